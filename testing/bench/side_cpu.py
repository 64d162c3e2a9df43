"""Worker CPU per forwarded log record and per span, by thread (and the
host's and the daemon's), A/B.

Drives `side_targets.log_burst` and `side_targets.span_burst` through a real
agentix-sandboxd (+ agentix-worker) on a Unix socket, waits until the host
has every record / span, and reads the worker's per-thread on-CPU time
(schedstat, ns resolution) around each burst. Run from a venv with the agentix
host package (tools/make_venv), after `bazel build //sandbox/... //worker/...`:

    .venv-test/bin/python testing/bench/side_cpu.py [--rounds 5]
    .venv-test/bin/python testing/bench/side_cpu.py \\
        --worker /tmp/before/agentix-worker --agentix /tmp/before/python \\
        --worker bazel-bin/worker/agentix-worker --agentix host/python

    .venv-test/bin/python testing/bench/side_cpu.py \\
        --sandboxd /tmp/before/agentix-sandboxd --sandboxd bazel-bin/sandbox/agentix-sandboxd

Each variant (the i-th --sandboxd, --worker and --agentix; a single one of a
kind serves every variant) is measured in every round (alternating order, so a
noisy neighbour hits both); --agentix gives the directory holding the
`agentix` package the sandbox imports (its trace module runs there too).
Medians over the rounds are printed: the worker's threads by name, its
`total`, `host` / `daemon` (this process, all threads; the daemon's
process) and the host's threads by role (`host:loop`, `host:replay`,
`host:other`; see host_thread_cpu_ns) per record / span, and
`wait:agentix-call`, the worker's calling thread's run-queue wait (time
runnable but not running) per item: in a log burst that thread is the
serial stage, so items/s is about 1 / (its CPU + its wait) per item; then every thread's (worker, host, daemon) busy
share of the burst's wall time, which says which serial stage bounds the
rate. --split adds the worker's calling thread stage by stage
(`side_targets.worker_split`: stdlib logging, the bridge, the durable log,
agentix.trace, the forwarder; C paths against their general paths).
"""

import argparse
import asyncio
import glob
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import procs  # noqa: E402
import side_targets  # noqa: E402  (by this name on both sides)
from agentix import RuntimeClient, trace  # noqa: E402


class Counter:
    """Counts arrivals (host log handler / span processor) from any thread."""

    def __init__(self):
        self.count = 0

    def hit(self):
        self.count += 1  # one GIL-held increment; exactness is checked below

    async def wait_for(self, n, timeout_s=120.0, poll_s=0.005):
        deadline = time.monotonic() + timeout_s
        while self.count < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.count}/{n} arrived")
            await asyncio.sleep(poll_s)


def install_counters():
    records, spans = Counter(), Counter()

    class Records(logging.Handler):
        def emit(self, record):
            records.hit()

    logger = logging.getLogger(side_targets.LOGGER)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(Records())

    class Spans(trace.Processor):
        def on_span_end(self, span):
            if span.name == "s":
                spans.hit()

    trace.add_processor(Spans())
    return records, spans


