"""End to end: `LocalProvider`, the client of ``agentix-providerd``, runs the
real daemon and worker under bubblewrap through providerd's local backend
(providers/backends/local/) — what users get.

The module starts no providerd itself: it points ``$XDG_RUNTIME_DIR`` at a
private directory and ``$AGENTIX_PROVIDERD`` at a stand-in that only adds a
short private ``--state-dir``, so the first `LocalProvider` starts "the
per-user providerd" exactly as local.py does for users (detached, on
``$XDG_RUNTIME_DIR/agentix/providerd.sock``) and every later one reuses it.
What the in-process provider let tests look into is checked through what
providerd exposes instead: GetSandbox's ``status.backend_ref``, the local
backend's per-sandbox directory ``<state-dir>/sb/<id>`` (``state.json``
records its bwrap pid and cgroups, ``sandbox.log`` its output), the cgroup
directories ``/sys/fs/cgroup/<controller>/…/agentix/<id>`` and the process
table.

Two tests keep driving `InProcessLocalProvider` (the in-process bubblewrap
provider LocalProvider was before; the benchmark's baseline) where they test
its own internals (its runtime_dir and prune).

The bundle here is a development one: ``nix/runtime/bootstrap.sh`` execs the
Bazel-built ``agentix-sandboxd`` and ``agentix-worker`` by their absolute host
paths, which the sandbox sees because its root is the host's root (read-only).
The worker's Python path is the e2e fixtures plus ``/nix/runtime/probe``, a
module of probes written into the bundle by this file (the host imports the
same file, so its functions are valid remote targets).

Run: bazel build //... && tools/make_venv $PWD/.venv-test &&
     .venv-test/bin/python -m pytest -q -p no:cacheprovider -o asyncio_mode=auto \
         --timeout=300 testing/e2e/test_local_provider.py
"""

import asyncio
import io
import json
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from conftest import (REPO, BAZEL_BIN, DIRECT_CALLS_ARGS, SANDBOXD, TARGETS_DIR, WORKER, _venv,
                      on_root_logger)

sys.path.insert(0, str(REPO / "testing" / "providerd"))
import providerd_harness as harness  # noqa: E402

import e2e_targets
from agentix import Unauthenticated, WorkerExited
from agentix.provider import SandboxConfig, SandboxResource, providers
from agentix.provider.local import LocalProvider, LocalProviderConfig
from agentix.provider._local_inprocess import InProcessLocalProvider
from agentix.provider.service import ServiceProvider

PROVIDERD = BAZEL_BIN / "providers" / "agentix-providerd"


@pytest.fixture(autouse=True)
def _needs_bubblewrap_and_providerd():
    # Failures, not skips: tools/setup installs bubblewrap, //... builds providerd.
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required for the local provider tests: apt-get install bubblewrap")
    if not PROVIDERD.is_file():
        pytest.fail(f"{PROVIDERD} is missing: bazel build //providers:agentix-providerd")

PROBE_SOURCE = '''
"""Probes run inside a local sandbox by testing/e2e/test_local_provider.py."""
import errno
import os
import socket
import threading


def _try_write(path):
    try:
        with open(path, "w") as handle:
            handle.write("x")
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))
    os.unlink(path)
    return "ok"


def _rewrite_same(path):
    # Writes the current value back: detects a writable global sysctl
    # without changing anything if it is writable.
    with open(path) as handle:
        value = handle.read()
    try:
        with open(path, "w") as handle:
            handle.write(value)
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))
    return "ok"


def facts():
    processes = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    processes[int(entry)] = handle.read().replace(b"\\0", b" ").decode(errors="replace")
            except OSError:
                pass
    return {
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "interfaces": [name for _, name in socket.if_nameindex()],
        "processes": processes,
        "usr_write": _try_write("/usr/agentix-probe"),
        "nix_write": _try_write("/nix/agentix-probe"),
        "root_write": _try_write("/agentix-probe"),
        "tmp_write": _try_write("/tmp/agentix-probe"),
        "sysctl_write": _rewrite_same("/proc/sys/kernel/core_pattern"),
        "uid": os.getuid(),
        "cap_eff": [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:")][0],
        "env_home": os.environ.get("HOME"),
        "host_secret": os.environ.get("AGENTIX_E2E_HOST_SECRET"),
        "config_env": os.environ.get("AGENTIX_E2E_CONFIG_ENV"),
    }


def connect_tcp(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return "connected"
    except OSError as error:
        return type(error).__name__


def allocate(megabytes):
    data = b"\\x01" * (megabytes << 20)  # written, so every page is really charged
    return len(data)


def _errno_name(number):
    return errno.errorcode.get(number, str(number))


def _libc_call(name, *args):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ctypes.set_errno(0)
    result = getattr(libc, name)(*args)
    return "ok" if result == 0 else _errno_name(ctypes.get_errno())


def kernel_escapes():
    """Namespace, mount, keyring and ptrace calls from sandbox code: their errno names."""
    import ctypes

    status = {line.split(":")[0]: line.split()[1] for line in open("/proc/self/status") if ":" in line and line.split()[1:]}
    return {
        "unshare_user": _libc_call("unshare", 0x10000000),  # CLONE_NEWUSER
        "unshare_ns": _libc_call("unshare", 0x00020000),  # CLONE_NEWNS
        "unshare_user_ns": _libc_call("unshare", 0x10020000),
        "mount_tmpfs": _libc_call("mount", b"none", b"/tmp", b"tmpfs", ctypes.c_ulong(0), None),
        "umount_proc": _libc_call("umount2", b"/proc", 0),
        "keyctl": _libc_call("syscall", 250, 0, ctypes.c_long(-3), 0),  # KEYCTL_GET_KEYRING_ID(session)
        "ptrace_init": _libc_call("ptrace", 16, 1, None, None),  # PTRACE_ATTACH to pid 1
        "bpf": _libc_call("syscall", 321, 0, None, 0),
        "cap_bnd": status["CapBnd"],
        "cap_eff": status["CapEff"],
        "seccomp": status.get("Seccomp"),
    }


def writable_mounts():
    """(mount point, fs type, size= option) of every read-write mount but
    bwrap's single device nodes (/dev/null and friends: writes reach the device)."""
    import stat as stat_module

    found = []
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        dash = fields.index("-")
        if "rw" in fields[5].split(",") and not stat_module.S_ISCHR(os.stat(fields[4]).st_mode):
            size = [o for o in fields[dash + 3].split(",") if o.startswith("size=")]
            found.append((fields[4], fields[dash + 1], size[0] if size else None))
    return sorted(found)


def fill(directory, megabytes):
    """Writes up to `megabytes` MiB into `directory`: (bytes written, errno name or "ok")."""
    path = os.path.join(directory, "agentix-fill")
    chunk = b"\\x01" * (1 << 20)
    written = 0
    outcome = "ok"
    try:
        with open(path, "wb", buffering=0) as handle:
            for _ in range(megabytes):
                written += handle.write(chunk)
    except OSError as error:
        outcome = _errno_name(error.errno)
    try:
        os.unlink(path)
    except OSError:
        pass
    return written, outcome


def reopen_fds(flood_megabytes):
    """Opens every /proc/<pid>/fd/<n> of other processes for writing. Returns
    {path: errno name, or (fd kind, link target)}; each pipe opened gets
    `flood_megabytes` MiB and a forged log line written into it."""
    import stat as stat_module

    found = {}
    for pid in sorted(p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError as error:
            found[f"/proc/{pid}/fd"] = _errno_name(error.errno)
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                target = os.readlink(path)
                handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            except OSError as error:
                found[path] = _errno_name(error.errno)
                continue
            mode = os.fstat(handle).st_mode
            kind = ("reg" if stat_module.S_ISREG(mode) else "fifo" if stat_module.S_ISFIFO(mode)
                    else "chr" if stat_module.S_ISCHR(mode) else oct(stat_module.S_IFMT(mode)))
            found[path] = (kind, target)
            try:
                if kind == "fifo" and target.startswith("pipe:") and fd in ("1", "2"):
                    os.set_blocking(handle, True)
                    chunk = b"y" * (1 << 20)
                    for _ in range(flood_megabytes):
                        os.write(handle, chunk)
                    os.write(handle, b"\\nFORGED by sandbox code\\n")
            except OSError:
                pass
            finally:
                os.close(handle)
    return found


def proc_texts():
    """Every /proc/<pid>/environ and cmdline the sandbox can read, and what
    every pipe it can reopen through /proc/<pid>/fd holds, concatenated."""
    texts = []
    for pid in os.listdir("/proc"):
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as handle:
                    texts.append(handle.read().decode(errors="replace"))
            except OSError:
                pass
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:"):
                    continue
                handle = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                texts.append(os.read(handle, 1 << 16).decode(errors="replace"))
            except OSError:
                pass
            finally:
                os.close(handle)
    return "\\n".join(texts)


def start_threads(count):
    stop = threading.Event()
    threads = []
    try:
        for _ in range(count):
            thread = threading.Thread(target=stop.wait)
            thread.start()
            threads.append(thread)
    except RuntimeError:
        pass
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return len(threads)
'''


