"""A frame-wire Namespace stream with an untrusted peer (docs/DIRECT-CALLS.md,
stage 8): with ``AGENTIX_CALLS_DIRECT=auto`` (the default) the host asks that
its Namespace streams be served by the worker (HELLO ``agentix-direct: 1``),
so their peer may be user code, as a Calls connection's may. Descriptors it
sends are never received; its STATUS 16 never touches the token; a frame it
forges ends the stream, and the next emit opens it again, never a hang.

Against fake_frames.FrameServer, whose ``hostile`` hook replaces the next
response frame (here: a NamespaceResponse carrying the fake's event) with the
peer's bytes.
"""

import asyncio
import struct

import pytest

from agentix import AsyncClientNamespace, RuntimeClient
from agentix.runtime.client import frames
from agentix.runtime.client.hello import DIRECT_KEY
from agentix.runtime.client.namespaces import FrameNamespaceStream
from agentix.runtime.shared.codec import pack
from agentix.runtime.v1 import runtime_pb2 as pb
from fake_frames import MESSAGE, descriptors_with_next_response, encode, keep, unauthenticated
from fake_runtime import eventually

pytestmark = pytest.mark.asyncio
BOUND_S = 30  # every case settles well within this, a loaded 2-core machine included


@pytest.fixture(autouse=True)
def _default_wire(monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "auto")
    monkeypatch.delenv("AGENTIX_CALLS_DIRECT", raising=False)
    monkeypatch.delenv("AGENTIX_NATIVE_TRANSPORT", raising=False)


class Recorder(AsyncClientNamespace):
    def __init__(self):
        super().__init__("/plug")
        self.seen = []

    def on_connect(self):
        self.seen.append("connect")

    def on_disconnect(self):
        self.seen.append("disconnect")

    def on_tick(self, data):
        self.seen.append(("tick", data))


def tick(i: int) -> pb.NamespaceEvent:
    return pb.NamespaceEvent(event="tick", data=pack(i))


def namespace_hellos(framed) -> list[dict[str, str]]:
    return [h for h in framed.frames.hellos if h.get("agentix-stream") == "namespace"]


@pytest.mark.parametrize("setting, sent", [("", True), ("auto", True), ("off", False)])
async def test_agentix_calls_direct_decides_the_key_on_namespace_streams_too(framed, monkeypatch, setting, sent):
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", setting)
    ns = Recorder()
    client = RuntimeClient(framed.url, logs=False, traces=False)
    client.register_namespace(ns)
    async with client:
        assert type(client._namespace_streams["/plug"]) is FrameNamespaceStream
    (hello,) = namespace_hellos(framed)
    assert (hello.get(DIRECT_KEY) == "1") is sent
    assert sent or DIRECT_KEY not in hello


async def test_descriptors_a_namespace_peer_sends_are_never_received_and_the_stream_goes_on(framed):
    sent = 64
    ns = Recorder()
    client = RuntimeClient(framed.url, logs=False, traces=False)
    client.register_namespace(ns)
    async with client:
        await eventually(lambda: ns.seen == ["connect"])
        with descriptors_with_next_response(framed.frames, sent):  # the event comes with them
            framed.emit_namespace("/plug", tick(1))
            await asyncio.wait_for(eventually(lambda: ("tick", 1) in ns.seen), BOUND_S)
        framed.emit_namespace("/plug", tick(2))
        await asyncio.wait_for(eventually(lambda: ("tick", 2) in ns.seen), BOUND_S)
    assert ns.seen[:3] == ["connect", ("tick", 1), ("tick", 2)]
    assert len(namespace_hellos(framed)) == 1  # the same stream, unharmed


async def test_status_16_from_a_namespace_peer_reopens_with_the_same_token(framed):
    ns = Recorder()
    client = RuntimeClient(framed.url, token="s3cret", logs=False, traces=False, reconnection_delay=0.05)
    client.register_namespace(ns)
    async with client:
        metadata = client._metadata
        framed.frames.hostile = unauthenticated
        framed.emit_namespace("/plug", tick(1))
        await asyncio.wait_for(eventually(lambda: "disconnect" in ns.seen), BOUND_S)
        # The next emit opens the stream again, with the same credentials.
        await asyncio.wait_for(ns.emit("config", {"k": 1}), BOUND_S)
        await asyncio.wait_for(eventually(lambda: framed.namespace_events.get("/plug")), BOUND_S)
        assert client._metadata is metadata
    first, second = namespace_hellos(framed)
    assert first["authorization"] == second["authorization"] == "Bearer s3cret"
    assert ("tick", 1) not in ns.seen


@pytest.mark.parametrize(
    "forged",
    [
        struct.pack("<IB", 0xFFFFFFFF, MESSAGE),  # 4 GiB promised: decided from the header
        encode(9, b"?"),  # an unknown kind
        encode(3),  # HALF_CLOSE: a host's
        struct.pack("<IB", frames.MAX_PAYLOAD + 1, 4),  # a STATUS over the limit
    ],
    ids=["huge-length", "unknown-kind", "half-close", "status-over-limit"],
)
async def test_a_forged_frame_ends_the_namespace_stream_and_the_next_emit_reopens_it(framed, forged):
    ns = Recorder()
    client = RuntimeClient(framed.url, logs=False, traces=False, reconnection_delay=0.05)
    client.register_namespace(ns)
    async with client:
        framed.frames.hostile = keep(forged)  # and stays connected: the host must end it
        framed.emit_namespace("/plug", tick(1))
        await asyncio.wait_for(eventually(lambda: "disconnect" in ns.seen), BOUND_S)
        await asyncio.wait_for(ns.emit("config", {"k": 2}), BOUND_S)
        await asyncio.wait_for(eventually(lambda: framed.namespace_events.get("/plug")), BOUND_S)
        framed.emit_namespace("/plug", tick(3))
        await asyncio.wait_for(eventually(lambda: ("tick", 3) in ns.seen), BOUND_S)
    assert ("tick", 1) not in ns.seen
    assert len(namespace_hellos(framed)) == 2  # one reopen
