"""The host half of ``RuntimeService.Traces``: trace and span lifecycle events
from the sandbox replayed into the host's trace processors (`agentix.trace`).

A `TracesStream` subscribes with the last seq its client has seen, then
replays every event of every `TracesResponse` in order (`replay_event`) and
acknowledges each response with one `AckTraces`. Events whose seq is not
above the last one seen are dropped, so resubscribing never replays an event
twice. Delivery, failure handling and closing are those of the ``Logs``
stream (`agentix.runtime.client.subscription.SubscriptionStream`): its own
task, replay in a worker thread, a lost stream re-opened by the next call, a
daemon without ``Traces`` (UNIMPLEMENTED) not asked again.

Each event becomes a fresh `Trace` or `Span` handed to
``agentix.utils.trace._dispatch``, so replayed items get the same processor
order, disabling (``set_tracing_disabled``) and error handling as local ones.

What the sandbox chooses is bounded before processors see it: names (of
traces, spans and span events) are cut to `MAX_NAME_CHARS`, attribute keys to
`MAX_KEY_CHARS`; a trace, span, span event or error keeps its first
`MAX_ATTRIBUTES` attributes and a span its first `MAX_EVENTS` events (as
OpenTelemetry's default limits), the number left out in the attribute
``agentix.dropped_attributes`` / ``agentix.dropped_events``. An event whose
agentix ids are longer than `MAX_ID_CHARS` is refused (ValueError: the stream
reports and skips it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentix.runtime.client.subscription import ReplayedOnce, ResponseDecoder, SeqCursor, SubscriptionStream
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.utils import trace as _trace
from agentix.utils.trace import Span, SpanError, SpanEvent, SpanStatus, Trace

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_EVENTS",
    "MAX_ID_CHARS",
    "MAX_KEY_CHARS",
    "MAX_NAME_CHARS",
    "EventReplayer",
    "TraceCursor",
    "TracesStream",
    "decode_response",
    "replay_event",
    "trace_item",
]

# Bounds on what a sandbox's trace events make the host build (module docstring).
MAX_NAME_CHARS = 1024
MAX_KEY_CHARS = 256
MAX_ATTRIBUTES = 128
MAX_EVENTS = 128
MAX_ID_CHARS = 128
DROPPED_ATTRIBUTES = "agentix.dropped_attributes"
DROPPED_EVENTS = "agentix.dropped_events"

_STATUSES: dict[int, SpanStatus] = {
    pb.SPAN_STATUS_CODE_UNSET: "unset",
    pb.SPAN_STATUS_CODE_OK: "ok",
    pb.SPAN_STATUS_CODE_ERROR: "error",
}

_METHODS = {
    pb.TRACE_EVENT_KIND_TRACE_START: "on_trace_start",
    pb.TRACE_EVENT_KIND_TRACE_END: "on_trace_end",
    pb.TRACE_EVENT_KIND_SPAN_START: "on_span_start",
    pb.TRACE_EVENT_KIND_SPAN_END: "on_span_end",
}
_TRACE_KINDS = frozenset({pb.TRACE_EVENT_KIND_TRACE_START, pb.TRACE_EVENT_KIND_TRACE_END})


class TraceCursor(SeqCursor):
    """The seq of the last trace event a client has replayed and the daemon
    instance it counts in (see `SeqCursor`)."""

    __slots__ = ()


def iso_from_nanos(nanos: int) -> str | None:
    """``nanos`` since the epoch as the ISO-8601 UTC string `agentix.trace`
    uses (``YYYY-MM-DDTHH:MM:SS.ffffffZ``, truncated to microseconds); None
    for 0 or less (not set)."""
    if nanos <= 0:
        return None
    return _trace.iso_from_unix_micros(nanos // 1000)


# How trace_item stamps times: iso_from_nanos until a Traces stream first
# replays a batch, then native_stamp()'s choice (the native module loads
# grpc++, so it is not imported with this module).
_stamp: Callable[[int], str | None] = iso_from_nanos
_stamp_chosen = False
# And `_native_calls.span_item` (trace_item's Span of a plain span event,
# made in one call) once chosen with it, when the native module loads.
_native_span: Callable[..., Span | None] | None = None
# And the span_item and `_native_calls.SpanReplayer` chosen with it (None
# without the native module): a batch replays through a SpanReplayer only
# while `_native_span` is still that span_item.
_native_span_item: Callable[..., Span | None] | None = None
_native_replayer: Any = None


def attribute_value(value: pb.AttributeValue) -> Any:
    """The Python value of the set member of the oneof (str, bool, int,
    float or bytes); None when none is set."""
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def attributes(items: Sequence[Any]) -> dict[str, Any]:
    """``{key: value}`` of the first `MAX_ATTRIBUTES` wire items
    (`pb.Attribute` messages, or the native decoder's ``(key, value)``
    pairs), in wire order (a repeated key: the last one wins), keys cut to
    `MAX_KEY_CHARS`; ``agentix.dropped_attributes`` counts the items left
    out, if any."""
    out = {}
    count = len(items)
    for item in items[:MAX_ATTRIBUTES] if count > MAX_ATTRIBUTES else items:
        if type(item) is tuple:
            key, value = item
        else:
            value = item.value
            kind = value.WhichOneof("value")
            key = item.key
            value = None if kind is None else getattr(value, kind)
        out[key if len(key) <= MAX_KEY_CHARS else key[:MAX_KEY_CHARS]] = value
    if count > MAX_ATTRIBUTES:
        out[DROPPED_ATTRIBUTES] = count - MAX_ATTRIBUTES
    return out


def _name(name: str) -> str:
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS]


def _check_ids(event: pb.TraceEvent) -> None:
    """Raises ValueError when an agentix id of `event` is longer than `MAX_ID_CHARS`."""
    for field in ("agentix_trace_id", "agentix_span_id", "agentix_parent_id"):
        length = len(getattr(event, field))
        if length > MAX_ID_CHARS:
            raise ValueError(f"trace event refused: its {field} has {length} characters, more than {MAX_ID_CHARS}")


def trace_item(event: pb.TraceEvent) -> Trace | Span | None:
    """The fresh `Trace` or `Span` an event describes; None for a kind this
    host does not know (UNSPECIFIED or newer).

    TRACE_START / TRACE_END: ``Trace(agentix_trace_id, name, metadata,
    started_at, ended_at)``; metadata comes from the attributes on TRACE_START
    only (TRACE_END carries ``name=""`` and no metadata, as in the original).
    SPAN_START / SPAN_END: ``Span(agentix_span_id, agentix_trace_id,
    agentix_parent_id or None, name, attrs, started_at, ended_at, status,
    status_description or None, error, events)``, where attrs gets
    ``call_id`` (``setdefault``: a span attribute of that name wins) when the
    event names a call, and error is ``SpanError(error_message, error_data or
    None)`` when ``error_message`` is set. Timestamps unset on the wire
    (0) are None (an event's timestamp ""). Sandbox-chosen sizes are bounded
    as the module docstring says (ValueError for an over-long id).
    """
    kind = event.kind
    if kind not in _METHODS:
        return None
    trace_id = event.agentix_trace_id
    span_id = event.agentix_span_id
    parent_id = event.agentix_parent_id
    if len(trace_id) > MAX_ID_CHARS or len(span_id) > MAX_ID_CHARS or len(parent_id) > MAX_ID_CHARS:
        _check_ids(event)
    stamp = _stamp
    started_at = stamp(event.start_time_unix_nanos)
    ended_at = stamp(event.end_time_unix_nanos)
    if kind in _TRACE_KINDS:
        metadata = attributes(event.attributes) if kind == pb.TRACE_EVENT_KIND_TRACE_START else {}
        return Trace(
            trace_id=trace_id,
            name=_name(event.name),
            metadata=metadata,
            started_at=started_at,
            ended_at=ended_at,
        )
    wire_attributes = event.attributes
    attrs = attributes(wire_attributes) if wire_attributes else {}
    call_id = event.call_id
    if call_id:
        attrs.setdefault("call_id", call_id)
    error = None
    if event.error_message:
        error = SpanError(message=event.error_message, data=attributes(event.error_data) or None)
    wire_events = event.events
    if wire_events and len(wire_events) > MAX_EVENTS:
        attrs[DROPPED_EVENTS] = len(wire_events) - MAX_EVENTS
        wire_events = wire_events[:MAX_EVENTS]
    name = event.name
    # Positional, in Span's field order (span_id, trace_id, parent_id, name,
    # attrs, started_at, ended_at, status, status_description, error,
    # events): half the cost of keywords, twice per span.
    return Span(
        span_id,
        trace_id,
        parent_id or None,
        name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS],
        attrs,
        started_at,
        ended_at,
        _STATUSES.get(event.status, "unset"),
        event.status_description or None,
        error,
        [
            SpanEvent(_name(record.name), stamp(record.time_unix_nanos) or "", attributes(record.attributes))
            for record in wire_events
        ]
        if wire_events
        else [],
    )


# The instance id and the events of a serialized `TracesResponse`: the
# native decoder's ``TraceEventFields`` (``_native_calls.trace_events``:
# attribute lists as ``(key, value)`` pairs, no OpenTelemetry ids) or
# protobuf's `pb.TraceEvent` messages (see `ResponseDecoder`).
decode_response = ResponseDecoder("trace_events", pb.TracesResponse, "events")


def native_stamp() -> Callable[[int], str | None]:
    """``_native_calls.iso_from_unix_nanos`` (the same text as
    `iso_from_nanos`, made in C), or `iso_from_nanos` itself without the
    native module (the pure wheel)."""
    try:
        from agentix.runtime.client import _native_calls
    except ImportError:
        return iso_from_nanos
    return _native_calls.iso_from_unix_nanos


def replay_event(event: pb.TraceEvent) -> None:
    """Hands one sandbox trace event to the host's trace processors:
    ``_dispatch("on_trace_start" | "on_trace_end" | "on_span_start" |
    "on_span_end", trace_item(event))``. Events of an unknown kind are
    ignored. Processor exceptions are handled by ``_dispatch`` (logged and
    swallowed)."""
    item = trace_item(event)
    if item is not None:
        _trace._dispatch(_METHODS[event.kind], item)


def _is_no_op(processor: Any, method: str) -> bool:
    """Whether `processor`'s `method` is `Processor`'s own (which does nothing)."""
    bound = getattr(processor, method, None)
    return getattr(bound, "__func__", None) is _NO_OP_METHODS[method]


_NO_OP_METHODS = {method: getattr(_trace.Processor, method) for method in _METHODS.values()}


class EventReplayer:
    """Replays the events of one `TracesResponse` on the calling thread, each
    as `replay_event` describes, except that an event whose method no
    registered processor implements (each one's is `Processor`'s no-op; e.g.
    ``on_span_start`` when every processor only watches ``on_span_end``) is
    not made into a `Span`/`Trace` at all: dispatching it would change
    nothing. Its ids are still checked (an over-long one is refused as
    always). Which methods are skipped is worked out again whenever the
    processor list changes. Once `choose_native` has run, a plain span
    event's `Span` comes from ``_native_calls.span_item`` (the same object
    as `trace_item`'s, in one C call); any other event takes `trace_item`."""

    __slots__ = ("_processors", "_skipped")

    def __init__(self) -> None:
        self._processors: tuple[Any, ...] | None = None
        self._skipped: frozenset[str] = frozenset()

    def _refresh(self, processors: tuple[Any, ...]) -> None:
        self._processors = processors
        if not processors:
            # _dispatch does nothing then, but warns once at a span's end.
            self._skipped = frozenset(m for m in _METHODS.values() if m != "on_span_end")
        else:
            self._skipped = frozenset(
                m for m in _METHODS.values() if all(_is_no_op(p, m) for p in processors))

    def replay(self, event: pb.TraceEvent) -> None:
        method = _METHODS.get(event.kind)
        if method is None:
            return
        processors = _trace._processors
        if processors is not self._processors:
            self._refresh(processors)
        if method in self._skipped or _trace._disabled:
            if (len(event.agentix_trace_id) > MAX_ID_CHARS or len(event.agentix_span_id) > MAX_ID_CHARS
                    or len(event.agentix_parent_id) > MAX_ID_CHARS):
                _check_ids(event)
            return
        item: Trace | Span | None = None
        native = _native_span
        if native is not None:  # None: not a plain span event, trace_item bounds it
            item = native(event, Span, MAX_ID_CHARS, MAX_NAME_CHARS, MAX_KEY_CHARS, MAX_ATTRIBUTES)
        if item is None:
            item = trace_item(event)
        if item is not None:
            _trace._dispatch(method, item)


def native_span() -> Callable[..., Span | None] | None:
    """``_native_calls.span_item``, or None without the native module."""
    try:
        from agentix.runtime.client import _native_calls
    except ImportError:
        return None
    return _native_calls.span_item


def _native_replayer_type() -> Any:
    """``_native_calls.SpanReplayer``, or None without the native module."""
    try:
        from agentix.runtime.client import _native_calls
    except ImportError:
        return None
    return _native_calls.SpanReplayer


def choose_native() -> None:
    """Makes replay stamp times with `native_stamp` and build plain spans
    with `native_span`, and batches replay through ``SpanReplayer`` (once;
    a Traces stream calls it before its first batch)."""
    global _stamp, _stamp_chosen, _native_span, _native_span_item, _native_replayer
    if not _stamp_chosen:
        _stamp, _native_span, _stamp_chosen = native_stamp(), native_span(), True
        _native_span_item, _native_replayer = _native_span, _native_replayer_type()


def _processor_raised(processor: Any, method: str, error: BaseException) -> None:
    """What ``_dispatch`` logs when a processor raises, for SpanReplayer."""
    _trace._logger.exception("trace processor %r raised in %s", processor, method, exc_info=error)


def batch_replayer() -> Callable[[Any], None]:
    """One batch's replay: an `EventReplayer`'s, through
    ``_native_calls.SpanReplayer`` (its plain span path in C, one call per
    event with no Python frame: the same processor calls, in the same order,
    and the same log record for one that raises) when the native module
    loads and `_native_span` is its span_item."""
    choose_native()
    replayer = EventReplayer()
    if _native_replayer is None or _native_span is not _native_span_item:
        return replayer.replay
    return _native_replayer(
        replayer=replayer, fallback=replayer.replay, trace_module=_trace, span_type=Span,
        report=_processor_raised, max_id_chars=MAX_ID_CHARS, max_name_chars=MAX_NAME_CHARS,
        max_key_chars=MAX_KEY_CHARS, max_attributes=MAX_ATTRIBUTES,
    )


class TracesStream(SubscriptionStream):
    """Drives one open ``Traces`` RPC; see the module docstring and
    `SubscriptionStream` (same arguments, with a `TraceCursor`)."""

    _replayed_once = ReplayedOnce()
    rpc_name = "Traces"
    noun = "sandbox trace event"
    decoder = decode_response

    def _subscribe_request(self, after_seq: int, instance_id: str) -> pb.TracesRequest:
        return pb.TracesRequest(subscribe=pb.SubscribeTraces(after_seq=after_seq, instance_id=instance_id))

    def _ack_request(self, seq: int) -> pb.TracesRequest:
        return pb.TracesRequest(ack=pb.AckTraces(seq=seq))

    def _batch_replayer(self) -> Callable[[Any], None]:
        return batch_replayer()

    def _describe(self, item: pb.TraceEvent) -> str:
        kind = pb.TraceEventKind.Name(item.kind) if item.kind in _METHODS else item.kind
        return f"{kind} {item.name[:MAX_NAME_CHARS]!r}"
