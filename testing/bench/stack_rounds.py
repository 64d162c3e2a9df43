"""The parent process of a two-stack benchmark (remote_calls.py, side_channels.py).

Each script measures one stack per child process (`--side ours|baseline`), which
prints its results as one line `RESULT <json>`. The parent runs the children for a
number of rounds, alternating which stack goes first so that neither always meets
the same background load, takes the per-metric median over the rounds and reports
the load average. What is measured, summarised and printed stays in each script.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

import procs

SIDES = ("baseline", "ours")
RESULT_PREFIX = "RESULT "


def add_arguments(parser, *, quick_help: str) -> None:
    """The options every two-stack benchmark takes (and the internal child ones)."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--only", choices=("all",) + SIDES, default="all",
                        help="measure only one stack")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure each stack this many times, alternating the order; "
                             "every metric is the median over the rounds")
    parser.add_argument("--sandboxd", help="agentix-sandboxd binary (default: from runfiles)")
    parser.add_argument("--worker", help="agentix-worker binary (default: from runfiles)")
    parser.add_argument("--daemon-arg", action="append", default=[], metavar="ARG",
                        help="passed to every agentix-sandboxd of ours this run starts "
                             "(repeatable; write flags as --daemon-arg=--direct_calls)")
    # Internal: child mode, measuring one stack for the driver.
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)


def print_result(results: dict) -> None:
    """A child's last word: its results, for the parent to pick up."""
    print(RESULT_PREFIX + json.dumps(results), flush=True)


def run_child(script: str, side: str, args, env: dict,
              timeout_s: float) -> tuple[dict | None, str | None]:
    """Runs `script --side side` (passing on --quick, --sandboxd, --worker, --daemon-arg),
    echoing its lines; returns (results, None) or (None, what went wrong)."""
    argv = [sys.executable, os.path.abspath(script), "--side", side,
            "--parent-pid", str(os.getpid())]
    if args.quick:
        argv.append("--quick")
    if args.sandboxd:
        argv += ["--sandboxd", args.sandboxd]
    if args.worker:
        argv += ["--worker", args.worker]
    # The = form: an ARG that starts with "--" is not taken for the child's own option.
    argv += [f"--daemon-arg={arg}" for arg in args.daemon_arg]
    # Own process group, so a timeout or Ctrl-C can stop the child and all it started.
    child = procs.start_process(argv, env=env, stdout=subprocess.PIPE, new_session=True)
    results, deadline = None, time.monotonic() + timeout_s
    try:
        while True:
            line = procs.read_line(child, max(deadline - time.monotonic(), 0.0))
            if line is None:
                break
            if line.startswith(RESULT_PREFIX):
                results = json.loads(line[len(RESULT_PREFIX):])
            else:
                print(line, flush=True)
        if child.poll() is None and time.monotonic() >= deadline:
            return None, f"{side}: timed out after {timeout_s:.0f} s"
        child.wait(timeout=10)
    finally:
        procs.stop_process(child, group=True)
    if results is None:
        return None, f"{side}: no result (exit code {child.returncode})"
    return results, None


