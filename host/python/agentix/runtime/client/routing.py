"""How a Calls stream handles the events it reads (`CallRouter`, the base of
`agentix.runtime.client.stream.CallsStream`): each `SandboxEvent` goes to the
`PendingCall` of its ``call_id``; `ResultChunk` bytes accumulate (refused
past ``max_result_bytes``), streamed items go to the call's queue in order,
and a terminal `CallResult` or `CallError` is turned into the call's
`Outcome` and handed to the stream's ``_finish``, which settles and
acknowledges it.

An exception raised while one call's event is handled (a host bug, or an
event the host cannot use) fails that call with a ``MalformedError``
`RemoteCallError` caused by it, acknowledges a terminal event and cancels
the call otherwise; the stream and the other calls go on. One that belongs
to no call (a response that cannot be read) fails every pending call with
`RuntimeUnreachable` and drops the stream, which the client then does not
resume: the daemon would replay the same events into the same failure
(docs/RELIABILITY.md, "Host-side failures").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agentix.runtime.client import wire
from agentix.runtime.client.errors import RemoteCallError, ResultTooLarge, RuntimeUnreachable
from agentix.runtime.client.pending import Outcome, PendingCall, SideBarrier, remote_error_outcome
from agentix.runtime.shared.models import RemoteError
from agentix.runtime.v1 import runtime_pb2 as pb

if TYPE_CHECKING:
    from agentix.runtime.client.chunking import Upload
    from agentix.runtime.client.pending import CallFuture

__all__ = ["CallRouter"]

_RawResult = wire.RawResult  # (the native CallResultFields when the extension is there)

_log = logging.getLogger("agentix.runtime.client")


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


class CallRouter:
    """Routes the events of a Calls stream's responses to the calls in its
    client's table (see the module docstring). The stream (`CallsStream`)
    provides the state and the operations declared here."""

    _pending: dict[str, PendingCall]
    _uploads_by_id: dict[str, Upload]
    _woken: list[CallFuture] | None
    _lost: bool
    _dropped_ids: list[str]

    def cancel_call(self, call_id: str) -> None:
        raise NotImplementedError

    def _drop_upload(self, call_id: str) -> None:
        raise NotImplementedError

    def _finish(self, call_id: str, outcome: Outcome | ResultTooLarge | None) -> None:
        raise NotImplementedError

    def _report_lost(self, error: BaseException | None) -> None:
        raise NotImplementedError

    def _route_message(self, message: bytes | memoryview | wire.SelfParsing) -> None:
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
        pending = self._pending
        for event in events:
            try:
                # A plain call's whole result without a barrier (a noop's): the checks of _route,
                # _on_result and _result_outcome without their calls, then _finish as theirs.
                # (A RawResult's encoding is always unspecified or pickle.)
                if type(event) is _RawResult and not event.log_seq and not event.trace_seq:
                    call = pending.get(event.call_id)
                    if call is not None and call.items is None and not call.result_chunks:
                        value = event.value
                        size = len(value)
                        if size <= call.max_result_bytes and (not event.value_size or event.value_size == size):
                            self._finish(event.call_id, value)
                            continue
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
            self._finish(call_id, None)  # no longer pending: the ack alone (and its upload dropped)
        else:
            self.cancel_call(call_id)  # (drops its upload too)

    def _call_failed(self, call: PendingCall, kind: str, error: Exception) -> None:
        """Fails `call`, whose `kind` event raised `error` on the host, with a
        ``MalformedError`` `RemoteCallError` caused by `error`; logged once
        with the traceback (a host bug, or an event the host cannot use)."""
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
        """`what` raised `error`, and no one call's event was at fault: every
        pending call fails with `RuntimeUnreachable` (caused by `error`) and
        the stream is dropped. Resuming them on a new stream would have the
        daemon replay the same events into the same failure, for ever; the
        next stream cancels and acknowledges them instead (`take_unsent_acks`),
        so the daemon does not retain them until eviction."""
        pending = list(self._pending.values())
        self._pending.clear()
        self._dropped_ids.extend(call.call_id for call in pending)
        _log.error("%s on the runtime's Calls stream raised; the stream is dropped and its %d pending call(s) "
                   "fail", what, len(pending), exc_info=error)
        for call in pending:
            failure = RuntimeUnreachable(
                f"runtime Calls stream dropped by the host: {what} raised {type(error).__name__}: {error}; "
                f"remote call '{call.display_name}' ({call.call_id}) is not resumed"
            )
            failure.__cause__ = error
            try:
                call.fail(failure)
            except Exception:  # a subclass's fail() raised
                _log.error("failing call %s raised", call.call_id, exc_info=True)
                PendingCall.fail(call, failure)
        self._report_lost(error)

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
            call.start = None  # as in _add_chunk
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
        call.start = None  # it ran, so the daemon has its arguments: a resume need not re-send them
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
            # Left in pieces: restricted_loads_chunks decodes them unjoined. The
            # outcome's list is then the only one holding them, and the decode
            # empties it (consume=True): ring pieces are free once decoded.
            value = [*call.result_chunks, result.value]
            call.result_chunks = []
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
