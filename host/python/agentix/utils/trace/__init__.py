"""Tracing: traces, spans and the processors that receive them; also
reachable as ``agentix.trace``.

A *trace* groups one workflow; a *span* is one operation inside it. Both are
opened with context managers and become the current trace / span for the
block::

    from agentix import trace

    trace.collect("runs/trace.jsonl")              # or add_processor(...)
    with trace.trace("agent-run", user="ada"):
        with trace.span("plan", step=1) as s:
            s.add_event("cache_miss", key="k1")
            await client.remote(tool)               # sandbox spans parent to "plan"

Scope lives in two *propagated* context vars (``agentix_trace_current_trace``,
``agentix_trace_current_span``, see `agentix.utils.context`), so every remote
call carries the current `Trace` / `Span` (pickled) to the sandbox and spans
opened there share the host's ``trace_id`` and parent to the host's span.
Scope follows `contextvars`: threads started with a copied context and asyncio
tasks each see their own current span.

Processors (`Processor`) are called synchronously, in registration order, from
the code that opens and closes traces and spans. An exception raised by a
processor is logged on the ``agentix.trace`` logger and swallowed: tracing
never breaks the traced code. Span events and the final status/error are only
visible at `Processor.on_span_end`.

Extension points: anything that wants to observe traces (an OTel exporter, the
sandbox-side forwarder, ...) is a `Processor`; code that receives traces and
spans made elsewhere (the host-side replay of sandbox spans) builds `Trace` /
`Span` objects and hands them to the registered processors with
`_dispatch`, which applies the same error handling as local spans.

This is a ``pkgutil`` namespace package: plugins add modules such as
``agentix.utils.trace.otel``.
"""

from __future__ import annotations

import _random
import abc
import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from pkgutil import extend_path
from typing import Any, Literal

from agentix.utils import context as _context

__path__ = extend_path(__path__, __name__)

__all__ = [
    # types
    "Trace",
    "Span",
    "SpanEvent",
    "SpanError",
    "SpanStatus",
    # context managers and accessors
    "trace",
    "span",
    "get_current_span",
    "get_current_trace",
    "current_span_id",
    "current_trace_id",
    # processors
    "Processor",
    "Exporter",
    "ConsoleProcessor",
    "JsonlProcessor",
    "collect",
    # provider control
    "add_processor",
    "remove_processor",
    "set_processors",
    "set_tracing_disabled",
    "get_processors",
    "force_flush",
    "shutdown",
    # ids
    "gen_trace_id",
    "gen_span_id",
]

SpanStatus = Literal["unset", "ok", "error"]
_STATUSES = ("unset", "ok", "error")

UNBOUND_TRACE_ID = "trace_unbound"
"""The ``trace_id`` of spans opened while no trace is open (and with no explicit parent)."""

_logger = logging.getLogger("agentix.trace")


# ── ids and timestamps ──────────────────────────────────────────────


# Ids come from a generator of this module's own, seeded from os.urandom:
# one os.urandom per id is a getrandom() system call, ~0.9 µs of a sandbox
# span's ~6 µs on a VM with costly system calls. Ids must be unique, not
# secret (they are shown to whoever sees the traces). Private, so a
# program's random.seed(0) cannot make two runs repeat ids; reseeded in a
# forked child, whose ids would otherwise repeat its parent's.
_ids = _random.Random()
os.register_at_fork(after_in_child=_ids.seed)

# uuid4's version nibble (4) and RFC 4122 variant bits (10) in bytes 6 and 8
# of a 12- / 16-byte big-endian id: (clear, set) masks.
_SPAN_ID_BITS = ((0xF0 << 40) | (0xC0 << 24), (0x40 << 40) | (0x80 << 24))
_TRACE_ID_BITS = ((0xF0 << 72) | (0xC0 << 56), (0x40 << 72) | (0x80 << 56))


def gen_trace_id() -> str:
    """Returns a fresh trace id: ``"trace_"`` + 32 lowercase hex digits (a uuid4's form)."""
    clear, bits = _TRACE_ID_BITS
    return f"trace_{_ids.getrandbits(128) & ~clear | bits:032x}"


_SPAN_ID_KEEP, _SPAN_ID_SET = ~_SPAN_ID_BITS[0], _SPAN_ID_BITS[1]