def _write_bundle(directory: Path, bootstrap: str, probe: bool = False) -> Path:
    runtime = directory / "nix" / "runtime"
    runtime.mkdir(parents=True)
    (runtime / "bootstrap.sh").write_text(bootstrap)
    (runtime / "bootstrap.sh").chmod(0o755)
    if probe:
        (runtime / "probe").mkdir()
        (runtime / "probe" / "local_sandbox_probe.py").write_text(PROBE_SOURCE)
    return directory


@pytest.fixture(scope="module")
def dev_bundle():
    directory = Path(tempfile.mkdtemp(prefix="agx-bundle-"))
    python_path = f"{TARGETS_DIR}:/nix/runtime/probe"
    _write_bundle(
        directory,
        "#!/bin/sh\n"
        f'exec {os.path.realpath(SANDBOXD)} --listen "$AGENTIX_LISTEN" '
        f'--worker {os.path.realpath(WORKER)} --venv {_venv()} --python-path {python_path} '
        f'{" ".join(DIRECT_CALLS_ARGS)} "$@"\n',
        probe=True,
    )
    sys.path.insert(0, str(directory / "nix" / "runtime" / "probe"))
    yield directory
    sys.path.remove(str(directory / "nix" / "runtime" / "probe"))
    shutil.rmtree(directory)


def _providerds(marker):
    """Pids of live agentix-providerd processes whose command line mentions `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"agentix-providerd") and any(marker.encode() in a for a in argv) \
                and _alive(int(entry)):
            found.append(int(entry))
    return found


class Providerd:
    """The module's providerd: where LocalProvider finds (and starts) it and
    where its local backend keeps its sandboxes."""

    def __init__(self, base: Path):
        self.base = base
        self.state = base / "s"  # providerd's limit is 22 bytes: /tmp/agx-XXXXXXXX/s
        self.socket = base / "x" / "agentix" / "providerd.sock"
        self.sandboxes = self.state / "sb"

    def pids(self):
        return _providerds(str(self.base))

    def sandbox_dir(self, sandbox_id):
        return self.sandboxes / sandbox_id

    def entries(self):
        """Names in the local backend's state directory (one per sandbox it holds)."""
        return set(os.listdir(self.sandboxes)) if self.sandboxes.is_dir() else set()

    def record(self, sandbox_id):
        """The local backend's state.json of a sandbox: bwrap pid, cgroup dirs."""
        return json.loads((self.sandbox_dir(sandbox_id) / "state.json").read_text())

    def cgroups(self, sandbox_id):
        return {name: Path(path) for name, path in self.record(sandbox_id)["cgroups"].items()}

    def stop(self, sig=signal.SIGTERM, timeout=15.0):
        for pid in self.pids():
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.pids() == [], "providerd did not stop"


@pytest.fixture(scope="module")
def providerd():
    """A private per-user runtime directory and a providerd stand-in that adds
    a short private --state-dir: LocalProvider starts (and reuses) the module's
    providerd the way it starts the per-user one. Stopped at the end, after
    deleting whatever sandbox is left."""
    base = Path(tempfile.mkdtemp(prefix="agx-"))
    service = Providerd(base)
    (base / "x").mkdir(mode=0o700)
    wrapper = base / "agentix-providerd"
    # A checkout under /tmp is bound into the sandboxes by the service (a
    # server-level setting, so LocalProvider itself keeps its defaults).
    binds = " ".join(f"--local-extra-bwrap-arg={arg}" for arg in _repo_binds())
    wrapper.write_text(f'#!/bin/sh\nexec {PROVIDERD} "$@" --state-dir={service.state} {binds}\n')
    wrapper.chmod(0o755)
    saved = {name: os.environ.get(name) for name in
             ("XDG_RUNTIME_DIR", "AGENTIX_PROVIDERD", "AGENTIX_PROVIDER_URL", "AGENTIX_PROVIDER_TOKEN")}
    os.environ["XDG_RUNTIME_DIR"] = str(base / "x")
    os.environ["AGENTIX_PROVIDERD"] = str(wrapper)
    os.environ.pop("AGENTIX_PROVIDER_URL", None)
    os.environ.pop("AGENTIX_PROVIDER_TOKEN", None)
    try:
        yield service
    finally:
        if service.pids():
            asyncio.run(_delete_all(f"unix://{service.socket}"))
        service.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(base, ignore_errors=True)


async def _delete_all(url):
    async with ServiceProvider(url) as client:
        for sandbox in await client.list():
            await client.delete(sandbox.id, grace=0, allow_missing=True)


