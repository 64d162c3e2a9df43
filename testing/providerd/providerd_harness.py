"""Drives a real `agentix-providerd` for the e2e tests and the provider benchmark.

Only the wire contract (proto/agentix/provider/v1/provider.proto) and plain
grpcio stubs are used here, never the Python client (`agentix.provider.service`),
so the tests and the benchmark measure and check the service itself.

What is here:
  * `stubs()`: the generated `provider_pb2` / `provider_pb2_grpc` modules, from the
    `agentix` package when it ships them, else from //proto:provider_py's output
    (bazel-bin or the runfiles), mounted as the `agentix.provider.v1` package.
  * `Providerd`: one providerd process on a Unix socket with its own state dir,
    instance name and token file; start, wait until it answers, SIGTERM or
    `kill -9`, restart on the same state.
  * `write_dev_bundle`: a bundle whose bootstrap.sh execs Bazel-built binaries.
  * leftover scanners: cgroup directories, processes and mounts of sandboxes.
"""

from __future__ import annotations

import importlib
import os
import secrets
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Iterable, Sequence

SERVICE = "agentix.provider.v1.ProviderService"
REASON_KEY = "agentix-error-reason"
RETRY_AFTER_KEY = "agentix-retry-after-ms"


# --------------------------------------------------------------------------- stubs


def _generated_dirs() -> list[Path]:
    """Where //proto:provider_py's outputs may be: runfiles, then bazel-bin."""
    found = []
    here = Path(os.path.abspath(__file__))
    for parent in here.parents:
        if parent.name.endswith(".runfiles"):
            found.append(parent / "agentix" / "proto" / "agentix" / "provider" / "v1")
    env_bin = os.environ.get("AGENTIX_BAZEL_BIN")
    if env_bin:
        found.append(Path(env_bin) / "proto" / "agentix" / "provider" / "v1")
    repo = here.parents[2]
    found.append(repo / "bazel-bin" / "proto" / "agentix" / "provider" / "v1")
    return found


def stubs() -> tuple[types.ModuleType, types.ModuleType]:
    """(provider_pb2, provider_pb2_grpc)."""
    try:
        from agentix.provider.v1 import provider_pb2, provider_pb2_grpc  # shipped by the package

        return provider_pb2, provider_pb2_grpc
    except ImportError:
        pass
    import agentix.provider as provider_pkg

    for directory in _generated_dirs():
        if (directory / "provider_pb2.py").is_file() and (directory / "provider_pb2_grpc.py").is_file():
            # A package whose __path__ is the generated directory: the grpc
            # module's own `from agentix.provider.v1 import provider_pb2` then works.
            package = types.ModuleType("agentix.provider.v1")
            package.__path__ = [str(directory)]
            package.__package__ = "agentix.provider.v1"
            sys.modules["agentix.provider.v1"] = package
            provider_pkg.v1 = package
            pb2 = importlib.import_module("agentix.provider.v1.provider_pb2")
            pb2_grpc = importlib.import_module("agentix.provider.v1.provider_pb2_grpc")
            return pb2, pb2_grpc
    raise RuntimeError("provider stubs not found: bazel build //proto:provider_py "
                       f"(looked in {', '.join(map(str, _generated_dirs()))})")


# --------------------------------------------------------------------------- errors


def error_reason(error) -> str:
    """The "agentix-error-reason" trailing metadata of a grpc error ("" if none)."""
    metadata = error.trailing_metadata() or ()
    for key, value in metadata:
        if key == REASON_KEY:
            return value if isinstance(value, str) else value.decode()
    return ""


def retry_after_ms(error) -> int | None:
    metadata = error.trailing_metadata() or ()
    for key, value in metadata:
        if key == RETRY_AFTER_KEY:
            return int(value)
    return None


def ts_seconds(timestamp) -> float:
    """A google.protobuf.Timestamp as epoch seconds (0.0 when unset)."""
    return timestamp.seconds + timestamp.nanos / 1e9


def duration(seconds: float):
    """A google.protobuf.Duration of `seconds`."""
    from google.protobuf import duration_pb2

    d = duration_pb2.Duration()
    d.seconds = int(seconds)
    d.nanos = int(round((seconds - int(seconds)) * 1e9))
    return d


