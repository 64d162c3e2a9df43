"""What the machine takes from each CPU while code runs that makes no system call.

    python3 cpu_stops.py [--seconds 0.25] [--max-cpus 8]

For each CPU this process may use (the first `--max-cpus`), pinned there, a
loop reads the clock for `--seconds`; a gap of more than GAP_NS between two
reads is time the CPU was taken from the loop: the tick, an interrupt, another
task, or (on a VM) the hypervisor, which the guest cannot see in
/proc/interrupts. Prints one JSON line:

    {"seconds": 0.25, "cpus": [{"cpu": 0, "stops_per_s": ..., "lost_pct": ...,
      "mean_us": ..., "over_30us_per_s": ..., "max_us": ...,
      "timer_interrupts_per_s": ...}, ...]}

`timer_interrupts_per_s` (from /proc/interrupts' LOC line; None where there is
none) is the scheduler tick's rate on a CPU that never idles: on these VMs a
tick landing in a call costs it ~55-65 µs (docs/PERFORMANCE.md, "stop-66: the
noop's p99 is the tick"), so the share of calls with one, p50 x this rate, says
whether a run's p99 falls among them (over 1 %) or not.

Why: on the VMs this project is measured on, the stops move between the
vCPUs from one quarter-minute to the next (docs/PERFORMANCE.md, "stop-66: the
machine's stops move"), and a run's tail figures read differently in a phase
where one CPU loses 5-8 % in 30-60 µs stops than in one where both lose ~2.5 %
in ~19 µs ones. `remote_calls` runs this before and after its passes so that
each report says which phase it met. A Python loop reads the clock every
~0.15 µs here and finds the same stops as a C loop (same stops/s and lost
share within a few per cent).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# A gap longer than this between two clock reads is a stop. A read-and-compare
# turn of the loop is ~0.15 µs; 5 µs is far above its own jitter.
GAP_NS = 5_000
# Stops at least this long are counted apart: they are the ones a ~50 µs
# call cannot absorb (two of them double it).
LONG_STOP_NS = 30_000


def gaps(seconds: float, clock=time.perf_counter_ns, gap_ns: int = GAP_NS) -> list[int]:
    """The gaps (ns) over `gap_ns` between consecutive reads of `clock` in a
    loop that runs for `seconds`."""
    out = []
    last = clock()
    end = last + int(seconds * 1e9)
    while last < end:
        now = clock()
        if now - last > gap_ns:
            out.append(now - last)
        last = now
    return out


def local_timer_counts(text: str | None = None) -> dict[int, int] | None:
    """{CPU: its local timer interrupts so far} from the ``LOC:`` line of
    /proc/interrupts (x86), or None where there is no such line. The columns
    are the online CPUs the header names (``CPU0 CPU3 ...``), not 0..n-1."""
    if text is None:
        try:
            with open("/proc/interrupts") as f:
                text = f.read()
        except OSError:
            return None
    lines = text.splitlines()
    if not lines:
        return None
    try:
        cpus = [int(name[3:]) for name in lines[0].split()]
    except ValueError:
        return None
    for line in lines[1:]:
        fields = line.split()
        if fields and fields[0] == "LOC:":
            try:
                return {cpu: int(x) for cpu, x in zip(cpus, fields[1:1 + len(cpus)])}
            except ValueError:
                return None
    return None


def summarize(cpu: int, stops_ns: list[int], seconds: float,
              timer_interrupts: int | None = None) -> dict:
    """One CPU's figures from its stops over `seconds` of looking, and from
    the local timer interrupts it took meanwhile (None: not known)."""
    per_s = 1.0 / seconds
    return {
        "cpu": cpu,
        "stops_per_s": round(len(stops_ns) * per_s),
        "lost_pct": round(sum(stops_ns) / (seconds * 1e9) * 100, 2),
        "mean_us": round(sum(stops_ns) / len(stops_ns) / 1e3, 1) if stops_ns else 0.0,
        "over_30us_per_s": round(sum(1 for s in stops_ns if s >= LONG_STOP_NS) * per_s),
        "max_us": round(max(stops_ns) / 1e3, 1) if stops_ns else 0.0,
        # On a CPU that never idles, the scheduler tick's rate (HZ) and any
        # other timer the CPU took: a call of length L has a tick in it with
        # probability L x this rate.
        "timer_interrupts_per_s": (None if timer_interrupts is None
                                   else round(timer_interrupts * per_s)),
    }


def measure(seconds: float, max_cpus: int) -> dict:
    """Each allowed CPU in turn (the first `max_cpus`), this thread pinned to it;
    the thread's own mask is restored after."""
    allowed = sorted(os.sched_getaffinity(0))
    cpus = []
    try:
        for cpu in allowed[:max_cpus]:
            os.sched_setaffinity(0, {cpu})
            before = local_timer_counts()
            stops = gaps(seconds)
            after = local_timer_counts()
            timers = (after[cpu] - before[cpu]
                      if before and after and cpu in before and cpu in after else None)
            cpus.append(summarize(cpu, stops, seconds, timers))
    finally:
        os.sched_setaffinity(0, allowed)
    return {"seconds": seconds, "cpus": cpus}


def describe(report: dict | None) -> str:
    """One line for a benchmark's log: each CPU's lost share and stops."""
    if not report or not report.get("cpus"):
        return "not measured"
    return "; ".join(
        f"cpu{c['cpu']} {c['lost_pct']:.1f} % lost in {c['stops_per_s']:,}/s "
        f"(mean {c['mean_us']:.0f} us, {c['over_30us_per_s']:,}/s of 30 us or more; "
        f"timer interrupts {c.get('timer_interrupts_per_s')}/s)"
        for c in report["cpus"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.25, help="looking time per CPU")
    parser.add_argument("--max-cpus", type=int, default=8, help="CPUs looked at, at most")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.max_cpus < 1:
        parser.error("--seconds must be positive and --max-cpus at least 1")
    print(json.dumps(measure(args.seconds, args.max_cpus)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
