"""What a host that falls behind gets of a log burst (docs/RELIABILITY.md,
"stop-27: a lagging host").

One session per variant and round: a real agentix-sandboxd (+ agentix-worker)
on a Unix socket and a RuntimeClient of the agentix package this Python
imports; the host's handler of the burst's logger sleeps `--stall-s` on the
burst's first record (a host handler that blocks, for less than the call's
barrier waits without progress), while the sandbox logs
`--records` records of `--size` bytes (`side_targets.log_big`). Reported per
run: the burst's records the host had when the call returned (`at_return`),
after a second call and `--settle-s` (`total`), duplicates, the daemon's drop
reports the host received (the records they count) and how long the call took.
The host package is this interpreter's: compare hosts by running the script
with each venv's python (alternating runs), daemons with repeated --sandboxd:

    .venv-test/bin/python testing/bench/lag_burst.py --rounds 3 \\
        --sandboxd /tmp/before/agentix-sandboxd --sandboxd bazel-bin/sandbox/agentix-sandboxd
"""

import argparse
import asyncio
import logging
import os
import re
import statistics
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import procs  # noqa: E402
import side_targets  # noqa: E402
from agentix import RuntimeClient  # noqa: E402


class StallAtFirst(logging.Handler):
    """Counts the burst's records by index; once `armed`, sleeps on the
    first; sums the daemon's drop reports."""

    def __init__(self, stall_s):
        super().__init__(logging.DEBUG)
        self.stall_s = stall_s
        self.armed = False
        self.seen = {}
        self.dropped = 0

    def emit(self, record):
        if record.name == side_targets.LOGGER:
            if self.armed:
                self.armed = False
                time.sleep(self.stall_s)
            index = int(record.getMessage().split()[1])
            self.seen[index] = self.seen.get(index, 0) + 1
        elif "were dropped" in record.getMessage():
            found = re.match(r"(\d+) sandbox log records were dropped", record.getMessage())
            self.dropped += int(found.group(1)) if found else 0


async def session(sock, args):
    handler = StallAtFirst(args.stall_s)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    for name in ("agentix.runtime", "grpc"):  # the host's own warnings only to stderr
        logging.getLogger(name).propagate = False
    try:
        async with RuntimeClient(f"unix://{sock}") as client:
            await client.remote(side_targets.log_big, 1, 1)  # streams open, worker up
            handler.seen.clear()
            handler.armed = True
            started = time.perf_counter()
            await client.remote(side_targets.log_big, args.records, args.size)
            took = time.perf_counter() - started
            at_return = len(handler.seen)
            await client.remote(side_targets.log_big, 0, 1)
            await asyncio.sleep(args.settle_s)
            await client.remote(side_targets.log_big, 0, 1)
            await asyncio.sleep(args.settle_s)
    finally:
        root.removeHandler(handler)
    return {"at_return": at_return, "total": len(handler.seen),
            "duplicates": sum(c - 1 for c in handler.seen.values()),
            "reported_dropped": handler.dropped, "call_s": round(took, 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--size", type=int, default=8192)
    # Below the host's barrier bound (2 s without progress): the call waits.
    parser.add_argument("--stall-s", type=float, default=1.5)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--sandboxd", action="append")
    parser.add_argument("--worker", default=f"{REPO}/bazel-bin/worker/agentix-worker")
    args = parser.parse_args()
    daemons = args.sandboxd or [f"{REPO}/bazel-bin/sandbox/agentix-sandboxd"]
    env = {**os.environ, "GLIBC_TUNABLES": procs.MALLOC_TUNABLES}
    rows = {d: [] for d in daemons}
    for round_ in range(args.rounds):
        order = daemons if round_ % 2 == 0 else daemons[::-1]
        for sandboxd in order:
            with procs.ab_daemon(sandboxd, args.worker, env) as (sock, _):
                row = asyncio.run(session(sock, args))
            rows[sandboxd].append(row)
            print(f"round {round_ + 1} {sandboxd}: {row}", flush=True)
    for sandboxd, runs in rows.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{sandboxd} (host {sys.executable}), {args.records} x {args.size} B, "
              f"stall {args.stall_s} s, median of {len(runs)}: {medians}")


if __name__ == "__main__":
    main()