@pytest.fixture
def dirs():
    """A short private cache dir (bundles and images unpacked by the client),
    and a runtime dir for the in-process provider (a socket path must fit in 108 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="agx-"))
    yield base / "run", base / "cache"
    shutil.rmtree(base, ignore_errors=True)


def _repo_binds():
    """bubblewrap binds for a checkout under /tmp (harness.sandbox_binds)."""
    return harness.sandbox_binds()


def make_provider(providerd, dirs, **settings):
    """A LocalProvider with the defaults users get (it finds, or starts, the
    module's providerd); `settings` are per-sandbox ones (no private providerd)."""
    _, cache_dir = dirs
    provider = LocalProvider(LocalProviderConfig(cache_dir=str(cache_dir), **settings))
    assert provider._server_flags == [], "a server-level setting would start a private providerd"
    return provider


def make_inprocess_provider(dirs, **settings):
    runtime_dir, cache_dir = dirs
    settings.setdefault("extra_bwrap_args", _repo_binds())
    return InProcessLocalProvider(LocalProviderConfig(runtime_dir=str(runtime_dir), cache_dir=str(cache_dir), **settings))


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def _descendants(pid):
    found = []
    pending = [pid]
    while pending:
        current = pending.pop()
        for task in os.listdir(f"/proc/{current}/task") if os.path.isdir(f"/proc/{current}/task") else []:
            try:
                children = Path(f"/proc/{current}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append(child)
                pending.append(child)
    return found


async def _backend_ref(provider, sandbox_id):
    """GetSandbox's status.backend_ref: the local backend's "<id>:<uid>"."""
    async with ServiceProvider(provider.url) as client:
        return (await client.describe(sandbox_id)).status.backend_ref


def _in_cgroups_of(providerd, sandbox_id):
    """(pid, cgroup line) of every process in a cgroup of the sandbox, and the
    sandbox's cgroup directories that exist: what the local backend makes is
    /sys/fs/cgroup/<controller>/<providerd's own cgroup>/agentix/<id>."""
    [pid] = providerd.pids()
    dirs = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, own = line.split(":", 2)
        for controller in set(controllers.split(",")) & {"memory", "pids", "cpu"}:
            path = Path("/sys/fs/cgroup", controller, own.lstrip("/"), "agentix", sandbox_id)
            if path.exists():
                dirs.append(path)
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/cgroup").read_text()
            except OSError:
                continue
            found += [(int(entry), line) for line in text.splitlines() if line.endswith(f"/agentix/{sandbox_id}")]
    return found, dirs


def _failed_sandbox_left_nothing(providerd, error, before):
    """The sandbox a failed create names (its message says "sandbox <id>")
    has no directory, no cgroup and no process left."""
    import re

    sandbox_id = re.search(r"sandbox (sbx-[a-z0-9]+)", str(error.value)).group(1)
    assert providerd.entries() == before
    assert not providerd.sandbox_dir(sandbox_id).exists()
    assert _in_cgroups_of(providerd, sandbox_id) == ([], [])


def _wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


async def test_entry_point_names_the_local_provider():
    import agentix.provider.local

    assert providers().get("local") is agentix.provider.local.LocalProvider


async def test_session_runs_remote_calls(dev_bundle, dirs, providerd):
    provider = make_provider(providerd, dirs)
    async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as sandbox:
        # The first LocalProvider started the per-user providerd (detached,
        # on the per-user socket); it is not this process's child.
        assert provider.url == f"unix://{providerd.socket}"
        [pid] = providerd.pids()
        assert int(Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[1]) != os.getpid()
        sandbox_dir = providerd.sandbox_dir(sandbox.sandbox_id)
        assert sandbox.runtime_url == f"unix://{sandbox_dir}/run/agentix.sock"
        assert (await _backend_ref(provider, sandbox.sandbox_id)).split(":")[0] == sandbox.sandbox_id
        assert await sandbox.remote(e2e_targets.add, 2, 3) == 5
        assert await sandbox.remote(e2e_targets.async_add, 4, 5) == 9
        assert [item async for item in sandbox.remote_stream(e2e_targets.count_sync, 3)] == [0, 10, 20]
        info = await provider.get(sandbox.sandbox_id)
        assert info.status == "running" and info.runtime_url == sandbox.runtime_url
        # Each sandbox has its own token: without it the daemon refuses every RPC,
        # and the worker never sees it.
        assert sandbox.token and len(sandbox.token) >= 32 and sandbox.token not in repr(sandbox)
        assert await sandbox.remote(os.getenv, "AGENTIX_TOKEN") is None
        from agentix import RuntimeClient, Unauthenticated

        for wrong in ("", "not-the-token"):
            with pytest.raises(Unauthenticated, match="UNAUTHENTICATED"):
                async with RuntimeClient(sandbox.runtime_url, token=wrong or None, timeout=5):
                    pass
    with pytest.raises(KeyError):
        await provider.get(sandbox.sandbox_id)
    assert not sandbox_dir.exists()
    # A second provider (as another process would) reuses the running providerd.
    second = make_provider(providerd, dirs)
    async with second.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as other:
        assert await other.remote(e2e_targets.add, 1, 1) == 2
    assert providerd.pids() == [pid]
    await provider.aclose()
    await second.aclose()
    assert providerd.pids() == [pid]  # the per-user providerd outlives its clients


async def test_isolation(dev_bundle, dirs, providerd):
    import local_sandbox_probe as probe

    os.environ["AGENTIX_E2E_HOST_SECRET"] = "must-not-leak"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        provider = make_provider(providerd, dirs)
        config = SandboxConfig(image="host", bundle=str(dev_bundle), env={"AGENTIX_E2E_CONFIG_ENV": "given"})
        async with provider.session(config) as sandbox:
            facts = await sandbox.remote(probe.facts)
            tcp = await sandbox.remote(probe.connect_tcp, listener.getsockname()[1])
    finally:
        listener.close()
        del os.environ["AGENTIX_E2E_HOST_SECRET"]

    # pid namespace: the worker is a low pid and sees only the sandbox's processes.
    assert facts["pid"] < 100, facts
    assert len(facts["processes"]) <= 5, facts["processes"]
    assert not any("pytest" in cmdline or "providerd" in cmdline for cmdline in facts["processes"].values()), \
        facts["processes"]
    # net namespace: loopback only, the host's listener unreachable.
    assert facts["interfaces"] == ["lo"]
    assert tcp == "ConnectionRefusedError"
    # uts namespace.
    assert facts["hostname"] == sandbox.sandbox_id != socket.gethostname()
    # read-only root and bundle, writable scratch /tmp.
    assert facts["usr_write"] == "EROFS" and facts["nix_write"] == "EROFS" and facts["root_write"] == "EROFS"
    assert facts["tmp_write"] == "ok"
    # uid 0 without capabilities, and global kernel settings out of reach.
    assert facts["cap_eff"] == "0000000000000000"
    assert facts["sysctl_write"] == "EROFS"
    # the environment is the provider's plus the config's, not the host's.
    assert facts["host_secret"] is None and facts["config_env"] == "given" and facts["env_home"] == "/tmp"


# The boundaries of issue 17 item 6: sandbox code attacks them, each attack
# gets its definite outcome, and the sandbox keeps serving afterwards.


async def test_host_files_are_not_reachable_through_proc_fds(dev_bundle, dirs, providerd):
    """Every fd of another process the sandbox can reopen through /proc (the
    namespace's init's, the daemon's) is no host file: the daemon's output is
    a pipe providerd drains into a capped sandbox.log, so 64 MiB written into
    it leaves at most `log_max_bytes` on the host."""
    import local_sandbox_probe as probe

    provider = make_provider(providerd, dirs)
    async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as sandbox:
        host_dir = providerd.sandbox_dir(sandbox.sandbox_id)
        processes = (await sandbox.remote(probe.facts))["processes"]
        daemon = next(pid for pid, cmdline in processes.items() if "agentix-sandboxd" in cmdline)
        found = await sandbox.remote(probe.reopen_fds, 64)
        await asyncio.sleep(0.5)  # the drain catches up
        logs = sum(path.stat().st_size for path in host_dir.glob("sandbox.log*"))
        assert await sandbox.remote(e2e_targets.add, 1, 1) == 2

    host_files = {path: got for path, got in found.items()
                  if isinstance(got, tuple) and got[0] == "reg" and not got[1].startswith("/memfd:")}
    assert host_files == {}, found
    # pid 1 (bwrap's init) and the daemon: refused, or a pipe / device node, never a file.
    for pid in (1, daemon):
        for path, got in found.items():
            if path.startswith(f"/proc/{pid}/fd/"):
                assert isinstance(got, str) or got[0] in ("fifo", "chr"), (path, got)
    daemon_out = found.get(f"/proc/{daemon}/fd/1", found.get(f"/proc/{daemon}/fd"))
    assert daemon_out in ("EACCES", "EPERM") or daemon_out[0] == "fifo", daemon_out
    # 64 MiB (several times over) went into the pipe; the host kept its cap.
    assert 0 < logs <= LocalProviderConfig().log_max_bytes


async def test_writable_mounts_are_capped_tmpfs(dev_bundle, dirs, providerd):
    """Only the documented tmpfs mounts are writable, each with its size: 600
    MiB written into each fails with ENOSPC at the quota (/dev, /, /nix:
    EROFS), under a 256 MB memory limit, and the sandbox keeps serving."""
    import local_sandbox_probe as probe

    # The documented defaults (docs/PROVIDERS.md).
    sizes = {"/run/agentix": 1 << 20, "/run": 16 << 20, "/dev/shm": 64 << 20, "/tmp": 1 << 30}
    config = SandboxConfig(image="host", bundle=str(dev_bundle), resource=SandboxResource(memory="256m"))
    async with make_provider(providerd, dirs).session(config) as sandbox:
        mounts = await sandbox.remote(probe.writable_mounts)
        fills = {path: await sandbox.remote(probe.fill, path, 600)
                 for path in ("/run/agentix", "/run", "/dev/shm", "/dev", "/", "/nix")}
        assert await sandbox.remote(e2e_targets.add, 1, 1) == 2
    # devpts and mqueue hold no file data; everything else writable is a sized tmpfs.
    assert [m for m in mounts if m[1] not in ("devpts", "mqueue")] == sorted(
        (path, "tmpfs", f"size={size >> 10}k") for path, size in sizes.items()
    ), mounts
    # /tmp's default (1 GiB) is above the memory limit: its quota is checked
    # with a smaller one (LocalProviderConfig.tmp_size -> resources.scratch_bytes).
    async with make_provider(providerd, dirs, tmp_size="32m").session(config) as sandbox:
        fills["/tmp"] = await sandbox.remote(probe.fill, "/tmp", 600)
        assert await sandbox.remote(e2e_targets.add, 1, 1) == 2
    sizes["/tmp"] = 32 << 20

    for path, size in sizes.items():
        written, outcome = fills[path]
        assert outcome == "ENOSPC" and size - (1 << 20) <= written <= size, (path, fills[path])
    assert fills["/dev"] == (0, "EROFS") and fills["/"] == (0, "EROFS") and fills["/nix"] == (0, "EROFS")


async def test_kernel_escapes_are_refused(dev_bundle, dirs, providerd):
    """New user or mount namespaces, mounts, the keyring, ptrace and bpf fail
    with EPERM (seccomp); the capability bounding set is empty."""
    import local_sandbox_probe as probe

    provider = make_provider(providerd, dirs)
    async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as sandbox:
        got = await sandbox.remote(probe.kernel_escapes)
        assert await sandbox.remote(e2e_targets.add, 1, 1) == 2

    for call in ("unshare_user", "unshare_ns", "unshare_user_ns", "mount_tmpfs", "umount_proc", "keyctl",
                 "ptrace_init", "bpf"):
        assert got[call] == "EPERM", (call, got)
    assert got["cap_bnd"] == got["cap_eff"] == "0000000000000000", got
    assert got["seccomp"] == "2", got  # SECCOMP_MODE_FILTER


async def test_token_is_in_no_sandbox_visible_environment(dev_bundle, dirs, providerd):
    """The daemon's admin token reaches it through a pipe, the access token
    through an RPC: no /proc/*/environ or cmdline readable in the sandbox
    holds either (bwrap's init's included)."""
    import local_sandbox_probe as probe

    provider = make_provider(providerd, dirs)
    async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as sandbox:
        texts = await sandbox.remote(probe.proc_texts)
        assert await sandbox.remote(e2e_targets.add, 1, 1) == 2
    assert "AGENTIX_SANDBOX_ID" in texts  # the environments were readable
    assert sandbox.token not in texts and "AGENTIX_TOKEN" not in texts


async def test_entry_point_that_drops_the_token_fails_closed(dirs, tmp_path, providerd):
    """The admin token reaches the daemon only as arguments of the entry
    point: one that drops them starts a daemon without a token check, which
    `create` refuses (and tears down) instead of handing out an open sandbox."""
    bundle = _write_bundle(
        tmp_path / "bundle",
        "#!/bin/sh\n"
        f'exec {os.path.realpath(SANDBOXD)} --listen "$AGENTIX_LISTEN" '
        f"--worker {os.path.realpath(WORKER)} --venv {_venv()} {' '.join(DIRECT_CALLS_ARGS)}\n",
    )
    provider = make_provider(providerd, dirs)
    before = providerd.entries()
    with pytest.raises(RuntimeError, match="answers without a token") as error:
        await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
    _failed_sandbox_left_nothing(providerd, error, before)
    await provider.aclose()


async def test_memory_limit_kills_the_worker_not_the_sandbox(dev_bundle, dirs, providerd):
    import local_sandbox_probe as probe

    provider = make_provider(providerd, dirs)
    config = SandboxConfig(image="host", bundle=str(dev_bundle), resource=SandboxResource(memory="200m"))
    async with provider.session(config) as sandbox:
        cgroups = providerd.cgroups(sandbox.sandbox_id)
        assert cgroups["memory"].name == sandbox.sandbox_id and cgroups["memory"].parent.name == "agentix"
        assert int((cgroups["memory"] / "memory.limit_in_bytes").read_text()) == 200 << 20
        assert int((cgroups["memory"] / "memory.memsw.limit_in_bytes").read_text()) == 200 << 20
        assert await sandbox.remote(probe.allocate, 20) == 20 << 20
        with pytest.raises(WorkerExited):
            await sandbox.remote(probe.allocate, 400)
        assert "oom_kill 1" in (cgroups["memory"] / "memory.oom_control").read_text()
        # The daemon survived and starts a fresh worker.
        assert await sandbox.remote(e2e_targets.add, 1, 1) == 2
        assert (await provider.get(sandbox.sandbox_id)).status == "running"


async def test_pids_limit(dev_bundle, dirs, providerd):
    import local_sandbox_probe as probe

    provider = make_provider(providerd, dirs, pids_max=64)
    async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as sandbox:
        cgroups = providerd.cgroups(sandbox.sandbox_id)
        assert (cgroups["pids"] / "pids.max").read_text().strip() == "64"
        started = await sandbox.remote(probe.start_threads, 200)
        assert 0 < started < 64
        assert int((cgroups["pids"] / "pids.events").read_text().split()[1]) >= 1
        assert await sandbox.remote(e2e_targets.add, 1, 2) == 3


async def test_delete_leaves_nothing(dev_bundle, dirs, providerd):
    provider = make_provider(providerd, dirs)
    sandbox = await provider.create(SandboxConfig(image="host", bundle=str(dev_bundle), resource=SandboxResource(memory="1g")))
    worker_pid_inside = await sandbox.remote(e2e_targets.getpid)
    assert worker_pid_inside < 100
    host_dir = providerd.sandbox_dir(sandbox.sandbox_id)
    record = providerd.record(sandbox.sandbox_id)
    bwrap_pid = int(record["bwrap_pid"])
    assert [pid for pid in providerd.pids() if bwrap_pid in _descendants(pid)]  # providerd's child
    tree = [bwrap_pid, *_descendants(bwrap_pid)]
    assert len(tree) >= 4  # bwrap, the namespace's init, sandboxd, the worker
    cgroups = providerd.cgroups(sandbox.sandbox_id)
    assert set(cgroups) >= {"memory", "pids"} and all(path.is_dir() for path in cgroups.values())
    members, found_dirs = _in_cgroups_of(providerd, sandbox.sandbox_id)
    assert {pid for pid, _ in members} >= set(tree[1:]) and sorted(found_dirs) == sorted(cgroups.values())
    await sandbox.aclose()

    started = time.monotonic()
    await provider.delete(sandbox.sandbox_id)
    assert time.monotonic() - started < 5.0  # the daemon stops on SIGTERM, no SIGKILL wait
    assert [pid for pid in tree if _alive(pid)] == []
    assert not host_dir.exists()
    assert [path for path in cgroups.values() if path.exists()] == []
    assert _in_cgroups_of(providerd, sandbox.sandbox_id) == ([], [])
    with pytest.raises(KeyError):
        await provider.delete(sandbox.sandbox_id)
    await provider.aclose()


async def test_session_deletes_when_the_body_raises(dev_bundle, dirs, providerd):
    provider = make_provider(providerd, dirs)
    with pytest.raises(ZeroDivisionError):
        async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as sandbox:
            await sandbox.remote(e2e_targets.noop)
            assert providerd.sandbox_dir(sandbox.sandbox_id).is_dir()
            1 / 0
    assert not providerd.sandbox_dir(sandbox.sandbox_id).exists()
    with pytest.raises(KeyError):
        await provider.get(sandbox.sandbox_id)
    await provider.aclose()


async def test_sandbox_health_and_async_with(dev_bundle, dirs, providerd):
    """The original's `Sandbox.health()` and ``async with sandbox:`` (SPEC §1.1):
    leaving the block closes the sandbox's client, not the sandbox."""
    provider = make_provider(providerd, dirs)
    sandbox = await provider.create(SandboxConfig(image="host", bundle=str(dev_bundle)))
    try:
        async with sandbox as entered:
            assert entered is sandbox
            health = await sandbox.health()
            assert health.status == "ok" and health.version
            assert await sandbox.remote(e2e_targets.add, 1, 2) == 3
            assert sandbox._client is not None
        assert sandbox._client is None  # closed on the way out
        async with sandbox:  # the sandbox still runs: a fresh client
            assert (await sandbox.health()).status == "ok"
            assert await sandbox.remote(e2e_targets.add, 2, 2) == 4
        assert sandbox._client is None
    finally:
        await provider.delete(sandbox.sandbox_id)
        await provider.aclose()


async def test_call_deadline_reaches_the_client(dev_bundle, dirs, providerd):
    from agentix import CallTimeout

    provider = make_provider(providerd, dirs)
    async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle)), call_deadline=0.5) as sandbox:
        with pytest.raises(CallTimeout):
            await sandbox.remote(e2e_targets.async_sleep, 5)


