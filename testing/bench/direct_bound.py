"""The bound of direct calls (docs/DIRECT-CALLS.md): the same worker binary's
sequential noop with and without the daemon's hop, same run, alternating.

Per round, in an order that alternates between rounds, each on the same load:

- `direct`: `worker_direct` spawns agentix-worker on a socketpair with a
  payload area (as the daemon does; no CPU published in it: nothing pinned)
  and ping-pongs `call` / `result` frames for bench_targets.noop with it:
  the worker's own round trip;
- `direct_slow` (`--caller-work-us T`, default 40; 0 leaves it out): the same
  with T µs of the caller's own CPU spun before each call (outside the
  timing), standing in for the Python host's per-call work, so the worker
  sleeps between calls as it would behind that host;
- `relayed`: a fresh agentix-sandboxd with the same worker, `--nodirect_calls --calls_cpu=off`,
  and the C++ client (`cc_remote_calls --noops=N`, `AGENTIX_CALLS_CPU=off`)
  on the frame wire: the same calls through the daemon, nothing pinned;
- `relayed_default` (unless `--no-default`): the same with the daemon's and
  the client's default placement (`--calls_cpu=probe`, pinned waits);
- the machine's floors: `unix_pingpong` plain (two processes) and
  `--relay-poll` (a third process relaying as the daemon does).

Both clients are C++, and both calls run the same msgpack noop in the same
worker, so `relayed - direct` is the daemon's hop plus the protobuf framing
the C++ client does instead of msgpack (small: see the doc). CPU a call:
the client's own, the worker's and (relayed) the daemon's, from each
process's threads' schedstat run time; the relayed sides' daemon and worker
figures include the client's N/5 warm-up calls (cc_remote_calls counts them).

`--busy` keeps one spinning process (`sh -c 'while :; do :; done'`) running
over the round, the issue's busy regime.

    /usr/bin/python3 testing/bench/direct_bound.py [--rounds 4] [--calls 10000] [--busy] \\
        [--sandboxd B/agentix-sandboxd --worker B/agentix-worker] \\
        [--cc B/testing/bench/cc_remote_calls --direct B/testing/bench/worker_direct \\
         --floor B/testing/bench/floor/unix_pingpong]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import procs  # noqa: E402

# Each side's figures, and the ratios the report gives (numerator, denominator).
RATIOS = {
    "p50 relayed / direct": ("relayed.p50_us", "direct.p50_us"),
    "p99 relayed / direct": ("relayed.p99_us", "direct.p99_us"),
    "CPU relayed / direct": ("relayed.cpu_us", "direct.cpu_us"),
    "p50 relayed_default / direct": ("relayed_default.p50_us", "direct.p50_us"),
    "worker CPU relayed / direct": ("relayed.worker_cpu_us", "direct.worker_cpu_us"),
    "worker CPU relayed / direct_slow": ("relayed.worker_cpu_us", "direct_slow.worker_cpu_us"),
    "CPU relayed_default / direct": ("relayed_default.cpu_us", "direct.cpu_us"),
    "p50 relay floor / plain floor": ("floor_relay.p50_us", "floor_plain.p50_us"),
    "CPU relay floor / plain floor": ("floor_relay.cpu_us", "floor_plain.cpu_us"),
}


def task_cpu_ns(pid: int) -> int:
    """The run time of every thread of `pid` (schedstat), summed."""
    return sum(procs.thread_cpu_ns(pid).values())


def direct_side(args, env, caller_work_us: int = 0) -> dict:
    out = subprocess.run([args.direct, f"--worker={args.worker}", f"--python-path={BENCH_DIR}",
                          f"--calls={args.calls}", "--payload-area",
                          f"--client-work-us={caller_work_us}"],
                         env=env, check=True, capture_output=True, text=True, timeout=600)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    client_us = row["client_cpu_us_per_call"] - caller_work_us  # the spin is not the path's
    return {"p50_us": row["p50_us"], "p99_us": row["p99_us"],
            "client_cpu_us": client_us,
            "worker_cpu_us": row["worker_cpu_us_per_call"],
            "daemon_cpu_us": 0.0,
            "cpu_us": client_us + row["worker_cpu_us_per_call"]}


def relayed_side(args, env, default_placement: bool) -> dict:
    # Relayed whatever the daemon's default (the C++ client never asks for
    # direct calls, but a daemon with them gives its worker the direct poll set).
    flags = ("--nodirect_calls",) + (() if default_placement else ("--calls_cpu=off",))
    client_env = dict(env)
    if not default_placement:
        client_env["AGENTIX_CALLS_CPU"] = "off"
    with procs.ab_daemon(args.sandboxd, args.worker, env, "agx-dbound-", flags=flags) as (sock, daemon):
        def cc(calls: int) -> dict:
            out = subprocess.run([args.cc, f"--target=unix://{sock}", f"--noops={calls}"],
                                 env=client_env, check=True, capture_output=True, text=True,
                                 timeout=600)
            return json.loads(out.stdout.strip().splitlines()[-1])

        cc(200)  # starts the worker; its boot is not counted
        (worker,) = procs.children(daemon.pid)
        before = task_cpu_ns(daemon.pid), task_cpu_ns(worker)
        row = cc(args.calls)
        after = task_cpu_ns(daemon.pid), task_cpu_ns(worker)
    if row.get("calls_wire") != "frames":
        raise RuntimeError(f"the C++ client did not use the frame wire: {row.get('calls_wire')}")
    served = row["calls"]
    daemon_us = (after[0] - before[0]) / 1e3 / served
    worker_us = (after[1] - before[1]) / 1e3 / served
    return {"p50_us": row["noop_p50_us"], "p99_us": row["noop_p99_us"],
            "client_cpu_us": row["noop_cpu_us_per_call"], "worker_cpu_us": worker_us,
            "daemon_cpu_us": daemon_us,
            "cpu_us": row["noop_cpu_us_per_call"] + worker_us + daemon_us}


def floor_side(args, *mode: str) -> dict:
    out = subprocess.run([args.floor, "--big-mib=", "--concurrency=", *mode],
                         check=True, capture_output=True, text=True, timeout=600)
    row = json.loads(out.stdout)
    return {"p50_us": row["noop_p50_us"], "p99_us": row["noop_p99_us"],
            "cpu_us": row["noop_cpu_us_per_call"]}


def lookup(row: dict, dotted: str):
    side, key = dotted.split(".")
    return row.get(side, {}).get(key)


def summarise(rounds: list[dict]) -> dict:
    """Per side and figure the median over rounds, and per ratio of RATIOS
    the median of the per-round ratios (rounds lacking a side are left out)."""
    sides = {}
    for row in rounds:
        for side, figures in row.items():
            if isinstance(figures, dict):
                for key, value in figures.items():
                    sides.setdefault(side, {}).setdefault(key, []).append(value)
    medians = {side: {k: statistics.median(v) for k, v in figs.items()}
               for side, figs in sides.items()}
    ratios = {}
    for name, (top, bottom) in RATIOS.items():
        per_round = [lookup(r, top) / lookup(r, bottom) for r in rounds
                     if lookup(r, top) is not None and lookup(r, bottom)]
        if per_round:
            ratios[name] = {"median": statistics.median(per_round),
                            "rounds": [round(x, 3) for x in per_round]}
    return {"medians": medians, "ratios": ratios}


def run(args) -> dict:
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES)
    sides = {
        "direct": lambda: direct_side(args, env),
        "relayed": lambda: relayed_side(args, env, default_placement=False),
    }
    if args.caller_work_us > 0:
        sides["direct_slow"] = lambda: direct_side(args, env, args.caller_work_us)
    if not args.no_default:
        sides["relayed_default"] = lambda: relayed_side(args, env, default_placement=True)
    sides["floor_plain"] = lambda: floor_side(args)
    sides["floor_relay"] = lambda: floor_side(args, "--relay-poll")
    rounds = []
    for index in range(args.rounds):
        order = list(sides) if index % 2 == 0 else list(reversed(sides))
        spinner = None
        if args.busy:
            spinner = subprocess.Popen(["sh", "-c", "while :; do :; done"])
            time.sleep(0.3)
        try:
            row = {"load": os.getloadavg()[0]}
            for side in order:
                row[side] = sides[side]()
        finally:
            if spinner:
                spinner.kill()
                spinner.wait()
        rounds.append(row)
        print(f"round {index + 1} ({', '.join(order)}), load {row['load']:.1f}: " + ", ".join(
            f"{side} p50 {row[side]['p50_us']:.1f} CPU {row[side]['cpu_us']:.1f}"
            for side in sides), file=sys.stderr)
    return {"busy": args.busy, "calls": args.calls, "rounds": rounds, **summarise(rounds)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxd", default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--worker", default=f"{REPO}/bazel-bin/worker/agentix-worker")
    parser.add_argument("--cc", default=f"{REPO}/bazel-bin/testing/bench/cc_remote_calls")
    parser.add_argument("--direct", default=f"{REPO}/bazel-bin/testing/bench/worker_direct")
    parser.add_argument("--floor", default=f"{REPO}/bazel-bin/testing/bench/floor/unix_pingpong")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--busy", action="store_true", help="one spinning process meanwhile")
    parser.add_argument("--caller-work-us", type=int, default=40,
                        help="the direct_slow side's caller CPU a call (0: no such side)")
    parser.add_argument("--no-default", action="store_true",
                        help="leave out the relayed side with the default placement")
    print(json.dumps(run(parser.parse_args(argv)), indent=1))


if __name__ == "__main__":
    main()
