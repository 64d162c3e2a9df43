"""The Calls stream on the daemon's frame wire (agentix.runtime.client.frames):
frames and HELLO as the spec says, pipelining, STATUS and EOF, partial
writes, chunked uploads, and when the client uses it or falls back to gRPC.

The whole of test_client.py also runs on the frame wire (its
``calls_transport`` "frames"); these are the frame wire's own cases, against
fake_frames.FrameServer or a bare socket server written here.
"""

import asyncio
import os
import pickle
import socket
import struct
import sys
import tempfile

import grpc
import pytest
import pytest_asyncio

import sandbox_functions
from agentix import AsyncClientNamespace, RuntimeClient, RuntimeUnreachable
from agentix.runtime.client import frames
from agentix.runtime.client.frames import FrameCallsStream, FrameTransport
from agentix.runtime.client.namespaces import NAMESPACE_METHOD
from agentix.runtime.client.stream import CallsStream, NativeCallsStream, NativeStreamError
from agentix.runtime.v1 import runtime_pb2 as pb
from fake_frames import HALF_CLOSE, HELLO, MESSAGE, STATUS, FrameServer, decode_hello, encode, read_frame, status_frame
from fake_runtime import FakeRuntime, eventually, serve

pytestmark = pytest.mark.asyncio
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _default_wire(monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "auto")
    monkeypatch.delenv("AGENTIX_CALLS_DIRECT", raising=False)
    monkeypatch.delenv("AGENTIX_NATIVE_TRANSPORT", raising=False)


@pytest.fixture
def sock_dir():
    with tempfile.TemporaryDirectory(prefix="agx-fw-", dir="/tmp") as directory:
        yield directory


@pytest_asyncio.fixture
async def grpc_only(sock_dir):
    """A FakeRuntime on a Unix socket without a frame wire (``.url``, ``.path``)."""
    fake = FakeRuntime()
    fake.path = os.path.join(sock_dir, "runtime.sock")
    fake.url = f"unix://{fake.path}"
    server, _ = await serve(fake, fake.url)
    yield fake
    await server.stop(None)


@pytest_asyncio.fixture
async def framed(grpc_only):
    """The same, with its Calls also on ``PATH.calls`` (``.frames``)."""
    grpc_only.frames = await FrameServer(grpc_only, grpc_only.path + ".calls").start()
    yield grpc_only
    await grpc_only.frames.stop()


async def stream_type(url: str, **options) -> type:
    async with RuntimeClient(url, **options) as client:
        assert await client.remote(sandbox_functions.add, 2, 3) == 5
        return type(client._stream)


# --- frames --------------------------------------------------------------


async def test_frames_and_hello_encode_as_the_spec_says():
    assert frames.frame(frames.MESSAGE, b"abc") == b"\x03\x00\x00\x00\x02abc"
    assert frames.frame(frames.HALF_CLOSE) == b"\x00\x00\x00\x00\x03"
    assert (frames.HELLO, frames.MESSAGE, frames.HALF_CLOSE, frames.STATUS) == (HELLO, MESSAGE, HALF_CLOSE, STATUS)
    metadata = (("authorization", "Bearer tøken"), ("agentix-client-id", "c" * 32))
    payload = frames.encode_hello(metadata)
    assert payload[:2] == struct.pack("<H", len("authorization"))
    assert decode_hello(payload) == dict(metadata)
    assert frames.encode_hello(()) == b""


async def test_the_reader_reassembles_frames_however_the_bytes_arrive():
    # Small messages, one longer than the read buffer, an empty one, then the
    # status, written in pieces that split headers and payloads anywhere.
    messages = [b"m1", os.urandom(700 * 1024), b"", pb.CallsResponse().SerializeToString() + b"x" * 300]
    data = b"".join(encode(MESSAGE, m) for m in messages) + status_frame(9, "done: ✓")
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    transport = FrameTransport(ours, (("k", "v"),))
    theirs.settimeout(5)
    hello = theirs.recv(64)
    assert hello == encode(HELLO, frames.encode_hello((("k", "v"),)))
    received, status = [], None
    try:
        for cut in range(0, len(data), 99_991):
            theirs.sendall(data[cut : cut + 99_991])
            got, status, _ = transport.drain()
            received += [bytes(m) for m in got]
        assert received == messages
        assert status == (9, "done: ✓")
    finally:
        transport.close()
        theirs.close()


