"""CPU time the host, the worker and the daemon spend per 16 MiB echo.

Drives `bench_targets.echo` through a real agentix-sandboxd (+ agentix-worker)
on a Unix socket and reads each process's on-CPU time around every call.
Run from a venv with the agentix host package (tools/make_venv), after
`bazel build //sandbox/... //worker/...`:

    .venv-test/bin/python testing/bench/echo_cpu.py [--calls 20] [--worker PATH]

--worker lets two worker builds be compared under the same daemon, --sandboxd
two daemon builds; --daemon-arg passes a daemon flag (e.g.
--daemon-arg=--payload_ring_bytes=0 for the socketpair-only path).
"""

import argparse
import asyncio
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--sandboxd",
                        default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--worker",
                        default=f"{REPO}/bazel-bin/worker/agentix-worker")
    parser.add_argument("--daemon-arg", action="append", default=[],
                        help="extra agentix-sandboxd flag (repeatable), e.g. "
                        "--daemon-arg=--payload_ring_bytes=0")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="agx-cpu-", dir="/tmp")  # short sun_path
    sock = os.path.join(tmp, "sandboxd.sock")
    daemon = subprocess.Popen(
        [args.sandboxd, "--listen", f"unix://{sock}", f"--worker={args.worker}",
         f"--python_path={BENCH_DIR}", "--log_level=warning",
         *args.daemon_arg])
    try:
        while not os.path.exists(sock):
            if daemon.poll() is not None:
                sys.exit(f"agentix-sandboxd exited with {daemon.returncode}")
            time.sleep(0.05)
        result = asyncio.run(run(sock, daemon.pid, args.calls, args.mib << 20))
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    worker_ms, daemon_ms, host_ms, wall_ms = result
    print(f"{args.mib} MiB echo x{args.calls}: "
          f"host CPU median {statistics.median(host_ms):.1f} ms, "
          f"worker CPU median {statistics.median(worker_ms):.1f} ms, "
          f"daemon CPU median {statistics.median(daemon_ms):.1f} ms, "
          f"wall median {statistics.median(wall_ms):.1f} ms")


async def run(sock, daemon_pid, calls, size):
    data = os.urandom(size)
    worker_ms, daemon_ms, host_ms, wall_ms = [], [], [], []
    async with RuntimeClient(f"unix://{sock}") as client:
        for _ in range(3):  # warm-up; the first call starts the worker
            assert await client.remote(bench_targets.echo, data) == data
        (worker,) = procs.children(daemon_pid)
        for _ in range(calls):
            w0, d0, h0 = cpu_ms(worker), cpu_ms(daemon_pid), cpu_ms(os.getpid())
            t0 = time.perf_counter()
            out = await client.remote(bench_targets.echo, data)
            wall_ms.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.02)  # let both processes finish their side
            host_ms.append(cpu_ms(os.getpid()) - h0)  # all threads, grpc's included
            worker_ms.append(cpu_ms(worker) - w0)
            daemon_ms.append(cpu_ms(daemon_pid) - d0)
            assert out == data
    return worker_ms, daemon_ms, host_ms, wall_ms


if __name__ == "__main__":
    main()
