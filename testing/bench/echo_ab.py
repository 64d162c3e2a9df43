"""Same-run A/B of two builds on the large echo: alternates echo_cpu.py runs
of build A and build B and prints the median of the per-pair ratios (B / A)
of wall time, CPU and page faults by process, per payload size.

    .venv-test/bin/python testing/bench/echo_ab.py --pairs 4 --calls 8 \\
        --a-worker /tmp/old/agentix-worker [--a-sandboxd ...] [--a-python OLD_VENV/bin/python] \\
        --mib 1 --mib 16 --mib 64

A side's --X-env KEY=VALUE (repeatable) sets an environment variable for its
runs only, e.g. --a-env AGENTIX_PAYLOAD_RING=off for a flag off/on A/B of one
build, and --X-daemon-arg FLAG a daemon flag (e.g. --a-daemon-arg=--calls_cpu=off). Each side defaults to this checkout's bazel-bin and this interpreter. All
processes get procs.MALLOC_TUNABLES, as in remote_calls.
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

KEYS = ("wall_ms", "host_ms", "daemon_ms", "worker_ms", "host_faults", "daemon_faults",
        "worker_faults")


def run(python, sandboxd, worker, calls, sizes, env, daemon_args=()):
    argv = [python, os.path.join(BENCH_DIR, "echo_cpu.py"), "--calls", str(calls),
            "--sandboxd", sandboxd, "--worker", worker,
            *(f"--daemon-arg={arg}" for arg in daemon_args)]
    for mib in sizes:
        argv += ["--mib", str(mib)]
    out = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True, check=True,
                         timeout=900).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--mib", type=int, action="append")
    for side in ("a", "b"):
        parser.add_argument(f"--{side}-python", default=sys.executable)
        parser.add_argument(f"--{side}-sandboxd",
                            default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
        parser.add_argument(f"--{side}-worker",
                            default=f"{REPO}/bazel-bin/worker/agentix-worker")
        parser.add_argument(f"--{side}-env", action="append", default=[], metavar="KEY=VALUE",
                            help="environment variable for this side's runs (repeatable)")
        parser.add_argument(f"--{side}-daemon-arg", action="append", default=[], metavar="FLAG",
                            help="agentix-sandboxd flag for this side's runs (repeatable), "
                            "e.g. --a-daemon-arg=--calls_cpu=off")
    args = parser.parse_args()
    sizes = args.mib or [16]
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES)
    pairs = []
    for i in range(args.pairs):
        order = ("a", "b") if i % 2 == 0 else ("b", "a")
        got = {}
        for side in order:
            side_env = dict(env, **dict(pair.split("=", 1) for pair in getattr(args, f"{side}_env")))
            got[side] = run(getattr(args, f"{side}_python"), getattr(args, f"{side}_sandboxd"),
                            getattr(args, f"{side}_worker"), args.calls, sizes, side_env,
                            getattr(args, f"{side}_daemon_arg"))
        pairs.append(got)
        for mib in sizes:
            a, b = got["a"][str(mib)], got["b"][str(mib)]
            print(f"pair {i} {mib} MiB: " + ", ".join(
                f"{key} {a[key]:.1f} -> {b[key]:.1f}" for key in KEYS), flush=True)
    summary = {}
    for mib in sizes:
        row = {}
        for key in KEYS:
            a_values = [p["a"][str(mib)][key] for p in pairs]
            b_values = [p["b"][str(mib)][key] for p in pairs]
            ratios = [b / a for a, b in zip(a_values, b_values) if a > 0]
            row[key] = {"a": statistics.median(a_values), "b": statistics.median(b_values),
                        "ratio": round(statistics.median(ratios), 3) if ratios else None}
        summary[str(mib)] = row
        print(f"{mib} MiB, medians A -> B (median ratio B/A): " + "; ".join(
            f"{key} {row[key]['a']:.1f} -> {row[key]['b']:.1f} ({row[key]['ratio']})"
            for key in KEYS))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
