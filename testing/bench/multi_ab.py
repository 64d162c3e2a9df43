"""Same-run A/B of --calls_cpu with many sandboxes on one machine (stop 25: placement on
by default must not pile sandboxes onto one CPU, nor pin user code).

    bazel run //testing/bench:multi_ab                         # ~2 minutes
    bazel run //testing/bench:multi_ab -- --main-dir DIR       # also stop 24's binaries
    bazel run //testing/bench:multi_ab -- --rounds 1 --seconds 1 --threaded 1   # smoke

Sides, alternating in rotated order each round (all daemons of a side fresh):
- `off`:  every daemon --calls_cpu=off, every host AGENTIX_CALLS_CPU=off;
- `on`:   the defaults of stops 25-31 (since stop 32 the daemon's is --calls_cpu=probe,
          which places the daemon as auto does): every daemon --calls_cpu=auto (each pins its call path's waits to
          the CPU its worker reader runs on, or the one its host names), every host with
          AGENTIX_CALLS_CPU unset (pinned waits);
- `main`: --calls_cpu=auto with the agentix-sandboxd and agentix-worker of --main-dir
          (e.g. stop 24's, whose auto pinned every daemon's call path and whole worker
          to the highest CPU), hosts AGENTIX_CALLS_CPU=off, only with --main-dir.

Per side: --daemons daemons, each with one Python host process making sequential
CPU-bound calls (bench_targets.busy_loops(--call-loops), ~2 ms) for --seconds, all in the same window:
total calls/s. Then, with those daemons idle and one of them warmed up by sequential
calls (so its call path is pinned), --threaded calls that each start two threads that
hash --threaded-mib MiB each without the GIL (bench_targets.busy_threads; ~200 ms on a
free CPU): their wall time (ms; about one thread's time with two CPUs free, twice that if
the call's threads were on one CPU).

Output: a line per side and round, then per figure the medians and the median over
rounds of the per-round ratio side / off; LAST, one JSON line. Judge by the ratios:
calls/s on/off must not fall below ~1, threaded wall time on/off must be ~1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

sys.path[0] = os.path.dirname(os.path.abspath(__file__))

import procs  # noqa: E402

# One sequential caller: argv = socket, loops per call, seconds. Warms up, prints READY,
# reads the common start (time.time()) from stdin, keeps calling until then, and prints
# `RESULT {json}` with the calls finished inside [start, start + seconds].
_CALLER = r"""
import asyncio, json, sys, time
import bench_targets
from agentix import RuntimeClient

sock, loops, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])


