"""Same-run A/B of the namespace request round trip: whole stacks (daemon, worker, host package).

usage: /usr/bin/python3 testing/bench/ns_ab.py [--rounds N] [--requests N] [--busy] \\
           --stack A_DAEMON,A_WORKER,A_VENV --stack B_DAEMON,B_WORKER,B_VENV

Each round runs every stack once, in alternating order, each in a fresh process of its
venv's python (so the host package is that stack's) with a fresh daemon (its --python_path
gives the sandbox the same venv's agentix package). Per run: `side_targets.ns_roundtrips`
(sandbox `Namespace.request` answered by a host `request_handler`) p50 / p99 and CPU per
request of the host, the daemon and the worker (every thread, /proc schedstat, warm-up
excluded). The last line (SUMMARY) gives medians and the medians of per-round B/A ratios.
"""
import argparse
import asyncio
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
KEYS = ("p50", "p99", "host_cpu", "daemon_cpu", "worker_cpu", "total_cpu")


def cpu_ns(pid):
    """On-CPU ns of every thread of `pid` (schedstat)."""
    total = 0
    for task in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(open(task).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def descendants(pid):
    kids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            child = int(stat.split("/")[2])
            kids += [child] + descendants(child)
    return kids


def child(args):
    sys.path.insert(0, BENCH)
    import side_targets
    from agentix import AsyncClientNamespace, RuntimeClient, request_handler
    import agentix

    hostpy = os.path.dirname(os.path.dirname(os.path.abspath(agentix.__file__)))

    class BenchHost(AsyncClientNamespace):
        @request_handler("echo")
        async def on_echo(self, body):
            return body

    tmp = tempfile.mkdtemp(prefix="agx-nsab-", dir="/tmp")
    sock = os.path.join(tmp, "s.sock")
    env = dict(os.environ, AGENTIX_LOG_DIR=tmp)
    daemon = subprocess.Popen([args.daemon, "--listen", f"unix://{sock}", f"--worker={args.worker}",
                               f"--python_path={BENCH}:{hostpy}", "--log_level=warning"],
                              env=env, stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/err", "wb"))

    async def session():
        client = RuntimeClient(f"unix://{sock}")
        client.register_namespace(BenchHost(side_targets.NAMESPACE))
        async with client:
            await client.remote(side_targets.ns_roundtrips, "agentix", 300, 100)
            workers = descendants(daemon.pid)
            before = (cpu_ns(os.getpid()), cpu_ns(daemon.pid), sum(cpu_ns(w) for w in workers))
            lat = sorted(await client.remote(side_targets.ns_roundtrips, "agentix", args.requests, 0))
            after = (cpu_ns(os.getpid()), cpu_ns(daemon.pid), sum(cpu_ns(w) for w in workers))
        n = len(lat)
        host, dmn, wrk = ((b - a) / 1e3 / n for a, b in zip(before, after))
        return {"p50": round(lat[n // 2], 1), "p99": round(lat[int(n * .99)], 1),
                "host_cpu": round(host, 1), "daemon_cpu": round(dmn, 1), "worker_cpu": round(wrk, 1),
                "total_cpu": round(host + dmn + wrk, 1)}

    try:
        import socket as so
        for _ in range(1000):
            try:
                c = so.socket(so.AF_UNIX)
                c.connect(sock)
                c.close()
                break
            except OSError:
                time.sleep(0.01)
        print(json.dumps(asyncio.run(session())), flush=True)
    finally:
        daemon.terminate()
        daemon.wait(10)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--busy", action="store_true", help="one unrelated busy loop beside")
    p.add_argument("--stack", action="append", default=[], help="DAEMON,WORKER,VENV (twice: A then B)")
    p.add_argument("--child", action="store_true")
    p.add_argument("--daemon")
    p.add_argument("--worker")
    args = p.parse_args()
    if args.child:
        return child(args)
    stacks = [s.split(",") for s in args.stack]
    assert len(stacks) == 2, "give --stack twice"
    busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if args.busy else None
    rows = []
    try:
        for r in range(args.rounds):
            order = [0, 1] if r % 2 == 0 else [1, 0]
            res = {}
            for i in order:
                daemon, worker, venv = stacks[i]
                out = subprocess.run([f"{venv}/bin/python", os.path.abspath(__file__), "--child",
                                      "--daemon", daemon, "--worker", worker,
                                      "--requests", str(args.requests)],
                                     check=True, capture_output=True, text=True, timeout=300)
                res["AB"[i]] = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps({"round": r, "load": os.getloadavg()[0], **res}), flush=True)
            rows.append(res)
    finally:
        if busy:
            busy.kill()
    summary = {}
    for k in KEYS:
        ratios = [x["B"][k] / x["A"][k] for x in rows if x["A"][k]]
        summary[k] = {"A_med": round(statistics.median(x["A"][k] for x in rows), 1),
                      "B_med": round(statistics.median(x["B"][k] for x in rows), 1),
                      "ratio_med": round(statistics.median(ratios), 3) if ratios else None,
                      "ratios": [round(x, 3) for x in ratios]}
    print("SUMMARY", json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
