"""Where a sequential noop's time goes with one busy core (issue 25's busy regime).

Same-run, alternating A/B of two stacks (daemon, worker, host venv), one stack
running at a time (its own daemon and host process), in each regime asked for:
``busy`` (floors.BusyCore: one unpinned spinning process, as remote_calls' busy
pass) and ``idle``. For each side of each run it reports:

- the noop's p50 / p90 (the host's clock, `--calls` sequential calls after a
  warm-up),
- CPU a call of host, daemon and worker (schedstat) and their sum,
- involuntary / voluntary context switches a call of each process (each
  thread's /proc status, summed): the call path's 4 tasks sharing one CPU make
  a waker preempted by the thread its write woke (PERFORMANCE.md stop 35),
- ``on_spinner_cpu``: the share of the stack's on-CPU time spent on CPUs where
  the spinner ran too, sampled every 2 ms (each thread's last CPU and run time
  from /proc; an estimate, not a trace),
- the Unix ping-pong floor's p50 run right after under the same regime, and
  ours / floor.

Then, per regime and figure, the medians of old and new and of the per-run
ratios new / old.

    /usr/bin/python3 testing/bench/busy_ab.py --runs 4 --calls 3000 \\
        --a-sandboxd /tmp/old36/agentix-sandboxd --a-worker /tmp/old36/agentix-worker \\
        --a-python /tmp/old36-venv/bin/python \\
        [--sandboxd B/agentix-sandboxd --worker B/agentix-worker --python VENV/bin/python] \\
        [--b-env AGENTIX_CALLS_CPU=off] [--b-daemon-flag=--calls_cpu=off] [--regime busy]

`--b-env` / `--b-daemon-flag` put a setting on side b only (its host's and
daemon's environment, a daemon flag), to A/B a setting on one build.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import threading

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import floors  # noqa: E402
import procs  # noqa: E402

# The host of one side: warms up, prints "READY <worker pid>", waits for a
# line, runs the calls, prints their latencies (ns) as one JSON line and
# disconnects at the next line.
_HOST = r"""
import asyncio, json, os, sys, time
sys.path.insert(0, os.environ["BUSY_BENCH_DIR"])
import bench_targets, procs
from agentix import RuntimeClient

async def main():
    sock, daemon_pid, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    async with RuntimeClient(f"unix://{sock}") as client:
        for _ in range(500):
            await client.remote(bench_targets.noop)
        (worker,) = procs.children(daemon_pid)
        print(f"READY {worker}", flush=True)
        sys.stdin.readline()
        clock, noop, lats = time.perf_counter_ns, bench_targets.noop, []
        for _ in range(calls):
            t0 = clock()
            await client.remote(noop)
            lats.append(clock() - t0)
        # Still connected: the daemon's connection threads (and their CPU) live until it closes.
        print(json.dumps(lats), flush=True)
        sys.stdin.readline()

asyncio.run(main())
"""

FIGURES = ("p50_us", "p90_us", "cpu_total_us", "cpu_host_us", "cpu_daemon_us", "cpu_worker_us",
           "inv_host", "inv_daemon", "inv_worker", "vol_total", "on_spinner_cpu", "floor_p50_us", "floor_cpu_us",
           "ours_over_floor")


def switches(pid: int) -> tuple[int, int]:
    """(involuntary, voluntary) context switches summed over pid's live threads."""
    inv = vol = 0
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("nonvoluntary_ctxt_switches:"):
                        inv += int(line.split()[1])
                    elif line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return inv, vol


