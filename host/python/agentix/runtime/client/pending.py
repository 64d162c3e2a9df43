"""The host's record of one call in flight (`PendingCall`), what a call's
future receives (`Outcome`), the side-channel barrier a result carries, and
the StartCall kept for re-sending after a reconnect. The client owns the
table of pending calls; the Calls streams fill and settle its entries."""

from __future__ import annotations

import asyncio
from typing import Union

from agentix.runtime.client import wire
from agentix.runtime.shared.models import RemoteError

__all__ = ["MAX_RESULT_BYTES", "Outcome", "PendingCall", "STREAM_END", "SideBarrier", "StartRequest"]

# A call's outcome: the encoded result value (bytes, or the list of pieces it
# arrived in), or the sandbox's error report.
Outcome = Union[bytes, list, RemoteError]

# Default cap on one call's encoded result (and on one streamed item): the
# daemon's default --max-payload-bytes for arguments.
MAX_RESULT_BYTES = 1 << 30


# Put into a streaming call's item queue once its future is done.
STREAM_END = object()


class SideBarrier:
    """The seqs of the last log record and trace event a call emitted before
    one of its events (``CallResult.log_seq`` / ``trace_seq``): the host
    replays up to them before it hands that event to the caller. In a
    streaming call's item queue it precedes the item it guards."""

    __slots__ = ("log_seq", "trace_seq")

    def __init__(self, log_seq: int, trace_seq: int) -> None:
        self.log_seq = log_seq
        self.trace_seq = trace_seq


class PendingCall:
    """A call started on a stream and not yet settled.

    ``future`` receives the `Outcome`, or an exception chosen by the client when
    the call cannot finish (connection lost, client closed). A streaming call
    also has ``items``: the encoded `StreamItem` values in order, followed by
    `STREAM_END` once the future is done.
    """

    __slots__ = (
        "call_id",
        "display_name",
        "future",
        "result_chunks",
        "items",
        "start",
        "received",
        "consumed",
        "max_result_bytes",
        "result_bytes",
        "barrier",
    )

    def __init__(
        self,
        call_id: str,
        display_name: str,
        future: asyncio.Future,
        *,
        streaming: bool = False,
        start: StartRequest | None = None,
        max_result_bytes: int = MAX_RESULT_BYTES,
    ) -> None:
        self.call_id = call_id
        self.display_name = display_name
        self.future = future
        self.result_chunks: list[bytes] = []
        self.items: asyncio.Queue | None = asyncio.Queue() if streaming else None
        # What re-sends the call after a reconnect (None: resume only).
        self.start = start
        # StreamItems received (index of the next one expected) and consumed
        # by the caller (what the last StreamAck said).
        self.received = 0
        self.consumed = 0
        # Encoded result bytes received so far, refused beyond the cap.
        self.max_result_bytes = max_result_bytes
        self.result_bytes = 0
        # What its terminal event says to replay before returning (None: nothing).
        self.barrier: SideBarrier | None = None

    def settle(self, outcome: Outcome) -> None:
        """Delivers `outcome` unless the future is already done (e.g. cancelled)."""
        if not self.future.done():
            self.future.set_result(outcome)
            if self.items is not None:
                self.items.put_nowait(STREAM_END)

    def fail(self, error: BaseException) -> None:
        """Fails the call with `error` unless the future is already done."""
        if not self.future.done():
            self.future.set_exception(error)
            self._end_items()

    def _end_items(self) -> None:
        if self.items is not None:
            self.items.put_nowait(STREAM_END)


class StartRequest:
    """The StartCall of a call, kept so it can be sent again on a new stream
    after a reconnect (the daemon never runs a call_id twice)."""

    __slots__ = ("callable_ref", "arguments", "context", "stream_window")

    def __init__(self, callable_ref: str, arguments: bytes | wire.Pieces, context: bytes, stream_window: int) -> None:
        self.callable_ref = callable_ref
        self.arguments = arguments
        self.context = context
        self.stream_window = stream_window
