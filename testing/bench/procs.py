"""Process, path and machine helpers shared by every part of the benchmark.

Every process the benchmark starts goes through `start_process`, and every one is
stopped with `stop_process` (SIGTERM, a grace period, then SIGKILL, then reaped),
so nothing outlives a run, whether it ends normally, by exception or by Ctrl-C.
"""

import asyncio
import contextlib
import glob
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

# Applied identically to every process of both stacks (host, server/daemon, worker):
# keep buffers below 32 MiB on the heap instead of fresh mmap()s and do not give
# freed memory back eagerly, so large payloads do not pay for first-touching new
# pages on every call (shared/PERFORMANCE-NOTES.md, item 3).
MALLOC_TUNABLES = (
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
)

# The Bazel workspace name: runfiles of this repository live under <runfiles>/agentix.
WORKSPACE = "agentix"

# What running one measured program (a floor, a side's round, the C++ client) can
# raise when that program, not the benchmark, failed: it exited badly or printed no
# figures (RuntimeError, ValueError), could not start (OSError) or overran its time.
# A benchmark records the error and goes on with the other figures.
RUN_FAILURES = (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError)


def machine() -> dict:
    """The machine a report's figures come from: CPUs, CPU model, kernel, Python,
    and how its idle CPUs wait (`idle_policy`)."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "idle": idle_policy()}


def idle_policy(sys_root: str = "/sys") -> dict:
    """The cpuidle governor and, under haltpoll, how long an idle vCPU polls
    before it halts (``guest_halt_poll_ns``; 0: at once): on an idle machine
    it decides what every cross-CPU hand-off costs (docs/PERFORMANCE.md, "The
    idle regime is the VM's halt policy"), so every report says which it was.
    None where not known."""
    def first_line(path: str) -> str | None:
        try:
            with open(os.path.join(sys_root, path)) as f:
                return f.readline().strip()
        except OSError:
            return None

    governor = (first_line("devices/system/cpu/cpuidle/current_governor_ro")
                or first_line("devices/system/cpu/cpuidle/current_governor"))
    poll_ns = None
    if governor == "haltpoll":
        text = first_line("module/haltpoll/parameters/guest_halt_poll_ns")
        poll_ns = int(text) if text is not None and text.isdigit() else None
    return {"cpuidle_governor": governor, "guest_halt_poll_ns": poll_ns}


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (2 decimals); None if unknown."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_reported(run: Callable[[], Awaitable], report: dict, log: Callable[[str], None],
                 deadline_s: float | None = None) -> int:
    """Runs `run()` in a new event loop (at most `deadline_s`), SIGTERM
    cancelling it, so that a benchmark still prints what it measured: an
    interruption or error is put in ``report["error"]`` (an error also
    logged). Returns the exit code: 0, 1 (error), 130 (SIGINT), 143 (SIGTERM)."""

    async def guarded():
        task = asyncio.current_task()

        def on_sigterm():
            report["error"] = "terminated (SIGTERM)"
            task.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
        await asyncio.wait_for(run(), deadline_s)

    try:
        asyncio.run(guarded())
    except (KeyboardInterrupt, asyncio.CancelledError):
        report.setdefault("error", "interrupted (SIGINT)")
        return 143 if "SIGTERM" in report["error"] else 130
    except Exception as error:  # report what we have, then fail
        report["error"] = f"{type(error).__name__}: {error}"
        log(f"error: {report['error']}")
        return 1
    return 0


def bench_dir() -> Path:
    """The directory holding this file (inside the runfiles tree under Bazel).

    Not resolved through symlinks on purpose: under Bazel the runfiles directory is
    what the workers must import from.
    """
    return Path(os.path.abspath(__file__)).parent


def runfiles_root() -> Path | None:
    """The runfiles root (the directory that contains `agentix/`), or None."""
    env = os.environ.get("RUNFILES_DIR")
    if env and Path(env, WORKSPACE).is_dir():
        return Path(env)
    manifest = os.environ.get("RUNFILES_MANIFEST_FILE", "")
    if manifest.endswith("_manifest") and Path(manifest[:-len("_manifest")], WORKSPACE).is_dir():
        return Path(manifest[:-len("_manifest")])
    for parent in bench_dir().parents:
        if parent.name.endswith(".runfiles"):
            return parent
    return None


def runfile(relpath: str) -> Path | None:
    """Path of `relpath` (relative to the workspace root) in the runfiles, if present."""
    root = runfiles_root()
    if root is None:
        return None
    path = root / WORKSPACE / relpath
    return path if path.exists() else None


def start_process(argv, *, env=None, stdin=None, stdout=None, stderr=None, cwd=None,
                  new_session=False):
    """Starts a child; `new_session=True` makes it the leader of its own process group."""
    return subprocess.Popen(
        [str(a) for a in argv],
        env=env,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        start_new_session=new_session,
    )


def stop_process(proc: subprocess.Popen, *, grace_s: float = 5.0, group: bool = False):
    """Stops `proc` (and its process group when `group`), escalating to SIGKILL; reaps it."""
    if proc is None:
        return

    def send(sig):
        try:
            if group:
                os.killpg(proc.pid, sig)
            elif proc.poll() is None:
                proc.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass

    if proc.poll() is None:
        send(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # Group members may outlive the leader: always finish the group with SIGKILL.
    if group or proc.poll() is None:
        send(signal.SIGKILL)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def wait_listening(sock: str, daemon: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Returns once the Unix socket `sock` accepts a connection; exits the
    benchmark if `daemon` exited first, raises OSError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if daemon.poll() is not None:
            sys.exit(f"agentix-sandboxd exited with {daemon.returncode}")
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(sock)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.02)


@contextlib.contextmanager
def ab_daemon(sandboxd: str, worker: str, env: dict, prefix: str = "agx-ab-",
              python_path: tuple[str, ...] = (), flags: tuple[str, ...] = (), log=None):
    """agentix-sandboxd (with `worker`, this directory and then `python_path`
    on the worker's path, warnings only, then `flags`) on a Unix socket in a
    fresh directory, for one side of a same-run A/B: yields ``(socket path,
    process)`` once it listens, then stops it and removes the directory.
    `log`: a file for its output (default: this process's)."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: sun_path is 108 bytes
    sock = os.path.join(tmp, "sandboxd.sock")
    daemon = subprocess.Popen(
        [sandboxd, "--listen", f"unix://{sock}", f"--worker={worker}",
         f"--python_path={':'.join((str(bench_dir()), *python_path))}", "--log_level=warning", *flags],
        env=env, stdout=log, stderr=log)
    try:
        wait_listening(sock, daemon)
        yield sock, daemon
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def ab_round_line(index: int, order, row: dict) -> str:
    """One A/B round (`row`: side "a"/"b" -> figures, measured in `order`)
    as a line: ``round N (a/b): key a/b, ...``."""
    def shown(value):  # small figures (switches per item) keep two decimals
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"

    return f"round {index + 1} ({'/'.join(order)}): " + ", ".join(
        f"{k} {shown(row['a'][k])}/{shown(row['b'][k])}" for k in row["a"])


def _rounded(value: float) -> float:
    """One decimal, two below 10 (switches per item)."""
    return round(value, 2 if abs(value) < 10 else 1)


def ab_summary(rows: list[dict]) -> dict:
    """Per figure of A/B `rows` (each side "a"/"b" -> figures): each side's
    median and the median of the per-round ratios b / a. Only figures that
    every round gave on both sides (a thread under a bench's threshold in
    one round, or of one side's binary only, has no ratio to take)."""
    summary = {}
    for key in rows[0]["a"]:
        if any(key not in r["a"] or key not in r["b"] for r in rows):
            continue
        summary[key] = {
            "a_median": _rounded(statistics.median(r["a"][key] for r in rows)),
            "b_median": _rounded(statistics.median(r["b"][key] for r in rows)),
            # None when a round's a side is zero (a count such as
            # preemptions per request can be): no ratio to take.
            "median_ratio_b_over_a": (round(statistics.median(
                r["b"][key] / r["a"][key] for r in rows), 3)
                if all(r["a"][key] for r in rows) else None),
        }
    return summary


def read_line(proc: subprocess.Popen, timeout_s: float) -> str | None:
    """Reads one line of `proc.stdout` (a binary pipe) within `timeout_s`; None on EOF/timeout."""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    buf = b""
    while not buf.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return None
        chunk = os.read(fd, 1)  # byte-wise: never read past the line we want
        if not chunk:
            return None
        buf += chunk
    return buf.decode("utf-8", "replace").rstrip("\n")


def children(pid: int) -> list[int]:
    """Child processes of `pid` (started by any of its threads), sorted."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
        except OSError:
            pass  # the thread ended meanwhile
    return sorted(found)


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """{thread name: on-CPU ns summed over pid's threads of that name}.
    schedstat has ns resolution; /proc/<pid>/stat counts 10 ms ticks."""
    return _thread_schedstat_ns(pid, 0)


def thread_wait_ns(pid: int) -> dict[str, int]:
    """{thread name: run-queue wait in ns (runnable, not running) summed over
    pid's threads of that name}: the second schedstat field."""
    return _thread_schedstat_ns(pid, 1)


def _thread_schedstat_ns(pid: int, field: int) -> dict[str, int]:
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/comm") as f:
                name = f.read().strip()
            with open(f"{task}/schedstat") as f:
                ns = int(f.read().split()[field])
        except OSError:
            continue  # the thread ended meanwhile
        out[name] = out.get(name, 0) + ns
    return out


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches summed over pid's threads:
    a thread's sleeps (each one a later wake-up) and its preemptions (a
    wake-up it caused, of a thread placed on its CPU, among them)."""
    voluntary = involuntary = 0
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        involuntary += int(line.split()[1])
        except OSError:
            continue  # the thread ended meanwhile
    return voluntary, involuntary
