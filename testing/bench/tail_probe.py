"""What the slow calls of a sequential noop stream are (issue 25's p99).

Runs one long stream of sequential `remote(bench_targets.noop)` calls
through a fresh daemon and records every call's start and latency (the
host's CLOCK_MONOTONIC, which `perf_counter` reads on Linux), the host's
garbage collections, and, with `--perf`, the scheduler's view of the whole
machine over the same seconds (`perf record -a -k CLOCK_MONOTONIC`:
sched_switch, sched_wakeup, sched_migrate_task, hrtimer expiries, user page
faults). It then reports:

- the latency distribution (p50, p90, p99, p99.9, max, p99/p50), how the
  slow calls (> 2 x p50) are spaced (gaps between consecutive slow calls:
  clustered or periodic) and spread over the run (per tenth of it),
- per call, from the trace: context switches and migrations of the stack's
  threads (host, daemon, worker), whether a thread of another process ran
  on a CPU the stack used, whether the worker's intake follower woke (its
  1 ms timerfd), hrtimer expiries in the stack, page faults; each as a
  share of the fast calls and of the slow ones, so what goes with a slow
  call stands out, and each slow call's first cause (`slow_calls_by_cause`:
  another process on the stack's CPU, our timerfd, the tick, a migration, a
  page fault of a stack thread, ...),
- what happened around each first slow call after 20 fast ones (which
  timers fired, which other processes ran, which threads migrated),
- the Unix ping-pong floor's p50/p99 measured right after (`--floor`).

    /usr/bin/python3 testing/bench/tail_probe.py [--calls 20000] [--perf] \\
        [--sandboxd B/agentix-sandboxd --worker B/agentix-worker \\
         --python VENV/bin/python] [--floor B/testing/bench/floor/unix_pingpong]

`--ns`: the stream is the sandbox's sequential namespace requests
(side_targets.ns_stream, answered by the host's echo handler) instead of the
host's noop calls; `--sandbox-env AGENTIX_CALLS_CPU=off` unpins the worker's
reply waits. With `--perf` the report's `tick` says what the kernel tick costs
a call (tick_cost); with `--tick` too, `tick_breakdown` splits a tick-meeting
call's excess into the stall before the interrupt, the handler, softirqs and
the rest, and `tick_threads` into who had the chain's CPU (each stack
thread, idle, other processes, the interrupts) against a call without a
tick. `--busy`: one unpinned spinner runs from before the daemon
starts to the stream's end (remote_calls' busy core; `--calls 200 --warmup 51`
is its busy pass's noop phase); a slow call whose stack CPU ran it counts as
`busy_spinner_on_stack_cpu`, and `--keep` leaves report.json (the stack's
threads, the spinner's pid) beside the trace for a later look.

Needs `perf` (perf_event_paranoid <= 1 or root) for `--perf`.
"""

import argparse
import bisect
import collections
import contextlib
import json
import os
import signal
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

# The host: warms up, prints "READY <worker pid>", waits for a line on
# stdin, runs the stream and writes (start ns, latency ns) pairs and GC
# spans to argv[3] as JSON.
_HOST = r"""
import array, asyncio, gc, json, os, sys, time
sys.path.insert(0, os.environ["TAIL_BENCH_DIR"])
import bench_targets, procs
from agentix import RuntimeClient

sock, daemon_pid, out_path, calls = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
warmup = int(sys.argv[5])
gcs, gc_start = [], [0]

def on_gc(phase, info):
    now = time.perf_counter_ns()
    if phase == "start":
        gc_start[0] = now
    else:
        gcs.append((gc_start[0], now, info["generation"]))

async def main():
    async with RuntimeClient(f"unix://{sock}") as client:
        for _ in range(warmup):
            await client.remote(bench_targets.noop)
        (worker,) = procs.children(daemon_pid)
        print(f"READY {worker}", flush=True)
        sys.stdin.readline()
        await client.remote(bench_targets.gc_record_start)
        gc.callbacks.append(on_gc)
        # Raw int64s: a list would keep two int objects a call alive, and
        # the host would fault in a fresh page every ~64 calls (its own).
        starts, lats = array.array("q", bytes(8 * calls)), array.array("q", bytes(8 * calls))
        clock, noop, remote = time.perf_counter_ns, bench_targets.noop, client.remote
        for i in range(calls):
            t0 = clock()
            await remote(noop)
            starts[i] = t0
            lats[i] = clock() - t0
        gc.callbacks.remove(on_gc)
        worker_gcs = await client.remote(bench_targets.gc_record_stop)
    with open(out_path, "w") as f:
        json.dump({"starts": starts.tolist(), "lats": lats.tolist(), "gcs": gcs,
                   "worker_gcs": worker_gcs}, f)
    print("DONE", flush=True)

asyncio.run(main())
"""

# The host of --ns: as _HOST, but the stream is the sandbox's sequential
# namespace requests (side_targets.ns_stream, timed in the sandbox) answered
# by this host's echo handler; no host GC record (the host only answers).
_NS_HOST = r"""
import asyncio, json, os, sys
sys.path.insert(0, os.environ["TAIL_BENCH_DIR"])
import procs, side_targets
from agentix import AsyncClientNamespace, RuntimeClient, request_handler

sock, daemon_pid, out_path, calls = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

class Echo(AsyncClientNamespace):
    @request_handler("echo")
    async def on_echo(self, body):
        return body

async def main():
    client = RuntimeClient(f"unix://{sock}")
    client.register_namespace(Echo(side_targets.NAMESPACE))
    async with client:
        await client.remote(side_targets.ns_roundtrips, "agentix", 300, 200)
        (worker,) = procs.children(daemon_pid)
        print(f"READY {worker}", flush=True)
        sys.stdin.readline()
        data = await client.remote(side_targets.ns_stream, calls, 0)
    with open(out_path, "w") as f:
        json.dump({**data, "gcs": []}, f)
    print("DONE", flush=True)

asyncio.run(main())
"""

# The host of --ab: one client per daemon (argv[1], argv[2], their pids
# argv[7], argv[8]); after a warm-up of each, blocks of argv[4] sequential
# calls alternate between the two (the order swapped each pair of blocks),
# so both sides meet the same moments of the machine's load; writes
# {"a": [...], "b": [...]} latencies (ns), the first argv[5] calls of each
# block left out (the side was idle for a block), their starts ("starts_a",
# "starts_b"), each side's on-CPU ns of its daemon and worker over its blocks
# ("cpu_a", "cpu_b") and the threads of all five processes ("stack_tids"),
# to argv[3].
_AB_HOST = r"""
import asyncio, json, os, sys, time
sys.path.insert(0, os.environ["TAIL_BENCH_DIR"])
import bench_targets, procs
from agentix import RuntimeClient

socks = {"a": sys.argv[1], "b": sys.argv[2]}
out_path, block, skip, calls = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
daemons = {"a": int(sys.argv[7]), "b": int(sys.argv[8])}

def cpu(pids):
    return {k: sum(procs.thread_cpu_ns(p).values()) for k, p in pids.items()}

async def main():
    lats = {"a": [], "b": []}
    starts = {"a": [], "b": []}
    spent = {s: {"daemon": 0, "worker": 0} for s in "ab"}
    async with RuntimeClient(f"unix://{socks['a']}") as ca, \
            RuntimeClient(f"unix://{socks['b']}") as cb:
        remotes = {"a": ca.remote, "b": cb.remote}
        for side in "ab":
            for _ in range(500):
                await remotes[side](bench_targets.noop)
        pids = {s: {"daemon": daemons[s], "worker": procs.children(daemons[s])[0]}
                for s in "ab"}
        clock, noop = time.perf_counter_ns, bench_targets.noop
        for pair in range(max(1, calls // block)):
            for side in ("ab" if pair % 2 == 0 else "ba"):
                remote, out, began = remotes[side], lats[side], starts[side]
                before = cpu(pids[side])
                for i in range(block):
                    t0 = clock()
                    await remote(noop)
                    if i >= skip:
                        out.append(clock() - t0)
                        began.append(t0)
                after = cpu(pids[side])
                for k in after:
                    spent[side][k] += after[k] - before[k]
        # The stack's threads, while connected (a connection's threads end with it).
        tids = [int(t) for p in ["self", *(pids[s][k] for s in "ab" for k in pids[s])]
                for t in os.listdir(f"/proc/{p}/task")]
    with open(out_path, "w") as f:
        json.dump({**lats, "cpu_a": spent["a"], "cpu_b": spent["b"],
                   "starts_a": starts["a"], "starts_b": starts["b"],
                   "stack_tids": tids}, f)

asyncio.run(main())
"""

