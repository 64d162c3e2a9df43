"""Fixtures that start the real `agentix-sandboxd` + `agentix-worker`.

Run through `tools/test`, which builds the binaries and the wheel, installs the
wheel into a `--system-site-packages` venv of /usr/bin/python3 and runs pytest
with that venv's interpreter. The same venv is the worker's `--venv`.
"""

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BAZEL_BIN = Path(os.environ.get("AGENTIX_BAZEL_BIN", REPO / "bazel-bin"))
SANDBOXD = BAZEL_BIN / "sandbox" / "agentix-sandboxd"
LAUNCHER = BAZEL_BIN / "sandbox" / "agentix-launch"
WORKER = BAZEL_BIN / "worker" / "agentix-worker"
TARGETS_DIR = REPO / "testing" / "fixtures" / "remote_targets"

sys.path.insert(0, str(TARGETS_DIR))

# AGENTIX_TEST_DIRECT_CALLS runs the suite with direct calls on or off
# whatever the daemon's default (docs/DIRECT-CALLS.md "Flag and default",
# testing/README.md): "1" gives every daemon a test starts --direct_calls
# (DIRECT_CALLS_ARGS) and has the host ask for them (AGENTIX_CALLS_DIRECT=auto);
# "0" gives every daemon --nodirect_calls; unset, daemons keep their default.
# A worker a test launches itself (agentix-launch) gets the worker arguments
# of the daemon's flags from the launcher. AGENTIX_CALLS_WIRE stays as the
# test sets it: its default, auto, takes the frame wire wherever a daemon has
# one, which is where a call can go direct; forcing `frames` would fail every
# TCP or --nocalls_socket test for a reason that is not direct calls.
DIRECT_SWITCH = os.environ.get("AGENTIX_TEST_DIRECT_CALLS", "")
if DIRECT_SWITCH not in ("", "0", "1"):
    raise RuntimeError(f"AGENTIX_TEST_DIRECT_CALLS must be 1, 0 or unset, not {DIRECT_SWITCH!r}")
DIRECT_CALLS_ARGS = {"1": ("--direct_calls",), "0": ("--nodirect_calls",)}.get(DIRECT_SWITCH, ())
# What a daemon that must relay says, whatever the default and the switch.
RELAYED_ARGS = ("--nodirect_calls",)
if DIRECT_SWITCH == "1":
    os.environ["AGENTIX_CALLS_DIRECT"] = "auto"


async def wait_for(predicate, timeout=10.0):
    """Polls `predicate` every 20 ms until it holds; fails the test after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def names_shared_libpython(binary) -> bool:
    """Whether an ELF file's DT_NEEDED names Debian's shared libpython3.11
    (agentix-worker does only when built with
    --define=agentix_libpython=shared; worker/BUILD.bazel)."""
    dynamic = subprocess.run(["readelf", "-d", str(binary)], check=True, capture_output=True, text=True,
                             timeout=30).stdout
    return any("(NEEDED)" in line and "[libpython3.11.so" in line for line in dynamic.splitlines())


def _venv():
    if sys.prefix == sys.base_prefix:
        pytest.exit("run the e2e suite with the venv made by tools/test", 2)
    return sys.prefix


def _thread_states(pid):
    """One line per thread of `pid`: its name, state and kernel wait channel,
    to tell where a process that does not exit is waiting."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name)):
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            lines.append(f"  {task.name} {(task / 'comm').read_text().strip()} {state} "
                         f"{(task / 'wchan').read_text().strip()}")
        except OSError:
            pass
    return "\n".join(lines)


