"""The gateway proper: the original's HTTP + Socket.IO server driving a gRPC daemon.

State mirrors the original runtime server (SPEC §2.4), kept here because the
daemon frees a result as soon as the gateway's client acknowledges it:

- ``_running``: legacy call_id -> the future of its terminal frame while it runs;
- ``_results``: call_id -> (event, frame) of finished calls not yet acked by a
  legacy host (insertion order, cap `MAX_PENDING_RESULTS`, oldest evicted).

A call_id is started only when it is in neither map; the daemon itself also runs
a call_id at most once and refuses a start of a recently freed one, so a call
never runs twice even after eviction here.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import secrets
import threading
from collections.abc import Callable
from typing import Any

import grpc
import socketio
from aiohttp import web
from engineio import asyncio_socket as _eio_socket
from engineio import exceptions as _eio_exceptions
from engineio import packet as _eio_packet
from socketio import packet as _sio_packet

import engineio.async_drivers.aiohttp as _eio_aiohttp

from agentix.runtime.client import RuntimeClient
from agentix.runtime.client.pending import CallFuture
from agentix.runtime.client.feeds import Feed  # the client's subscription slots
from agentix.runtime.client.errors import ResultTooLarge, RuntimeUnreachable
from agentix.runtime.client.logs import LogCursor, LogsStream, decode_extras
from agentix.runtime.client.stream import PendingCall
from agentix.runtime.client.traces import TraceCursor, TracesStream, attributes, iso_from_nanos
from agentix.runtime.shared import MAX_MESSAGE_BYTES, codec
from agentix.runtime.shared.models import RemoteError
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc

__all__ = ["HEALTH_VERSION", "Gateway", "MAX_PENDING_RESULTS"]

_log = logging.getLogger("agentix.gateway")

# The original's `GET /health` version (SPEC §12): legacy hosts see the wire
# they were written for.
HEALTH_VERSION = "0.2.7"
# Unacked results kept for legacy hosts (the original's _MAX_PENDING_RESULTS).
MAX_PENDING_RESULTS = 4096
# Engine.IO ping interval / timeout of the original server (SPEC §2.1).
PING_INTERVAL = 25
PING_TIMEOUT = 300
# Default `Prefer: wait` of POST /call, and the original's regex for it.
DEFAULT_WAIT_S = 1.0
_WAIT_RE = re.compile(r'(?:^|[,;\s])wait\s*=\s*"?([0-9]+(?:\.[0-9]+)?)', re.IGNORECASE)
RESERVED = frozenset({"/rpc", "/log", "/trace"})
_RESULT_UNAVAILABLE = (
    "result is no longer held by the runtime (evicted or unknown call_id); retry as a new call"
)
_FRAME_TOO_LARGE = (
    f"remote call result could not be delivered: the pickled return value exceeds the "
    f"{MAX_MESSAGE_BYTES}-byte frame limit"
)
_BUFFER_DEFAULT = 10_000


class _LargeWebSocketResponse(web.WebSocketResponse):
    """engineio's aiohttp driver builds ``WebSocketResponse()`` with aiohttp's 4 MiB
    receive cap; the original accepts 256 MiB messages on every transport."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max_msg_size", MAX_MESSAGE_BYTES)
        super().__init__(*args, **kwargs)


_eio_aiohttp.WebSocketResponse = _LargeWebSocketResponse


class _Socket(_eio_socket.AsyncSocket):
    """Engine.IO's socket with a cheaper `poll` (what its writer task, and a
    polling GET, wait on): the same contract — the first packet within
    ping_interval + ping_timeout, else `QueueEmpty`; then every packet already
    queued, up to a ``None`` (closing) — but packets already queued are taken
    without waiting, and the wait is an ``asyncio.timeout`` rather than
    ``asyncio.wait_for``, which in Python 3.11 starts a task per wait."""

    async def poll(self) -> list:
        queue = self.queue
        if queue.empty():
            try:
                async with asyncio.timeout(self.server.ping_interval + self.server.ping_timeout):
                    first = await queue.get()
            except (asyncio.TimeoutError, asyncio.CancelledError):
                raise _eio_exceptions.QueueEmpty() from None
        else:
            first = queue.get_nowait()
        queue.task_done()
        if first is None:
            return []
        packets = [first]
        while not queue.empty():
            pkt = queue.get_nowait()
            queue.task_done()
            if pkt is None:
                queue.put_nowait(None)
                break
            packets.append(pkt)
        return packets