async def test_the_reader_takes_a_lone_whole_message_and_leaves_other_frames_to_the_parser():
    # One whole MESSAGE per read into an empty buffer (a sequential call's result) is taken
    # without the parser; a frame of another kind, or more or less than one frame, is not.
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    transport = FrameTransport(ours, ())
    theirs.settimeout(5)
    theirs.recv(64)  # the HELLO
    try:
        reads = [
            (encode(MESSAGE, b"one"), [b"one"], None),
            (encode(MESSAGE, b""), [b""], None),
            (encode(MESSAGE, b"two") + encode(MESSAGE, b"three")[:6], [b"two"], None),
            (encode(MESSAGE, b"three")[6:], [b"three"], None),
            (encode(frames.RING_MESSAGE, b"\0\0"), [], (13, "frame wire: the daemon sent a RING_MESSAGE unasked")),
        ]
        for data, messages, status in reads:
            theirs.sendall(data)  # (readable at once on a socketpair)
            got, got_status, _ = transport.drain()
            assert [bytes(m) for m in got] == messages and got_status == status
    finally:
        transport.close()
        theirs.close()


async def test_a_daemons_hello_steers_the_pinned_waits_that_asked(monkeypatch):
    payload = frames.encode_hello((("agentix-calls-cpu", "off"), ("other", "x")))
    assert frames.decode_hello(payload) == [("agentix-calls-cpu", "off"), ("other", "x")]
    assert frames.decode_hello(payload[:-1]) == [("agentix-calls-cpu", "off")]  # truncated: dropped
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    transport = FrameTransport(ours, ())
    told = []
    transport.told = told.append
    try:
        theirs.sendall(encode(HELLO, payload) + encode(MESSAGE, b"m"))
        got, status, _ = transport.drain()
        assert [bytes(m) for m in got] == [b"m"] and status is None
        assert told == [False]
        theirs.sendall(encode(HELLO, frames.encode_hello((("agentix-calls-cpu", "wait"),))))
        transport.drain()
        assert told == [False, True]
        transport.told = None  # a host that did not ask ignores it
        theirs.sendall(encode(HELLO, payload))
        got, status, _ = transport.drain()
        assert status is None
    finally:
        transport.close()
        theirs.close()


async def test_whole_frames_go_out_in_order_behind_what_waits_and_not_after_the_end():
    # A sequential call's frame (write_frame) written while a large message is still
    # waiting for the socket goes after it; once the daemon ended the stream, nothing is sent.
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    transport = FrameTransport(ours, ())
    theirs.settimeout(5)
    try:
        assert theirs.recv(64) == encode(HELLO, b"")
        assert transport.write_frame(encode(MESSAGE, b"first")) == 0
        large = os.urandom(1 << 20)
        assert transport.write([large]) > 0  # the rest waits for the socket
        assert transport.write_frame(encode(MESSAGE, b"second")) > 0  # queued behind it
        theirs.setblocking(False)
        received = bytearray()

        def read_all() -> bool:
            try:
                received.extend(theirs.recv(1 << 20))
            except BlockingIOError:
                pass
            return len(received) >= 3 * 5 + len(b"first") + len(large) + len(b"second")

        await eventually(read_all)
        assert received == encode(MESSAGE, b"first") + encode(MESSAGE, large) + encode(MESSAGE, b"second")
        theirs.sendall(status_frame(0, ""))
        await eventually(lambda: transport.drain()[1] == (0, ""))
        assert transport.write_frame(encode(MESSAGE, b"late")) == -1
    finally:
        transport.close()
        theirs.close()


async def test_only_the_default_setting_asks_the_daemon_whether_to_pin(framed, monkeypatch):
    monkeypatch.delenv("AGENTIX_CALLS_CPU", raising=False)
    assert await stream_type(framed.url) is FrameCallsStream
    assert framed.frames.hellos[-1].get("agentix-calls-cpu-follow") == "2"
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait")
    assert await stream_type(framed.url) is FrameCallsStream
    assert "agentix-calls-cpu-follow" not in framed.frames.hellos[-1]
    assert "agentix-calls-cpu" in framed.frames.hellos[-1]


