"""Same-run A/B of two agentix-worker builds on the call path.

Alternates the two workers under one agentix-sandboxd build, one fresh daemon
per (round, worker), the order swapped every round, and prints per round and
as the median of per-round ratios (b / a):

- sequential sync noop (`bench_targets.noop`) p50 / p99 and worker CPU per call
  (all worker threads, /proc schedstat),
- sequential async noop (`intake_targets.anoop`),
- calls/s with 64 concurrent callers of the sync noop, and worker CPU per call.

`--busy` runs one pure-Python busy loop beside every measurement (one busy
core). Run from a venv with the agentix host package (tools/make_venv), after
`bazel build //sandbox:agentix-sandboxd //worker:agentix-worker`:

    .venv-test/bin/python testing/bench/worker_intake_ab.py \
        --a /tmp/worker-main --b bazel-bin/worker/agentix-worker [--rounds 6] [--busy]
"""

import argparse
import asyncio
import glob
import json
import os
import statistics
import subprocess
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import bench_targets  # noqa: E402  (by this name on both sides)
import intake_targets  # noqa: E402
import procs  # noqa: E402
from agentix import RuntimeClient  # noqa: E402


def cpu_ns(pid):
    return sum(procs.thread_cpu_ns(pid).values())


def switches(pid):
    """Times any of pid's threads was scheduled in (schedstat's third
    field): the worker's wake-ups, summed over its threads."""
    total = 0
    for task in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(task) as f:
                total += int(f.read().split()[2])
        except OSError:
            continue
    return total


def pct(values, q):
    ordered = sorted(values)
    return ordered[max(0, -(-q * len(ordered) // 100) - 1)]


async def measure(sock, daemon_pid, calls, concurrent_calls):
    out = {}
    async with RuntimeClient(f"unix://{sock}") as client:
        for _ in range(200):
            await client.remote(bench_targets.noop)
            await client.remote(intake_targets.anoop)
        (worker,) = procs.children(daemon_pid)
        for name, fn in (("sync", bench_targets.noop),
                         ("async", intake_targets.anoop)):
            lat = []
            w0, s0 = cpu_ns(worker), switches(worker)
            for _ in range(calls):
                t0 = time.perf_counter()
                await client.remote(fn)
                lat.append((time.perf_counter() - t0) * 1e6)
            w1, s1 = cpu_ns(worker), switches(worker)
            out[f"{name}_worker_wakeups"] = (s1 - s0) / calls
            out[f"{name}_p50_us"] = statistics.median(lat)
            out[f"{name}_p99_us"] = pct(lat, 99)
            out[f"{name}_worker_cpu_us"] = (w1 - w0) / 1e3 / calls
        per = concurrent_calls // 64

        async def caller():
            for _ in range(per):
                await client.remote(bench_targets.noop)

        w0 = cpu_ns(worker)
        t0 = time.perf_counter()
        s0 = switches(worker)
        await asyncio.gather(*(caller() for _ in range(64)))
        elapsed = time.perf_counter() - t0
        w1 = cpu_ns(worker)
        out["c64_worker_wakeups"] = (switches(worker) - s0) / (per * 64)
        out["calls_per_s_64"] = per * 64 / elapsed
        out["c64_worker_cpu_us"] = (w1 - w0) / 1e3 / (per * 64)
    return out


def one(sandboxd, worker, calls, concurrent_calls):
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES)
    with procs.ab_daemon(sandboxd, worker, env) as (sock, daemon):
        return asyncio.run(measure(sock, daemon.pid, calls, concurrent_calls))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="worker binary A (e.g. main's)")
    parser.add_argument("--b", required=True, help="worker binary B")
    parser.add_argument("--sandboxd",
                        default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrent-calls", type=int, default=12800)
    parser.add_argument("--busy", action="store_true",
                        help="one busy-looping process beside every measurement")
    args = parser.parse_args()
    busy = None
    if args.busy:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        rows = []
        for r in range(args.rounds):
            order = ("a", "b") if r % 2 == 0 else ("b", "a")
            row = {}
            for side in order:
                row[side] = one(args.sandboxd, getattr(args, side), args.calls,
                                args.concurrent_calls)
            rows.append(row)
            print(procs.ab_round_line(r, order, row), flush=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    summary = procs.ab_summary(rows)
    print(json.dumps({"busy": args.busy, "rounds": args.rounds,
                      "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
