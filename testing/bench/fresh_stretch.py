"""A fresh stack's first calls by stretch: slow calls and page faults per process (issue 25's p99).

`remote_calls`' noop phase measures a fresh daemon's calls 303-2,302 (its first call starts
the worker, then `glibc_tunables`, 300 warm-ups, 2,000 measured). This runs calls 3-6,002 of
a fresh daemon the same way and reports, per stretch (calls 3-502, 503-2,302, 2,303-6,002):
the share of slow calls (> 2x the p50 of the last stretch), the p50, and the minor page
faults of the host (this process; `host_main`: its event-loop thread), the daemon and the
worker; per 100-call block the number of slow calls of calls 3-2,302; and the p50, p99
(nearest rank, 2,000 samples) and p99/p50 of `remote_calls`' window.

    /usr/bin/python3 testing/bench/fresh_stretch.py --pairs 10 \\
        --a-python OLD_VENV/bin/python --a-sandboxd OLD/agentix-sandboxd --a-worker OLD/agentix-worker \\
        --python .venv-test/bin/python --sandboxd bazel-bin/sandbox/agentix-sandboxd \\
        --worker bazel-bin/worker/agentix-worker

runs side a (old) and side b (new) alternating, the order swapped every pair, each run a
fresh stack in a child process of the side's Python (its venv's agentix), all with the
benches' GLIBC_TUNABLES; prints one JSON line per run and then medians per side and the
per-pair differences. `--pairs 0 --python P ...`: one run of side b, its JSON line.
"""

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
STRETCHES = (500, 2300, 6000)  # measured calls at each stretch's end (calls 3.. of the daemon)
WINDOW = (300, 2300)  # remote_calls' measured calls, after 300 warm-ups


def _minflt(path: str) -> int:
    with open(path) as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[7])  # field 10, after the comm


def _worker_pid(daemon_pid: int) -> int | None:
    pending = [daemon_pid]
    while pending:
        pid = pending.pop()
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            for child in children:
                try:
                    with open(f"/proc/{child}/comm") as f:
                        if "worker" in f.read():
                            return child
                except OSError:
                    continue
                pending.append(child)
    return None


def _faults(daemon_pid: int, worker_pid: int | None) -> dict:
    return {"host": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
            "host_main": _minflt(f"/proc/self/task/{threading.get_native_id()}/stat"),
            "daemon": _minflt(f"/proc/{daemon_pid}/stat"),
            "worker": _minflt(f"/proc/{worker_pid}/stat") if worker_pid else 0}


async def _calls(url: str, daemon_pid: int) -> tuple[list[float], list[dict]]:
    import bench_targets
    from agentix import RuntimeClient
    async with RuntimeClient(url) as client:
        remote = client.remote
        await remote(bench_targets.noop)  # starts the worker
        await remote(bench_targets.glibc_tunables)
        worker_pid = _worker_pid(daemon_pid)
        faults = [_faults(daemon_pid, worker_pid)]
        latencies: list[float] = []
        clock = time.perf_counter
        for end in STRETCHES:
            while len(latencies) < end:
                start = clock()
                await remote(bench_targets.noop)
                latencies.append(clock() - start)
            faults.append(_faults(daemon_pid, worker_pid))
        return latencies, faults


def _nearest_rank(sorted_values: list[float], share: float) -> float:
    return sorted_values[max(0, int(share * len(sorted_values) + 0.999999) - 1)]