def gen_span_id() -> str:
    """Returns a fresh span id: ``"span_"`` + 24 lowercase hex digits (the
    first 24 of a uuid4's form)."""
    # bytes.hex() of the 12 bytes: the same digits as format(n, "024x"), once
    # per span at ~60% of its cost.
    return "span_" + (_ids.getrandbits(96) & _SPAN_ID_KEEP | _SPAN_ID_SET).to_bytes(12, "big").hex()


# The second `_now` formatted last and its "YYYY-MM-DDTHH:MM:SS": a span's two
# stamps (and the next span's) mostly share it, and formatting a datetime per
# stamp was a large part of a span's cost. One tuple, so threads read a
# consistent pair.
_stamp_second: tuple[int, str] = (-1, "")


def iso_from_unix_micros(micros: int) -> str:
    """``micros`` since the epoch (not negative) as ISO-8601 UTC:
    ``YYYY-MM-DDTHH:MM:SS.ffffffZ``, the form every agentix timestamp has."""
    global _stamp_second
    seconds, fraction = divmod(micros, 1_000_000)
    second, text = _stamp_second
    if second != seconds:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        _stamp_second = (seconds, text)
    return f"{text}.{fraction:06d}Z"


# `_now`'s own cache: the Unix seconds' decimal digits and their
# "YYYY-MM-DDTHH:MM:SS." (one tuple, so threads read a consistent pair);
# "-" matches no digits.
_now_second: tuple[str, str] = ("-", "")


def _now() -> str:
    """The current time as ISO-8601 UTC with microseconds: ``YYYY-MM-DDTHH:MM:SS.ffffffZ``.
    Twice per span, so cheaper than iso_from_unix_micros: the microseconds'
    decimal digits are cut (the last six are the fraction, zero-padded)
    instead of divided and formatted."""
    global _now_second
    digits = str(time.time_ns() // 1000)
    head, text = _now_second
    if digits[:-6] != head:
        if len(digits) <= 6:  # a clock in 1970's first second: no seconds digits
            return iso_from_unix_micros(int(digits))
        head = digits[:-6]
        text = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(int(head)))
        _now_second = (head, text)
    return f"{text}{digits[-6:]}Z"


# ── data types ──────────────────────────────────────────────────────


@dataclass
class SpanEvent:
    """A point-in-time record on a span (``span.add_event(name, **attributes)``).

    Events are not announced on their own: processors see them in
    ``span.events`` at `Processor.on_span_end`.
    """

    name: str
    timestamp: str
    attributes: dict[str, Any] = field(default_factory=dict)

    def export(self) -> dict[str, Any]:
        """``{name, timestamp, attributes}``; empty attributes export as None."""
        return {"name": self.name, "timestamp": self.timestamp, "attributes": dict(self.attributes) or None}


@dataclass
class SpanError:
    """The structured error of a span: a message and optional extra data."""

    message: str
    data: dict[str, Any] | None = None

    def export(self) -> dict[str, Any]:
        """``{message, data}``."""
        return {"message": self.message, "data": self.data}


