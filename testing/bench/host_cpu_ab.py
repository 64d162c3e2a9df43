"""Same-run A/B of the Python host's own CPU per call, without the daemon's round trip.

usage: /usr/bin/python3 testing/bench/host_cpu_ab.py --a-python OLDVENV/bin/python \\
           --b-python .venv-test/bin/python [--rounds 8] [--calls 20000] [--callers 1,64]

The host's CPU per call in `c64_ab.py` moves with the machine: on a shared 2-core VM a
wake-up, a preemption after `sendmsg` or a migrated cache costs the host a few µs more or
less from one run to the next, more than most changes to its own code. Here each host
(one fresh process of each side's venv per round, sides alternating) connects to a real
daemon (`agentix-sandboxd` of this checkout's bazel-bin, with its worker) once, then its
Calls stream is swapped for a frame-wire stream (`FrameCallsStream`) over a socketpair
whose other end is answered inside the host's own `sendmsg`: every StartCall of a write
gets its CallResult (pickled None) before `sendmsg` returns, so the next loop iteration
reads it at once. What is measured is the event-loop thread's CPU
(`time.thread_time_ns`) per `remote(bench_targets.noop)`: the host's whole call path
(pickling, the StartCall, the write, the loop turn, the read, routing, decoding) plus
the responder's fixed cost (a protobuf parse and build, one `recv`, one `send`; the same
on both sides), over `--calls` calls after 2,000 warm-up calls, the median of 5 repeats
per process. `--callers 64` runs 64 tasks calling in a loop (calls / 64 each).

The summary gives, per caller count, each side's median over the rounds and the median
of the per-round ratios b / a (procs.ab_summary).
"""

import argparse
import json
import os
import subprocess
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import procs  # noqa: E402

# The host process: argv = socket, calls, callers; prints one RESULT line.
_HOST = r"""
import asyncio, json, os, pickle, socket, statistics, struct, sys, time
sys.path.insert(0, os.environ["HOST_CPU_BENCH_DIR"])
import bench_targets
from agentix import RuntimeClient
from agentix.runtime.client.frames import FrameCallsStream, FrameTransport
from agentix.runtime.v1 import runtime_pb2 as pb

HEADER = struct.Struct("<IB")
MESSAGE = 2
NONE = pickle.dumps(None, protocol=5)


class AnsweringSocket:
    # The host's end of a socketpair; `sendmsg` also answers, from the other
    # end, every StartCall of the frames written so far.
    def __init__(self, ours, theirs):
        self.ours, self.theirs, self.pending = ours, theirs, b""

    def fileno(self):
        return self.ours.fileno()

    def recv_into(self, *args):
        return self.ours.recv_into(*args)

    def close(self):
        self.ours.close()
        self.theirs.close()

    def sendmsg(self, pieces):
        sent = self.ours.sendmsg(pieces)
        self.pending += self.theirs.recv(1 << 20)
        replies = []
        while len(self.pending) >= HEADER.size:
            size, kind = HEADER.unpack_from(self.pending)
            if len(self.pending) < HEADER.size + size:
                break
            payload = self.pending[HEADER.size : HEADER.size + size]
            self.pending = self.pending[HEADER.size + size :]
            if kind != MESSAGE:
                continue
            response = pb.CallsResponse()
            for event in pb.CallsRequest.FromString(payload).events:
                if event.HasField("start"):
                    result = response.events.add().result
                    result.call_id = event.start.call_id
                    result.value = NONE
                    result.encoding = pb.ENCODING_PICKLE
            if response.events:
                message = response.SerializeToString()
                replies.append(HEADER.pack(len(message), MESSAGE) + message)
        if replies:
            self.theirs.sendall(b"".join(replies))
        return sent


async def main(sock, calls, callers):
    async with RuntimeClient(f"unix://{sock}", logs=False, traces=False) as client:
        await client.remote(bench_targets.noop)
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        transport = FrameTransport(ours, ())
        theirs.recv(1 << 16)  # the HELLO
        transport._sock = AnsweringSocket(ours, theirs)
        real = client._stream
        client._stream = FrameCallsStream(transport, client._pending, client._stream_lost)

        async def caller(n):
            for _ in range(n):
                await client.remote(bench_targets.noop)

        await caller(2000)
        repeats = []
        for _ in range(5):
            start = time.thread_time_ns()
            await asyncio.gather(*(caller(calls // callers) for _ in range(callers)))
            repeats.append((time.thread_time_ns() - start) / (calls // callers * callers) / 1e3)
        client._stream = real
    return statistics.median(repeats)


print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))), flush=True)
"""


def one(python: str, sock: str, calls: int, callers: int, env: dict) -> float:
    host = subprocess.run([python, "-c", _HOST, sock, str(calls), str(callers)], env=env,
                          stdout=subprocess.PIPE, text=True, timeout=300, check=True)
    for line in host.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"no RESULT from the host: {host.stdout!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-python", required=True)
    parser.add_argument("--b-python", default=f"{REPO}/.venv-test/bin/python")
    parser.add_argument("--sandboxd", default=f"{REPO}/bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--worker", default=f"{REPO}/bazel-bin/worker/agentix-worker")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--callers", default="1,64", help="caller counts, comma-separated")
    args = parser.parse_args()
    pythons = {"a": args.a_python, "b": args.b_python}
    callers = [int(c) for c in args.callers.split(",")]
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES, HOST_CPU_BENCH_DIR=BENCH_DIR)
    rows = []
    with procs.ab_daemon(args.sandboxd, args.worker, env, "agx-hcpu-") as (sock, _daemon):
        for r in range(args.rounds):
            order = ("a", "b") if r % 2 == 0 else ("b", "a")
            row = {side: {} for side in order}
            for side in order:
                for count in callers:
                    row[side][f"c{count}_host_cpu_us"] = one(pythons[side], sock, args.calls, count, env)
            rows.append(row)
            print(procs.ab_round_line(r, order, row), f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print(json.dumps({"rounds": args.rounds, "summary": procs.ab_summary(rows)}, indent=1))


if __name__ == "__main__":
    main()
