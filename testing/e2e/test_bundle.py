"""The bundler end to end: build the fixture project into a bundle, run it
self-contained, check determinism and the errors a user sees.

Self-containment is proven by running the bundle under bubblewrap over a root
that holds nothing but a static busybox: no Python, no libc, none of our
libraries. The bundle is mounted read-only at /nix, `bootstrap.sh` starts the
daemon on a Unix socket in a bind-mounted directory, and this process (the
host) calls the project's functions through it.

Needs `bazel build //...` (for bazel-bin/bundler/bundler and its runfiles),
bubblewrap and busybox-static (tools/setup).
"""

import asyncio
import contextlib
import hashlib
import json
import re
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import BAZEL_BIN, DIRECT_CALLS_ARGS, REPO, names_shared_libpython, wait_for

BUNDLER = BAZEL_BIN / "bundler" / "bundler"
PROJECT = REPO / "testing" / "fixtures" / "bundle_project"
BUILD_TIMEOUT_S = 240
RUNTIME = "/nix/runtime"

sys.path.insert(0, str(PROJECT))
import bundle_app  # noqa: E402  (the host needs the functions' names only)


def build(project, output, *extra, check=True):
    done = subprocess.run(
        [str(BUNDLER), "build", str(project), "--output", str(output), *extra],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"bundler failed ({done.returncode}):\n{done.stderr}")
    return done


def setuptools_project(directory, name, version, package, source="", dependencies=()):
    """A setuptools project in `directory`: the package `package` (its
    __init__.py holding `source`), named `name` `version`, depending on
    `dependencies`. Returns `directory`."""
    (directory / package).mkdir(parents=True)
    (directory / package / "__init__.py").write_text(source)
    pyproject = ('[build-system]\nrequires = ["setuptools>=61"]\n'
                 'build-backend = "setuptools.build_meta"\n'
                 f'[project]\nname = "{name}"\nversion = "{version}"\n')
    if dependencies:
        pyproject += "dependencies = [" + ", ".join(f'"{d}"' for d in dependencies) + "]\n"
    (directory / "pyproject.toml").write_text(pyproject)
    return directory


def summary(stdout):
    return dict(line.split(": ", 1) for line in stdout.strip().splitlines())


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    if not BUNDLER.exists():
        pytest.fail(f"{BUNDLER} missing: run `bazel build //...` first")
    out = tmp_path_factory.mktemp("bundle") / "out"
    started = time.monotonic()
    done = build(PROJECT, out)
    info = summary(done.stdout)
    info["stderr"] = done.stderr
    info["seconds"] = time.monotonic() - started
    info["out"] = out
    return info


def test_build_reports_each_stage_with_timing(bundle):
    for stage in ("pyproject", "binaries", "stdlib", "venv", "bytecode",
                  "libraries",
                  "patch", "manifest", "tarball", "oci"):
        lines = [l for l in bundle["stderr"].splitlines()
                 if l.startswith(f"[bundler] {stage}: ")]
        assert lines and lines[0].endswith(" s"), (stage, bundle["stderr"])


def test_tree_layout_and_manifest(bundle):
    out = bundle["out"]
    root = out / "nix" / "runtime"
    for rel in ("bootstrap.sh", "bin/agentix-sandboxd", "bin/agentix-worker",
                "bin/patchelf", "bin/sh", "lib/ld-linux-x86-64.so.2",
                "lib/libc.so.6",
                "python/lib/python3.11/os.py", "python/lib/python3.11/lib-dynload",
                "venv/pyvenv.cfg"):
        assert (root / rel).exists(), rel
    # The bundle's python3.11 links libpython statically, and so does the worker unless
    # built with --define=agentix_libpython=shared: the shared library comes only with a
    # worker that names it.
    assert (root / "lib/libpython3.11.so.1.0").exists() == names_shared_libpython(root / "bin/agentix-worker")
    site = root / "venv/lib/python3.11/site-packages"
    for rel in ("bundle_app/__init__.py", "bundle_helper/__init__.py",
                "msgpack/__init__.py", "agentix/__init__.py"):
        assert (site / rel).exists(), rel
    assert not list(site.glob("*.egg-link")) and not list(site.glob("__editable__*"))
    assert not (root / "python/lib/python3.11/test").exists()
    # Precompiled, so a read-only bundle does not compile on every start.
    assert (root / "python/lib/python3.11/__pycache__/os.cpython-311.pyc").exists()
    assert (site / "bundle_app/__pycache__/__init__.cpython-311.pyc").exists()
    assert "include-system-site-packages = false" in (root / "venv/pyvenv.cfg").read_text()

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "agentix-bundle"
    assert manifest["name"] == "bundle-fixture" and manifest["tag"] == "0.1.0"
    assert manifest["digest"] == bundle["digest"]
    tarball = Path(bundle["tarball"])
    assert tarball.name == "bundle-fixture-0.1.0.bundle.tar"
    assert hashlib.sha256(tarball.read_bytes()).hexdigest() == bundle["sha256"]

    # Every dynamically linked executable loads the bundle's loader.
    for name in ("agentix-sandboxd", "agentix-worker", "patchelf"):
        interp = subprocess.run(
            ["patchelf", "--print-interpreter", str(root / "bin" / name)],
            capture_output=True, text=True, check=True).stdout.strip()
        assert interp == f"{RUNTIME}/lib/ld-linux-x86-64.so.2", name
        rpath = subprocess.run(
            ["patchelf", "--print-rpath", str(root / "bin" / name)],
            capture_output=True, text=True, check=True).stdout.strip()
        assert rpath == f"{RUNTIME}/lib", name


