"""Protobuf wire encoding for the bulk events of the ``Calls`` stream, and
for the host's events on a ``Namespace`` stream.

Argument chunks and result chunks carry up to a MiB of bytes each. Going
through protobuf messages costs three copies of those bytes per direction
(into the message, out of it by ``SerializeToString`` / attribute access, and
the slice we started from); on this kind of VM a copy of 16 MiB is 3-5 ms.
So the Calls stream carries ready-made ``bytes`` (no request serializer),
argument chunks are written here straight from memoryviews of the pickled
arguments (one join), which are pickled in pieces (`pickle_pieces`: large
values stay the caller's own buffers instead of being copied into the
pickle), and the deserializer hands result chunks over as memoryviews into
the received message. StartCall events, one per call, are encoded here too
(cheaper than building messages), and a call's CallResult is read here
(`RawResult`: parsing it with protobuf and reading its fields cost several
times more). Everything else still goes through the generated classes; the bytes produced and accepted are exactly what protobuf would
produce and accept (``tests/test_wire.py`` checks both ways).

A host event on a Namespace stream (`namespace_event_request`) is encoded
in `agentix.runtime.client.ns_wire`.

Field numbers are those of ``agentix/runtime/v1/runtime.proto``.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, final

from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.utils import context as _context

__all__ = [
    "BULK_MIN_BYTES",
    "CALLS_METHOD",
    "BulkHead",
    "CallsEvent",
    "Pieces",
    "RawResult",
    "RawResultChunk",
    "ack_events",
    "argument_chunk_event",
    "request_event",
    "byte_views",
    "ContextFields",
    "context_carrier",
    "length_header",
    "parse_calls_response",
    "pickle_arguments",
    "pickle_pieces",
    "start_call_event",
    "start_fields",
]

CALLS_METHOD = "/agentix.runtime.v1.RuntimeService/Calls"
# Bulk fields this large are marked (`BulkHead`): the frame wire may carry
# them in its payload ring (the daemon's kSpliceMinBytes and ring floor).
BULK_MIN_BYTES = 64 << 10


class BulkHead(bytes):
    """The encoded bytes that end right before a large bulk field's content
    (``StartCall.arguments``, ``ArgumentChunk.data``) in an event's pieces;
    the views that follow hold its `size` bytes. Other transports send it as
    the bytes it is; the frame wire's payload ring takes the content out
    (frames.py)."""

    size: int


def _bulk_head(head: bytes, size: int) -> bytes:
    if size < BULK_MIN_BYTES:
        return head
    marked = BulkHead(head)
    marked.size = size
    return marked

# Tags (field number << 3 | wire type); wire type 2 is length-delimited, 0 varint.
_EVENTS = 1 << 3 | 2  # CallsRequest.events / CallsResponse.events
_HOST_START = 1 << 3 | 2  # HostEvent.start
_HOST_ARGUMENT_CHUNK = 2 << 3 | 2  # HostEvent.argument_chunk
_CHUNK_CALL_ID = 1 << 3 | 2  # ArgumentChunk.call_id / ResultChunk.call_id
_CHUNK_DATA = 2 << 3 | 2  # ArgumentChunk.data / ResultChunk.data
_CHUNK_OFFSET = 3 << 3 | 0  # ArgumentChunk.offset
_START_CALL_ID = 1 << 3 | 2  # StartCall.call_id
_START_CALLABLE = 2 << 3 | 2  # StartCall.callable
_START_ENCODING_PICKLE = bytes((3 << 3 | 0, pb.ENCODING_PICKLE))  # StartCall.encoding
_START_ARGUMENTS = 4 << 3 | 2  # StartCall.arguments
_START_ARGUMENTS_SIZE = 5 << 3 | 0  # StartCall.arguments_size
_START_CONTEXT = 6 << 3 | 2  # StartCall.context
_START_STREAM_WINDOW = 7 << 3 | 0  # StartCall.stream_window
_START_TRACEPARENT = 8 << 3 | 2  # StartCall.traceparent
_START_TRACESTATE = 9 << 3 | 2  # StartCall.tracestate
_START_BAGGAGE = 10 << 3 | 2  # StartCall.baggage (map entries: key 1, value 2)
_MAP_KEY = 1 << 3 | 2
_MAP_VALUE = 2 << 3 | 2
_HOST_ACK = 5 << 3 | 2  # HostEvent.ack
_ACK_CALL_ID = 1 << 3 | 2  # AckResult.call_id
_SANDBOX_RESULT_CHUNK = 1 << 3 | 2  # SandboxEvent.result_chunk
_SANDBOX_RESULT = 2 << 3 | 2  # SandboxEvent.result
_RESULT_CALL_ID = 1 << 3 | 2  # CallResult.call_id
_RESULT_VALUE = 3 << 3 | 2  # CallResult.value
_RESULT_ENCODING = 2 << 3 | 0  # CallResult.encoding
_RESULT_VALUE_SIZE = 4 << 3 | 0  # CallResult.value_size
_RESULT_LOG_SEQ = 5 << 3 | 0  # CallResult.log_seq
_RESULT_TRACE_SEQ = 6 << 3 | 0  # CallResult.trace_seq


def _varint(value: int) -> bytes:
    if value <= 0x7F:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = [bytes((value,)) for value in range(0x80)]


def length_header(tag: int, length: int) -> bytes:
    """A length-delimited field's tag and varint length."""
    return bytes((tag,)) + _varint(length)


