"""The host half of one ``RuntimeService.Calls`` stream.

One bidirectional stream carries every call of a client, correlated by
``call_id``. Two tasks own it:

- the sender writes queued `HostEvent`s. Whatever accumulated while the previous
  write was in flight goes out in one `CallsRequest` (coalescing is what makes
  many concurrent small calls cheap), up to about `BATCH_BYTES` per message.
  Arguments over `CHUNK_BYTES` are sent as a `StartCall` with the first chunk
  followed by `ArgumentChunk`s; each message takes the queued events first and
  then fills up with chunks taken in turn from the unfinished uploads, so a
  small call is never queued behind a large upload.
- the reader routes `SandboxEvent`s to the `PendingCall` of their ``call_id``:
  `ResultChunk` bytes accumulate, and a terminal `CallResult` or `CallError`
  settles the call's future and is acknowledged with `AckResult`. Terminal
  events for calls nobody awaits any more are acknowledged too, so the daemon
  can free what it retains. Acknowledgements ride along with the next message
  the sender writes; only when nothing else goes out for `ACK_DELAY` seconds
  (or `ACK_BATCH` of them pile up) do they get a message of their own. An
  ack-only write right after each result would otherwise sit in front of the
  next call's StartCall.

`NativeCallsStream` does the same over the ``_native_calls`` extension (grpc++)
without either task: events are handed to the extension as they are queued and
responses are routed from a ``loop.add_reader`` callback on its eventfd.

The table of pending calls belongs to the client (it outlives a stream, which
is what resuming calls on a new stream needs); this module only reads it and
removes settled calls. When the stream ends or fails, it reports once through
``on_lost`` and the client decides what happens to the calls still pending.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

import grpc

from agentix.runtime.client import wire
from agentix.runtime.client.chunking import CHUNK_BYTES, Upload, first_chunk
from agentix.runtime.client.errors import RemoteCallError, ResultTooLarge
from agentix.runtime.client.pending import (
    MAX_RESULT_BYTES,
    CallFuture,
    STREAM_END,
    Outcome,
    PendingCall,
    SideBarrier,
    StartRequest,
    remote_error_outcome,
)
from agentix.runtime.shared.models import RemoteError
from agentix.runtime.v1 import runtime_pb2 as pb

__all__ = [
    "BATCH_BYTES",
    "CHUNK_BYTES",
    "CallsStream",
    "MAX_RESULT_BYTES",
    "NativeCallsStream",
    "NativeStreamError",
    "Outcome",
    "PendingCall",
    "RoutingFailed",
    "STREAM_END",
    "SideBarrier",
    "StartRequest",
]

_log = logging.getLogger("agentix.runtime.client")

# Soft cap on one outgoing message: events are added while the total stays within
# it (a single larger event still goes alone). Keeps messages far below the
# daemon's receive limit.
BATCH_BYTES = 2 << 20
# Bytes counted per event on top of its payloads (ids, tags, lengths).
_EVENT_OVERHEAD = 64
# Longest time an acknowledgement waits for a message to ride along with, and
# how many may wait at most (the daemon retains a result until it is acked).
ACK_DELAY = 0.05
ACK_BATCH = 512
# How many written acks a stream remembers for re-sending after a cut.
RECENT_ACKS = 4096

class RoutingFailed(Exception):
    """Why a Calls stream was dropped by the host itself: handling a
    response that belongs to no one call raised (a host bug, or a message
    it cannot read; the exception is the ``__cause__``). The client fails
    the stream's pending calls instead of resuming them: the daemon would
    replay the same events, and the same exception, on every new stream."""


def _event_call_id(event: wire.CallsEvent) -> str:
    """The call an event of the Calls stream belongs to ("" for none)."""
    if type(event) is wire.RawResult or type(event) is wire.RawResultChunk:
        return event.call_id
    try:
        kind = event.WhichOneof("kind")
        return getattr(getattr(event, kind), "call_id", "") if kind else ""
    except Exception:  # not a SandboxEvent after all
        return ""


def _event_kind(event: wire.CallsEvent) -> str:
    """What an event of the Calls stream is, for messages ("result", "stream_item", ...)."""
    if type(event) is wire.RawResult:
        return "result"
    if type(event) is wire.RawResultChunk:
        return "result_chunk"
    try:
        return event.WhichOneof("kind") or "event"
    except Exception:
        return type(event).__name__


def _encode_batch(batch: list[pb.HostEvent | list]) -> bytes:
    """The encoded CallsRequest carrying a batch of events and hand-encoded
    events (wire.py), in order."""
    return b"".join(_batch_pieces(batch))


def _batch_pieces(batch: list[pb.HostEvent | list]) -> list:
    """The pieces (bytes and memoryviews) whose concatenation is the
    CallsRequest of a batch of events and hand-encoded events (wire.py)."""
    pieces: list = []
    for event in batch:
        if type(event) is pb.HostEvent:
            # Cheaper than copying the events into a new CallsRequest message.
            pieces.extend(wire.request_event(event.SerializeToString()))
        else:
            pieces.extend(event)
    return pieces


class CallsStream:
    """Drives one open ``Calls`` RPC; see the module docstring.

    Args:
      rpc: the stream-stream call object returned by ``stub.Calls()``.
      pending: the client's table of pending calls, keyed by ``call_id``.
      on_lost: called once, from this stream's tasks, when the stream ends or
        fails before `aclose`; receives this stream and the error (None when the
        server ended the stream cleanly).
    """

    def __init__(
        self,
        rpc: grpc.aio.StreamStreamCall,
        pending: dict[str, PendingCall],
        on_lost: Callable[[CallsStream, BaseException | None], None],
    ) -> None:
        self._rpc = rpc
        self._init_state(pending, on_lost)
        self._sender = asyncio.create_task(self._send_loop(), name="agentix-calls-sender")
        self._reader = asyncio.create_task(self._read_loop(), name="agentix-calls-reader")

    def _init_state(
        self, pending: dict[str, PendingCall], on_lost: Callable[[CallsStream, BaseException | None], None]
    ) -> None:
        self._pending = pending
        self._on_lost = on_lost
        # (estimated size, event, upload to begin once the event is sent); an
        # event is a HostEvent or the pieces of an encoded one (wire.py)
        self._queue: collections.deque[tuple[int, pb.HostEvent | list, Upload | None]] = collections.deque()
        self._uploads: collections.deque[Upload] = collections.deque()
        self._uploads_by_id: dict[str, Upload] = {}
        self._wakeup = asyncio.Event()
        self._acks: list[str] = []  # call ids whose terminal event awaits an ack
        # Acks written lately: a connection cut can lose them in flight, so
        # they are sent again on the next stream (the daemon ignores acks of
        # results it no longer holds).
        self._recent_acks: collections.deque[str] = collections.deque(maxlen=RECENT_ACKS)
        self._acks_due = False  # set when the acks may not wait any longer
        self._ack_timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._lost = False
        # While NativeCallsStream routes a read: the CallFutures it settled, woken after it.
        self._woken: list[CallFuture] | None = None

    @property
    def alive(self) -> bool:
        """True while new calls may be started on this stream."""
        return not (self._lost or self._closing)

    def start_call(
        self, call_id: str, callable_ref: str, arguments: bytes | wire.Pieces, context: bytes, stream_window: int = 0
    ) -> None:
        """Queues the StartCall (and any ArgumentChunks) of a call in `pending`;
        a non-zero `stream_window` makes it a streaming call. `arguments`:
        the pickled (args, kwargs), `wire.Pieces` only when over CHUNK_BYTES."""
        upload = None
        if len(arguments) > CHUNK_BYTES:
            upload = Upload(call_id, arguments)
            self._uploads_by_id[call_id] = upload
        first, first_size = first_chunk(arguments)
        event = wire.start_call_event(call_id, callable_ref, first, len(arguments), context, stream_window)
        self._enqueue(first_size + len(context) + len(callable_ref) + _EVENT_OVERHEAD, event, upload)

    def resume(self, calls: list[PendingCall]) -> None:
        """Re-attaches `calls` (pending from a lost stream) to this one: sends
        each retained StartCall again (the daemon starts calls it never saw,
        ignores ones it knows and refuses finished ones), then ResumeCalls
        for all (the daemon replays what it produced for them), then the
        flow-control state of streaming calls."""
        for call in calls:
            call.result_chunks = []  # the daemon replays chunks from the start
            call.result_bytes = 0
            start = call.start
            if start is not None:
                self.start_call(call.call_id, start.callable_ref, start.arguments, start.context, start.stream_window)
        self._enqueue(
            _EVENT_OVERHEAD * (1 + len(calls)),
            pb.HostEvent(resume=pb.ResumeCalls(call_ids=[call.call_id for call in calls])),
        )
        for call in calls:
            if call.items is not None and call.consumed:
                self.ack_stream(call.call_id, call.consumed)

    def take_unsent_acks(self) -> list[str]:
        """The ids whose AckResult this (lost) stream never wrote, or wrote
        lately (it may not have arrived); the client sends them on the next
        stream so the daemon can free the results."""
        acks = [*self._recent_acks, *self._acks]
        self._acks = []
        self._recent_acks.clear()
        return acks

    def ack_results(self, call_ids: list[str]) -> None:
        """Acknowledges terminal events received on an earlier stream."""
        self._acks.extend(call_ids)
        self._acks_ready()

    def ack_stream(self, call_id: str, next_index: int) -> None:
        """Tells the sandbox the items below `next_index` were consumed, which
        lets it produce more (sent at once: it is flow control)."""
        if self.alive:
            self._enqueue(
                _EVENT_OVERHEAD, pb.HostEvent(stream_ack=pb.StreamAck(call_id=call_id, next_index=next_index))
            )

    def cancel_call(self, call_id: str) -> None:
        """Stops uploading the call's arguments and asks the daemon to cancel it."""
        self._drop_upload(call_id)
        if self.alive:
            self._enqueue(_EVENT_OVERHEAD, pb.HostEvent(cancel=pb.CancelCall(call_id=call_id)))

    async def aclose(self, cancel_ids: list[str], flush_timeout: float) -> None:
        """Cancels `cancel_ids`, flushes queued events and half-closes the stream
        (waiting at most `flush_timeout` seconds), then tears it down. The calls
        in `pending` are the caller's to settle; `on_lost` is not called."""
        for call_id in cancel_ids:
            self.cancel_call(call_id)
        self._closing = True
        self._acks_due = True
        self._wakeup.set()
        if not self._lost:
            try:
                await asyncio.wait_for(asyncio.shield(self._sender), flush_timeout)
            except TimeoutError:
                _log.debug("runtime stream did not flush within %ss", flush_timeout)
        self._lost = True
        self._rpc.cancel()
        for task in (self._sender, self._reader):
            task.cancel()
        await asyncio.gather(self._sender, self._reader, return_exceptions=True)

    def _enqueue(self, size: int, event: pb.HostEvent, upload: Upload | None = None) -> None:
        self._queue.append((size, event, upload))
        self._kick()

    def _kick(self) -> None:
        """Something was queued: get it written."""
        self._wakeup.set()

    def _drop_upload(self, call_id: str) -> None:
        upload = self._uploads_by_id.pop(call_id, None)
        if upload is not None:
            upload.dropped = True

    def _acks_ready(self) -> None:
        self._ack_timer = None
        if self._acks:
            self._acks_due = True
            self._kick()

    def _take_acks(self) -> list:
        """The waiting acks, encoded (wire.ack_events: one piece for all)."""
        acks = self._acks
        encoded = wire.ack_events(acks)
        self._recent_acks.extend(acks)
        acks.clear()
        # A pending ack timer stays: when it fires with no acks waiting it does
        # nothing, which is cheaper than cancelling and re-arming it per call.
        self._acks_due = False
        return [encoded]

    def _take_batch(self) -> list[pb.HostEvent | list]:
        """Takes the events of the next message, within BATCH_BYTES: waiting
        acks, then queued events, then argument chunks taken round-robin from
        the uploads."""
        batch: list[pb.HostEvent | list] = []
        size = 0
        if self._acks:
            size = len(self._acks) * _EVENT_OVERHEAD
            batch.append(self._take_acks())
        queue = self._queue
        while queue:
            event_size, event, upload = queue[0]
            if batch and size + event_size > BATCH_BYTES:
                return batch
            queue.popleft()
            batch.append(event)
            size += event_size
            if upload is not None and not upload.dropped:
                self._uploads.append(upload)

        uploads = self._uploads
        while uploads:
            upload = uploads[0]
            if upload.dropped:
                uploads.popleft()
                continue
            chunk_size = upload.next_chunk_size() + _EVENT_OVERHEAD
            if batch and size + chunk_size > BATCH_BYTES:
                break
            uploads.popleft()
            offset, data = upload.take_chunk()
            batch.append(wire.argument_chunk_event(upload.call_id, data, offset))
            size += chunk_size
            if upload.finished:
                self._uploads_by_id.pop(upload.call_id, None)
            else:
                uploads.append(upload)
        return batch

    async def _send_loop(self) -> None:
        try:
            while True:
                # No extra yield is needed for coalescing: the sender resumes in
                # the loop iteration after the one in which the first event was
                # queued, so every task made ready with it (e.g. by one response
                # settling many calls) has queued its events by then.
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._queue or self._uploads or (self._acks and self._acks_due):
                    batch = self._take_batch()
                    if batch:
                        await self._rpc.write(_encode_batch(batch))
                if self._closing:
                    await self._rpc.done_writing()
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a write failed: the stream is unusable
            self._report_lost(exc)

    async def _read_loop(self) -> None:
        read = self._rpc.read  # cheaper than the call's async iterator
        try:
            while True:
                response = await read()
                if response is grpc.aio.EOF:
                    break
                self._route_message(response)
                if self._lost:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the RPC failed: reconnect and resume
            self._report_lost(exc)
        else:
            self._report_lost(None)

    def _route_message(self, message: bytes | memoryview) -> None:
        """Routes the events of one response. What raises while one call's
        event is handled fails that call (`_event_failed`); a message that
        cannot be read, or an event of no call that raises, drops the stream
        (`_routing_failed`). Never raises."""
        route = self._route
        try:
            events = wire.parse_calls_response(message)
        except Exception as exc:
            self._routing_failed(exc, "reading a response")
            return
        for event in events:
            try:
                route(event)
            except Exception as exc:
                self._event_failed(event, exc)
                if self._lost:
                    return

    def _event_failed(self, event: wire.CallsEvent, error: Exception) -> None:
        """Handling `event` raised `error`. The call it belongs to fails
        (`_call_failed`); a terminal event is acknowledged (the daemon would
        replay it on every resume), any other one cancels the call in the
        sandbox (whose terminal event is then acknowledged unread). The
        stream and the other calls go on."""
        call_id = _event_call_id(event)
        kind = _event_kind(event)
        if not call_id:
            self._routing_failed(error, f"handling a {kind} event of no call")
            return
        call = self._pending.pop(call_id, None)
        if call is not None:
            self._call_failed(call, kind, error)
        else:
            _log.error("handling the runtime's %s for call %s (no longer awaited) raised", kind, call_id,
                       exc_info=error)
        if kind in ("result", "error"):
            self._acknowledge(call_id)
        else:
            self.cancel_call(call_id)
        if self._uploads_by_id:
            self._drop_upload(call_id)

    def _call_failed(self, call: PendingCall, kind: str, error: Exception) -> None:
        """Fails `call`, whose `kind` event raised `error` on the host, with a
        ``MalformedError`` `RemoteCallError` caused by `error`; logged once
        with the traceback (it is a host bug, or an event the host cannot
        use)."""
        _log.error("handling the runtime's %s for call %s (%s) raised; the call fails", kind, call.call_id,
                   call.display_name, exc_info=error)
        failure = RemoteCallError(
            call.display_name,
            RemoteError(
                type="MalformedError",
                message=f"the host failed to handle the runtime's {kind} for call {call.call_id}: "
                f"{type(error).__name__}: {error}",
            ),
        )
        failure.__cause__ = error
        try:
            call.fail(failure)
        except Exception:  # a subclass's fail() (e.g. the gateway's) raised too
            _log.error("failing call %s raised", call.call_id, exc_info=True)
            PendingCall.fail(call, failure)

    def _routing_failed(self, error: Exception, what: str) -> None:
        """`what` raised `error`, and no one call's event was at fault: the
        stream is dropped and the client fails its pending calls
        (`RoutingFailed`) rather than resume them into the same failure."""
        _log.error("%s on the runtime's Calls stream raised; the stream is dropped and its %d pending call(s) "
                   "fail", what, len(self._pending), exc_info=error)
        failure = RoutingFailed(f"{what} raised {type(error).__name__}: {error}")
        failure.__cause__ = error
        self._report_lost(failure)

    def _acknowledge(self, call_id: str) -> None:
        """Queues the AckResult of a terminal event (`_finish` does the same inline)."""
        self._acks.append(call_id)
        if len(self._acks) >= ACK_BATCH:
            self._acks_ready()
        elif self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._acks_ready)

    def _report_lost(self, error: BaseException | None) -> None:
        if self._lost:
            return
        self._lost = True
        if self._closing:
            return
        _log.debug("runtime stream lost: %r", error)
        self._teardown()
        self._on_lost(self, error)

    def _teardown(self) -> None:
        """Stops the stream's tasks and cancels the RPC (after a loss)."""
        for task in (self._sender, self._reader):
            if task is not asyncio.current_task():
                task.cancel()
        self._rpc.cancel()

    def _route(self, event: pb.SandboxEvent | wire.RawResult | wire.RawResultChunk) -> None:
        if type(event) is wire.RawResult:  # the common case first
            self._on_result(event)
            return
        if type(event) is wire.RawResultChunk:
            call = self._pending.get(event.call_id)
            if call is not None:
                self._add_chunk(call, event.data)
            return
        kind = event.WhichOneof("kind")
        if kind == "result":  # one protobuf read (see wire.parse_calls_response)
            self._on_result(event.result)
        elif kind == "result_chunk":
            call = self._pending.get(event.result_chunk.call_id)
            if call is not None:
                self._add_chunk(call, event.result_chunk.data)
        elif kind == "error":
            failure = event.error
            if failure.log_seq or failure.trace_seq:
                self._set_barrier(failure.call_id, failure.log_seq, failure.trace_seq)
            if failure.HasField("error"):
                outcome = remote_error_outcome(failure.error)
            else:
                outcome = RemoteError(type="MalformedError", message="the runtime reported an error without details")
            if not failure.call_id:
                _log.warning("runtime refused an event of this client: %s: %s", outcome.type, outcome.message)
                return
            self._finish(failure.call_id, outcome)
        elif kind == "stream_item":
            item = event.stream_item
            call = self._pending.get(item.call_id)
            if call is None or call.items is None or call.future.done():
                return
            value = item.value
            if call.result_chunks:
                # An item over 1 MiB comes as ResultChunks of its leading
                # bytes, then the item with the rest.
                value = b"".join([*call.result_chunks, value])
                call.result_chunks = []
                call.result_bytes = 0
            if item.index < call.received:
                return  # replayed after a resume, and received before
            if item.index > call.received:
                # Items before it never came and never will (the daemon sends
                # them in order and replays what was not acked): fail the call
                # instead of handing the consumer a list with a hole in it.
                self._pending.pop(item.call_id, None)
                call.settle(
                    RemoteError(
                        type="MalformedError",
                        message=f"stream item {item.index} arrived while item {call.received} was expected; "
                        f"items {call.received}..{item.index - 1} were lost",
                    )
                )
                self.cancel_call(item.call_id)
                return
            call.received = item.index + 1
            if len(value) > call.max_result_bytes:
                self._refuse_result(call, len(value), f"stream item {item.index}")
                return
            if item.log_seq or item.trace_seq:
                call.items.put_nowait(SideBarrier(item.log_seq, item.trace_seq))
            call.items.put_nowait(value)

    def _set_barrier(self, call_id: str, log_seq: int, trace_seq: int) -> None:
        call = self._pending.get(call_id)
        if call is not None:
            call.barrier = SideBarrier(log_seq, trace_seq)

    def _add_chunk(self, call: PendingCall, data: bytes | memoryview) -> None:
        call.result_bytes += len(data)
        if call.result_bytes > call.max_result_bytes:
            self._refuse_result(call, call.result_bytes, "result")
        else:
            call.result_chunks.append(data)

    def _refuse_result(self, call: PendingCall, size: int, what: str) -> None:
        """Fails `call` with `ResultTooLarge`, drops what it received and
        cancels it in the sandbox; its terminal event is acknowledged unread."""
        self._pending.pop(call.call_id, None)
        call.result_chunks = []
        call.fail(
            ResultTooLarge(
                f"remote call '{call.display_name}': {what} of at least {size} bytes exceeds "
                f"max_result_bytes={call.max_result_bytes}"
            )
        )
        self.cancel_call(call.call_id)

    def _on_result(self, result: pb.CallResult | wire.RawResult) -> None:
        """A call's CallResult, read by wire.py or by protobuf: the barrier
        for its records and spans, then its outcome."""
        call_id = result.call_id
        if result.log_seq or result.trace_seq:
            self._set_barrier(call_id, result.log_seq, result.trace_seq)
        self._finish(call_id, self._result_outcome(result, call_id))

    def _result_outcome(self, result: pb.CallResult | wire.RawResult, call_id: str) -> Outcome | ResultTooLarge:
        call = self._pending.get(call_id)
        value: bytes | list
        if call is None or not call.result_chunks:
            value = result.value
            size = len(value)
        else:
            # Left in pieces: restricted_loads_chunks decodes them unjoined.
            value = [*call.result_chunks, result.value]
            size = sum(len(piece) for piece in value)
        if result.encoding not in (pb.ENCODING_UNSPECIFIED, pb.ENCODING_PICKLE):
            return RemoteError(
                type="MalformedError",
                message=f"the runtime answered with encoding {pb.Encoding.Name(result.encoding)}, not pickle",
            )
        if result.value_size and result.value_size != size:
            return RemoteError(
                type="MalformedError",
                message=f"result value has {size} bytes but the runtime announced {result.value_size}",
            )
        if call is not None and size > call.max_result_bytes:
            call.result_chunks = []
            return ResultTooLarge(
                f"remote call '{call.display_name}': result of {size} bytes exceeds "
                f"max_result_bytes={call.max_result_bytes}"
            )
        return value

    def _finish(self, call_id: str, outcome: Outcome | ResultTooLarge) -> None:
        """Settles a call on its terminal event and acknowledges the event."""
        call = self._pending.pop(call_id, None)
        if call is not None:
            try:
                if isinstance(outcome, ResultTooLarge):
                    call.fail(outcome)
                else:
                    call.settle(outcome, self._woken)
            except Exception as exc:  # no longer in `pending`: fail it here, then ack as usual
                self._call_failed(call, "result" if type(outcome) is not RemoteError else "error", exc)
        if self._uploads_by_id:  # (no call per result when nothing uploads)
            self._drop_upload(call_id)
        self._acks.append(call_id)
        if len(self._acks) >= ACK_BATCH:
            self._acks_ready()
        elif self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._acks_ready)


