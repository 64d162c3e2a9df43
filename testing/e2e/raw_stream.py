"""A bare `RuntimeService.Calls` stream for tests that must send what the
host package never would (garbage arguments, unknown ids, no call_id)."""

import grpc

from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc


class RawStream:
    def __init__(self, url):
        # Batched responses may exceed gRPC's 4 MiB default (the daemon
        # batches up to ~4 MiB of events, plus framing).
        self.channel = grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.stub = pb_grpc.RuntimeServiceStub(self.channel)
        self.call = self.stub.Calls()
        self.seen = {}  # call_id -> terminal event read while awaiting another

    async def send(self, *events):
        await self.call.write(pb.CallsRequest(events=list(events)))

    async def terminal(self, call_id, timeout=20):
        """Reads until the terminal event of `call_id`; returns it."""
        import asyncio

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


def start(call_id, callable_, arguments=b"", size=0, encoding=pb.ENCODING_PICKLE):
    return pb.HostEvent(start=pb.StartCall(
        call_id=call_id, callable=callable_, arguments=arguments,
        arguments_size=size, encoding=encoding))


def chunk(call_id, data):
    return pb.HostEvent(argument_chunk=pb.ArgumentChunk(call_id=call_id, data=data))


def record_start_calls(monkeypatch) -> list:
    """Makes the host package's StartCall encoder also append each StartCall
    it writes (decoded) to the returned list, for tests of the wire fields."""
    from agentix.runtime.client import wire

    sent = []
    original = wire.start_call_event

    def spy(*args):
        pieces = original(*args)
        sent.append(pb.CallsRequest.FromString(b"".join(bytes(p) for p in pieces)).events[0].start)
        return pieces

    monkeypatch.setattr(wire, "start_call_event", spy)
    return sent
