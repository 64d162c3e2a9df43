"""A fresh daemon's sequential noop p50 with the start-up placement probe's
wait at 0 (it measures at once, before stop 34) against the daemon's default
(it waits for the worker's boot and the first calls), alternating by round;
prints the probe's choice from each daemon's log.

Run with a venv that has the agentix wheel (tools/make_venv), after
`bazel build //sandbox:agentix-sandboxd //worker:agentix-worker`:

    .venv-test/bin/python testing/bench/probe_wait_ab.py --rounds 10

Each round starts a daemon, makes 300 warm-up calls and then `--calls` timed
ones, right after start: the window in which the two settings differ.
"""

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import bench_targets  # noqa: E402
import procs  # noqa: E402
from agentix.runtime.client import RuntimeClient  # noqa: E402


async def _noop_p50(sock: str, calls: int) -> float:
    async with RuntimeClient(f"unix://{sock}") as client:
        for _ in range(300):
            await client.remote(bench_targets.noop)
        lat = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await client.remote(bench_targets.noop)
            lat.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(lat)


def one(sandboxd: str, worker: str, wait_ms: int | None, calls: int) -> tuple[float, list[str]]:
    """(p50 µs, the daemon's calls_cpu log lines) for one fresh daemon."""
    flags = ["--log_level=info"] + ([] if wait_ms is None else [f"--calls_cpu_probe_wait_ms={wait_ms}"])
    with tempfile.TemporaryFile("w+") as log:
        with procs.ab_daemon(sandboxd, worker, dict(os.environ), "agx-pwab-", flags=tuple(flags),
                             log=log) as (sock, _):
            p50 = asyncio.run(_noop_p50(sock, calls))
        log.seek(0)
        return p50, [line.strip() for line in log if "calls_cpu" in line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxd", default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--worker", default=f"{REPO}/bazel-bin/worker/agentix-worker")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    p50s: dict[str, list[float]] = {"0": [], "default": []}
    for r in range(args.rounds):
        for side in (("0", "default") if r % 2 == 0 else ("default", "0")):
            p50, lines = one(args.sandboxd, args.worker, 0 if side == "0" else None, args.calls)
            p50s[side].append(p50)
            print(f"round {r + 1} wait={side}: p50 {p50:.1f} us; " + " | ".join(lines), flush=True)
    ratios = [d / z for d, z in zip(p50s["default"], p50s["0"])]
    for side, values in p50s.items():
        print(f"wait={side}: median p50 {statistics.median(values):.1f} us", [round(v, 1) for v in values])
    print(f"default / 0 per round: median {statistics.median(ratios):.3f}, range "
          f"{min(ratios):.2f}-{max(ratios):.2f}; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
