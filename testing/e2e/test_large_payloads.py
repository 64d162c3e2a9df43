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


async def test_large_results_arrive_whole_through_the_hosts_prefault(client):
    # Values of 4 MiB and more are decoded into buffers whose pages the host
    # faults in first, in huge or small pages (base/fresh_pages.h), leaving
    # an unaligned head and tail to the copy: every byte must still land.
    def pattern(size, seed):
        return (bytes(range(seed, 256)) + bytes(range(seed))) * (size // 256) + bytes([seed]) * (size % 256)

    values = [
        pattern(4 * MiB - 1, 1),
        pattern(4 * MiB, 2),
        pattern(9 * MiB + 3, 3),
        bytearray(pattern(6 * MiB + 77, 4)),
        [pattern(5 * MiB, 5), b"small", pattern(4 * MiB + 1, 6)],
    ]
    for value in values:
        out = await client.remote(t.echo, value)
        assert type(out) is type(value) and out == value


def _payload(size, seed):
    return bytes((seed + i) % 251 for i in range(251)) * (size // 251) + bytes([seed]) * (size % 251)


async def _echo_mixed_sizes(client):
    # Sizes across the worker's large-buffer pool (1–64 MiB slots), two at a
    # time so that several slots are in use at once; each echo's bytes differ.
    sizes = [48 * MiB, 40 * MiB + 3, 33 * MiB, 24 * MiB + 1, 16 * MiB, 2 * MiB - 5]
    for round_ in range(2):
        for i in range(0, len(sizes), 2):
            pair = [_payload(size, round_ * 10 + i + k) for k, size in enumerate(sizes[i:i + 2])]
            outs = await asyncio.gather(*(client.remote(t.echo, p) for p in pair))
            assert [len(o) for o in outs] == [len(p) for p in pair]
            assert outs == pair


async def test_repeated_large_echoes_keep_the_worker_bounded(client):
    await client.remote(t.echo, _payload(16 * MiB, 1))
    before = await client.remote(t.rss_bytes)
    await _echo_mixed_sizes(client)
    after = await client.remote(t.rss_bytes)
    # Idle pool slots keep at most 64 MiB faulted in; a slot kept per size
    # seen (48+40+33+24 MiB) would not fit, nor would buffers never freed.
    assert after - before < 64 * MiB + 40 * MiB, (before, after)


async def test_large_echoes_without_the_pool(start_daemon):
    from agentix import RuntimeClient

    daemon = start_daemon(env={"AGENTIX_WORKER_LARGE_BUFFERS": "0"})
    async with RuntimeClient(daemon.url) as client:
        await _echo_mixed_sizes(client)