def test_same_input_gives_the_same_tarball(bundle, tmp_path):
    again = summary(build(PROJECT, tmp_path / "again").stdout)
    assert again["sha256"] == bundle["sha256"]
    assert again["digest"] == bundle["digest"]


def test_missing_pyproject_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty-project"
    empty.mkdir()
    done = build(empty, tmp_path / "out", check=False)
    assert done.returncode == 1
    assert f"no pyproject.toml in {empty}" in done.stderr
    assert not (tmp_path / "out").exists()


def test_unknown_system_package_is_a_clear_error(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "p"\n[tool.agentix]\n'
        'system-packages = ["agentix-no-such-package"]\n')
    done = build(project, tmp_path / "out", check=False)
    assert done.returncode == 1
    assert ("system package 'agentix-no-such-package' is not a Debian package "
            "known to apt") in done.stderr


def test_dependency_not_available_offline_names_it(tmp_path):
    project = setuptools_project(tmp_path / "p", "p", "1", "p", dependencies=["agentix-not-on-this-machine>=2"])
    done = build(project, tmp_path / "out", check=False)
    assert done.returncode == 1
    assert ("dependency 'agentix-not-on-this-machine>=2' is not available "
            "offline") in done.stderr
    assert "--wheelhouse DIR" in done.stderr


def busybox_root(path):
    """A root with a static busybox and the mount points bwrap needs."""
    for d in ("bin", "dev", "proc", "tmp", "nix", "run/agentix"):
        (path / d).mkdir(parents=True)
    shutil.copy("/bin/busybox", path / "bin" / "busybox")
    os.symlink("busybox", path / "bin" / "sh")
    return path


def accepts(path):
    """True once the daemon listens: the socket file appears at bind(),
    a moment before listen(), and a client that connects in between is
    refused."""
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
            return True
        except OSError:
            return False


