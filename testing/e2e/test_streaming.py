"""Streaming callables end to end: generators in the sandbox, `async for` on
the host, with back-pressure, cancellation and errors where they happened."""

import asyncio

import pytest

import e2e_targets as t
from agentix import RemoteCallError, RuntimeClient

pytestmark = pytest.mark.asyncio


async def test_async_and_sync_generators_stream_their_items(client):
    assert [i async for i in client.remote_stream(t.count_async, 50)] == list(range(50))
    assert [i async for i in client.remote_stream(t.count_sync, 5)] == [0, 10, 20, 30, 40]
    assert [i async for i in client.remote_stream(t.returns_iterator, 3)] == [0, 1, 2]


async def test_an_exception_is_raised_where_the_sandbox_failed(client):
    got = []
    with pytest.raises(RemoteCallError) as info:
        async for item in client.remote_stream(t.fail_after, 3):
            got.append(item)
    assert got == [0, 1, 2]
    assert info.value.error.type == "ValueError"
    assert "failed after 3 items" in str(info.value)


@pytest.mark.parametrize("target", [t.ticker, t.async_ticker])
async def test_back_pressure_and_cancel_on_early_exit(daemon, target):
    async with RuntimeClient(daemon.url, stream_window=4) as c:
        stream = c.remote_stream(target)
        first = await stream.__anext__()
        assert first == 1
        # The consumer stalls: the producer fills the window, then waits.
        for _ in range(100):
            if (await c.remote(t.stream_state))["produced"] >= 4:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        produced = (await c.remote(t.stream_state))["produced"]
        assert 4 <= produced <= 5, produced  # the window, plus one item in hand
        await stream.aclose()  # leaving early cancels the call in the sandbox
        for _ in range(100):
            if (await c.remote(t.stream_state))["closed"]:
                break
            await asyncio.sleep(0.05)
        assert (await c.remote(t.stream_state))["closed"]
        # The client and the worker keep serving.
        assert await c.remote(t.add, 1, 2) == 3


async def test_remote_on_a_generator_and_remote_stream_on_a_function(client):
    with pytest.raises(RemoteCallError) as info:
        await client.remote(t.count_sync, 3)
    assert info.value.error.type == "ResultEncodeError"
    assert "remote_stream" in info.value.error.message
    with pytest.raises(RemoteCallError) as info:
        async for _ in client.remote_stream(t.add, 1, 2):
            pass
    assert info.value.error.type == "TypeError"


async def test_many_streams_interleave_with_calls(client):
    async def consume(n):
        return [i async for i in client.remote_stream(t.count_async, n)]

    results = await asyncio.gather(*(consume(100) for _ in range(10)), client.remote(t.add, 2, 2))
    assert results[:10] == [list(range(100))] * 10
    assert results[10] == 4
