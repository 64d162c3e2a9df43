"""The machine's floor, a busy core and CPU per call, shared by every benchmark (issue 25).

Three things each benchmark (remote_calls.py, side_channels.py, provider.py) adds to
its report with this module, so that its figures are judged against what this
machine can do at the moment of the run rather than against absolute numbers:

- **floors**: the programs of floor/ (`run_floor`), run in the same process tree and
  the same minute as the stack they are compared with. `floor` is two processes
  ping-ponging the same message sizes over a Unix socket (unix_pingpong),
  `floor_grpc` the same on a raw gRPC C++ bidi stream over a Unix socket
  (grpc_pingpong), `floor_relay` the Unix-socket ping-pong through a third
  process that forwards the bytes (unix_pingpong --relay): the shape of our
  call path, host -> daemon -> worker and back, with nothing else in it;
  `floor_pinned` the Unix-socket ping-pong with both processes pinned to one CPU
  (unix_pingpong --one-cpu): `floor` lands there in some runs and across two CPUs
  in others, ~16 against ~31 µs here, and the pinned one is what co-location can
  reach. All report the same keys as the stack they stand beside. `floor_work`
  (`run_work_floor`, work_floor.py) is no ping-pong: chunks of plain Python work
  as long as our noop's p50, for the p99 / p50 this machine gives any code of that
  length with no hand-off at all (remote_calls' tail target).
- **a busy core** (`BusyCore`): one process spinning in a loop while a benchmark
  measures its headline figures again (`busy`). The spinner is NOT pinned to a CPU:
  it is what any other busy program on the machine looks like to us (the scheduler
  is free to move it, and us), which is the situation issue 25 describes (a
  call path whose every hand-off pays an idle CPU's wake-up gets faster when
  another process keeps the CPUs awake). `BusyCore.report()` gives the share of
  one CPU the spinner really got, so a reader can see it spun.
- **CPU per call** (`CpuMeter`): on-CPU time of each process of a stack (host,
  daemon, worker) over a phase, from each process's CPU-time clock (ns resolution;
  threads that end during the phase keep their time in it), divided by the calls of
  the phase. It sits beside each latency so that a figure
  bought by spinning shows up as CPU.

Ratios (`floor_ratios`) are oriented so that >= 1 means the floor is better: for a
latency `<stem>_ours_over_<floor>` (ours / floor), for a rate
`<key>_<floor>_over_ours` (floor / ours).
"""

from __future__ import annotations

import copy
import errno
import glob
import json
import os
import subprocess
import sys
import time

import procs

# Where a floor's figures come from, by report key: (program, its own flags).
FLOOR_PROGRAMS = {"floor": ("unix_pingpong", ()), "floor_grpc": ("grpc_pingpong", ()),
                  "floor_relay": ("unix_pingpong", ("--relay",)),
                  "floor_pinned": ("unix_pingpong", ("--one-cpu",))}
SPIN = "while True: pass"
# The work floor's key in a report (work_floor.py; not a ping-pong, so not in
# FLOOR_PROGRAMS: only its noop_p50_us / noop_p99_us mean anything beside ours).
WORK_FLOOR = "floor_work"