async def main():
    async with RuntimeClient(f"unix://{sock}") as client:
        for _ in range(20):
            await client.remote(bench_targets.busy_loops, 1000)
        print("READY", flush=True)
        start = float(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
        while time.time() < start:
            await client.remote(bench_targets.busy_loops, loops)
        done = 0
        while time.time() < start + seconds:
            await client.remote(bench_targets.busy_loops, loops)
            done += 1
    print("RESULT " + json.dumps({"calls": done}), flush=True)

asyncio.run(main())
"""

# Threaded calls on one daemon: argv = socket, count; prints `RESULT {json}`.
_THREADED = r"""
import asyncio, json, statistics, sys
import bench_targets
from agentix import RuntimeClient

sock, count, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


async def main():
    async with RuntimeClient(f"unix://{sock}") as client:
        walls = []
        for _ in range(count):
            for _ in range(100):  # one at a time: the call path is pinned
                await client.remote(bench_targets.noop)
            walls.append(await client.remote(bench_targets.busy_threads, 2, mib))
    print("RESULT " + json.dumps({"threaded_wall_ms": round(statistics.median(walls), 1)}),
          flush=True)

asyncio.run(main())
"""


def _result(proc_stdout: str) -> dict:
    lines = [l for l in proc_stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"no RESULT: {proc_stdout[-500:]!r}")
    return json.loads(lines[-1][len("RESULT "):])


def one_side(bins: dict, flags: list[str], args, env: dict, host_env: dict) -> dict:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(procs.ab_daemon(
            bins["sandboxd"], bins["worker"], env, prefix="agx-multi-", flags=tuple(flags)))[0]
            for _ in range(args.daemons)]
        callers = [subprocess.Popen(
            [sys.executable, "-c", _CALLER, sock, str(args.call_loops), str(args.seconds)],
            env={**env, **host_env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for sock in socks]
        for caller in callers:  # every caller connected and warm
            line = caller.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"a caller did not start: {line!r}")
        start = time.time() + args.warmup_s
        for caller in callers:
            caller.stdin.write(f"{start}\n")
            caller.stdin.flush()
        calls = 0
        for caller in callers:
            out, _ = caller.communicate(timeout=args.warmup_s + args.seconds + 120)
            calls += _result(out)["calls"]
        threaded = subprocess.run(
            [sys.executable, "-c", _THREADED, socks[0], str(args.threaded),
             str(args.threaded_mib)], env={**env, **host_env},
            stdout=subprocess.PIPE, text=True, timeout=120, check=True)
        return {"calls_per_s": round(calls / args.seconds, 1),
                **_result(threaded.stdout)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--daemons", type=int, default=6)
    parser.add_argument("--call-loops", type=int, default=200000,
                        help="Python loop turns per call (~2 ms here under load)")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup-s", type=float, default=1.0,
                        help="seconds of calls, all callers at once, before the window")
    parser.add_argument("--threaded", type=int, default=5,
                        help="threaded calls per side and round (their median counts)")
    parser.add_argument("--threaded-mib", type=int, default=50,
                        help="MiB each of a threaded call's two threads hashes")
    parser.add_argument("--main-dir", default="",
                        help="a directory with older agentix-sandboxd and agentix-worker "
                             "binaries: adds the `main` side")
    args = parser.parse_args(argv)
    here = {name: procs.runfile(path) for name, path in (
        ("sandboxd", "sandbox/agentix-sandboxd"), ("worker", "worker/agentix-worker"))}
    if not all(here.values()):
        sys.exit("run it with bazel run //testing/bench:multi_ab")
    here = {k: str(v) for k, v in here.items()}
    off = {"AGENTIX_CALLS_CPU": "off"}
    sides = {"off": (here, ["--calls_cpu=off"], off), "on": (here, ["--calls_cpu=auto"], {})}
    if args.main_dir:
        sides["main"] = ({"sandboxd": os.path.join(args.main_dir, "agentix-sandboxd"),
                          "worker": os.path.join(args.main_dir, "agentix-worker")},
                         ["--calls_cpu=auto"], off)
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES,
               PYTHONPATH=os.pathsep.join([str(procs.bench_dir())] + sys.path[1:]))
    env.pop("AGENTIX_CALLS_CPU", None)
    names = list(sides)
    rounds = []
    t0 = time.monotonic()
    load_start = procs.loadavg()
    for index in range(args.rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        row = {}
        for name in order:
            bins, flags, host_env = sides[name]
            row[name] = one_side(bins, flags, args, env, host_env)
            print(f"round {index + 1} {name:<4} {row[name]}", flush=True)
        rounds.append(row)
    summary = {}
    for key in rounds[0]["off"]:
        summary[key] = {name: {"median": statistics.median(r[name][key] for r in rounds)}
                        for name in names}
        for name in names[1:]:
            summary[key][name]["median_ratio_over_off"] = round(statistics.median(
                r[name][key] / r["off"][key] for r in rounds), 3)
    for key, per in summary.items():
        print(f"{key}: " + ", ".join(f"{n} {v['median']}" + (
            f" ({v['median_ratio_over_off']}x off)" if "median_ratio_over_off" in v else "")
            for n, v in per.items()))
    print(json.dumps({"summary": summary, "rounds": rounds, "daemons": args.daemons,
                      "call_loops": args.call_loops, "seconds": args.seconds,
                      "load": {"start": load_start, "end": procs.loadavg()},
                      "elapsed_s": round(time.monotonic() - t0, 1),
                      "machine": procs.machine()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
