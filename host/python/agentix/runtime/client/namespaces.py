"""The host half of ``RuntimeService.Namespace``: one stream per plugin
namespace registered with a `RuntimeClient` (see
`agentix.runtime.client._sio_facade` for the plugin-facing classes).

`NativeNamespaceStream` runs it over the ``_native_calls`` extension (grpc++
on a completion queue), like the Calls stream; `FrameNamespaceStream` over
the daemon's frame wire (docs/FRAME-WIRE.md) when the Calls stream's wire
choice would use it; `NamespaceStream` over grpc.aio when neither is in use.
All behave the same towards the namespace object and the client.

Event names come from the sandbox: one that `valid_event_name` refuses (empty,
longer than `MAX_EVENT_NAME_CHARS`, with an unprintable character, or a
lifecycle name, which only the host's stream itself delivers) is dropped
before any handler sees it; the first one of a stream is logged at WARNING,
later ones at DEBUG. The ``namespace`` of a response is not used (each stream
delivers to the namespace object it was opened for).

A response the host cannot read (its decoder or protobuf raises) is skipped:
logged (the stream's first at ERROR with the traceback, later ones at
WARNING), counted (`namespace_failures.lost_counts`), and each request whose
event name and request id can still be read from its bytes is answered with
a ``MalformedError`` error reply; a request whose id cannot be read waits out
its timeout in the sandbox. The stream goes on (`namespace_failures`).

`NamespaceSet` is a client's registry of namespace objects and their current
streams: it registers them (`register`), opens and confirms their streams
when the client connects (`open`, `confirm`), re-opens lost ones, and gives
each namespace object the `agentix.runtime.client._sio_facade.NamespaceLink`
its `emit` goes through. It asks the client for connections only through the
callables it is built with, so this module does not import the client."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Union

import grpc

from agentix.runtime.client import namespace_failures, ns_wire
from agentix.runtime.client._sio_facade import (
    LIFECYCLE_EVENTS,
    RESERVED_NAMESPACES,
    AsyncClientNamespace,
    attach,
    trigger_data_event,
)
from agentix.runtime.client.errors import RuntimeUnreachable
from agentix.runtime.client.pinned_waits import converse
from agentix.runtime.client.stream import NativeStreamError
from agentix.runtime.shared import codec
from agentix.runtime.v1 import runtime_pb2 as pb

__all__ = [
    "MAX_EVENT_NAME_CHARS",
    "NAMESPACE_METHOD",
    "FrameNamespaceStream",
    "NamespaceSet",
    "NamespaceStream",
    "NativeNamespaceStream",
    "read_response",
    "valid_event_name",
]

NAMESPACE_METHOD = "/agentix.runtime.v1.RuntimeService/Namespace"

# Seconds a new Namespace stream may take to be confirmed by the daemon.
OPEN_TIMEOUT = 10.0

# Bytes a NativeNamespaceStream lets wait in its transport before send()
# waits for them to be written (grpc.aio's write waits for every message).
NATIVE_SEND_AHEAD = 2 << 20

_log = logging.getLogger("agentix.sio")

# The longest event name a sandbox may send to the host.
MAX_EVENT_NAME_CHARS = 256


def valid_event_name(event: str) -> bool:
    """Whether the host delivers a sandbox event named `event`: 1 to
    `MAX_EVENT_NAME_CHARS` printable characters, and not ``connect``,
    ``disconnect`` or ``connect_error`` (the stream's own events)."""
    return 0 < len(event) <= MAX_EVENT_NAME_CHARS and event not in LIFECYCLE_EVENTS and event.isprintable()


def _event_request(event: str, payload: bytes, request_id: str, error: dict | None) -> pb.NamespaceRequest:
    """The NamespaceRequest carrying one host event."""
    message = pb.NamespaceEvent(event=event, data=payload, request_id=request_id)
    if error is not None:
        status = error.get("status_code")
        message.error.type = str(error.get("type", "Error"))
        message.error.message = str(error.get("message", ""))
        if isinstance(status, int) and not isinstance(status, bool) and -(2**31) <= status < 2**31:
            message.error.status_code = status
    return pb.NamespaceRequest(event=message)


def _closed(ns: AsyncClientNamespace) -> RuntimeError:
    return RuntimeError(f"namespace {ns.namespace}: the stream to the sandbox is closed")


def _native_decoder() -> Callable[[bytes], tuple[bool, list[tuple[str, bytes]]] | None]:
    """``_native_calls.namespace_events``: reads the opened flag and the
    events of a serialized NamespaceResponse without protobuf's reflection
    (several µs less per event on the host's loop), or returns None for any
    message it leaves to protobuf. Streams of the native transport always
    have it; the fallback only keeps this module importable without it."""
    try:
        from agentix.runtime.client._native_calls import namespace_events
    except ImportError:
        return lambda message: None
    return namespace_events


def read_response(message: bytes, decode: Callable[[bytes], Any]) -> tuple[bool, list[tuple[str, bytes]]]:
    """The opened flag and the (name, data) events of a serialized
    NamespaceResponse, read by `decode` (`_native_decoder`) or, for a message
    it leaves alone, by protobuf. Raises what they raise."""
    decoded = decode(message)
    return _protobuf_response(message) if decoded is None else decoded


def _protobuf_response(message: bytes) -> tuple[bool, list[tuple[str, bytes]]]:
    response = pb.NamespaceResponse.FromString(message)
    return response.opened, [(event.event, event.data) for event in response.events]


def _plain_trigger(ns: AsyncClientNamespace) -> bool:
    """True when `ns` uses AsyncClientNamespace.trigger_event as it is: its
    data events can then go to `_trigger_data_event` without a coroutine."""
    return getattr(getattr(ns, "trigger_event", None), "__func__", None) is AsyncClientNamespace.trigger_event


class _StreamBase:
    """What both kinds of stream share: the daemon's confirmation, the
    open watchdog, how an RPC error is reported."""

    def __init__(self, ns: AsyncClientNamespace) -> None:
        self.ns = ns
        self._opened: asyncio.Future = asyncio.get_running_loop().create_future()
        self._done = False  # no more sends
        self._refused = 0  # sandbox events dropped for their name
        self._undecodable = 0  # responses skipped because they could not be read
        self._decode = _native_decoder()

    @property
    def alive(self) -> bool:
        return not self._done

    def send_nowait(self, event: str, payload: bytes, request_id: str) -> bool:
        """Sends one event when that needs no waiting; False when nothing was
        sent (`send` must be awaited instead). Raises RuntimeError when the
        stream is closed."""
        return False

    async def wait_opened(self, timeout: float) -> None:
        """Waits for the daemon's confirmation. Raises ValueError when the
        daemon refuses the namespace, RuntimeError when the stream fails."""
        async with asyncio.timeout(timeout):
            await asyncio.shield(self._opened)

    def _refuse(self, event: str) -> None:
        """Drops a sandbox event whose name `valid_event_name` refuses."""
        self._refused += 1
        _log.log(
            logging.WARNING if self._refused == 1 else logging.DEBUG,
            "namespace %s: dropped an event from the sandbox named %r (%d characters): an event name is 1 to %d "
            "printable characters and not a lifecycle event (%d dropped on this stream; later ones at DEBUG)",
            self.ns.namespace, event[:64], len(event), MAX_EVENT_NAME_CHARS, self._refused,
        )

    def _unreadable(self, message: bytes, error: Exception) -> list[tuple[str, bytes, str, dict]]:
        """Reading `message` raised `error`: reports and counts it; returns the
        error replies (event, payload, request id, error) due to the requests
        still readable in it (see `namespace_failures`). Never raises."""
        path = self.ns.namespace
        replies = []
        for event, request_id in namespace_failures.readable_requests(message):
            name, reply = namespace_failures.unreadable_reply(event, request_id, error)
            replies.append((name, codec.pack(reply), request_id, reply["error"]))
        self._undecodable += 1
        total = namespace_failures.count_lost(path, 1, len(replies))
        first = self._undecodable == 1
        try:
            _log.log(
                logging.ERROR if first else logging.WARNING,
                "namespace %s: a response of %d bytes from the sandbox could not be read (%s: %s); its events are "
                "lost, %d request(s) in it answered with an error, the stream goes on (%d such responses for this "
                "namespace in this process)",
                path, len(message), type(error).__name__, error, len(replies), total,
                exc_info=error if first else None,
            )
        except Exception:  # an unprintable error, or a failing handler of this logger
            pass
        return replies

    def _open_timed_out(self) -> None:
        if not self._opened.done():
            _log.debug("namespace %s: no answer to OpenNamespace within %ss; re-opened by the next call",
                       self.ns.namespace, OPEN_TIMEOUT)
            self._abandon()

    def _abandon(self) -> None:
        """Ends a stream the daemon did not confirm in time."""
        raise NotImplementedError

    def _report_error(self, error: grpc.RpcError, closed_by_host: bool) -> bool:
        """Reports the RPC ending with `error`: to `wait_opened` when it had
        not opened (True: connect_error is due), else as a warning unless the
        host closed it."""
        ns = self.ns
        if not self._opened.done():
            kind = ValueError if error.code() == grpc.StatusCode.INVALID_ARGUMENT else RuntimeError
            self._opened.set_exception(
                kind(f"namespace {ns.namespace}: the sandbox refused it: {error.code().name}: {error.details()}")
            )
            return True
        if not closed_by_host:
            _log.warning(
                "namespace %s: stream to the sandbox lost (%s: %s); re-opened by the next call",
                ns.namespace,
                error.code().name,
                error.details(),
            )
        return False

    def _settle_opened(self) -> None:
        """The stream has ended: `wait_opened` fails if it had not opened."""
        if not self._opened.done():
            self._opened.set_exception(RuntimeError(f"namespace {self.ns.namespace}: stream ended before it opened"))
        # Retrieved here so an unawaited failure is not reported as lost.
        self._opened.exception()


class NamespaceStream(_StreamBase):
    """One open ``RuntimeService.Namespace`` stream: reads the sandbox's
    events into ``ns.trigger_event`` (in order, one at a time) and writes the
    host's events. Never raises into the client: a failure ends the stream
    (``alive`` False), delivers ``disconnect`` and is re-opened by the next
    call."""

    def __init__(self, rpc: grpc.aio.StreamStreamCall, ns: AsyncClientNamespace) -> None:
        super().__init__(ns)
        self._rpc = rpc
        self._write_lock = asyncio.Lock()
        self._task = asyncio.create_task(self._run(), name=f"agentix-namespace{ns.namespace}")

    async def send(self, event: str, payload: bytes, request_id: str, error: dict | None) -> None:
        request = _event_request(event, payload, request_id, error)
        async with self._write_lock:
            if self._done:
                raise _closed(self.ns)
            await self._rpc.write(request)

    async def aclose(self) -> None:
        """Ends the stream; delivers ``disconnect``. Idempotent."""
        if self._done and self._task.done():
            return
        self._done = True
        self._rpc.cancel()
        if self._task is asyncio.current_task():
            return  # closed from inside a trigger: waiting would wait for itself
        await asyncio.gather(self._task, return_exceptions=True)

    def _abandon(self) -> None:
        self._rpc.cancel()
        self._task.cancel()  # the stuck write may not notice the RPC's cancellation

    async def _run(self) -> None:
        ns = self.ns
        connected = False
        # A stream opened while its connection is being cut was seen to hang
        # in its first write for ever; the client re-opens streams that end,
        # so one that does not open in time is ended.
        watchdog = asyncio.get_running_loop().call_later(OPEN_TIMEOUT, self._open_timed_out)
        try:
            await self._rpc.write(pb.NamespaceRequest(open=pb.OpenNamespace(namespace=ns.namespace)))
            read = self._rpc.read  # cheaper than the call's async iterator
            plain = _plain_trigger(ns)
            decode = self._decode
            while (message := await read()) is not grpc.aio.EOF:
                try:
                    opened, events = read_response(message, decode)
                except Exception as error:  # skipped: the stream goes on
                    if not self._opened.done():
                        raise  # (the daemon's confirmation: the stream fails to open, as before)
                    for reply in self._unreadable(message, error):
                        await self._send_reply(*reply)
                    continue
                if opened:
                    if not self._opened.done():
                        self._opened.set_result(None)
                    connected = True
                    await self._trigger("connect")
                for name, data in events:
                    if self._done:  # a trigger closed the stream
                        break
                    if not valid_event_name(name):
                        self._refuse(name)
                    elif plain:
                        self._trigger_now(name, data)
                    else:
                        await self._trigger(name, data)
        except asyncio.CancelledError:
            pass
        except grpc.aio.AioRpcError as error:
            if self._report_error(error, closed_by_host=self._done):
                await self._trigger("connect_error", {"message": error.details()})
        except Exception:
            _log.exception("namespace %s: stream failed; re-opened by the next call", ns.namespace)
        finally:
            watchdog.cancel()
            self._done = True
            self._settle_opened()
            if connected:
                await self._trigger("disconnect")

    async def _send_reply(self, event: str, payload: bytes, request_id: str, error: dict) -> None:
        try:
            await self.send(event, payload, request_id, error)
        except Exception:  # the stream is closing: the request waits out its timeout
            _log.debug("namespace %s: could not send %s", self.ns.namespace, event, exc_info=True)

    def _trigger_now(self, event: str, data: bytes) -> None:
        """A data event of a namespace with the plain trigger_event, without a coroutine."""
        try:
            trigger_data_event(self.ns, event, data)
        except Exception:
            _log.exception("namespace %s: handling event %r raised", self.ns.namespace, event)

    async def _trigger(self, event: str, *args: Any) -> None:
        try:
            await self.ns.trigger_event(event, *args)
        except Exception:
            _log.exception("namespace %s: handling event %r raised", self.ns.namespace, event)


class NativeNamespaceStream(_StreamBase):
    """A `NamespaceStream` over ``_native_calls.CallsTransport`` opened on
    the Namespace method instead of grpc.aio.

    Responses are taken from the transport in a ``loop.add_reader``
    callback on its eventfd, decoded by the extension (protobuf only reads
    the rare ones it leaves alone), and triggered one at a time, in order:

    - A data event whose handler is a coroutine function (as every
      `request_handler` is), of a namespace with the plain
      ``AsyncClientNamespace.trigger_event``, is handled right in that
      callback: the handler is detached as its own task, as that trigger
      would, so no plugin code runs outside a task, and no task step is
      spent per event.
    - Anything else (a sync handler, an overridden ``trigger_event``, the
      lifecycle events) goes to a dispatcher task that awaits each trigger,
      so that code runs inside a task as on grpc.aio; later events wait
      behind it until it has run them all.

    Writes are handed to the transport without waiting; `send` waits only
    while more than `NATIVE_SEND_AHEAD` bytes are not yet written.
    `send_nowait` (how a `request_handler` replies) writes without a
    coroutine at all, unless earlier writes are backed up that far.

    Args:
      transport: a new ``CallsTransport`` opened on `NAMESPACE_METHOD`
        without coalescing; this stream owns and closes it.
      ns: the namespace object events are delivered to.
    """

    # The transport takes a whole frame-wire frame (`write_frame`).
    _whole_frames = False

    def __init__(self, transport: Any, ns: AsyncClientNamespace) -> None:
        super().__init__(ns)
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._transport = transport
        self._ended = False  # the transport is closed; nothing more is read
        self._connected = False
        self._plain = _plain_trigger(ns)
        self._backlog: collections.deque[tuple[str, tuple]] = collections.deque()
        self._dispatcher: asyncio.Task | None = None  # awaiting the backlog's triggers
        self._finished: asyncio.Future = loop.create_future()  # ended, every event delivered
        self._below: asyncio.Future | None = None  # send() waits for the transport to drain
        self._fd = transport.fileno()
        loop.add_reader(self._fd, self._on_readable)
        # A stream opened while its connection is being cut was seen to hang
        # (grpc.aio); the client re-opens streams that end, so one that does
        # not open in time is ended.
        self._watchdog = loop.call_later(OPEN_TIMEOUT, self._open_timed_out)
        # -1 (no more writes) means the stream is ending: drain() brings the status.
        transport.write(pb.NamespaceRequest(open=pb.OpenNamespace(namespace=ns.namespace)).SerializeToString())

    async def send(self, event: str, payload: bytes, request_id: str, error: dict | None) -> None:
        if self._write(event, payload, request_id, error):
            below = self._below  # set by _write when it returns True
            if below is not None:
                await asyncio.shield(below)

    def send_nowait(self, event: str, payload: bytes, request_id: str) -> bool:
        if self._below is not None:
            return False  # earlier writes are backed up: wait behind them in send()
        self._write(event, payload, request_id, None)
        return True

    def _write(self, event: str, payload: bytes, request_id: str, error: dict | None) -> bool:
        """Hands one event to the transport. True when more than
        `NATIVE_SEND_AHEAD` bytes now wait to be written; `_below` resolves
        once they no longer do."""
        if self._done:
            raise _closed(self.ns)
        if error is None and type(payload) is bytes:
            if self._whole_frames and len(payload) <= ns_wire.FRAME_PAYLOAD_MAX:
                waiting = self._transport.write_frame(ns_wire.namespace_event_frame(event, payload, request_id))
            else:
                waiting = self._transport.write(ns_wire.namespace_event_request(event, payload, request_id))
        else:
            waiting = self._transport.write(_event_request(event, payload, request_id, error).SerializeToString())
        if waiting < 0:
            raise _closed(self.ns)
        if waiting <= NATIVE_SEND_AHEAD:
            return False
        if self._below is None:
            self._below = self._loop.create_future()
            self._transport.notify_below(NATIVE_SEND_AHEAD)
        return True

    async def aclose(self) -> None:
        """Ends the stream; delivers ``disconnect``. Idempotent."""
        if not self._ended:
            self._backlog.clear()  # what the host closed on is not delivered
            self._end(None)
        current = asyncio.current_task()
        if self._finished.done() or (current is not None and current is self._dispatcher):
            return  # (closed from inside a trigger: waiting would wait for itself)
        try:
            await asyncio.shield(self._finished)
        except asyncio.CancelledError:
            if self._dispatcher is not None:
                self._dispatcher.cancel()
            raise

    def _abandon(self) -> None:
        self._end(None)

    def _on_readable(self) -> None:
        if self._ended:
            return
        try:
            messages, status, below = self._transport.drain()
            if messages:
                # A call in flight on this loop (pinned waits: frame-wire
                # Calls, whose namespace streams are these) now converses.
                converse()
            decode = self._decode
            for message in messages:
                try:
                    decoded = decode(message)
                    if decoded is None:  # not the common form: protobuf judges it
                        decoded = _protobuf_response(message)
                except Exception as error:  # skipped: the stream goes on
                    if not self._opened.done():
                        raise  # (the daemon's confirmation: the stream fails to open, as before)
                    for event, payload, request_id, failure in self._unreadable(message, error):
                        try:
                            self._write(event, payload, request_id, failure)
                        except RuntimeError:  # closed meanwhile: the request waits out its timeout
                            break
                    continue
                opened, events = decoded
                if opened:
                    if not self._opened.done():
                        self._opened.set_result(None)
                    self._connected = True
                    self._deliver("connect", ())
                for event, data in events:
                    if self._ended:  # a trigger closed the stream
                        return
                    if 0 < len(event) <= MAX_EVENT_NAME_CHARS and event not in LIFECYCLE_EVENTS and event.isprintable():
                        self._deliver(event, (data,))
                    else:
                        self._refuse(event)
                if self._ended:
                    return
            if below:
                self._wake_senders()
            if status is not None:
                self._end(status)
        except Exception:
            _log.exception("namespace %s: stream failed; re-opened by the next call", self.ns.namespace)
            self._end(None)

    def _end(self, status: tuple[int, str] | None) -> None:
        """Closes the transport and reports the end as the grpc.aio stream
        does: `status` is the RPC's (code, details), None when the host ended
        it (aclose, the open watchdog) or a failure was already logged."""
        if self._ended:
            return
        self._ended = True
        self._watchdog.cancel()
        closed_by_host = self._done
        self._done = True
        self._loop.remove_reader(self._fd)  # before the transport closes its eventfd
        self._transport.close()
        self._wake_senders()
        if status is not None and status[0] != 0:
            error = NativeStreamError(*status)
            if self._report_error(error, closed_by_host):
                self._deliver("connect_error", ({"message": error.details()},))
        self._settle_opened()
        if self._connected:
            self._deliver("disconnect", ())
        self._check_finished()

    def _wake_senders(self) -> None:
        below, self._below = self._below, None
        if below is not None and not below.done():
            below.set_result(None)

    def _deliver(self, event: str, args: tuple) -> None:
        """Triggers `event` now, or after the triggers before it have ended."""
        if self._dispatcher is None and self._plain and event not in LIFECYCLE_EVENTS:
            try:
                if self.ns._detach_coroutine_event(event, args[0], self._loop):  # detach_coroutine_event
                    return
            except Exception:
                _log.exception("namespace %s: handling event %r raised", self.ns.namespace, event)
                return
        self._backlog.append((event, args))
        if self._dispatcher is None:
            self._dispatcher = self._loop.create_task(self._dispatch(), name=f"agentix-namespace{self.ns.namespace}")

    async def _dispatch(self) -> None:
        ns = self.ns
        try:
            backlog = self._backlog
            while backlog:
                event, args = backlog.popleft()
                try:
                    await ns.trigger_event(event, *args)
                except Exception:
                    _log.exception("namespace %s: handling event %r raised", ns.namespace, event)
        finally:
            self._dispatcher = None
            self._check_finished()

    def _check_finished(self) -> None:
        if self._ended and self._dispatcher is None and not self._backlog and not self._finished.done():
            self._finished.set_result(None)


class FrameNamespaceStream(NativeNamespaceStream):
    """A `NativeNamespaceStream` over a frame-wire connection
    (`agentix.runtime.client.frames.FrameTransport`, opened with HELLO
    ``agentix-stream: namespace``): the event loop reads the socket itself
    and writes go out at once with a non-blocking ``sendmsg``; write progress
    comes from the transport's ``on_progress``. A STATUS other than OK, or
    EOF without one, ends the stream as a gRPC status does. An event of a
    payload below the payload ring's bulk size is written as one whole
    frame (`ns_wire.namespace_event_frame`).

    Args:
      transport: a new ``FrameTransport``; this stream owns and closes it.
      ns: the namespace object events are delivered to.
    """

    _whole_frames = True

    def __init__(self, transport: Any, ns: AsyncClientNamespace) -> None:
        super().__init__(transport, ns)
        transport.on_progress = self._on_readable


AnyNamespaceStream = Union[NamespaceStream, NativeNamespaceStream]


class _Link:
    """The `NamespaceLink` of one registered path: sends through the
    set's current stream for it."""

    __slots__ = ("_namespaces", "_streams", "_path")

    def __init__(self, namespaces: NamespaceSet, path: str) -> None:
        self._namespaces = namespaces
        self._streams = namespaces.streams
        self._path = path

    def send_nowait(self, event: str, payload: bytes, request_id: str) -> bool:
        stream = self._streams.get(self._path)
        return stream is not None and stream.alive and stream.send_nowait(event, payload, request_id)

    async def emit(self, event: str, data: Any, payload: bytes | None = None) -> None:
        await self._namespaces.emit(self._path, event, data, payload)

    async def close(self) -> None:
        stream = self._streams.pop(self._path, None)
        if stream is not None:
            await stream.aclose()


class NamespaceSet:
    """The plugin namespaces registered with one client, and their streams.

    Args:
      base_url: the client's URL, for error messages.
      new_stream: makes a new (unconfirmed) stream for a namespace object on
        a channel (the client picks the transport).
      connect: connects the client if it is not (its Calls stream), which
        opens and confirms every namespace's stream.
      reopen: re-opens and confirms the namespaces' lost streams under the
        client's connect lock.
    """

    def __init__(
        self,
        base_url: str,
        new_stream: Callable[[grpc.aio.Channel, AsyncClientNamespace], AnyNamespaceStream],
        connect: Callable[[], Awaitable[Any]],
        reopen: Callable[[], Awaitable[None]],
    ) -> None:
        self._base_url = base_url
        self._new_stream = new_stream
        self._connect = connect
        self._reopen = reopen
        self.registered: dict[str, AsyncClientNamespace] = {}
        self.streams: dict[str, AnyNamespaceStream] = {}
        self.reopened_at = float("-inf")

    def register(self, ns: AsyncClientNamespace, client: Any) -> None:
        """Adds `ns` (see `RuntimeClient.register_namespace`)."""
        path = getattr(ns, "namespace", None)
        if not isinstance(path, str) or not path.startswith("/") or path == "/":
            raise ValueError(f"namespace must be a path starting with '/' (e.g. '/myplugin'), got {path!r}")
        if path in RESERVED_NAMESPACES:
            raise ValueError(f"namespace {path!r} is reserved by agentix-core; choose another path for the plugin")
        if path in self.registered:
            raise ValueError(f"namespace {path!r} already registered")
        attach(ns, client, _Link(self, path))
        self.registered[path] = ns

    def alive(self) -> bool:
        """Whether every registered namespace has a live stream."""
        return all((stream := self.streams.get(path)) is not None and stream.alive for path in self.registered)

    def open(self, channel: grpc.aio.Channel) -> list[AnyNamespaceStream]:
        """Opens a Namespace stream for every registered namespace that has
        no live one; returns the new streams (not yet confirmed)."""
        opened = []
        for path, ns in self.registered.items():
            current = self.streams.get(path)
            if current is not None and current.alive:
                continue
            stream = self._new_stream(channel, ns)
            self.streams[path] = stream
            opened.append(stream)
        return opened

    async def confirm(self, streams: list[AnyNamespaceStream], timeout: float) -> None:
        """Waits until the daemon has confirmed each new stream.

        Raises ValueError when it refuses a namespace, RuntimeUnreachable
        when a stream fails or no answer comes within `timeout`."""
        for stream in streams:
            try:
                await stream.wait_opened(timeout)
            except TimeoutError:
                raise RuntimeUnreachable(
                    f"runtime at {self._base_url} did not confirm namespace {stream.ns.namespace} within {timeout}s"
                ) from None
            except RuntimeError as error:
                raise RuntimeUnreachable(f"runtime at {self._base_url}: {error}") from error

    async def emit(self, path: str, event: str, data: Any, payload: bytes | None = None) -> None:
        """Sends one event of a registered namespace (AsyncClientNamespace.emit);
        `payload`, when given, is ``codec.pack(data)`` already."""
        if payload is None:
            payload = codec.pack(data)
        error = None
        if event.endswith(":error") and isinstance(data, dict) and isinstance(data.get("error"), dict):
            error = data["error"]
        request_id = data.get("request_id") if isinstance(data, dict) else None
        stream = self.streams.get(path)
        if stream is None or not stream.alive:
            # (A request handler's reply, the hot path, finds its stream open.)
            await self._connect()
            stream = self.streams.get(path)
        if stream is None or not stream.alive:
            await self._reopen()
            stream = self.streams[path]
        await stream.send(event, payload, request_id if isinstance(request_id, str) else "", error)

    def take_streams(self) -> list[AnyNamespaceStream]:
        """Forgets every stream and returns them (to close)."""
        streams = list(self.streams.values())
        self.streams.clear()
        return streams
