"""Plugin namespaces, host side: `AsyncClientNamespace` and
`request_handler` (the original's ``_sio_facade``). No gRPC here: plugin
modules import these in sandboxes too.

A plugin subclasses `AsyncClientNamespace` (same surface as the original's,
which was python-socketio's class): ``on_<event>`` methods receive the
decoded payload of the sandbox's events, `emit` sends events to the
sandbox's `agentix.Namespace` of the same path, and `trigger_event` is the
single entry point every event goes through — plugins may override it (the
lifecycle events ``connect`` / ``disconnect`` / ``connect_error`` arrive with
no payload; data events with the msgpack payload bytes as ``args[0]``,
decodable with `agentix.runtime.shared.codec.unpack`).

Register before connecting: ``client.register_namespace(ns)``; the client
then opens one ``RuntimeService.Namespace`` stream per registered namespace
(`agentix.runtime.client.namespaces`) and waits until the daemon confirms
each, so the sandbox can use them from its first call on.

This module is the bottom of the host's namespace code: it imports neither
the client nor the streams. A registered namespace object reaches its stream
through a `NamespaceLink` that `attach` hands it (the client's
`agentix.runtime.client.namespaces.NamespaceSet` makes one per path); the
streams deliver events through `trigger_data_event` and
`detach_coroutine_event`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from inspect import CO_COROUTINE
from types import CoroutineType, FunctionType, MethodType
from typing import Any, Protocol

from agentix.runtime.shared import codec
from agentix.sio import RESERVED_NAMESPACES, DetachedTasks

__all__ = [
    "AsyncClientNamespace",
    "LIFECYCLE_EVENTS",
    "NamespaceLink",
    "RESERVED_NAMESPACES",
    "attach",
    "detach_coroutine_event",
    "request_handler",
    "trigger_data_event",
]

_log = logging.getLogger("agentix.sio")

# The events a namespace's stream itself delivers (no payload); never a
# sandbox event's name.
LIFECYCLE_EVENTS = frozenset({"connect", "disconnect", "connect_error"})


class NamespaceLink(Protocol):
    """How a registered namespace object sends to its stream (one per
    namespace path; made by the client that registered it)."""

    def send_nowait(self, event: str, payload: bytes, request_id: str) -> bool:
        """Sends one encoded event when the stream is open and takes it
        without waiting; False when nothing was sent."""

    async def emit(self, event: str, data: Any, payload: bytes | None = None) -> None:
        """Sends one event (`payload`, when given, is ``codec.pack(data)``),
        re-opening the stream first when it is down."""

    async def close(self) -> None:
        """Closes the stream (the client's calls are unaffected)."""


def attach(ns: AsyncClientNamespace, client: Any, link: NamespaceLink) -> None:
    """Registers `ns` with `client` (its ``client`` attribute, as in the
    original) and gives it the `link` its events go out through."""
    ns.client = client
    ns._link = link


# Replies kept per namespace object for repeated request ids: at most
# _REMEMBERED_REPLIES of them and _REMEMBERED_REPLY_BYTES of packed replies
# (the oldest go first), and only for ids that are ints or strings of at most
# _REMEMBERED_ID_CHARS characters (the sandbox's are 32 hex digits); others are
# answered without being remembered.
_REMEMBERED_REPLIES = 1024
_REMEMBERED_REPLY_BYTES = 64 << 20
_REMEMBERED_ID_CHARS = 128
_IN_PROGRESS = object()
_IN_PROGRESS_ENTRY = (_IN_PROGRESS, 0)
# Distinct unhandled event names warned about per namespace object.
_WARNED_EVENTS = 256


class _RememberedReplies:
    """The answers of one namespace object by request id, oldest first,
    within the bounds above."""

    __slots__ = ("_entries", "_bytes")

    def __init__(self) -> None:
        self._entries: collections.OrderedDict[Any, tuple[Any, int]] = collections.OrderedDict()
        self._bytes = 0

    def __contains__(self, request_id: Any) -> bool:
        return request_id in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """The sizes of the remembered replies, added up."""
        return self._bytes

    def get(self, request_id: Any) -> Any:
        return self._entries[request_id][0]

    def begin(self, request_id: Any) -> None:
        """Marks `request_id`, which it does not hold, as being answered
        (`get` gives `_IN_PROGRESS`): `put` for a new id with no bytes."""
        entries = self._entries
        entries[request_id] = _IN_PROGRESS_ENTRY
        if len(entries) > _REMEMBERED_REPLIES:  # one over the count bound: the oldest goes
            self._bytes -= entries.popitem(last=False)[1][1]

    def finish(self, request_id: Any, answer: Any, size: int = 0) -> None:
        """`put` of the answer of a request `begin` marked: in that
        entry's place while it is still held (no move, and the count bound
        holds already), else as `put`."""
        entries = self._entries
        if entries.get(request_id) is not _IN_PROGRESS_ENTRY:
            self.put(request_id, answer, size)
            return
        entries[request_id] = (answer, size)
        if size:
            self._bytes += size
            if self._bytes > _REMEMBERED_REPLY_BYTES:
                self._forget_oldest()

    def put(self, request_id: Any, answer: Any, size: int = 0) -> None:
        """Remembers `answer` (`size` bytes packed) for `request_id`, then
        forgets the oldest answers while over a bound (this one too when it
        alone is larger than the byte bound)."""
        entries = self._entries
        previous = entries.pop(request_id, None)
        total = self._bytes + size
        if previous is not None:
            total -= previous[1]
        entries[request_id] = (answer, size)
        self._bytes = total
        if total > _REMEMBERED_REPLY_BYTES or len(entries) > _REMEMBERED_REPLIES:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        entries = self._entries
        while entries and (len(entries) > _REMEMBERED_REPLIES or self._bytes > _REMEMBERED_REPLY_BYTES):
            self._bytes -= entries.popitem(last=False)[1][1]


def _replies_of(ns: Any) -> _RememberedReplies:
    replies = getattr(ns, "_agentix_replies", None)
    if replies is None:
        replies = _RememberedReplies()
        ns._agentix_replies = replies
    return replies


class AsyncClientNamespace:
    """A plugin's host-side endpoint of one namespace (see module docstring).

    Handlers: ``on_<event>(self, data)``; a coroutine handler runs as a
    detached task (exceptions logged), so a slow handler never delays other
    events or remote calls. An event with no handler is logged once per
    event name, for the first 256 names.
    """

    def __init__(self, namespace: str | None = None) -> None:
        self.namespace = namespace or "/"
        self.client: Any = None  # the RuntimeClient it is registered with
        self._link: NamespaceLink | None = None
        self._detached_tasks = DetachedTasks(self)
        self._warned_unhandled: set[str] = set()

    async def trigger_event(self, event: str, *args: Any) -> Any:
        """Dispatches one event to its ``on_<event>`` handler."""
        if event in LIFECYCLE_EVENTS:
            handler = getattr(self, "on_" + event, None)
            if handler is None:
                return None
            result = handler(*args)
            return await result if inspect.isawaitable(result) else result
        self._trigger_data_event(event, *args)
        return None

    def _trigger_data_event(self, event: str, *args: Any) -> None:
        """`trigger_event` of a data event, which never awaits anything: a
        sync handler runs, a coroutine handler is detached. The host's
        streams call it directly (no coroutine, no task step) when a
        namespace does not override `trigger_event`."""
        handler = getattr(self, "on_" + event, None)
        if handler is None or not callable(handler):
            warned = self._warned_unhandled
            if event not in warned and len(warned) < _WARNED_EVENTS:
                warned.add(event)
                _log.warning(
                    "namespace %s received event %r with no handler. A typo in an on_<event> method or a "
                    "mismatched namespace string silently drops the event.%s",
                    self.namespace,
                    event,
                    f" ({_WARNED_EVENTS} event names reported: later names without a handler are not.)"
                    if len(warned) == _WARNED_EVENTS else "",
                )
            return
        data = codec.unpack(args[0]) if args and isinstance(args[0], (bytes, bytearray, memoryview)) else (
            args[0] if args else None
        )
        result = handler(data)
        if inspect.isawaitable(result):
            self._detach(event, result)

    def _detach_coroutine_event(self, event: str, data: bytes, loop: asyncio.AbstractEventLoop) -> bool:
        """`_trigger_data_event` for the host's streams, in one lookup: when
        `event`'s handler is a coroutine function, starts it on `data` decoded
        as a detached task of `loop` and returns True; otherwise does nothing
        and returns False (the stream then triggers the event the usual way).
        Raises what decoding or calling the handler raises."""
        handler = getattr(self, "on_" + event, None)
        if handler is None:
            return False
        # inspect.iscoroutinefunction's answer, read straight from the code
        # flags for the usual method or function (~1 µs less per event).
        function = handler.__func__ if type(handler) is MethodType else handler
        if type(function) is FunctionType:
            if not function.__code__.co_flags & CO_COROUTINE:
                return False
        elif not inspect.iscoroutinefunction(handler):
            return False
        self._detached_tasks.run(event, handler(codec.unpack(data)), loop)
        return True

    def _detach(self, event: str, awaitable: Awaitable[Any]) -> None:
        if type(awaitable) is CoroutineType:
            self._detached_tasks.run(event, awaitable, asyncio.get_running_loop())
        else:  # a future or another awaitable: held as it is
            self._detached_tasks.start(event, asyncio.ensure_future(awaitable))

    async def emit(self, event: str, data: Any = None, namespace: str | None = None, callback: Any = None) -> None:
        """Sends `event` with `data` (msgpack-encoded) to the sandbox.

        Raises RuntimeError if the namespace is not registered with a
        connected client, TypeError if `data` cannot be encoded."""
        if callback is not None:
            raise TypeError("AsyncClientNamespace.emit: callbacks are not supported; use request/reply events")
        if namespace not in (None, self.namespace):
            raise ValueError(f"this namespace object carries {self.namespace}, not {namespace}")
        link = self._link
        if link is None:
            raise RuntimeError(
                f"namespace {self.namespace} is not registered with a RuntimeClient "
                "(call client.register_namespace(ns) before the first call)"
            )
        await link.emit(event, data)

    async def disconnect(self) -> None:
        """Closes this namespace's stream (the client's calls are unaffected)."""
        if self._link is not None:
            await self._link.close()


def trigger_data_event(ns: AsyncClientNamespace, event: str, data: bytes) -> None:
    """`AsyncClientNamespace.trigger_event` of a data event without a
    coroutine, for the host's streams when `ns` does not override
    `trigger_event`."""
    ns._trigger_data_event(event, data)


def detach_coroutine_event(ns: AsyncClientNamespace, event: str, data: bytes, loop: asyncio.AbstractEventLoop) -> bool:
    """`AsyncClientNamespace._detach_coroutine_event`, for the host's streams
    (see there)."""
    return ns._detach_coroutine_event(event, data, loop)


def _message_of(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when that raises: the sandbox must get its
    error reply whatever the exception (without one it waits out its timeout)."""
    try:
        return str(exc)
    except Exception as error:
        return f"<str() of the {type(exc).__name__} raised {type(error).__name__}>"


def request_handler(event: str) -> Callable[[Callable[..., Any]], Callable[..., Awaitable[None]]]:
    """Turns ``on_<event>(self, body)`` into the answering side of the
    sandbox's ``Namespace.request(event, body)``: the return value is sent as
    ``<event>:result {request_id, value}``, an exception as ``<event>:error
    {request_id, error: {type, message[, status_code]}}`` (the sandbox raises
    `RemoteSioError`). A payload that is not a request envelope is passed
    as the body with request_id None.

    A repeated request id gets the first answer again, not a second call:
    answers are remembered for the last 1,024 ids (ints, or strings of at
    most 128 characters) and 64 MiB of packed replies per namespace object."""

    result_event, error_event = f"{event}:result", f"{event}:error"

    def decorate(fn: Callable[..., Any]) -> Callable[..., Awaitable[None]]:
        @functools.wraps(fn)
        async def handle(self: AsyncClientNamespace, payload: Any) -> None:
            if isinstance(payload, dict) and "request_id" in payload:
                request_id, body = payload.get("request_id"), payload.get("data")
            else:
                request_id, body = None, payload
            # The sandbox sends a request again after a reconnect (its first
            # send or our reply may have been lost): answer each id once,
            # replaying the reply to repeats.
            replies = getattr(self, "_agentix_replies", None)  # `_replies_of` inline
            if replies is None:
                replies = _replies_of(self)
            # Ids remembered: ints, and strs of at most _REMEMBERED_ID_CHARS.
            remember = (type(request_id) is str and len(request_id) <= _REMEMBERED_ID_CHARS) or type(request_id) is int
            if remember:
                if request_id in replies._entries:
                    previous = replies.get(request_id)
                    if previous is not _IN_PROGRESS:
                        await self.emit(*previous)
                    return
                replies.begin(request_id)
            try:
                value = fn(self, body)
                if type(value) is CoroutineType or inspect.isawaitable(value):
                    value = await value
                reply = {"request_id": request_id, "value": value}
                packed = codec.pack(reply)  # an unencodable value becomes an error reply
            except Exception as exc:
                error: dict[str, Any] = {"type": type(exc).__name__, "message": _message_of(exc)}
                try:
                    status = getattr(exc, "status_code", None)
                except Exception:  # a raising property: no status, still a reply
                    status = None
                if isinstance(status, int) and not isinstance(status, bool):
                    error["status_code"] = status
                answer = (error_event, {"request_id": request_id, "error": error})
                size = len(error["message"]) + len(error["type"])
            else:
                size = len(packed)
                answer = (result_event, reply)
                link = self._link
                if type(self).emit is AsyncClientNamespace.emit and link is not None:
                    # emit() would pack the reply again: send the bytes at hand,
                    # straight to the stream when it takes them without waiting.
                    if remember:
                        replies.finish(request_id, answer, size)
                    ident = request_id if isinstance(request_id, str) else ""
                    if not link.send_nowait(result_event, packed, ident):
                        await link.emit(result_event, reply, packed)
                    return
            if remember:
                replies.finish(request_id, answer, size)
            await self.emit(*answer)

        return handle

    return decorate