# The host of one side of --ab with --a-python (each side its own Python and
# agentix package): one client of the daemon at argv[1] (pid argv[2]); after a
# warm-up prints READY, then runs a block of argv[4] sequential calls (the
# first argv[5] left out) for each "go" line on stdin, answering "ok"; at EOF
# writes {"lats", "starts", "cpu" (its daemon's, worker's and own on-CPU ns
# over its blocks), "stack_tids"} to argv[3].
_AB_SIDE_HOST = r"""
import asyncio, json, os, sys, time
sys.path.insert(0, os.environ["TAIL_BENCH_DIR"])
import bench_targets, procs
from agentix import RuntimeClient

sock, daemon, out_path, block, skip = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])

def cpu(pids):
    return {k: sum(procs.thread_cpu_ns(p).values()) for k, p in pids.items()}

async def main():
    lats, starts, spent = [], [], {"daemon": 0, "worker": 0, "host": 0}
    async with RuntimeClient(f"unix://{sock}") as client:
        remote, noop, clock = client.remote, bench_targets.noop, time.perf_counter_ns
        for _ in range(500):
            await remote(noop)
        pids = {"daemon": daemon, "worker": procs.children(daemon)[0], "host": os.getpid()}
        print("READY", flush=True)
        while sys.stdin.readline().strip() == "go":
            before = cpu(pids)
            for i in range(block):
                t0 = clock()
                await remote(noop)
                if i >= skip:
                    lats.append(clock() - t0)
                    starts.append(t0)
            after = cpu(pids)
            for k in after:
                spent[k] += after[k] - before[k]
            print("ok", flush=True)
        tids = [int(t) for p in ["self", *pids.values()] for t in os.listdir(f"/proc/{p}/task")]
    with open(out_path, "w") as f:
        json.dump({"lats": lats, "starts": starts, "cpu": spent, "stack_tids": tids}, f)

asyncio.run(main())
"""


