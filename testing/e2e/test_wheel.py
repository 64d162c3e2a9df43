"""The packages a user installs (docs/PACKAGING.md): the two wheels
(//host/python:wheel, cp311 with the native transport; //host/python:wheel_pure,
py3-none-any) and the Debian package (//packaging:deb), as `bazel build //...`
leaves them in bazel-bin. tools/test-install installs them on a clean Debian 12;
these are its fast checks."""

import importlib.metadata
import importlib.util
import os
import pathlib
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from conftest import BAZEL_BIN, TARGETS_DIR, names_shared_libpython

# The floors are Debian 12's versions (python3-grpcio, python3-protobuf, python3-msgpack).
DECLARED = {"grpcio": ">=1.51.1", "protobuf": ">=4.21.12", "msgpack": ">=1.0.3"}


def _one(pattern: str, directory: pathlib.Path) -> pathlib.Path:
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {directory}, found {found}"
    return found[0]


def _wheel_fields(wheel: pathlib.Path, member: str) -> list[tuple[str, str]]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(f".dist-info/{member}")]
        text = archive.read(name).decode()
    return [tuple(line.split(": ", 1)) for line in text.split("\n\n")[0].splitlines() if ": " in line]


def _requires(fields) -> dict[str, str]:
    """Requires-Dist without extras, as {name: specifier} (METADATA writes `name (>=x)`)."""
    out = {}
    for key, value in fields:
        if key == "Requires-Dist" and "extra ==" not in value:
            name, _, spec = value.partition(" ")
            out[name] = spec.strip("()")
    return out


def test_the_wheel_is_tagged_for_the_interpreter_and_platform_of_its_extension():
    dist = importlib.metadata.distribution("agentix")
    wheel = dict(
        line.split(": ", 1) for line in (dist.read_text("WHEEL") or "").splitlines() if ": " in line
    )
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel["Tag"] == f"{python}-{python}-{platform}"
    assert wheel["Root-Is-Purelib"] == "false"

    extension = importlib.util.find_spec("agentix.runtime.client._native_calls")
    assert extension is not None and extension.origin.endswith(sysconfig.get_config_var("EXT_SUFFIX"))
    installed = {str(path) for path in dist.files or []}
    assert str(pathlib.Path(extension.origin).relative_to(dist.locate_file(""))) in installed


def test_the_platform_wheel_declares_its_dependencies_and_only_its_python():
    wheel = _one("agentix-*.whl", BAZEL_BIN / "host" / "python")
    metadata = _wheel_fields(wheel, "METADATA")
    assert _requires(metadata) == DECLARED
    # cp311 in the tag, so Requires-Python must not promise more.
    assert dict(metadata)["Requires-Python"] == f"=={sys.version_info.major}.{sys.version_info.minor}.*"
    assert dict(_wheel_fields(wheel, "WHEEL"))["Tag"].startswith("cp311-cp311-")
    # The installed copy (tools/make_venv) says the same.
    assert importlib.metadata.metadata("agentix")["Requires-Python"] == "==3.11.*"


def test_the_pure_wheel_has_no_extension_and_runs_on_any_python_3_11_or_later():
    wheel = _one("agentix-*-py3-none-any.whl", BAZEL_BIN / "host" / "python" / "pure")
    tags = dict(_wheel_fields(wheel, "WHEEL"))
    assert tags["Tag"] == "py3-none-any" and tags["Root-Is-Purelib"] == "true"
    metadata = _wheel_fields(wheel, "METADATA")
    assert dict(metadata)["Requires-Python"] == ">=3.11"
    assert _requires(metadata) == DECLARED
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "agentix/runtime/client/client.py" in names
    assert not [n for n in names if n.endswith(".so")]


def _pip(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=timeout)


def test_in_a_clean_venv_pip_refuses_the_wheel_offline_and_pip_check_names_its_dependencies(tmp_path):
    """A venv without system site packages and no index (PyPI is not
    reachable here): pip stops at grpcio; installed with --no-deps, `pip
    check` names exactly the declared dependencies."""
    wheel = _one("agentix-*.whl", BAZEL_BIN / "host" / "python")
    venv = tmp_path / "clean"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    refused = _pip("--python", python, "install", "--no-index", str(wheel))
    assert refused.returncode != 0
    assert "No matching distribution found for grpcio>=1.51.1" in refused.stderr, refused.stderr
    installed = _pip("--python", python, "install", "--no-index", "--no-deps", str(wheel))
    assert installed.returncode == 0, installed.stderr
    check = _pip("--python", python, "check")
    assert check.returncode == 1
    assert sorted(check.stdout.splitlines()) == [
        f"agentix 0.3.0 requires {name}, which is not installed." for name in sorted(DECLARED)
    ], check.stdout