@dataclass
class Trace:
    """One workflow. Its structure lives in the spans that share its ``trace_id``.

    ``started_at`` / ``ended_at`` are ISO-8601 UTC strings, None until set.
    """

    trace_id: str
    name: str
    metadata: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    ended_at: str | None = None

    def export(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{object: "trace", id, name, metadata, started_at,
        ended_at}``; empty metadata exports as None."""
        return {
            "object": "trace",
            "id": self.trace_id,
            "name": self.name,
            "metadata": dict(self.metadata) or None,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }


@dataclass
class Span:
    """One operation inside a trace.

    Spans are plain data (they pickle, so they can ride the context carrier);
    the mutators below are meant for the code that owns the span, not for
    concurrent use from several threads.
    """

    span_id: str
    trace_id: str
    parent_id: str | None
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    ended_at: str | None = None
    status: SpanStatus = "unset"
    status_description: str | None = None
    error: SpanError | None = None
    events: list[SpanEvent] = field(default_factory=list)

    def set_attribute(self, key: str, value: Any) -> None:
        """Sets one attribute (replacing any previous value)."""
        self.attrs[key] = value

    def set_attributes(self, **attrs: Any) -> None:
        """Merges `attrs` into the attributes."""
        self.attrs.update(attrs)

    def set_status(self, status: SpanStatus, description: str | None = None) -> None:
        """Sets the status (``"unset"``, ``"ok"`` or ``"error"``, else ValueError);
        the description is replaced only when one is given."""
        if status not in _STATUSES:
            raise ValueError(f"span status must be one of {_STATUSES}, not {status!r}")
        self.status = status
        if description is not None:
            self.status_description = description

    def set_error(self, message: str, **data: Any) -> None:
        """Records ``SpanError(message, data or None)``, replacing any previous
        error. A span whose status is still ``"unset"`` becomes ``"error"`` with
        `message` as description; an explicitly set status is kept."""
        self.error = SpanError(message=message, data=dict(data) or None)
        if self.status == "unset":
            self.status = "error"
            self.status_description = message

    def add_event(self, name: str, **attrs: Any) -> None:
        """Appends a `SpanEvent` stamped with the current time."""
        self.events.append(SpanEvent(name=name, timestamp=_now(), attributes=dict(attrs)))

    def export(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{object: "span", id, trace_id, parent_id, name,
        attrs, started_at, ended_at, status, status_description, error, events}``.
        Empty attrs / events export as None; ``error`` is ``{message, data}`` or None."""
        return {
            "object": "span",
            "id": self.span_id,
            "trace_id": self.trace_id,
            "parent_id": self.parent_id,
            "name": self.name,
            "attrs": dict(self.attrs) or None,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "status": self.status,
            "status_description": self.status_description,
            "error": self.error.export() if self.error is not None else None,
            "events": [event.export() for event in self.events] or None,
        }


# ── scope (propagated context vars) ─────────────────────────────────

_current_trace: ContextVar[Trace | None] = _context.var("agentix_trace_current_trace", default=None)
_current_span: ContextVar[Span | None] = _context.var("agentix_trace_current_span", default=None)


def get_current_trace() -> Trace | None:
    """The innermost open trace of this context, or None."""
    return _current_trace.get()


def get_current_span() -> Span | None:
    """The innermost open span of this context, or None."""
    return _current_span.get()


def current_trace_id() -> str | None:
    """The id of `get_current_trace`, or None."""
    current = _current_trace.get()
    return current.trace_id if current is not None else None


def current_span_id() -> str | None:
    """The id of `get_current_span`, or None."""
    current = _current_span.get()
    return current.span_id if current is not None else None


def _reset(context_var: ContextVar[Any], token: Token[Any]) -> None:
    """Restores `context_var`; if the block ended in another context (e.g. a
    generator resumed elsewhere), sets the old value there instead of failing."""
    try:
        context_var.reset(token)
    except ValueError:
        old = token.old_value
        context_var.set(None if old is Token.MISSING else old)


# ── processors ──────────────────────────────────────────────────────


class Processor:
    """Receives the lifecycle of traces and spans. Every method is a no-op here;
    subclasses override what they need.

    Methods are called synchronously from the code that opens or closes the
    trace/span, in registration order, possibly from several threads at once:
    keep them quick and thread-safe, and move slow work (network, disk
    batches) to a thread of your own. Exceptions are logged and swallowed.
    The objects passed are live: copy what you keep (``item.export()``).
    """

    def on_trace_start(self, trace: Trace) -> None:
        """A trace was opened (``started_at`` set)."""

    def on_trace_end(self, trace: Trace) -> None:
        """A trace was closed (``ended_at`` set)."""

    def on_span_start(self, span: Span) -> None:
        """A span was opened (``started_at`` set, no events yet)."""

    def on_span_end(self, span: Span) -> None:
        """A span was closed: ``ended_at``, final status, error and events are set."""

    def force_flush(self) -> None:
        """Writes out anything buffered."""

    def shutdown(self) -> None:
        """Flushes and releases resources; called by `shutdown` (and at exit)."""


class Exporter(abc.ABC):
    """A batch sink: takes finished traces/spans and ships them somewhere.
    Meant to be driven by a processor that buffers and schedules; subclasses
    must implement `export`."""

    @abc.abstractmethod
    def export(self, items: Sequence[Trace | Span]) -> None:
        """Ships `items` (in the order they finished)."""

    def shutdown(self) -> None:
        """Releases resources. No-op by default."""


# ── provider (the global processor list) ────────────────────────────

_processors: tuple[Processor, ...] = ()
_processors_lock = threading.Lock()
_disabled = False
_warned_no_processor = False

_NO_PROCESSOR_WARNING = (
    "trace span ended but no trace Processor is registered, so it is not recorded anywhere; "
    "register one with agentix.trace.add_processor(...) or agentix.trace.collect(path)"
)


def add_processor(processor: Processor) -> None:
    """Appends `processor` to the processor list; a processor already
    registered (same object or ``==``) is not added twice."""
    global _processors
    with _processors_lock:
        if processor not in _processors:
            _processors = (*_processors, processor)


def remove_processor(processor: Processor) -> None:
    """Removes `processor` from the list; does nothing if it is not registered.
    The processor is not shut down."""
    global _processors
    with _processors_lock:
        _processors = tuple(p for p in _processors if p is not processor and p != processor)


def set_processors(processors: Sequence[Processor]) -> None:
    """Replaces the whole list (order kept, duplicates dropped). Removed
    processors are not shut down."""
    global _processors
    unique: list[Processor] = []
    for processor in processors:
        if processor not in unique:
            unique.append(processor)
    with _processors_lock:
        _processors = tuple(unique)


def get_processors() -> list[Processor]:
    """A copy of the processor list, in call order."""
    return list(_processors)


def set_tracing_disabled(disabled: bool) -> None:
    """While disabled, `trace` / `span` still work and set the current
    trace/span, but no processor is called (and nothing is warned)."""
    global _disabled
    _disabled = bool(disabled)


def _call(processor: Processor, method: str, *args: Any) -> None:
    try:
        getattr(processor, method)(*args)
    except Exception:
        _logger.exception("trace processor %r raised in %s", processor, method)


def _dispatch(method: str, item: Trace | Span) -> None:
    """Calls ``processor.<method>(item)`` on every registered processor, in
    order, unless tracing is disabled; exceptions are logged and swallowed.

    `method` is one of ``on_trace_start``, ``on_trace_end``, ``on_span_start``,
    ``on_span_end``. This is the single entry point for local spans and for
    traces/spans received from elsewhere (the host-side replay of sandbox
    spans), so both get identical treatment. ``on_span_end`` with no processor
    registered logs the "no trace Processor" warning once per process.
    """
    global _warned_no_processor
    if _disabled:
        return
    processors = _processors
    if not processors:
        if method == "on_span_end" and not _warned_no_processor:
            _warned_no_processor = True
            _logger.warning(_NO_PROCESSOR_WARNING)
        return
    for processor in processors:
        # _call inlined: this runs twice per span.
        try:
            getattr(processor, method)(item)
        except Exception:
            _logger.exception("trace processor %r raised in %s", processor, method)


def force_flush() -> None:
    """Calls `Processor.force_flush` on every processor (exceptions logged)."""
    for processor in _processors:
        _call(processor, "force_flush")


def shutdown() -> None:
    """Calls `Processor.shutdown` on every processor (exceptions logged).
    Registered with `atexit`; processors stay registered."""
    for processor in _processors:
        _call(processor, "shutdown")


# ── context managers ────────────────────────────────────────────────


@contextlib.contextmanager
def trace(name: str, *, trace_id: str | None = None, **metadata: Any) -> Iterator[Trace]:
    """Opens a trace for the ``with`` block and yields it.

    The trace gets `trace_id` or a fresh `gen_trace_id`, `metadata` and
    ``started_at``; it becomes the current trace and the current span is
    cleared for the block, so spans opened inside are roots of this trace.
    Processors see ``on_trace_start`` on entry and ``on_trace_end`` (with
    ``ended_at`` set) on exit, also when the block raises; exceptions
    propagate unchanged.
    """
    opened = Trace(trace_id=trace_id or gen_trace_id(), name=name, metadata=dict(metadata), started_at=_now())
    trace_token = _current_trace.set(opened)
    span_token = _current_span.set(None)
    try:
        _dispatch("on_trace_start", opened)
        yield opened
    finally:
        opened.ended_at = _now()
        try:
            _dispatch("on_trace_end", opened)
        finally:
            _reset(_current_span, span_token)
            _reset(_current_trace, trace_token)


def span(name: str, *, span_id: str | None = None, parent: Span | Trace | None = None,
         **attrs: Any) -> _SpanScope:
    """Opens a span for the ``with`` block and yields it.

    Parent and trace:
    - ``parent=`` a `Span`: ``parent_id``/``trace_id`` are copied from it
      (use this where the context did not follow, e.g. a plain thread);
      ``parent=`` a `Trace`: a root span of that trace;
    - else the current span, if any (same trace as it);
    - else a root span of the current trace, or with no open trace
      ``trace_id="trace_unbound"``.

    The span becomes the current span for the block. Processors see
    ``on_span_start`` on entry and ``on_span_end`` on exit (``ended_at`` set).
    An `Exception` leaving the block is recorded with
    ``set_error("<Type>: <message>")`` unless the span already has an error,
    then re-raised; BaseExceptions (cancellation, KeyboardInterrupt) end the
    span without recording an error.
    """
    return _SpanScope(name, span_id, parent, attrs)


class _SpanScope(contextlib.ContextDecorator):
    """What `span` returns: a context manager (and, like any
    ``contextlib.contextmanager``, a decorator) that opens the span on entry.
    A class rather than a generator: a span is the hottest thing a traced
    program does, and a generator-based manager costs a generator and its
    frame switches per span. Entered once, like the generator it replaced."""

    __slots__ = ("_name", "_span_id", "_parent", "_attrs", "_span", "_token")

    def __init__(self, name: str, span_id: str | None, parent: Span | Trace | None, attrs: dict[str, Any]) -> None:
        self._name = name
        self._span_id = span_id
        self._parent = parent
        self._attrs = attrs
        self._span: Span | None = None
        self._token: Token[Any] | None = None

    def _recreate_cm(self) -> _SpanScope:
        # As a decorator: a fresh span for each call.
        return _SpanScope(self._name, self._span_id, self._parent, self._attrs)

    def __enter__(self) -> Span:
        if self._span is not None:
            raise RuntimeError("a trace.span() context manager can be entered only once")
        parent = self._parent
        if parent is None:  # the common case first: no isinstance() calls
            current = _current_span.get()
            if current is not None:
                trace_id, parent_id = current.trace_id, current.span_id
            else:
                open_trace = _current_trace.get()
                trace_id = open_trace.trace_id if open_trace is not None else UNBOUND_TRACE_ID
                parent_id = None
        elif isinstance(parent, Span):
            trace_id, parent_id = parent.trace_id, parent.span_id
        elif isinstance(parent, Trace):
            trace_id, parent_id = parent.trace_id, None
        else:
            raise TypeError(f"span parent must be a Span, a Trace or None, not {type(parent).__name__}")
        # Positional (span_id, trace_id, parent_id, name, attrs, started_at):
        # half the cost of keywords.
        opened = self._span = Span(self._span_id or gen_span_id(), trace_id, parent_id, self._name,
                                   dict(self._attrs), _now())
        self._token = _current_span.set(opened)
        try:
            processors = _processors
            if _disabled or not processors:
                _dispatch("on_span_start", opened)
            else:
                # _dispatch inlined (the same calls and error handling): a
                # Python frame less, twice per span.
                for processor in processors:
                    try:
                        processor.on_span_start(opened)
                    except Exception:
                        _logger.exception("trace processor %r raised in %s", processor, "on_span_start")
        except BaseException as exc:  # only BaseExceptions get through: end the span
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return opened

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        opened = self._span
        if opened is None or self._token is None:
            return False  # never entered
        token, self._token = self._token, None
        if exc is not None and isinstance(exc, Exception) and opened.error is None:
            opened.set_error(f"{type(exc).__name__}: {exc}")
        opened.ended_at = _now()
        try:
            processors = _processors
            if _disabled or not processors:
                _dispatch("on_span_end", opened)  # nothing to call, or the warning
            else:
                for processor in processors:  # _dispatch inlined, as in __enter__
                    try:
                        processor.on_span_end(opened)
                    except Exception:
                        _logger.exception("trace processor %r raised in %s", processor, "on_span_end")
        finally:
            try:
                _current_span.reset(token)  # _reset inlined
            except ValueError:
                _reset(_current_span, token)
        return False


# ── built-in processors ─────────────────────────────────────────────

from agentix.utils.trace.processors import ConsoleProcessor, JsonlProcessor  # noqa: E402


def collect(path: str | Any, *, spans: bool = True, traces: bool = True) -> JsonlProcessor:
    """Registers (`add_processor`) and returns a `JsonlProcessor` appending to
    `path`; ``trace.collect("run.jsonl")`` is the one-line way to record."""
    processor = JsonlProcessor(path, spans=spans, traces=traces)
    add_processor(processor)
    return processor


atexit.register(shutdown)
