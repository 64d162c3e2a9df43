"""The frame wire's payload ring end to end (docs/FRAME-WIRE.md, "Payload
ring"): a Python host on a ``unix://`` daemon shares a memfd with it, and
large arguments and results cross as ring positions; values are byte-exact
at 16 and 40 MiB and under many concurrent 3 MiB calls, hosts without the
ring are served beside it, and a connection lost mid-transfer resumes with
the daemon's retained results on a new ring."""

import asyncio
import os
import socket

import pytest

import e2e_targets as t
from agentix import RuntimeClient
from agentix.runtime.client import frames
from agentix.runtime.client.frames import FrameCallsStream

pytestmark = pytest.mark.asyncio
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _frame_wire(monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    monkeypatch.delenv(frames.PAYLOAD_RING_ENV, raising=False)


def ring_of(client: RuntimeClient):
    """The client's payload ring, checked to be in use."""
    stream = client._stream
    assert type(stream) is FrameCallsStream
    transport = stream._transport
    assert transport._ring_ready, "the daemon did not accept the payload ring"
    return transport._ring


@pytest.mark.parametrize("size", [16 * MiB, 40 * MiB + 3])
async def test_large_echoes_cross_through_the_ring(daemon, size):
    data = os.urandom(size)
    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(t.add, 1, 1) == 2  # the daemon's answer is read
        for _ in range(2):
            assert await client.remote(t.echo, data) == data
        ring = ring_of(client)
        # Both ways went through it: the host put arguments, took results.
        assert ring._tail > 0 and ring._in_done > 0


async def test_many_concurrent_3_mib_calls_and_a_host_without_the_ring(daemon, monkeypatch):
    values = [os.urandom(3 * MiB + i) for i in range(12)]
    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(t.add, 1, 1) == 2
        monkeypatch.setenv(frames.PAYLOAD_RING_ENV, "off")
        async with RuntimeClient(daemon.url) as plain:
            assert not plain._stream._transport._ring_ready
            both = await asyncio.gather(
                *(client.remote(t.echo, v) for v in values),
                *(plain.remote(t.echo, v) for v in values[:4]),
            )
        assert both == values + values[:4]
        ring = ring_of(client)
        assert ring._tail > 0 and ring._in_done > 0


async def test_a_lost_connection_resumes_large_results_on_a_new_ring(daemon):
    data = os.urandom(24 * MiB)
    async with RuntimeClient(daemon.url, reconnection_delay=0.05) as client:
        assert await client.remote(t.add, 1, 1) == 2
        for delay in (0.0, 0.01, 0.03):
            first = client._stream
            call = asyncio.ensure_future(client.remote(t.echo, data))
            await asyncio.sleep(delay)
            # The connection breaks under the transfer (as if the daemon's
            # end went away; with the longer delays the call may be done by
            # then): the client reconnects and resumes the call.
            first._transport._sock.shutdown(socket.SHUT_RDWR)
            assert await asyncio.wait_for(call, 60) == data
            # The next call runs on a new connection, with a new ring.
            assert await client.remote(t.echo, data) == data
            assert client._stream is not first
            ring_of(client)
