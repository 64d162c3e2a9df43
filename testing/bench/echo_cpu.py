"""CPU time and page faults the host, the worker and the daemon spend per
large echo (16 MiB by default).

Drives `bench_targets.echo` through a real agentix-sandboxd (+ agentix-worker)
on a Unix socket and reads each process's on-CPU time and minor page faults
around every call. Run from a venv with the agentix host package
(tools/make_venv), after `bazel build //sandbox/... //worker/...`:

    .venv-test/bin/python testing/bench/echo_cpu.py [--calls 20] [--mib 1 --mib 16] [--worker PATH]

--worker lets two worker builds be compared under the same daemon, --sandboxd
two daemon builds; --daemon-arg passes a daemon flag (e.g.
--daemon-arg=--payload_ring_bytes=0 for the socketpair-only path).
--malloc-tunables runs all three processes with the benchmarks'
procs.MALLOC_TUNABLES (as remote_calls does; without it, malloc as users
have it); --env NAME=VALUE sets a variable for the daemon and its worker
(e.g. --env AGENTIX_WORKER_LARGE_BUFFERS=0). The last
line is JSON: {"<mib>": {"wall_ms", "host_ms", "daemon_ms", "worker_ms",
"host_faults", "daemon_faults", "worker_faults" (medians per echo),
"fresh_page_echoes": {process: the echoes in which it faulted in half the
payload's pages or more}}};
echo_ab.py alternates two builds with it.
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import bench_targets  # noqa: E402  (by this name on both sides)
import procs  # noqa: E402
from agentix import RuntimeClient  # noqa: E402


def cpu_ms(pid):
    """On-CPU time of all of pid's threads, in ms."""
    return sum(procs.thread_cpu_ns(pid).values()) / 1e6


def faults(pid):
    """Minor page faults of all of pid's threads so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[7])  # minflt: the 10th field, 8th after the command


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--mib", type=int, action="append",
                        help="payload size in MiB (repeatable; default 16)")
    parser.add_argument("--sandboxd",
                        default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--worker",
                        default=f"{REPO}/bazel-bin/worker/agentix-worker")
    parser.add_argument("--daemon-arg", action="append", default=[],
                        help="extra agentix-sandboxd flag (repeatable), e.g. "
                        "--daemon-arg=--payload_ring_bytes=0")
    parser.add_argument("--malloc-tunables", action="store_true",
                        help="GLIBC_TUNABLES=procs.MALLOC_TUNABLES for the host, "
                        "the daemon and the worker")
    parser.add_argument("--env", action="append", default=[],
                        help="NAME=VALUE for the daemon and its worker (repeatable)")
    args = parser.parse_args()
    if args.malloc_tunables and os.environ.get("GLIBC_TUNABLES") != procs.MALLOC_TUNABLES:
        # glibc reads them at process start: this process starts again with them.
        env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES)
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    daemon_env = dict(os.environ)
    for entry in args.env:
        name, sep, value = entry.partition("=")
        if not sep or not name:
            parser.error(f"--env wants NAME=VALUE, not {entry!r}")
        daemon_env[name] = value
    sizes = args.mib or [16]
    tmp = tempfile.mkdtemp(prefix="agx-cpu-", dir="/tmp")  # short sun_path
    sock = os.path.join(tmp, "sandboxd.sock")
    daemon = subprocess.Popen(
        [args.sandboxd, "--listen", f"unix://{sock}", f"--worker={args.worker}",
         f"--python_path={BENCH_DIR}", "--log_level=warning",
         *args.daemon_arg], env=daemon_env)
    try:
        while not os.path.exists(sock):
            if daemon.poll() is not None:
                sys.exit(f"agentix-sandboxd exited with {daemon.returncode}")
            time.sleep(0.05)
        results = asyncio.run(run(sock, daemon.pid, args.calls, sizes))
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {}
    for mib, samples in zip(sizes, results):
        medians = {key: statistics.median(values) for key, values in samples.items()}
        # Echoes where a process first-touched at least half the payload's
        # pages: the median hides them, the mean and a round's median of few
        # echoes do not (a fresh page costs ~11 us on these VMs).
        half = (mib << 20) // 4096 // 2
        fresh = {name: sum(f >= half for f in samples[f"{name}_faults"])
                 for name in ("host", "daemon", "worker")}
        medians["fresh_page_echoes"] = fresh
        summary[str(mib)] = medians
        print(f"{mib} MiB echo x{args.calls}: "
              f"wall {medians['wall_ms']:.1f} ms; CPU host {medians['host_ms']:.1f} / "
              f"daemon {medians['daemon_ms']:.1f} / worker {medians['worker_ms']:.1f} ms; "
              f"faults host {medians['host_faults']:.0f} / daemon "
              f"{medians['daemon_faults']:.0f} / worker {medians['worker_faults']:.0f} (medians); "
              f"echoes that faulted in half the payload or more: {fresh}")
    print(json.dumps(summary))


async def run(sock, daemon_pid, calls, sizes):
    results = []
    async with RuntimeClient(f"unix://{sock}") as client:
        await client.remote(bench_targets.echo, b"")  # starts the worker
        (worker,) = procs.children(daemon_pid)
        pids = {"host": os.getpid(), "daemon": daemon_pid, "worker": worker}
        for mib in sizes:
            data = os.urandom(mib << 20)
            for _ in range(3):  # warm-up
                assert await client.remote(bench_targets.echo, data) == data
            samples = {"wall_ms": []}
            for name in pids:
                samples[f"{name}_ms"] = []
                samples[f"{name}_faults"] = []
            for _ in range(calls):
                before = {name: (cpu_ms(pid), faults(pid)) for name, pid in pids.items()}
                t0 = time.perf_counter()
                out = await client.remote(bench_targets.echo, data)
                samples["wall_ms"].append((time.perf_counter() - t0) * 1000)
                del out  # freed before the counters are read, as a caller would
                time.sleep(0.02)  # let both processes finish their side
                for name, pid in pids.items():
                    cpu0, faults0 = before[name]
                    samples[f"{name}_ms"].append(cpu_ms(pid) - cpu0)  # all threads
                    samples[f"{name}_faults"].append(faults(pid) - faults0)
            results.append(samples)
    return results


if __name__ == "__main__":
    main()