async def test_long_frames_reuse_a_buffer_only_once_nothing_refers_to_its_bytes(monkeypatch):
    # Long frames (result chunks) are read into buffers that are reused, and
    # result chunks are memoryviews into them: a buffer must not be read
    # into again while a view of it is alive, whatever arrives next. (A 4 KiB
    # read buffer, so that several long frames fit in the socket at once.)
    monkeypatch.setattr(frames, "_READ_BYTES", 4096)
    payloads = [os.urandom(40 * 1024) for _ in range(4)]
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    transport = FrameTransport(ours, ())
    theirs.settimeout(5)
    theirs.recv(64)  # HELLO

    def receive(*sent: bytes) -> list:
        theirs.sendall(b"".join(encode(MESSAGE, payload) for payload in sent))
        got: list = []
        for _ in range(100):
            messages, status, _ = transport.drain()
            assert status is None
            got += messages
            if len(got) == len(sent):
                break
        assert [bytes(message) for message in got] == list(sent)
        return got

    try:
        (first,) = receive(payloads[0])
        buffer = first.obj
        held = first[100:]  # as a result chunk holds it
        del first
        # Two long frames read in one drain: the first is not parsed yet
        # (nobody holds a chunk of it) when the second arrives.
        second, second_again = receive(payloads[1], payloads[2])
        assert len({id(buffer), id(second.obj), id(second_again.obj)}) == 3
        assert held == payloads[0][100:]  # untouched by the frames after it
        assert bytes(second) == payloads[1]
        del held, second, second_again
        # Nothing refers to the first buffer's bytes now: it is read into
        # again (no new zero-filled buffer); a long frame following a long
        # frame, and a short one between them, still arrive intact.
        third, short, fourth = receive(payloads[3], b"short", payloads[0])
        assert third.obj is buffer
        assert bytes(short) == b"short"
        assert bytes(third) == payloads[3] and bytes(fourth) == payloads[0]
    finally:
        transport.close()
        theirs.close()


async def test_eof_without_status_is_unavailable_and_a_bad_frame_is_internal():
    for tail, code in ((b"", 14), (encode(7, b"?"), 13), (struct.pack("<IB", 64 << 20, MESSAGE), 13)):
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        transport = FrameTransport(ours, ())
        theirs.sendall(encode(MESSAGE, b"m") + tail)
        theirs.close()
        received, status = [], None
        while status is None:  # the loop would call drain() while the socket is readable
            messages, status, _ = transport.drain()
            received += [bytes(m) for m in messages]
        transport.close()
        assert received == [b"m"]
        assert status[0] == code, status


# --- against a frame-wire server ------------------------------------------


async def test_hello_carries_the_token_and_the_client_id(framed):
    client = RuntimeClient(framed.url, token="s3cret")
    async with client:
        assert await client.remote(sandbox_functions.add, 1, 2) == 3
        assert type(client._stream) is FrameCallsStream
    # (and shares the payload ring, which this fake daemon leaves unanswered: test_payload_ring.py)
    (hello,) = framed.frames.hellos
    # By default (pinned waits) it names the CPU its loop waits on.
    assert int(hello.pop("agentix-calls-cpu")) in os.sched_getaffinity(0)
    # and asks the daemon whether pinning its waits pays (--calls_cpu=probe), and
    # (AGENTIX_CALLS_DIRECT unset: auto) for direct calls (test_frames_hostile.py).
    assert hello == {"authorization": "Bearer s3cret", "agentix-client-id": client.client_id,
                     frames.PAYLOAD_RING_KEY: "1", "agentix-calls-cpu-follow": "2", "agentix-direct": "1"}
    # Every call went on the frame wire, none on gRPC's Calls.
    assert [s.callable for s in framed.events("start")] == ["sandbox_functions::add"]


async def bare_server(path: str, handler) -> asyncio.Server:
    return await asyncio.start_unix_server(handler, path)


