"""Same-run A/B of the sandbox side's own CPU per namespace request, without the relay.

usage: /usr/bin/python3 testing/bench/sio_request_ab.py --a-python OLDVENV/bin/python \\
           --b-python .venv-test/bin/python [--rounds 8] [--requests 20000]

A namespace request's latency on this machine follows the CPU summed over its four
processes (the chain runs mostly on one CPU), but a whole-stack A/B (`ns_blocks.py`)
resolves ~1 %. Here each side's python (its venv's `agentix.sio`, a fresh process per
round, sides alternating) installs a bridge in place of the worker's: its `emit` answers
each request from a loop callback, as the worker's channel read delivers a host's reply
(`sio._deliver` of ``<event>:result``). Measured: the thread's CPU
(`time.thread_time_ns`) per `await Namespace.request("echo", body)` over `--requests`
after 2,000 warm-up requests, the best of 5 repeats per process: `request`, the reply's
delivery (`_deliver`, `_dispatch`, `_resolve`, the task's wake-up) and one event-loop turn,
plus the bridge's fixed cost (one msgpack unpack and pack, the same on both sides).

The summary gives each side's median over the rounds and the median of the per-round
ratios b / a (procs.ab_summary).
"""

import argparse
import json
import os
import subprocess
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

import procs  # noqa: E402

# One side: argv = requests; prints one RESULT line.
_SIDE = r"""
import asyncio, json, sys, time
import agentix.sio as sio
from agentix.runtime.shared.codec import pack, unpack


class AnsweringBridge:
    def __init__(self, loop):
        self.loop = loop

    def wait_cpu(self):
        return -1  # no pinned reply waits: only the Python is measured

    def emit(self, namespace, event, payload, request_id, error):
        reply = pack({"request_id": request_id, "value": unpack(payload)["data"]})
        self.loop.call_soon(sio._deliver, namespace, event + ":result", reply)


async def main(n):
    sio._install(AnsweringBridge(asyncio.get_running_loop()))
    ns = sio.register_namespace(sio.Namespace("/bench"))
    body = {"i": 0, "text": "ping"}
    for _ in range(2000):
        await ns.request("echo", body, timeout=30)
    best = None
    for _ in range(5):
        start = time.thread_time_ns()
        for _ in range(n):
            if await ns.request("echo", body, timeout=30) != body:
                raise AssertionError("unexpected reply")
        per = (time.thread_time_ns() - start) / n / 1e3
        best = per if best is None else min(best, per)
    return best


print("RESULT " + json.dumps({"cpu_us_per_request": asyncio.run(main(int(sys.argv[1])))}), flush=True)
"""


def _side(python: str, requests: int) -> dict:
    out = subprocess.run([python, "-c", _SIDE, str(requests)], capture_output=True, text=True,
                         timeout=600, check=True).stdout
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{python}: no RESULT line in {out!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-python", required=True, help="side a's python (its venv's agentix)")
    parser.add_argument("--b-python", required=True, help="side b's python")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    rows = []
    for r in range(args.rounds):
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        row = {side: _side(getattr(args, f"{side}_python"), args.requests) for side in order}
        rows.append(row)
        print(procs.ab_round_line(r, order, row) + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    print("SUMMARY " + json.dumps(procs.ab_summary(rows)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