async def wait_for_socket(path, proc, log, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not accepts(path):
        if proc.poll() is not None:
            raise AssertionError(f"bootstrap exited {proc.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no socket after {timeout}s:\n{log.read_text()}")
        await asyncio.sleep(0.02)


def stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


async def call_everything(socket_path):
    from agentix import RuntimeClient

    async with RuntimeClient(f"unix://{socket_path}") as sandbox:
        assert await asyncio.wait_for(sandbox.remote(bundle_app.add, 2, 3), 30) == 5
        packed = await sandbox.remote(bundle_app.msgpack_roundtrip, {"a": [1, 2]})
        assert packed["value"] == {"a": [1, 2]}
        assert packed["from"].startswith(f"{RUNTIME}/venv/")
        assert await sandbox.remote(bundle_app.greet, "host") == \
            "hello, host, from bundle_helper"
        assert (await sandbox.remote(bundle_app.tool_version)).startswith("patchelf ")
        info = await sandbox.remote(bundle_app.runtime_info)
        # The bootstrap records what it put in front of PATH, so image_env()
        # (what the original's bash plugin runs task commands with) takes it off.
        from agentix.runtime.shared.env import image_env

        worker_path = await sandbox.remote(os.getenv, "PATH")
        image_path = (await sandbox.remote(image_env))["PATH"]
    assert worker_path.startswith(f"{RUNTIME}/venv/bin:{RUNTIME}/bin")
    assert image_path and worker_path.endswith(image_path) and RUNTIME not in image_path
    assert info["prefix"] == f"{RUNTIME}/venv"
    assert info["base_prefix"] == f"{RUNTIME}/python"
    assert info["stdlib"] == f"{RUNTIME}/python/lib/python3.11"
    assert info["sha256"] == hashlib.sha256(b"agentix").hexdigest()
    assert info["sqlite"] and info["openssl"].startswith("OpenSSL")
    assert info["python_exists"] is False


@contextlib.asynccontextmanager
async def bootstrapped(bundle, root, tmp_path, env=(), args=DIRECT_CALLS_ARGS):
    """The bundle's bootstrap.sh in bwrap over `root` (e.g. a busybox root),
    with the daemon's socket bound out to tmp_path/sock; yields the socket's
    path once it listens. `env`: more (name, value) pairs for the daemon and
    its workers; `args`: bootstrap.sh's (the daemon's) arguments. Output goes
    to tmp_path/bootstrap.log."""
    sockdir = tmp_path / "sock"
    sockdir.mkdir()
    log = tmp_path / "bootstrap.log"
    extra = [arg for name, value in env for arg in ("--setenv", name, value)]
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            ["bwrap", "--bind", str(root), "/",
             "--ro-bind", str(bundle["out"] / "nix"), "/nix",
             "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
             "--bind", str(sockdir), "/run/agentix",
             "--unshare-pid", "--unshare-net", "--unshare-ipc",
             "--die-with-parent", "--clearenv",
             "--setenv", "AGENTIX_LISTEN", "unix:///run/agentix/agentix.sock", *extra,
             f"{RUNTIME}/bootstrap.sh", *args],
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        await wait_for_socket(sockdir / "agentix.sock", proc, log)
        yield sockdir / "agentix.sock"
    finally:
        stop(proc)


async def test_bundle_runs_self_contained_in_a_busybox_root(bundle, tmp_path):
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap missing: run tools/setup")
    root = busybox_root(tmp_path / "root")
    assert sorted(p.name for p in (root / "bin").iterdir()) == ["busybox", "sh"]
    assert not (root / "usr").exists() and not (root / "lib").exists()
    async with bootstrapped(bundle, root, tmp_path) as sock:
        await asyncio.wait_for(call_everything(sock), 60)
    assert "serving agentix.runtime.v1 on unix:///run/agentix/agentix.sock" in \
        (tmp_path / "bootstrap.log").read_text()


@pytest.mark.parametrize("args", [(), ("--direct_calls",), ("--nodirect_calls",)],
                         ids=["default", "direct", "relayed"])
async def test_the_early_worker_is_adopted_with_direct_calls_on_off_or_the_default(
        bundle, tmp_path, monkeypatch, args):
    """AGENTIX_EARLY_WORKER=1: agentix-launch gives the early worker the
    arguments the daemon would spawn it with for bootstrap.sh's flags
    (--python-home, --direct_calls), so the daemon adopts it."""
    from agentix import RuntimeClient

    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "auto")
    env = [("AGENTIX_EARLY_WORKER", "1"), ("AGENTIX_LOG_LEVEL", "debug")]
    async with bootstrapped(bundle, busybox_root(tmp_path / "root"), tmp_path, env=env,
                            args=args) as sock:
        async with RuntimeClient(f"unix://{sock}") as sandbox:
            assert await asyncio.wait_for(sandbox.remote(bundle_app.add, 2, 3), 30) == 5
            pid = await sandbox.remote(os.getpid)
        log = tmp_path / "bootstrap.log"
        adopted = re.search(r"\(generation 1\) adopted as pid (\d+)", log.read_text())
        assert adopted and "could not adopt" not in log.read_text(), log.read_text()
        # The worker that ran the calls is the adopted one (pids in bwrap's namespace).
        assert pid == int(adopted.group(1))
        if args == ("--direct_calls",):
            await wait_for(lambda: re.search(r"direct connection \S+ closed", log.read_text()))