async def test_messages_follow_the_hello_without_waiting_for_an_answer(grpc_only):
    got: asyncio.Future = asyncio.get_running_loop().create_future()

    async def silent(reader, writer):  # reads, never answers
        first = await read_frame(reader)
        second = await read_frame(reader)
        got.set_result((first, second))
        await asyncio.sleep(30)

    server = await bare_server(grpc_only.path + ".calls", silent)
    client = RuntimeClient(grpc_only.url, logs=False, traces=False)
    try:
        call = asyncio.create_task(client.remote(sandbox_functions.add, 4, 5))
        (kind, payload), (kind2, payload2) = await asyncio.wait_for(got, 10)
        hello = decode_hello(payload)
        assert int(hello.pop("agentix-calls-cpu")) in os.sched_getaffinity(0)
        assert kind == HELLO and hello == {
            "agentix-client-id": client.client_id,
            frames.PAYLOAD_RING_KEY: "1",
            "agentix-calls-cpu-follow": "2",
            "agentix-direct": "1",
        }
        assert kind2 == MESSAGE
        (event,) = pb.CallsRequest.FromString(payload2).events
        assert event.start.callable == "sandbox_functions::add"
        assert pickle.loads(event.start.arguments) == ((4, 5), {})
        call.cancel()
    finally:
        await client.close()
        server.close()