_eio_socket.AsyncSocket = _Socket  # engineio's server looks the class up here per connection


def _error(type_: str, message: str, *, traceback: str | None = None, cancelled: bool = False,
           returncode: int | None = None) -> dict:
    """The original's RemoteError.model_dump(): always all five keys."""
    return {"type": type_, "message": message, "traceback": traceback, "cancelled": cancelled,
            "returncode": returncode}


def _remote_error(error: RemoteError) -> dict:
    return _error(error.type, error.message, traceback=error.traceback, cancelled=error.cancelled,
                  returncode=error.returncode)


def _unpack(data: Any) -> Any:
    """A legacy event payload: one binary attachment holding msgpack. Raises
    ValueError for anything else (non-binary, undecodable)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"payload must be msgpack bytes, got {type(data).__name__}")
    try:
        return codec.unpack(bytes(data))
    except Exception as error:
        raise ValueError(f"payload is not valid msgpack: {error}") from None


def _buffer_size(env: dict, name: str) -> int:
    try:
        value = int(env.get(name, ""))
    except ValueError:
        return _BUFFER_DEFAULT
    return value if value > 0 else _BUFFER_DEFAULT


class ReliableStream:
    """The sandbox half of the original's reliable stream (SPEC §2.8) for one
    reserved namespace: envelopes ``{_sid, _seq, data}``, a ring buffer of the
    unacked ones (``_ack{seq}`` drops ≤ seq, ``_resume{since_seq}`` replays).
    `append` is called from the replay thread; emission happens on the loop."""

    def __init__(self, gateway: Gateway, namespace: str, max_buffer: int) -> None:
        self.gateway = gateway
        self.namespace = namespace
        self.max_buffer = max_buffer
        self.sid = secrets.token_hex(4)
        self._seq = 0
        self._buffer: collections.deque[tuple[int, str, bytes]] = collections.deque()
        self._lock = threading.Lock()
        self.dropped = 0

    def append(self, event: str, data: dict) -> None:
        with self._lock:
            self._seq += 1
            envelope = codec.pack({"_sid": self.sid, "_seq": self._seq, "data": data})
            if len(self._buffer) >= self.max_buffer:
                self._buffer.popleft()
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    _log.warning(
                        "ReliableStream %s buffer full (max_buffer=%d): dropping oldest unacked events; "
                        "at-least-once delivery degraded (dropped=%d). Raise AGENTIX_LOG_BUFFER / "
                        "AGENTIX_TRACE_BUFFER or ack faster.", self.namespace, self.max_buffer, self.dropped)
            self._buffer.append((self._seq, event, envelope))
            # Under the lock: the outbox keeps seq order whichever thread appends.
            self.gateway.emit_threadsafe(event, envelope, self.namespace)

    def ack(self, seq: Any) -> None:
        if not isinstance(seq, int) or isinstance(seq, bool):
            return
        with self._lock:
            while self._buffer and self._buffer[0][0] <= seq:
                self._buffer.popleft()

    def since(self, since_seq: Any) -> list[tuple[str, bytes]]:
        if not isinstance(since_seq, int) or isinstance(since_seq, bool):
            since_seq = 0
        with self._lock:
            return [(event, envelope) for seq, event, envelope in self._buffer if seq > since_seq]

    def __len__(self) -> int:
        return len(self._buffer)


def log_payload(record: pb.LogRecord) -> dict:
    """A daemon LogRecord as the original's /log ``record`` payload (SPEC §4)."""
    extras = decode_extras(record.extras)
    return {
        "name": record.logger,
        "level": record.level_name,
        "levelno": record.level,
        "message": record.message,
        "created": record.time_unix_nanos / 1e9,
        "pathname": record.file,
        "lineno": record.line,
        "funcName": record.function,
        "module": record.module,
        "exc_text": record.exception_text or None,
        "stack_info": record.stack_info or None,
        "agentix_context": record.context,
        "extras": extras or None,
    }


_STATUS = {pb.SPAN_STATUS_CODE_UNSET: "unset", pb.SPAN_STATUS_CODE_OK: "ok", pb.SPAN_STATUS_CODE_ERROR: "error"}


