"""Same-run A/B of two host packages' sequential noop, interleaved in blocks.

usage: /usr/bin/python3 testing/bench/host_seq_ab.py --a-python OLDVENV/bin/python \\
           --b-python .venv-test/bin/python [--runs 6] [--blocks 80] [--block 250]

`c64_ab.py` alternates whole rounds, so a change to the host's few µs per call drowns in
the load other processes put on a shared machine between rounds, and its p99 shows which
side ran second more than which host it was. `tail_probe.py --ab` interleaves blocks, but
of one host against two daemons. Here two hosts (one process per side's venv, each a
`RuntimeClient` with its defaults) call `bench_targets.noop` through ONE daemon
(`--sandboxd`, `--worker`: the same binaries for both) in alternating blocks of
`--block` calls (the first 2 of each left out), a and b in turn, the order swapped every
block, so both meet the same moments of the machine. Per run: each side's p50, p90, p99,
p99/p50 and the event-loop thread's CPU per call (`time.thread_time_ns` over its blocks);
with `--runs N` the two venvs swap processes' start order every run (the first-started
host came out slower in some runs), and the summary gives each side's medians and the
median of the per-run ratios b / a (procs.ab_summary).
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

# One host: argv = socket, block; after warm-up prints "ready"; per "go" line on stdin
# runs one block and prints "done"; on any other line prints its RESULT and exits.
_HOST = r"""
import asyncio, json, os, sys, time
sys.path.insert(0, os.environ["HOST_SEQ_BENCH_DIR"])
import bench_targets
from agentix import RuntimeClient


async def main(sock, block):
    async with RuntimeClient(f"unix://{sock}") as client:
        for _ in range(500):
            await client.remote(bench_targets.noop)
        latencies, cpu_ns = [], 0
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "go":
                break
            start_cpu = time.thread_time_ns()
            for i in range(block):
                start = time.perf_counter_ns()
                await client.remote(bench_targets.noop)
                if i >= 2:
                    latencies.append((time.perf_counter_ns() - start) / 1e3)
            cpu_ns += time.thread_time_ns() - start_cpu
            print("done", flush=True)
    print("RESULT " + json.dumps({"latencies": latencies, "cpu_ns": cpu_ns}), flush=True)


asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def send(host: subprocess.Popen, line: str) -> None:
    host.stdin.write(f"{line}\n".encode())
    host.stdin.flush()


def expect(host: subprocess.Popen, prefix: str, timeout_s: float) -> str:
    line = procs.read_line(host, timeout_s)
    if line is None or not line.startswith(prefix):
        raise RuntimeError(f"host said {line!r}, expected {prefix!r}")
    return line


def one_run(pythons: dict, first: str, args, env: dict) -> dict:
    """One interleaved run; `first`: the side whose host process starts first."""
    with procs.ab_daemon(args.sandboxd, args.worker, env, "agx-hseq-") as (sock, _daemon):
        hosts = {}
        try:
            for side in (first, "b" if first == "a" else "a"):
                hosts[side] = procs.start_process(
                    [pythons[side], "-c", _HOST, sock, str(args.block)], env=env,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                expect(hosts[side], "ready", 120)
            for index in range(args.blocks):
                for side in (("a", "b") if index % 2 == 0 else ("b", "a")):
                    send(hosts[side], "go")
                    expect(hosts[side], "done", 120)
            row = {}
            for side, host in hosts.items():
                send(host, "stop")
                result = json.loads(expect(host, "RESULT ", 60)[len("RESULT "):])
                latencies = result["latencies"]
                p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
                row[side] = {"noop_p50_us": p50, "noop_p90_us": percentile(latencies, 0.9),
                             "noop_p99_us": p99, "noop_p99_over_p50": p99 / p50,
                             "host_cpu_us": result["cpu_ns"] / len(latencies) / 1e3}
            return row
        finally:
            for host in hosts.values():
                procs.stop_process(host)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-python", required=True)
    parser.add_argument("--b-python", default=f"{REPO}/.venv-test/bin/python")
    parser.add_argument("--sandboxd", default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--worker", default=f"{REPO}/bazel-bin/worker/agentix-worker")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--blocks", type=int, default=80, help="blocks per side and run")
    parser.add_argument("--block", type=int, default=250, help="calls per block")
    args = parser.parse_args()
    pythons = {"a": args.a_python, "b": args.b_python}
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES, HOST_SEQ_BENCH_DIR=BENCH_DIR)
    rows = []
    for run in range(args.runs):
        first = "a" if run % 2 == 0 else "b"
        row = one_run(pythons, first, args, env)
        rows.append(row)
        print(procs.ab_round_line(run, (first, "b" if first == "a" else "a"), row),
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print(json.dumps({"runs": args.runs, "summary": procs.ab_summary(rows)}, indent=1))


if __name__ == "__main__":
    main()
