"""The native Calls transport (``agentix.runtime.client._native_calls``) on its
own, against a grpc.aio server that handles the Calls method with raw bytes."""

import asyncio
import gc

import grpc
import pytest
import pytest_asyncio

from agentix.runtime.client import _native_calls as native
from agentix.runtime.client import wire
from agentix.runtime.client.stream import NativeStreamError

pytestmark = pytest.mark.asyncio

_SERVICE = "agentix.runtime.v1.RuntimeService"


class RawCalls:
    """Answers each request message with `reply(message)` (None: no answer);
    records messages, metadata and whether the host half-closed."""

    def __init__(self, reply=lambda message: message, abort=None):
        self.reply = reply
        self.abort = abort
        self.messages: list[bytes] = []
        self.metadata: list[tuple] = []
        self.half_closed = asyncio.Event()

    async def calls(self, request_iterator, context):
        self.metadata.append(tuple(context.invocation_metadata()))
        if self.abort is not None:
            await context.abort(*self.abort)
        async for message in request_iterator:
            self.messages.append(message)
            answer = self.reply(message)
            if answer is not None:
                await context.write(answer)
        self.half_closed.set()


@pytest_asyncio.fixture
async def server():
    servers = []

    async def start(handler: RawCalls) -> str:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    _SERVICE, {"Calls": grpc.stream_stream_rpc_method_handler(handler.calls)}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        await server.stop(None)


async def drain_until(transport, predicate, timeout=5.0):
    """drain()s whenever the eventfd is readable until predicate(messages,
    status, below) holds for what was drained so far."""
    loop = asyncio.get_running_loop()
    messages, status, below = [], None, False
    deadline = loop.time() + timeout
    ready = asyncio.Event()
    loop.add_reader(transport.fileno(), ready.set)
    try:
        while True:
            got, got_status, got_below = transport.drain()
            messages += got
            status = status or got_status
            below = below or got_below
            if predicate(messages, status, below):
                return messages, status, below
            ready.clear()
            await asyncio.wait_for(ready.wait(), max(0.0, deadline - loop.time()))
    finally:
        loop.remove_reader(transport.fileno())


async def test_messages_round_trip(server):
    url = await server(RawCalls())
    transport = native.CallsTransport(native.Channel(url), [])
    assert transport.write(b"\x0a\x02hi") >= 0
    assert transport.write([b"\x0a", memoryview(b"\x01x"), bytearray(b"")]) >= 0
    messages, status, _ = await drain_until(transport, lambda m, s, b: len(b"".join(m)) >= 7)
    assert b"".join(messages) == b"\x0a\x02hi\x0a\x01x"
    assert status is None
    transport.close()


async def test_metadata_is_sent(server):
    handler = RawCalls()
    url = await server(handler)
    transport = native.CallsTransport(native.Channel(url), [("authorization", "Bearer t0k")])
    transport.write(b"")
    await drain_until(transport, lambda m, s, b: m)
    assert ("authorization", "Bearer t0k") in handler.metadata[0]
    transport.close()


async def test_writes_queued_meanwhile_are_joined_into_fewer_messages(server):
    # Joining is opportunistic: only writes queued while another is in flight
    # join it. A slow interpreter (under ASan) can let every write finish
    # before the next arrives, so a few streams are tried; the bytes must
    # be exact on every one, and at least one must have been joined.
    sent = [wire.request_event(b"\x1a\x00")[0] + b"\x1a\x00" for _ in range(300)]
    joined = []
    for _ in range(5):
        handler = RawCalls(reply=lambda message: None)
        url = await server(handler)
        transport = native.CallsTransport(native.Channel(url), [])
        for message in sent:
            transport.write(message)
        transport.writes_done()
        _, status, _ = await drain_until(transport, lambda m, s, b: s is not None)
        transport.close()
        assert status == (0, "")
        assert handler.half_closed.is_set()
        assert b"".join(handler.messages) == b"".join(sent)
        joined.append(len(handler.messages) < len(sent))
        if joined[-1]:
            break
    assert any(joined), "no stream joined any queued writes"


async def test_writes_done_ends_the_stream_after_the_queued_writes(server):
    handler = RawCalls(reply=lambda message: None)
    url = await server(handler)
    transport = native.CallsTransport(native.Channel(url), [])
    big = b"\x0a" + bytes(3 << 20)  # raw bytes to this server (under its 4 MiB limit)
    transport.write(big)
    transport.writes_done()
    assert transport.write(b"late") == -1  # no writes after the half-close
    transport.notify_below(0)
    _, status, below = await drain_until(transport, lambda m, s, b: s is not None and b)
    assert status == (0, "")
    assert handler.messages == [big]
    assert transport.pending() == 0
    transport.close()