class Daemon:
    """One running agentix-sandboxd; stops it on `stop()`."""

    def __init__(self, tmp_path, *, tcp=False, extra_args=(), env=None, popen_kwargs=None,
                 prefix=(), relayed_only=None):
        """`relayed_only`: why the test needs a relayed daemon (a sentence);
        the daemon then gets --nodirect_calls whatever the default and
        AGENTIX_TEST_DIRECT_CALLS, so the test says so rather than being
        skipped."""
        self.log_path = tmp_path / "sandboxd.log"
        if tcp:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            self.listen = f"127.0.0.1:{port}"
            self.url = self.listen
            self.socket_path = None
        else:
            self.socket_path = tmp_path / "sandboxd.sock"
            self.listen = f"unix://{self.socket_path}"
            self.url = self.listen
        # `prefix`: a command that execs the daemon (agentix-launch ... --).
        argv = [
            *prefix,
            str(SANDBOXD),
            "--listen", self.listen,
            "--worker", str(WORKER),
            "--venv", _venv(),
            "--python-path", str(TARGETS_DIR),
            *(RELAYED_ARGS if relayed_only else DIRECT_CALLS_ARGS),
            *extra_args,
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})}, **(popen_kwargs or {}),
        )
        self._wait_ready()

    def _wait_ready(self, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandboxd exited early:\n{self.log()}")
            if b"serving agentix.runtime.v1" in self.log_path.read_bytes():
                return
            time.sleep(0.02)
        raise RuntimeError(f"sandboxd not ready in {timeout}s:\n{self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace")

    def peak_rss_bytes(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    def stop(self, timeout=15.0):
        """SIGTERM, wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            # Polled rather than a blocking wait(): in a process that has used
            # grpc.aio, a blocking waitpid was seen to return ~10 s after the
            # daemon had already exited.
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None:
                if time.monotonic() > deadline:
                    threads = _thread_states(self.proc.pid)
                    self.proc.kill()
                    self.proc.wait()
                    raise RuntimeError(f"sandboxd ignored SIGTERM for {timeout} s; its threads "
                                       f"(name state wchan):\n{threads}\nits log:\n{self.log()}")
                time.sleep(0.01)
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def start_daemon(tmp_path):
    daemons = []

    def start(**kwargs):
        d = Daemon(tmp_path, **kwargs)
        daemons.append(d)
        return d

    yield start
    for d in daemons:
        d.stop()


@pytest.fixture
def daemon(start_daemon):
    return start_daemon()


def relayed_or_direct(kind, start_daemon, monkeypatch):
    """A module's `daemon` fixture parametrized ["relayed", "direct"] yields
    from this: "direct" starts the daemon with --direct_calls and the host
    asking for them (docs/DIRECT-CALLS.md), then checks the calls really went
    direct: the worker reported a handed-over connection's end (logged at
    debug level; asynchronous, so the wait is bounded)."""
    if kind == "relayed":
        yield start_daemon(relayed_only="the relayed half of a relayed/direct pair")
        return
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "auto")
    d = start_daemon(extra_args=["--direct_calls", "--log_level=debug"])
    yield d
    deadline = time.monotonic() + 10
    while "direct connection" not in d.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "direct connection" in d.log(), d.log()[-4000:]


@pytest.fixture
async def client(daemon):
    from agentix import RuntimeClient

    async with RuntimeClient(daemon.url) as c:
        yield c


class CollectedRecords(logging.Handler):
    """Every log record the host's logging tree sees during a test."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def named(self, prefix):
        """Records of loggers whose name starts with `prefix`."""
        return [r for r in self.records if r.name.startswith(prefix)]

    def messages(self, name):
        """The messages of logger `name`, in order."""
        return [r.getMessage() for r in self.records if r.name == name]


@contextlib.contextmanager
def on_root_logger(handler):
    """`handler` on the host's root logger at DEBUG for the block; the root's
    level and handlers as they were afterwards."""
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


@pytest.fixture
def collected():
    with on_root_logger(CollectedRecords()) as handler:
        yield handler


# ---- container engines (test_engine_backend.py, test_engine_providerd.py) ----
# One dockerd and one podman service for the whole session (each is started
# once and stopped at the end, whatever happened), and one bundle of
# testing/fixtures/bundle_project: the engine modules share them, and pytest
# runs all of one engine's tests before starting the other.

ENGINE_BUNDLER = BAZEL_BIN / "bundler" / "bundler"
ENGINE_PROJECT = REPO / "testing" / "fixtures" / "bundle_project"


@pytest.fixture(scope="session", params=["docker", "podman"])
def engine_service(request, tmp_path_factory):
    sys.path.insert(0, str(REPO / "testing" / "engines"))
    import engines

    tar = engines._busybox_tar(tmp_path_factory.mktemp("image"))
    try:
        engine = engines.start(request.param, tar)
    except RuntimeError as error:
        pytest.fail(str(error))
    try:
        networks = sorted(n["Name"] for n in engine.api("/networks"))
        yield engine
        # Nothing of ours makes a network (network none or host): none left.
        assert sorted(n["Name"] for n in engine.api("/networks")) == networks
    finally:
        left = engines.cleanup(engine)
    assert left == [], f"{engine.kind}: containers left behind: {left}"
    assert not engines._mounts_under(engine.root)
    assert engine.proc.poll() is not None, f"{engine.kind}: the engine still runs"


@pytest.fixture(scope="session")
def engine_bundle(tmp_path_factory):
    if not ENGINE_BUNDLER.exists():
        pytest.fail("run `bazel build //...` first")
    out = tmp_path_factory.mktemp("bundle") / "out"
    done = subprocess.run([str(ENGINE_BUNDLER), "build", str(ENGINE_PROJECT), "--output", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return out


async def disconnect_sio(sio) -> None:
    """`sio.disconnect()` (a python-socketio AsyncClient), then the end of its
    engine.io read and write loops: socketio's disconnect aborts them
    (engineio's ``abort=True``), and one still pending when the test's event
    loop closes warns at garbage collection, in whatever test runs then."""
    eio = sio.eio
    loops = [task for task in (getattr(eio, "read_loop_task", None), getattr(eio, "write_loop_task", None))
             if task is not None]
    await sio.disconnect()
    if loops:
        await asyncio.wait(loops, timeout=10)
