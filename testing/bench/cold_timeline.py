"""A cold create's timeline and CPU per process, from the kernel's scheduler events.

    /usr/bin/python3 testing/bench/cold_timeline.py --bundle BUNDLE [--runs 4]

Records `perf record -a -e sched:sched_process_exec,sched_process_fork,sched_process_exit,
sched_switch` (root, perf installed) around `sandbox_lifecycle --bundle BUNDLE --runs N
--compare-runs 0` (bazel-bin's, or --bench), then prints per sandbox, in ms from bwrap's exec:

  bootstrap.sh's exec, agentix-sandboxd's exec, its first thread (≈ its main), the
  start-up probe's measuring thread (agx-probe), the worker's spawn (agx-launcher) and exec,
  the worker's first thread (≈ its main: the prefault thread) and its second batch of
  threads (the driver's, ≈ ready);

and the CPU each process used from bwrap's exec to the worker's driver threads (the boot
window, where the daemon's start and the worker's boot share the machine's CPUs). The
medians over the measured sandboxes come last. Events of other processes are ignored but
their CPU shows as "others" (a loaded machine). The unmeasured warm-up sandbox and the
bench's own probes (bwrap true and the like, which start no daemon) are skipped.
"""

import argparse
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

EVENTS = "sched:sched_process_exec,sched:sched_process_fork,sched:sched_process_exit,sched:sched_switch"
_LINE = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)")
_SWITCH = re.compile(r"prev_comm=(.+?) prev_pid=(\d+) .*next_comm=(.+?) next_pid=(\d+)")
_FORK = re.compile(r"child_comm=(\S+) child_pid=(\d+)")


def events(data: str):
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,cpu,time,event,trace"],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        m = _LINE.match(line)
        if m:
            yield (float(m.group(5)), m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)),
                   m.group(6).split(":")[-1], m.group(7))


def sandboxes(evs: list):
    """Splits the events at each bwrap exec; keeps the ones that started a daemon and a worker."""
    starts = [i for i, e in enumerate(evs) if e[5] == "sched_process_exec" and "filename=/usr/bin/bwrap" in e[6]]
    for n, i in enumerate(starts):
        seg = evs[i:starts[n + 1] if n + 1 < len(starts) else len(evs)]
        if any("agentix-worker" in e[6] for e in seg if e[5] == "sched_process_exec"):
            yield seg


def timeline(seg: list, tid_to_pid: dict) -> dict | None:
    t0 = seg[0][0]
    marks, daemon, worker, worker_threads = {}, None, None, 0

    def mark(name, t):
        marks.setdefault(name, round((t - t0) * 1000, 2))

    for t, comm, pid, tid, cpu, name, trace in seg:
        if name == "sched_process_exec":
            path = trace.split()[0].split("=", 1)[1]
            if path.endswith("/bootstrap.sh"):
                mark("bootstrap.sh exec", t)
            elif path.endswith("/agentix-sandboxd"):
                daemon = pid
                mark("agentix-sandboxd exec", t)
            elif path.endswith("/agentix-worker"):
                worker = pid
                mark("agentix-worker exec", t)
        elif name == "sched_process_fork":
            child = _FORK.search(trace)
            if pid == daemon:
                mark("daemon's first thread", t)
                if comm == "agx-probe":
                    mark("probe measures (agx-probe's thread)", t)
                if comm == "agx-launcher":
                    mark("worker spawned (agx-launcher)", t)
            elif pid == worker and child is not None:
                worker_threads += 1
                if worker_threads == 1:
                    mark("worker's first thread (its main)", t)
                elif worker_threads == 2:
                    mark("worker's driver threads (~ready)", t)
    end = marks.get("worker's driver threads (~ready)")
    if end is None or daemon is None:
        return None
    t_end = t0 + end / 1000
    running, cpu_ms = {}, collections.Counter()
    for t, comm, pid, tid, cpu, name, trace in seg:
        if t > t_end:
            break
        if name != "sched_switch":
            continue
        m = _SWITCH.search(trace)
        if not m:
            continue
        if cpu in running:
            was, since = running[cpu]
            owner = tid_to_pid.get(was, was)
            who = ("daemon" if owner == daemon else "worker" if owner == worker
                   else "idle" if was == 0 else "others")
            cpu_ms[who] += (t - since) * 1000
        running[cpu] = (int(m.group(4)), t)
    return {"marks": marks, "cpu_ms": {k: round(v, 1) for k, v in cpu_ms.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--bench", default="bazel-bin/testing/bench/sandbox_lifecycle")
    args = parser.parse_args(argv)
    if shutil.which("perf") is None:
        print("cold_timeline: perf is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="agx-cold-timeline-") as work:
        data = os.path.join(work, "sched.data")
        subprocess.run(["perf", "record", "-a", "-q", "-e", EVENTS, "-o", data, "--",
                        args.bench, "--bundle", args.bundle, "--runs", str(args.runs), "--compare-runs", "0"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600)
        evs = list(events(data))
    tid_to_pid = {e[3]: e[2] for e in evs}
    found = [r for r in (timeline(seg, tid_to_pid) for seg in sandboxes(evs)) if r is not None]
    measured = found[1:]  # the first is the bench's unmeasured warm-up
    if not measured:
        print("cold_timeline: no sandbox found in the recording", file=sys.stderr)
        return 1
    for n, r in enumerate(measured, 1):
        print(f"sandbox {n}: " + ", ".join(f"{k} {v}" for k, v in sorted(r["marks"].items(), key=lambda kv: kv[1])))
        print(f"   CPU ms, bwrap exec -> ~ready: {r['cpu_ms']}")
    print(f"medians over {len(measured)} sandboxes (ms from bwrap's exec; CPU in the boot window):")
    names = sorted({k for r in measured for k in r["marks"]},
                   key=lambda k: statistics.median(r["marks"][k] for r in measured if k in r["marks"]))
    for k in names:
        print(f"  {k:40s} {statistics.median(r['marks'][k] for r in measured if k in r['marks']):8.1f}")
    for k in ("worker", "daemon", "others", "idle"):
        print(f"  CPU {k:36s} {statistics.median(r['cpu_ms'].get(k, 0.0) for r in measured):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
