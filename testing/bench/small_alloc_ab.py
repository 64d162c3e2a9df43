"""The small-call path's cost for workers A and B, alternated: the worker's
CPU per sequential noop call, and ns per bytes object of 600 bytes (CPython's
raw allocator path) and of 100 bytes (its small-object path) made in the
worker.

    .venv-test/bin/python testing/bench/small_alloc_ab.py --a-worker OLD --b-worker NEW [--rounds 6]

Both under bazel-bin's agentix-sandboxd. Prints each round and the medians'
ratios b/a.
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

import bench_targets  # noqa: E402
import procs  # noqa: E402
from agentix import RuntimeClient  # noqa: E402

KEYS = ("noop_worker_cpu_us", "alloc600_ns", "alloc100_ns")


async def measure(sandboxd, worker, calls):
    tmp = tempfile.mkdtemp(prefix="agx-sab-", dir="/tmp")
    sock = os.path.join(tmp, "sandboxd.sock")
    daemon = subprocess.Popen(
        [sandboxd, "--listen", f"unix://{sock}", f"--worker={worker}",
         f"--python_path={BENCH_DIR}", "--log_level=error"])
    try:
        while not os.path.exists(sock):
            if daemon.poll() is not None:
                sys.exit(f"agentix-sandboxd exited with {daemon.returncode}")
            time.sleep(0.05)
        async with RuntimeClient(f"unix://{sock}") as client:
            for _ in range(calls):
                await client.remote(bench_targets.noop)
            (pid,) = procs.children(daemon.pid)
            cpu0 = sum(procs.thread_cpu_ns(pid).values())
            for _ in range(calls):
                await client.remote(bench_targets.noop)
            cpu = (sum(procs.thread_cpu_ns(pid).values()) - cpu0) / calls / 1000
            a600 = await client.remote(bench_targets.alloc_ns, 600, 300_000)
            a100 = await client.remote(bench_targets.alloc_ns, 100, 300_000)
        return dict(zip(KEYS, (cpu, a600, a100)))
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-worker", required=True)
    parser.add_argument("--b-worker", required=True)
    parser.add_argument("--sandboxd", default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    rows = {"a": [], "b": []}
    for r in range(args.rounds):
        order = [("a", args.a_worker), ("b", args.b_worker)]
        if r % 2:
            order.reverse()
        for name, worker in order:
            rows[name].append(asyncio.run(measure(args.sandboxd, worker, args.calls)))
        print(f"round {r + 1}: " + ", ".join(
            f"{k} {rows['a'][-1][k]:.1f}/{rows['b'][-1][k]:.1f}" for k in KEYS), flush=True)
    for k in KEYS:
        ratios = [b[k] / a[k] for a, b in zip(rows["a"], rows["b"])]
        print(f"{k}: a {statistics.median(r[k] for r in rows['a']):.1f}, "
              f"b {statistics.median(r[k] for r in rows['b']):.1f}, "
              f"median ratio b/a {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
