"""Baseline sandbox side of the original's side channels, modelled (SPEC §2.8, §4, §5, §6.1).

Runs inside the baseline worker (`baseline.worker` calls `install(send)` at boot with a
thread-safe function that queues one worker→server frame). What it models:

- `Namespace` / `register_namespace` (`agentix/sio.py`): `on_<event>` handlers, `emit`
  → one `sio_emit {namespace, event, data}` frame, `request(event, data, timeout=…)`
  → `{request_id: uuid4().hex, data}` on `event`, reply on `<event>:result` /
  `<event>:error`; `register_namespace` sends `sio_open {namespace}`; inbound
  `sio_inbound` frames are dispatched by `deliver` (sync handlers inline, coroutines as
  detached tasks).
- `ReliableStream` (`agentix/sio.py:309-453`): envelope `{_sid, _seq, data}`, seq
  allocation, buffering (`deque(maxlen=AGENTIX_LOG_BUFFER / AGENTIX_TRACE_BUFFER`, default
  10,000) and the emit under one `threading.Lock`; `_ack {seq}` drops acknowledged items,
  `_resume {since_seq}` re-emits the rest. Overflow evicts the oldest (already emitted)
  entry and counts it, as the original.
- `WorkerLogHandler` (`agentix/utils/log/_bridge.py`): one root handler; every record
  except `agentix.sio*` / `agentix.utils.log*` becomes a `/log` `record` event with the
  original's payload fields (name, level, levelno, message, created, pathname, lineno,
  funcName, module, exc_text, stack_info, agentix_context, extras).
- `ForwardProcessor` (`agentix/utils/trace/_bridge.py`): an `agentix.trace` Processor
  that turns trace/span lifecycle calls into `/trace` events `trace_start`, `trace_end`,
  `span_start`, `span_end` with the original's payload fields and the running call's id.

The thread-safe `send` the worker provides puts the frame on its outbound queue directly
on the loop thread and through `loop.call_soon_threadsafe` from other threads (sync
callables run in `asyncio.to_thread`), the cheapest hand-off asyncio offers.
"""

import asyncio
import collections
import contextvars
import inspect
import logging
import logging.handlers
import os
import threading
import uuid

RESERVED_NAMESPACES = frozenset({"/rpc", "/trace", "/log"})
DEFAULT_BUFFER = 10_000

# The running remote call's id (the original's DISPATCH_CALL_ID); set by the worker.
DISPATCH_CALL_ID: contextvars.ContextVar = contextvars.ContextVar(
    "agentix_dispatch_call_id", default=None)

_log = logging.getLogger("agentix.sio")
_send = None  # thread-safe "queue one frame for the server", set by install()
_registry: dict = {}
_registry_lock = threading.Lock()

_NOT_INSTALLED = ("agentix.sio is not installed — only callable from inside a sandbox "
                  "runtime worker.")


class RemoteSioError(RuntimeError):
    def __init__(self, type, message, status_code=None):  # noqa: A002
        super().__init__(f"{type}: {message}")
        self.type = type
        self.message = message
        self.status_code = status_code if isinstance(status_code, int) else None


def _emit_frame(namespace: str, event: str, data) -> None:
    send = _send
    if send is None:
        raise RuntimeError(_NOT_INSTALLED)
    send({"type": "sio_emit", "namespace": namespace, "event": event, "data": data})


