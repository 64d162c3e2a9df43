"""Same-run A/B of the namespace request round trip: whole stacks (daemon, worker, host package).

usage: /usr/bin/python3 testing/bench/ns_ab.py [--rounds N] [--requests N] [--busy] \\
           --stack A_DAEMON,A_WORKER,A_VENV[,EXTRA...] --stack B_DAEMON,B_WORKER,B_VENV[,EXTRA...]

Each round runs every stack once, in alternating order, each in a fresh process of its
venv's python (so the host package is that stack's) with a fresh daemon (its --python_path
gives the sandbox the same venv's agentix package). Per run: `side_targets.ns_roundtrips`
(sandbox `Namespace.request` answered by a host `request_handler`) p50 / p99, CPU per
request of the host, the daemon and the worker (every thread, /proc schedstat, warm-up
excluded) and their context switches per request (every thread, /proc status): `*_wakes`
the voluntary ones (a request wakes one thread of each side: the host's loop, the
daemon's two relaying threads, the worker's loop), `*_preempts` the involuntary ones
(mostly a side preempted by the daemon thread its own write woke on its CPU) and `*_rq_wait`
their run-queue wait in µs per request (every thread, schedstat: time runnable, not running;
on one CPU, what each side waits behind the others). The last line (SUMMARY) gives medians and the medians of per-round B/A ratios.

A stack's EXTRA fields compare settings of the same binaries: one starting with ``--`` is
a daemon flag (``--calls_cpu=auto``), ``NAME=VALUE`` goes into the host's environment
(``AGENTIX_CALLS_CPU=auto``; the daemon, and so the sandbox, inherits it too) and
``sandbox:NAME=VALUE`` into the daemon's and the sandbox's only (``sandbox:AGENTIX_CALLS_CPU=wait``:
the worker's namespace-reply waits pinned, which since stop 63 they are only when named there;
the host's pinned waits as they are).
"""
import argparse
import asyncio
import json
import os
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import procs  # noqa: E402


def cpu_ns(pid):
    """On-CPU ns of every thread of `pid`."""
    return sum(procs.thread_cpu_ns(pid).values())


def sample(pids):
    """Per process of `pids` (host, daemon, workers): (CPU ns, voluntary,
    involuntary, run-queue wait ns)."""
    return [(cpu_ns(pid), *procs.context_switches(pid), sum(procs.thread_wait_ns(pid).values()))
            for pid in pids]


def child(args):
    import side_targets
    from agentix import AsyncClientNamespace, RuntimeClient, request_handler
    import agentix

    hostpy = os.path.dirname(os.path.dirname(os.path.abspath(agentix.__file__)))

    class BenchHost(AsyncClientNamespace):
        @request_handler("echo")
        async def on_echo(self, body):
            return body

    async def session(sock, daemon):
        client = RuntimeClient(f"unix://{sock}")
        client.register_namespace(BenchHost(side_targets.NAMESPACE))
        async with client:
            await client.remote(side_targets.ns_roundtrips, "agentix", 300, 100)
            workers = procs.children(daemon.pid)
            before = sample([os.getpid(), daemon.pid, *workers])
            lat = sorted(await client.remote(side_targets.ns_roundtrips, "agentix", args.requests, 0))
            after = sample([os.getpid(), daemon.pid, *workers])
        n = len(lat)
        # Per request: [CPU ns, wakes, preempts, run-queue wait ns] of the host, the daemon, the workers.
        delta = [[(b - a) / n for a, b in zip(old, new)] for old, new in zip(before, after)]
        host, dmn = delta[0], delta[1]
        wrk = [sum(d[i] for d in delta[2:]) for i in range(4)]
        result = {"p50": round(lat[n // 2], 1), "p99": round(lat[int(n * .99)], 1),
                  "host_cpu": round(host[0] / 1e3, 1), "daemon_cpu": round(dmn[0] / 1e3, 1),
                  "worker_cpu": round(wrk[0] / 1e3, 1), "total_cpu": round((host[0] + dmn[0] + wrk[0]) / 1e3, 1)}
        for side, d in (("host", host), ("daemon", dmn), ("worker", wrk)):
            result[f"{side}_wakes"], result[f"{side}_preempts"] = round(d[1], 2), round(d[2], 2)
        for side, d in (("host", host), ("daemon", dmn), ("worker", wrk)):
            result[f"{side}_rq_wait"] = round(d[3] / 1e3, 1)
        return result

    # The daemon's --python_path gives the sandbox this venv's agentix (agentix.sio).
    daemon_env = dict(os.environ)
    daemon_env.update(field.split("=", 1) for field in args.sandbox_env)
    with procs.ab_daemon(args.daemon, args.worker, daemon_env, "agx-nsab-",
                         python_path=(hostpy,), flags=tuple(args.daemon_flag)) as (sock, daemon):
        print("RESULT " + json.dumps(asyncio.run(session(sock, daemon))), flush=True)


def run_side(stack, requests):
    """One run of `stack` (daemon, worker, venv) in its venv's python: its figures."""
    daemon, worker, venv, *extra = stack
    flags = [f"--daemon-flag={field}" for field in extra if field.startswith("--")]
    flags += [f"--sandbox-env={field[len('sandbox:'):]}" for field in extra if field.startswith("sandbox:")]
    env = dict(os.environ)
    env.update(field.split("=", 1) for field in extra if not field.startswith(("--", "sandbox:")))
    out = subprocess.run([f"{venv}/bin/python", os.path.abspath(__file__), "--child",
                          "--daemon", daemon, "--worker", worker, "--requests", str(requests), *flags],
                         check=True, capture_output=True, text=True, timeout=300, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"no RESULT from the child: {out.stdout!r} {out.stderr[-2000:]!r}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--busy", action="store_true", help="one unrelated busy loop beside")
    p.add_argument("--stack", action="append", default=[],
                   help="DAEMON,WORKER,VENV[,--DAEMON_FLAG|NAME=VALUE|sandbox:NAME=VALUE...] (twice: A then B)")
    p.add_argument("--daemon-flag", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--sandbox-env", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true")
    p.add_argument("--daemon")
    p.add_argument("--worker")
    args = p.parse_args()
    if args.child:
        return child(args)
    stacks = dict(zip("ab", (s.split(",") for s in args.stack)))
    assert len(args.stack) == 2, "give --stack twice"
    busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if args.busy else None
    rows = []
    try:
        for r in range(args.rounds):
            order = ("a", "b") if r % 2 == 0 else ("b", "a")
            row = {side: run_side(stacks[side], args.requests) for side in order}
            rows.append(row)
            print(procs.ab_round_line(r, order, row), f"(load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        if busy:
            busy.kill()
    print("SUMMARY", json.dumps(procs.ab_summary(rows)), flush=True)


if __name__ == "__main__":
    main()