def trace_payload(event: pb.TraceEvent) -> tuple[str, dict] | None:
    """A daemon TraceEvent as the original's /trace event and payload (SPEC §5)."""
    kind = event.kind
    if kind == pb.TRACE_EVENT_KIND_TRACE_START:
        return "trace_start", {"trace_id": event.agentix_trace_id, "call_id": event.call_id or None,
                               "name": event.name, "metadata": attributes(event.attributes),
                               "started_at": iso_from_nanos(event.start_time_unix_nanos)}
    if kind == pb.TRACE_EVENT_KIND_TRACE_END:
        return "trace_end", {"trace_id": event.agentix_trace_id, "call_id": event.call_id or None,
                             "ended_at": iso_from_nanos(event.end_time_unix_nanos)}
    if kind not in (pb.TRACE_EVENT_KIND_SPAN_START, pb.TRACE_EVENT_KIND_SPAN_END):
        return None
    payload = {"trace_id": event.agentix_trace_id, "call_id": event.call_id or None,
               "span_id": event.agentix_span_id, "parent_id": event.agentix_parent_id or None,
               "name": event.name, "attrs": attributes(event.attributes),
               "started_at": iso_from_nanos(event.start_time_unix_nanos)}
    if kind == pb.TRACE_EVENT_KIND_SPAN_START:
        return "span_start", payload
    payload["ended_at"] = iso_from_nanos(event.end_time_unix_nanos)
    payload["status"] = _STATUS.get(event.status, "unset")
    payload["status_description"] = event.status_description or None
    if event.error_message:
        payload["error"] = {"message": event.error_message, "data": attributes(event.error_data) or None}
    if event.events:
        payload["events"] = [{"name": e.name, "timestamp": iso_from_nanos(e.time_unix_nanos),
                              "attributes": attributes(e.attributes)} for e in event.events]
    return "span_end", payload


def _feed_type(base: type, replay: Callable[[Any], None]) -> type:
    """A Logs/Traces stream class whose replay hands items to the gateway."""
    return type(f"Gateway{base.__name__}", (base,), {"_batch_replayer": lambda self: replay})


class _PluginNamespace:
    """One daemon ``Namespace`` stream for a plugin path, shared by every
    legacy host connected there: host events go to the sandbox, sandbox
    events are broadcast to the path's legacy hosts (as the original)."""

    def __init__(self, gateway: Gateway, path: str) -> None:
        self.gateway = gateway
        self.path = path
        self.rpc: grpc.aio.StreamStreamCall | None = None
        self.task: asyncio.Task | None = None

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    async def ensure(self) -> None:
        if self.alive:
            return
        channel = await self.gateway.client._ready_channel()
        stub = pb_grpc.RuntimeServiceStub(channel)
        self.rpc = stub.Namespace(metadata=self.gateway.client._metadata)
        await self.rpc.write(pb.NamespaceRequest(open=pb.OpenNamespace(namespace=self.path)))
        self.task = asyncio.create_task(self._read(self.rpc), name=f"gateway-ns{self.path}")

    async def send(self, event: str, data: bytes, request_id: str, error: dict | None) -> None:
        await self.ensure()
        assert self.rpc is not None
        ev = pb.NamespaceEvent(event=event, data=data, request_id=request_id)
        if error is not None:
            status = error.get("status_code")
            ev.error.type = str(error.get("type", ""))
            ev.error.message = str(error.get("message", ""))
            if isinstance(status, int) and not isinstance(status, bool) and -2**31 <= status < 2**31:
                ev.error.status_code = status
        await self.rpc.write(pb.NamespaceRequest(event=ev))

    async def _read(self, rpc: grpc.aio.StreamStreamCall) -> None:
        try:
            while (response := await rpc.read()) is not grpc.aio.EOF:
                for ev in response.events:
                    self.gateway.emitter.emit(ev.event, ev.data, self.path)
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as error:
            _log.info("namespace %s stream ended: %s %s", self.path, error.code().name, error.details())
        except Exception:
            _log.exception("namespace %s stream failed", self.path)

    async def aclose(self) -> None:
        if self.rpc is not None:
            self.rpc.cancel()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


class _GatewayCall(PendingCall):
    """A PendingCall that reports its outcome synchronously (one event-loop
    turn less per call than a callback on its future)."""

    __slots__ = ("on_done",)
    on_done: Callable[[asyncio.Future], None]  # set by whoever makes the call

    def settle(self, outcome: Any, woken: list[CallFuture] | None = None) -> None:
        if not self.future.done():
            super().settle(outcome, woken)
            self.on_done(self.future)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            super().fail(error)
            self.on_done(self.future)