def host_thread_cpu_ns():
    """This process's on-CPU ns by role: "host:loop" (the main thread, which
    runs the event loop), "host:replay" (asyncio's to_thread pool, where
    log and span replay runs), "host:other" (gRPC's own threads and the
    rest). CPython 3.11 does not name its threads for the OS, so they are
    told apart by native thread id."""
    roles = {threading.main_thread().native_id: "host:loop"}
    for thread in threading.enumerate():
        if thread.name.startswith("asyncio_"):
            roles[thread.native_id] = "host:replay"
    out = {}
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(f"{task}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:
            continue  # the thread ended meanwhile
        role = roles.get(int(os.path.basename(task)), "host:other")
        out[role] = out.get(role, 0) + ns
    return out


async def burst(client, worker_pid, daemon_pid, fn, n, counter):
    counter.count = 0
    before = procs.thread_cpu_ns(worker_pid)
    waited_before = procs.thread_wait_ns(worker_pid)
    host_threads, daemon_threads = procs.thread_cpu_ns(os.getpid()), procs.thread_cpu_ns(daemon_pid)
    host_before, daemon_before = sum(host_threads.values()), sum(daemon_threads.values())
    roles_before = host_thread_cpu_ns()
    start = time.perf_counter()
    await client.remote(fn, n)
    await counter.wait_for(n)
    wall = time.perf_counter() - start
    time.sleep(0.02)  # the sender thread may still be returning from a write
    after = procs.thread_cpu_ns(worker_pid)
    waited = procs.thread_wait_ns(worker_pid)
    host_after, daemon_after = procs.thread_cpu_ns(os.getpid()), procs.thread_cpu_ns(daemon_pid)
    host = (sum(host_after.values()) - host_before) / 1e3 / n
    daemon = (sum(daemon_after.values()) - daemon_before) / 1e3 / n
    # The host's and the daemon's threads too ("host/<name>", "daemon/<name>"):
    # with `rate`, each thread's share of the burst's wall time (utilisation).
    others = {}
    for prefix, old, new in (("host", host_threads, host_after),
                             ("daemon", daemon_threads, daemon_after)):
        for name in new:
            others[f"{prefix}/{name}"] = (new[name] - old.get(name, 0)) / 1e3 / n
    roles_after = host_thread_cpu_ns()
    if counter.count != n:
        raise AssertionError(f"{counter.count} arrived, {n} sent")
    per_thread = {name: (after[name] - before.get(name, 0)) / 1e3 / n
                  for name in after}
    roles = {name: (ns - roles_before.get(name, 0)) / 1e3 / n for name, ns in roles_after.items()}
    # The calling thread's run-queue wait: with its CPU time, its wall time
    # per item, which bounds the rate (see the module docstring).
    wait = {f"wait:{name}": (ns - waited_before.get(name, 0)) / 1e3 / n
            for name, ns in waited.items() if name == "agentix-call"}
    return {"total": sum(per_thread.values()), "rate": n / wall, "host": host,
            "daemon": daemon, **per_thread, **others, **roles, **wait}


async def measure(sock, daemon_pid, records_n, spans_n, counters, split):
    records, spans = counters
    records.count = spans.count = 0
    async with RuntimeClient(f"unix://{sock}") as client:
        await client.remote(side_targets.log_burst, 2000)  # starts the worker
        await client.remote(side_targets.span_burst, 500)
        await records.wait_for(2000)
        await spans.wait_for(500)
        (worker,) = procs.children(daemon_pid)
        logs = await burst(client, worker, daemon_pid, side_targets.log_burst,
                           records_n, records)
        span = await burst(client, worker, daemon_pid, side_targets.span_burst,
                           spans_n, spans)
        if split:
            # After the bursts: the worker's calling thread stage by stage.
            logs["split"] = await client.remote(side_targets.worker_split, 20_000)
    return logs, span


def run_one(sandboxd, worker, agentix_dir, records_n, spans_n, counters, split):
    tmp = tempfile.mkdtemp(prefix="agx-side-cpu-", dir="/tmp")  # short sun_path
    sock = os.path.join(tmp, "sandboxd.sock")
    env = dict(os.environ, AGENTIX_LOG_DIR=tmp)
    daemon = subprocess.Popen(
        [sandboxd, "--listen", f"unix://{sock}", f"--worker={worker}",
         f"--python_path={BENCH_DIR}:{agentix_dir}", "--log_level=error"],
        env=env)
    try:
        while not os.path.exists(sock):
            if daemon.poll() is not None:
                sys.exit(f"agentix-sandboxd exited with {daemon.returncode}")
            time.sleep(0.05)
        return asyncio.run(measure(sock, daemon.pid, records_n, spans_n,
                                   counters, split))
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def summary(samples):
    first = ("rate", "host", "daemon", "total")
    keys = sorted({k for s in samples for k in s if "/" not in k and k != "split"},
                  key=lambda k: (first.index(k) if k in first else len(first), k))
    parts = []
    for key in keys:
        value = statistics.median(s.get(key, 0.0) for s in samples)
        if key == "rate":
            parts.append(f"{value:,.0f}/s")
        elif value >= 0.05:
            parts.append(f"{key} {value:.1f}")
    return ", ".join(parts)


def utilisation(samples):
    """Each busy thread's share of the burst's wall time (µs per item × items/s),
    median over the rounds, busiest first: the serial stage that bounds the
    rate is the one near 100%."""
    shares = {}
    for key in {k for s in samples for k in s}:
        if key in ("rate", "host", "daemon", "total", "split") or key.startswith("wait:"):
            continue
        share = statistics.median(s.get(key, 0.0) * s["rate"] / 1e6 for s in samples)
        if share >= 0.05:
            name = key if "/" in key else f"worker/{key}"
            shares[name] = share
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--spans", type=int, default=10_000)
    parser.add_argument("--sandboxd", action="append")
    parser.add_argument("--worker", action="append")
    parser.add_argument("--agentix", action="append")
    parser.add_argument("--split", action="store_true",
                        help="also time the worker's calling thread stage by stage "
                             "(side_targets.worker_split) after each round's bursts")
    args = parser.parse_args()
    import agentix
    default_agentix = os.path.dirname(os.path.dirname(agentix.__file__))
    daemons = args.sandboxd or [f"{REPO}/bazel-bin/sandbox/agentix-sandboxd"]
    workers = args.worker or [f"{REPO}/bazel-bin/worker/agentix-worker"]
    dirs = [os.path.abspath(d) for d in (args.agentix or [default_agentix])]
    count = max(len(daemons), len(workers), len(dirs))
    for name, values in (("--sandboxd", daemons), ("--worker", workers), ("--agentix", dirs)):
        if len(values) not in (1, count):
            sys.exit(f"give {name} once or {count} times")
    variants = [(daemons[i if len(daemons) > 1 else 0], workers[i if len(workers) > 1 else 0],
                 dirs[i if len(dirs) > 1 else 0]) for i in range(count)]
    counters = install_counters()
    results = {i: ([], []) for i in range(count)}
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(args.rounds):
        order = range(count) if r % 2 == 0 else reversed(range(count))
        for i in order:
            daemon, worker, agentix_dir = variants[i]
            logs, spans = run_one(daemon, worker, agentix_dir, args.records, args.spans,
                                  counters, args.split)
            results[i][0].append(logs)
            results[i][1].append(spans)
            print(f"round {r + 1} variant {i}: record {logs['total']:.1f} µs, "
                  f"span {spans['total']:.1f} µs (worker)", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")
    for i, (daemon, worker, agentix_dir) in enumerate(variants):
        print(f"variant {i}: {daemon}, {worker} (agentix from {agentix_dir})")
        print(f"  µs per record (median of {args.rounds}): {summary(results[i][0])}")
        print(f"  µs per span   (median of {args.rounds}): {summary(results[i][1])}")
        print(f"  busy share of the wall time, records: {utilisation(results[i][0])}")
        print(f"  busy share of the wall time, spans:   {utilisation(results[i][1])}")
        splits = [r["split"] for r in results[i][0] if "split" in r]
        if splits:
            medians = {key: statistics.median(s[key] for s in splits if key in s)
                       for key in splits[0]}
            print(f"  worker calling thread by stage, µs per item (median of {len(splits)}): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))


if __name__ == "__main__":
    main()
