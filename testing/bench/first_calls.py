"""A fresh connection's first calls against its steady state (issue 25's p99).

Each run starts a daemon (its worker starts on the first call, as for a
user's new sandbox), connects a host, makes one call (timed apart: the cold
start), then `--calls` sequential `remote(bench_targets.noop)` calls, and
reports:

- `slow_first`: calls over 1 ms among the first `--first` (1,500) calls,
- `p99_first1000`: p99 of the first 1,000 calls,
- per 500-call window: p50, p99, calls over 1 ms (`--windows`),
- the steady state (the second half of the calls): p50, p99, CPU per call of
  host, daemon and worker (schedstat of all their threads),
- RSS (kB) of daemon and worker after the first call and at the end,
- with `--pause S`: the calls over 1 ms among the first `--first` calls
  after a pause of S seconds taken after `--pause-after` (300) calls (a
  client that stops and resumes: when the worker's deferred imports run).

With `--a-*` paths it is a same-run A/B: pairs of runs, old (A) and new (B)
alternating which goes first, medians per side and per-pair ratios (B/A).
`--daemon-arg=ARG` (repeatable) goes to every daemon; `--b-daemon-arg=ARG`
to side B's only, which makes an A/B of daemon arguments on the same
binaries (`--daemon-arg=--nodirect_calls --b-daemon-arg=--direct_calls`:
direct calls off/on whatever the daemon's default; B's come last and win).

    /usr/bin/python3 testing/bench/first_calls.py --pairs 6 \\
        --a-sandboxd OLD/agentix-sandboxd --a-worker OLD/agentix-worker \\
        --a-python OLD_VENV/bin/python \\
        --sandboxd NEW/agentix-sandboxd --worker NEW/agentix-worker \\
        --python NEW_VENV/bin/python

The processes get the environment users give them (no GLIBC_TUNABLES: the
daemon and worker set their own allocator options) unless
`--malloc-tunables` puts the benchmarks' procs.MALLOC_TUNABLES on all three.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import procs  # noqa: E402

_HOST = r"""
import asyncio, json, os, sys, time
sys.path.insert(0, os.environ["TAIL_BENCH_DIR"])
import bench_targets, procs
from agentix import RuntimeClient

sock, daemon_pid, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pause_after, pause_s = int(sys.argv[4]), float(sys.argv[5])

def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

def cpu_ns(pids):
    return {k: sum(procs.thread_cpu_ns(p).values()) for k, p in pids.items()}

async def main():
    async with RuntimeClient(f"unix://{sock}") as client:
        t0 = time.perf_counter()
        await client.remote(bench_targets.noop)
        first_ms = (time.perf_counter() - t0) * 1e3
        (worker,) = procs.children(daemon_pid)
        pids = {"host": os.getpid(), "daemon": daemon_pid, "worker": worker}
        rss_start = {k: rss_kb(p) for k, p in pids.items()}
        lat = []
        steady_from = calls // 2
        cpu_a = None
        perf = time.perf_counter
        for i in range(calls):
            if i == steady_from:
                cpu_a = cpu_ns(pids)
            if i == pause_after and pause_s:
                time.sleep(pause_s)  # the host's loop blocked: no traffic
            t = perf()
            await client.remote(bench_targets.noop)
            lat.append((perf() - t) * 1e6)
        cpu_b = cpu_ns(pids)
        n = calls - steady_from
        print("RESULT " + json.dumps({
            "first_call_ms": first_ms, "lat_us": lat,
            "pause_after": pause_after if pause_s else 0,
            "cpu_us": {k: (cpu_b[k] - cpu_a[k]) / 1e3 / n for k in pids},
            "rss_start_kb": rss_start,
            "rss_end_kb": {k: rss_kb(p) for k, p in pids.items()},
        }), flush=True)

