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
- the reader routes `SandboxEvent`s to the `PendingCall` of their ``call_id``
  (`agentix.runtime.client.routing`, which also says what happens when that
  raises): `ResultChunk` bytes accumulate, and a terminal `CallResult` or
  `CallError` settles the call's future and is acknowledged with `AckResult`. Terminal
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
import os
from collections.abc import Callable

import grpc

from agentix.runtime.client import wire
from agentix.runtime.client.chunking import CHUNK_BYTES, Upload, first_chunk
from agentix.runtime.client.errors import ResultTooLarge
from agentix.runtime.client.routing import CallRouter
from agentix.runtime.client.pending import (
    MAX_RESULT_BYTES,
    CallFuture,
    STREAM_END,
    Outcome,
    PendingCall,
    SideBarrier,
    StartRequest,
    wake_all,
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
    "STREAM_END",
    "SideBarrier",
    "StartRequest",
    "start_call_request",
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

# A CallsRequest of acks and one StartCall made in C (call_start_wire.h), when the extension is there.
try:
    from agentix.runtime.client._native_calls import calls_request as _native_calls_request
except Exception:  # the pure wheel, another interpreter, libgrpc++ missing (as channels.native_calls_module)
    _native_calls_request = None
_callable_fields = wire._callable_fields  # start_fields' cache
# Arguments shorter than this go into the StartCall `start_call_request` makes (one buffer, as
# wire.start_call_event's below 4 KiB); longer ones, or wire.Pieces, take wire.start_call_event.
SMALL_ARGUMENTS_BYTES = 4096


def start_call_request(
    acks: list[str] | None, call_id: str, callable_ref: str, arguments: bytes, context: bytes, stream_window: int,
    frame_kind: int,
) -> bytes:
    """One ``CallsRequest``: ``wire.ack_events(acks)`` (None: no acks), then
    the StartCall ``wire.start_call_event`` makes of bytes `arguments`
    shorter than `SMALL_ARGUMENTS_BYTES`: the same bytes, joined, behind a
    frame-wire header of `frame_kind` unless it is 0. One native call when
    the extension is there (a sequential call's whole write)."""
    if _native_calls_request is not None:
        fields = _callable_fields.get(callable_ref) or wire.start_fields(callable_ref)  # (no call when cached)
        return _native_calls_request(acks, call_id, fields, arguments, context,
                                     type(context) is wire.ContextFields, stream_window, frame_kind)
    message = b"".join(wire.start_call_event(call_id, callable_ref, arguments, len(arguments), context, stream_window))
    if acks:
        message = wire.ack_events(acks) + message
    return len(message).to_bytes(4, "little") + bytes((frame_kind,)) + message if frame_kind else message


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


class CallsStream(CallRouter):
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
        self._dropped_ids: list[str] = []  # calls failed by _routing_failed: freed on the next stream
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
        size = len(arguments)
        if size < SMALL_ARGUMENTS_BYTES and type(arguments) is bytes:  # the common case: one buffer
            event = [start_call_request(None, call_id, callable_ref, arguments, context, stream_window, 0)]
            self._enqueue(size + len(context) + len(callable_ref) + _EVENT_OVERHEAD, event)
            return
        if size <= CHUNK_BYTES:  # the StartCall carries them all (first_chunk's bytes)
            event = wire.start_call_event(call_id, callable_ref, arguments, size, context, stream_window)  # type: ignore[arg-type]
            self._enqueue(size + len(context) + len(callable_ref) + _EVENT_OVERHEAD, event)
            return
        upload = Upload(call_id, arguments)
        self._uploads_by_id[call_id] = upload
        first, first_size = first_chunk(arguments)
        event = wire.start_call_event(call_id, callable_ref, first, size, context, stream_window)
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
        lately (it may not have arrived), and those of the calls it failed
        when it was dropped (`_routing_failed`); the client sends them on the
        next stream (`ack_results`) so the daemon can free the results."""
        acks = [*self._recent_acks, *self._acks, *self._dropped_ids]
        self._acks = []
        self._recent_acks.clear()
        self._dropped_ids = []
        return acks

    def ack_results(self, call_ids: list[str]) -> None:
        """Frees what the daemon retains for calls of an earlier stream that
        nobody awaits: each is cancelled, then acknowledged, in that order (a
        cancel ends a call still running and is ignored for a finished or
        unknown one; the ack frees the result, which an ack alone would leave
        to eviction for a call still running). Remembered as acks written
        lately, in case this stream is lost too."""
        for call_id in call_ids:
            self._enqueue(_EVENT_OVERHEAD, pb.HostEvent(cancel=pb.CancelCall(call_id=call_id)))
            self._enqueue(_EVENT_OVERHEAD, pb.HostEvent(ack=pb.AckResult(call_id=call_id)))
        self._recent_acks.extend(call_ids)

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

    def _finish(self, call_id: str, outcome: Outcome | ResultTooLarge | None) -> None:
        """Where every terminal event ends (a plain result straight from
        `_route_message`): settles the call if it is still pending, with
        `outcome` (None: it was failed already, `_event_failed`), drops its
        upload and queues the event's AckResult, which rides along with the
        next write (or goes alone after ACK_DELAY, or once ACK_BATCH wait)."""
        call = self._pending.pop(call_id, None)
        if call is not None:
            try:
                if isinstance(outcome, ResultTooLarge):
                    call.fail(outcome)
                else:
                    call.settle(outcome, self._woken)  # type: ignore[arg-type]
            except Exception as exc:  # no longer in `pending`: fail it here, then ack as usual
                self._call_failed(call, "result" if type(outcome) is not RemoteError else "error", exc)
        if self._uploads_by_id:  # (no call per result when nothing uploads)
            self._drop_upload(call_id)
        acks = self._acks
        acks.append(call_id)
        if len(acks) >= ACK_BATCH:
            self._acks_ready()
        elif self._ack_timer is None and self._woken is None:  # (NativeCallsStream._on_readable: after it)
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


COALESCE_STARTS_ENV = "AGENTIX_COALESCE_STARTS"


def coalesce_starts() -> bool:
    """Whether a read that settled several calls defers the next loop turn's
    first StartCall to go out with the others (``AGENTIX_COALESCE_STARTS``:
    1, the default, or 0: the first is written at once, the rest together)."""
    value = os.environ.get(COALESCE_STARTS_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{COALESCE_STARTS_ENV} must be 0 or 1, not {value!r}")
    return value != "0"


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
        try:
            coalesce = coalesce_starts()
        except ValueError:
            transport.close()  # the stream that would own it is not made
            raise
        self._transport = transport
        # How `start_call` writes one whole CallsRequest, and the frame kind in front of it (0: none).
        self._write_message = transport.write
        self._frame_kind = 0
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
        # A read that settled several calls: their callers' next StartCalls, made as they resume in
        # the next loop turn, go out in one write after them (not the first alone, then the rest).
        self._coalesce_starts = coalesce
        self._half_closed = False
        self._flushed: asyncio.Future | None = None  # aclose() waits for it

    def start_call(
        self, call_id: str, callable_ref: str, arguments: bytes | wire.Pieces, context: bytes, stream_window: int = 0
    ) -> None:
        if type(arguments) is not bytes or len(arguments) >= SMALL_ARGUMENTS_BYTES:
            super().start_call(call_id, callable_ref, arguments, context, stream_window)
            return
        if self._deferred or self._queue or self._uploads or self._throttled or self._lost or self._closing:
            # Queued behind others (`_enqueue`'s first case): one native call makes the event.
            event = start_call_request(None, call_id, callable_ref, arguments, context, stream_window, 0)
            self._queue.append((len(arguments) + len(context) + len(callable_ref) + _EVENT_OVERHEAD, [event], None))
            self._kick()
            return
        # A sequential call on an idle stream: the waiting acks and its StartCall in one
        # message, made in one native call (`_enqueue`'s lone-event case, without its steps).
        acks = self._acks
        message = start_call_request(acks or None, call_id, callable_ref, arguments, context, stream_window,
                                     self._frame_kind)
        if acks:
            self._recent_acks.extend(acks)
            acks.clear()
            self._acks_due = False
        self._deferred = True
        try:
            self._write_message(message)  # < 0: the stream is ending, drain() brings its status
        except Exception as exc:  # the transport refused: the stream is unusable
            self._report_lost(exc)

    def _enqueue(self, size: int, event: pb.HostEvent | list, upload: Upload | None = None) -> None:
        if (self._deferred or self._queue or self._uploads or upload is not None or self._throttled
                or type(event) is not list or self._lost or self._closing):  # (`alive`, without its call)
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
            pending = self._pending
            before = len(pending)
            for message in messages:
                if self._lost:  # dropped by a routing failure, or a write failed meanwhile
                    break
                self._route_message(message)
            if before - len(pending) > 1 and self._coalesce_starts and not self._deferral_scheduled:
                # The settled calls' tasks resume in the next turn, ahead of this handle: every
                # StartCall they make queues (`_deferred`) and _end_deferral writes them together.
                self._deferred = True
                self._deferral_scheduled = True
                self._loop.call_soon(self._end_deferral)
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
        finally:
            woken, self._woken = self._woken, outer
            try:
                wake_all(woken)
            finally:
                # The acks' timer only if they still wait: a sequential caller's next call, made
                # in a wake above, took them (no timer in the loop's heap for every turn to check).
                if self._acks and self._ack_timer is None:
                    self._ack_timer = self._loop.call_later(ACK_DELAY, self._acks_ready)

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