async def test_failing_bootstrap_reports_its_output(dirs, providerd):
    bundle = _write_bundle(Path(tempfile.mkdtemp(prefix="agx-bad-")), "#!/bin/sh\necho 'no daemon here: broken bundle' >&2\nexit 3\n")
    try:
        provider = make_provider(providerd, dirs)
        before = providerd.entries()
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"exited with code 3[\s\S]*no daemon here: broken bundle") as error:
            await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
        assert time.monotonic() - started < 10
        _failed_sandbox_left_nothing(providerd, error, before)
        await provider.aclose()
    finally:
        shutil.rmtree(bundle)


async def test_silent_bootstrap_times_out_and_is_killed(dirs, providerd):
    bundle = _write_bundle(Path(tempfile.mkdtemp(prefix="agx-slow-")), "#!/bin/sh\necho waiting forever\nexec sleep 600\n")
    try:
        provider = make_provider(providerd, dirs, ready_timeout=1.0, stop_grace=0.5)
        before = providerd.entries()
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="waiting forever") as error:
            await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
        assert time.monotonic() - started < 10
        _failed_sandbox_left_nothing(providerd, error, before)  # `sleep 600` killed with it
        await provider.aclose()
    finally:
        shutil.rmtree(bundle)


async def test_bad_inputs_are_refused_before_anything_starts(dev_bundle, dirs, tmp_path, providerd):
    provider = make_provider(providerd, dirs)
    before = providerd.entries()
    with pytest.raises(ValueError, match="does not exist"):
        await provider.create(SandboxConfig(image="host", bundle=str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="not a bundle"):
        await provider.create(SandboxConfig(image="host", bundle=str(tmp_path)))
    with pytest.raises(ValueError, match="images are not pulled"):
        await provider.create(SandboxConfig(image="docker.io/library/python:3.11", bundle=str(dev_bundle)))
    with pytest.raises(ValueError, match="platform"):
        await provider.create(SandboxConfig(image="host", bundle=str(dev_bundle), platform="linux/s390x"))
    with pytest.raises(ValueError, match="GPU"):
        await provider.create(SandboxConfig(image="host", bundle=str(dev_bundle), resource=SandboxResource(gpu=1)))
    assert providerd.entries() == before
    # The same mistakes sent to providerd directly are refused there with the same types.
    async with ServiceProvider(f"unix://{providerd.socket}") as client:
        with pytest.raises(ValueError, match="not a bundle"):
            await client.create(SandboxConfig(image="host", bundle=str(tmp_path)))
        with pytest.raises(ValueError, match="platform"):
            await client.create(SandboxConfig(image="host", bundle=str(dev_bundle), platform="linux/s390x"))
        with pytest.raises(ValueError, match="GPU"):
            await client.create(SandboxConfig(image="host", bundle=str(dev_bundle), resource=SandboxResource(gpu=1)))
    assert providerd.entries() == before
    await provider.aclose()


def _busybox_tree(files):
    """(name, TarInfo, bytes|None) members of a tiny static-busybox root."""
    busybox = Path("/bin/busybox").read_bytes()
    members = []
    for name in ("bin", "etc"):
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        members.append((info, None))
    info = tarfile.TarInfo("bin/busybox")
    info.size, info.mode = len(busybox), 0o755
    members.append((info, busybox))
    for applet in ("sh", "cat", "echo"):
        info = tarfile.TarInfo(f"bin/{applet}")
        info.type, info.linkname = tarfile.SYMTYPE, "busybox"
        members.append((info, None))
    for name, data in files.items():
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        members.append((info, data))
    return members


def _tar_bytes(members, gzip=False):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _oci_layout(directory, layers):
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data):
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    config = put(json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers"}}).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **put(layer)} for layer in layers],
    }
    descriptor = put(json.dumps(manifest).encode())
    (directory / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (directory / "index.json").write_text(json.dumps({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", **descriptor,
            "annotations": {"org.opencontainers.image.ref.name": "v1"},
        }],
    }))