def _two_hosts(pythons, socks, daemons, out_path, args, env):
    """--ab with a host process per side (`pythons`): their blocks alternate
    as _AB_HOST's do; writes what _AB_HOST writes to `out_path`."""
    hosts = {}
    try:
        for side in "ab":
            hosts[side] = subprocess.Popen(
                [pythons[side], "-c", _AB_SIDE_HOST, socks[side], str(daemons[side]),
                 f"{out_path}.{side}", str(args.block), str(args.skip)],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if hosts[side].stdout.readline().strip() != "READY":
                raise RuntimeError(f"host {side} did not start")
        for pair in range(max(1, args.calls // args.block)):
            for side in ("ab" if pair % 2 == 0 else "ba"):
                hosts[side].stdin.write("go\n")
                hosts[side].stdin.flush()
                if hosts[side].stdout.readline().strip() != "ok":
                    raise RuntimeError(f"host {side} failed")
        for side in "ab":
            hosts[side].stdin.close()
            if hosts[side].wait(timeout=60) != 0:
                raise RuntimeError(f"host {side} failed")
    finally:
        for host in hosts.values():
            if host.poll() is None:
                host.kill()
                host.wait()
    out = {"stack_tids": []}
    for side in "ab":
        with open(f"{out_path}.{side}") as f:
            one = json.load(f)
        out.update({side: one["lats"], f"starts_{side}": one["starts"], f"cpu_{side}": one["cpu"]})
        out["stack_tids"] += one["stack_tids"]
    with open(out_path, "w") as f:
        json.dump(out, f)


_PERF_EVENTS = ("sched:sched_switch,sched:sched_wakeup,sched:sched_migrate_task,"
                "timer:hrtimer_expire_entry,exceptions:page_fault_user,"
                "irq_vectors:local_timer_entry,irq_vectors:reschedule_entry,"
                "irq_vectors:call_function_single_entry")
# With --tick as well: the tick's own span, the softirqs after it and the IPIs
# it sends (the nohz idle-balance kick: smp_call_function from the tick).
_TICK_EVENTS = "irq_vectors:local_timer_exit,irq:softirq_entry,irq:softirq_exit,ipi:ipi_send_cpu"


def _perf_events(args):
    """The tracepoints to record: the usual ones, --tick's, then --perf-event's."""
    events = _PERF_EVENTS.split(",") + (_TICK_EVENTS.split(",") if args.tick else [])
    return ",".join(dict.fromkeys(events + list(args.perf_event)))


def _pct(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def distribution(lats_us):
    s = sorted(lats_us)
    p50 = statistics.median(s)
    out = {"calls": len(s), "p50_us": round(p50, 1), "p90_us": round(_pct(s, 0.90), 1),
           "p99_us": round(_pct(s, 0.99), 1), "p999_us": round(_pct(s, 0.999), 1),
           "max_us": round(s[-1], 1), "p99_over_p50": round(_pct(s, 0.99) / p50, 2)}
    # Histogram in multiples of p50 (is it bimodal?).
    bins = collections.Counter(min(int(x / p50 * 4) / 4, 5.0) for x in s)
    out["histogram_x_p50"] = {f"{k:.2f}": bins[k] for k in sorted(bins)}
    return out


def spacing(slow_idx, calls):
    gaps = [b - a for a, b in zip(slow_idx, slow_idx[1:])]
    tenth = max(1, calls // 10)
    per_tenth = collections.Counter(i // tenth for i in slow_idx)
    return {"slow_calls": len(slow_idx),
            "gap_median_calls": statistics.median(gaps) if gaps else None,
            "gaps_of_1": sum(g == 1 for g in gaps),
            # Exact gaps (a bin of 16-31 was once read as "every 16th call"): the
            # 24 commonest, in order; "65+" is 65 or more (a bin once read as
            # "exactly 65 calls apart": see period below).
            "gap_histogram": {(str(g) if g < 65 else "65+"): n for g, n in sorted(
                collections.Counter(min(g, 65) for g in gaps).most_common(24))},
            "per_tenth_of_run": [per_tenth.get(i, 0) for i in range(10)],
            "period": period(slow_idx, calls)}


def period(slow_idx, calls, max_lag=256):
    """Is a slow call followed by another one a fixed number of calls later
    more often than at the distances around it? For each lag L, the share of
    slow calls with a slow call L calls later, against the median share of
    the lags within 3 of it: a stall every N calls makes lags N, 2N, ...
    stand out of their neighbours (a contrast well above 1); clustered slow
    calls (a loaded machine's episodes) raise the short lags together and
    random ones none. Reports the base rate (the share of all calls that are
    slow), the lag-1 share (clustering) and the five lags of highest contrast."""
    if len(slow_idx) < 2:
        return {}
    slow = set(slow_idx)
    share = {lag: sum(i + lag in slow for i in slow_idx) / len(slow_idx)
             for lag in range(1, max_lag + 4)}
    contrast = []
    for lag in range(3, max_lag + 1):
        around = statistics.median(share[k] for k in range(max(2, lag - 3), lag + 4)
                                   if k != lag)
        if share[lag] > 0:
            contrast.append((share[lag] / around if around else float("inf"), lag))
    contrast.sort(reverse=True)
    return {"base_rate": round(len(slow_idx) / calls, 4), "lag_1": round(share[1], 4),
            "top_lags": [{"lag": lag, "share": round(share[lag], 4),
                          "over_neighbours": round(c, 2)} for c, lag in contrast[:5]]}


def by_residue(lats, periods=(16, 64, 256, 512)):
    """Something every N calls (a count-based sample, a buffer or a block
    refilled every N) makes one call index modulo N slower in its median, a
    shift the 2 x p50 threshold sees only in part (stop 35: the daemon's
    schedstat sample every 256 call ends, a 256-call lag at the edge of
    `period`'s range). Per N: the residue whose calls' median is highest, that
    median over the median of all residues' medians, and its share of calls
    over 2 x p50 against the run's."""
    if not lats:
        return {}
    p50 = statistics.median(lats)
    out = {}
    for n in periods:
        if len(lats) < 16 * n:
            continue
        medians = [statistics.median(lats[r::n]) for r in range(n)]
        top = max(range(n), key=medians.__getitem__)
        out[str(n)] = {"residue": top,
                       "median_over_residues": round(medians[top] / statistics.median(medians), 3),
                       "slow_share": round(sum(x > 2 * p50 for x in lats[top::n]) / len(lats[top::n]), 4),
                       "slow_share_all": round(sum(x > 2 * p50 for x in lats) / len(lats), 4)}
    return out


def parse_perf(script_text):
    """perf script lines -> list of (t_ns, cpu, comm, tid, event, rest)."""
    events = []
    for line in script_text.splitlines():
        # "   comm  tid [cpu] secs.frac: event: rest"
        try:
            head, event, rest = line.split(": ", 2)
        except ValueError:
            continue
        parts = head.split()
        try:
            t_ns = int(round(float(parts[-1]) * 1e9))
            cpu = int(parts[-2].strip("[]"))
            tid = int(parts[-3])
        except (ValueError, IndexError):
            continue
        comm = " ".join(parts[:-3])
        events.append((t_ns, cpu, comm, tid, event.split(":")[-1].strip(), rest))
    events.sort()
    return events


def correlate(events, starts, lats, slow_threshold_ns, stack_tids, names):
    """Per call, the features seen in its window; returns shares among the
    fast and the slow calls."""
    times = [e[0] for e in events]
    features = collections.defaultdict(lambda: [0, 0])  # name -> [fast, slow]
    n_fast = n_slow = 0
    examples = []
    for t0, lat in zip(starts, lats):
        slow = lat > slow_threshold_ns
        lo, hi = bisect.bisect_left(times, t0), bisect.bisect_right(times, t0 + lat)
        seen = set()
        switches = 0
        cpus_used = set()
        foreign = set()
        window = events[lo:hi]
        for t, cpu, comm, tid, ev, rest in window:
            if tid in stack_tids:
                cpus_used.add(cpu)
        for t, cpu, comm, tid, ev, rest in window:
            if ev == "sched_switch":
                # prev_comm=... prev_pid=N ... ==> next_comm=... next_pid=M
                try:
                    next_pid = int(rest.rsplit("next_pid=", 1)[1].split()[0])
                    prev_pid = int(rest.split("prev_pid=", 1)[1].split()[0])
                except (IndexError, ValueError):
                    continue
                if prev_pid in stack_tids:
                    switches += 1
                    if " prev_state=R" in rest:
                        seen.add(f"preempted:{names.get(prev_pid, prev_pid)}")
                if next_pid not in stack_tids and next_pid != 0 and cpu in cpus_used:
                    foreign.add(rest.rsplit("next_comm=", 1)[1].split(" next_pid")[0])
            elif ev == "sched_migrate_task":
                try:
                    pid = int(rest.split(" pid=", 1)[1].split()[0])
                except (IndexError, ValueError):
                    continue
                if pid in stack_tids:
                    seen.add(f"migrated:{names.get(pid, pid)}")
            elif ev == "sched_wakeup":
                try:
                    pid = int(rest.split(" pid=", 1)[1].split()[0])
                except (IndexError, ValueError):
                    continue
                if pid in stack_tids:
                    seen.add(f"woke:{names.get(pid, pid)}")
            elif ev == "hrtimer_expire_entry" and tid in stack_tids:
                seen.add(f"hrtimer:{names.get(tid, tid)}")
            elif ev == "page_fault_user" and tid in stack_tids:
                seen.add(f"page_fault:{names.get(tid, tid)}")
        if foreign:
            seen.add("foreign_thread_ran_on_stack_cpu")
        seen.add(f"stack_cpus={len(cpus_used)}")
        seen.add(f"stack_switches={min(switches, 8)}")
        for f in seen:
            features[f][1 if slow else 0] += 1
        if slow:
            n_slow += 1
            if len(examples) < 12:
                examples.append({"lat_us": round(lat / 1e3, 1), "features": sorted(seen),
                                 "foreign": sorted(foreign)[:6]})
        else:
            n_fast += 1
    shares = {f: {"fast": round(v[0] / max(1, n_fast), 3), "slow": round(v[1] / max(1, n_slow), 3)}
              for f, v in sorted(features.items())}
    return {"fast_calls": n_fast, "slow_calls": n_slow, "share_of_calls": shares,
            "slow_examples": examples}


# A slow call's cause, the first of these seen in its window: the --busy
# spinner ran on a CPU the stack used (the chain shared the busy core); another
# process's thread ran on a CPU the stack used (the others' load); the
# worker's intake timer (a timerfd whose expiry wakes a stack thread) fired
# on a CPU the stack used; the kernel tick fired there; a stack thread
# migrated; a stack thread took a page fault (first touches of memory a
# growing table or buffer takes from the kernel); the tracer itself (perf's buffer wake-ups: an IPI from the CPU
# whose events filled it); none of them.
# The last before none_seen: the call's hand-offs crossed CPUs (its stack
# threads ran on two or more: a cross-CPU wake-up, e.g. a side not pinned).
CAUSES = ("busy_spinner_on_stack_cpu", "foreign_thread_on_stack_cpu",
          "our_timerfd_on_stack_cpu", "tick_on_stack_cpu", "stack_thread_migrated",
          "stack_page_fault", "perf_woken", "stack_on_two_cpus", "none_seen")


def our_timers(events, stack_tids):
    """The hrtimers (addresses) of timerfds whose expiries wake a stack
    thread, and the threads they wake (the worker's intake follower): a stack
    thread at least a quarter of whose (10 or more) wake-ups come within 50 us
    after an expiry of one timerfd (the wake-up may follow on another CPU,
    after an IPI)."""
    expiries = []  # (t, address) of every timerfd expiry
    for t, _, _, _, ev, rest in events:
        if ev == "hrtimer_expire_entry" and "function=timerfd_tmrproc" in rest:
            expiries.append((t, rest.split("hrtimer=", 1)[1].split()[0]))
    times = [t for t, _ in expiries]
    after = collections.Counter()  # (address, tid): wake-ups soon after its expiry
    wakeups = collections.Counter()  # tid: all its wake-ups
    for t, _, _, _, ev, rest in events:
        if ev != "sched_wakeup":
            continue
        try:
            tid = int(rest.split(" pid=", 1)[1].split()[0])
        except (IndexError, ValueError):
            continue
        if tid not in stack_tids:
            continue
        wakeups[tid] += 1
        i = bisect.bisect_right(times, t) - 1
        if i >= 0 and t - times[i] <= 50_000:
            after[expiries[i][1], tid] += 1
    ours = {(address, tid) for (address, tid), n in after.items()
            if n >= 10 and n * 4 >= wakeups[tid]}
    return {a for a, _ in ours}, {tid for _, tid in ours}


def causes(events, starts, lats, slow_threshold_ns, stack_tids, timers, spinner=None):
    """Per slow call its cause (CAUSES; `timers`: our_timers'; `spinner`: the
    --busy spinner's pid, its own cause); returns {cause: share of all calls}.
    The CPUs the stack used are those its threads ran on, the ones our timers wake left out (else a timer firing
    on the follower's own CPU, off the call path, would count)."""
    addresses, followers = timers
    times = [e[0] for e in events]
    counts = collections.Counter()
    for t0, lat in zip(starts, lats):
        if lat <= slow_threshold_ns:
            continue
        window = events[bisect.bisect_left(times, t0):bisect.bisect_right(times, t0 + lat)]
        cpus = {cpu for _, cpu, _, tid, _, _ in window
                if tid in stack_tids and tid not in followers}
        seen = set()
        for _, cpu, _, tid, ev, rest in window:
            if ev == "sched_switch" and cpu in cpus:
                try:
                    nxt = int(rest.rsplit("next_pid=", 1)[1].split()[0])
                except (IndexError, ValueError):
                    continue
                if nxt == spinner:
                    seen.add(CAUSES[0])
                elif nxt not in stack_tids and nxt != 0:
                    seen.add(CAUSES[1])
            elif ev == "hrtimer_expire_entry" and cpu in cpus:
                if rest.split("hrtimer=", 1)[1].split()[0] in addresses:
                    seen.add(CAUSES[2])
                elif "function=tick_nohz_handler" in rest or "function=tick_sched_timer" in rest:
                    seen.add(CAUSES[3])
            elif ev == "sched_migrate_task":
                try:
                    if int(rest.split(" pid=", 1)[1].split()[0]) in stack_tids:
                        seen.add(CAUSES[4])
                except (IndexError, ValueError):
                    pass
            elif ev == "page_fault_user" and tid in stack_tids:
                seen.add(CAUSES[5])
            elif ev == "sched_wakeup" and rest.startswith("comm=perf "):
                seen.add(CAUSES[6])
        if len(cpus) > 1:
            seen.add(CAUSES[7])
        counts[next((c for c in CAUSES if c in seen), CAUSES[-1])] += 1
    return {c: round(counts[c] / max(1, len(lats)), 5) for c in CAUSES}


def tick_loss(starts, lats, period_ns=4_000_000):
    """Per boundary of the tick period (CLOCK_MONOTONIC multiples of
    `period_ns`: the periodic tick's due times, 4 ms at HZ=250), the calls'
    excess over the median call from 100 us before it to 150 us after, less
    the same sum half a period later (the baseline); p25/p50/p75 in us, as
    tick_ring (testing/bench/floor) reports for a plain ring of processes.
    Needs no trace."""
    p50 = statistics.median(lats)

    def loss(frm, to):
        i = bisect.bisect_left(starts, frm - 10_000_000)
        total = 0
        while i < len(starts) and starts[i] < to:
            if starts[i] + lats[i] >= frm and lats[i] > p50:
                total += lats[i] - p50
            i += 1
        return total

    losses = []
    b = (starts[0] // period_ns + 1) * period_ns
    while b + period_ns < starts[-1]:
        half = b + period_ns // 2
        losses.append((loss(b - 100_000, b + 150_000) - loss(half - 100_000, half + 150_000)) / 1e3)
        b += period_ns
    if not losses:
        return {}
    losses.sort()
    return {"ticks": len(losses), "p25_us": round(_pct(losses, 0.25), 1),
            "p50_us": round(_pct(losses, 0.5), 1), "p75_us": round(_pct(losses, 0.75), 1)}


def _q(values, q):
    return round(_pct(sorted(values), q), 1) if values else None


_TICK_FUNCTIONS = ("function=tick_nohz_handler", "function=tick_sched_timer")


def runnable_at_ticks(events):
    """{(t, cpu): threads runnable on `cpu` (the one running included) when
    a local_timer_entry there began}: the scheduler's nr_running as the trace
    shows it, from sched_wakeup (target_cpu), sched_switch (a prev_state of R
    stays runnable, next is runnable) and sched_migrate_task. The nohz
    idle-balance kick is sent for nr_running >= 2 (besides its periodic
    blocked-load updates)."""
    where, out, running = {}, {}, {}
    on_cpu = collections.defaultdict(set)

    def place(tid, cpu):
        old = where.get(tid)
        if old is not None:
            on_cpu[old].discard(tid)
        if cpu is None:
            where.pop(tid, None)
        else:
            where[tid] = cpu
            on_cpu[cpu].add(tid)

    def field(rest, name):
        return int(rest.rsplit(f"{name}=", 1)[1].split()[0])

    for t, cpu, _, _, ev, rest in events:
        try:
            if ev == "sched_wakeup":
                place(field(rest, "pid"), field(rest, "target_cpu"))
            elif ev == "sched_switch":
                prev, nxt = field(rest, "prev_pid"), field(rest, "next_pid")
                state = rest.split("prev_state=", 1)[1].split()[0]
                if running.get(cpu, prev) != prev:
                    # The trace lost the thread that ran here last (some
                    # threads' switches away are never seen): not counted.
                    place(running[cpu], None)
                running[cpu] = nxt
                if prev != 0:
                    place(prev, cpu if state.startswith("R") else None)
                if nxt != 0:
                    place(nxt, cpu)
            elif ev == "sched_migrate_task":
                tid = field(rest, "pid")
                if tid in where:
                    place(tid, field(rest, "dest_cpu"))
            elif ev == "local_timer_entry":
                out[(t, cpu)] = len(on_cpu[cpu])
        except (IndexError, ValueError):
            continue
    return out


def _call_window(events, times, t0, lat, stack_tids, followers):
    """The events of the call [t0, t0 + lat) and a Counter of the CPUs its
    stack threads' events were on (the timer-woken follower left out)."""
    window = events[bisect.bisect_left(times, t0):bisect.bisect_right(times, t0 + lat)]
    return window, collections.Counter(cpu for _, cpu, _, tid, _, _ in window
                                       if tid in stack_tids and tid not in followers)


def tick_breakdown(events, starts, lats, slow_threshold_ns, stack_tids, followers):
    """Where the time goes when the kernel tick lands on a call (`--tick`'s
    events needed). For each call with one tick on the CPU its threads ran on
    (the timer-woken follower left out), in us: `stall`, from the tick's due
    time (the previous multiple of the tick period before the handler's
    `now`) or the CPU's last event after it, to the interrupt's entry (the
    vCPU made no progress: no event, and the call's work was still to do);
    `handler`, the interrupt's span; `kick`, whether the handler sent an IPI
    through smp_call_function (the nohz idle-balance kick of a halted CPU);
    `softirq`, the softirqs on that CPU in the call; `others`, the time
    other processes' threads ran there; `rest`, the call's excess over the
    median call less all of these (its later hops running slower). Reported
    as p10/p50/p90 over the calls, with and without a kick, and the share of
    each group over the slow threshold; and `runnable`, the threads runnable
    on the CPU when the tick's interrupt began (runnable_at_ticks), as the
    share of each group's calls with 2 or more."""
    times = [e[0] for e in events]
    runnable = runnable_at_ticks(events)
    ticks = collections.defaultdict(list)
    for t, cpu, _, _, ev, rest in events:
        if ev == "hrtimer_expire_entry" and any(f in rest for f in _TICK_FUNCTIONS):
            ticks[cpu].append(t)
    gaps = sorted(b - a for ts in ticks.values() for a, b in zip(ts, ts[1:]))
    if not gaps:
        return {}
    period = round(gaps[len(gaps) // 2] / 100_000) * 100_000  # 4 ms at HZ=250
    p50 = statistics.median(lats)
    groups = {"kick": collections.defaultdict(list), "no_kick": collections.defaultdict(list)}
    for t0, lat in zip(starts, lats):
        window, cpus = _call_window(events, times, t0, lat, stack_tids, followers)
        if not cpus:
            continue
        cpu = cpus.most_common(1)[0][0]
        mine = [e for e in window if e[1] == cpu]
        due = [e for e in mine if e[4] == "hrtimer_expire_entry"
               and any(f in e[5] for f in _TICK_FUNCTIONS)]
        if len(due) != 1:
            continue
        f = {"handler": 0, "softirq": 0, "others": 0}
        kick, entry, soft, ran, last, stall = False, None, None, None, t0, 0
        queued = None
        due_at = due[0][0] - int(due[0][5].split("now=", 1)[1].split()[0]) % period
        for t, _, _, _, ev, rest in mine:
            if ev == "local_timer_entry":
                entry = t
                if due[0][0] - 20_000 < t <= due[0][0]:  # the tick's own interrupt
                    stall = max(0, t - max(last, due_at))
                    queued = runnable.get((t, cpu))
            elif ev == "local_timer_exit" and entry is not None:
                f["handler"] += t - entry
                entry = None
            elif ev == "ipi_send_cpu" and entry is not None and "generic_exec_single" in rest:
                kick = True
            elif ev == "softirq_entry":
                soft = t
            elif ev == "softirq_exit" and soft is not None:
                f["softirq"] += t - soft
                soft = None
            elif ev == "sched_switch":
                if ran is not None:
                    f["others"] += t - ran
                    ran = None
                try:
                    nxt = int(rest.rsplit("next_pid=", 1)[1].split()[0])
                except (IndexError, ValueError):
                    continue
                if nxt not in stack_tids and nxt != 0:
                    ran = t
            last = t
        if ran is not None:
            f["others"] += t0 + lat - ran
        f["stall"] = stall
        f["excess"] = lat - p50
        f["rest"] = f["excess"] - f["stall"] - f["handler"] - f["softirq"] - f["others"]
        g = groups["kick" if kick else "no_kick"]
        for k, v in f.items():
            g[k].append(v / 1e3)
        g["slow"].append(lat > slow_threshold_ns)
        if queued is not None:
            g["runnable"].append(queued)
    out = {"tick_period_us": period / 1e3}
    for name, g in groups.items():
        n = len(g["slow"])
        out[name] = {"calls": n, "share_of_calls": round(n / max(1, len(lats)), 5),
                     "share_slow": round(sum(g["slow"]) / max(1, n), 3)}
        for k in ("excess", "stall", "handler", "softirq", "others", "rest"):
            out[name][k + "_us_p10_p50_p90"] = [_q(g[k], q) for q in (0.1, 0.5, 0.9)]
        out[name]["share_runnable_2_or_more"] = round(
            sum(r >= 2 for r in g["runnable"]) / max(1, len(g["runnable"])), 3)
    return out


def tick_threads(events, starts, lats, stack_tids, followers, names):
    """Who had the chain's CPU during a call that met the tick, against a
    call that did not (`--tick`'s events needed): per call, on the CPU its
    stack threads ran on most, the time each stack thread ran there (the
    timer interrupts and softirqs taken out, as `irq`), the time the CPU was
    idle, the time other processes ran, the stack threads' time on the other
    CPUs, and the context switches there. Means in us over the calls with
    exactly one tick on that CPU and over those with none, and the
    difference: means add up, so the difference's parts sum to the excess."""
    switches = collections.defaultdict(list)  # cpu -> [(t, next_pid)]
    irqs = collections.defaultdict(list)  # cpu -> [(entry, exit)]
    open_irq = {}
    for t, cpu, _, _, ev, rest in events:
        if ev == "sched_switch":
            try:
                switches[cpu].append((t, int(rest.rsplit("next_pid=", 1)[1].split()[0]),
                                      int(rest.split("prev_pid=", 1)[1].split()[0])))
            except (IndexError, ValueError):
                continue
        elif ev in ("local_timer_entry", "softirq_entry"):
            open_irq.setdefault(cpu, t)
        elif ev in ("local_timer_exit", "softirq_exit") and cpu in open_irq:
            irqs[cpu].append((open_irq.pop(cpu), t))
    sw_times = {cpu: [t for t, _, _ in v] for cpu, v in switches.items()}
    irq_starts = {cpu: [a for a, _ in v] for cpu, v in irqs.items()}
    times = [e[0] for e in events]

    def label(tid):
        if tid == 0:
            return "idle"
        if tid in followers:
            return "follower"
        if tid in stack_tids:
            return names.get(tid, str(tid)).split("[")[0]
        return "other_processes"

    def occupancy(cpu, lo, hi):
        """{label: ns} of [lo, hi) on cpu, irq time apart; and the switches."""
        out = collections.Counter()
        ts = sw_times.get(cpu, [])
        if not ts:
            return None, 0
        k = bisect.bisect_right(ts, lo) - 1
        # Before the CPU's first switch, the thread it switched away from ran.
        cur = switches[cpu][k][1] if k >= 0 else switches[cpu][0][2]
        n_sw, t = 0, lo
        k += 1
        while True:
            end = ts[k] if k < len(ts) and ts[k] < hi else hi
            out[label(cur)] += end - t
            if end >= hi:
                break
            cur, t, n_sw = switches[cpu][k][1], end, n_sw + 1
            k += 1
        istarts = irq_starts.get(cpu, [])
        j = bisect.bisect_left(istarts, lo - 1_000_000)
        irq = 0
        while j < len(istarts) and istarts[j] < hi:
            a, b = irqs[cpu][j]
            irq += max(0, min(b, hi) - max(a, lo))
            j += 1
        out["irq"] = irq
        return out, n_sw

    groups = {"tick": [], "clean": []}
    for t0, lat in zip(starts, lats):
        window, cpus = _call_window(events, times, t0, lat, stack_tids, followers)
        if not cpus:
            continue
        cpu = cpus.most_common(1)[0][0]
        n_ticks = sum(1 for e in window if e[1] == cpu and e[4] == "local_timer_entry")
        if n_ticks > 1:
            continue
        occ, n_sw = occupancy(cpu, t0, t0 + lat)
        if occ is None:
            continue
        # The running thread's share of the interrupts is the interrupts'.
        irq_left = occ["irq"]
        for name in sorted(occ, key=lambda n: -occ[n]):
            if name not in ("irq", "idle") and irq_left:
                taken = min(irq_left, occ[name])
                occ[name] -= taken
                irq_left -= taken
        elsewhere = 0
        for other in cpus:
            if other != cpu:
                o, _ = occupancy(other, t0, t0 + lat)
                if o:
                    elsewhere += sum(v for k, v in o.items()
                                     if k not in ("idle", "irq", "other_processes"))
        occ["stack_on_other_cpus"] = elsewhere
        occ["switches"] = n_sw * 1000  # shown / 1e3 below, as a count
        occ["latency"] = lat
        groups["tick" if n_ticks else "clean"].append(occ)
    if not groups["tick"] or not groups["clean"]:
        return {}
    keys = sorted({k for g in groups.values() for occ in g for k in occ}
                  | {"idle", "irq", "other_processes"})
    mean = {name: {k: round(sum(o[k] for o in g) / len(g) / 1e3, 1) for k in keys}
            for name, g in groups.items()}
    return {"calls": {name: len(g) for name, g in groups.items()},
            "mean_us": mean,
            "tick_minus_clean_us": {k: round(mean["tick"][k] - mean["clean"][k], 1)
                                    for k in keys}}


def tick_cost(events, starts, lats, stack_tids, followers):
    """What the kernel tick costs a call: the share of calls during which
    the tick fired on a CPU their stack threads ran on (the intake follower
    left out), and the median latency over the median of the calls without
    one; and, per such tick, the gap from the last traced event of the CPU
    to the timer interrupt's entry (a stall before the interrupt is
    delivered: the hypervisor's, as no guest event shows in it; read with
    --perf-event raw_syscalls:sys_enter,raw_syscalls:sys_exit for a dense
    trace) and the interrupt's own time (with irq_vectors:local_timer_exit)."""
    times = [e[0] for e in events]
    hit, clean, gaps, irq = [], [], [], []
    for t0, lat in zip(starts, lats):
        lo, hi = bisect.bisect_left(times, t0), bisect.bisect_right(times, t0 + lat)
        cpus = {e[1] for e in events[lo:hi] if e[3] in stack_tids and e[3] not in followers}
        ticks = [k for k in range(lo, hi) if events[k][4] == "local_timer_entry"
                 and events[k][1] in cpus]
        (hit if ticks else clean).append(lat)
        for k in ticks:
            cpu, before = events[k][1], k - 1
            while before >= lo and events[before][1] != cpu:
                before -= 1
            if before >= lo:
                gaps.append(events[k][0] - events[before][0])
            after = next((e for e in events[k + 1:hi] if e[1] == cpu and e[4] == "local_timer_exit"),
                         None)
            if after is not None:
                irq.append(after[0] - events[k][0])
    base = statistics.median(clean) if clean else 0
    med = lambda v: round(statistics.median(v) / 1e3, 1) if v else None  # noqa: E731
    return {"share_of_calls_with_tick": round(len(hit) / max(1, len(lats)), 4),
            "their_median_excess_us": med([x - base for x in hit]),
            "share_of_them_over_2x_p50": round(sum(x > 2 * base for x in hit) / max(1, len(hit)), 3),
            "gap_before_tick_entry_median_us": med(gaps), "tick_irq_median_us": med(irq)}


def run_starts(events, starts, lats, slow_threshold_ns, stack_tids, quiet=20):
    """What happened around the first slow call after `quiet` fast ones (a
    run of slow calls starting), from the previous call's start to its end:
    for each timer function that fired, each thread of another process that
    ran and each thread of any process that migrated, in how many starts."""
    times = [e[0] for e in events]
    counts = collections.Counter()
    found = 0
    last_slow = -quiet - 1
    for i, lat in enumerate(lats):
        if lat <= slow_threshold_ns:
            continue
        if i - last_slow > quiet and i > 0:
            found += 1
            lo = bisect.bisect_left(times, starts[i - 1])
            hi = bisect.bisect_right(times, starts[i] + lat)
            seen = set()
            for _, _, _, tid, ev, rest in events[lo:hi]:
                if ev == "hrtimer_expire_entry":
                    seen.add("timer:" + rest.split("function=", 1)[-1].split()[0])
                elif ev == "sched_migrate_task":
                    seen.add("migrated:" + rest.split("comm=", 1)[-1].split(" pid=")[0])
                elif ev == "sched_switch":
                    try:
                        next_pid = int(rest.rsplit("next_pid=", 1)[1].split()[0])
                    except (IndexError, ValueError):
                        continue
                    if next_pid not in stack_tids and next_pid != 0:
                        seen.add("other_process_ran:" +
                                 rest.rsplit("next_comm=", 1)[1].split(" next_pid")[0])
            counts.update(seen)
        last_slow = i
    return {"run_starts": found, "in_how_many": dict(counts.most_common(20))}


def gc_overlap(gcs, starts, lats, slow_idx):
    """How a process's cycle collections ([start ns, end ns, generation, ...])
    meet the stream's calls: how many, by generation, their median length,
    how many calls apart, how many calls (and slow calls) one overlaps."""
    hit = set()
    for g in gcs:  # calls are sequential: starts sorted
        i = bisect.bisect_right(starts, g[1]) - 1
        while i >= 0 and starts[i] + lats[i] > g[0]:
            hit.add(i)
            i -= 1
    slow = set(slow_idx)
    idx = sorted(hit)
    gaps = collections.Counter(b - a for a, b in zip(idx, idx[1:]))
    return {"collections": len(gcs),
            "by_generation": dict(collections.Counter(g[2] for g in gcs)),
            "median_us": round(statistics.median(g[1] - g[0] for g in gcs) / 1e3, 1) if gcs else 0,
            "calls_with_gc": len(hit), "slow_calls_with_gc": len(hit & slow),
            "slow_calls": len(slow), "slow_with_gc_p50_us": round(statistics.median(
                lats[i] for i in hit & slow) / 1e3, 1) if hit & slow else 0,
            "gap_calls_top": dict(gaps.most_common(3))}


def thread_names(pids, seen=None):
    """{tid: "process/thread name"} of the stack's threads (and of `seen`,
    an earlier answer, for threads gone since); a name several threads
    share (the worker's pool threads) gets the tid: which of them is the
    intake's reader and which its follower matters."""
    names = {tid: name.split("[")[0] for tid, name in (seen or {}).items()}
    for who, pid in pids.items():
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/comm") as f:
                    names[int(task)] = f"{who}/{f.read().strip()}"
            except OSError:
                pass
    shared = collections.Counter(names.values())
    return {tid: f"{name}[{tid}]" if shared[name] > 1 else name
            for tid, name in names.items()}


@contextlib.contextmanager
def _busy(args):
    """With --busy, one spinning process (floors.BusyCore, unpinned: remote_calls'
    busy core) for the block, started before the daemon as there; yields it, or None."""
    if not args.busy:
        yield None
        return
    with floors.BusyCore() as busy:
        time.sleep(0.2)  # the spinner runs before the first call
        yield busy


def run(args):
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES, TAIL_BENCH_DIR=BENCH_DIR)
    tmp = tempfile.mkdtemp(prefix="agx-tail-")
    out_path = os.path.join(tmp, "lat.json")
    perf_data = os.path.join(tmp, "perf.data")
    report = {"load_start": os.getloadavg()[0], "stream": "namespace requests" if args.ns else "noop"}
    python_path = ()
    if args.ns:  # the sandbox's agentix (agentix.sio) is the host's venv's
        python_path = (subprocess.run(
            [args.python, "-c", "import agentix, os; print(os.path.dirname(os.path.dirname("
             "os.path.abspath(agentix.__file__))))"],
            check=True, capture_output=True, text=True, env=env).stdout.strip(),)
    daemon_env = dict(env)
    daemon_env.update(field.split("=", 1) for field in args.sandbox_env)
    with _busy(args) as busy, \
            procs.ab_daemon(args.sandboxd, args.worker, daemon_env, "agx-tail-",
                            python_path=python_path,
                            flags=tuple(args.daemon_flag)) as (sock, daemon):
        host = subprocess.Popen([args.python, "-c", _NS_HOST if args.ns else _HOST, sock,
                                 str(daemon.pid), out_path,
                                 str(args.calls), str(args.warmup)], env=env,
                                stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        perf = None
        try:
            line = host.stdout.readline()
            if not line.startswith("READY "):
                raise RuntimeError(f"host: {line!r}")
            worker = int(line.split()[1])
            pids = {"host": host.pid, "daemon": daemon.pid, "worker": worker}
            names = thread_names(pids)
            if args.perf:
                perf = subprocess.Popen(["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC",
                                         "-e", _perf_events(args), "-o", perf_data],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            host.stdin.write("go\n")
            host.stdin.flush()
            line = host.stdout.readline()
            if line.strip() != "DONE":
                raise RuntimeError(f"host: {line!r}")
            names = thread_names(pids, names)
        finally:
            if perf is not None:
                perf.send_signal(signal.SIGINT)
                perf.wait(timeout=60)
            host.wait(timeout=60)
    if busy is not None:
        report["busy"] = busy.report()
    with open(out_path) as f:
        data = json.load(f)
    starts, lats = data["starts"], data["lats"]
    lats_us = [x / 1e3 for x in lats]
    report["ns_request" if args.ns else "noop"] = distribution(lats_us)
    p50_ns = statistics.median(lats)
    slow_idx = [i for i, x in enumerate(lats) if x > 2 * p50_ns]
    report["slow_spacing"] = spacing(slow_idx, len(lats))
    # The hosts time one pinned wait in 16 (pinned_waits.TIME_EVERY): does a call
    # of the period stand out?
    report["by_call_index_mod_16"] = {
        "p50_us": [round(statistics.median(lats[m::16]) / 1e3, 1) for m in range(16)],
        "slow_share": [round(sum(x > 2 * p50_ns for x in lats[m::16]) / len(lats[m::16]), 4)
                       for m in range(16)]}
    report["by_call_index_mod_n"] = by_residue(lats)
    report["tick_loss"] = tick_loss(starts, lats)
    report["host_gc"] = gc_overlap(data["gcs"], starts, lats, slow_idx)
    if "worker_gcs" in data:
        report["worker_gc"] = gc_overlap(data["worker_gcs"], starts, lats, slow_idx)
    if args.perf:
        text = subprocess.run(["perf", "script", "-i", perf_data, "-F",
                               "comm,tid,cpu,time,event,trace"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, timeout=600).stdout
        events = parse_perf(text)
        report["trace_events"] = len(events)
        report["threads"] = sorted(names.values())
        report["correlation"] = correlate(events, starts, lats, 2 * p50_ns, set(names), names)
        report["slow_run_starts"] = run_starts(events, starts, lats, 2 * p50_ns, set(names))
        timers = our_timers(events, set(names))
        report["slow_calls_by_cause"] = causes(events, starts, lats, 2 * p50_ns, set(names),
                                               timers, busy and busy.proc.pid)
        report["tick"] = tick_cost(events, starts, lats, set(names), timers[1])
        if args.tick:
            report["tick_breakdown"] = tick_breakdown(events, starts, lats, 2 * p50_ns,
                                                      set(names), timers[1])
            report["tick_threads"] = tick_threads(events, starts, lats, set(names),
                                                  timers[1], names)
    report["load_end"] = os.getloadavg()[0]
    if args.floor:
        fl = subprocess.run([args.floor, "--big-mib=1", "--concurrency=16"], env=env,
                            stdout=subprocess.PIPE, text=True, timeout=300).stdout
        fj = json.loads([l for l in fl.splitlines() if l.strip()][-1])
        report["floor_unix"] = {"p50_us": fj["noop_p50_us"], "p99_us": fj["noop_p99_us"],
                                "p99_over_p50": round(fj["noop_p99_us"] / fj["noop_p50_us"], 2)}
    if not args.keep:
        subprocess.run(["rm", "-rf", tmp])
    else:
        report["kept"] = tmp
        with open(os.path.join(tmp, "report.json"), "w") as f:  # what a later look needs
            json.dump({"tids": sorted(names), "spinner": busy and busy.proc.pid}, f)
    return report


_AB_KEYS = ("p50_us", "p90_us", "p99_us", "p999_us", "max_us", "p99_over_p50",
            "share_over_2x_a_p50",
            "daemon_cpu_us_per_call", "worker_cpu_us_per_call",
            "host_cpu_us_per_call")  # (the host's: with --a-python only)


def run_ab(args, swapped=False):
    """Block-interleaved A/B: each side's distribution, and the share of
    each side's calls slower than 2x side a's p50 (one threshold for both).
    `swapped`: the new build (--sandboxd/--worker, and --python with
    --a-python) is side a."""
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES, TAIL_BENCH_DIR=BENCH_DIR)
    tmp = tempfile.mkdtemp(prefix="agx-tail-")
    out_path = os.path.join(tmp, "ab.json")
    report = {"load_start": os.getloadavg()[0], "block": args.block, "skip": args.skip}
    old, new = (args.a_sandboxd, args.a_worker), (args.sandboxd, args.worker)
    first, second = (new, old) if swapped else (old, new)
    perf_data = os.path.join(tmp, "perf.data")
    perf, tids, events = None, set(), None
    try:
        flags = tuple(args.daemon_flag)
        with procs.ab_daemon(*first, env, "agx-tail-a-", flags=flags) as (sa, da), \
                procs.ab_daemon(*second, env, "agx-tail-b-", flags=flags) as (sb, db), \
                _busy(args) as busy:
            if args.perf:
                perf = subprocess.Popen(["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC",
                                         "-e", _perf_events(args), "-o", perf_data],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            try:
                if args.a_python:
                    pythons = {"a": args.python, "b": args.a_python} if swapped else \
                        {"a": args.a_python, "b": args.python}
                    _two_hosts(pythons, {"a": sa, "b": sb}, {"a": da.pid, "b": db.pid},
                               out_path, args, env)
                else:
                    subprocess.run([args.python, "-c", _AB_HOST, sa, sb, out_path,
                                    str(args.block), str(args.skip), str(args.calls),
                                    str(da.pid), str(db.pid)],
                                   env=env, timeout=1200, check=True)
            finally:
                if perf is not None:
                    perf.send_signal(signal.SIGINT)
                    perf.wait(timeout=60)
            with open(out_path) as f:
                lats = json.load(f)
        if args.perf:
            tids = set(lats["stack_tids"])
            events = parse_perf(subprocess.run(
                ["perf", "script", "-i", perf_data, "-F", "comm,tid,cpu,time,event,trace"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                timeout=600).stdout)
    finally:
        if args.keep:
            report["kept"] = tmp
        else:
            subprocess.run(["rm", "-rf", tmp])
    threshold = 2 * statistics.median(lats["a"])
    for side in "ab":
        report[side] = distribution([x / 1e3 for x in lats[side]])
        report[side]["share_over_2x_a_p50"] = round(
            sum(x > threshold for x in lats[side]) / len(lats[side]), 4)
        calls = max(1, args.calls // args.block) * args.block  # the CPU covers every call
        for k, ns in lats[f"cpu_{side}"].items():
            report[side][f"{k}_cpu_us_per_call"] = round(ns / 1e3 / calls, 2)
        if events is not None:
            report[side]["slow_calls_by_cause"] = causes(
                events, lats[f"starts_{side}"], lats[side], threshold, tids,
                our_timers(events, tids), busy and busy.proc.pid)
    if busy is not None:
        report["busy"] = busy.report()
    report["ratios_b_over_a"] = {k: round(report["b"][k] / report["a"][k], 3) for k in
                                 _AB_KEYS if report["a"].get(k)}
    report["load_end"] = os.getloadavg()[0]
    return report


def runs_ab(args):
    """--runs N of run_ab, the new build side b in odd runs and side a in
    even ones (the side's position matters to a p99); per figure the medians
    of old and new and the median of the per-run ratios new / old."""
    per_run = []
    for i in range(args.runs):
        r = run_ab(args, swapped=i % 2 == 1)
        old, new = (r["b"], r["a"]) if i % 2 else (r["a"], r["b"])
        per_run.append({"old": old, "new": new, "load": [r["load_start"], r["load_end"]]})
        print(f"run {i + 1}: " + ", ".join(f"{k} {old[k]}/{new[k]}" for k in _AB_KEYS
                                           if k in old),
              file=sys.stderr, flush=True)
        if "slow_calls_by_cause" in old:
            print("  slow by cause (old/new): " + ", ".join(
                f"{c} {old['slow_calls_by_cause'][c]}/{new['slow_calls_by_cause'][c]}"
                for c in CAUSES), file=sys.stderr, flush=True)
    summary = {}
    for k in _AB_KEYS:
        pairs = [(p["old"][k], p["new"][k]) for p in per_run if p["old"].get(k)]
        if pairs:
            summary[k] = {"old_median": statistics.median(o for o, _ in pairs),
                          "new_median": statistics.median(n for _, n in pairs),
                          "median_ratio_new_over_old": round(
                              statistics.median(n / o for o, n in pairs), 3),
                          "per_run_ratios": [round(n / o, 2) for o, n in pairs]}
    if all("slow_calls_by_cause" in p["old"] for p in per_run):
        # Per cause, each side's share of calls slow for it (medians over runs).
        summary["slow_calls_by_cause"] = {c: {
            side: statistics.median(p[side]["slow_calls_by_cause"][c] for p in per_run)
            for side in ("old", "new")} for c in CAUSES}
    return {"runs": args.runs, "calls_per_side_per_run": args.calls,
            "loads": [p["load"] for p in per_run], "summary": summary}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxd", default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--worker", default=f"{REPO}/bazel-bin/worker/agentix-worker")
    parser.add_argument("--python", default=f"{REPO}/.venv-test/bin/python")
    parser.add_argument("--floor", default=f"{REPO}/bazel-bin/testing/bench/floor/unix_pingpong",
                        help="the Unix ping-pong floor run after the stream; '' to skip")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=500,
                        help="noop calls before the stream (not --ns, not --ab); 301: "
                             "the stream is remote_calls' noop phase, calls 3-2,302 of a "
                             "fresh daemon with --calls 2000 (its first call, "
                             "glibc_tunables, 300 warm-ups)")
    parser.add_argument("--perf", action="store_true",
                        help="trace the scheduler meanwhile (with --ab: each side's slow "
                        "calls by cause)")
    parser.add_argument("--tick", action="store_true",
                        help="with --perf (not --ab): also trace the tick's interrupt, "
                        "softirqs and IPIs, and report where a call that meets the tick "
                        "loses its time (tick_breakdown)")
    parser.add_argument("--keep", action="store_true", help="keep the latencies and the trace")
    parser.add_argument("--perf-event", action="append", default=[], metavar="EVENT",
                        help="a tracepoint to record beside the usual ones (kept with --keep)")
    parser.add_argument("--ns", action="store_true",
                        help="the stream is the sandbox's sequential namespace requests "
                        "(answered by the host), not the host's noop calls")
    parser.add_argument("--sandbox-env", action="append", default=[], metavar="NAME=VALUE",
                        help="into the daemon's (so the sandbox's) environment only "
                        "(AGENTIX_CALLS_CPU=off: the worker's pinned reply waits off)")
    parser.add_argument("--daemon-flag", action="append", default=[],
                        help="a flag for the daemon (--calls_cpu=off, --direct_calls; "
                        "with --ab both sides')")
    parser.add_argument("--busy", action="store_true",
                        help="one busy core (an unpinned spinner, remote_calls' busy pass) "
                        "while the calls run; its switches-in are the cause "
                        "busy_spinner_on_stack_cpu")
    parser.add_argument("--ab", action="store_true",
                        help="block-interleaved A/B of --a-sandboxd/--a-worker against "
                        "--sandboxd/--worker through one host (no trace, no floor)")
    parser.add_argument("--a-sandboxd", default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--a-worker", default=f"{REPO}/bazel-bin/worker/agentix-worker")
    parser.add_argument("--a-python", default="",
                        help="--ab: side a's Python (its venv's agentix) against --python's; "
                        "each side then gets a host process of its own, their blocks "
                        "alternating as in one host")
    parser.add_argument("--block", type=int, default=250, help="--ab: calls per block")
    parser.add_argument("--skip", type=int, default=2,
                        help="--ab: calls left out at the start of each block")
    parser.add_argument("--runs", type=int, default=1,
                        help="--ab: this many runs, the sides' positions alternating; "
                        "reports medians of the per-run ratios new / old")
    args = parser.parse_args()
    if args.ab:
        print(json.dumps(runs_ab(args) if args.runs > 1 else run_ab(args), indent=1))
    else:
        print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()
