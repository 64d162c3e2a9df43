"""Reconnect and resume end to end: a proxy cuts the host<->daemon connection
at random moments; every call still ends exactly once with its result, runs
once in the sandbox, and every log record and span arrives exactly once."""

import asyncio
import collections
import logging
import random
import sys
import time
from pathlib import Path

import pytest

import e2e_targets as t
from agentix import RemoteCallError, RuntimeClient, RuntimeUnreachable, trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy"))
from cutting_proxy import CuttingProxy  # noqa: E402

pytestmark = pytest.mark.asyncio


class Spans(trace.Processor):
    def __init__(self):
        self.steps = collections.Counter()

    def on_span_end(self, span):
        if span.name == "chaos-step":
            self.steps[span.attrs["step"]] += 1


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.steps = collections.Counter()

    def emit(self, record):
        if record.name == "e2e.chaos":
            self.steps[int(record.getMessage().rsplit(" ", 1)[1])] += 1


class Proxies:
    """The proxy of the daemon's gRPC socket and, for the frame wire, one of
    its ``PATH.calls`` beside it: `cut()` cuts both at once."""

    def __init__(self, listen: str, upstream: str, frames: bool) -> None:
        self._all = [CuttingProxy(listen, upstream)]
        if frames:
            self._all.append(CuttingProxy(listen + ".calls", upstream + ".calls"))
        self.url = self._all[0].url

    def start(self) -> None:
        for p in self._all:
            p.start()

    def stop(self) -> None:
        for p in self._all:
            p.stop()

    def cut(self) -> int:
        return sum(p.cut() for p in self._all)

    @property
    def cuts(self) -> int:
        return max(p.cuts for p in self._all)

    @property
    def connections(self) -> int:
        return min(p.connections for p in self._all)


@pytest.fixture(params=["relayed", "direct"])
def daemon(request, start_daemon):
    """The daemon with and without direct calls (docs/DIRECT-CALLS.md):
    the proxy relays bytes, so with --direct_calls the daemon hands the
    proxy's frame-wire connection to the worker and the cuts cut direct
    connections; the guarantees are the same."""
    if request.param == "direct":
        return start_daemon(extra_args=["--direct_calls"])
    return start_daemon(relayed_only="the relayed case of two")


@pytest.fixture(params=["frames", "grpc"])
def proxy(request, daemon, tmp_path, monkeypatch):
    """Cuts the Calls stream on the frame wire (AGENTIX_CALLS_WIRE=frames: a
    fallback to gRPC fails the test) or, with no frame-wire proxy, on gRPC."""
    frames = request.param == "frames"
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", request.param)
    p = Proxies(str(tmp_path / "proxy.sock"), str(daemon.socket_path), frames)
    p.start()
    yield p
    p.stop()


@pytest.fixture
def observed():
    spans, records = Spans(), Records()
    trace.add_processor(spans)
    root = logging.getLogger()
    old = root.level
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    yield spans, records
    root.removeHandler(records)
    root.setLevel(old)
    trace.remove_processor(spans)


async def test_a_call_survives_a_cut_while_it_runs(daemon, proxy, observed):
    spans, records = observed
    async with RuntimeClient(proxy.url) as client:
        call = asyncio.ensure_future(client.remote(t.chaos_step, 7, 0.6))
        await asyncio.sleep(0.3)
        assert proxy.cut() >= 1
        assert await asyncio.wait_for(call, 20) == 14
        assert proxy.connections >= 2  # it reconnected
    async with RuntimeClient(daemon.url, logs=False, traces=False) as direct:  # not a second replayer
        assert await direct.remote(t.chaos_executions) == {7: 1}
        deadline = time.monotonic() + 10
        while (records.steps[7], spans.steps[7]) != (1, 1) and time.monotonic() < deadline:
            await direct.remote(t.add, 0, 0)
            await asyncio.sleep(0.1)
    assert records.steps[7] == 1 and spans.steps[7] == 1


async def test_2000_calls_through_random_cuts_lose_and_duplicate_nothing(daemon, proxy, observed):
    spans, records = observed
    n, concurrency = 2000, 32
    results = {}
    errors = []
    rng = random.Random(1234)

    async with RuntimeClient(proxy.url) as client:
        queue = list(range(n))

        async def caller():
            while queue:
                i = queue.pop()
                try:
                    results.setdefault(i, []).append(await client.remote(t.chaos_step, i, 0.01))
                except Exception as error:  # counted as lost below
                    errors.append((i, repr(error)))

        async def cutter():
            while True:
                await asyncio.sleep(rng.uniform(0.02, 0.12))
                await asyncio.to_thread(proxy.cut)

        cutting = asyncio.ensure_future(cutter())
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(caller() for _ in range(concurrency))), 240)
        elapsed = time.monotonic() - started
        cutting.cancel()
        cuts = proxy.cuts
        # Records and spans of the last calls may still be on their way (a
        # broken Logs/Traces stream is re-opened by the next call).
        deadline = time.monotonic() + 30
        while (len(records.steps) < n or len(spans.steps) < n) and time.monotonic() < deadline:
            await client.remote(t.add, 0, 0)
            await asyncio.sleep(0.2)

    lost = [i for i in range(n) if i not in results]
    duplicated = [i for i, values in results.items() if len(values) != 1]
    wrong = [i for i, values in results.items() if values != [2 * i]]
    print(f"{n} calls in {elapsed:.1f}s through {cuts} cuts; errors: {errors[:5]}")
    assert cuts >= 10, "the proxy should have cut the connection many times"
    assert errors == [] and lost == [] and duplicated == [] and wrong == []

    async with RuntimeClient(daemon.url, logs=False, traces=False) as direct:  # not a second replayer
        executions = await direct.remote(t.chaos_executions)
        assert sorted(executions) == list(range(n))
        assert set(executions.values()) == {1}, "a call ran twice"
    missing_records = [i for i in range(n) if records.steps[i] == 0]
    missing_spans = [i for i in range(n) if spans.steps[i] == 0]
    assert missing_records == [] and missing_spans == []
    assert set(records.steps.values()) == {1}, "a log record arrived twice"
    assert set(spans.steps.values()) == {1}, "a span arrived twice"