def process_cpu_s(pid: int) -> float | None:
    """On-CPU seconds of process `pid`, its ended threads included; None if it is gone.

    Read from the process's CPU-time clock (clock_getcpuclockid's id: (~pid << 3) | 2,
    CPUCLOCK_SCHED of the whole thread group, in ns). A sum over /proc/PID/task/*/schedstat
    would lose a thread's time when the thread ends between two readings, and a phase's
    difference could come out negative (a pool thread retiring, a prefault thread of a
    large echo); that sum is only the fallback where the clock cannot be read."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError as error:
        if error.errno == errno.EINVAL and not os.path.exists(f"/proc/{pid}"):
            return None  # gone
    total, found = 0, False
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
                found = True
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total / 1e9 if found else None


class CpuMeter:
    """CPU of a fixed set of named processes (e.g. host, daemon, worker) over a phase."""

    def __init__(self, pids: dict[str, int]):
        self.pids = {name: pid for name, pid in pids.items() if pid}

    def snapshot(self) -> dict[str, float | None]:
        return {name: process_cpu_s(pid) for name, pid in self.pids.items()}

    @staticmethod
    def per_item(before: dict, after: dict, items: float, scale: float = 1e6) -> dict:
        """{name: CPU per item, ..., "total": sum} in µs (scale 1e6) or ms (1e3)."""
        out = {}
        for name, end in after.items():
            start = before.get(name)
            if start is not None and end is not None and items > 0:
                out[name] = round((end - start) * scale / items, 2)
        out["total"] = round(sum(out.values()), 2)
        return out


def run_json(argv, *, env: dict | None = None, timeout_s: float = 300, log=print) -> dict:
    """Runs a program whose last stdout line is one JSON object; returns it."""
    proc = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, text=True,
                          timeout=timeout_s, env=env)
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{argv[0]} failed with exit code {proc.returncode}")
    result = json.loads(lines[-1])
    log(f"{os.path.basename(str(argv[0]))}: {result}")
    return result


def run_floor(program: str, flags, *, quick: bool, env: dict | None = None, log=print) -> dict:
    """One run of floor/<program> (unix_pingpong, grpc_pingpong, spawn_true)."""
    binary = procs.runfile(f"testing/bench/floor/{program}")
    if not binary:
        raise RuntimeError(f"testing/bench/floor/{program} not in the runfiles")
    return run_json([binary, *flags] + (["--quick"] if quick else []), env=env, log=log)


def run_work_floor(chunk_us: float, *, quick: bool, env: dict | None = None,
                   log=print) -> dict:
    """One run of work_floor.py in the host's interpreter, its chunk sized to
    `chunk_us` (a noop's p50 of the same run)."""
    script = procs.bench_dir() / "work_floor.py"
    return run_json([sys.executable, script, f"--chunk-us={max(1.0, round(chunk_us, 1))}"]
                    + (["--quick"] if quick else []), env=env, log=log)


def run_cpu_stops(*, env: dict | None = None, log=print) -> dict:
    """One run of cpu_stops.py: what the machine takes from each CPU (its
    stops while a clock loop runs pinned there), at a moment when the run's
    own processes are idle."""
    script = procs.bench_dir() / "cpu_stops.py"
    return run_json([sys.executable, script], env=env, log=log)


class BusyCore:
    """A context in which one process spins on the CPU (unpinned; see the module
    docstring). `report()` after the block: its wall time and the CPU it got."""

    def __init__(self):
        self.proc = None
        self.started = self.cpu_s = self.wall_s = None

    def __enter__(self) -> "BusyCore":
        self.proc = procs.start_process([sys.executable, "-c", SPIN])
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_s = time.monotonic() - self.started
        self.cpu_s = process_cpu_s(self.proc.pid)
        procs.stop_process(self.proc)

    def report(self) -> dict:
        share = (self.cpu_s / self.wall_s) if self.cpu_s is not None and self.wall_s else None
        return {"pinned": False, "wall_s": round(self.wall_s or 0, 1),
                "cpu_share": None if share is None else round(share, 2)}


def ratio(numerator, denominator):
    if not isinstance(numerator, (int, float)) or not isinstance(denominator, (int, float)):
        return None
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 2)


def floor_ratios(ours: dict | None, floors: dict, keys: dict[str, bool],
                 prefix: str = "") -> dict:
    """Each headline figure of `ours` over each floor that has it.

    `keys` maps a figure to True if lower is better (a latency: `<stem>_ours_over_<floor>`,
    the unit suffix dropped, e.g. noop_p50_ours_over_floor) or False (a rate:
    `<key>_<floor>_over_ours`). `floors` maps a floor's name to its figures (or None).
    Both ratios are >= 1 when the floor is faster; None where a figure is missing."""
    ours = ours or {}
    out = {}
    for floor_name, figures in floors.items():
        figures = figures or {}
        for key, lower_is_better in keys.items():
            if key not in figures:
                continue
            if lower_is_better:
                stem = key.rsplit("_", 1)[0]  # noop_p50_us -> noop_p50
                out[f"{prefix}{stem}_ours_over_{floor_name}"] = ratio(ours.get(key), figures[key])
            else:
                out[f"{prefix}{key}_{floor_name}_over_ours"] = ratio(figures[key], ours.get(key))
    return out


def busy_child_pass(stack_rounds, script: str, args, env: dict, timeout_s: float,
                    floor_runs: dict, keys, quick: bool = True,
                    rounds: int = 1) -> tuple[dict | None, list[str]]:
    """For the two-stack benchmarks (stack_rounds): our stack measured again in
    `rounds` children (`--side ours`; `quick`: the quick plan, fewer iterations,
    else the run's own) with one busy core, then each floor of `floor_runs`
    ({name: callable}) under the same busy core. `busy` has the per-figure
    medians over the rounds that succeeded (`stack_rounds.combine`), as the idle
    figures do, and each round's figures of `keys` in `per_round`. Returns
    (`busy` record, errors)."""
    busy_args = copy.copy(args)
    busy_args.quick = quick or args.quick
    plan = "quick" if busy_args.quick else "full"
    rounds = max(1, rounds)
    errors = []
    print(f"== ours again with one busy core ({plan} plan, {rounds} round"
          f"{'s' if rounds > 1 else ''}) and the floors ==", flush=True)
    start = time.monotonic()
    results = []
    with BusyCore() as spinner:
        for _ in range(rounds):
            ours, error = stack_rounds.run_child(script, "ours", busy_args, env, timeout_s)
            if error:
                errors.append(f"busy {error}")
            if ours is not None:
                results.append(ours)
        measured = {}
        for name, run in floor_runs.items():
            try:
                measured[name] = run()
            except procs.RUN_FAILURES as failure:
                errors.append(f"busy {name}: {failure}")
    if not results and not measured:
        return None, errors
    ours = stack_rounds.combine(results)  # None when no round succeeded
    busy = {key: (ours or {}).get(key) for key in keys}
    busy.update(measured)
    busy["spinner"] = spinner.report()
    busy["plan"] = plan
    busy["rounds"] = len(results)
    busy["per_round"] = [{key: result.get(key) for key in keys} for result in results]
    busy["pass_s"] = round(time.monotonic() - start, 1)
    busy["details"] = ours
    return busy, errors