asyncio.run(main())
"""


def pct(sorted_values, q):
    """Nearest-rank percentile of an ascending list."""
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def summarize(raw: dict, first: int) -> dict:
    """The figures of one run from the host's RESULT."""
    lat = raw["lat_us"]
    steady = sorted(lat[len(lat) // 2:])
    after = lat[raw["pause_after"]:] if raw["pause_after"] else []
    windows = []
    for w in range(0, len(lat), 500):
        x = sorted(lat[w:w + 500])
        windows.append((round(pct(x, 0.5)), round(pct(x, 0.99)),
                        sum(v > 1000 for v in x)))
    return {
        "first_call_ms": round(raw["first_call_ms"], 1),
        "slow_first": sum(v > 1000 for v in lat[:first]),
        "p99_first1000": round(pct(sorted(lat[:1000]), 0.99), 1),
        "p50_steady": round(pct(steady, 0.5), 1),
        "p99_steady": round(pct(steady, 0.99), 1),
        "slow_after_pause": sum(v > 1000 for v in after[:first]),
        "cpu_us": {k: round(v, 1) for k, v in raw["cpu_us"].items()},
        "cpu_total_us": round(sum(raw["cpu_us"].values()), 1),
        "rss_start_kb": raw["rss_start_kb"],
        "rss_end_kb": raw["rss_end_kb"],
        "windows": windows,
    }


def run_once(side: dict, args) -> dict:
    env = dict(os.environ, TAIL_BENCH_DIR=BENCH_DIR)
    env.pop("GLIBC_TUNABLES", None)
    if args.malloc_tunables:
        env["GLIBC_TUNABLES"] = procs.MALLOC_TUNABLES
    with procs.ab_daemon(side["sandboxd"], side["worker"], env, "agx-first-",
                         flags=tuple(side["daemon_args"])) as (sock, daemon):
        out = subprocess.run(
            [side["python"], "-c", _HOST, sock, str(daemon.pid),
             str(args.calls), str(args.pause_after), str(args.pause)],
            env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return summarize(json.loads(line[7:]), args.first)
    raise RuntimeError(f"host failed: {out.stderr[-2000:]}")


def show(label: str, r: dict, windows: bool) -> str:
    line = (f"{label}: first call {r['first_call_ms']} ms, >1ms in first "
            f"calls {r['slow_first']}, p99 first 1000 {r['p99_first1000']}, "
            f"after the pause {r['slow_after_pause']}, "
            f"steady p50 {r['p50_steady']} p99 {r['p99_steady']}, CPU/call "
            f"{r['cpu_total_us']} ({r['cpu_us']['host']} / "
            f"{r['cpu_us']['daemon']} / {r['cpu_us']['worker']}), RSS kB "
            f"daemon {r['rss_start_kb']['daemon']}->{r['rss_end_kb']['daemon']}"
            f" worker {r['rss_start_kb']['worker']}->"
            f"{r['rss_end_kb']['worker']}")
    if windows:
        line += "\n    windows (p50, p99, >1ms): " + " ".join(
            f"{a}/{b}/{c}" for a, b, c in r["windows"])
    return line


_FIGURES = [
    ("slow_first", lambda r: r["slow_first"]),
    ("p99_first1000", lambda r: r["p99_first1000"]),
    ("slow_after_pause", lambda r: r["slow_after_pause"]),
    ("p50_steady", lambda r: r["p50_steady"]),
    ("p99_steady", lambda r: r["p99_steady"]),
    ("cpu_total_us", lambda r: r["cpu_total_us"]),
    ("cpu_host_us", lambda r: r["cpu_us"]["host"]),
    ("cpu_daemon_us", lambda r: r["cpu_us"]["daemon"]),
    ("cpu_worker_us", lambda r: r["cpu_us"]["worker"]),
    ("rss_daemon_end_kb", lambda r: r["rss_end_kb"]["daemon"]),
    ("rss_worker_end_kb", lambda r: r["rss_end_kb"]["worker"]),
    ("first_call_ms", lambda r: r["first_call_ms"]),
]


def ab_table(pairs) -> str:
    rows = ["figure | A median | B median | B/A per pair (median; range)"]
    for name, get in _FIGURES:
        a = [get(p[0]) for p in pairs]
        b = [get(p[1]) for p in pairs]
        ratios = [y / x for x, y in zip(a, b) if x]
        ratio = (f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-"
                 f"{max(ratios):.2f})" if ratios else "-")
        rows.append(f"{name} | {statistics.median(a):g} | "
                    f"{statistics.median(b):g} | {ratio}")
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    built = os.path.join(REPO, "bazel-bin")
    parser.add_argument("--sandboxd", default=f"{built}/sandbox/agentix-sandboxd")
    parser.add_argument("--worker", default=f"{built}/worker/agentix-worker")
    parser.add_argument("--python", default=f"{REPO}/.venv-test/bin/python")
    parser.add_argument("--a-sandboxd")
    parser.add_argument("--a-worker")
    parser.add_argument("--a-python")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--calls", type=int, default=6000)
    parser.add_argument("--first", type=int, default=1500)
    parser.add_argument("--daemon-arg", "--daemon-flag", dest="daemon_arg", action="append",
                        default=[], metavar="ARG",
                        help="passed to every agentix-sandboxd, both sides (repeatable; "
                             "write flags as --daemon-arg=--direct_calls)")
    parser.add_argument("--b-daemon-arg", action="append", default=[], metavar="ARG",
                        help="passed to side B's agentix-sandboxd only, after --daemon-arg: "
                             "an A/B of daemon arguments on the same binaries")
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds without calls after --pause-after calls")
    parser.add_argument("--pause-after", type=int, default=300)
    parser.add_argument("--malloc-tunables", action="store_true")
    parser.add_argument("--windows", action="store_true",
                        help="print every run's 500-call windows")
    parser.add_argument("--json", help="write every run's figures here")
    args = parser.parse_args()
    new = {"sandboxd": args.sandboxd, "worker": args.worker,
           "python": args.python, "daemon_args": args.daemon_arg + args.b_daemon_arg}
    ab = args.a_sandboxd or args.a_worker or args.a_python or args.b_daemon_arg
    old = {"sandboxd": args.a_sandboxd or args.sandboxd,
           "worker": args.a_worker or args.worker,
           "python": args.a_python or args.python, "daemon_args": args.daemon_arg}
    print(f"machine {procs.machine()}", flush=True)
    print(f"daemon args: A {old['daemon_args']}, B {new['daemon_args']}", flush=True)
    pairs = []
    for i in range(args.pairs if ab else 1):
        order = ("A", "B") if i % 2 == 0 else ("B", "A")
        got = {}
        for label in (order if ab else ("B",)):
            got[label] = run_once(old if label == "A" else new, args)
            print(f"[{i}] load {procs.loadavg()} " +
                  show(label, got[label], args.windows), flush=True)
        if ab:
            pairs.append((got["A"], got["B"]))
    if ab:
        print(ab_table(pairs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"daemon_args": {"A": old["daemon_args"], "B": new["daemon_args"]},
                       "pairs": [{"A": a, "B": b} for a, b in pairs]}, f)


if __name__ == "__main__":
    main()