async def test_large_uploads_and_streams_resume_across_cuts(daemon, proxy):
    import hashlib

    data = bytes(random.Random(5).getrandbits(8) for _ in range(1 << 16)) * 192  # 12 MiB
    async with RuntimeClient(proxy.url) as client:
        for attempt in range(3):
            call = asyncio.ensure_future(client.remote(t.chaos_digest, f"big{attempt}", data))
            await asyncio.sleep(0.02 * (attempt + 1))  # mid-upload, most likely
            proxy.cut()
            assert await asyncio.wait_for(call, 60) == hashlib.sha256(data).hexdigest()
        # A stream cut mid-way: every item once, in order.
        items = []
        async for item in client.remote_stream(t.count_sync, 200):
            items.append(item)
            if len(items) in (50, 120):
                proxy.cut()
        assert items == [10 * i for i in range(200)]
    async with RuntimeClient(daemon.url, logs=False, traces=False) as direct:
        executions = await direct.remote(t.chaos_executions)
        assert {k: v for k, v in executions.items() if str(k).startswith("big")} == {"big0": 1, "big1": 1, "big2": 1}


@pytest.mark.parametrize("wire", ["frames", "grpc"])
async def test_namespace_streams_of_cut_connections_are_released(start_daemon, tmp_path, monkeypatch, wire):
    from agentix import AsyncClientNamespace

    daemon = start_daemon(extra_args=["--max-namespace-streams", "3"])
    # On the frame wire the namespace streams' connections are cut too.
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", wire)
    proxy = Proxies(str(tmp_path / "ns-proxy.sock"), str(daemon.socket_path), wire == "frames")
    proxy.start()
    try:
        client = RuntimeClient(proxy.url)
        client.register_namespace(AsyncClientNamespace("/cuts"))
        async with client:
            for _ in range(10):
                assert await client.remote(t.add, 1, 1) == 2
                proxy.cut()
                await asyncio.sleep(0.3)
            assert await client.remote(t.add, 2, 2) == 4
        # Streams of cut connections were released: a new host can open one.
        fresh = RuntimeClient(daemon.url, logs=False, traces=False)
        fresh.register_namespace(AsyncClientNamespace("/cuts"))
        async with fresh:
            assert await fresh.remote(t.add, 3, 3) == 6
    finally:
        proxy.stop()


def _stream_diff(items, expected):
    """How a received item list differs from the expected one (for failure
    messages): counts, missing and repeated entries, first divergence."""
    if items == expected:
        return "ok"
    got = collections.Counter(map(repr, items))
    want = collections.Counter(map(repr, expected))
    missing = [e for e in expected if got[repr(e)] == 0]
    repeated = [k for k, n in got.items() if n > 1]
    first = next((i for i, (a, b) in enumerate(zip(items, expected)) if a != b), min(len(items), len(expected)))
    return (f"{len(items)} of {len(expected)} items; missing {missing[:10]}; repeated {repeated[:10]}; "
            f"unexpected {[k for k in got if want[k] == 0][:10]}; first difference at position {first}")


@pytest.mark.parametrize(
    "window, size",
    [(16, 0), (2, 0), (3, 256 << 10)],
    ids=["window16", "window2", "window3-256KiB-items"],
)
async def test_streams_through_frequent_cuts_yield_every_item_once_in_order(daemon, proxy, window, size):
    """Many concurrent streams while the proxy cuts every 20-150 ms: each one
    yields exactly its n items in order (or fails with a typed error; with no
    worker kills here, none should). A cut while items and acks are in flight
    makes the daemon replay retained items on the resumed stream and the
    re-sent StreamAck lets the worker go on at once: a list with a gap or a
    truncated list is a lost item."""
    rng = random.Random(4321 + window)
    n, streams, concurrency = 20, 3000 if size == 0 else 300, 32
    wrong, errors = [], []
    done = 0
    async with RuntimeClient(proxy.url, stream_window=window) as client:
        queue = list(range(streams))

        async def caller():
            nonlocal done
            while queue:
                k = queue.pop()
                items = []
                try:
                    if size:
                        async for i, blob in client.remote_stream(t.numbered_blobs, n, size):
                            assert blob == bytes([i % 256]) * size
                            items.append(i)
                    else:
                        async for item in client.remote_stream(t.count_sync, n):
                            items.append(item // 10)
                except (RemoteCallError, RuntimeUnreachable) as error:
                    errors.append((k, len(items), f"{type(error).__name__}: {error}"[:200]))
                    continue
                if items != list(range(n)):
                    wrong.append((k, _stream_diff(items, list(range(n)))))
                else:
                    done += 1

        async def cutter():
            while True:
                await asyncio.sleep(rng.uniform(0.02, 0.15))
                await asyncio.to_thread(proxy.cut)

        cutting = asyncio.ensure_future(cutter())
        try:
            await asyncio.wait_for(asyncio.gather(*(caller() for _ in range(concurrency))), 300)
        finally:
            cutting.cancel()
    print(f"{streams} streams (window {window}, item size {size}): {done} complete through {proxy.cuts} cuts; "
          f"wrong: {wrong[:5]}; errors: {errors[:5]}")
    assert proxy.cuts >= 10, "the proxy should have cut the connection many times"
    assert wrong == [], f"{len(wrong)} streams returned a wrong item list: {wrong[:5]}"
    assert errors == []
