"""A bare `RuntimeService.Calls` stream for tests that must send what the
host package never would (garbage arguments, unknown ids, no call_id), and
bare Logs / Traces subscriptions for tests of exactly what arrives."""

import asyncio

import grpc

from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc


class RawStream:
    def __init__(self, url, client_id=None):
        # Batched responses may exceed gRPC's 4 MiB default (the daemon
        # batches up to ~4 MiB of events, plus framing).
        self.channel = grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.stub = pb_grpc.RuntimeServiceStub(self.channel)
        # With a RuntimeClient's client_id it may resume that client's calls.
        self.call = self.stub.Calls(metadata=(("agentix-client-id", client_id),) if client_id else None)
        self.seen = {}  # call_id -> terminal event read while awaiting another

    async def send(self, *events):
        await self.call.write(pb.CallsRequest(events=list(events)))

    async def terminal(self, call_id, timeout=20):
        """Reads until the terminal event of `call_id`; returns it."""

        async def read():
            while call_id not in self.seen:
                resp = await self.call.read()
                assert resp is not grpc.aio.EOF, "stream ended"
                for e in resp.events:
                    kind = e.WhichOneof("kind")
                    if kind in ("result", "error"):
                        self.seen[getattr(e, kind).call_id] = e
            return self.seen.pop(call_id)

        return await asyncio.wait_for(read(), timeout)

    async def close(self):
        self.call.cancel()
        await self.channel.close()


def distinct_scalar(field, salt=0):
    """A value for scalar `field` (a FieldDescriptor) unlike any default (and,
    for strings, bytes and numbers, unlike the value for another `salt`)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    if field.type == F.TYPE_STRING:
        return f"v-{field.name}-{salt}"
    if field.type == F.TYPE_BYTES:
        return f"b-{field.name}-{salt}".encode()
    if field.type == F.TYPE_ENUM:
        return field.enum_type.values[-1].number
    if field.type == F.TYPE_BOOL:
        return True
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return field.number + salt + 0.5
    return 1000 + field.number + salt


async def first_item_emitted(url, method, subscribe, items, matches, target, *args, timeout=20):
    """Subscribes a bare `method` stream ("Logs" or "Traces") with the request
    `subscribe`, runs `target(*args)` in the sandbox (through a RuntimeClient
    whose own logs and traces streams are off; the call must return a true
    value), and returns the first item in a response's repeated field `items`
    for which `matches(item)` holds. Fails if the stream ends first or after
    `timeout` seconds."""
    from agentix import RuntimeClient

    channel = grpc.aio.insecure_channel(url)
    stream = getattr(pb_grpc.RuntimeServiceStub(channel), method)()
    await stream.write(subscribe)
    try:
        async with RuntimeClient(url, logs=False, traces=False) as client:
            assert await client.remote(target, *args)

        async def received():
            while True:
                response = await stream.read()
                assert response is not grpc.aio.EOF, f"{method} stream ended"
                for item in getattr(response, items):
                    if matches(item):
                        return item

        return await asyncio.wait_for(received(), timeout)
    finally:
        stream.cancel()
        await channel.close()


def start(call_id, callable_, arguments=b"", size=0, encoding=pb.ENCODING_PICKLE):
    return pb.HostEvent(start=pb.StartCall(
        call_id=call_id, callable=callable_, arguments=arguments,
        arguments_size=size, encoding=encoding))


def chunk(call_id, data):
    return pb.HostEvent(argument_chunk=pb.ArgumentChunk(call_id=call_id, data=data))


def record_start_calls(monkeypatch) -> list:
    """Makes the host package's StartCall encoder also append each StartCall
    it writes (decoded) to the returned list, for tests of the wire fields."""
    from agentix.runtime.client import stream, wire

    sent = []
    original = wire.start_call_event
    original_request = stream.start_call_request  # small arguments: acks and the StartCall in one

    def spy(*args):
        pieces = original(*args)
        sent.append(pb.CallsRequest.FromString(b"".join(bytes(p) for p in pieces)).events[0].start)
        return pieces

    def spy_request(*args):
        message = original_request(*args)
        framed = args[-1] != 0  # frame_kind: behind the frame wire's 5-byte header
        sent.append(pb.CallsRequest.FromString(message[5:] if framed else message).events[-1].start)
        return message

    monkeypatch.setattr(wire, "start_call_event", spy)
    monkeypatch.setattr(stream, "start_call_request", spy_request)
    return sent