class _Server(socketio.AsyncServer):
    """Routes every event of a non-reserved namespace to the plugin forwarder
    (python-socketio 5.7 has no catch-all namespace handler), and runs the
    reserved namespaces' handlers inline.

    python-socketio starts a task per event when ``async_handlers`` is on (the
    default). The /rpc, /log and /trace handlers never wait on anything but
    queue puts, so they run in the connection's reader instead: one task and
    one event-loop turn less per event (a call and its ack are two events),
    and a client's events are handled in the order it sent them. Plugin events
    still get a task each (their forwarding awaits the daemon's stream).
    """

    gateway: Gateway

    async def _handle_event(self, eio_sid: str, namespace: str | None, id: Any, data: Any) -> None:
        if namespace not in RESERVED:
            return await super()._handle_event(eio_sid, namespace, id, data)
        sid = self.manager.sid_from_eio_sid(eio_sid, namespace)
        if not self.manager.is_connected(sid, namespace):
            self.logger.warning("%s is not connected to namespace %s", sid, namespace)
            return None
        await self._handle_event_internal(self, sid, eio_sid, data, namespace, id)
        return None

    async def _trigger_event(self, event: str, namespace: str, *args: Any) -> Any:
        if namespace not in RESERVED and namespace != "/":
            return await self.gateway._plugin_event(event, namespace, *args)
        return await super()._trigger_event(event, namespace, *args)


class _Emitter:
    """Emits single-attachment events without a coroutine, task or re-encoding
    per event: what ``AsyncServer.emit`` does for a one-``bytes``-argument event
    (build the Socket.IO packet, encode it, put its Engine.IO packets on each
    recipient's send queue), with the header packet built once per (event,
    namespace). ``emit`` would start one task for the emit, one per recipient,
    and JSON-encode the same header each time.

    The recipients' queues are Engine.IO's own (``AsyncSocket.queue``, unbounded
    ``asyncio.Queue``): its writer task sends them in order, for websocket and
    polling alike. A closed socket is skipped, as ``AsyncSocket.send`` does; a
    ping-timed-out one is closed by Engine.IO's service task.
    """

    def __init__(self, sio: socketio.AsyncServer) -> None:
        self.sio = sio
        self._headers: dict[tuple[str, str], Any] = {}

    def _header(self, event: str, namespace: str) -> Any:
        key = (event, namespace)
        header = self._headers.get(key)
        if header is None:
            encoded = _sio_packet.Packet(_sio_packet.EVENT, namespace=namespace, data=[event, b""]).encode()
            # [header text, attachment]: one binary attachment (placeholder num 0).
            header = _eio_packet.Packet(_eio_packet.MESSAGE, data=encoded[0])
            if len(self._headers) < 1024:  # plugin event names are open-ended
                self._headers[key] = header
        return header

    def emit(self, event: str, data: bytes, namespace: str, to: str | None = None) -> None:
        """Queues `event` with its one binary argument `data` to `to`, or to
        every client connected to `namespace`."""
        manager = self.sio.manager
        rooms = manager.rooms.get(namespace)
        if not rooms:
            return
        if to is None:
            members = rooms.get(None)
            if members is None:
                return
            eio_sids = list(members._fwdm.values())
        else:
            eio_sid = manager.eio_sid_from_sid(to, namespace)
            if eio_sid is None:
                return
            eio_sids = [eio_sid]
        if not eio_sids:
            return
        header = self._header(event, namespace)
        body = _eio_packet.Packet(_eio_packet.MESSAGE, data=bytes(data))
        sockets = self.sio.eio.sockets
        for eio_sid in eio_sids:
            socket = sockets.get(eio_sid)
            if socket is None or socket.closed:
                continue
            queue = socket.queue
            queue.put_nowait(header)
            queue.put_nowait(body)


