"""Chaos run: mixed load against a real agentix-sandboxd while connections are
cut, the worker is killed and memory is put under pressure.

    bazel run //testing/chaos -- --minutes N [--seed S] [--concurrency C]

Load (C concurrent callers): small calls, 64 KiB-4 MiB echoes, streams,
namespace requests answered by the host, and calls that allocate 64-256 MiB.
Faults: a proxy between host and daemon cuts every connection every 0.3-2 s;
the worker is SIGKILLed every 8-20 s. At the end it prints calls done, lost
(no result and no typed error that explains it, or a wrong result),
duplicated (ran more than once, from an append-only ledger the sandbox
writes), hung (no outcome within 120 s), worker restarts, the daemon's peak
RSS, and whether every log record and span of a completed call arrived
exactly once. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(os.path.abspath(__file__)).parent
ROOT = HERE.parents[1]  # the workspace root (in the runfiles tree under Bazel)
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "testing" / "proxy"))

import chaos_targets as targets  # noqa: E402
from cutting_proxy import CuttingProxy, start_pair  # noqa: E402

from agentix import AsyncClientNamespace, RuntimeClient, WorkerExited, request_handler, trace  # noqa: E402

CALL_TIMEOUT = 120.0


class Double(AsyncClientNamespace):
    @request_handler("double")
    async def on_double(self, body):
        return body * 2


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.ops = collections.Counter()

    def emit(self, record):
        if record.name == "chaos":
            self.ops[record.getMessage()[3:]] += 1


class Spans(trace.Processor):
    def __init__(self):
        self.ops = collections.Counter()

    def on_span_end(self, span):
        if span.name == "chaos":
            self.ops[span.attrs.get("op")] += 1


def stream_diff(items, n):
    """How a stream's received items differ from range(n), compactly: the
    count, the missing and repeated indices, whether the order broke, and the
    list itself when it is short."""
    counts = collections.Counter(items)
    missing = [i for i in range(n) if counts[i] == 0]
    repeated = sorted(i for i, c in counts.items() if c > 1 and isinstance(i, int))
    unexpected = [i for i in counts if not (isinstance(i, int) and 0 <= i < n)]
    backwards = [pos + 1 for pos, (a, b) in enumerate(zip(items, items[1:]))
                 if isinstance(a, int) and isinstance(b, int) and b <= a]
    parts = [f"{len(items)} of {n} items"]
    if missing:
        parts.append(f"missing {missing}")
    if repeated:
        parts.append(f"repeated {repeated}")
    if unexpected:
        parts.append(f"unexpected {unexpected[:5]!r}")
    if backwards:
        parts.append(f"out of order at positions {backwards[:5]}")
    if len(items) <= 3 * n:
        parts.append(f"received {items!r}")
    return "; ".join(parts)


def peak_rss_mb(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


async def run(args):
    work = Path(tempfile.mkdtemp(prefix="agentix-chaos-"))
    ledger = work / "ledger"
    socket_path = work / "sandboxd.sock"
    env = {**os.environ, "AGENTIX_CHAOS_LEDGER": str(ledger), "AGENTIX_LOG_DIR": ""}
    daemon_log = open(work / "sandboxd.log", "wb")
    daemon = subprocess.Popen(
        [
            args.sandboxd,
            f"--listen=unix://{socket_path}",
            f"--worker={args.worker}",
            f"--python_path={ROOT / 'host' / 'python'}:{HERE}",
            "--log_level=warning",
            # Explicit either way: the daemon's default may change.
            "--direct_calls" if args.direct_calls else "--nodirect_calls",
        ],
        stdout=daemon_log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    proxies = []
    rng = random.Random(args.seed)
    outcomes = collections.Counter()
    lost_samples, op_kind = [], {}
    completed = set()
    in_flight = set()
    records, spans = Records(), Spans()
    root = logging.getLogger()
    root.addHandler(records)
    root.setLevel(logging.INFO)
    trace.add_processor(spans)
    try:
        for _ in range(200):
            if socket_path.exists():
                break
            if daemon.poll() is not None:
                raise RuntimeError(f"sandboxd exited: {(work / 'sandboxd.log').read_text()}")
            await asyncio.sleep(0.05)
        # With --direct-calls the frame-wire Calls socket is proxied too, so
        # the cut client's Calls connections are handed-over ones; without it
        # that client finds no proxy.sock.calls and stays on gRPC, as before.
        if args.direct_calls:
            proxies = start_pair(str(work / "proxy.sock"), str(socket_path))
        else:
            proxies = [CuttingProxy(str(work / "proxy.sock"), str(socket_path))]
            proxies[0].start()
        client = RuntimeClient(proxies[0].url)
        client.register_namespace(Double("/chaos"))
        direct = RuntimeClient(f"unix://{socket_path}", logs=False, traces=False)
        deadline = time.monotonic() + args.minutes * 60
        seq = 0

        def next_op(kind):
            nonlocal seq
            seq += 1
            op = f"{kind}-{seq}"
            op_kind[op] = kind
            return op

        async def one(kind):
            op = next_op(kind)
            in_flight.add(op)
            try:
                await one_op(kind, op)
            finally:
                in_flight.discard(op)

        async def one_op(kind, op):
            wrong = "wrong result"
            try:
                if kind == "small":
                    x = rng.randrange(1 << 30)
                    ok = await asyncio.wait_for(client.remote(targets.small, op, x), CALL_TIMEOUT) == 2 * x
                elif kind == "echo":
                    data = rng.randbytes(rng.choice([64 << 10, 1 << 20, 4 << 20]))
                    ok = await asyncio.wait_for(client.remote(targets.echo, op, data), CALL_TIMEOUT) == data

                elif kind == "stream":
                    received = []

                    async def collect():
                        async for item in client.remote_stream(targets.stream, op, 20):
                            received.append(item)

                    try:
                        await asyncio.wait_for(collect(), CALL_TIMEOUT)
                    except Exception as error:
                        # Say how far the stream got before it failed.
                        error.add_note(f"after {len(received)} of 20 items")
                        raise
                    ok = received == list(range(20))
                    if not ok:
                        wrong = f"wrong item list: {stream_diff(received, 20)}"
                elif kind == "ask":
                    value = rng.randrange(1000)
                    ok = await asyncio.wait_for(client.remote(targets.ask, op, value), CALL_TIMEOUT) == 2 * value
                else:
                    mib = rng.choice([64, 128, 256])
                    ok = await asyncio.wait_for(client.remote(targets.pressure, op, mib), CALL_TIMEOUT) == mib << 20
            except WorkerExited:
                outcomes["worker_exited"] += 1  # a worker kill we caused: a typed, explained failure
                return
            except TimeoutError:
                outcomes["hung"] += 1
                return
            except Exception as error:
                outcomes["lost"] += 1
                if len(lost_samples) < 10:
                    notes = "; ".join(getattr(error, "__notes__", ()))
                    lost_samples.append(f"{op}: {type(error).__name__}: {error}{' (' + notes + ')' if notes else ''}"[:300])
                return
            if ok:
                outcomes["done"] += 1
                completed.add(op)
            else:
                outcomes["lost"] += 1
                if len(lost_samples) < 10:
                    lost_samples.append(f"{op}: {wrong}"[:300])

        kinds = ["small"] * 50 + ["echo"] * 15 + ["stream"] * 15 + ["ask"] * 15 + ["pressure"] * 5

        async def caller():
            while time.monotonic() < deadline:
                await one(rng.choice(kinds))

        async def cutter():
            while True:
                await asyncio.sleep(rng.uniform(0.3, 2.0))
                for proxy in proxies:
                    await asyncio.to_thread(proxy.cut)

        async def killer():
            while True:
                await asyncio.sleep(rng.uniform(8, 20))
                info = await direct._info()
                if info.worker_pid > 0:
                    try:
                        os.kill(info.worker_pid, signal.SIGKILL)
                        outcomes["worker_kills"] += 1
                    except ProcessLookupError:
                        pass

        async def reporter():
            while True:
                await asyncio.sleep(30)
                running = collections.Counter(op_kind[op] for op in in_flight)
                try:
                    streams = (await asyncio.wait_for(direct._info(), 5)).namespace_streams
                except Exception as error:
                    streams = repr(error)
                print(f"[chaos] {time.strftime('%H:%M:%S')} {dict(outcomes)} cuts={sum(p.cuts for p in proxies)} "
                      f"rss={peak_rss_mb(daemon.pid):.0f} MiB in-flight={dict(running)} "
                      f"namespace-streams={streams}", flush=True)

        def dump_state():
            # `kill -USR2 <pid>`: the client's connection state and where every task waits.
            print(f"[chaos] client: stream alive={client._stream is not None and client._stream.alive} "
                  f"channel={client._channel!r} lock={client._connect_lock.locked()} "
                  f"reconnector={client._reconnector!r}", flush=True)
            for path, ns_stream in client._namespace_streams.items():
                print(f"[chaos] namespace {path}: done={ns_stream._done} task_done={ns_stream._task.done()} "
                      f"opened={ns_stream._opened!r}", flush=True)
            for task in asyncio.all_tasks():
                task.print_stack(limit=6, file=sys.stdout)
            sys.stdout.flush()

        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, dump_state)
        async with client:
            injectors = [asyncio.ensure_future(f()) for f in (cutter, killer, reporter)]
            try:
                await asyncio.gather(*(caller() for _ in range(args.concurrency)))
            finally:
                for task in injectors:
                    task.cancel()
                await asyncio.gather(*injectors, return_exceptions=True)
            # Let the last records and spans arrive (a call re-opens a broken feed).
            wait_until = time.monotonic() + 60
            while time.monotonic() < wait_until and any(
                records.ops[op] == 0 or spans.ops[op] == 0 for op in completed
            ):
                try:
                    await asyncio.wait_for(client.remote(targets.worker_pid), 10)
                except Exception as error:
                    print(f"[chaos] final call failed: {error!r}", flush=True)
                await asyncio.sleep(0.5)
        info = await asyncio.wait_for(direct._info(), 30)
        await direct.close()
        executions = collections.Counter(ledger.read_text().split()) if ledger.exists() else collections.Counter()
        duplicated = sorted(op for op, n in executions.items() if n > 1)
        result = {
            "calls_done": outcomes["done"],
            "lost": outcomes["lost"],
            "duplicated": len(duplicated),
            "hung": outcomes["hung"],
            "worker_restarts": max(0, info.workers_started - 1),
            "peak_rss_mb": round(peak_rss_mb(daemon.pid) or 0, 1),
            "worker_exited_calls": outcomes["worker_exited"],
            "worker_kills": outcomes["worker_kills"],
            "connection_cuts": sum(p.cuts for p in proxies),
            "log_records_missing": sum(1 for op in completed if records.ops[op] == 0),
            "log_records_duplicated": sum(1 for n in records.ops.values() if n > 1),
            "spans_missing": sum(1 for op in completed if spans.ops[op] == 0),
            "spans_duplicated": sum(1 for n in spans.ops.values() if n > 1),
            "minutes": args.minutes,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "lost_samples": lost_samples,
            "duplicated_samples": duplicated[:10],
        }
        return result
    finally:
        trace.remove_processor(spans)
        root.removeHandler(records)
        for proxy in proxies:
            proxy.stop()
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        daemon_log.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sandboxd", default=str(ROOT / "sandbox" / "agentix-sandboxd"))
    parser.add_argument("--worker", default=str(ROOT / "worker" / "agentix-worker"))
    parser.add_argument("--direct-calls", action="store_true",
                        help="the daemon with --direct_calls (docs/DIRECT-CALLS.md) and the "
                             "cut client on the frame wire, asking for them; without it the "
                             "daemon gets --nodirect_calls")
    args = parser.parse_args()
    # `kill -USR1 <pid>` prints every thread's Python stack (diagnosing a stall).
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.getLogger("agentix").setLevel(logging.WARNING)
    print(f"[chaos] {args.minutes} min, {args.concurrency} callers, seed {args.seed}"
          f"{', direct calls' if args.direct_calls else ''}", flush=True)
    started = time.monotonic()
    result = asyncio.run(run(args))
    print(f"[chaos] finished in {time.monotonic() - started:.0f} s")
    for key in ("calls_done", "lost", "duplicated", "hung", "worker_restarts", "peak_rss_mb",
                "connection_cuts", "worker_kills", "worker_exited_calls", "log_records_missing",
                "log_records_duplicated", "spans_missing", "spans_duplicated"):
        print(f"[chaos] {key:24} {result[key]}")
    for sample in result["lost_samples"]:
        print(f"[chaos] lost: {sample}")
    print(json.dumps(result), flush=True)
    bad = result["lost"] or result["duplicated"] or result["hung"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