def run_once(sandboxd: str, worker: str) -> dict:
    """One fresh stack (in this process: its Python and agentix are the host's)."""
    sys.path.insert(0, BENCH_DIR)
    import procs
    from remote_calls import SERVER_START_TIMEOUT_S, _wait_for_unix_socket
    tmp = tempfile.mkdtemp(prefix="agx-fresh-", dir="/tmp")
    sock = os.path.join(tmp, "sandboxd.sock")
    daemon = procs.start_process(
        [sandboxd, "--listen", f"unix://{sock}", f"--worker={worker}",
         f"--python_path={BENCH_DIR}", "--log_level=warning"], stdout=sys.stderr.fileno())
    try:
        _wait_for_unix_socket(sock, daemon, SERVER_START_TIMEOUT_S)
        latencies, faults = asyncio.run(_calls(f"unix://{sock}", daemon.pid))
    finally:
        procs.stop_process(daemon)
        shutil.rmtree(tmp, ignore_errors=True)
    steady = statistics.median(latencies[STRETCHES[-2]:])
    out = {"steady_p50_us": steady * 1e6, "stretches": [],
           "slow_per_100": [sum(x > 2 * steady for x in latencies[i:i + 100])
                            for i in range(0, STRETCHES[1], 100)]}
    begin = 0
    for k, end in enumerate(STRETCHES):
        part = latencies[begin:end]
        out["stretches"].append({
            "calls": f"{begin + 3}-{end + 2}",
            "slow_pct": 100 * sum(x > 2 * steady for x in part) / len(part),
            "p50_us": statistics.median(part) * 1e6,
            "max_us": max(part) * 1e6,
            "faults": {name: faults[k + 1][name] - faults[k][name] for name in faults[0]}})
        begin = end
    window = sorted(latencies[WINDOW[0]:WINDOW[1]])
    p50, p99 = _nearest_rank(window, 0.5) * 1e6, _nearest_rank(window, 0.99) * 1e6
    out["window"] = {"p50_us": p50, "p99_us": p99, "p99_over_p50": p99 / p50}
    return out


def _child(python: str, sandboxd: str, worker: str, env: dict) -> dict:
    argv = [python, os.path.abspath(__file__), "--pairs", "0", "--sandboxd", sandboxd, "--worker", worker]
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=300, check=True)
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _summary(runs: list[dict]) -> None:
    median = statistics.median
    pairs = [(r["a"], r["b"]) for r in runs]
    for k, name in enumerate(("calls 3-502", "calls 503-2,302", "calls 2,303-6,002")):
        for process in ("host", "daemon", "worker"):
            a = [p[0]["stretches"][k]["faults"][process] for p in pairs]
            b = [p[1]["stretches"][k]["faults"][process] for p in pairs]
            print(f"{name} {process} faults: a {median(a)} ({min(a)}-{max(a)}), b {median(b)} ({min(b)}-{max(b)})")
        a = [p[0]["stretches"][k]["slow_pct"] for p in pairs]
        b = [p[1]["stretches"][k]["slow_pct"] for p in pairs]
        print(f"{name} slow %: a {median(a):.2f}, b {median(b):.2f}; per pair b - a "
              f"{[round(y - x, 2) for x, y in zip(a, b)]}")
    for key in ("p50_us", "p99_us", "p99_over_p50"):
        a = [p[0]["window"][key] for p in pairs]
        b = [p[1]["window"][key] for p in pairs]
        ratios = [y / x for x, y in zip(a, b)]
        print(f"window {key}: a {median(a):.2f}, b {median(b):.2f}; b / a per pair "
              f"{[round(r, 2) for r in ratios]}, median {median(ratios):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=10, help="0: one run of side b in this process")
    parser.add_argument("--sandboxd", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--python", default=sys.executable, help="side b's Python (its venv's agentix)")
    parser.add_argument("--a-sandboxd")
    parser.add_argument("--a-worker")
    parser.add_argument("--a-python")
    args = parser.parse_args()
    if args.pairs == 0:
        print(json.dumps(run_once(args.sandboxd, args.worker)))
        return
    sys.path.insert(0, BENCH_DIR)
    import procs
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES)
    sides = {"a": (args.a_python or args.python, args.a_sandboxd or args.sandboxd, args.a_worker or args.worker),
             "b": (args.python, args.sandboxd, args.worker)}
    runs = []
    for pair in range(args.pairs):
        run = {}
        for side in ("a", "b") if pair % 2 == 0 else ("b", "a"):
            with open("/proc/loadavg") as f:
                load = f.read().split()[0]
            run[side] = _child(*sides[side], env)
            print(json.dumps({"pair": pair + 1, "side": side, "load": load, **run[side]}), flush=True)
        runs.append(run)
    _summary(runs)


if __name__ == "__main__":
    main()
