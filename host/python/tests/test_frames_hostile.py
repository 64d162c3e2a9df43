"""The frame wire's Calls connection with an untrusted peer (docs/DIRECT-CALLS.md,
"Security"): a host that asks for direct calls (``AGENTIX_CALLS_DIRECT``,
HELLO ``agentix-direct: 1``) may find the worker — user code — at the other
end. Every frame it could forge ends in a typed error or a reconnect, within
a bounded time and with bounded memory; file descriptors it sends are never
received; no STATUS touches the host's token.

Against fake_frames.FrameServer, whose ``hostile`` hook replaces one response
frame with a hostile peer's bytes, or a bare socketpair for the payload ring.
"""

import array
import asyncio
import os
import socket
import struct

import grpc
import pytest
from google.protobuf.message import DecodeError

import sandbox_functions
from agentix import AsyncClientNamespace, RuntimeClient, RuntimeUnreachable
from agentix.runtime.client import frames
from agentix.runtime.client.frames import FrameCallsStream, FrameTransport
from agentix.runtime.client.hello import DIRECT_KEY
from agentix.runtime.client.payload_ring import PayloadRing
from agentix.runtime.client.stream import NativeStreamError
from fake_frames import (HELLO, MESSAGE, STATUS, descriptors_with_next_response, encode, encode_hello,
                         keep, unauthenticated)

pytestmark = pytest.mark.asyncio
RING_MESSAGE = 5
# Every case must settle well within this (a loaded 2-core machine included).
BOUND_S = 30


@pytest.fixture(autouse=True)
def _default_wire(monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "auto")
    monkeypatch.delenv("AGENTIX_CALLS_DIRECT", raising=False)
    monkeypatch.delenv("AGENTIX_NATIVE_TRANSPORT", raising=False)


def watched(client: RuntimeClient) -> list:
    """The errors the client's Calls streams are lost with, in order (the
    client still reconnects as it would); before the client connects."""
    lost, on_lost = [], client._stream_lost

    def record(stream, error):
        lost.append(error)
        on_lost(stream, error)

    client._stream_lost = record
    return lost


# --- the HELLO key --------------------------------------------------------


async def test_calls_connections_and_namespace_streams_ask_for_direct_by_default(framed):
    client = RuntimeClient(framed.url, token="s3cret")
    client.register_namespace(AsyncClientNamespace("/plug"))
    async with client:
        assert await client.remote(sandbox_functions.add, 2, 3) == 5
    calls = [h for h in framed.frames.hellos if "agentix-stream" not in h]
    namespace = [h for h in framed.frames.hellos if h.get("agentix-stream") == "namespace"]
    assert len(calls) == 1 and len(namespace) == 1
    assert calls[0][DIRECT_KEY] == "1"
    assert namespace[0][DIRECT_KEY] == "1"  # stage 8's ask (test_namespace_hostile.py)


@pytest.mark.parametrize("setting, sent", [("", True), ("auto", True), (" AUTO ", True), ("off", False), ("OFF", False)])
async def test_agentix_calls_direct_decides_the_key(framed, monkeypatch, setting, sent):
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", setting)
    async with RuntimeClient(framed.url) as client:
        assert await client.remote(sandbox_functions.add, 1, 1) == 2
        assert type(client._stream) is FrameCallsStream
    (hello,) = framed.frames.hellos
    assert (hello.get(DIRECT_KEY) == "1") is sent
    assert sent or DIRECT_KEY not in hello


@pytest.mark.parametrize("wire", ["auto", "grpc"])
async def test_a_bad_agentix_calls_direct_is_a_clear_error_on_any_wire(framed, monkeypatch, wire):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", wire)
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "on")
    with pytest.raises(ValueError, match=r"AGENTIX_CALLS_DIRECT='on' is not one of auto, off"):
        async with RuntimeClient(framed.url, logs=False, traces=False):
            pass
    assert framed.frames.hellos == []


# --- no ancillary data ----------------------------------------------------