def _threads_cpu(pid: int) -> dict[int, tuple[int, int]]:
    """{tid: (on-CPU ns so far, the CPU it last ran on)} for pid's live threads."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"{task}/stat") as f:
                stat = f.read()
            out[int(os.path.basename(task))] = (ns, int(stat[stat.rindex(")") + 2:].split()[36]))
        except (OSError, ValueError, IndexError):
            continue
    return out


class PlacementSampler:
    """Samples, every `period_s`, where the stack's threads ran since the last
    sample and on which CPU the spinner is: `share()` is the stack's on-CPU
    time on the spinner's CPU over all of its on-CPU time (None: no spinner
    or nothing ran)."""

    def __init__(self, stack_pids: list[int], spinner_pid: int | None, period_s: float = 0.002):
        self.stack_pids, self.spinner_pid, self.period_s = stack_pids, spinner_pid, period_s
        self.shared_ns = self.total_ns = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PlacementSampler":
        if self.spinner_pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        last = {}
        for pid in self.stack_pids:
            last.update(_threads_cpu(pid))
        while not self._stop.wait(self.period_s):
            spin = _threads_cpu(self.spinner_pid)
            spin_cpus = {cpu for _, cpu in spin.values()}
            for pid in self.stack_pids:
                for tid, (ns, cpu) in _threads_cpu(pid).items():
                    ran = ns - last.get(tid, (ns, cpu))[0]
                    last[tid] = (ns, cpu)
                    self.total_ns += ran
                    if cpu in spin_cpus:
                        self.shared_ns += ran

    def share(self) -> float | None:
        return round(self.shared_ns / self.total_ns, 3) if self.total_ns else None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(side: dict, calls: int, floor: str, spinner_pid: int | None) -> dict:
    """One side's figures: a fresh daemon and host, `calls` noops, then the floor."""
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES, BUSY_BENCH_DIR=BENCH_DIR)
    env.update(side["env"])
    with procs.ab_daemon(side["sandboxd"], side["worker"], env, "agx-busy-",
                         flags=tuple(side["daemon_flags"])) as (sock, daemon):
        host = subprocess.Popen([side["python"], "-c", _HOST, sock, str(daemon.pid), str(calls)],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            ready = host.stdout.readline().split()
            if len(ready) != 2 or ready[0] != "READY":
                raise RuntimeError(f"the host did not warm up (exit {host.poll()})")
            pids = {"host": host.pid, "daemon": daemon.pid, "worker": int(ready[1])}
            cpu_before = {k: sum(procs.thread_cpu_ns(p).values()) for k, p in pids.items()}
            sw_before = {k: switches(p) for k, p in pids.items()}
            with PlacementSampler(list(pids.values()), spinner_pid) as sampler:
                host.stdin.write("go\n")
                host.stdin.flush()
                line = host.stdout.readline()
                cpu_after = {k: sum(procs.thread_cpu_ns(p).values()) for k, p in pids.items()}
                sw_after = {k: switches(p) for k, p in pids.items()}
            host.stdin.write("done\n")
            host.stdin.flush()
            host.wait(timeout=60)
        finally:
            if host.poll() is None:
                procs.stop_process(host)
    lats = [ns / 1e3 for ns in json.loads(line)]
    out = {"p50_us": round(statistics.median(lats), 1), "p90_us": round(percentile(lats, 0.9), 1)}
    for k in pids:
        out[f"cpu_{k}_us"] = round((cpu_after[k] - cpu_before[k]) / 1e3 / calls, 1)
        out[f"inv_{k}"] = round((sw_after[k][0] - sw_before[k][0]) / calls, 2)
    out["cpu_total_us"] = round(sum(out[f"cpu_{k}_us"] for k in pids), 1)
    out["vol_total"] = round(sum(sw_after[k][1] - sw_before[k][1] for k in pids) / calls, 2)
    out["on_spinner_cpu"] = sampler.share()
    if floor:
        result = floors.run_json([floor, "--quick"], log=lambda *_: None)
        out["floor_p50_us"] = result.get("noop_p50_us")
        out["floor_cpu_us"] = result.get("noop_cpu_us_per_call")
        out["ours_over_floor"] = floors.ratio(out["p50_us"], out["floor_p50_us"])
    return out


def summarize(per_run: list[dict]) -> dict:
    """Per figure: old and new medians and the median of the per-run ratios new / old."""
    summary = {}
    for k in FIGURES:
        pairs = [(r["old"][k], r["new"][k]) for r in per_run
                 if isinstance(r["old"].get(k), (int, float)) and isinstance(r["new"].get(k), (int, float))]
        if not pairs:
            continue
        ratios = [n / o for o, n in pairs if o]
        summary[k] = {"old": round(statistics.median(o for o, _ in pairs), 3),
                      "new": round(statistics.median(n for _, n in pairs), 3),
                      "ratio": round(statistics.median(ratios), 3) if ratios else None,
                      "per_run": [round(x, 2) for x in ratios]}
    return summary


def _setting(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a-sandboxd", required=True)
    parser.add_argument("--a-worker", required=True)
    parser.add_argument("--a-python", required=True)
    parser.add_argument("--sandboxd", default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--worker", default=f"{REPO}/bazel-bin/worker/agentix-worker")
    parser.add_argument("--python", default=f"{REPO}/.venv-test/bin/python")
    parser.add_argument("--b-env", action="append", default=[], type=_setting, metavar="NAME=VALUE",
                        help="side b's host and daemon environment only")
    parser.add_argument("--b-daemon-flag", action="append", default=[], help="side b's daemon only")
    parser.add_argument("--floor", default=f"{REPO}/bazel-bin/testing/bench/floor/unix_pingpong",
                        help="the Unix ping-pong floor run after each side; '' to skip")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--regime", choices=("busy", "idle", "both"), default="both")
    args = parser.parse_args()
    if args.calls < 1 or args.runs < 1:
        parser.error("--calls and --runs must be positive")
    sides = {"old": {"sandboxd": args.a_sandboxd, "worker": args.a_worker, "python": args.a_python,
                     "env": {}, "daemon_flags": []},
             "new": {"sandboxd": args.sandboxd, "worker": args.worker, "python": args.python,
                     "env": dict(args.b_env), "daemon_flags": args.b_daemon_flag}}
    regimes = ("busy", "idle") if args.regime == "both" else (args.regime,)
    report = {"calls": args.calls, "runs": args.runs, "load_start": os.getloadavg()[0]}
    for regime in regimes:
        per_run = []
        for i in range(args.runs):
            order = ("old", "new") if i % 2 == 0 else ("new", "old")
            row = {}
            for name in order:
                if regime == "busy":
                    with floors.BusyCore() as busy:
                        row[name] = measure(sides[name], args.calls, args.floor, busy.proc.pid)
                    row[name]["spinner_cpu_share"] = busy.report()["cpu_share"]
                else:
                    row[name] = measure(sides[name], args.calls, args.floor, None)
            row["load"] = os.getloadavg()[0]
            per_run.append(row)
            print(f"{regime} run {i + 1} ({'/'.join(order)}, load {row['load']:.2f}): " + ", ".join(
                f"{k} {row['old'].get(k)}/{row['new'].get(k)}" for k in FIGURES),
                file=sys.stderr, flush=True)
        report[regime] = {"summary": summarize(per_run), "loads": [r["load"] for r in per_run]}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
