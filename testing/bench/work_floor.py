"""The machine's own tail for a call's length of plain work (issue 25's p99 <= 2 x p50).

    python3 work_floor.py --chunk-us 50 [--chunks 20000] [--quick]

Times `--chunks` back-to-back chunks of pure Python work (no system call, no
allocation that grows, no other thread or process), each sized at start to cost
about `--chunk-us` microseconds of CPU (its wall time is then what the machine
makes of that), and prints one JSON line: the
chunks' p50/p90/p99 under the same keys as a noop (`noop_p50_us`,
`noop_p99_us`, ...), so that the benchmarks read its p99 / p50 beside ours.

Why: a noop's tail is the sum of what its hand-offs add and what the machine
takes from any code running that long. On these VMs the second is large — the
hypervisor stops a vCPU 1,400-2,300 times a second for ~15-20 µs (invisible to
the guest's /proc/interrupts), and a Python working set pays more than that
after each stop — so a chunk of work with no hand-off at all has a p99 / p50 of
its own, measured here in the same run as ours (docs/PERFORMANCE.md, "stop-65:
the machine's tail for plain work"). Ours over this is what the call path adds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time

import workloads

# The chunk's unit: the kind of work a host's call turn does (a dict lookup, a
# list index, a struct pack, a call), with nothing kept between units.
_PACK = struct.Struct("<IQ").pack
_RECORD = {"id": 1, "sizes": [3, 5, 7]}


def chunk(units: int) -> int:
    """`units` units of work; returns a number so that nothing is optimised away."""
    total = 0
    sizes = _RECORD["sizes"]
    for i in range(units):
        total += len(_PACK(i, i * 3)) + sizes[i % 3]
    return total


def time_chunks(units: int, count: int, clock=time.perf_counter_ns) -> list[int]:
    """The wall time (ns) of each of `count` back-to-back chunks of `units` units."""
    out = []
    append = out.append
    for _ in range(count):
        start = clock()
        chunk(units)
        append(clock() - start)
    return out


def chunk_cpu_ns(units: int, count: int, clock=time.thread_time_ns) -> float:
    """The CPU time (ns) one chunk of `units` units costs this thread: the mean
    over `count` back to back. CPU time, not wall time: a chunk that shares
    its CPU for a moment (the busy core's spinner before the scheduler moves
    one of them) is not counted long, so the size does not shrink with it."""
    start = clock()
    for _ in range(count):
        chunk(units)
    return (clock() - start) / count


def calibrate(target_us: float, cost=chunk_cpu_ns, tries: int = 6) -> int:
    """Units per chunk that cost about `target_us` of CPU (within 10 %, or the
    last estimate after `tries`), scaled each try from 101 chunks' mean."""
    units = 64
    for _ in range(tries):
        per_chunk_us = cost(units, 101) / 1e3
        if per_chunk_us <= 0:  # a clock too coarse to see them: more units
            units *= 4
            continue
        wanted = max(1, round(units * target_us / per_chunk_us))
        if abs(wanted - units) <= 0.1 * units:
            return wanted
        units = wanted
    return units


def summarize(latencies_ns: list[int]) -> dict:
    """p50 (the median), p90 and p99 (nearest rank, as workloads.py reads a
    noop's) in µs, p99 / p50 and the share of chunks over 2 x p50."""
    ordered = sorted(latencies_ns)
    n = len(ordered)
    if n == 0:
        raise ValueError("no chunks timed")

    def at(q: float) -> float:
        return workloads.percentile(ordered, q) / 1e3

    p50, p99 = statistics.median(ordered) / 1e3, at(0.99)
    return {
        "noop_p50_us": round(p50, 1),
        "noop_p90_us": round(at(0.90), 1),
        "noop_p99_us": round(p99, 1),
        "p99_over_p50": round(p99 / p50, 2) if p50 > 0 else None,
        "over_2x_p50_share": round(sum(1 for x in ordered if x > 2 * ordered[n // 2]) / n, 4),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-us", type=float, default=50.0,
                        help="the chunk's median length to size it to (µs; a noop's p50)")
    parser.add_argument("--chunks", type=int, default=20000, help="chunks to time")
    parser.add_argument("--quick", action="store_true", help="3,000 chunks (smoke run)")
    args = parser.parse_args(argv)
    if not 1 <= args.chunk_us <= 100_000:
        parser.error(f"--chunk-us {args.chunk_us} is not between 1 and 100000")
    if args.chunks < 100:
        parser.error(f"--chunks {args.chunks} is under 100")
    count = 3000 if args.quick else args.chunks
    units = calibrate(args.chunk_us)
    cpu_start = time.process_time_ns()
    wall_start = time.perf_counter_ns()
    latencies = time_chunks(units, count)
    wall_ns = time.perf_counter_ns() - wall_start
    report = {"kind": "python_work", "chunk_us_target": args.chunk_us, "chunk_units": units,
              "chunks": count, **summarize(latencies),
              # Under 1.0 when something else ran on our CPU in between.
              "cpu_share": round((time.process_time_ns() - cpu_start) / wall_ns, 3),
              "python": sys.executable, "pid": os.getpid()}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