# Bytes a NativeCallsStream hands to its transport ahead of the wire while
# arguments are uploading; the rest follows once the transport has written
# them. Like CallsStream's sender awaiting each write, this keeps a large
# upload from sitting in memory twice and a small call from queueing behind
# more than about one message of it.
NATIVE_WRITE_AHEAD = BATCH_BYTES

_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class NativeStreamError(grpc.RpcError):
    """How a NativeCallsStream reports a Calls RPC that ended with a non-OK
    status (the grpc.aio path reports an ``AioRpcError``)."""

    def __init__(self, code: int, details: str) -> None:
        self._code = _STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN)
        self._details = details
        super().__init__(f"{self._code.name}: {details}")

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class NativeCallsStream(CallsStream):
    """A `CallsStream` over ``_native_calls.CallsTransport`` (grpc++'s
    completion-queue API in a C++ extension) instead of grpc.aio.

    No tasks: the first event queued in a loop iteration is encoded and
    handed to the transport at once (which writes it at once when idle);
    events queued after it in the same iteration go out together in the next
    one (many calls started together make one message, as with `CallsStream`;
    only a second event schedules that flush, so a lone call costs no extra
    loop turn), and what queues up in the transport while a write is in flight is joined
    into its next message. Responses are taken from it in a
    ``loop.add_reader`` callback on its eventfd, which also resumes the
    tasks of the calls it settled that await a `CallFuture` (a call alone in
    flight) before it returns. Batching is `CallsStream`'s:
    acks ride along with the next write, arguments over `CHUNK_BYTES` are
    uploaded in chunks taken in turn with the other events; an upload stops
    once `NATIVE_WRITE_AHEAD` bytes are waiting in the transport and goes on
    when they are written.

    Args:
      transport: a new ``CallsTransport``; this stream owns and closes it.
      pending, on_lost: as for `CallsStream`.
    """

    def __init__(
        self,
        transport,
        pending: dict[str, PendingCall],
        on_lost: Callable[[CallsStream, BaseException | None], None],
    ) -> None:
        self._transport = transport
        self._init_state(pending, on_lost)
        self._loop = asyncio.get_running_loop()
        self._fd = transport.fileno()
        self._loop.add_reader(self._fd, self._on_readable)
        self._watching = True
        self._throttled = False  # waiting for the transport to drain
        # Wrote since the last response or deferral: a later event waits for
        # the next loop iteration (_deferral_scheduled), with any others.
        self._deferred = False
        self._deferral_scheduled = False
        self._half_closed = False
        self._flushed: asyncio.Future | None = None  # aclose() waits for it

    def _enqueue(self, size: int, event: pb.HostEvent | list, upload: Upload | None = None) -> None:
        if (self._deferred or self._queue or self._uploads or upload is not None or self._throttled
                or type(event) is not list or not self.alive):
            self._queue.append((size, event, upload))
            self._kick()
            return
        # A lone encoded event (a StartCall of sequential calls) on an idle stream: what `_kick` and
        # `_flush` would write (the waiting acks, then the event), without the queue and the batch.
        if self._acks:
            event.insert(0, self._take_acks()[0])
        self._deferred = True
        try:
            self._transport.write(event)  # < 0: the stream is ending, drain() brings its status
        except Exception as exc:  # the transport refused: the stream is unusable
            self._report_lost(exc)

    def _kick(self) -> None:
        if self._lost or self._throttled:
            return
        if not self._deferred:
            self._flush()
            self._deferred = True
        elif not self._deferral_scheduled:
            # A second event since the last write: it and whatever follows in
            # this iteration go out together in the next one. Scheduled only
            # now, so that a lone call (sequential calls) costs no loop turn.
            self._deferral_scheduled = True
            self._loop.call_soon(self._end_deferral)

    def _end_deferral(self) -> None:
        self._deferral_scheduled = False
        self._deferred = False
        if self._queue and not self._lost and not self._throttled:
            self._flush()

    def _flush(self) -> None:
        """Writes what is queued, up to NATIVE_WRITE_AHEAD bytes waiting in
        the transport; half-closes once everything is written when closing."""
        transport = self._transport
        try:
            while self._queue or self._uploads or (self._acks and self._acks_due):
                batch = self._take_batch()
                if not batch:
                    continue
                waiting = transport.write(_batch_pieces(batch))
                if waiting < 0:
                    return  # the stream is ending: drain() brings its status
                if waiting >= NATIVE_WRITE_AHEAD and (self._queue or self._uploads):
                    self._throttled = True
                    transport.notify_below(0)
                    return
            if self._closing and not self._half_closed:
                self._half_closed = True
                transport.writes_done()
                transport.notify_below(0)
        except Exception as exc:  # the transport refused: the stream is unusable
            self._report_lost(exc)

    def _on_readable(self) -> None:
        # Tasks of calls settled here resume before it returns, not one loop iteration later.
        outer, self._woken = self._woken, []
        try:
            self._read_responses()
        finally:
            woken, self._woken = self._woken, outer
            for future in woken:
                future.wake()

    def _read_responses(self) -> None:
        if not self._deferral_scheduled:
            # A response: the loop has been round since the last write (or
            # this is that write's iteration, where a second write is what the
            # deferral would have made too); the next event is written at once.
            self._deferred = False
        try:
            messages, status, below = self._transport.drain()
        except Exception as exc:  # the transport failed: reconnect and resume
            self._report_lost(exc)
            return
        for message in messages:
            self._route_message(message)
            if self._lost:
                return
        try:
            if status is not None:
                self._settle_flushed()
                code, details = status
                self._report_lost(None if code == 0 else NativeStreamError(code, details))
                self._unwatch()
                return
            if below:
                self._throttled = False
                if self._half_closed:
                    self._settle_flushed()
                elif not self._lost:
                    self._flush()
        except Exception as exc:  # the transport failed: reconnect and resume
            self._report_lost(exc)

    def _settle_flushed(self) -> None:
        if self._flushed is not None and not self._flushed.done():
            self._flushed.set_result(None)

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self._loop.remove_reader(self._fd)

    def _teardown(self) -> None:
        self._unwatch()  # before the transport may close its eventfd
        self._transport.close()

    async def aclose(self, cancel_ids: list[str], flush_timeout: float) -> None:
        for call_id in cancel_ids:
            self.cancel_call(call_id)
        self._closing = True
        self._acks_due = True
        if not self._lost:
            self._flushed = self._loop.create_future()
            if not self._throttled:
                self._flush()
            try:
                await asyncio.wait_for(asyncio.shield(self._flushed), flush_timeout)
            except TimeoutError:
                _log.debug("runtime stream did not flush within %ss", flush_timeout)
        self._lost = True
        self._teardown()