class Namespace:
    namespace = None
    _allow_reserved = False

    def __init__(self, namespace=None):
        path = namespace if namespace is not None else type(self).namespace
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"namespace must start with '/', got {path!r}")
        if path in RESERVED_NAMESPACES and not self._allow_reserved:
            raise ValueError(f"namespace {path!r} is reserved by agentix-core")
        self.namespace = path
        self._handlers: dict = {}
        self._detached_tasks: set = set()
        self._pending: dict = {}
        for name in dir(type(self)):
            if name.startswith("on_") and name != "on_":
                handler = getattr(self, name)
                if callable(handler):
                    self._handlers.setdefault(name[3:], []).append(handler)

    def on(self, event, handler):
        self._handlers.setdefault(event, []).append(handler)
        return handler

    async def emit(self, event, data=None):
        _emit_frame(self.namespace, event, data)

    async def request(self, event, data=None, *, timeout=300.0):
        if _send is None:
            raise RuntimeError(_NOT_INSTALLED)
        for suffix, handler in ((":result", self._on_reply_result),
                                (":error", self._on_reply_error)):
            if handler not in self._handlers.get(event + suffix, []):
                self.on(event + suffix, handler)
        request_id = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self.emit(event, {"request_id": request_id, "data": data})
            try:
                return await asyncio.wait_for(future, timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(f"no reply to {event!r} within {timeout} s") from None
        finally:
            self._pending.pop(request_id, None)

    def _on_reply_result(self, payload):
        if isinstance(payload, dict):
            future = self._pending.get(payload.get("request_id"))
            if future is not None and not future.done():
                future.set_result(payload.get("value"))

    def _on_reply_error(self, payload):
        if isinstance(payload, dict):
            future = self._pending.get(payload.get("request_id"))
            error = payload.get("error") or {}
            if future is not None and not future.done():
                future.set_exception(RemoteSioError(
                    str(error.get("type", "Error")), str(error.get("message", "")),
                    error.get("status_code")))

    def _dispatch(self, event, data):
        for handler in list(self._handlers.get(event, ())):
            try:
                result = handler(data)
            except Exception:
                _log.exception("namespace %s: handler for %r raised", self.namespace, event)
                continue
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self._detached_tasks.add(task)
                task.add_done_callback(self._detached_tasks.discard)


def register_namespace(ns: Namespace) -> Namespace:
    with _registry_lock:
        if ns.namespace in _registry:
            raise ValueError(f"namespace {ns.namespace!r} already registered")
        _registry[ns.namespace] = ns
    if _send is not None:
        _send({"type": "sio_open", "namespace": ns.namespace})
    return ns


def deliver(namespace: str, event: str, data) -> None:
    """A `sio_inbound` frame (on the worker's loop). Unknown namespaces: dropped."""
    ns = _registry.get(namespace)
    if ns is not None:
        ns._dispatch(event, data)


class _CoreNamespace(Namespace):
    _allow_reserved = True


class ReliableStream:
    """The original's at-least-once side-channel stream (SPEC §2.8)."""

    def __init__(self, namespace: str, max_buffer: int):
        self._ns = register_namespace(_CoreNamespace(namespace))
        self._ns.on("_ack", self._on_ack)
        self._ns.on("_resume", self._on_resume)
        self._sid = uuid.uuid4().hex[:8]
        self._seq = 0
        self._buffer = collections.deque(maxlen=max_buffer)
        self._lock = threading.Lock()
        self.dropped = 0

    def emit(self, event: str, payload) -> None:
        with self._lock:
            self._seq += 1
            envelope = {"_sid": self._sid, "_seq": self._seq, "data": payload}
            if len(self._buffer) == self._buffer.maxlen:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    _log.warning("ReliableStream %s buffer full (max_buffer=%d): dropping "
                                 "oldest unacked events; at-least-once delivery degraded "
                                 "(dropped=%d).", self._ns.namespace, self._buffer.maxlen,
                                 self.dropped)
            self._buffer.append((self._seq, event, envelope))
            _emit_frame(self._ns.namespace, event, envelope)

    def _on_ack(self, data) -> None:
        seq = data.get("seq") if isinstance(data, dict) else None
        if not isinstance(seq, int):
            return
        with self._lock:
            while self._buffer and self._buffer[0][0] <= seq:
                self._buffer.popleft()

    def _on_resume(self, data) -> None:
        since = data.get("since_seq") if isinstance(data, dict) else 0
        since = since if isinstance(since, int) else 0
        with self._lock:
            for seq, event, envelope in list(self._buffer):
                if seq > since:
                    _emit_frame(self._ns.namespace, event, envelope)


def _buffer_size(variable: str) -> int:
    try:
        value = int(os.environ.get(variable, ""))
    except ValueError:
        return DEFAULT_BUFFER
    return value if value > 0 else DEFAULT_BUFFER


# ---------------------------------------------------------------------------- /log

_STANDARD_KEYS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "agentix_context"}


