"""Same-run A/B of two agentix-sandboxd builds: alternating processes, one host and worker build.

usage: .venv-test/bin/python testing/bench/daemon_ab.py [--rounds N] [--busy] [--b-arg=FLAG] A_BIN B_BIN
Per round and binary (a fresh daemon each): noop p50/p99 (sequential), daemon CPU and
sched-ins per call by thread (/proc schedstat), calls/s with 64 callers, namespace request
p50. The last line (SUMMARY) gives medians and the medians of per-round B/A ratios.
"""
import argparse, asyncio, json, os, statistics, subprocess, sys, tempfile, time, glob

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = f"{REPO}/testing/bench"
sys.path.insert(0, BENCH)
import bench_targets, side_targets  # noqa
from agentix import RuntimeClient, AsyncClientNamespace, request_handler  # noqa
import agentix
HOSTPY = os.path.dirname(os.path.dirname(os.path.abspath(agentix.__file__)))


def threads(pid):
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            name = open(f"{task}/comm").read().strip()
            f = open(f"{task}/schedstat").read().split()
        except OSError:
            continue
        cpu, n = out.get(name, (0, 0))
        out[name] = (cpu + int(f[0]), n + int(f[2]))
    return out


def diff(a, b, calls):
    res = {}
    for k, (cpu, n) in b.items():
        c0, n0 = a.get(k, (0, 0))
        res[k] = (round((cpu - c0) / 1e3 / calls, 1), round((n - n0) / calls, 2))
    return res


class BenchHost(AsyncClientNamespace):
    @request_handler("echo")
    async def on_echo(self, body):
        return body


async def session(url, dpid, args):
    client = RuntimeClient(url)
    client.register_namespace(BenchHost(side_targets.NAMESPACE))
    out = {}
    async with client:
        for _ in range(300):
            await client.remote(bench_targets.noop)
        n = args.calls
        lat = []
        t0 = threads(dpid)
        perf = time.perf_counter
        for _ in range(n):
            s = perf()
            await client.remote(bench_targets.noop)
            lat.append((perf() - s) * 1e6)
        t1 = threads(dpid)
        lat.sort()
        out["p50"] = lat[n // 2]; out["p99"] = lat[int(n * .99)]
        d = diff(t0, t1, n)
        out["dcpu"] = round(sum(v[0] for v in d.values()), 1)
        out["dthreads"] = {k: v for k, v in d.items() if v[1] > 0.05}
        # 64 callers
        per = args.par_calls // 64
        async def caller():
            for _ in range(per):
                await client.remote(bench_targets.noop)
        await asyncio.gather(*[caller() for _ in range(64)])
        t0 = threads(dpid)
        s = perf()
        await asyncio.gather(*[caller() for _ in range(64)])
        el = perf() - s
        t1 = threads(dpid)
        out["cps64"] = round(per * 64 / el)
        out["dcpu64"] = round(sum(v[0] for v in diff(t0, t1, per * 64).values()), 1)
        # namespace requests
        t0 = threads(dpid)
        ns = sorted(await client.remote(side_targets.ns_roundtrips, "agentix", args.ns, 100))
        t1 = threads(dpid)
        out["ns_p50"] = ns[len(ns) // 2]
        out["ns_dcpu"] = round(sum(v[0] for v in diff(t0, t1, args.ns + 100).values()), 1)
    return out


def run_one(binary, worker, args):
    tmp = tempfile.mkdtemp(prefix="agx-ab-", dir="/tmp")
    sock = os.path.join(tmp, "s.sock")
    env = dict(os.environ, AGENTIX_LOG_DIR=tmp)
    d = subprocess.Popen([binary, "--listen", f"unix://{sock}", f"--worker={worker}",
                          f"--python_path={BENCH}:{HOSTPY}", "--log_level=warning", *args.daemon_arg],
                         env=env, stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/err", "wb"))
    try:
        import socket as so
        for _ in range(1000):
            try:
                c = so.socket(so.AF_UNIX); c.connect(sock); c.close(); break
            except OSError:
                time.sleep(0.01)
        return asyncio.run(session(f"unix://{sock}", d.pid, args))
    finally:
        d.terminate(); d.wait(10)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--par-calls", type=int, default=12800)
    p.add_argument("--ns", type=int, default=1000)
    p.add_argument("--busy", action="store_true")
    p.add_argument("--worker", default=f"{REPO}/bazel-bin/worker/agentix-worker")
    p.add_argument("--daemon-arg", action="append", default=[])
    p.add_argument("--b-arg", action="append", default=[], help="extra flag for B only")
    p.add_argument("a"); p.add_argument("b")
    args = p.parse_args()
    busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if args.busy else None
    rows = []
    try:
        for r in range(args.rounds):
            order = [("A", args.a), ("B", args.b)] if r % 2 == 0 else [("B", args.b), ("A", args.a)]
            res = {}
            for tag, b in order:
                base = list(args.daemon_arg)
                a2 = argparse.Namespace(**vars(args))
                a2.daemon_arg = base + (args.b_arg if tag == "B" else [])
                res[tag] = run_one(b, args.worker, a2)
            print(json.dumps({"round": r, "load": os.getloadavg()[0], **res}), flush=True)
            rows.append(res)
    finally:
        if busy:
            busy.kill()
    keys = ["p50", "p99", "cps64", "dcpu", "dcpu64", "ns_p50", "ns_dcpu"]
    summ = {}
    for k in keys:
        # The daemon's CPU is 0 on the direct path (the host talks to the
        # worker): such a round has no ratio.
        ratios = [x["B"][k] / x["A"][k] for x in rows if x["A"][k]]
        summ[k] = {"A_med": round(statistics.median(x["A"][k] for x in rows), 1),
                   "B_med": round(statistics.median(x["B"][k] for x in rows), 1),
                   "ratio_med": round(statistics.median(ratios), 3) if ratios else None,
                   "ratios": [round(x, 3) for x in ratios]}
    print("SUMMARY", json.dumps(summ))


main()