@final  # lets a checker narrow `type(x) is Pieces` both ways (no runtime cost)
class Pieces:
    """Bytes held as consecutive buffers, not joined: a pickle written by
    ``pickle.dump`` (see `pickle_pieces`). ``len()`` is the byte count."""

    __slots__ = ("views", "size")

    def __init__(self, views: list[memoryview]) -> None:
        self.views = views
        self.size = sum(len(view) for view in views)

    def __len__(self) -> int:
        return self.size

    def slice(self, start: int, end: int) -> list[memoryview]:
        """Views (not copies) of the bytes [start, end)."""
        out = []
        pos = 0
        for view in self.views:
            size = len(view)
            if pos + size > start:
                out.append(view[max(start - pos, 0) : end - pos])
            pos += size
            if pos >= end:
                break
        return out


class _PickleSink(list):
    """A file for pickle.dump that keeps what it is handed: the pickler's
    frames, and large bytes values themselves (written straight to the file
    rather than copied into a frame). Anything mutable (a large bytearray)
    is copied, so the arguments are what they were at call time however
    late their chunks go out."""

    __slots__ = ()

    def write(self, data) -> None:
        self.append(data if type(data) is bytes else bytes(data))


def pickle_pieces(obj, joined_up_to: int) -> bytes | Pieces:
    """``pickle.dumps(obj, protocol=5)``'s bytes, as `Pieces` when they are
    longer than ``joined_up_to`` (so large values are not copied), else as
    one ``bytes``."""
    sink = _PickleSink()
    pickle.dump(obj, sink, protocol=5)
    if len(sink) == 1 and type(sink[0]) is bytes:
        return sink[0]
    pieces = Pieces([memoryview(piece) for piece in sink])
    if len(pieces) <= joined_up_to:
        return b"".join(pieces.views)
    return pieces


# ((), {}): the arguments of a call without any.
_NO_ARGUMENTS = pickle.dumps(((), {}), protocol=5)
# Argument types pickled in one piece by pickle.dumps (no large buffer to keep
# out of the pickle); str and bytes only when shorter than _ONE_PIECE_BYTES.
_FLAT_TYPES = frozenset((type(None), bool, int, float))
_STRING_TYPES = frozenset((str, bytes))
_ONE_PIECE_BYTES = 4096


def pickle_arguments(args: tuple, kwargs: dict, joined_up_to: int) -> bytes | Pieces:
    """``pickle_pieces((args, kwargs), joined_up_to)``'s bytes; without
    `_PickleSink` when no argument can be large (none, or positional
    scalars and short strings only), as is common."""
    if not kwargs:
        if not args:
            return _NO_ARGUMENTS
        for arg in args:
            kind = type(arg)
            if kind not in _FLAT_TYPES and (kind not in _STRING_TYPES or len(arg) >= _ONE_PIECE_BYTES):
                break
        else:
            return pickle.dumps((args, kwargs), protocol=5)
    return pickle_pieces((args, kwargs), joined_up_to)


def byte_views(data: bytes | Pieces, start: int, end: int) -> list[memoryview]:
    """Views (not copies) of ``data[start:end]``."""
    if type(data) is Pieces:
        return data.slice(start, end)
    return [memoryview(data)[start:end]]