# The daemon cannot run over a busybox root (it needs the host's libraries),
# so these bundles print what the root holds and exit: the error carries it.
_SHOW_ROOT = "#!/bin/sh\necho \"marker=$(cat /etc/marker) gone=$(cat /etc/gone 2>&1)\" >&2\nexit 7\n"


# The daemon cannot run over a busybox root (it needs the host's libraries),
# so these bundles print what the root holds and exit: the error carries it.
_SHOW_ROOT = "#!/bin/sh\necho \"marker=$(cat /etc/marker) gone=$(cat /etc/gone 2>&1)\" >&2\nexit 7\n"


async def test_oci_layout_root(dirs, tmp_path, providerd):
    base = _busybox_tree({"etc/marker": b"from-oci-layer-2\n", "etc/gone": b"lower layer\n"})
    upper = [(tarfile.TarInfo("etc"), None)]
    upper[0][0].type = tarfile.DIRTYPE
    for name, data in (("etc/marker", b"from-oci-layer-2\n"), ("etc/.wh.gone", b"")):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        upper.append((info, data))
    _oci_layout(tmp_path / "layout", [_tar_bytes(base, gzip=True), _tar_bytes(upper, gzip=True)])
    bundle = _write_bundle(tmp_path / "bundle", _SHOW_ROOT)

    provider = make_provider(providerd, dirs)
    for image in (f"oci:{tmp_path / 'layout'}:v1", str(tmp_path / "layout")):
        with pytest.raises(RuntimeError, match="code 7[\\s\\S]*marker=from-oci-layer-2 gone=cat: can't open '/etc/gone'"):
            await provider.create(SandboxConfig(image=image, bundle=str(bundle)))
    unpacked = list((dirs[1] / "rootfs").iterdir())
    assert len(unpacked) == 1 and unpacked[0].name.startswith("sha256-")  # unpacked once, reused
    with pytest.raises(ValueError, match="no image tagged 'v2'"):
        await provider.create(SandboxConfig(image=f"oci:{tmp_path / 'layout'}:v2", bundle=str(bundle)))
    await provider.aclose()