async def test_bootstrap_passes_the_admin_token_file_through(bundle, tmp_path):
    """providerd starts warm-pool members as `bootstrap.sh --listen ...
    --admin-token-file /proc/self/fd/N`: the bundle's daemon starts unarmed,
    Activate arms it, and its worker sees Activate's env."""
    import grpc

    from admin_client import ADMIN, SERVING, Admin, bearer, pb, token_pipe
    from admin_client import RUNTIME as RUNTIME_TOKEN
    from agentix import RuntimeClient

    root = busybox_root(tmp_path / "root")
    sockdir = tmp_path / "sock"
    sockdir.mkdir()
    log = tmp_path / "bootstrap.log"
    with token_pipe() as fd, open(log, "wb") as log_file:
        proc = subprocess.Popen(
            ["bwrap", "--bind", str(root), "/",
             "--ro-bind", str(bundle["out"] / "nix"), "/nix",
             "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
             "--bind", str(sockdir), "/run/agentix",
             "--unshare-pid", "--unshare-net", "--unshare-ipc",
             "--die-with-parent", "--clearenv",
             f"{RUNTIME}/bootstrap.sh",
             "--listen", "unix:///run/agentix/agentix.sock",
             "--admin-token-file", f"/proc/self/fd/{fd}", *DIRECT_CALLS_ARGS],
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
            pass_fds=(fd,))
    try:
        socket_path = sockdir / "agentix.sock"
        await wait_for_socket(socket_path, proc, log)
        url = f"unix://{socket_path}"
        async with grpc.aio.insecure_channel(url) as channel:
            admin = Admin(channel)
            assert await admin.health(b"", timeout=10, metadata=bearer(ADMIN)) == SERVING
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await admin.get_info(b"", timeout=10)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            # bootstrap.sh passes --prestart-worker: the worker boots before
            # Activate (running no user code) and gets its env at Activate.
            assert (await admin.get_status()).worker_running
            await admin.activate(pb.ActivateRequest(token=RUNTIME_TOKEN, env={"POOL_USER": "u1"},
                                                    sandbox_id="warm-1"),
                                 timeout=10, metadata=bearer(ADMIN))
        async with RuntimeClient(url, token=RUNTIME_TOKEN) as sandbox:
            assert await asyncio.wait_for(sandbox.remote(bundle_app.add, 2, 3), 30) == 5
            assert await sandbox.remote(os.getenv, "POOL_USER") == "u1"
            assert await sandbox.remote(os.getenv, "AGENTIX_SANDBOX_ID") == "warm-1"
            assert (await sandbox._info()).workers_started == 1  # the prestarted one
    finally:
        stop(proc)
    assert "unarmed until SandboxAdmin.Activate" in log.read_text()