def request_event(host_event: bytes) -> tuple[bytes, bytes]:
    """The pieces of one ``CallsRequest.events`` entry for a serialized HostEvent."""
    return length_header(_EVENTS, len(host_event)), host_event


# Id length -> the tags and lengths in front of an AckResult's call id in a
# CallsRequest.events entry (ids under 122 bytes: every length is one byte).
_ACK_HEADS = [bytes((_EVENTS, n + 4, _HOST_ACK, n + 2, _ACK_CALL_ID, n)) for n in range(122)]


def ack_events(call_ids: Sequence[str]) -> bytes:
    """The ``CallsRequest.events`` entries holding ``HostEvent{ack: {call_id}}``
    for each id, in order, exactly as protobuf serializes them (an empty id
    is left out as protobuf leaves an empty field out)."""
    heads = _ACK_HEADS
    out = []
    for call_id in call_ids:
        ident = call_id.encode()
        size = len(ident)
        if 0 < size < 122:
            out.append(heads[size])
            out.append(ident)
        else:
            ack = length_header(_ACK_CALL_ID, size) + ident if size else b""
            event = length_header(_HOST_ACK, len(ack)) + ack
            out.append(length_header(_EVENTS, len(event)) + event)
    return b"".join(out)


def argument_chunk_event(call_id: str, data: memoryview | list[memoryview], offset: int) -> list:
    """The pieces of one ``CallsRequest.events`` entry holding
    ``HostEvent{argument_chunk: {call_id, data, offset}}``; joined with other
    entries they form a CallsRequest. ``data`` (a byte view, or a list of
    them meaning their concatenation) is not copied here."""
    views = [data] if type(data) is memoryview else data  # memoryview is final: narrows both ways
    size = sum(len(view) for view in views)
    ident = call_id.encode()
    chunk_head = length_header(_CHUNK_CALL_ID, len(ident)) + ident
    chunk_tail = bytes((_CHUNK_OFFSET,)) + _varint(offset)
    data_head = length_header(_CHUNK_DATA, size)
    chunk_size = len(chunk_head) + len(data_head) + size + len(chunk_tail)
    event_head = length_header(_HOST_ARGUMENT_CHUNK, chunk_size)
    return [
        length_header(_EVENTS, len(event_head) + chunk_size),
        event_head,
        chunk_head,
        _bulk_head(data_head, size),
        *views,
        chunk_tail,
    ]


class ContextFields(bytes):
    """StartCall's plain context fields (traceparent, tracestate, baggage),
    already encoded as protobuf fields: `start_call_event` writes them as
    they are instead of as the pickled ``context`` field."""

    __slots__ = ()


_PLAIN_VARS = frozenset(("agentix_context_baggage", "agentix_trace_current_trace", "agentix_trace_current_span"))
_TRACE_ID = re.compile(r"trace_[0-9a-f]{32}").fullmatch
_SPAN_ID = re.compile(r"span_[0-9a-f]{24}").fullmatch
_ZERO_TRACE_ID = "trace_" + "0" * 32
_ZERO_PARENT = "0" * 16


def _field(tag: int, text: str) -> bytes:
    data = text.encode()
    return length_header(tag, len(data)) + data


def context_carrier() -> bytes:
    """The current context for a StartCall: b"" when nothing is propagated;
    `ContextFields` (traceparent, tracestate, baggage) when every baggage key
    and value is a str and the only other propagated vars are the agentix
    trace scope, with a current span whose ids are agentix's own; else the
    pickled carrier (see `agentix.utils.context.encode`).

    The plain form carries ids, not objects: in the sandbox the current span
    and trace have the host's ids and an empty name."""
    captured = _context.capture()
    if not captured:
        return b""
    if _PLAIN_VARS.issuperset(captured):
        trace_part = _trace_fields(captured)
        if trace_part is not None:
            baggage_part = _baggage_fields(captured.get("agentix_context_baggage"))
            if baggage_part is not None and (trace_part or baggage_part):
                return ContextFields(trace_part + baggage_part)
    return pickle.dumps(captured, protocol=5)


# One-entry caches: calls made in the same span / baggage scope reuse the
# encoded fields (the baggage mapping is replaced, never changed in place,
# by agentix.context; spans keep their ids).
_last_span: tuple[str, str, bytes] = ("", "", b"")
_last_baggage: tuple[object, bytes | None] = (None, b"")


if TYPE_CHECKING:
    from agentix.utils.trace import Span as _Span, Trace as _Trace