class Gateway:
    """The legacy wire on an aiohttp application, translating onto `client`.

    Args:
      daemon_url: the daemon's gRPC address (``unix:///path`` or ``host:port``).
      env: where AGENTIX_LOG_BUFFER / AGENTIX_TRACE_BUFFER are read.
      max_pending_results: unacked results kept for legacy hosts.
    """

    def __init__(self, daemon_url: str, *, env: dict | None = None, token: str | None = None,
                 max_pending_results: int = MAX_PENDING_RESULTS) -> None:
        env = env if env is not None else {}
        self.client = RuntimeClient(daemon_url, token=token, max_result_bytes=MAX_MESSAGE_BYTES)
        self.max_pending_results = max_pending_results
        # call_id -> the future of its terminal (event, frame) while running.
        self._running: dict[str, asyncio.Future] = {}
        # call_id -> (PendingCall, stream) once started on the daemon.
        self._calls: dict[str, tuple[PendingCall, Any]] = {}
        self._connecting: dict[str, asyncio.Task] = {}
        self._results: collections.OrderedDict[str, tuple[str, dict]] = collections.OrderedDict()
        self._evicted = 0
        self._plugins: dict[str, _PluginNamespace] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = asyncio.Event()
        self.log_stream = ReliableStream(self, "/log", _buffer_size(env, "AGENTIX_LOG_BUFFER"))
        self.trace_stream = ReliableStream(self, "/trace", _buffer_size(env, "AGENTIX_TRACE_BUFFER"))
        # The client's Logs/Traces feeds, replaying into the reliable streams.
        self.client._feeds = (
            Feed("logs", _feed_type(LogsStream, self._replay_log), LogCursor()),
            Feed("traces", _feed_type(TracesStream, self._replay_trace), TraceCursor()),
        )
        self.sio = _Server(async_mode="aiohttp", cors_allowed_origins="*", namespaces="*",
                           ping_interval=PING_INTERVAL, ping_timeout=PING_TIMEOUT,
                           max_http_buffer_size=MAX_MESSAGE_BYTES)
        self.sio.gateway = self
        self.emitter = _Emitter(self.sio)
        # Emits from the replay thread, flushed on the loop (emit_threadsafe).
        self._outbox: list[tuple[str, bytes, str]] = []
        self._outbox_lock = threading.Lock()
        self._outbox_scheduled = False
        self.app = web.Application(client_max_size=MAX_MESSAGE_BYTES, middlewares=[self._refuse_oversized_polls])
        self.app.router.add_get("/health", self._health)
        self.app.router.add_post("/call", self._post_call)
        self.sio.attach(self.app, socketio_path="socket.io")
        for event, handler in (("call", self._on_call), ("cancel", self._on_cancel),
                               ("resume", self._on_resume), ("ack", self._on_ack)):
            self.sio.on(event, handler, namespace="/rpc")
        for stream in (self.log_stream, self.trace_stream):
            self.sio.on("_ack", self._stream_handler(stream, self._stream_ack), namespace=stream.namespace)
            self.sio.on("_resume", self._stream_handler(stream, self._stream_resume), namespace=stream.namespace)

    # ── connecting to the daemon ────────────────────────────────────

    async def connect(self, timeout: float = 30.0, interval: float = 0.005) -> None:
        """Opens the client's streams, retrying while the daemon is not up yet
        (started beside the gateway); then ``/health`` answers 200."""
        self._loop = asyncio.get_running_loop()
        deadline = self._loop.time() + timeout
        while True:
            try:
                await self.client._live_stream()
                break
            except (RuntimeUnreachable, OSError, grpc.aio.AioRpcError):
                if self._loop.time() >= deadline:
                    raise
                await asyncio.sleep(interval)
        self.ready.set()

    async def aclose(self) -> None:
        for call, stream in list(self._calls.values()):
            call.future.cancel()
            stream.cancel_call(call.call_id)
        for task in list(self._connecting.values()):
            task.cancel()
        for plugin in self._plugins.values():
            await plugin.aclose()
        await self.client.close()

    def emit_threadsafe(self, event: str, data: bytes, namespace: str) -> None:
        """Emits from another thread (the feeds' replay thread): queued in
        order, and one loop wake-up flushes everything queued since the last
        (a replayed batch of records costs one wake-up, not one each)."""
        loop = self._loop
        if loop is None:
            return
        with self._outbox_lock:
            self._outbox.append((event, data, namespace))
            if self._outbox_scheduled:
                return
            self._outbox_scheduled = True
        loop.call_soon_threadsafe(self._flush_outbox)

    def _flush_outbox(self) -> None:
        with self._outbox_lock:
            outbox, self._outbox = self._outbox, []
            self._outbox_scheduled = False
        emit = self.emitter.emit
        for event, data, namespace in outbox:
            emit(event, data, namespace)

    # ── HTTP ────────────────────────────────────────────────────────

    @web.middleware
    async def _refuse_oversized_polls(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        """A polling POST over the cap gets engineio's own answer (400 "Bad
        Request", session closed) at once: engineio 4.3 closes the session
        first and, for a polling client that stopped polling, that waits for
        the ping timeout (300 s) before the reply goes out."""
        if request.method == "POST" and (request.content_length or 0) > MAX_MESSAGE_BYTES \
                and request.path.rstrip("/") == "/socket.io":
            sid = request.query.get("sid")
            if sid:
                asyncio.ensure_future(self.sio.eio.disconnect(sid))
            return web.Response(status=400, body=b"Bad Request", content_type="text/plain")
        return await handler(request)

    async def _health(self, request: web.Request) -> web.Response:
        # Rendered as the original's FastAPI JSONResponse: compact, application/json.
        ok = self.ready.is_set()
        body = json.dumps({"status": "ok" if ok else "starting", "version": HEALTH_VERSION}, separators=(",", ":"))
        return web.Response(body=body.encode(), status=200 if ok else 503, content_type="application/json")

    async def _post_call(self, request: web.Request) -> web.Response:
        if (request.content_length or 0) > MAX_MESSAGE_BYTES:  # refused before reading it
            return self._msgpack({"ok": False, "error": {
                "type": "BadRequest", "message": f"body exceeds the {MAX_MESSAGE_BYTES}-byte message limit"}}, 413)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._msgpack({"ok": False, "error": {
                "type": "BadRequest", "message": f"body exceeds the {MAX_MESSAGE_BYTES}-byte message limit"}}, 413)
        try:
            payload = codec.unpack(body) if body else {}
        except Exception:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        call_id = payload.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            return self._msgpack({"ok": False, "error": {"type": "BadRequest", "message": "missing or invalid call_id"}},
                                 400)
        match = _WAIT_RE.search(request.headers.get("Prefer", ""))
        wait_s = float(match.group(1)) if match else DEFAULT_WAIT_S
        applied = {"Preference-Applied": f"wait={int(wait_s) if wait_s == int(wait_s) else wait_s}"}
        if call_id in self._running or call_id in self._results:
            return self._accepted(call_id, applied)
        terminal = self._start(call_id, payload)
        finished, _ = await asyncio.wait({terminal}, timeout=wait_s)
        if not finished:
            return self._accepted(call_id, applied)
        entry = self._results.pop(call_id, None)
        if entry is None:  # acked by a Socket.IO host in the same turn
            return self._accepted(call_id, applied)
        event, frame = entry
        reply = {"ok": True, "value": frame["value"]} if event == "call:result" else {"ok": False, "error": frame["error"]}
        return self._msgpack(reply, 200, applied)

    @staticmethod
    def _msgpack(body: dict, status: int, headers: dict | None = None) -> web.Response:
        return web.Response(body=codec.pack(body), status=status, headers=headers,
                            content_type="application/msgpack")

    def _accepted(self, call_id: str, applied: dict) -> web.Response:
        return self._msgpack({"call_id": call_id}, 202, {**applied, "Location": f"/call/{call_id}"})

    # ── /rpc ────────────────────────────────────────────────────────

    async def _on_call(self, sid: str, data: Any = None) -> None:
        try:
            payload = _unpack(data)
        except ValueError as error:
            self.emitter.emit("call:error", codec.pack({"call_id": "", "error": _error("BadRequest", str(error))}),
                              "/rpc", to=sid)
            return
        call_id = payload.get("call_id") if isinstance(payload, dict) else None
        if not isinstance(call_id, str) or not call_id:
            self.emitter.emit("call:error", codec.pack({"call_id": "", "error": _error("BadRequest", "missing call_id")}),
                              "/rpc", to=sid)
            return
        if call_id in self._running or call_id in self._results:
            return  # execution-once: a duplicate start is ignored
        self._start(call_id, payload)

    def _start(self, call_id: str, payload: dict) -> asyncio.Future:
        """Starts a legacy call; returns a future that gets its terminal
        (event, frame) once that is cached and broadcast. No task per call:
        the daemon's outcome is turned into the frame in a done-callback."""
        done = asyncio.get_running_loop().create_future()
        self._running[call_id] = done
        entry = self._check(call_id, payload)
        if entry is not None:
            self._complete(call_id, done, entry)
            return done
        stream = self.client._stream
        if stream is not None and stream.alive:
            self._begin(call_id, payload, done, stream)
        else:  # (re)connecting first
            task = asyncio.ensure_future(self._begin_connected(call_id, payload, done))
            self._connecting[call_id] = task
            task.add_done_callback(lambda _: self._connecting.pop(call_id, None))
        return done

    @staticmethod
    def _check(call_id: str, payload: dict) -> tuple[str, dict] | None:
        """The original's errors for a malformed call, or None."""
        for key in ("callable", "arguments"):
            if key not in payload:
                return "call:error", {"call_id": call_id, "error": _error("KeyError", repr(key))}
        context = payload.get("context") or b""
        if not isinstance(payload["callable"], str) or not isinstance(payload["arguments"], (bytes, bytearray)) \
                or not isinstance(context, (bytes, bytearray)):
            return "call:error", {"call_id": call_id, "error": _error(
                "ValidationError", "call needs callable: str, arguments: bytes, context: bytes | None")}
        return None

    async def _begin_connected(self, call_id: str, payload: dict, done: asyncio.Future) -> None:
        try:
            stream = await self.client._live_stream()
        except Exception as error:  # RuntimeUnreachable and the like
            self._complete(call_id, done, ("call:error", {"call_id": call_id,
                                                          "error": _error(type(error).__name__, str(error))}))
            return
        if self._running.get(call_id) is done:  # not cancelled meanwhile
            self._begin(call_id, payload, done, stream)

    def _begin(self, call_id: str, payload: dict, done: asyncio.Future, stream: Any) -> None:
        client = self.client
        callable_ref = payload["callable"]
        arguments = bytes(payload["arguments"])
        context = bytes(payload.get("context") or b"")
        call = _GatewayCall(call_id, callable_ref, asyncio.get_running_loop().create_future(),
                            start=client._start_request(callable_ref, arguments, context, 0),
                            max_result_bytes=client.max_result_bytes)
        call.on_done = lambda future: self._settled(call_id, call, done, future)
        client._pending[call_id] = call
        self._calls[call_id] = (call, stream)
        stream.start_call(call_id, callable_ref, arguments, context)

    def _settled(self, call_id: str, call: PendingCall, done: asyncio.Future, future: asyncio.Future) -> None:
        """The daemon's outcome (or the client's failure) -> the legacy frame."""
        self._calls.pop(call_id, None)
        self.client._pending.pop(call_id, None)
        if future.cancelled():
            return  # cancelled by a legacy host: _on_cancel answered
        error = future.exception()
        if isinstance(error, ResultTooLarge):
            entry = ("call:error", {"call_id": call_id, "error": _error("FrameTooLarge", _FRAME_TOO_LARGE)})
        elif error is not None:  # the client gave up (connection lost for good)
            entry = ("call:error", {"call_id": call_id, "error": _error(type(error).__name__, str(error))})
        else:
            outcome = future.result()
            if isinstance(outcome, RemoteError):
                entry = ("call:error", {"call_id": call_id, "error": _remote_error(outcome)})
            else:
                value = b"".join(outcome) if isinstance(outcome, list) else bytes(outcome)
                entry = ("call:result", {"call_id": call_id, "value": value})
        barrier = call.barrier
        if barrier is not None and any(
                seq > feed.cursor.last_seq for feed, seq in zip(self.client._feeds, (barrier.log_seq, barrier.trace_seq))):
            waited = barrier  # not None (a closure does not keep the narrowing)

            # The records/spans the call emitted go out before its result.
            async def after_barrier() -> None:
                try:
                    await self.client._side_barrier(waited)
                finally:
                    self._complete(call_id, done, entry)
            asyncio.ensure_future(after_barrier())
            return
        self._complete(call_id, done, entry)

    def _complete(self, call_id: str, done: asyncio.Future, entry: tuple[str, dict]) -> None:
        """Cache first, then broadcast (a result is never in neither map)."""
        if self._running.get(call_id) is not done:
            return  # cancelled meanwhile: _on_cancel cached its own reply
        del self._running[call_id]
        self._cache(call_id, entry)
        self.emitter.emit(entry[0], codec.pack(entry[1]), "/rpc")
        if not done.done():
            done.set_result(entry)

    def _cache(self, call_id: str, entry: tuple[str, dict]) -> None:
        self._results[call_id] = entry
        while len(self._results) > self.max_pending_results:
            self._results.popitem(last=False)
            self._evicted += 1
            if self._evicted == 1 or self._evicted % 1000 == 0:
                _log.warning("dropping the oldest unacked result (cap %d, evicted %d so far); a later resume of "
                             "it gets ResultUnavailable", self.max_pending_results, self._evicted)

    async def _on_cancel(self, sid: str, data: Any = None) -> None:
        try:
            call_id = _unpack(data).get("call_id")
        except (ValueError, AttributeError):
            return
        done = self._running.pop(call_id, None) if isinstance(call_id, str) else None
        if done is None:
            return  # unknown or finished: silence (as the original)
        started = self._calls.pop(call_id, None)
        if started is not None:
            call, stream = started
            self.client._pending.pop(call_id, None)
            call.future.cancel()
            stream.cancel_call(call_id)
        connecting = self._connecting.pop(call_id, None)
        if connecting is not None:
            connecting.cancel()
        entry = ("call:error", {"call_id": call_id, "error": _error("Cancelled", "remote call cancelled",
                                                                     cancelled=True)})
        # Cached and broadcast (the original replied to the canceller only,
        # which left another client awaiting the call with no reply).
        self._cache(call_id, entry)
        if not done.done():
            done.set_result(entry)
        self.emitter.emit(entry[0], codec.pack(entry[1]), "/rpc")

    async def _on_resume(self, sid: str, data: Any = None) -> None:
        try:
            call_ids = _unpack(data).get("call_ids")
        except (ValueError, AttributeError):
            return
        if not isinstance(call_ids, list):
            return
        for call_id in call_ids:
            if not isinstance(call_id, str):
                continue
            entry = self._results.get(call_id)
            if entry is not None:
                self.emitter.emit(entry[0], codec.pack(entry[1]), "/rpc", to=sid)
            elif call_id not in self._running:
                frame = {"call_id": call_id, "error": _error("ResultUnavailable", _RESULT_UNAVAILABLE)}
                self.emitter.emit("call:error", codec.pack(frame), "/rpc", to=sid)

    async def _on_ack(self, sid: str, data: Any = None) -> None:
        try:
            call_id = _unpack(data).get("call_id")
        except (ValueError, AttributeError):
            return
        if isinstance(call_id, str):
            self._results.pop(call_id, None)

    # ── /log and /trace ─────────────────────────────────────────────

    def _replay_log(self, record: pb.LogRecord) -> None:
        self.log_stream.append("record", log_payload(record))

    def _replay_trace(self, event: pb.TraceEvent) -> None:
        mapped = trace_payload(event)
        if mapped is not None:
            self.trace_stream.append(*mapped)

    @staticmethod
    def _stream_handler(stream: ReliableStream, handler: Callable) -> Callable:
        async def on_event(sid: str, data: Any = None) -> None:
            try:
                payload = _unpack(data)
            except ValueError:
                return
            if isinstance(payload, dict):
                await handler(stream, sid, payload)
        return on_event

    async def _stream_ack(self, stream: ReliableStream, sid: str, payload: dict) -> None:
        stream.ack(payload.get("seq"))

    async def _stream_resume(self, stream: ReliableStream, sid: str, payload: dict) -> None:
        for event, envelope in stream.since(payload.get("since_seq")):
            self.emitter.emit(event, envelope, stream.namespace, to=sid)

    # ── plugin namespaces ───────────────────────────────────────────

    async def _plugin_event(self, event: str, namespace: str, *args: Any) -> Any:
        plugin = self._plugins.get(namespace)
        if plugin is None:
            plugin = self._plugins[namespace] = _PluginNamespace(self, namespace)
        if event == "connect":
            try:
                await plugin.ensure()
            except Exception as failure:  # refuse the connection, keep serving
                _log.warning("cannot open namespace %s on the daemon: %r", namespace, failure)
                return False
            return None
        if event == "disconnect":
            return None
        if len(args) < 2:
            return None
        data = args[1]
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data)
            try:
                decoded = codec.unpack(data)
            except Exception:
                decoded = None
        else:  # the original passed non-binary payloads through: carry them as msgpack
            decoded = data
            try:
                data = codec.pack(data)
            except Exception:
                _log.debug("dropping an unencodable %s event %r", namespace, event)
                return None
        request_id = ""
        error = None
        if isinstance(decoded, dict):
            rid = decoded.get("request_id")
            request_id = rid if isinstance(rid, str) else ""
            if event.endswith(":error") and isinstance(decoded.get("error"), dict):
                error = decoded["error"]
        try:
            await plugin.send(event, data, request_id, error)
        except Exception as failure:
            _log.warning("forwarding %s event %r failed: %r", namespace, event, failure)
        return None

    # ── serving ─────────────────────────────────────────────────────

    async def serve(self, host: str, port: int) -> web.AppRunner:
        """Starts listening at once (``/health`` answers 503 until the daemon
        is connected) and connects in the background. Returns the runner."""
        self._loop = asyncio.get_running_loop()
        runner = web.AppRunner(self.app, handle_signals=False, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        return runner


def parse_health(body: bytes) -> dict:
    """Decodes a /health body (for tests and the CLI's self-check)."""
    return json.loads(body)
