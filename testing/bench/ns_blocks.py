"""Block-interleaved A/B of the namespace request between two whole stacks.

usage: /usr/bin/python3 testing/bench/ns_blocks.py [--runs 6] [--blocks 24] [--block 300] \\
           --stack OLD_DAEMON,OLD_WORKER,OLD_VENV[,EXTRA...] --stack NEW_DAEMON,NEW_WORKER,NEW_VENV[,EXTRA...]

EXTRA as in ns_ab.py (--DAEMON_FLAG, NAME=VALUE, sandbox:NAME=VALUE), plus sched:batch: that
side's host sets SCHED_BATCH before it starts its daemon, so the whole call path (host,
daemon threads, worker: the policy is inherited) runs under it.

`ns_ab.py` runs one stack after the other; on a machine other work loads, two runs
seconds apart meet different loads, and its rounds scatter by ±10 %. Here both stacks
run at once (each its own daemon, sandbox, and host process in its venv's python, the
EXTRA fields as in ns_ab.py) and the parent alternates blocks of `--block` sequential
`side_targets.ns_roundtrips` between them (a b, b a, ...), so that neighbouring blocks
meet the same load. Per block: p50, p90 and CPU per request of the host, the daemon and
the worker (every thread, schedstat). Which stack runs as side a matters by a few per
cent even for two copies of one stack, so run r has the second --stack (new) as side b
in odd runs and as side a in even ones. Per run and figure: the median of the ratios
new / old of neighbouring blocks; the summary gives their median over runs."""
import argparse
import json
import os
import statistics
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
FIGURES = ("p50", "p90", "host", "daemon", "worker", "total", "host_inv", "worker_inv")

# One side's host: warms up, then runs a block per line of stdin ("N"), printing
# "R {figures}" after each; an empty line ends it. host_inv / worker_inv: the
# host's and the worker's involuntary context switches a request (preemptions).
_CHILD = r'''
import asyncio, json, os, sys
sys.path.insert(0, BENCH)
import agentix, procs, side_targets
from agentix import AsyncClientNamespace, RuntimeClient, request_handler

hostpy = os.path.dirname(os.path.dirname(os.path.abspath(agentix.__file__)))


class BenchHost(AsyncClientNamespace):
    @request_handler("echo")
    async def on_echo(self, body):
        return body


def cpu(pid):
    return sum(procs.thread_cpu_ns(pid).values())


def preempted(pid):
    return procs.context_switches(pid)[1]


async def session(sock, daemon):
    client = RuntimeClient(f"unix://{sock}")
    client.register_namespace(BenchHost(side_targets.NAMESPACE))
    async with client:
        await client.remote(side_targets.ns_roundtrips, "agentix", 500, 100)
        pids = [os.getpid(), daemon.pid, *procs.children(daemon.pid)]
        print("READY", flush=True)
        loop = asyncio.get_running_loop()
        while (line := (await loop.run_in_executor(None, sys.stdin.readline)).strip()):
            n = int(line)
            before = [cpu(p) for p in pids]
            inv = [preempted(p) for p in pids]
            lat = sorted(await client.remote(side_targets.ns_roundtrips, "agentix", n, 0))
            d = [(cpu(p) - b) / n / 1e3 for p, b in zip(pids, before)]
            i = [(preempted(p) - b) / n for p, b in zip(pids, inv)]
            print("R " + json.dumps({"p50": lat[n // 2], "p90": lat[int(n * .9)], "host": d[0],
                                     "daemon": d[1], "worker": sum(d[2:]), "total": sum(d),
                                     "host_inv": i[0], "worker_inv": sum(i[2:])}), flush=True)


if SCHED:  # this host, and (inherited through fork) its daemon, the daemon's threads and the worker
    os.sched_setscheduler(0, {"batch": os.SCHED_BATCH, "other": os.SCHED_OTHER}[SCHED], os.sched_param(0))
env = dict(os.environ)
env.update(f.split("=", 1) for f in SANDBOX_ENV)
with procs.ab_daemon(DAEMON, WORKER, env, "agx-nsblk-", python_path=(hostpy,), flags=tuple(FLAGS)) as (sock, d):
    asyncio.run(session(sock, d))
'''