_trace_types: tuple[type[_Span], type[_Trace]] | None = None


def _load_trace_types() -> tuple[type[_Span], type[_Trace]]:
    """agentix.utils.trace imports this module's package indirectly: looked up
    on first use, not at import."""
    global _trace_types
    from agentix.utils.trace import Span, Trace

    _trace_types = (Span, Trace)
    return _trace_types


def _trace_fields(captured: dict) -> bytes | None:
    """traceparent + tracestate for the captured trace scope, b"" without
    one, None when it needs the pickle (a trace with no span open, ids that
    are not agentix's own)."""
    global _last_span
    span = captured.get("agentix_trace_current_span")
    current = captured.get("agentix_trace_current_trace")
    if span is None:
        return b"" if current is None else None
    trace_types = _trace_types
    if trace_types is None:
        trace_types = _load_trace_types()
    Span, Trace = trace_types  # noqa: N806 - classes
    if type(span) is not Span:
        return None
    trace_id, span_id = span.trace_id, span.span_id
    if current is not None and (type(current) is not Trace or current.trace_id != trace_id):
        return None
    cached_span, cached_trace, encoded = _last_span
    if span_id == cached_span and trace_id == cached_trace:
        return encoded
    if (
        type(trace_id) is not str
        or type(span_id) is not str
        or not _TRACE_ID(trace_id)
        or not _SPAN_ID(span_id)
        or trace_id == _ZERO_TRACE_ID
        or span_id[5:21] == _ZERO_PARENT
    ):
        return None
    encoded = _field(_START_TRACEPARENT, f"00-{trace_id[6:]}-{span_id[5:21]}-01") + _field(
        _START_TRACESTATE, "agentix=" + span_id[5:]
    )
    _last_span = (span_id, trace_id, encoded)
    return encoded


def _baggage_fields(baggage: object) -> bytes | None:
    """The baggage map entries, b"" for none, None unless every key is a
    non-empty str and every value a str."""
    global _last_baggage
    if not baggage:
        return b""
    cached, encoded = _last_baggage
    if baggage is cached:
        return encoded
    out = []
    for key, value in baggage.items():  # type: ignore[attr-defined]
        if type(key) is not str or not key or type(value) is not str:
            _last_baggage = (baggage, None)
            return None
        entry = _field(_MAP_KEY, key) + _field(_MAP_VALUE, value)
        out.append(length_header(_START_BAGGAGE, len(entry)) + entry)
    encoded = b"".join(out)
    _last_baggage = (baggage, encoded)
    return encoded


# callable_ref -> its StartCall fields (callable, encoding): the same for
# every call of a function. Bounded; cleared when full.
_callable_fields: dict[str, bytes] = {}
_MAX_CALLABLE_FIELDS = 4096


def start_fields(callable_ref: str) -> bytes:  # StartCall's callable and encoding (cached)
    fields = _callable_fields.get(callable_ref)
    if fields is None:
        ref = callable_ref.encode()
        fields = (length_header(_START_CALLABLE, len(ref)) + ref if ref else b"") + _START_ENCODING_PICKLE
        if len(_callable_fields) >= _MAX_CALLABLE_FIELDS:
            _callable_fields.clear()
        _callable_fields[callable_ref] = fields
    return fields


# Call id length -> StartCall's call_id tag and length (ids under 128 bytes).
_CALL_ID_HEADS = [bytes((_START_CALL_ID, n)) for n in range(128)]


