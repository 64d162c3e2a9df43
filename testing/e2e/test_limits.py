"""Limits and back-pressure end to end: a host that stops reading its results
cannot make the daemon take (and buffer) more and more work; nothing it was
owed is dropped."""

import asyncio
import pickle
import time

import pytest

from agentix import RuntimeClient
from raw_stream import RawStream, start

pytestmark = pytest.mark.asyncio

MiB = 1 << 20


async def test_a_host_that_stops_reading_is_throttled_and_loses_nothing(daemon):
    raw = RawStream(daemon.url)
    big, size = 30, 4 * MiB  # 120 MiB of results nobody reads for a while
    args = pickle.dumps(((size,), {}), protocol=5)
    for i in range(big):
        await raw.send(start(f"big{i}", "e2e_targets::make_bytes", args))
    await asyncio.sleep(4)  # the results pile up unwritten: the daemon stops reading this stream
    more = 100  # then 50 MiB more of calls: the daemon does not take them yet
    echo_args = pickle.dumps(((b"y" * (MiB // 2),), {}), protocol=5)

    async def send_more():
        for i in range(more):
            await raw.send(start(f"more{i}", "e2e_targets::echo", echo_args))

    sender = asyncio.ensure_future(send_more())
    await asyncio.sleep(5)
    assert not sender.done(), "the daemon kept taking calls from a host that does not read"
    async with RuntimeClient(daemon.url, logs=False, traces=False) as other:
        assert (await other.health()).status == "ok"  # the daemon still serves others
    rss = daemon.peak_rss_bytes()
    assert rss < 600 * MiB, f"daemon peak RSS {rss / MiB:.0f} MiB"
    n = big + more
    # Reading again drains everything, in full: nothing was dropped.
    started = time.monotonic()
    parts, done = {}, set()
    while len(done) < n:
        assert time.monotonic() - started < 120, f"only {len(done)} of {n} results arrived"
        response = await asyncio.wait_for(raw.call.read(), 60)
        for event in response.events:
            kind = event.WhichOneof("kind")
            if kind == "result_chunk":
                parts.setdefault(event.result_chunk.call_id, []).append(len(event.result_chunk.data))
            elif kind == "result":
                got = sum(parts.pop(event.result.call_id, [])) + len(event.result.value)
                assert got == event.result.value_size and got > MiB // 2
                done.add(event.result.call_id)
            elif kind == "error":
                raise AssertionError(f"call failed: {event.error}")
    assert done == {f"big{i}" for i in range(big)} | {f"more{i}" for i in range(more)}
    await asyncio.wait_for(sender, 60)
    await raw.close()


async def test_concurrent_calls_are_limited_with_a_bounded_queue(start_daemon):
    import e2e_targets as t
    from agentix import RemoteCallError

    daemon = start_daemon(extra_args=["--max-concurrent-calls", "2", "--max-queued-calls", "2"])
    async with RuntimeClient(daemon.url) as client:
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(client.remote(t.blocking_sleep, 0.5) for _ in range(6)), return_exceptions=True
        )
        elapsed = time.monotonic() - started
    refused = [o for o in outcomes if isinstance(o, RemoteCallError)]
    assert len(refused) == 2 and all(o.error.type == "TooManyCalls" for o in refused)
    assert sum(1 for o in outcomes if not isinstance(o, BaseException)) == 4
    assert elapsed >= 0.9  # two rounds of two: the queue waited for free slots