# --------------------------------------------------------------------------- the process


def find_providerd() -> Path:
    """The Bazel-built binary: $AGENTIX_PROVIDERD, the runfiles, else bazel-bin."""
    if os.environ.get("AGENTIX_PROVIDERD"):
        return Path(os.environ["AGENTIX_PROVIDERD"])
    here = Path(os.path.abspath(__file__))
    for parent in here.parents:
        if parent.name.endswith(".runfiles"):
            candidate = parent / "agentix" / "providers" / "agentix-providerd"
            if candidate.exists():
                return candidate
    bazel_bin = Path(os.environ.get("AGENTIX_BAZEL_BIN", here.parents[2] / "bazel-bin"))
    return bazel_bin / "providers" / "agentix-providerd"


def sandbox_binds() -> list[str]:
    """bubblewrap arguments that make a checkout under /tmp (as CI may use)
    visible in sandboxes: a sandbox gets a fresh /tmp, which would hide the
    test venv and the modules the dev bundles name (runfiles link back into
    the checkout), so the checkout is bound read-only at its own path."""
    repo = str(Path(__file__).resolve().parents[2])
    return ["--ro-bind", repo, repo] if (repo + "/").startswith("/tmp/") else []


def sandbox_bind_args() -> list[str]:
    """`sandbox_binds()` as providerd flags."""
    return [f"--local-extra-bwrap-arg={arg}" for arg in sandbox_binds()]


class Providerd:
    """One `agentix-providerd` on `unix://<workdir>/pd.sock`.

    The state dir, instance name and token stay the same across `kill9()` +
    `start()`, which is what a restart of the same service means.
    """

    def __init__(self, workdir: Path, *, instance: str | None = None, binary: Path | None = None,
                 extra_args: Sequence[str] = (), env: dict | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binary = Path(binary or find_providerd())
        self.instance = instance or f"e2e-{secrets.token_hex(4)}"
        # providerd keeps its sandboxes' socket directories under the state
        # dir, so it must be short (sun_path is 108 bytes): providerd refuses
        # one longer than 22 bytes.
        self.state_dir = self.workdir / "s"
        if len(str(self.state_dir)) > 22:
            raise ValueError(f"state dir {self.state_dir} is longer than 22 bytes: use a short work dir")
        self.socket_path = self.workdir / "pd.sock"
        self.target = f"unix://{self.socket_path}"
        self.token = secrets.token_hex(24)
        self.token_file = self.workdir / "token"
        self.token_file.write_text(self.token + "\n")
        self.token_file.chmod(0o600)
        self.metadata = (("authorization", f"Bearer {self.token}"),)
        self.extra_args = list(extra_args)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.started_at = 0.0  # time.monotonic() of the last Popen

    def argv(self) -> list[str]:
        return [str(self.binary), "--listen", self.target, "--state-dir", str(self.state_dir),
                "--instance", self.instance, "--token-file", str(self.token_file),
                *sandbox_bind_args(), *self.extra_args]

    @property
    def log_path(self) -> Path:
        return self.workdir / f"providerd.{self.starts}.log"

    def start(self, timeout: float = 30.0) -> "Providerd":
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("providerd is already running")
        self.starts += 1
        log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **(self.env or {})})
        finally:
            log.close()
        self.wait_serving(timeout)
        return self

    def wait_serving(self, timeout: float) -> None:
        """Until GetCapabilities answers (with the token)."""
        import grpc

        pb2, pb2_grpc = stubs()
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"providerd exited with {self.proc.returncode}:\n{self.log()}")
            if self.socket_path.exists():
                with grpc.insecure_channel(self.target) as channel:
                    try:
                        pb2_grpc.ProviderServiceStub(channel).GetCapabilities(
                            pb2.GetCapabilitiesRequest(), metadata=self.metadata, timeout=2.0)
                        return
                    except grpc.RpcError as error:
                        last = error
            time.sleep(0.02)
        raise RuntimeError(f"providerd did not answer within {timeout} s ({last}):\n{self.log()}")

    def log(self) -> str:
        texts = []
        for n in range(1, self.starts + 1):
            path = self.workdir / f"providerd.{n}.log"
            if path.exists():
                texts.append(f"--- providerd start {n} ---\n" + path.read_text(errors="replace")[-20000:])
        return "\n".join(texts)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill9(self) -> None:
        """`kill -9` and reap: no chance to clean anything up."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self._reap(10.0)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, bounded wait, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if not self._reap(timeout):
                os.kill(self.proc.pid, signal.SIGKILL)
                self._reap(10.0)
        return self.proc.returncode

    def _reap(self, timeout: float) -> bool:
        # Polled, not a blocking wait(): see testing/e2e/conftest.py's Daemon.stop.
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


# --------------------------------------------------------------------------- bundles


def write_dev_bundle(directory: Path, *, sandboxd: Path, worker: Path, python_path: str,
                     venv: str | None = None, mark: str = "", probe_source: str = "",
                     prestart_worker: bool = False, daemon_args: Iterable[str] = ()) -> Path:
    """A development bundle: nix/runtime/bootstrap.sh execs the Bazel-built
    daemon (by its absolute host path: the sandbox's root is the host's,
    read-only) with the arguments the backend gives it (--admin-token-file ...).
    `mark` goes into the daemon's environment, to find its processes later.
    `prestart_worker`: pass --prestart-worker, as a built bundle's bootstrap.sh
    does. `daemon_args`: more of the daemon's flags (e.g. --direct_calls)."""
    runtime = Path(directory) / "nix" / "runtime"
    runtime.mkdir(parents=True)
    venv_arg = f" --venv {venv}" if venv else ""
    (runtime / "bootstrap.sh").write_text(
        "#!/bin/sh\n"
        + (f"export AGENTIX_E2E_MARK={mark}\n" if mark else "")
        + f'exec {os.path.realpath(sandboxd)} --listen "$AGENTIX_LISTEN" '
        f"--worker {os.path.realpath(worker)}{venv_arg} --python-path {python_path}"
        + (" --prestart-worker" if prestart_worker else "")
        + "".join(f" {arg}" for arg in daemon_args) + ' "$@"\n')
    (runtime / "bootstrap.sh").chmod(0o755)
    if probe_source:
        (runtime / "probe").mkdir()
        (runtime / "probe" / "provider_sandbox_probe.py").write_text(probe_source)
    return Path(directory)