def start_call_event(
    call_id: str,
    callable_ref: str,
    arguments: bytes | memoryview | list[memoryview],
    arguments_size: int,
    context: bytes,
    stream_window: int,
) -> list:
    """The pieces of one ``CallsRequest.events`` entry holding
    ``HostEvent{start: StartCall{...}}`` with pickle encoding, where
    ``arguments`` is the first chunk of the arguments (a byte view, or a list
    of them meaning their concatenation; not copied here unless shorter
    than `_ONE_PIECE_BYTES`: then the event is one ``bytes``, one buffer
    fewer for the socket to gather).
    Fields in number order, zero values left out: the bytes protobuf would
    produce, for a fraction of the cost of building the messages (the
    callable's fields are encoded once per callable)."""
    views: Sequence[bytes | memoryview]
    if isinstance(arguments, list):
        views = arguments
        size = sum(len(view) for view in views)
    else:
        views = (arguments,)
        size = len(arguments)
    ident = call_id.encode()
    length = len(ident)
    fields = _callable_fields.get(callable_ref) or start_fields(callable_ref)  # never empty (the encoding)
    if length:
        head = (_CALL_ID_HEADS[length] if length < 128 else length_header(_START_CALL_ID, length)) + ident + fields
    else:
        head = fields
    if size:
        head += bytes((_START_ARGUMENTS, size)) if size < 0x80 else length_header(_START_ARGUMENTS, size)
    if arguments_size:
        tail = bytes((_START_ARGUMENTS_SIZE, arguments_size)) if arguments_size < 0x80 else (
            bytes((_START_ARGUMENTS_SIZE,)) + _varint(arguments_size))
    else:
        tail = b""
    if context:
        tail += context if type(context) is ContextFields else length_header(_START_CONTEXT, len(context)) + context
    if stream_window:
        tail += bytes((_START_STREAM_WINDOW,)) + _varint(stream_window)
    start_size = len(head) + size + len(tail)
    if start_size < 0x7E:  # both lengths in front of it are one byte
        head = bytes((_EVENTS, start_size + 2, _HOST_START, start_size)) + head
    else:
        event_head = length_header(_HOST_START, start_size)
        head = length_header(_EVENTS, len(event_head) + start_size) + event_head + head
    if size < _ONE_PIECE_BYTES:
        return [b"".join((head, *views, tail))]
    return [_bulk_head(head, size), *views, tail]


@final  # as Pieces: `type(event) is RawResultChunk` narrows both ways
class RawResultChunk:
    """A ``SandboxEvent.result_chunk`` read without protobuf: ``data`` is a
    memoryview into the received message."""

    __slots__ = ("call_id", "data")

    def __init__(self, call_id: str, data: memoryview) -> None:
        self.call_id = call_id
        self.data = data


class _Malformed(Exception):
    pass


class _NotOnlyResults(Exception):
    """A short message holds an event other than a CallResult: protobuf
    parses it whole, in one call (cheaper than one per event)."""


def _read_varint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _read_result_chunk(buf: memoryview, pos: int, end: int) -> RawResultChunk | None:
    """ResultChunk fields in buf[pos:end]; None if anything but call_id and
    data is there (the caller then lets protobuf parse the event)."""
    call_id = ""
    data = buf[0:0]
    while pos < end:
        tag, pos = _read_varint(buf, pos, end)
        if tag not in (_CHUNK_CALL_ID, _CHUNK_DATA):
            return None
        length, pos = _read_varint(buf, pos, end)
        if length > end - pos:
            raise _Malformed
        if tag == _CHUNK_CALL_ID:
            call_id = str(buf[pos : pos + length], "utf-8")
        else:
            data = buf[pos : pos + length]
        pos += length
    return RawResultChunk(call_id, data)


@final
class RawResult:
    """A ``SandboxEvent.result`` (`CallResult`) read without protobuf (a noop's response: several times
    cheaper); ``value`` is bytes, ``encoding`` pickle or unspecified (others are left to protobuf, as
    is anything unexpected). With the native module: its ``CallResultFields`` (made from a tuple)."""

    __slots__ = __match_args__ = ("call_id", "encoding", "value", "value_size", "log_seq", "trace_seq")

    def __init__(self, fields: tuple[str, int, bytes, int, int, int]) -> None:
        self.call_id, self.encoding, self.value, self.value_size, self.log_seq, self.trace_seq = fields


# A CallsResponse's CallResults read in C (None: it holds anything else), and their type.
try:
    from agentix.runtime.client._native_calls import call_results as _native_call_results, CallResultFields as _Native
except Exception:  # the pure wheel, another interpreter, libgrpc++ missing (as channels.native_calls_module)
    _native_call_results = _Native = None
if not TYPE_CHECKING and _Native is not None:
    RawResult = _Native  # noqa: F811
_new_result: Callable[[tuple[str, int, bytes, int, int, int]], RawResult] = RawResult  # (fields) -> RawResult


