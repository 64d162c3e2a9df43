"""The daemon's CPU per noop call, against a bare relay's (issue 25's busy floor).

Per round, alternating, each on the same machine load:

- a fresh daemon serves a sequential stream of `remote(bench_targets.noop)`
  calls; per call, each thread of the daemon, the worker and the host:
  on-CPU µs (schedstat), voluntary and involuntary context switches, and
  the user / system split (/proc/<tid>/stat, 10 ms ticks: a share, not µs);
- `floor/unix_pingpong --relay` (a process relaying 64-byte messages with a
  blocking read and a write per direction, one thread per direction), and
  the same relay waiting in poll(POLLIN) before each read as the daemon's
  threads do (`--relay-poll`), and the plain ping-pong right after: a
  relay's CPU per call is its run's server side less the plain run's (the
  echo process);

`--busy` keeps one spinning process (`sh -c 'while :; do :; done'`) running
over both, the issue's busy regime. `--strace FILE` also counts the daemon's
system calls in one extra, traced stream (`strace -f -c`; slows the calls).

    /usr/bin/python3 testing/bench/relay_cpu.py [--rounds 3] [--calls 10000] [--busy] \\
        [--sandboxd B/agentix-sandboxd --worker B/agentix-worker --python VENV/bin/python] \\
        [--floor B/testing/bench/floor/unix_pingpong] [--strace /tmp/daemon.strace]
"""

import argparse
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

import procs  # noqa: E402

# The host: warms up, prints "READY <worker pid>", then runs `calls` calls
# for each "go" line on stdin and answers "DONE".
_HOST = r"""
import asyncio, os, sys
sys.path.insert(0, os.environ["RELAY_BENCH_DIR"])
import bench_targets, procs
from agentix import RuntimeClient

sock, daemon_pid, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

async def main():
    async with RuntimeClient(f"unix://{sock}") as client:
        for _ in range(1000):
            await client.remote(bench_targets.noop)
        (worker,) = procs.children(daemon_pid)
        print(f"READY {worker}", flush=True)
        while sys.stdin.readline().strip() == "go":
            for _ in range(calls):
                await client.remote(bench_targets.noop)
            print("DONE", flush=True)

asyncio.run(main())
"""