def test_oci_layout_validates(bundle):
    if shutil.which("oci-image-tool") is None:
        pytest.skip("oci-image-tool not installed (tools/setup installs it)")
    done = subprocess.run(
        ["oci-image-tool", "validate", "--type", "image", "--ref",
         "name=0.1.0",
         bundle["oci"]],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Validation succeeded" in done.stdout + done.stderr


async def test_podman_runs_the_oci_layout(bundle, tmp_path):
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("podman/runc not installed (tools/setup installs them)")
    # podman refuses a runroot path longer than 50 characters.
    store = Path(tempfile.mkdtemp(prefix="agx-podman-", dir="/tmp"))
    podman = ["podman", "--root", str(store / "root"), "--runroot",
              str(store / "run"), "--storage-driver", "vfs", "--runtime", "runc",
              "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
    sockdir = tmp_path / "sock"
    sockdir.mkdir()
    name = f"agentix-bundle-test-{os.getpid()}"
    done = subprocess.run(
        [*podman, "run", "-d", "--name", name, "--network", "none",
         "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
         "-v", f"{sockdir}:/run/agentix",
         "-e", "AGENTIX_LISTEN=unix:///run/agentix/agentix.sock",
         f"oci:{bundle['oci']}:0.1.0"],
        capture_output=True, text=True, timeout=120)
    try:
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 20
        while not accepts(sockdir / "agentix.sock"):
            assert time.monotonic() < deadline, subprocess.run(
                [*podman, "logs", name], capture_output=True, text=True).stderr
            await asyncio.sleep(0.05)
        from agentix import RuntimeClient

        async with RuntimeClient(f"unix://{sockdir}/agentix.sock") as sandbox:
            assert await asyncio.wait_for(
                sandbox.remote(bundle_app.greet, "podman"), 30) == \
                "hello, podman, from bundle_helper"
    finally:
        subprocess.run([*podman, "rm", "-f", "-t", "2", name],
                       capture_output=True, timeout=60)
        subprocess.run([*podman, "rmi", "-a", "-f"], capture_output=True,
                       timeout=60)
        shutil.rmtree(store, ignore_errors=True)


def test_wheelhouse_provides_a_dependency(tmp_path):
    """A dependency that is nowhere on the machine installs from --wheelhouse."""
    lib = setuptools_project(tmp_path / "padlib", "agentix-padlib", "1.2", "agentix_padlib",
                             "def pad(s, n):\n    return s.rjust(n)\n")
    wheels = tmp_path / "wheels"
    subprocess.run(
        ["/usr/bin/python3", "-m", "pip", "wheel", "-q", "--no-index",
         "--no-build-isolation", "--no-deps", "-w", str(wheels), str(lib)],
        check=True, capture_output=True, timeout=120,
        env={**os.environ, "PIP_CONFIG_FILE": "/dev/null"})
    project = setuptools_project(tmp_path / "p", "p", "1", "p", dependencies=["agentix-padlib>=1.1"])
    out = tmp_path / "out"
    build(project, out, "--wheelhouse", str(wheels))
    site = out / "nix/runtime/venv/lib/python3.11/site-packages"
    assert (site / "agentix_padlib" / "__init__.py").exists()
    assert (site / "agentix_padlib-1.2.dist-info").is_dir()


async def run_in_bundle(bundle, tmp_path, body, env=()):
    """Starts the bundle as test_bundle_runs_self_contained does (`env`: more
    (name, value) pairs for the daemon and its workers) and returns
    `await body(client)`."""
    from agentix import RuntimeClient

    root = busybox_root(tmp_path / "root")
    async with bootstrapped(bundle, root, tmp_path, env) as sock:
        async with RuntimeClient(f"unix://{sock}") as sandbox:
            return await asyncio.wait_for(body(sandbox), 60)


def test_the_stdlib_bytecode_pack_holds_asyncio(bundle):
    pack = bundle["out"] / "nix/runtime/python/lib/python3.11/__pycache__/agentix-stdlib.pack"
    assert pack.is_file() and pack.read_bytes()[:8] == b"AGXPYC1\n"
    line = [l for l in bundle["stderr"].splitlines() if l.startswith("[bundler] bytecode: ")][0]
    assert "stdlib modules packed" in line, line


async def test_user_code_sees_the_stdlib_as_the_path_finder_gives_it(bundle, tmp_path):
    """asyncio comes from the bundle's bytecode pack, and looks to user code
    as it does when the path finder loads it: file, bytecode path, package
    path, source, tracebacks with their lines, reload."""
    stdlib = f"{RUNTIME}/python/lib/python3.11"

    async def body(sandbox):
        return await sandbox.remote(bundle_app.stdlib_imports)

    info = await run_in_bundle(bundle, tmp_path, body)
    assert info["status"] == ""
    assert info["served"] == ["asyncio", "asyncio.base_events", "json", "typing"]
    assert info["asyncio_file"] == info["asyncio_origin"] == f"{stdlib}/asyncio/__init__.py"
    assert info["asyncio_cached"] == f"{stdlib}/asyncio/__pycache__/__init__.cpython-311.pyc"
    assert info["asyncio_path"] == [f"{stdlib}/asyncio"]
    assert info["source_file_loader"] and info["sleep_source"] and info["reloaded"]
    assert f'File "{stdlib}/asyncio/queues.py"' in info["trace"], info["trace"]
    assert "raise QueueEmpty" in info["trace"], info["trace"]


async def test_an_import_root_first_on_sys_path_shadows_a_packed_module(bundle, tmp_path):
    async def body(sandbox):
        return await sandbox.remote(bundle_app.shadowed_stdlib_module, "/tmp/shadow")

    name, shadow, file = await run_in_bundle(bundle, tmp_path, body)
    assert shadow is True and file == f"/tmp/shadow/{name}.py", (name, file)


async def test_asyncio_and_ssl_are_complete_in_a_bundle(bundle, tmp_path):
    """A TLS echo over loopback through asyncio's streams, in the sandbox:
    the worker's deferred ssl and its bytecode pack change nothing a user
    can use. With AGENTIX_WORKER_BYTECODE_PACK=0 the pack is off."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60)
    for env, status in (((), ""), ((("AGENTIX_WORKER_BYTECODE_PACK", "0"),),
                                   "off (AGENTIX_WORKER_BYTECODE_PACK=0)")):
        async def body(sandbox):
            echoed = await sandbox.remote(bundle_app.tls_echo, cert.read_text(),
                                          key.read_text(), "hello over tls")
            imports = await sandbox.remote(bundle_app.stdlib_imports)
            return echoed, imports

        run_dir = tmp_path / f"run{len(env)}"
        run_dir.mkdir()
        (answer, version, loop_module), imports = await run_in_bundle(bundle, run_dir, body, env)
        assert answer == "hello over tls"
        assert version.startswith("TLSv1.")
        assert loop_module == "asyncio.unix_events"
        assert imports["status"] == status
        assert imports["served"] == ([] if env else ["asyncio", "asyncio.base_events", "json", "typing"])
