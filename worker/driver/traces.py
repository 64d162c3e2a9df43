"""agentix.trace events as trace frames.

Each event is an agentix.runtime.v1.TraceEvent, written by `send_trace`
from its keyword arguments (named as runtime.proto's fields; see
worker/channel/proto_fields.h for each field's Python form)."""

import os
import sys
import threading

import _agentix_worker as _w

from .common import _DEBUG, _WARNING, _call_id, _log, _text

# agentix.runtime.v1.TraceEventKind / SpanStatusCode
_TRACE_START, _TRACE_END, _SPAN_START, _SPAN_END = 1, 2, 3, 4
_SPAN_STATUS = {"unset": 0, "ok": 1, "error": 2}

# TraceEvent attributes are int64 (OTel AnyValue); larger ints go as repr.
_INT64 = (-(1 << 63), 1 << 63)
_NANOS = 1_000_000_000


def _attribute(value):
    """value as an attribute scalar (str/bool/int/float/bytes), anything
    else as its repr(); None for None (the key is then left out)."""
    if value is None:
        return None
    # Subclasses (enums, str/int wrappers) become their plain base value:
    # AttributeValue holds only the base types, and repr() would hide it.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        if _INT64[0] <= value < _INT64[1]:
            return int(value)
    elif isinstance(value, float):
        return float(value)
    elif isinstance(value, bytes):
        return bytes(value)
    try:
        return repr(value)
    except BaseException:
        return f"<unrepresentable {type(value).__name__} object>"


# Attribute values of these exact types are sent as they are (ints after a
# range check): the common case skips _attribute's isinstance() chain.
_PLAIN_ATTRIBUTES = frozenset((str, float, bool, bytes))


def _attribute_map(mapping):
    """A dict of attribute scalars from `mapping` (keys as str)."""
    out = {}
    if isinstance(mapping, dict):
        for key, value in list(mapping.items()):
            kind = type(value)
            if kind not in _PLAIN_ATTRIBUTES and not (
                    kind is int and _INT64[0] <= value < _INT64[1]):
                value = _attribute(value)
                if value is None:
                    continue
            out[key if isinstance(key, str) else _text(key)] = value
    return out


def _attributes(mapping):
    """`mapping`'s attributes as a {str: scalar} dict (repeated Attribute),
    or None if it has none."""
    if not mapping:
        return None
    return _attribute_map(mapping) or None


def _str(value):
    """value if it is a str (the common case: no call to _text)."""
    return value if type(value) is str else _text(value)


# The last "YYYY-MM-DDTHH:MM:SS" _unix_nanos converted, with its Unix
# seconds: a span's stamps (and the next span's) mostly share their second.
_last_second = ("", 0)


def _timegm(year, month, day, hour, minute, second):
    """calendar.timegm of these fields (same range checks: year 1-9999,
    month 1-12) without importing calendar and datetime at boot: they cost
    the worker's cold start a few ms, and stamps come only once agentix is
    imported, after the ready frame."""
    if not (1 <= year <= 9999 and 1 <= month <= 12):
        raise ValueError("year or month out of range")
    y = year - (month <= 2)
    era, yoe = divmod(y, 400)
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    return ((days * 24 + hour) * 60 + minute) * 60 + second


def _unix_nanos(stamp):
    """An agentix timestamp (ISO-8601 UTC "YYYY-MM-DDTHH:MM:SS.ffffffZ", or
    a datetime) as Unix nanoseconds; 0 if missing or unreadable."""
    global _last_second
    try:
        if isinstance(stamp, str):
            if len(stamp) == 27 and stamp[19] == "." and stamp[26] == "Z":
                # agentix's own format: slicing is ~10x cheaper than parsing.
                head, seconds = _last_second  # one tuple: thread-safe
                if stamp[:19] != head:
                    head = stamp[:19]
                    seconds = _timegm(
                        int(head[0:4]), int(head[5:7]), int(head[8:10]),
                        int(head[11:13]), int(head[14:16]), int(head[17:19]))
                    _last_second = (head, seconds)
                return seconds * _NANOS + int(stamp[20:26]) * 1000
            from datetime import datetime  # rare: another string format
            stamp = datetime.fromisoformat(stamp)
        # A datetime instance means its module is imported already.
        datetime_module = sys.modules.get("datetime")
        if datetime_module is not None and isinstance(stamp, datetime_module.datetime):
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=datetime_module.timezone.utc)
            t = stamp.utctimetuple()
            return (_timegm(t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour,
                            t.tm_min, t.tm_sec) * _NANOS
                    + stamp.microsecond * 1000)
    except Exception:
        pass
    return 0