async def test_hostile_layouts_and_tarballs_are_refused_and_the_cache_keeps_serving(dirs, tmp_path, providerd):
    # Issue 17 item 7: a layout whose index.json claims the good image's digest
    # must not run (nor replace) the good image; a bundle tarball with a link
    # resolving through an earlier `..` link, or a sparse bomb, is refused.
    from agentix.provider._extract import UnsafeArchiveError
    from agentix.provider._oci import ImageDigestError

    bundle = _write_bundle(tmp_path / "bundle", _SHOW_ROOT)
    good = tmp_path / "good"
    _oci_layout(good, [_tar_bytes(_busybox_tree({"etc/marker": b"good-image\n", "etc/gone": b"-\n"}), gzip=True)])
    provider = make_provider(providerd, dirs)
    with pytest.raises(RuntimeError, match="marker=good-image"):
        await provider.create(SandboxConfig(image=f"oci:{good}:v1", bundle=str(bundle)))
    good_digest = json.loads((good / "index.json").read_text())["manifests"][0]["digest"]

    evil = tmp_path / "evil"
    _oci_layout(evil, [_tar_bytes(_busybox_tree({"etc/marker": b"evil-image\n", "etc/gone": b"-\n"}), gzip=True)])
    index = json.loads((evil / "index.json").read_text())
    evil_manifest = (evil / "blobs" / "sha256" / index["manifests"][0]["digest"].partition(":")[2]).read_bytes()
    (evil / "blobs" / "sha256" / good_digest.partition(":")[2]).write_bytes(evil_manifest)
    index["manifests"][0]["digest"] = good_digest
    (evil / "index.json").write_text(json.dumps(index))
    before = providerd.entries()
    with pytest.raises(ImageDigestError, match=f"manifest blob does not match its descriptor: descriptor says {good_digest}"):
        await provider.create(SandboxConfig(image=f"oci:{evil}:v1", bundle=str(bundle)))

    up = tarfile.TarInfo("nix/runtime/up")
    up.type, up.linkname = tarfile.SYMTYPE, ".."
    passwd = tarfile.TarInfo("nix/runtime/passwd")
    passwd.type, passwd.linkname = tarfile.SYMTYPE, "up/../etc/passwd"
    bootstrap = tarfile.TarInfo("nix/runtime/bootstrap.sh")
    bootstrap.size, bootstrap.mode = len(_SHOW_ROOT), 0o4777
    hostile = tmp_path / "hostile.tar"
    hostile.write_bytes(_tar_bytes([(bootstrap, _SHOW_ROOT.encode()), (up, None), (passwd, None)]))
    with pytest.raises(UnsafeArchiveError, match="'nix/runtime/passwd' refused \\(symlink leaves the tree\\)"):
        await provider.deploy_bundle(hostile)
    with pytest.raises(UnsafeArchiveError, match="symlink leaves the tree"):
        await provider.create(SandboxConfig(image="host", bundle=str(hostile)))
    assert not (dirs[1] / "bundles").exists() or list((dirs[1] / "bundles").iterdir()) == []
    assert providerd.entries() == before  # nothing reached providerd

    # The provider keeps serving: the good image (cache entry untouched) and a good tarball.
    with pytest.raises(RuntimeError, match="marker=good-image"):
        await provider.create(SandboxConfig(image=f"oci:{good}:v1", bundle=str(bundle)))
    assert [entry.name for entry in (dirs[1] / "rootfs").iterdir()] == [f"sha256-{good_digest.partition(':')[2]}"]
    safe = tmp_path / "safe.tar"
    safe.write_bytes(_tar_bytes([(bootstrap, _SHOW_ROOT.encode())]))
    deployed = await provider.deploy_bundle(safe)
    script = Path(deployed.bundle) / "nix" / "runtime" / "bootstrap.sh"
    assert oct(os.stat(script).st_mode & 0o7777) == oct(0o755)  # setuid and world write dropped
    await provider.aclose()


async def test_rootfs_directory_and_bundle_tarball(dirs, tmp_path, providerd):
    root = tmp_path / "rootfs"
    root.mkdir()
    with tarfile.open(fileobj=io.BytesIO(_tar_bytes(_busybox_tree({"etc/marker": b"rootfs-dir\n"})))) as archive:
        archive.extractall(root)
    bundle_tar = tmp_path / "bundle.tar"
    bootstrap = _SHOW_ROOT.encode()
    info = tarfile.TarInfo("nix/runtime/bootstrap.sh")
    info.size, info.mode = len(bootstrap), 0o755
    manifest = json.dumps({"format": "agentix-bundle", "name": "probe", "tag": "v1"}).encode()
    manifest_info = tarfile.TarInfo("manifest.json")
    manifest_info.size = len(manifest)
    bundle_tar.write_bytes(_tar_bytes([(manifest_info, manifest), (info, bootstrap)]))

    provider = make_provider(providerd, dirs)
    with pytest.raises(RuntimeError, match="code 7[\\s\\S]*marker=rootfs-dir"):
        await provider.create(SandboxConfig(image=str(root), bundle=str(bundle_tar)))
    deployed = await provider.deploy_bundle(bundle_tar)
    assert deployed.metadata["name"] == "probe:v1"  # from the manifest kept in the cache
    assert (Path(deployed.bundle) / "nix" / "runtime" / "bootstrap.sh").is_file()
    assert Path(deployed.bundle).parent == dirs[1] / "bundles"
    await provider.aclose()


