"""Arguments and results up to 256 MiB, carried in chunks on the stream."""

import asyncio
import time

import pytest

import e2e_targets as t

pytestmark = pytest.mark.asyncio

MiB = 1 << 20


@pytest.mark.parametrize("size", [3 * MiB + 17, 64 * MiB])
async def test_large_values_round_trip(client, size):
    data = bytes(range(256)) * (size // 256) + b"tail"
    assert await client.remote(t.echo, data) == data


async def test_256_mib_round_trip_keeps_daemon_memory_bounded(client, daemon):
    size = 256 * MiB
    data = b"\xab" * size
    out = await client.remote(t.echo, data)
    assert len(out) == size and out[:1] == b"\xab" and out[-1:] == b"\xab"
    del out
    # At most one direction's bytes are in flight at once plus the retained
    # result: the daemon's peak stays within about twice the payload.
    assert daemon.peak_rss_bytes() < 2 * size + 64 * MiB


async def test_small_calls_complete_while_a_big_one_transfers(client):
    big = asyncio.ensure_future(client.remote(t.echo, b"z" * (128 * MiB)))
    small_done_at = None
    for _ in range(200):
        await client.remote(t.noop)
        if small_done_at is None:
            small_done_at = time.monotonic()
        if big.done():
            break
    assert small_done_at is not None
    await big
    big_done_at = time.monotonic()
    assert small_done_at < big_done_at


async def test_a_large_result_from_a_small_call(client):
    out = await client.remote(t.make_bytes, 20 * MiB)
    assert out == b"x" * (20 * MiB)
