"""Same-run A/B of the whole call path under many concurrent callers.

Each side is a full stack: an agentix-sandboxd binary, an agentix-worker
binary and a Python (a venv) whose `agentix` host package plays the host.
The two sides alternate, one fresh daemon and one fresh host process per
(round, side), the order swapped every round. Each measurement reports:

- noop p50 and p99 (sequential sync `bench_targets.noop`) and their ratio,
  and CPU per sequential noop by process (host, daemon, worker) with the
  host's wake-ups (scheduler time slices) per call,
- the C++ client's sequential noop p50 through the same daemon
  (cc_remote_calls --noops, `--cc`), the raw gRPC ping-pong floor measured
  right after it (`--floor-grpc`) and their ratio (cc_noop_over_floor_grpc;
  issue 22: <= 1.5),
- calls/s with 16 and with 64 concurrent callers (asyncio tasks in the
  host, each calling the sync noop in a loop for a fixed time),
- CPU per call by process (host, daemon, worker; all threads, from
  /proc/<pid>/task/*/schedstat) at 16 and 64 callers,
- at 64 callers, by thread (process:thread name; threads under 1 % of a
  core left out): the share of a core it ran (`c64_core:…`; 1.0 is a
  saturated thread, the bound on calls/s), its CPU a call (`c64_cpu_us:…`)
  and the share of the window it waited runnable for a CPU (`c64_runq:…`),

and the summary gives per key the medians of each side and the median of the
per-round ratios b / a. Run after `bazel build //sandbox:agentix-sandboxd
//worker:agentix-worker` and `tools/make_venv`:

    /usr/bin/python3 testing/bench/c64_ab.py \\
        --a-sandboxd OLD/agentix-sandboxd --a-worker OLD/agentix-worker \\
        --a-python OLDVENV/bin/python --b-python .venv-test/bin/python \\
        [--rounds 6] [--seconds 2]

`--a-daemon-flag` /
`--b-daemon-flag FLAG` (repeatable) add daemon flags to one side: the same
binaries with `--a-daemon-flag=--nodirect_calls --b-daemon-flag=--direct_calls`
measure direct calls off/on (say both: the default may change).

(b defaults to this checkout's bazel-bin binaries.) `--profile-host FILE`
runs one side-b host under cProfile during the 64-caller phase and writes
the stats to FILE (no A/B).
"""

import argparse
import json
import os
import subprocess
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import procs  # noqa: E402

# The host process: measures against the daemon at argv[1] (socket), whose
# pid is argv[2]; prints one JSON line.
_HOST = r"""
import asyncio, cProfile, json, os, statistics, sys, time
sys.path.insert(0, os.environ["C64_BENCH_DIR"])
import bench_targets, procs, workloads
from agentix import RuntimeClient

sock, daemon_pid, seconds, calls = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
profile_to = sys.argv[5] if len(sys.argv) > 5 else ""


def cpu(pids):
    return {k: (sum(procs.thread_cpu_ns(p).values()) if p else 0) for k, p in pids.items()}


def by_thread(pids):  # {(process, thread name): (on-CPU ns, run-queue wait ns)}
    out = {}
    for k, p in pids.items():
        waits = procs.thread_wait_ns(p)
        for name, ns in procs.thread_cpu_ns(p).items():
            out[(k, name)] = (ns, waits.get(name, 0))
    return out


def wakeups(pid):
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[2])
        except OSError:
            continue
    return total


async def main():
    out = {}
    async with RuntimeClient(f"unix://{sock}") as client:
        for _ in range(300):
            await client.remote(bench_targets.noop)
        (worker,) = procs.children(daemon_pid)
        pids = {"host": os.getpid(), "daemon": daemon_pid, "worker": worker}
        lat = []
        c0, w0 = cpu(pids), {k: wakeups(p) for k, p in pids.items()}
        for _ in range(calls):
            t0 = time.perf_counter()
            await client.remote(bench_targets.noop)
            lat.append((time.perf_counter() - t0) * 1e6)
        c1, w1 = cpu(pids), {k: wakeups(p) for k, p in pids.items()}
        for k in pids:
            out[f"noop_{k}_cpu_us"] = (c1[k] - c0[k]) / 1e3 / calls
        out["noop_host_wakeups"] = (w1["host"] - w0["host"]) / calls
        out["noop_p50_us"] = statistics.median(lat)
        lat.sort()
        out["noop_p99_us"] = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        out["noop_p99_over_p50"] = out["noop_p99_us"] / out["noop_p50_us"]
        for callers in (16, 64):
            async with workloads.Callers(client.remote, bench_targets.noop, callers) as load:
                await asyncio.sleep(0.3)
                prof = None
                if profile_to and callers == 64:
                    prof = cProfile.Profile()
                    prof.enable()
                w0, th0 = {k: wakeups(p) for k, p in pids.items()}, by_thread(pids)
                c0, n0, t0 = cpu(pids), load.completed, time.perf_counter()
                await asyncio.sleep(seconds)
                c1, n1, t1 = cpu(pids), load.completed, time.perf_counter()
                w1, th1 = {k: wakeups(p) for k, p in pids.items()}, by_thread(pids)
                if prof is not None:
                    prof.disable()
                    prof.dump_stats(profile_to)
            n = n1 - n0
            out[f"c{callers}_calls_per_s"] = n / (t1 - t0)
            for k in pids:
                out[f"c{callers}_{k}_cpu_us"] = (c1[k] - c0[k]) / 1e3 / n
            for k in pids:
                out[f"c{callers}_{k}_wakeups"] = (w1[k] - w0[k]) / n
            out[f"c{callers}_total_cpu_us"] = sum((c1[k] - c0[k]) for k in pids) / 1e3 / n
            if callers == 64:
                wall_ns = (t1 - t0) * 1e9
                for (k, name), (ns, waited) in sorted(th1.items()):
                    ns0, waited0 = th0.get((k, name), (0, 0))
                    if ns - ns0 >= 0.01 * wall_ns:
                        out[f"c64_core:{k}:{name}"] = (ns - ns0) / wall_ns
                        out[f"c64_cpu_us:{k}:{name}"] = (ns - ns0) / 1e3 / n
                        out[f"c64_runq:{k}:{name}"] = (waited - waited0) / wall_ns
    print("RESULT " + json.dumps(out), flush=True)

asyncio.run(main())
"""