async def test_a_symlink_in_place_of_the_socket_is_not_trusted(dirs, tmp_path, providerd):
    """A hostile bootstrap points the socket path at another socket on the host
    that answers every RPC; providerd must not take it as the sandbox's daemon:
    the create times out, no RPC reaches the decoy, nothing is left."""
    import grpc

    reached = []

    class Decoy(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            reached.append(handler_call_details.method)

            def answer(request, context):
                return b"\x08\x01"  # HealthCheckResponse{status: SERVING}; empty-ish for the rest

            return grpc.unary_unary_rpc_method_handler(answer, lambda data: data, lambda data: data)

    decoy = grpc.aio.server()
    decoy.add_generic_rpc_handlers((Decoy(),))
    decoy.add_insecure_port(f"unix://{tmp_path / 'decoy.sock'}")
    await decoy.start()
    bundle = _write_bundle(
        tmp_path / "bundle", f"#!/bin/sh\nln -s {tmp_path / 'decoy.sock'} /run/agentix/agentix.sock\nexec sleep 600\n"
    )
    try:
        provider = make_provider(providerd, dirs, ready_timeout=1.5, stop_grace=0.2)
        before = providerd.entries()
        with pytest.raises(TimeoutError, match="agentix.sock is not a socket but a symlink \\(not trusted\\)") as error:
            await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
        assert reached == []
        _failed_sandbox_left_nothing(providerd, error, before)
        await provider.aclose()
    finally:
        await decoy.stop(None)


_CRASHING_HOST = """
import asyncio, os, signal, sys
from agentix.provider import SandboxConfig
from agentix.provider.local import LocalProvider

async def main():
    provider = LocalProvider(cache_dir=sys.argv[1], ttl=float(sys.argv[3]))
    sandbox = await provider.create(SandboxConfig(image="host", bundle=sys.argv[2], resource={"memory": "256m"}))
    print(sandbox.sandbox_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no delete(), no aclose(), no cleanup of any kind

asyncio.run(main())
"""


async def test_a_killed_host_process_leaks_its_sandboxes_for_at_most_their_ttl(dev_bundle, dirs, providerd):
    """local.py: sandboxes belong to the service; one whose host process died
    without deleting it lives (reachable, for another process to use or
    delete) until its TTL, then providerd removes everything it had."""
    ttl = 8.0  # room for the checks below on a loaded machine
    crashed = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", _CRASHING_HOST, str(dirs[1]), str(dev_bundle), str(ttl)],
        capture_output=True, text=True, timeout=60,
    )
    died = time.monotonic()
    assert crashed.returncode == -9, crashed.stderr
    sandbox_id = crashed.stdout.strip()
    cgroups = providerd.cgroups(sandbox_id)
    bwrap_pid = int(providerd.record(sandbox_id)["bwrap_pid"])
    tree = [bwrap_pid, *_descendants(bwrap_pid)]

    # Another process reaches it while its TTL lasts.
    async with ServiceProvider(f"unix://{providerd.socket}") as client:
        assert [s.id for s in await client.list() if s.id == sandbox_id] == [sandbox_id]
        sandbox = await client.connect(sandbox_id)
        assert await sandbox.remote(e2e_targets.add, 20, 22) == 42
        await sandbox.aclose()
        assert all(_alive(pid) for pid in tree)
        # Then providerd ends it by its TTL, with everything it had.
        await asyncio.to_thread(
            _wait_until, lambda: not providerd.sandbox_dir(sandbox_id).exists(), ttl + 15, "sandbox outlived its TTL"
        )
        assert time.monotonic() - died >= ttl - 3  # not before it
        record = await client.describe(sandbox_id)
        assert record.status.exit.reason == record.status.exit.TTL_EXPIRED
    assert [pid for pid in tree if _alive(pid)] == []
    assert [path for path in cgroups.values() if path.exists()] == []


async def test_a_killed_providerd_leaves_nothing_after_its_restart(dev_bundle, dirs, providerd):
    """SIGKILL to providerd: its sandboxes' processes die with it
    (bwrap --die-with-parent), their directories and cgroups stay until the
    next providerd on the same state directory, which the next call of a
    LocalProvider starts (another provider's, or the same one's) and which
    destroys them at its start."""
    provider = make_provider(providerd, dirs)
    sandbox = await provider.create(SandboxConfig(image="host", bundle=str(dev_bundle), resource=SandboxResource(memory="256m")))
    host_dir = providerd.sandbox_dir(sandbox.sandbox_id)
    cgroups = providerd.cgroups(sandbox.sandbox_id)
    bwrap_pid = int(providerd.record(sandbox.sandbox_id)["bwrap_pid"])
    tree = [bwrap_pid, *_descendants(bwrap_pid)]
    [old] = providerd.pids()
    await sandbox.aclose()

    providerd.stop(signal.SIGKILL)
    await asyncio.to_thread(_wait_until, lambda: not any(_alive(pid) for pid in tree), 10,
                            "sandbox processes outlived providerd")
    assert host_dir.is_dir() and all(path.is_dir() for path in cgroups.values())

    again = make_provider(providerd, dirs)
    async with again.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as live:
        [new] = providerd.pids()
        assert new != old  # started again, on the same socket and state directory
        assert not host_dir.exists()
        assert [path for path in cgroups.values() if path.exists()] == []
        assert again.prune() == []
        assert await live.remote(e2e_targets.add, 1, 2) == 3
        # The first provider's channel went to the dead providerd: its next
        # call reaches the new one, where its sandbox is gone.
        info = await provider.get(sandbox.sandbox_id)
        assert info.status.startswith("terminated"), info
        await provider.aclose()  # deletes what it made: no error
        assert await live.remote(e2e_targets.add, 2, 2) == 4
    await again.aclose()

    # The same provider, alone: its providerd is killed while its sandbox runs;
    # its next create starts providerd again and works.
    provider = make_provider(providerd, dirs)
    async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle))):
        providerd.stop(signal.SIGKILL)
        async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as fresh:
            assert await fresh.remote(e2e_targets.add, 3, 4) == 7
            assert len(providerd.pids()) == 1
    assert providerd.entries() == set()
    await provider.aclose()


async def test_ending_a_session_right_after_a_call_delivers_its_lines(dev_bundle, dirs, providerd):
    import logging

    import barrier_targets

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.lines = []

        def emit(self, record):
            if record.name == "agentix.sandbox.stdout":
                self.lines.append(record.getMessage())

    with on_root_logger(Keep()) as keep:
        provider = make_provider(providerd, dirs)
        for round_ in range(3):
            async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as sandbox:
                assert await sandbox.remote(barrier_targets.print_lines, 300, f"last-{round_}") == 300
            assert [line for line in keep.lines if line.startswith(f"last-{round_} ")] == [
                f"last-{round_} {i}" for i in range(300)
            ]
        await provider.aclose()


