"""A client's subscription feeds: the ``Logs`` and ``Traces`` streams, each
re-opened on a new channel with the cursor its earlier streams left, and the
side-channel barrier a call's result waits on (docs/RELIABILITY.md)."""

from __future__ import annotations

import grpc

from agentix.runtime.client.subscription import SeqCursor, SubscriptionStream
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc

__all__ = ["BARRIER_IDLE_SECONDS", "Feed"]

# A call's result waits for the sandbox's records it carries the seq of (the
# side-channel barrier) as long as replay makes progress; it stops waiting
# once none is replayed for this long (docs/RELIABILITY.md).
BARRIER_IDLE_SECONDS = 2.0


class Feed:
    """One subscription stream of a client (``Logs`` or ``Traces``): the
    current stream, the channel it runs on, the cursor its successive
    streams share, whether the daemon lacks the RPC, and when it was last
    re-opened. `flag` names the client attribute that turns it on."""

    __slots__ = ("flag", "stream_type", "cursor", "stream", "channel", "unimplemented", "reopened_at")

    def __init__(self, flag: str, stream_type: type[SubscriptionStream], cursor: SeqCursor) -> None:
        self.flag = flag
        self.stream_type = stream_type
        self.cursor = cursor
        self.stream: SubscriptionStream | None = None
        self.channel: grpc.aio.Channel | None = None
        self.unimplemented = False
        self.reopened_at = float("-inf")

    def ensure(self, channel: grpc.aio.Channel, metadata: tuple | None) -> None:
        """Opens the stream on `channel` unless one is running there or the
        daemon does not implement it. Does not wait for anything."""
        if self.unimplemented:
            return
        previous = self.stream
        if previous is not None and previous.alive and self.channel is channel:
            return
        rpc = getattr(pb_grpc.RuntimeServiceStub(channel), self.stream_type.rpc_name)(metadata=metadata)
        self.stream = self.stream_type(rpc, self.cursor, self._not_implemented, previous=previous)
        self.channel = channel

    def _not_implemented(self) -> None:
        self.unimplemented = True

    async def wait_replayed(self, seq: int) -> None:
        """Waits until this feed has replayed up to `seq` (a call's barrier),
        across a re-opened stream, while replay makes progress; returns at
        once when there is no live stream."""
        cursor = self.cursor
        while cursor.last_seq < seq:
            stream = self.stream
            if stream is None or not stream.alive:
                return
            before = cursor.last_seq
            await stream.wait_replayed(seq, BARRIER_IDLE_SECONDS)
            if self.stream is stream and cursor.last_seq == before:
                return  # no progress for the whole bound

    def detach(self) -> SubscriptionStream | None:
        """Forgets the stream and channel and returns the stream (to close)."""
        stream, self.stream, self.channel = self.stream, None, None
        return stream