async def test_descriptors_a_peer_sends_are_never_received_and_the_call_still_works(framed):
    sent = 64
    client = RuntimeClient(framed.url)
    lost = watched(client)  # before the first stream takes its on_lost
    async with client:
        assert await client.remote(sandbox_functions.add, 0, 0) == 0  # everything opened
        with descriptors_with_next_response(framed.frames, sent):  # the result comes with them
            assert await asyncio.wait_for(client.remote(sandbox_functions.add, 2, 3), BOUND_S) == 5
        assert lost == [] and len(framed.frames.hellos) == 1  # the same stream, unharmed


# --- STATUS never touches the token ---------------------------------------


async def test_status_16_from_the_peer_reconnects_with_the_same_token(framed):
    client = RuntimeClient(framed.url, token="s3cret", reconnection_delay=0.05)
    lost = watched(client)  # before the first stream takes its on_lost
    async with client:
        metadata = client._metadata
        framed.frames.hostile = unauthenticated
        assert await asyncio.wait_for(client.remote(sandbox_functions.add, 2, 3), BOUND_S) == 5
        assert client._metadata is metadata
    (error,) = lost
    assert type(error) is NativeStreamError and error.code() == grpc.StatusCode.UNAUTHENTICATED
    first, second = framed.frames.hellos
    assert first["authorization"] == second["authorization"] == "Bearer s3cret"


# --- hostile frames: a typed error or a reconnect, never a hang -----------


def then_close(data: bytes):
    """A peer that writes `data` instead of the response, then closes."""

    def send(sock: socket.socket, response: bytes) -> bool:
        sock.sendall(data)
        return False

    return send


def truncated(sock: socket.socket, response: bytes) -> bool:
    sock.sendall(response[:-3])
    return False


HUGE_STATUS = struct.pack("<I", 13) + b"x" * (frames.MAX_PAYLOAD - 4)


@pytest.mark.parametrize(
    "peer, code, details",
    [
        # Decided from the header: nothing of the 4 GiB is awaited or allocated.
        (keep(struct.pack("<IB", 0xFFFFFFFF, MESSAGE)), grpc.StatusCode.INTERNAL, "frame of 4294967295 bytes"),
        (keep(struct.pack("<IB", frames.MAX_PAYLOAD + 1, STATUS)), grpc.StatusCode.INTERNAL, "bytes"),
        (keep(encode(9, b"?")), grpc.StatusCode.INTERNAL, "kind 9"),
        (keep(encode(3)), grpc.StatusCode.INTERNAL, "kind 3"),  # HALF_CLOSE: a host's
        # The peer never said it maps the ring (it was never sent the memfd): its pieces are still checked.
        (keep(encode(RING_MESSAGE, struct.pack("<HIQQ", 1, 0, 0, 1 << 40) + b"x")), grpc.StatusCode.INTERNAL,
         "RING_MESSAGE of"),
        (truncated, grpc.StatusCode.UNAVAILABLE, "without a status"),
        # A whole frame's length promised, then EOF: at most MAX_PAYLOAD buffered.
        (then_close(struct.pack("<IB", frames.MAX_PAYLOAD, MESSAGE) + b"abc"), grpc.StatusCode.UNAVAILABLE,
         "without a status"),
        (keep(encode(STATUS, b"\x01")), grpc.StatusCode.INTERNAL, "kind 4"),  # shorter than its code
        (keep(encode(STATUS, struct.pack("<I", 1 << 31) + b"odd")), grpc.StatusCode.UNKNOWN, "odd"),
        (keep(encode(STATUS, HUGE_STATUS)), grpc.StatusCode.INTERNAL, "xxxx"),
    ],
    ids=["huge-length", "status-over-limit", "unknown-kind", "half-close", "ring-piece", "truncated-eof",
         "promised-eof", "short-status", "status-code-out-of-range", "huge-status"],
)
async def test_a_hostile_frame_fails_the_stream_and_the_call_is_resumed(framed, peer, code, details):
    client = RuntimeClient(framed.url, reconnection_delay=0.05)
    lost = watched(client)  # before the first stream takes its on_lost
    async with client:
        framed.frames.hostile = peer
        assert await asyncio.wait_for(client.remote(sandbox_functions.add, 2, 3), BOUND_S) == 5
        assert type(client._stream) is FrameCallsStream
    (error,) = lost
    assert type(error) is NativeStreamError and error.code() == code and details in error.details(), error
    assert len(error.details()) <= frames.MAX_PAYLOAD
    assert len(framed.frames.hellos) == 2  # one reconnect, then the call's re-sent start ran