async def test_notify_below_fires_once_the_writes_are_written(server):
    url = await server(RawCalls(reply=lambda message: None))
    transport = native.CallsTransport(native.Channel(url), [])
    for _ in range(4):
        transport.write(bytes(1 << 20))
    assert transport.pending() > 0
    transport.notify_below(0)
    await drain_until(transport, lambda m, s, b: b)
    assert transport.pending() == 0
    transport.close()


async def test_a_failed_rpc_reports_its_status(server):
    url = await server(RawCalls(abort=(grpc.StatusCode.UNAUTHENTICATED, "bad token")))
    transport = native.CallsTransport(native.Channel(url), [])
    transport.write(b"")
    _, status, _ = await drain_until(transport, lambda m, s, b: s is not None)
    assert status == (grpc.StatusCode.UNAUTHENTICATED.value[0], "bad token")
    assert transport.write(b"x") == -1
    error = NativeStreamError(*status)
    assert error.code() is grpc.StatusCode.UNAUTHENTICATED and error.details() == "bad token"
    transport.close()


async def test_an_unreachable_target_reports_unavailable():
    transport = native.CallsTransport(native.Channel("127.0.0.1:1"), [])
    transport.write(b"x")
    _, status, _ = await drain_until(transport, lambda m, s, b: s is not None)
    assert status[0] == grpc.StatusCode.UNAVAILABLE.value[0]
    transport.close()


async def test_cancel_ends_the_stream_with_cancelled(server):
    url = await server(RawCalls())
    transport = native.CallsTransport(native.Channel(url), [])
    transport.write(b"\x0a\x00")
    await drain_until(transport, lambda m, s, b: m)
    transport.cancel()
    _, status, _ = await drain_until(transport, lambda m, s, b: s is not None)
    assert status[0] == grpc.StatusCode.CANCELLED.value[0]
    transport.close()


async def test_closed_transport_refuses_use_and_close_is_idempotent(server):
    url = await server(RawCalls())
    transport = native.CallsTransport(native.Channel(url), [])
    transport.close()
    transport.close()
    transport.cancel()  # harmless
    for method, args in ((transport.write, (b"x",)), (transport.drain, ()), (transport.fileno, ()),
                         (transport.pending, ()), (transport.writes_done, ()), (transport.notify_below, (0,))):
        with pytest.raises(ValueError):
            method(*args)


async def test_bad_arguments_raise_python_errors():
    with pytest.raises(TypeError):
        native.Channel("127.0.0.1:1", None, [("grpc.some_option", 1.5)])
    with pytest.raises(TypeError):
        native.Channel("127.0.0.1:1", ("not bytes", None, None))
    with pytest.raises(TypeError):
        native.CallsTransport("not a channel", [])
    channel = native.Channel("127.0.0.1:1")
    with pytest.raises(TypeError):
        native.CallsTransport(channel, [("key",)])
    transport = native.CallsTransport(channel, [])
    with pytest.raises(TypeError):
        transport.write(12)
    with pytest.raises(TypeError):
        transport.write([b"ok", 12])
    with pytest.raises(ValueError):
        transport.notify_below(-1)
    transport.close()


async def test_many_streams_come_and_go(server):
    """Transports and channels dropped in any order, with the stream still
    open or already finished, neither crash nor leak their eventfds."""
    url = await server(RawCalls())
    import os

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    for round_ in range(30):
        channel = native.Channel(url, None, [("grpc.use_local_subchannel_pool", 1)])
        transport = native.CallsTransport(channel, [])
        transport.write(b"\x0a\x00")
        if round_ % 3 == 0:
            await drain_until(transport, lambda m, s, b: m)
        if round_ % 2 == 0:
            del channel  # the stream keeps the channel alive
            transport.cancel()
            await drain_until(transport, lambda m, s, b: s is not None)
        del transport
        gc.collect()
    # gRPC closes dropped connections on its own threads (and the in-process
    # server notices them later): on a loaded machine that takes a while. A
    # leak never drops back, so wait for it, bounded.
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        await asyncio.sleep(0.2)
        native.CallsTransport(native.Channel("127.0.0.1:1"), []).close()  # reaps what finished meanwhile
        if open_fds() - before < 10 or asyncio.get_running_loop().time() > deadline:
            break
    assert open_fds() - before < 10