def _coerce(value):
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (list, tuple)):
        return [_coerce(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _coerce(v) for k, v in value.items()}
    return repr(value)


class WorkerLogHandler(logging.Handler):
    """Root handler: each record → one `/log` `record` event (SPEC §4)."""

    _formatter = logging.Formatter()

    def __init__(self, stream: ReliableStream):
        super().__init__(logging.NOTSET)
        self._stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(("agentix.sio", "agentix.utils.log")):
            return
        try:
            exc_text = None
            if record.exc_info:
                exc_text = self._formatter.formatException(record.exc_info)
            extras = {k: _coerce(v) for k, v in record.__dict__.items()
                      if k not in _STANDARD_KEYS and not k.startswith("_")} or None
            self._stream.emit("record", {
                "name": record.name, "level": record.levelname, "levelno": record.levelno,
                "message": record.getMessage(), "created": record.created,
                "pathname": record.pathname, "lineno": record.lineno,
                "funcName": record.funcName, "module": record.module,
                "exc_text": exc_text, "stack_info": record.stack_info,
                "agentix_context": getattr(record, "agentix_context", None),
                "extras": extras,
            })
        except Exception:
            self.handleError(record)


# -------------------------------------------------------------------------- /trace


def _forward_processor_class():
    """The original's `_ForwardProcessor`, on the `agentix.trace` API (None without it)."""
    try:
        from agentix.utils import trace
    except ImportError:
        return None, None

    class ForwardProcessor(trace.Processor):
        def __init__(self, stream: ReliableStream):
            self._stream = stream

        def on_trace_start(self, t):
            self._stream.emit("trace_start", {
                "trace_id": t.trace_id, "call_id": DISPATCH_CALL_ID.get(), "name": t.name,
                "metadata": _coerce(t.metadata), "started_at": t.started_at})

        def on_trace_end(self, t):
            self._stream.emit("trace_end", {
                "trace_id": t.trace_id, "call_id": DISPATCH_CALL_ID.get(),
                "ended_at": t.ended_at})

        @staticmethod
        def _span_fields(s):
            return {"trace_id": s.trace_id, "call_id": DISPATCH_CALL_ID.get(),
                    "span_id": s.span_id, "parent_id": s.parent_id, "name": s.name,
                    "attrs": s.attrs, "started_at": s.started_at}

        def on_span_start(self, s):
            self._stream.emit("span_start", self._span_fields(s))

        def on_span_end(self, s):
            payload = self._span_fields(s)
            payload.update(ended_at=s.ended_at, status=s.status,
                           status_description=s.status_description)
            if s.error is not None:
                payload["error"] = {"message": s.error.message, "data": s.error.data}
            if s.events:
                payload["events"] = [{"name": e.name, "timestamp": e.timestamp,
                                      "attributes": e.attributes} for e in s.events]
            self._stream.emit("span_end", payload)

    return ForwardProcessor, trace


def install(send, worker_id: str, log_dir: str | None) -> None:
    """At worker boot: the frame sender, the /log and /trace bridges, the durable log."""
    global _send
    _send = send
    for namespace in list(_registry):  # registered before install: open them now
        send({"type": "sio_open", "namespace": namespace})

    context = f"sandbox-{os.uname().nodename}-worker-{worker_id}"
    factory = logging.getLogRecordFactory()

    def record_factory(*args, **kwargs):  # configure_logging's agentix_context
        record = factory(*args, **kwargs)
        record.agentix_context = context
        return record

    logging.setLogRecordFactory(record_factory)
    root = logging.getLogger()
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    root.addHandler(WorkerLogHandler(ReliableStream("/log", _buffer_size("AGENTIX_LOG_BUFFER"))))
    if log_dir:  # the durable log file (SPEC §3.4)
        os.makedirs(log_dir, exist_ok=True)
        durable = logging.handlers.RotatingFileHandler(
            os.path.join(log_dir, f"sandbox-{worker_id}.log"), maxBytes=64 * 1024 * 1024,
            backupCount=1, encoding="utf-8", delay=True)
        durable.setFormatter(logging.Formatter(
            "%(asctime)s [%(agentix_context)s] [%(name)s] %(message)s"))
        root.addHandler(durable)

    processor_class, trace = _forward_processor_class()
    if processor_class is not None:
        trace.add_processor(processor_class(
            ReliableStream("/trace", _buffer_size("AGENTIX_TRACE_BUFFER"))))