def test_pip_check_finds_the_declared_dependencies_satisfied_by_debians_packages():
    """In the suite's venv (--system-site-packages: Debian's python3-grpcio,
    python3-protobuf, python3-msgpack), nothing `pip check` reports concerns
    agentix, and each declared dependency is installed at or above its floor.
    (Other lines are the build machine's own: Debian's pygobject without
    pycairo, say. tools/test-install runs a strict `pip check` on a clean root.)"""
    check = _pip("check")
    assert not [line for line in check.stdout.splitlines() if line.startswith("agentix ")], check.stdout
    from pip._vendor.packaging.requirements import Requirement

    requires = [Requirement(r) for r in importlib.metadata.requires("agentix") or [] if "extra ==" not in r]
    assert {r.name: str(r.specifier) for r in requires} == DECLARED
    for requirement in requires:
        assert requirement.specifier.contains(importlib.metadata.version(requirement.name)), requirement


def test_without_the_extension_the_client_uses_grpc_aio_and_says_so_once_at_debug(daemon, tmp_path):
    """The pure wheel, unpacked for /usr/bin/python3: two clients make remote
    calls over grpc.aio; the fallback is logged once, at DEBUG."""
    wheel = _one("agentix-*-py3-none-any.whl", BAZEL_BIN / "host" / "python" / "pure")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    script = """
import asyncio, logging, sys
records = []
handler = logging.Handler(logging.DEBUG)
handler.emit = records.append
logging.getLogger("agentix").addHandler(handler)
logging.getLogger("agentix").setLevel(logging.DEBUG)
import agentix
from agentix import RuntimeClient
import e2e_targets
assert agentix.__file__.startswith(sys.argv[2]), agentix.__file__

async def main():
    results = []
    for _ in range(2):
        async with RuntimeClient(sys.argv[1]) as client:
            results.append(await client.remote(e2e_targets.add, 2, 3))
    return results

print(asyncio.run(main()))
said = [r for r in records if "native Calls transport" in r.getMessage()]
print(len(said), said[0].levelname if said else None, said[0].getMessage() if said else "")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = f"{site}:{TARGETS_DIR}"
    env["AGENTIX_SANDBOX_LOG_HANDLER"] = "0"
    run = subprocess.run(
        ["/usr/bin/python3", "-c", script, daemon.url, str(site)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results, said = run.stdout.splitlines()[-2:]
    assert results == "[5, 5]"
    count, level, message = said.split(" ", 2)
    assert (count, level) == ("1", "DEBUG"), said
    assert "native Calls transport unavailable, using grpc.aio" in message and "_native_calls" in message


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    """The .deb's control fields and its tree, unpacked with dpkg-deb."""
    package = _one("agentix_*_amd64.deb", BAZEL_BIN / "packaging")
    fields = subprocess.run(["dpkg-deb", "-f", str(package)], capture_output=True, text=True, check=True).stdout
    tree = tmp_path_factory.mktemp("deb")
    subprocess.run(["dpkg-deb", "-x", str(package), str(tree)], check=True)
    control = {}
    for line in fields.splitlines():
        if line and not line.startswith(" "):
            key, _, value = line.partition(": ")
            control[key] = value
    return package, control, tree


def test_the_deb_depends_on_the_debian_libraries_and_python_packages_it_uses(deb):
    package, control, tree = deb
    assert package.name == f"agentix_{control['Version']}_amd64.deb"
    assert control["Package"] == "agentix" and control["Architecture"] == "amd64"
    depends = {entry.strip().split(" ")[0] for entry in control["Depends"].split(",")}
    # From dpkg-shlibdeps: what the binaries and the extension link. The
    # worker links libpython statically by default (stop 34; Debian's python3
    # package brings the stdlib it runs), so libpython3.11 is a dependency
    # exactly when the packaged worker names the shared library.
    links_libpython = names_shared_libpython(tree / "usr" / "lib" / "agentix" / "bin" / "agentix-worker")
    for library in ("libgrpc++1.51", "libgrpc29", "libprotobuf32", "libabsl20220623",
                    "libstdc++6", "libc6", "libarchive13", "libcurl4"):
        assert library in depends, (library, control["Depends"])
    # fmt is header-only (third_party/system:fmt): no binary links libfmt.so.
    assert "libfmt9" not in depends, control["Depends"]
    assert ("libpython3.11" in depends) == links_libpython, (links_libpython, control["Depends"])
    # Declared: the Python package's dependencies and what the binaries run.
    for package_name in ("python3", "python3-grpcio", "python3-protobuf", "python3-msgpack",
                         "bubblewrap", "patchelf", "busybox-static", "python3-venv", "python3-pip"):
        assert package_name in depends, (package_name, control["Depends"])
    assert "python3 (<< 3.12)" in control["Depends"]  # the extension is CPython 3.11's