def _start(stack: str) -> subprocess.Popen:
    daemon, worker, venv, *extra = stack.split(",")
    flags = [f for f in extra if f.startswith("--")]
    sandbox_env = [f[len("sandbox:"):] for f in extra if f.startswith("sandbox:")]
    sched = _sched(stack)
    env = dict(os.environ)
    env.update(f.split("=", 1) for f in extra if not f.startswith(("--", "sandbox:", "sched:")))
    code = (f"BENCH={BENCH!r}; DAEMON={daemon!r}; WORKER={worker!r}; FLAGS={flags!r}; "
            f"SANDBOX_ENV={sandbox_env!r}; SCHED={sched!r}\n" + _CHILD)
    child = subprocess.Popen([f"{venv}/bin/python", "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    _reply(child, "READY")
    return child


def _sched(stack: str) -> str:
    """The stack's sched: field ("" without one)."""
    return next((f[len("sched:"):] for f in stack.split(",")[3:] if f.startswith("sched:")), "")


def _reply(child: subprocess.Popen, prefix: str) -> str:
    while line := child.stdout.readline():
        if line.startswith(prefix):
            return line[len(prefix):]
    raise RuntimeError(f"a host ended early (exit {child.wait()})")


def one_run(old: str, new: str, new_is_b: bool, blocks: int, block: int) -> dict:
    """Figure -> (median of per-pair ratios new / old, old median, new median)."""
    sides = {"a": _start(old if new_is_b else new)}
    sides["b"] = _start(new if new_is_b else old)
    got = {"old": [], "new": []}
    try:
        for i in range(blocks):
            row = {}
            for side in ("ab" if i % 2 == 0 else "ba"):
                sides[side].stdin.write(f"{block}\n")
                sides[side].stdin.flush()
                row[side] = json.loads(_reply(sides[side], "R "))
            got["new"].append(row["b" if new_is_b else "a"])
            got["old"].append(row["a" if new_is_b else "b"])
    finally:
        for child in sides.values():
            child.stdin.write("\n")
            child.stdin.flush()
            child.wait(timeout=60)
    return {k: (median_ratio([(o[k], n[k]) for o, n in zip(got["old"], got["new"])]),
                statistics.median(o[k] for o in got["old"]), statistics.median(n[k] for n in got["new"]))
            for k in FIGURES}


def median_ratio(pairs: list[tuple[float, float]]) -> float | None:
    """The median of new / old over (old, new) pairs whose old is not 0 (a
    block with no preemption on the old side has no ratio); None if none has."""
    ratios = [n / o for o, n in pairs if o]
    return statistics.median(ratios) if ratios else None


def _shown(figure: str, ratio: float | None, old: float, new: float) -> str:
    """`figure old/new (ratio)`; switches a request with two decimals."""
    places = 2 if figure.endswith("_inv") else 1
    return f"{figure} {old:.{places}f}/{new:.{places}f} ({'-' if ratio is None else f'{ratio:.3f}'})"


def _median_of_runs(ratios: list[float | None]) -> float | None:
    """The median of the runs' ratios that exist."""
    got = [r for r in ratios if r is not None]
    return statistics.median(got) if got else None


def _rounded(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--block", type=int, default=300, help="requests per block")
    parser.add_argument("--stack", action="append", default=[],
                        help="DAEMON,WORKER,VENV[,--DAEMON_FLAG|NAME=VALUE|sandbox:NAME=VALUE|sched:batch...] (old, then new)")
    args = parser.parse_args()
    if len(args.stack) != 2:
        parser.error("give --stack twice: old, then new")
    for stack in args.stack:
        if _sched(stack) not in ("", "batch", "other"):
            parser.error(f"sched:{_sched(stack)}: give sched:batch or sched:other")
    runs = []
    for r in range(args.runs):
        load = os.getloadavg()[0]
        run = one_run(*args.stack, new_is_b=r % 2 == 0, blocks=args.blocks, block=args.block)
        runs.append(run)
        print(f"run {r + 1} (new is side {'b' if r % 2 == 0 else 'a'}, load {load:.1f}-{os.getloadavg()[0]:.1f}): "
              + ", ".join(_shown(k, *figure) for k, figure in run.items()), flush=True)
    summary = {k: {"old_median": round(statistics.median(r[k][1] for r in runs), 2),
                   "new_median": round(statistics.median(r[k][2] for r in runs), 2),
                   "median_ratio_new_over_old": _rounded(_median_of_runs([r[k][0] for r in runs])),
                   "per_run_ratios": [_rounded(r[k][0]) for r in runs]} for k in FIGURES}
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
