"""Exec → exit of binaries run with one argument, alternating, same run (issue 25's cold create).

    /usr/bin/python3 testing/bench/exec_ab.py --runs 200 OLD NEW [--arg --version]

Each run spawns every binary once, in turn (the order rotates), with `--arg` and waits for
it: the dynamic loader's work (mapping, relocations, symbol lookups), the binary's static
initialisers and its main up to the flag's answer. Prints per binary the median wall time,
CPU (user + system) and minor page faults of a run, and each one's ratio to the first.
"""

import argparse
import os
import resource
import statistics
import time


def run_once(binary: str, arg: str) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    pid = os.posix_spawn(binary, [binary, arg], os.environ,
                         file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                       (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
    _, status = os.waitpid(pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{binary} {arg}: exit status {status}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall * 1e3, cpu * 1e3, after.ru_minflt - before.ru_minflt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binaries", nargs="+")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--arg", default="--version")
    args = parser.parse_args()
    samples = {b: [] for b in args.binaries}
    for b in args.binaries:  # warm the page cache
        run_once(b, args.arg)
    for n in range(args.runs):
        k = n % len(args.binaries)
        for b in args.binaries[k:] + args.binaries[:k]:
            samples[b].append(run_once(b, args.arg))
    print(f"load {os.getloadavg()}; {args.runs} runs each, medians")
    base = None
    for b, rows in samples.items():
        med = [statistics.median(r[i] for r in rows) for i in range(3)]
        base = base or med
        print(f"{b}: wall {med[0]:.2f} ms ({med[0] / base[0]:.3f}), CPU {med[1]:.2f} ms "
              f"({med[1] / base[1]:.3f}), minor faults {med[2]:.0f} ({med[2] / base[2]:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
