"""The frame wire's payload ring end to end (docs/FRAME-WIRE.md, "Payload
ring"): a Python host on a ``unix://`` daemon shares a memfd with it, and
large arguments and results cross as ring positions; values are byte-exact
at 16 and 40 MiB and under many concurrent 3 MiB calls, hosts without the
ring are served beside it, and a connection lost mid-transfer resumes with
the daemon's retained results on a new ring."""

import asyncio
import concurrent.futures
import os
import socket

import pytest

import e2e_targets as t
from agentix import RuntimeClient
from agentix.runtime.client import frames
from agentix.runtime.client.frames import FrameCallsStream
from conftest import relayed_or_direct

pytestmark = pytest.mark.asyncio
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _frame_wire(monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    monkeypatch.delenv(frames.PAYLOAD_RING_ENV, raising=False)


@pytest.fixture(params=["relayed", "direct"])
def ring_daemon(request, start_daemon, monkeypatch):
    yield from relayed_or_direct(request.param, start_daemon, monkeypatch)


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


class _KeepingExecutor(concurrent.futures.ThreadPoolExecutor):
    """Keeps every function it was given, with its arguments: a work item
    its thread has not dropped yet when the loop goes on, which happens
    whenever the thread is switched out between setting the result and
    taking the next item."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.kept: list = []

    def submit(self, fn, /, *args, **kwargs):
        self.kept.append((fn, args, kwargs))
        return super().submit(fn, *args, **kwargs)


async def test_a_decoded_result_leaves_no_ring_piece_held(ring_daemon):
    """Once `remote` returned a result that came in ring pieces, nothing
    refers to them: the next write releases the whole incoming ring, so the
    next 16 MiB result (which a direct worker puts at once) finds it empty.
    Not a matter of timing: the executor keeps what it ran."""
    data = os.urandom(16 * MiB)
    executor = _KeepingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    try:
        async with RuntimeClient(ring_daemon.url) as client:
            assert await client.remote(t.add, 1, 1) == 2
            ring = ring_of(client)
            for _ in range(2):
                taken = ring._taken
                assert await client.remote(t.echo, data) == data
                assert ring._taken - taken >= 16 * MiB, "the result did not come through the ring"
                ring.release_unreferenced()  # what the next write does first
                assert not ring.held
                assert ring._in_done == ring._taken
            assert executor.kept  # the results were decoded there
    finally:
        executor.shutdown()


async def test_sequential_16_mib_results_never_fall_back_to_the_socket(ring_daemon, monkeypatch):
    """Every result chunk of eight sequential 16 MiB echoes arrives in the
    ring: no MESSAGE frame carries more than 64 KiB (docs/PERFORMANCE.md
    "stop-40: a direct 16 MiB result no longer falls back to the socket").
    While the previous result's pieces were still referenced, a direct
    worker sent a whole result inline in about 1 echo of 4, relayed a chunk."""
    inline: list = []
    frame = frames.FrameTransport._frame

    def counting_frame(self, kind, payload, messages):
        if kind == frames.MESSAGE:
            inline.append(len(payload))
        frame(self, kind, payload, messages)

    monkeypatch.setattr(frames.FrameTransport, "_frame", counting_frame)
    data = os.urandom(16 * MiB)
    async with RuntimeClient(ring_daemon.url) as client:
        assert await client.remote(t.add, 1, 1) == 2
        inline.clear()
        for _ in range(8):
            assert await client.remote(t.echo, data) == data
        ring_of(client)
    assert max(inline, default=0) < 64 * 1024, sorted(inline)[-4:]