def _events(events):
    """A span's events as SpanEventRecord dicts, or None."""
    if not events:
        return None
    return [{"name": _text(getattr(event, "name", "")),
             "time_unix_nanos": _unix_nanos(getattr(event, "timestamp", None)),
             "attributes": _attribute_map(getattr(event, "attributes", None))}
            for event in list(events)]


def _span_ids(span):
    """A span's trace id, span id, parent id ("" for none) and name as the
    strings a TraceEvent carries (a str as it is: no call)."""
    trace_id, span_id = span.trace_id, span.span_id
    parent_id, name = span.parent_id, span.name
    return (trace_id if type(trace_id) is str else _text(trace_id),
            span_id if type(span_id) is str else _text(span_id),
            "" if parent_id is None else _str(parent_id),
            name if type(name) is str else _text(name))


class _Busy(threading.local):
    """Per thread: whether this thread is forwarding through the general
    path. `on` has a class default: reading an attribute a thread never set
    raises (and getattr swallows) an AttributeError, ~0.17 µs, twice per
    span on every thread that only ever took the C path."""

    on = False


def _declined(*args):
    """send_span's answer for a span it cannot send: the general path's."""
    return False


def _trace_forwarder_class(base):
    class _TraceForwarder(base):
        """Sends each trace/span lifecycle event as a `trace` frame (the
        original's _ForwardProcessor). Never raises into the traced code:
        failures are counted, and the first one is reported on stderr."""

        def __init__(self, channel, span_type):
            super().__init__()
            self._channel = channel
            # The common span events go out through send_span (C: the same
            # frame as the keyword calls below, without their Python); it
            # declines anything else, and everything if the trace module
            # has no Span class.
            self._send_span = (channel.send_span if span_type is not None
                               else _declined)
            self._span_type = span_type
            self.enabled = True
            self.failures = 0
            # Set while this thread forwards: a repr() or a log handler run
            # by the forwarding that opens a span must not forward again.
            self._busy = _Busy()
            # on_span_start / on_span_end below in C (span_handlers.h), as
            # this instance's attributes: agentix.trace calls them with no
            # Python frame per span event.
            self.on_span_start, self.on_span_end = _w.span_handlers(
                self, _call_id)

        def __repr__(self):
            return "<agentix-worker trace forwarder>"

        def _forward(self, kind, item):
            if not self.enabled or self._busy.on:
                return
            self._busy.on = True
            try:
                self._send(kind, item)
            except BaseException as exc:
                self._failed(exc)
            finally:
                self._busy.on = False

        def _failed(self, exc):
            self.failures += 1
            if self.failures == 1:
                _log(_WARNING, "cannot forward a trace event "
                     f"({type(exc).__name__}: {_text(exc)}); "
                     "dropping it (later failures are only counted)")

        def _send(self, kind, item):
            # Trace events (span events take on_span_start/on_span_end).
            if kind == _TRACE_START:
                self._channel.send_trace(
                    kind=kind, agentix_trace_id=_str(item.trace_id),
                    name=_str(item.name),
                    start_time_unix_nanos=_unix_nanos(item.started_at),
                    attributes=_attributes(item.metadata),
                    call_id=_call_id.get())
            else:
                self._channel.send_trace(
                    kind=kind, agentix_trace_id=_str(item.trace_id),
                    end_time_unix_nanos=_unix_nanos(item.ended_at),
                    call_id=_call_id.get())

        # The two span events are most of the traffic: _forward is inlined,
        # and fields left at their defaults are not passed (send_trace
        # leaves an omitted field at proto3's default, as for None). Each
        # instance shadows on_span_start / on_span_end with their C versions
        # (span_handlers, set in __init__), which call the general paths
        # below as these do.

        def on_span_start(self, span):
            busy = self._busy
            if not self.enabled or busy.on:
                return
            try:
                # Runs no Python code: no forwarding can nest in it.
                if self._send_span(_SPAN_START, span, _call_id.get(),
                                   self._span_type):
                    return
            except Exception:
                pass  # sent nothing: the general path below decides
            self._span_start_general(span)

        def _span_start_general(self, span):
            busy = self._busy
            busy.on = True
            try:
                trace_id, span_id, parent_id, name = _span_ids(span)
                self._channel.send_trace(
                    kind=_SPAN_START, agentix_trace_id=trace_id,
                    agentix_span_id=span_id, agentix_parent_id=parent_id,
                    name=name,
                    start_time_unix_nanos=_unix_nanos(span.started_at),
                    attributes=_attributes(span.attrs),
                    call_id=_call_id.get())
            except BaseException as exc:
                self._failed(exc)
            finally:
                busy.on = False

        def on_span_end(self, span):
            busy = self._busy
            if not self.enabled or busy.on:
                return
            try:
                if self._send_span(_SPAN_END, span, _call_id.get(),
                                   self._span_type):
                    return
            except Exception:
                pass
            self._span_end_general(span)

        def _span_end_general(self, span):
            busy = self._busy
            busy.on = True
            try:
                trace_id, span_id, parent_id, name = _span_ids(span)
                events, error = span.events, span.error
                description = span.status_description
                if not events and error is None and description is None:
                    self._channel.send_trace(
                        kind=_SPAN_END, agentix_trace_id=trace_id,
                        agentix_span_id=span_id, agentix_parent_id=parent_id,
                        name=name,
                        start_time_unix_nanos=_unix_nanos(span.started_at),
                        end_time_unix_nanos=_unix_nanos(span.ended_at),
                        attributes=_attributes(span.attrs),
                        status=_SPAN_STATUS.get(span.status, 0),
                        call_id=_call_id.get())
                    return
                error_message, error_data = "", None
                if error is not None:
                    error_message = _text(getattr(error, "message", error))
                    error_data = _attributes(getattr(error, "data", None))
                self._channel.send_trace(
                    kind=_SPAN_END, agentix_trace_id=trace_id,
                    agentix_span_id=span_id, agentix_parent_id=parent_id,
                    name=name,
                    start_time_unix_nanos=_unix_nanos(span.started_at),
                    end_time_unix_nanos=_unix_nanos(span.ended_at),
                    attributes=_attributes(span.attrs),
                    events=_events(events) if events else None,
                    status=_SPAN_STATUS.get(span.status, 0),
                    status_description=("" if description is None
                                        else _str(description)),
                    error_message=error_message, error_data=error_data,
                    call_id=_call_id.get())
            except BaseException as exc:
                self._failed(exc)
            finally:
                busy.on = False

        def on_trace_start(self, trace):
            self._forward(_TRACE_START, trace)

        def on_trace_end(self, trace):
            self._forward(_TRACE_END, trace)


    return _TraceForwarder


def _install_trace_forwarding(channel, trace_module):
    """Registers the forwarding processor with `trace_module` (the venv's
    agentix.utils.trace, just imported: deferred.py); returns it, or None if
    it cannot be registered."""
    try:
        span_type = getattr(trace_module, "Span", None)
        forwarder = _trace_forwarder_class(trace_module.Processor)(
            channel, span_type if isinstance(span_type, type) else None)
        trace_module.add_processor(forwarder)
    except Exception as exc:
        _log(_WARNING, "cannot register the trace forwarder "
             f"({type(exc).__name__}: {_text(exc)})")
        return None

    def after_fork_in_child():
        # The channel is the parent's: a child's spans are not forwarded.
        forwarder.enabled = False

    os.register_at_fork(after_in_child=after_fork_in_child)
    return forwarder
