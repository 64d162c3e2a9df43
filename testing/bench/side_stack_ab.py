"""Same-run A/B of two whole stacks on the side channels: log records/s and spans/s, and
each process's CPU per item.

usage: /usr/bin/python3 testing/bench/side_stack_ab.py \\
           --a OLDVENV/bin/python,OLD/agentix-sandboxd \\
           --b .venv-test/bin/python,bazel-bin/sandbox/agentix-sandboxd \\
           [--worker bazel-bin/worker/agentix-worker] [--rounds 6] [--records 50000] \\
           [--spans 20000] [--reps 5]

`side_channels --sandboxd` and `side_cpu.py` swap the daemon or the worker but keep the
host, which is the benchmark's own process. A change to the host's side (the replay of
records and spans, the native decoders of `_native_calls`) needs a host of each build,
so here each side is a Python (its venv's `agentix` is the host package and the
sandbox's) and a daemon: per round, sides alternating, one fresh process of each side's
Python runs this file with `--child`, starts its daemon (with `--worker`) on a Unix
socket, warms up, then runs `--reps` bursts of `side_targets.log_burst(--records)` and
of `side_targets.span_burst(--spans)`, each waited for until the host's handler or
processor has every item (the worker writes its durable log to a fresh
`AGENTIX_LOG_DIR`, as in `side_channels`). A child prints one JSON line: the median burst's items/s
(remote() start to the last arrival) and the host's, the daemon's and the worker's CPU
per item over all its bursts (`floors.CpuMeter`: each process's CPU clock, its ended
threads included). The summary gives each side's
median over the rounds and the median of the per-round ratios b / a
(procs.ab_summary).
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import floors  # noqa: E402
import procs  # noqa: E402


def child(args) -> dict:
    """One side's measurement, in a process of that side's Python."""
    import agentix
    import side_targets  # noqa: F401  (by this name on both sides)
    from agentix import RuntimeClient
    from side_cpu import install_counters  # the host's log handler and span processor

    records, spans = install_counters()
    arrived = {"logs": records, "spans": spans}
    agentix_dir = os.path.dirname(os.path.dirname(os.path.abspath(agentix.__file__)))

    async def burst(client, kind, fn, n):
        counter = arrived[kind]
        counter.count = 0
        start = time.perf_counter()
        await client.remote(fn, n)
        await counter.wait_for(n, poll_s=0.001)  # 1 ms: a burst lasts 0.1-0.3 s
        if counter.count != n:
            raise AssertionError(f"{counter.count} {kind} arrived, {n} sent")
        return n / (time.perf_counter() - start)

    async def measure(sock, daemon_pid):
        out = {}
        async with RuntimeClient(f"unix://{sock}") as client:
            for kind, fn, n in (("logs", side_targets.log_burst, args.records),
                                ("spans", side_targets.span_burst, args.spans)):
                await burst(client, kind, fn, min(n, 2000))  # warm-up (starts the worker)
                (worker,) = procs.children(daemon_pid)
                meter = floors.CpuMeter({"host": os.getpid(), "daemon": daemon_pid,
                                         "worker": worker})
                before = meter.snapshot()
                rates = [await burst(client, kind, fn, n) for _ in range(args.reps)]
                used = floors.CpuMeter.per_item(before, meter.snapshot(), n * args.reps)
                out[f"{kind}_per_s"] = statistics.median(rates)
                for who in ("host", "daemon", "worker"):
                    out[f"{kind}_cpu_us_{who}"] = used[who]
        return out

    # The worker keeps its durable log, as side_channels' does.
    with tempfile.TemporaryDirectory(prefix="agx-side-ab-log-") as log_dir:
        env = dict(os.environ, AGENTIX_LOG_DIR=log_dir)
        with procs.ab_daemon(args.sandboxd, args.worker, env, prefix="agx-side-ab-",
                             python_path=(agentix_dir,)) as (sock, daemon):
            return asyncio.run(measure(sock, daemon.pid))


def run_side(python: str, sandboxd: str, args) -> dict:
    argv = [python, os.path.abspath(__file__), "--child", "--sandboxd", sandboxd,
            "--worker", args.worker, "--records", str(args.records),
            "--spans", str(args.spans), "--reps", str(args.reps)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{python} --child exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def side(text: str) -> tuple[str, str]:
    python, _, sandboxd = text.partition(",")
    if not python or not sandboxd:
        raise argparse.ArgumentTypeError("expected PYTHON,SANDBOXD")
    return os.path.abspath(python) if os.sep in python else python, os.path.abspath(sandboxd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=side, help="PYTHON,SANDBOXD of side a")
    parser.add_argument("--b", type=side, help="PYTHON,SANDBOXD of side b")
    parser.add_argument("--worker", default=os.path.join(REPO, "bazel-bin/worker/agentix-worker"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sandboxd", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.worker = os.path.abspath(args.worker)
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return
    if args.a is None or args.b is None:
        parser.error("--a and --b are required")
    print(f"load {procs.loadavg()}; a = {args.a}; b = {args.b}", flush=True)
    rows = []
    for index in range(args.rounds):
        order = ("a", "b") if index % 2 == 0 else ("b", "a")
        row = {}
        for name in order:
            python, sandboxd = getattr(args, name)
            row[name] = run_side(python, sandboxd, args)
        rows.append(row)
        print(procs.ab_round_line(index, order, row), flush=True)
    print(f"load {procs.loadavg()}")
    print("SUMMARY " + json.dumps(procs.ab_summary(rows)))


if __name__ == "__main__":
    main()
