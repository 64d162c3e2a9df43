"""A client's subscription feeds: the ``Logs`` and ``Traces`` streams, and
the side-channel barrier a call's result waits on (docs/RELIABILITY.md).

Whenever the Calls stream is opened, a ``Logs`` and a ``Traces`` stream are
opened beside it (each unless already running): the first replays the
sandbox's log records into the host's stdlib logging
(`agentix.runtime.client.logs`), the second the sandbox's trace and span
events into the host's trace processors (`agentix.runtime.client.traces`).
``logs=False`` / ``traces=False`` turn them off. Either one, when lost while
calls keep working, is re-opened by the next call (at most once per second
each) with the cursor its earlier streams left, or at once by a call waiting
for its records when the daemon ended it because this host fell behind; a
daemon that does not implement one is not asked for it again."""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

import grpc

from agentix.runtime.client.subscription import SeqCursor, SubscriptionStream

__all__ = ["BARRIER_IDLE_SECONDS", "Feed", "ensure_feeds", "reopen_lost_feeds", "settle_feeds", "wait_barrier"]

# A call's result waits for the sandbox's records it carries the seq of (the
# side-channel barrier) as long as replay makes progress; it stops waiting
# once none is replayed for this long (docs/RELIABILITY.md).
BARRIER_IDLE_SECONDS = 2.0

S = TypeVar("S", bound=SubscriptionStream, covariant=True)


class Feed(Generic[S]):
    """One subscription stream of a client (``Logs`` or ``Traces``): the
    current stream, the channel it runs on, the cursor its successive
    streams share, whether the daemon lacks the RPC, and when it was last
    re-opened. `flag` names the client attribute that turns it on."""

    __slots__ = ("flag", "stream_type", "cursor", "stream", "channel", "metadata", "unimplemented", "reopened_at")

    def __init__(self, flag: str, stream_type: type[S], cursor: SeqCursor) -> None:
        self.flag = flag
        self.stream_type = stream_type
        self.cursor = cursor
        self.stream: S | None = None
        self.channel: grpc.aio.Channel | None = None
        self.metadata: tuple | None = None
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
        rpc = self.stream_type.open_rpc(channel, metadata)
        self.stream = self.stream_type(rpc, self.cursor, self._not_implemented, previous=previous)
        self.channel = channel
        self.metadata = metadata

    def _not_implemented(self) -> None:
        self.unimplemented = True

    async def wait_replayed(self, seq: int) -> None:
        """Waits until this feed has replayed up to `seq` (a call's barrier),
        across re-opened streams, while replay makes progress; returns at
        once when there is no stream (closed, turned off).

        A stream the daemon ended because this host fell behind, after it
        had replayed some of its records (`fell_behind`: a daemon before stop
        27 ends a host 8 MiB behind with RESOURCE_EXHAUSTED, a later one a
        host paused there that read nothing for --paused-subscriber-timeout-s;
        the records still buffered; docs/RELIABILITY.md), is re-opened at once
        with the cursor, so the call still gets what the daemon holds. Any other end
        (a cut connection, a refusal) is left to the client's reconnection
        and the next call, as before."""
        cursor = self.cursor
        while cursor.last_seq < seq:
            stream = self.stream
            if stream is None:
                return
            if not stream.alive:
                if not stream.fell_behind or self.channel is None:
                    return
                try:
                    self.ensure(self.channel, self.metadata)
                except Exception:  # a channel the client has closed: the next call re-opens it
                    return
                continue
            before = cursor.last_seq
            await stream.wait_replayed(seq, BARRIER_IDLE_SECONDS)
            if self.stream is stream and stream.alive and cursor.last_seq == before:
                return  # no progress for the whole bound

    def detach(self) -> SubscriptionStream | None:
        """Forgets the stream and channel and returns the stream (to close)."""
        stream, self.stream, self.channel = self.stream, None, None
        return stream


def ensure_feeds(feeds: tuple[Feed, ...], owner: Any, channel: grpc.aio.Channel, metadata: tuple | None) -> None:
    """Opens each feed on `channel` unless one is running there, it is
    turned off (`owner`'s attribute named by its flag: ``logs`` /
    ``traces``), or the daemon does not implement it. Called whenever a
    Calls stream is opened and when a lost one is re-opened; does not wait."""
    for feed in feeds:
        if getattr(owner, feed.flag):
            feed.ensure(channel, metadata)


def reopen_lost_feeds(
    feeds: tuple[Feed, ...], owner: Any, channel: grpc.aio.Channel, metadata: tuple | None, interval: float
) -> None:
    """Re-opens a feed whose stream broke while calls kept working, at most
    once per `interval` seconds each (a daemon that keeps failing it costs
    nothing per call). Called on every call: nothing else runs when all
    feeds are alive."""
    for feed in feeds:
        feed_stream = feed.stream
        if feed_stream is not None and not feed_stream.alive:
            now = asyncio.get_running_loop().time()
            if now - feed.reopened_at >= interval and getattr(owner, feed.flag):
                feed.reopened_at = now
                feed.ensure(channel, metadata)


async def settle_feeds(feeds: tuple[Feed, ...], quiet: float, bound: float) -> None:
    """Waits until the live feeds have been quiet for `quiet` seconds, at
    most `bound` seconds (close(): what the sandbox emitted before is
    replayed first)."""
    live = [feed.stream for feed in feeds if feed.stream is not None and feed.stream.alive]
    if live:
        await asyncio.gather(*(stream.settle(quiet, bound) for stream in live), return_exceptions=True)


async def wait_barrier(feeds: tuple[Feed, ...], *seqs: int) -> None:
    """Waits until each feed has replayed up to its seq in `seqs` (a call's
    side-channel barrier: log seq, trace seq), bounded by
    `BARRIER_IDLE_SECONDS` without progress."""
    for feed, seq in zip(feeds, seqs):
        if seq > feed.cursor.last_seq:
            await feed.wait_replayed(seq)