def cpu_probe_ms(repeats: int = 5) -> float:
    """Milliseconds a fixed pure-Python workload takes here now (median of
    `repeats`). These VMs run at different speeds from one minute to the next
    (up to ~2x), and the baseline's Python-bound figures follow that speed more
    than ours, so each round records it next to its figures."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        total = 0
        for i in range(100_000):
            total += i * i
        times.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(times), 2)


class Rounds:
    """The results of `run` for each stack, the errors met, the load average
    and the CPU probe (`cpu_probe_ms`) taken before each round.

    `beside` ({side: callable returning a dict}, optional): run right before
    each round of that side, after the CPU probe; its result is kept with the
    round's (`paired`), so that a figure can be judged against a floor taken
    seconds, not minutes, from it (these VMs change speed within minutes)."""

    def __init__(self, script: str, args, env: dict, timeout_s: float,
                 beside: dict | None = None) -> None:
        self.sides = SIDES if args.only == "all" else (args.only,)
        self.count = args.rounds
        self.daemon_args = tuple(args.daemon_arg)
        self.load_start = os.getloadavg()[0]
        self.results = {side: [] for side in self.sides}
        # Per side, each successful round's (result, what `beside` returned
        # before it, or None if it failed).
        self.paired = {side: [] for side in self.sides}
        self.cpu_probes = {side: [] for side in self.sides}
        self.errors = []
        beside = beside or {}
        for index in range(args.rounds):
            order = self.sides if index % 2 == 0 else tuple(reversed(self.sides))
            for side in order:
                probe = cpu_probe_ms()
                self.cpu_probes[side].append(probe)
                before = None
                if side in beside:
                    try:
                        before = beside[side]()
                    except procs.RUN_FAILURES as failure:
                        self.errors.append(f"{side} (beside round {index + 1}): {failure}")
                        print(f"!! {self.errors[-1]}", flush=True)
                print(f"== {side} ({'quick' if args.quick else 'full'}, round {index + 1}"
                      f"/{args.rounds}; CPU probe {probe:.1f} ms) ==", flush=True)
                result, error = run_child(script, side, args, env, timeout_s)
                if error:
                    self.errors.append(error)
                    print(f"!! {error}", flush=True)
                else:
                    self.results[side].append(result)
                    self.paired[side].append((result, before))

    def paired_ratios(self, side: str, key: str, beside_key: str) -> list[float]:
        """Per successful round of `side` that has both: its `key` over the
        `beside_key` of what ran right before it."""
        out = []
        for result, before in self.paired.get(side, ()):
            ratio = _ratio((result or {}).get(key), (before or {}).get(beside_key))
            if ratio is not None:
                out.append(ratio)
        return out

    def combined(self, side: str) -> dict | None:
        """Per-metric median over the rounds of one side (None if no round succeeded)."""
        return combine(self.results.get(side))

    def details(self, headline_keys) -> dict:
        """`rounds`, `daemon_args` (--daemon-arg, given to every daemon of ours),
        `per_round` (the headline figures of each round),
        `cpu_probe_ms` (per side, before each of its rounds, failed ones
        included) and `loadavg_1m`."""
        return {
            "rounds": self.count,
            "daemon_args": list(self.daemon_args),
            "per_round": {side: [{key: result.get(key) for key in headline_keys}
                                 for result in results]
                          for side, results in self.results.items()},
            "cpu_probe_ms": self.cpu_probes,
            "loadavg_1m": {"start": round(self.load_start, 2),
                           "end": round(os.getloadavg()[0], 2)},
        }


def combine(rounds: list[dict] | None) -> dict | None:
    """Per-metric median over the rounds of one side (None if no round succeeded).
    Nested records (a phase's CPU per item, say) are combined key by key the same
    way, so every number in a side's details is a median over the rounds."""
    if not rounds:
        return None
    return _combine_values(rounds)


def _combine_values(values: list):
    """Numbers: their median (rounds that lack one are left out). Flags: true only
    if true in every round. Records: key by key. Anything else (text, lists of
    warnings): the first round's."""
    first = values[0]
    if isinstance(first, dict):
        return {key: _combine_values([v.get(key) if isinstance(v, dict) else None for v in values])
                for key in first}
    if isinstance(first, bool):
        return all(v is True for v in values)
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if numbers:
        return round(statistics.median(numbers), 2)
    return first


class Target(NamedTuple):
    """One headline target: the ratio `ratio` of `key` (ours against the baseline,
    oriented so that > 1 means ours is better) must be at least `at_least`."""

    ratio: str  # e.g. "noop_p50_baseline_over_ours"
    key: str  # e.g. "noop_p50_us"
    lower_is_better: bool
    at_least: float
    name: str  # e.g. "noop_p50_at_most_one_fifth_of_baseline"


def _ratio(numerator, denominator):
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 2)


def headline(ours: dict | None, base: dict | None, headline_keys, targets) -> dict:
    """The report's headline: ours and the baseline's figures for `headline_keys`,
    `ratios` and `targets_met` (None where a figure is missing)."""
    o, b = ours or {}, base or {}
    report = {key: o.get(key) for key in headline_keys}
    report["baseline"] = {key: b.get(key) for key in headline_keys} if base else None
    report["ratios"] = {
        t.ratio: _ratio(b.get(t.key), o.get(t.key)) if t.lower_is_better
        else _ratio(o.get(t.key), b.get(t.key))
        for t in targets}
    report["targets_met"] = {
        t.name: None if report["ratios"][t.ratio] is None
        else report["ratios"][t.ratio] >= t.at_least
        for t in targets}
    return report


def print_table(report: dict, headline_keys) -> None:
    """The headline as a table, then the ratios and targets, one per line."""
    base = report["baseline"] or {}
    width = max(len(key) for key in headline_keys) + 2
    print(f"{'metric':<{width}}{'ours':>14}{'baseline':>14}")
    for key in headline_keys:
        def fmt(value):
            return "-" if value is None else f"{value:,.1f}"
        print(f"{key:<{width}}{fmt(report.get(key)):>14}{fmt(base.get(key)):>14}")
    for key, value in report["ratios"].items():
        print(f"ratio {key}: {value}")
    for key, value in report["targets_met"].items():
        print(f"target {key}: {value}")


def run_interruptibly(driver, args) -> int:
    """Runs `driver(args)`; Ctrl-C or SIGTERM ends it with 130 after run_child's cleanup
    has stopped the running child's whole process group."""

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        return driver(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