def _json_tail(argv, env):
    """The last stdout line of `argv` (a program printing one JSON object)."""
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True,
                          timeout=300, check=True)
    return json.loads([l for l in proc.stdout.splitlines() if l.strip()][-1])


def one(side, seconds, calls, profile_to="", cc="", floor_grpc=""):
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES,
               C64_BENCH_DIR=BENCH_DIR)
    with procs.ab_daemon(side["sandboxd"], side["worker"], env, "agx-c64-",
                         flags=tuple(side["flags"])) as (sock, daemon):
        argv = [side["python"], "-c", _HOST, sock, str(daemon.pid), str(seconds),
                str(calls)]
        if profile_to:
            argv.append(profile_to)
        host = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True,
                              timeout=300, check=True)
        out = None
        for line in host.stdout.splitlines():
            if line.startswith("RESULT "):
                out = json.loads(line[len("RESULT "):])
        if out is None:
            raise RuntimeError(f"no RESULT from the host: {host.stdout!r}")
        if cc:
            # The C++ client's sequential noop through this side's daemon,
            # then the raw gRPC ping-pong floor right after it (issue 22:
            # cc_noop_over_floor_grpc <= 1.5).
            figures = _json_tail([cc, f"--target=unix://{sock}", f"--noops={calls}"], env)
            if figures.get("calls_wire") != "frames":
                raise RuntimeError(f"the C++ client is not on the frame wire: {figures}")
            out["cc_noop_p50_us"] = figures["noop_p50_us"]
    if cc and floor_grpc:
        out["floor_grpc_p50_us"] = _json_tail([floor_grpc, "--quick"], env)["noop_p50_us"]
        out["cc_noop_over_floor_grpc"] = out["cc_noop_p50_us"] / out["floor_grpc_p50_us"]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for s in ("a", "b"):
        parser.add_argument(f"--{s}-sandboxd",
                            default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
        parser.add_argument(f"--{s}-worker",
                            default=f"{REPO}/bazel-bin/worker/agentix-worker")
        parser.add_argument(f"--{s}-python", default=f"{REPO}/.venv-test/bin/python")
        parser.add_argument(f"--{s}-daemon-flag", action="append", default=[],
                            metavar="FLAG", help=f"an extra agentix-sandboxd flag "
                            f"for side {s} (repeatable), e.g. --{s}-daemon-flag=--direct_calls")
    parser.add_argument("--cc", default=f"{REPO}/bazel-bin/testing/bench/cc_remote_calls",
                        help="the C++ client (cc_remote_calls) measured against each "
                        "side's daemon; '' to skip")
    parser.add_argument("--floor-grpc",
                        default=f"{REPO}/bazel-bin/testing/bench/floor/grpc_pingpong",
                        help="the raw gRPC ping-pong floor, run after each side's "
                        "C++ client; '' to skip")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="timed window per caller count")
    parser.add_argument("--calls", type=int, default=1000,
                        help="sequential noop calls for the p50")
    parser.add_argument("--single", action="store_true",
                        help="measure side b once (e.g. under perf), no A/B")
    parser.add_argument("--profile-host", default="",
                        help="cProfile one side-b host at 64 callers into this file")
    args = parser.parse_args()
    sides = {s: {"sandboxd": getattr(args, f"{s}_sandboxd"),
                 "worker": getattr(args, f"{s}_worker"),
                 "python": getattr(args, f"{s}_python"),
                 "flags": getattr(args, f"{s}_daemon_flag")} for s in ("a", "b")}
    if args.single:
        print(json.dumps(one(sides["b"], args.seconds, args.calls), indent=1))
        return
    if args.profile_host:
        print(json.dumps(one(sides["b"], args.seconds, args.calls,
                             args.profile_host), indent=1))
        return
    rows = []
    for r in range(args.rounds):
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        row = {side: one(sides[side], args.seconds, args.calls, cc=args.cc,
                         floor_grpc=args.floor_grpc) for side in order}
        # Per-thread keys exist only for threads over 1 % of a core: with a
        # daemon flag the sides' threads differ (e.g. --direct_calls leaves
        # the daemon's frame-wire threads idle). Compare what both have.
        common = row["a"].keys() & row["b"].keys()
        row = {s: {k: v for k, v in row[s].items() if k in common} for s in row}
        rows.append(row)
        print(procs.ab_round_line(r, order, row), flush=True)
    summary = procs.ab_summary(rows)
    print(json.dumps({"rounds": args.rounds, "load_end": os.getloadavg()[0],
                      "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
