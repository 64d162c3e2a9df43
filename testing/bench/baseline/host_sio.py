"""Baseline host side of the original's side channels, modelled (SPEC §2.8, §4, §5, §6.2).

- `AsyncClientNamespace` (`agentix/runtime/client/_sio_facade.py`): a
  `socketio.AsyncClientNamespace` whose `emit` msgpack-packs the payload and whose
  `trigger_event` unpacks data events and calls `on_<event>`; coroutine results run as
  detached tasks. `request_handler(event)` answers `{request_id, data}` with
  `<event>:result {request_id, value}` or `<event>:error {request_id, error}`.
- `HostLogNamespace` / `HostTraceNamespace` (`log/_bridge.py`, `trace/_bridge.py`):
  plain `socketio.AsyncClientNamespace`s, processed in the client's receive path; on
  connect `_resume {since_seq}`; per event the envelope dedup (`_sid` change resets,
  `seq <= last_seq` dropped and re-acked), delivery, then `_ack {seq}` for every event.
  Log records are replayed into the host's stdlib logging as the original does
  (`getLogger(name)`, `isEnabledFor`, `makeRecord(... extra=extras)`, fields set,
  `logger.handle`); trace events become fresh `agentix.trace` `Trace` / `Span` objects
  handed to the host's processors (`agentix.utils.trace._dispatch`), `call_id` added to
  the span attrs.
"""

import asyncio
import functools
import inspect
import logging

import socketio

from baseline.codec import pack, unpack

_LIFECYCLE = frozenset({"connect", "disconnect", "connect_error"})


def _decode(data):
    return unpack(data) if isinstance(data, (bytes, bytearray, memoryview)) else data


class AsyncClientNamespace(socketio.AsyncClientNamespace):
    def __init__(self, namespace=None):
        super().__init__(namespace)
        self._detached_tasks: set = set()

    async def trigger_event(self, event, *args):
        handler = getattr(self, "on_" + event, None)
        if event in _LIFECYCLE:
            if handler is None:
                return None
            result = handler(*args)
            return await result if inspect.isawaitable(result) else result
        if handler is None:
            return None
        result = handler(_decode(args[0]) if args else None)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._detached_tasks.add(task)
            task.add_done_callback(self._detached_tasks.discard)
        return None

    async def emit(self, event, data=None, namespace=None, callback=None):
        await super().emit(event, pack(data), namespace=namespace, callback=callback)


def request_handler(event):
    def decorate(fn):
        @functools.wraps(fn)
        async def handle(self, payload):
            if isinstance(payload, dict) and "request_id" in payload:
                request_id, body = payload.get("request_id"), payload.get("data")
            else:
                request_id, body = None, payload
            try:
                value = fn(self, body)
                if inspect.isawaitable(value):
                    value = await value
            except Exception as exc:
                await self.emit(f"{event}:error", {"request_id": request_id, "error": {
                    "type": type(exc).__name__, "message": str(exc)}})
                return
            await self.emit(f"{event}:result", {"request_id": request_id, "value": value})
        return handle
    return decorate


class _ReliableHostNamespace(socketio.AsyncClientNamespace):
    def __init__(self, namespace):
        super().__init__(namespace)
        self._sid = None
        self._last_seq = 0

    async def on_connect(self):
        await self.emit("_resume", pack({"since_seq": self._last_seq}))

    async def _receive(self, data, deliver) -> None:
        payload = _decode(data)
        seq = payload.get("_seq") if isinstance(payload, dict) else None
        body = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(seq, int) or not isinstance(body, dict):
            deliver(payload)  # legacy pass-through, no dedup / ack
            return
        if payload.get("_sid") != self._sid:
            self._sid = payload.get("_sid")
            self._last_seq = 0
        if seq <= self._last_seq:
            await self.emit("_ack", pack({"seq": seq}))
            return
        self._last_seq = seq
        deliver(body)
        await self.emit("_ack", pack({"seq": seq}))


_STANDARD_KEYS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime"}


def replay_record(payload: dict) -> None:
    logger = logging.getLogger(payload.get("name") or "agentix.sandbox")
    levelno = payload.get("levelno") or logging.INFO
    if not logger.isEnabledFor(levelno):
        return
    extras = {k: v for k, v in (payload.get("extras") or {}).items()
              if k not in _STANDARD_KEYS}
    record = logger.makeRecord(logger.name, levelno, payload.get("pathname") or "",
                               payload.get("lineno") or 0, payload.get("message"), (),
                               None, extra=extras)
    record.funcName = payload.get("funcName")
    record.module = payload.get("module")
    record.exc_text = payload.get("exc_text")
    record.stack_info = payload.get("stack_info")
    record.agentix_context = payload.get("agentix_context")
    logger.handle(record)


class HostLogNamespace(_ReliableHostNamespace):
    def __init__(self):
        super().__init__("/log")

    async def on_record(self, data):
        await self._receive(data, replay_record)


class HostTraceNamespace(_ReliableHostNamespace):
    def __init__(self):
        super().__init__("/trace")
        from agentix.utils import trace  # the host's agentix.trace provider
        self._trace = trace

    def _trace_item(self, payload, start: bool):
        return self._trace.Trace(
            trace_id=payload.get("trace_id"), name=payload.get("name", "") if start else "",
            metadata=payload.get("metadata") or {} if start else {},
            started_at=payload.get("started_at"), ended_at=payload.get("ended_at"))

    def _span(self, payload):
        t = self._trace
        attrs = dict(payload.get("attrs") or {})
        if payload.get("call_id"):
            attrs.setdefault("call_id", payload["call_id"])
        error = payload.get("error")
        return t.Span(
            span_id=payload.get("span_id"), trace_id=payload.get("trace_id"),
            parent_id=payload.get("parent_id"), name=payload.get("name"), attrs=attrs,
            started_at=payload.get("started_at"), ended_at=payload.get("ended_at"),
            status=payload.get("status") or "unset",
            status_description=payload.get("status_description"),
            error=t.SpanError(message=error.get("message"), data=error.get("data"))
            if isinstance(error, dict) else None,
            events=[t.SpanEvent(name=e.get("name"), timestamp=e.get("timestamp"),
                                attributes=e.get("attributes") or {})
                    for e in payload.get("events") or ()])

    async def on_trace_start(self, data):
        await self._receive(data, lambda p: self._trace._dispatch(
            "on_trace_start", self._trace_item(p, True)))

    async def on_trace_end(self, data):
        await self._receive(data, lambda p: self._trace._dispatch(
            "on_trace_end", self._trace_item(p, False)))

    async def on_span_start(self, data):
        await self._receive(data, lambda p: self._trace._dispatch(
            "on_span_start", self._span(p)))

    async def on_span_end(self, data):
        await self._receive(data, lambda p: self._trace._dispatch(
            "on_span_end", self._span(p)))