# InProcessLocalProvider (the benchmark's baseline) keeps its own internals
# tested: its runtime_dir layout and prune of a dead host process's leftovers.


async def test_in_process_provider_session_and_runtime_dir(dev_bundle, dirs):
    provider = make_inprocess_provider(dirs)
    config = SandboxConfig(image="host", bundle=str(dev_bundle), resource=SandboxResource(memory="1g"))
    async with provider.session(config) as sandbox:
        assert sandbox.sandbox_id.startswith("local-") and len(sandbox.sandbox_id) == len("local-") + 12
        assert sandbox.runtime_url == f"unix://{dirs[0]}/{sandbox.sandbox_id}/run/agentix.sock"
        assert await sandbox.remote(e2e_targets.add, 2, 3) == 5
        # The launcher joined each cgroup (a v1 `tasks` file) before bwrap ran, so the
        # whole tree is in: bwrap, the namespace's init, the daemon, the worker.
        cgroups = provider._sandboxes[sandbox.sandbox_id].cgroups.paths
        assert set(cgroups) == {"memory", "pids"}
        for path in cgroups.values():
            assert len((path / "cgroup.procs").read_text().split()) >= 4, path
        assert await sandbox.remote(os.getenv, "AGENTIX_TOKEN") is None
    assert provider._sandboxes == {}
    assert list(dirs[0].iterdir()) == []


_CRASHING_INPROCESS_HOST = """
import asyncio, os, signal, sys
from agentix.provider import SandboxConfig
from agentix.provider._local_inprocess import InProcessLocalProvider as LocalProvider

async def main():
    provider = LocalProvider(runtime_dir=sys.argv[1], cache_dir=sys.argv[2], extra_bwrap_args=sys.argv[4:])
    sandbox = await provider.create(SandboxConfig(image="host", bundle=sys.argv[3], resource={"memory": "256m"}))
    paths = provider._sandboxes[sandbox.sandbox_id].cgroups.paths.values()
    print(sandbox.sandbox_id, *paths, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no delete(), no cleanup of any kind

asyncio.run(main())
"""


async def test_in_process_leftovers_of_a_killed_host_process_are_pruned(dev_bundle, dirs):
    runtime_dir, cache_dir = dirs
    crashed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _CRASHING_INPROCESS_HOST, str(runtime_dir), str(cache_dir), str(dev_bundle),
         *_repo_binds()],
        capture_output=True, text=True, timeout=60,
    )
    assert crashed.returncode == -9, crashed.stderr
    sandbox_id, *cgroup_paths = crashed.stdout.split()
    cgroup_paths = [Path(path) for path in cgroup_paths]
    assert len(cgroup_paths) == 2  # memory and pids
    # --die-with-parent: the sandbox's processes die with the host process...
    await asyncio.to_thread(
        _wait_until, lambda: not any((path / "cgroup.procs").read_text().strip() for path in cgroup_paths), 10,
        "sandbox processes outlived their host process",
    )
    # ...but its directory and cgroups stay until a provider prunes them.
    assert (runtime_dir / sandbox_id).is_dir() and all(path.is_dir() for path in cgroup_paths)

    provider = make_inprocess_provider(dirs)
    async with provider.session(SandboxConfig(image="host", bundle=str(dev_bundle))) as live:
        # The first create pruned the dead one; a live sandbox is never pruned.
        assert not (runtime_dir / sandbox_id).exists()
        assert [path for path in cgroup_paths if path.exists()] == []
        assert make_inprocess_provider(dirs).prune() == []
        assert await live.remote(e2e_targets.add, 1, 2) == 3


async def test_in_process_first_call_takes_the_channel_of_the_readiness_check(dev_bundle, dirs):
    """The create's health check leaves its channel with the sandbox; the
    client's first connection takes it instead of opening a second one."""
    provider = make_inprocess_provider(dirs)
    try:
        sandbox = await provider.create(SandboxConfig(image="host", bundle=str(dev_bundle)))
        checked = sandbox.checked_channel
        assert checked is not None and checked.target == sandbox.runtime_url
        channel = checked._channel
        assert await sandbox.remote(e2e_targets.add, 2, 3) == 5
        assert sandbox.client._channel is channel
        assert await checked.take() is None  # taken once
        await sandbox.aclose()
        assert channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN

        # Never used for calls: aclose() closes it.
        unused = await provider.create(SandboxConfig(image="host", bundle=str(dev_bundle)))
        channel = unused.checked_channel._channel
        await unused.aclose()
        assert unused.checked_channel is None
        assert channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN

        # A client with another token does not take it (and is refused by the daemon).
        other = await provider.create(SandboxConfig(image="host", bundle=str(dev_bundle)))
        channel = other.checked_channel._channel
        other.token = "not-the-sandbox-token"
        with pytest.raises(Unauthenticated):
            await other.remote(e2e_targets.add, 1, 1)
        assert other.client._channel is not channel and other.checked_channel._channel is channel
        await other.aclose()
        assert channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN
    finally:
        await provider.aclose()
    assert list(dirs[0].iterdir()) == []


_QUIET_BOOTSTRAP = "#!/bin/sh\nexec {sandboxd} --listen \"$AGENTIX_LISTEN\" --worker {worker} --venv {venv} " \
    "--python-path {python_path} --log-level warning " + " ".join(DIRECT_CALLS_ARGS) + " \"$@\"\n"


async def test_in_process_ready_without_the_serving_line(dirs, tmp_path):
    """A daemon logging below info never writes "serving …": the create still
    finds it ready (by the slower poll) and its first call runs."""
    bundle = _write_bundle(tmp_path / "quiet", _QUIET_BOOTSTRAP.format(
        sandboxd=os.path.realpath(SANDBOXD), worker=os.path.realpath(WORKER), venv=_venv(),
        python_path=TARGETS_DIR))
    provider = make_inprocess_provider(dirs)
    async with provider.session(SandboxConfig(image="host", bundle=str(bundle))) as sandbox:
        log = provider._sandboxes[sandbox.sandbox_id].log_path
        assert await sandbox.remote(e2e_targets.add, 2, 2) == 4
        assert "serving agentix.runtime.v1" not in log.read_text()


async def test_in_process_a_false_serving_line_still_times_out_with_the_log(dirs, tmp_path):
    """The "serving" line only wakes the wait: a bootstrap that writes it and
    never serves times out within ready_timeout with its output, and one
    that writes it and dies reports its exit."""
    liar = _write_bundle(tmp_path / "liar", "#!/bin/sh\necho 'serving agentix.runtime.v1 on nothing'\nexec sleep 600\n")
    provider = make_inprocess_provider(dirs, ready_timeout=1.0, stop_grace=0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"runtime not serving[\s\S]*serving agentix.runtime.v1 on nothing"):
        await provider.create(SandboxConfig(image="host", bundle=str(liar)))
    assert time.monotonic() - started < 5
    dying = _write_bundle(tmp_path / "dying", "#!/bin/sh\necho 'serving agentix.runtime.v1 on x'\necho bye >&2\nexit 4\n")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exited with code 4[\s\S]*bye"):
        await provider.create(SandboxConfig(image="host", bundle=str(dying)))
    assert time.monotonic() - started < 5
    await provider.aclose()
    assert list(dirs[0].iterdir()) == []