class _CountingLoop:
    """A stream's event loop, recording what the stream schedules with
    `call_soon` (everything else goes to the real loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._real = loop
        self.scheduled: list = []

    def call_soon(self, callback, *args):
        self.scheduled.append(callback)
        return self._real.call_soon(callback, *args)

    def __getattr__(self, name: str):
        return getattr(self._real, name)


async def test_a_lone_call_costs_no_loop_turn_and_a_burst_still_shares_one_message(framed):
    async with RuntimeClient(framed.url, logs=False, traces=False) as client:
        assert await client.remote(sandbox_functions.add, 0, 1) == 1
        stream = client._stream
        assert type(stream) is FrameCallsStream
        loop = stream._loop = _CountingLoop(stream._loop)
        # One call at a time: each StartCall is written at once and nothing
        # is left for a later loop iteration.
        for i in range(20):
            assert await client.remote(sandbox_functions.add, i, 1) == i + 1
        assert loop.scheduled == []
        # Five calls started in one iteration: the first goes at once, the
        # other four together in the next iteration (one deferred flush).
        framed.requests.clear()
        results = await asyncio.gather(*(client.remote(sandbox_functions.add, i, 2) for i in range(5)))
        assert results == [i + 2 for i in range(5)]
        starts = [
            sum(e.WhichOneof("kind") == "start" for e in request.events) for request in framed.requests
        ]
        assert [n for n in starts if n] == [1, 4]
        # One deferred flush for the burst, and one more if a read settled several of its
        # calls (their callers' next starts would have gone out together: none came).
        assert 1 <= len(loop.scheduled) <= 2
        assert all(callback == stream._end_deferral for callback in loop.scheduled)


async def test_a_sequential_callers_task_resumes_in_the_callback_that_read_its_result(framed):
    # No loop iteration between reading a call's result and returning it:
    # the caller's task is resumed by the stream's read callback itself
    # (with and without a call deadline's asyncio.timeout around the wait).
    async with RuntimeClient(framed.url, logs=False, traces=False) as client:
        for deadline in (None, 30.0):
            client.call_deadline = deadline
            assert await client.remote(sandbox_functions.add, 1, 2) == 3
            resumed_by = []
            frame = sys._getframe().f_back
            while frame is not None:
                resumed_by.append(frame.f_code.co_name)
                frame = frame.f_back
            # (A task woken by an asyncio Handle shows _run, _run_once here.)
            assert resumed_by[:3] == ["wake", "wake_all", "_on_readable"]
        # With other calls in flight a loop turn resumes many callers at
        # once, and each awaits a plain Future (cheaper to await).
        client.call_deadline = None
        first = asyncio.ensure_future(client.remote(sandbox_functions.add, 1, 1))
        await asyncio.sleep(0)
        assert len(client._pending) == 1
        assert await client.remote(sandbox_functions.add, 2, 2) == 4
        frame = sys._getframe().f_back
        assert [frame.f_code.co_name, frame.f_back.f_code.co_name] == ["_run", "_run_once"]
        assert await first == 2


async def test_a_status_frame_fails_the_stream_with_its_grpc_code(grpc_only):
    async def refuse(reader, writer):
        await read_frame(reader)
        writer.write(status_frame(16, "bad token"))
        await writer.drain()
        writer.close()

    server = await bare_server(grpc_only.path + ".calls", refuse)
    client = RuntimeClient(grpc_only.url, reconnection=False)
    try:
        with pytest.raises(RuntimeUnreachable, match="connection lost") as info:
            await asyncio.wait_for(client.remote(sandbox_functions.add, 1, 1), 10)
        cause = info.value.__cause__
        assert type(cause) is NativeStreamError and isinstance(cause, grpc.RpcError)
        assert cause.code() == grpc.StatusCode.UNAUTHENTICATED
        assert cause.details() == "bad token"
    finally:
        await client.close()
        server.close()


async def test_eof_without_status_reconnects_and_resumes_the_calls(framed):
    framed.frames.eof_instead_of_status = True
    async with RuntimeClient(framed.url) as client:
        task = asyncio.create_task(client.remote(sandbox_functions.sleep_forever))
        await eventually(lambda: framed.started)
        (call_id,) = framed.started
        framed.drop_streams()  # the frame server closes the socket, no STATUS
        await eventually(lambda: framed.events("resume"))
        assert list(framed.events("resume")[0].call_ids) == [call_id]
        assert len(framed.frames.hellos) == 2 and framed.streams_opened == 2
        assert not task.done()
        assert await client.remote(sandbox_functions.add, 3, 4) == 7
        assert type(client._stream) is FrameCallsStream
    with pytest.raises(RuntimeUnreachable, match="closed"):
        await task


async def test_a_large_upload_goes_in_chunks_through_a_tiny_send_buffer(framed, monkeypatch):
    # A 4 KiB SO_SNDBUF: nearly every write leaves bytes for loop.add_writer.
    connect = frames._connect

    def small_buffer(path):
        sock = connect(path)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return sock

    resumed = []
    on_writable = FrameTransport._on_writable

    def counting(self):
        resumed.append(1)
        on_writable(self)

    monkeypatch.setattr(frames, "_connect", small_buffer)
    monkeypatch.setattr(FrameTransport, "_on_writable", counting)
    data = os.urandom(6 * MiB + 123)
    async with RuntimeClient(framed.url) as client:
        big = asyncio.create_task(client.remote(sandbox_functions.length, data))
        small = [client.remote(sandbox_functions.add, i, 1) for i in range(20)]
        assert await asyncio.gather(*small) == [i + 1 for i in range(20)]
        assert await big == len(data)
        assert await client.remote(sandbox_functions.echo, data[: 3 * MiB]) == data[: 3 * MiB]
    assert len(resumed) > 10
    chunks = framed.events("argument_chunk")
    assert chunks and all(len(c.data) <= MiB for c in chunks)
    (start,) = [s for s in framed.events("start") if s.callable == "sandbox_functions::length"]
    assert start.arguments_size == len(pickle.dumps(((data,), {}), protocol=5))


# --- which wire -----------------------------------------------------------


async def test_grpc_when_the_daemon_has_no_frame_wire(grpc_only, monkeypatch):
    assert await stream_type(grpc_only.url) is NativeCallsStream
    # A socket file nobody listens on (ECONNREFUSED) is the same.
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(grpc_only.path + ".calls")
    try:
        assert await stream_type(grpc_only.url) is NativeCallsStream
        monkeypatch.setenv("AGENTIX_NATIVE_TRANSPORT", "0")
        assert await stream_type(grpc_only.url) is CallsStream
    finally:
        stale.close()


async def test_agentix_calls_wire_selects_the_wire(framed, monkeypatch):
    assert await stream_type(framed.url) is FrameCallsStream
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    assert await stream_type(framed.url) is FrameCallsStream
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "grpc")
    assert await stream_type(framed.url) is NativeCallsStream
    assert len(framed.frames.hellos) == 2
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "Auto ")
    assert await stream_type(framed.url) is FrameCallsStream
    monkeypatch.delenv("AGENTIX_CALLS_WIRE")  # the default: auto
    assert await stream_type(framed.url) is FrameCallsStream
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "fast")
    with pytest.raises(ValueError, match="AGENTIX_CALLS_WIRE='fast' is not one of auto, frames, grpc"):
        await stream_type(framed.url)


async def test_the_frame_wire_leaves_the_native_channel_unopened_until_needed(framed, monkeypatch):
    # Unused, its connection would make no authenticated RPC: the daemon's
    # connection guard counts it against the per-peer cap and shuts it down.
    async with RuntimeClient(framed.url) as client:
        assert await client.remote(sandbox_functions.add, 1, 2) == 3
        assert type(client._stream) is FrameCallsStream
        assert client._native.channel is None
        # Made on first use (a stream that falls back to the native transport).
        assert client._native.transport(client._metadata, NAMESPACE_METHOD) is not None
        assert client._native.channel is not None
    # A registered namespace rides the frame wire as well: still unopened.
    client = RuntimeClient(framed.url)
    client.register_namespace(AsyncClientNamespace("/plug"))
    await client.health()
    assert client._native.channel is None
    await client.close()
    # Made beside the probe (connecting while GetInfo runs) when the Calls
    # stream is on gRPC.
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "grpc")
    client = RuntimeClient(framed.url)
    await client.health()
    assert client._native.channel is not None
    await client.close()


async def test_frames_required_but_absent_is_a_clear_error(grpc_only, monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    with pytest.raises(RuntimeUnreachable) as info:
        await stream_type(grpc_only.url)
    message = str(info.value)
    assert f"frame wire {grpc_only.path}.calls cannot be reached (ENOENT" in message
    assert "AGENTIX_CALLS_WIRE=frames" in message
    # Not a unix:// target: no frame wire either.
    fake = FakeRuntime()
    server, port = await serve(fake, "127.0.0.1:0")
    try:
        with pytest.raises(RuntimeUnreachable, match="frames, but the frame wire cannot be used: the target is not"):
            await stream_type(f"127.0.0.1:{port}")
        monkeypatch.setenv("AGENTIX_CALLS_WIRE", "auto")
        assert await stream_type(f"127.0.0.1:{port}") is NativeCallsStream
    finally:
        await server.stop(None)


async def test_agentix_calls_cpu_pins_the_loop_thread_on_the_frame_wire(framed, monkeypatch):
    before = os.sched_getaffinity(0)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "auto")
    try:
        assert await stream_type(framed.url) is FrameCallsStream
        assert os.sched_getaffinity(0) == {max(before)}
        assert framed.frames.hellos[-1]["agentix-calls-cpu"] == str(max(before))
    finally:
        os.sched_setaffinity(0, before)

# --- Namespace streams on the frame wire ------------------------------------


async def namespace_stream_type(url: str, **options) -> tuple[type, RuntimeClient]:
    from agentix import AsyncClientNamespace

    client = RuntimeClient(url, **options)
    client.register_namespace(AsyncClientNamespace("/plug"))
    async with client:
        assert await client.remote(sandbox_functions.add, 2, 3) == 5
        return type(client._namespace_streams["/plug"]), client


async def test_a_namespace_stream_rides_the_frame_wire_when_calls_do(framed, monkeypatch):
    from agentix.runtime.client.namespaces import FrameNamespaceStream, NamespaceStream, NativeNamespaceStream

    kind, client = await namespace_stream_type(framed.url, token="s3cret")
    assert kind is FrameNamespaceStream
    # Its own connection, whose HELLO names the stream, carries the token and asks for direct.
    assert {"authorization": "Bearer s3cret", "agentix-client-id": client.client_id,
            "agentix-direct": "1", "agentix-stream": "namespace"} in framed.frames.hellos
    assert framed.namespaces_opened == 1
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "grpc")
    hellos = len(framed.frames.hellos)
    assert (await namespace_stream_type(framed.url))[0] is NativeNamespaceStream
    monkeypatch.setenv("AGENTIX_NATIVE_TRANSPORT", "0")
    assert (await namespace_stream_type(framed.url))[0] is NamespaceStream
    assert len(framed.frames.hellos) == hellos  # neither touched the frame wire


async def test_a_namespace_stream_uses_grpc_when_the_daemon_has_no_frame_wire(grpc_only):
    from agentix.runtime.client.namespaces import NativeNamespaceStream

    assert (await namespace_stream_type(grpc_only.url))[0] is NativeNamespaceStream


async def test_a_daemon_refusing_the_namespace_stream_fails_the_connect_clearly(sock_dir):
    # A frame wire that answers every namespace HELLO with STATUS 12 (a daemon
    # that does not know the stream): connecting reports the daemon's words.
    fake = FakeRuntime()
    path = os.path.join(sock_dir, "runtime.sock")
    server, _ = await serve(fake, f"unix://{path}")
    frames_server = await FrameServer(fake, path + ".calls").start()
    original = frames_server._serve

    async def refuse_namespaces(reader, writer):
        first = await read_frame(reader)
        if decode_hello(first[1]).get("agentix-stream") == "namespace":
            writer.write(status_frame(12, "no stream named 'namespace'"))
            writer.close()
            return
        # Not a namespace stream: hand the HELLO back to the real server.
        feed = asyncio.StreamReader()
        feed.feed_data(encode(HELLO, first[1]))

        async def pump():
            while data := await reader.read(65536):
                feed.feed_data(data)
            feed.feed_eof()

        pumping = asyncio.create_task(pump())
        try:
            await original(feed, writer)
        finally:
            pumping.cancel()

    frames_server._server.close()
    await frames_server._server.wait_closed()
    frames_server._server = await asyncio.start_unix_server(refuse_namespaces, path + ".calls")
    try:
        with pytest.raises(RuntimeUnreachable, match="UNIMPLEMENTED: no stream named 'namespace'"):
            await namespace_stream_type(f"unix://{path}")
    finally:
        await frames_server.stop()
        await server.stop(None)


async def test_sequential_calls_leave_no_ack_timer_and_the_last_ack_still_goes_out(framed):
    # Each call's ack rides ahead of the next call's StartCall, taken while the
    # read callback wakes the caller: no ack timer is armed for it (a timer in the
    # loop's heap costs every loop turn). The last call's ack, which no call
    # takes, is sent alone once ACK_DELAY has passed, as before.
    async with RuntimeClient(framed.url, logs=False, traces=False) as client:
        assert await client.remote(sandbox_functions.add, 0, 1) == 1
        stream = client._stream
        assert type(stream) is FrameCallsStream
        await eventually(lambda: len(framed.events("ack")) == 1)
        await asyncio.sleep(0.1)  # the first call's timer has fired
        for i in range(5):
            assert await client.remote(sandbox_functions.add, i, 1) == i + 1
            assert stream._ack_timer is None
        acked = [e.ack.call_id for r in framed.requests for e in r.events if e.WhichOneof("kind") == "ack"]
        starts = [start.call_id for start in framed.events("start")]
        assert len(starts) == 6 and acked == starts[:5]  # the first alone, then each ahead of a StartCall
        await asyncio.sleep(0)  # the read callback has returned: the last ack waits, with its timer
        assert stream._ack_timer is not None and stream._acks == [starts[5]]
        await eventually(lambda: [e.call_id for e in framed.events("ack")] == starts)
        assert stream._acks == []


@pytest.mark.parametrize("setting", ["", "1", "0"])
async def test_calls_settled_by_one_read_start_their_next_calls_in_one_write(framed, monkeypatch, setting):
    # Three callers whose results arrive in one message resume in the same loop turn; each
    # starts its next call at once. Coalesced (the default): the three StartCalls in one
    # request. AGENTIX_COALESCE_STARTS=0: the first alone, the other two in the next turn.
    monkeypatch.setenv("AGENTIX_COALESCE_STARTS", setting)
    gate = f"coalesce-{setting or 'default'}"
    async with RuntimeClient(framed.url, logs=False, traces=False) as client:
        assert await client.remote(sandbox_functions.add, 0, 1) == 1
        assert type(client._stream) is FrameCallsStream

        async def caller(i: int) -> int:
            await client.remote(sandbox_functions.gated, gate, i)
            return await client.remote(sandbox_functions.add, i, 10)

        callers = [asyncio.create_task(caller(i)) for i in range(3)]
        await eventually(lambda: len(framed.events("start")) == 4)
        framed.requests.clear()
        sandbox_functions.GATES.setdefault(gate, asyncio.Event()).set()
        assert await asyncio.gather(*callers) == [10, 11, 12]
        starts = [sum(e.WhichOneof("kind") == "start" for e in request.events) for request in framed.requests]
        assert [n for n in starts if n] == ([1, 2] if setting == "0" else [3])


async def test_a_bad_coalesce_starts_setting_is_a_clear_error(framed, monkeypatch):
    monkeypatch.setenv("AGENTIX_COALESCE_STARTS", "yes")
    with pytest.raises(ValueError, match="AGENTIX_COALESCE_STARTS must be 0 or 1"):
        async with RuntimeClient(framed.url, logs=False, traces=False) as client:
            await client.remote(sandbox_functions.add, 0, 1)
