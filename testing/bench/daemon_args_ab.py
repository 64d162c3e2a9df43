"""Same-run A/B of two daemon argument sets on one build, for the two-stack benchmarks.

    bazel run //testing/bench:daemon_args_ab -- --bench remote_calls --rounds 3 \\
        --a-daemon-arg=--nodirect_calls --b-daemon-arg=--direct_calls -- --only ours
    bazel run //testing/bench:daemon_args_ab -- --bench side_channels --rounds 3 \\
        --a-daemon-arg=--nodirect_calls --b-daemon-arg=--direct_calls -- --only ours

Each round runs the benchmark (`remote_calls` or `side_channels`, from the
runfiles, with the arguments after `--`) once per side, side a with
`--daemon-arg=ARG` for each `--a-daemon-arg`, side b for each `--b-daemon-arg`
(the benchmark gives them to every daemon of ours it starts), the order swapped
every round. A side that means a daemon default says it (`--nodirect_calls`
for relayed calls): the default may change between builds. Every number of a report outside `details` (the headline, `ratios`,
`busy`, the floors, `cc_noop`, ...) becomes a dotted key (`busy.noop_p50_us`);
per key the summary gives each side's median and the median of the per-round
ratios b / a (procs.ab_summary). The 1-minute load average is taken before and
after each run. Output: one line per round, a table, then LAST one JSON object:
`daemon_args` {a, b}, `rounds` (per round: order, load before/after each side),
`summary` {key: {a_median, b_median, median_ratio_b_over_a}}, `errors` if a run
failed (exit code 1).
"""

import argparse
import json
import os
import subprocess
import sys

import procs

BENCHES = ("remote_calls", "side_channels")


def flatten(report: dict, prefix: str = "") -> dict:
    """The numbers of `report` as {dotted key: value}, without `details`
    records (per-round copies and raw figures) and without flags."""
    out = {}
    for key, value in report.items():
        if key == "details":
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def run_bench(argv: list[str], timeout_s: float) -> tuple[dict | None, str | None]:
    """Runs one benchmark, echoing its output; (its last-line JSON, None) or
    (None, what went wrong). A report with `errors` counts as failed."""
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=timeout_s)
    sys.stdout.write(proc.stdout)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        report = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict):
        return None, f"exit code {proc.returncode}, no JSON report"
    if proc.returncode != 0 or report.get("errors"):
        return None, f"exit code {proc.returncode}: {report.get('errors')}"
    return report, None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", choices=BENCHES, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--a-daemon-arg", action="append", default=[], metavar="ARG")
    parser.add_argument("--b-daemon-arg", action="append", default=[], metavar="ARG")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take")
    parser.add_argument("bench_args", nargs="*", help="after --: the benchmark's own arguments")
    args = parser.parse_args(argv)
    binary = procs.runfile(f"testing/bench/{args.bench}")
    if binary is None:
        print(f"{args.bench} not in the runfiles (run through bazel run)", file=sys.stderr)
        return 2
    sides = {"a": args.a_daemon_arg, "b": args.b_daemon_arg}
    rows, rounds, errors = [], [], []
    for index in range(args.rounds):
        order = ("a", "b") if index % 2 == 0 else ("b", "a")
        row, record = {}, {"order": "/".join(order)}
        for side in order:
            command = [str(binary), *args.bench_args,
                       *(f"--daemon-arg={arg}" for arg in sides[side])]
            load_before = round(os.getloadavg()[0], 2)
            print(f"== round {index + 1}/{args.rounds}, side {side}: {' '.join(command[1:])} "
                  f"(load {load_before}) ==", flush=True)
            report, error = run_bench(command, args.timeout)
            record[side] = {"load_before": load_before,
                            "load_after": round(os.getloadavg()[0], 2)}
            if error:
                errors.append(f"round {index + 1} side {side}: {error}")
                print(f"!! {errors[-1]}", flush=True)
            else:
                row[side] = flatten(report)
        rounds.append(record)
        if len(row) == 2:
            rows.append(row)
    summary = procs.ab_summary(rows) if rows else {}
    print(f"daemon args: a {sides['a']}, b {sides['b']}; {len(rows)} complete rounds")
    print(f"{'key':<60}{'a':>12}{'b':>12}{'b/a':>8}")
    for key, figures in summary.items():
        ratio = figures["median_ratio_b_over_a"]
        print(f"{key:<60}{figures['a_median']:>12g}{figures['b_median']:>12g}"
              f"{'-' if ratio is None else format(ratio, '.3f'):>8}")
    result = {"bench": args.bench, "bench_args": args.bench_args, "daemon_args": sides,
              "rounds": rounds, "summary": summary}
    if errors:
        result["errors"] = errors
    print(json.dumps(result), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