def test_the_deb_installs_the_binaries_the_package_and_the_commands(deb):
    _, control, tree = deb
    bin_dir = tree / "usr" / "lib" / "agentix" / "bin"
    for binary in ("agentix-sandboxd", "agentix-worker", "agentix-providerd", "bundler"):
        assert os.access(bin_dir / binary, os.X_OK), binary
    # agentix-bundle is the name `agentix build` looks for on PATH.
    for command, target in (("agentix-sandboxd", "agentix-sandboxd"), ("agentix-worker", "agentix-worker"),
                            ("agentix-providerd", "agentix-providerd"), ("agentix-bundle", "bundler")):
        assert (tree / "usr" / "bin" / command).resolve() == bin_dir / target
    # The bundler's runfiles: what it bundles, where it looks for it.
    runfiles = bin_dir / "bundler.runfiles" / "agentix"
    assert (runfiles / "sandbox" / "agentix-sandboxd").resolve() == bin_dir / "agentix-sandboxd"
    assert (runfiles / "worker" / "agentix-worker").resolve() == bin_dir / "agentix-worker"
    assert (runfiles / "bundler" / "dist_closure.py").is_file()
    assert len(list((runfiles / "host" / "python").glob("agentix-*-cp311-cp311-linux_x86_64.whl"))) == 1
    site = tree / "usr" / "lib" / "python3" / "dist-packages"
    assert (site / "agentix" / "runtime" / "client" / f"_native_calls{sysconfig.get_config_var('EXT_SUFFIX')}").is_file()
    dist_info = site / f"agentix-{control['Version']}.dist-info"
    assert (dist_info / "entry_points.txt").is_file() and (dist_info / "INSTALLER").read_text() == "dpkg\n"
    for script in ("agentix", "agentix-sio-gateway"):
        assert (tree / "usr" / "bin" / script).read_text().startswith("#!/usr/bin/python3\n")


def test_the_debs_commands_answer_help(deb):
    """`agentix --help` (the console script, on /usr/bin/python3 with the
    package from the .deb) and `agentix-sandboxd --help` run from the tree."""
    _, _, tree = deb
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(tree / "usr" / "lib" / "python3" / "dist-packages")
    run = subprocess.run(["/usr/bin/python3", str(tree / "usr" / "bin" / "agentix"), "--help"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    assert "sandbox" in run.stdout and "pool" in run.stdout
    probe = subprocess.run(
        ["/usr/bin/python3", "-c", "import agentix; print(agentix.__file__)"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert probe.stdout.startswith(str(tree)), probe.stdout + probe.stderr
    daemon = subprocess.run([str(tree / "usr" / "bin" / "agentix-sandboxd"), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert "--listen" in daemon.stdout + daemon.stderr


def test_the_debs_agentix_doctor_finds_its_binaries_and_its_declared_dependencies(deb, tmp_path):
    """`agentix doctor` of the .deb's command, run from the unpacked tree as
    if installed (its usr/bin first on PATH, its dist-packages on
    PYTHONPATH): it finds the package's bundler, providerd, daemon and worker,
    checks grpcio/protobuf/msgpack against the floors the package's own
    metadata declares, loads the native transport, and bubblewrap runs.
    tools/test-install runs the same on a clean Debian 12 root."""
    _, control, tree = deb
    usr_bin = tree / "usr" / "bin"
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AGENTIX_"))}
    env.update(PYTHONPATH=str(tree / "usr" / "lib" / "python3" / "dist-packages"),
               PATH=f"{usr_bin}:/usr/bin:/bin", XDG_RUNTIME_DIR=str(runtime))
    done = subprocess.run(["/usr/bin/python3", str(usr_bin / "agentix"), "doctor", "--json"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    document = __import__("json").loads(done.stdout)
    assert document["version"] == control["Version"] and document["ok"]
    checks = {c["name"]: c for c in document["checks"]}
    for name in ("python", "grpcio", "protobuf", "msgpack", "native transport", "bundler", "agentix-providerd",
                 "agentix-sandboxd", "agentix-worker", "bubblewrap", "user namespaces"):
        assert checks[name]["status"] == "ok", checks[name]
    for dist, specifier in DECLARED.items():
        assert checks[dist]["detail"].endswith(f"(agentix requires {specifier})"), checks[dist]
    assert checks["bundler"]["detail"] == str(usr_bin / "agentix-bundle")
    for name in ("agentix-providerd", "agentix-sandboxd", "agentix-worker"):
        assert checks[name]["detail"].startswith(str(tree)), checks[name]