# --------------------------------------------------------------------------- leftovers


def cgroup_dirs(names: Iterable[str], root: str = "/sys/fs/cgroup", max_depth: int = 8) -> list[str]:
    """Cgroup directories whose name contains one of `names` (sandbox ids / uids)."""
    names = [n for n in names if n]
    if not names:
        return []
    found = []
    root_depth = root.rstrip("/").count("/")
    for current, dirs, _ in os.walk(root):
        if current.count("/") - root_depth >= max_depth:
            dirs[:] = []
        for d in dirs:
            if any(n in d for n in names):
                found.append(os.path.join(current, d))
    return sorted(found)


def agentix_cgroup_children(root: str = "/sys/fs/cgroup", max_depth: int = 8) -> set[str]:
    """Every directory directly under a cgroup directory named "agentix"."""
    found = set()
    root_depth = root.rstrip("/").count("/")
    for current, dirs, _ in os.walk(root):
        if current.count("/") - root_depth >= max_depth:
            dirs[:] = []
        if os.path.basename(current) == "agentix":
            found.update(os.path.join(current, d) for d in dirs)
    return found


def processes_with(needles: Iterable[bytes]) -> dict[int, str]:
    """Live (non-zombie) processes whose environ or cmdline holds one of `needles`."""
    needles = [n for n in needles if n]
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                if handle.read().rsplit(b") ", 1)[1][:1] == b"Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    environ = handle.read()
            except OSError:
                environ = b""
        except (OSError, IndexError):
            continue
        if any(n in cmdline or n in environ for n in needles):
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
    return found


def mounts_with(needles: Iterable[str]) -> list[str]:
    """Lines of this mount namespace's mountinfo that mention one of `needles`."""
    needles = [n for n in needles if n]
    with open("/proc/self/mountinfo") as handle:
        return [line.strip() for line in handle if any(n in line for n in needles)]


def wait_until(predicate, timeout: float, interval: float = 0.05):
    """Polls `predicate()` until truthy (returned) or `timeout` s (returns the last value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