async def test_a_malformed_response_fails_the_pending_calls_and_the_next_call_reconnects(framed):
    # Not resumed: a daemon would replay the same bytes into the same failure (routing.py,
    # `_routing_failed`); the next stream cancels and acknowledges those calls.
    client = RuntimeClient(framed.url, reconnection_delay=0.05)
    lost = watched(client)  # before the first stream takes its on_lost
    async with client:
        framed.frames.hostile = keep(encode(MESSAGE, b"\xff\xff\xff\xff"))
        with pytest.raises(RuntimeUnreachable, match="dropped by the host.*DecodeError") as info:
            await asyncio.wait_for(client.remote(sandbox_functions.add, 2, 3), BOUND_S)
        assert type(info.value.__cause__) is DecodeError
        assert await asyncio.wait_for(client.remote(sandbox_functions.add, 3, 4), BOUND_S) == 7
    (error,) = lost
    assert type(error) is DecodeError
    assert len(framed.frames.hellos) == 2


@pytest.mark.parametrize(
    "hello",
    [
        b"\x05\x00ab",  # a truncated pair
        b"\xff\xff" + b"k" * 10,  # a key longer than the payload
        encode_hello({"agentix-calls-cpu": "\u2603" * 1000, "unknown": "x"}),
        encode_hello({}) + b"\x00",
    ],
    ids=["truncated-pair", "long-key", "garbage-values", "stray-byte"],
)
async def test_a_garbage_hello_answer_is_ignored_and_the_stream_goes_on(framed, hello):
    client = RuntimeClient(framed.url)
    lost = watched(client)  # before the first stream takes its on_lost
    async with client:

        def answer_then_respond(sock: socket.socket, response: bytes) -> bool:
            sock.sendall(encode(HELLO, hello) + response)
            return True

        framed.frames.hostile = answer_then_respond
        assert await asyncio.wait_for(client.remote(sandbox_functions.add, 2, 3), BOUND_S) == 5
        assert await client.remote(sandbox_functions.add, 3, 4) == 7
    assert lost == [] and len(framed.frames.hellos) == 1


# --- RING_MESSAGE pieces outside the ring ---------------------------------


@pytest.mark.parametrize(
    "head, why",
    [
        (struct.pack("<HIQQ", 1, 0, (1 << 64) - 1, 16), "outside"),  # past the ring's end
        (struct.pack("<HIQQ", 1, 0, 0, (1 << 64) - 1), "RING_MESSAGE of"),  # longer than any message
        (struct.pack("<HIQQ", 1, 0, 0, (1 << 20) + 1), "outside"),  # longer than the ring
        (struct.pack("<HIQQ", 1, 0, 3 * (1 << 20) - 8, 16), "outside"),  # across the ring's end, a lap on
        (struct.pack("<HIQQ", 1, 0xFFFFFFFF, 0, 16), "out of order"),  # placed past the bytes
        (struct.pack("<H", 0xFFFF) + b"\0" * 20, ""),  # more pieces than the head holds
        (struct.pack("<H", 1) + b"\0" * 7, ""),  # a truncated head
    ],
    ids=["pos-wraps", "size-huge", "size-over-ring", "across-the-end", "at-past-bytes", "count-huge", "head-truncated"],
)
async def test_ring_pieces_out_of_bounds_fail_the_stream(head, why):
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    transport = FrameTransport(ours, (), PayloadRing(1 << 20))
    try:
        theirs.settimeout(5)
        _, ancillary, _, _ = theirs.recvmsg(4096, socket.CMSG_SPACE(4))  # HELLO with the memfd
        for _, _, raw in ancillary:
            for fd in array.array("i", raw):
                os.close(fd)
        theirs.sendall(encode(RING_MESSAGE, b"\0\0") + encode(RING_MESSAGE, head + b"bytes"))
        status = None
        for _ in range(100):  # each drain reads what is there; both frames are
            messages, status, _ = transport.drain()
            assert messages == []
            if status is not None:
                break
        assert status is not None and status[0] == 13 and why in status[1], status
    finally:
        transport.close()
        theirs.close()