def threads(pid: int) -> dict[str, dict[str, int]]:
    """{"name/tid": cpu ns, user and system ticks, switches} of pid's threads."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/comm") as f:
                name = f.read().strip()
            with open(f"{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"{task}/schedstat") as f:
                cpu_ns = int(f.read().split()[0])
            with open(f"{task}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue  # the thread ended meanwhile
        out[f"{name}/{os.path.basename(task)}"] = {
            "cpu_ns": cpu_ns, "user_ticks": int(fields[11]), "sys_ticks": int(fields[12]),
            "voluntary": int(status["voluntary_ctxt_switches"]),
            "involuntary": int(status["nonvoluntary_ctxt_switches"])}
    return out


def per_call(before: dict, after: dict, calls: int) -> dict:
    """Each thread's figures per call between two `threads` readings (the
    threads that ran), by name (a name's threads summed), and the total."""
    named = {}
    for key, end in after.items():
        start = before.get(key)
        if start is None or end["cpu_ns"] == start["cpu_ns"]:
            continue
        row = named.setdefault(key.split("/")[0], dict.fromkeys(end, 0))
        for field in end:
            row[field] += end[field] - start[field]
    out = {}
    for name, row in named.items():
        ticks = row["user_ticks"] + row["sys_ticks"]
        out[name] = {"cpu_us": row["cpu_ns"] / 1e3 / calls,
                     "voluntary": row["voluntary"] / calls,
                     "involuntary": row["involuntary"] / calls,
                     "user_share": row["user_ticks"] / ticks if ticks else None}
    out["total"] = {"cpu_us": sum(r["cpu_us"] for r in out.values())}
    return out


def stream(args, env, strace_to=None) -> dict:
    """One daemon, one host: the per-call figures of `args.calls` calls."""
    with procs.ab_daemon(args.sandboxd, args.worker, env, "agx-relay-") as (sock, daemon):
        host = subprocess.Popen([args.python, "-c", _HOST, sock, str(daemon.pid), str(args.calls)],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        tracer = None
        try:
            line = procs.read_line(host, 120)
            if not line or not line.startswith("READY "):
                raise RuntimeError(f"host: {line!r}")
            pids = {"daemon": daemon.pid, "worker": int(line.split()[1]), "host": host.pid}
            if strace_to:
                tracer = subprocess.Popen(["strace", "-f", "-c", "-o", strace_to,
                                           "-p", str(daemon.pid)], stderr=subprocess.DEVNULL)
                time.sleep(1.0)  # attached to every thread
            before = {role: threads(pid) for role, pid in pids.items()}
            started = time.monotonic()
            host.stdin.write("go\n")
            host.stdin.flush()
            if procs.read_line(host, 600) != "DONE":
                raise RuntimeError("host: the stream did not finish")
            wall_us = (time.monotonic() - started) * 1e6 / args.calls
            after = {role: threads(pid) for role, pid in pids.items()}
        finally:
            if tracer:
                tracer.send_signal(2)  # strace writes its counts on SIGINT
                tracer.wait()
            procs.stop_process(host)
    result = {role: per_call(before[role], after[role], args.calls) for role in pids}
    result["wall_us"] = wall_us
    return result


def floor(args, *mode: str) -> dict:
    argv = [args.floor, "--big-mib=", "--concurrency=", *mode]
    return json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)


def run(args) -> dict:
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES, RELAY_BENCH_DIR=BENCH_DIR)
    rounds = []
    for index in range(args.rounds):
        spinner = None
        if args.busy:
            spinner = subprocess.Popen(["sh", "-c", "while :; do :; done"])
            time.sleep(0.3)
        try:
            calls = stream(args, env)
            relayed, polled, plain = floor(args, "--relay"), floor(args, "--relay-poll"), floor(args)
        finally:
            if spinner:
                spinner.kill()
                spinner.wait()
        row = {
            "load": os.getloadavg()[0],
            "noop_wall_us": calls["wall_us"],
            "daemon_cpu_us": calls["daemon"]["total"]["cpu_us"],
            "daemon_threads": {k: v for k, v in calls["daemon"].items() if k != "total"},
            "worker_cpu_us": calls["worker"]["total"]["cpu_us"],
            "host_cpu_us": calls["host"]["total"]["cpu_us"],
            "relay_floor_cpu_us": relayed["noop_cpu_us_per_call_server"]
                                  - plain["noop_cpu_us_per_call_server"],
            "relay_poll_floor_cpu_us": polled["noop_cpu_us_per_call_server"]
                                       - plain["noop_cpu_us_per_call_server"],
            "echo_floor_cpu_us": plain["noop_cpu_us_per_call_server"],
            "relay_floor_p50_us": relayed["noop_p50_us"],
            "relay_poll_floor_p50_us": polled["noop_p50_us"],
            "plain_floor_p50_us": plain["noop_p50_us"],
        }
        row["daemon_over_relay_floor"] = row["daemon_cpu_us"] / row["relay_floor_cpu_us"]
        row["daemon_over_relay_poll_floor"] = row["daemon_cpu_us"] / row["relay_poll_floor_cpu_us"]
        rounds.append(row)
        print(f"round {index + 1}: load {row['load']:.1f}, daemon {row['daemon_cpu_us']:.1f} µs, "
              f"bare relay {row['relay_floor_cpu_us']:.1f} µs "
              f"(polling {row['relay_poll_floor_cpu_us']:.1f} µs), echo {row['echo_floor_cpu_us']:.1f} µs",
              file=sys.stderr)
    scalar = [k for k, v in rounds[0].items() if isinstance(v, float)]
    report = {"busy": args.busy, "calls": args.calls, "rounds": rounds,
              "medians": {k: statistics.median(r[k] for r in rounds) for k in scalar}}
    if args.strace:
        stream(args, env, strace_to=args.strace)
        report["strace"] = args.strace
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxd", default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--worker", default=f"{REPO}/bazel-bin/worker/agentix-worker")
    parser.add_argument("--python", default=f"{REPO}/.venv-test/bin/python")
    parser.add_argument("--floor", default=f"{REPO}/bazel-bin/testing/bench/floor/unix_pingpong")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--busy", action="store_true", help="one spinning process meanwhile")
    parser.add_argument("--strace", metavar="FILE",
                        help="also count the daemon's system calls in one traced stream")
    print(json.dumps(run(parser.parse_args()), indent=1))


if __name__ == "__main__":
    main()