def _read_result(buf: bytes | memoryview, pos: int, end: int) -> RawResult | None:
    """CallResult fields in buf[pos:end]; None if a field is not one of
    CallResult's as protobuf writes it, or the encoding is neither
    unspecified nor pickle (the caller then lets protobuf parse the event).
    Later occurrences of a field win, as in protobuf."""
    call_id, value, encoding, value_size, log_seq, trace_seq = "", b"", 0, 0, 0, 0
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag == _RESULT_CALL_ID or tag == _RESULT_VALUE:
            length = buf[pos]  # one byte is the common case: no call for it
            if length < 0x80:
                pos += 1
            else:
                length, pos = _read_varint(buf, pos, end)
            stop = pos + length
            if stop > end:
                raise _Malformed
            if tag == _RESULT_CALL_ID:
                call_id = str(buf[pos:stop], "utf-8")
            else:
                value = bytes(buf[pos:stop])  # no copy of a bytes slice
            pos = stop
        elif _RESULT_ENCODING <= tag <= _RESULT_TRACE_SEQ and tag & 7 == 0 and tag != 3 << 3:
            number = buf[pos]
            if number < 0x80:
                pos += 1
            else:
                number, pos = _read_varint(buf, pos, end)
                if number >> 64:
                    return None
            if tag == _RESULT_ENCODING:
                encoding = number
            elif tag == _RESULT_VALUE_SIZE:
                value_size = number
            elif tag == _RESULT_LOG_SEQ:
                log_seq = number
            else:
                trace_seq = number
        else:
            return None
    if pos != end:  # a one-byte read ran past the event
        raise _Malformed
    return None if encoding > pb.ENCODING_PICKLE else _new_result((call_id, encoding, value, value_size, log_seq, trace_seq))


# Result chunks in a message at least this long are handed over as views
# into it (`RawResultChunk`) instead of copies, and its other events are
# parsed one by one; a shorter one holding anything but CallResults is
# parsed by protobuf in one call.
_PARSE_WHOLE_BYTES = 64 * 1024


CallsEvent: TypeAlias = "RawResult | RawResultChunk | pb.SandboxEvent"  # as parse_calls_response reads one


class SelfParsing(Protocol):  # a message that reads itself (payload_ring.SplitMessage)
    def events(self) -> Sequence[CallsEvent]: ...


def parse_calls_response(message: bytes | memoryview | SelfParsing) -> Sequence[CallsEvent]:
    """The events of one serialized ``CallsResponse``: a `RawResult` per call result, a
    `RawResultChunk` per result chunk in a message of at least `_PARSE_WHOLE_BYTES`, else
    ``pb.SandboxEvent``s (every event of a shorter message holding anything but results).
    Anything unexpected (unknown fields, a malformed message) is left to protobuf, which parses
    it or raises as it would have; the frame wire's `payload_ring.SplitMessage` reads itself."""
    if not isinstance(message, (bytes, memoryview)):
        return message.events()
    if _native_call_results is not None and (results := _native_call_results(message)) is not None:
        return results  # only CallResults (a noop's response): read in C
    end = len(message)
    long = end >= _PARSE_WHOLE_BYTES
    # Result chunks become views into a long message; a short one is read as it is.
    view = memoryview(message) if long or type(message) is not bytes else None
    buf: bytes | memoryview = message if view is None else view
    events: list = []
    try:
        pos = 0
        while pos < end:
            if buf[pos] != _EVENTS:
                raise _Malformed
            length = buf[pos + 1]
            if length < 0x80:
                pos += 2
            else:
                length, pos = _read_varint(buf, pos + 1, end)
            event_end = pos + length
            if event_end > end:
                raise _Malformed
            event: object = None
            if length:
                field = buf[pos]
                if field == _SANDBOX_RESULT or (long and field == _SANDBOX_RESULT_CHUNK):
                    inner = buf[pos + 1]
                    if inner < 0x80:
                        inner_pos = pos + 2
                    else:
                        inner, inner_pos = _read_varint(buf, pos + 1, event_end)
                    if inner_pos + inner == event_end:  # the event is that one field
                        if field == _SANDBOX_RESULT:
                            event = _read_result(buf, inner_pos, event_end)
                        elif view is not None:  # (always: the message is long)
                            event = _read_result_chunk(view, inner_pos, event_end)
            if event is None:
                if not long:
                    raise _NotOnlyResults
                event = pb.SandboxEvent.FromString(bytes(buf[pos:event_end]))
            events.append(event)
            pos = event_end
    except _NotOnlyResults:
        return pb.CallsResponse.FromString(message).events
    except Exception:  # _Malformed, a bad UTF-8 id, protobuf's DecodeError
        return list(pb.CallsResponse.FromString(message).events)
    return events
