"""Plugin namespaces, sandbox side: `Namespace` and `register_namespace`.

Code running in a sandbox subclasses `Namespace` to talk to host code (an
`agentix.AsyncClientNamespace` registered with the same namespace path)
while remote calls run::

    class Proxy(agentix.Namespace):
        namespace = "/llm"

        def on_config(self, data):          # host -> sandbox event
            ...

    proxy = agentix.register_namespace(Proxy())
    await proxy.emit("progress", {"step": 3})                 # sandbox -> host
    answer = await proxy.request("complete", {"prompt": p})   # ... and wait for the reply

Events travel over the daemon's ``RuntimeService.Namespace`` streams; the
agentix worker installs the bridge (`_install`) when it starts. Payloads are
msgpack (`agentix.runtime.shared.codec`). A request is the event
``{request_id, data}``; the host answers ``<event>:result {request_id,
value}`` or ``<event>:error {request_id, error: {type, message}}``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import os
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, NamedTuple, Protocol

from agentix.runtime.shared import codec
from agentix.runtime.shared import running_loop as _loops
from agentix.runtime.shared.ids import UniqueIds

__all__ = ["RESERVED_NAMESPACES", "Namespace", "RemoteSioError", "register_namespace"]

RESERVED_NAMESPACES = frozenset({"/rpc", "/trace", "/log"})

_log = logging.getLogger("agentix.sio")

_NOT_INSTALLED = "agentix.sio is not installed — only callable from inside a sandbox runtime worker."


class RemoteSioError(RuntimeError):
    """The host's handler of a `Namespace.request` raised.

    ``str(error)`` is ``"type: message"``; ``.type``, ``.message`` and
    ``.status_code`` (an int the handler chose, else None) are attributes."""

    def __init__(self, type: str, message: str, status_code: Any = None) -> None:  # noqa: A002
        super().__init__(f"{type}: {message}")
        self.type = type
        self.message = message
        self.status_code = status_code if isinstance(status_code, int) and not isinstance(status_code, bool) else None


class _Bridge(Protocol):
    """What the worker provides: sends one event to the hosts (thread-safe,
    non-blocking). A worker since stop 26 also has ``wait_cpu()``: the CPU
    the daemon placed its call path on, when called on the thread whose
    loop the hosts' events are delivered on, else -1 (`_ReplyWaits`)."""

    def emit(self, namespace: str, event: str, payload: bytes, request_id: str, error: dict | None) -> None: ...


_bridge: _Bridge | None = None
_registry: dict[str, Namespace] = {}
_registry_lock = threading.Lock()
# Sent by the daemon (never by a host) when a host opens a namespace stream.
_HOST_CONNECTED = "agentix:host_connected"
_warned_unregistered: set[str] = set()
# Request ids (unique across sandboxes; see UniqueIds).
_request_ids = UniqueIds()


class Namespace:
    """A plugin's sandbox-side endpoint of one namespace.

    Set the class attribute ``namespace = "/path"`` or pass it to
    ``__init__``. Every ``on_<event>`` method (sync or async) handles
    `event`; `on` adds handlers for names that are not identifiers (such as
    ``"x:result"``). Core namespaces (``/rpc``, ``/log``, ``/trace``) are
    refused unless the class sets ``_allow_reserved = True``.
    """

    # Every instance has its path (a str); the class-level None only means
    # that a subclass did not set one.
    namespace: str = None  # type: ignore[assignment]
    _allow_reserved: ClassVar[bool] = False

    def __init__(self, namespace: str | None = None) -> None:
        path = namespace if namespace is not None else type(self).namespace
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"namespace must be a string starting with '/', got {path!r}")
        if path in RESERVED_NAMESPACES and not self._allow_reserved:
            raise ValueError(
                f"namespace {path!r} is reserved by agentix-core (reserved: {sorted(RESERVED_NAMESPACES)}); "
                "choose another path for the plugin"
            )
        self.namespace = path
        self._handlers: dict[str, list[Callable[[Any], Any]]] = {}
        self._warned_unhandled: set[str] = set()
        self._detached_tasks = _DetachedTasks(self)
        # request_id -> _Pending of requests awaiting their reply; the
        # payload is sent again when a host (re)connects.
        self._pending: dict[str, _Pending] = {}
        self._pending_lock = threading.Lock()
        # Per event loop: the timer that fails this namespace's overdue
        # requests, armed for the earliest deadline (`_arm_expiry`). A timer
        # per request cost the sandbox's hot path ~3 µs more.
        self._expiry_timers: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}
        # Events whose reply handlers are known to be registered (`off`
        # forgets them).
        self._reply_events: set[str] = set()
        for name in dir(type(self)):
            if name.startswith("on_") and name != "on_":
                handler = getattr(self, name)
                if callable(handler):
                    self._handlers.setdefault(name[3:], []).append(handler)

    # ── handlers ────────────────────────────────────────────────────

    def on(self, event: str, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """Adds `handler` for `event` (after the existing ones); returns it."""
        self._handlers.setdefault(event, []).append(handler)
        return handler

    def off(self, event: str, handler: Callable[[Any], Any] | None = None) -> None:
        """Removes `handler` for `event`, or every handler of `event`."""
        self._reply_events.clear()  # the next request checks its reply handlers again
        if handler is None:
            self._handlers.pop(event, None)
            return
        handlers = self._handlers.get(event, [])
        if handler in handlers:
            handlers.remove(handler)
        if not handlers:
            self._handlers.pop(event, None)

    def registered_handlers(self) -> dict[str, list[Callable[[Any], Any]]]:
        """A snapshot: event -> its handlers, in call order."""
        return {event: list(handlers) for event, handlers in self._handlers.items()}

    # ── sending ─────────────────────────────────────────────────────

    async def emit(self, event: str, data: Any = None) -> None:
        """Sends `event` with `data` to every host that has this namespace
        open. Does not wait for the hosts. Raises RuntimeError outside a
        sandbox worker and TypeError for data msgpack cannot encode."""
        self._send(event, data)

    def _send(self, event: str, data: Any, error: dict | None = None) -> None:
        if _bridge is None:
            raise RuntimeError(_NOT_INSTALLED)
        request_id = data.get("request_id") if isinstance(data, dict) else None
        if error is None and event.endswith(":error") and isinstance(data, dict):
            error = data.get("error") if isinstance(data.get("error"), dict) else None
        self._send_packed(event, codec.pack(data), request_id if isinstance(request_id, str) else "", error)

    def _send_packed(self, event: str, payload: bytes, request_id: str, error: dict | None = None) -> None:
        bridge = _bridge
        if bridge is None:
            raise RuntimeError(_NOT_INSTALLED)
        bridge.emit(self.namespace, event, payload, request_id, error)

    def _host_connected(self) -> None:
        """A host (re)opened this namespace: requests still awaiting a reply
        are sent again with their request_id, since the first send or its
        reply may have been lost with a broken connection. Hosts answer a
        repeated request_id once (`request_handler` replays its reply).
        A request sent through a replaced `emit` is sent again through it."""
        with self._pending_lock:
            waiting = list(self._pending.items())
        for request_id, entry in waiting:
            try:
                if entry.payload is None:
                    entry.loop.call_soon_threadsafe(self._emit_again, entry)
                else:
                    self._send_packed(entry.event, entry.payload, request_id)
            except Exception:
                _log.exception("namespace %s: re-sending request %r failed", self.namespace, entry.event)

    def _emit_again(self, entry: _Pending) -> None:
        """On `entry`'s loop: sends a pending request again through `emit`."""
        if not entry.future.done():
            self._detached_tasks.start(entry.event, asyncio.ensure_future(self.emit(entry.event, entry.envelope)))

    def _emit_hook(self) -> Callable[..., Any] | None:
        """`self.emit` when a plugin or a test replaced it (on the instance,
        in a subclass or on `Namespace`), else None: the default `emit`,
        which `request` inlines."""
        emit = self.__dict__.get("emit")
        if emit is not None:
            return emit
        return None if type(self).emit is _NAMESPACE_EMIT else self.emit

    async def request(self, event: str, data: Any = None, *, timeout: float | None = 300.0) -> Any:
        """Sends `event` as a request and returns the host handler's reply
        value.

        The request is the event ``{request_id, data}`` sent through `emit`,
        as in the original: a plugin or a test that replaces or overrides
        `emit` sees it (and then also any re-send after a host reconnects).

        Raises:
          RemoteSioError: the host's handler raised (its type and message).
          TimeoutError: no reply within `timeout` seconds.
          RuntimeError: called outside a sandbox worker (with the default `emit`).
        """
        # `_emit_hook`'s answer for the usual case (no emit on the instance,
        # none in a subclass) without its call.
        if "emit" in self.__dict__ or type(self).emit is not _NAMESPACE_EMIT:
            emit = self._emit_hook()
        else:
            emit = None
        if emit is None and _bridge is None:
            raise RuntimeError(_NOT_INSTALLED)
        if event not in self._reply_events:
            self._ensure_reply_handlers(event)
        request_id = _request_ids.next()
        loop = _loops.last_loop  # running_loop(), inline: this is the sandbox's hot path
        if loop is None or getattr(loop, "_thread_id", None) != _get_ident():
            loop = _running_loop()
        future: asyncio.Future = loop.create_future()
        envelope = {"request_id": request_id, "data": data}
        # With the default emit the envelope is packed here, once: the bytes
        # are sent and kept for a re-send (emit would pack it again).
        payload = codec.pack(envelope) if emit is None else None
        # Deadlines fail the future from a timer, not asyncio.timeout(): this
        # is the sandbox's hot path, and the context manager costs ~10 µs
        # more per request here (it also tracks the task to cancel it).
        deadline = None if timeout is None else loop.time() + timeout
        with self._pending_lock:
            self._pending[request_id] = _Pending(loop, future, event, payload, envelope, deadline, timeout)
        waits = None
        try:
            waits = _reply_waits.hold(loop)
            if deadline is not None:
                self._arm_expiry(loop, deadline)
            if emit is not None:
                await emit(event, envelope)
            elif payload is not None:  # always, with the default emit: `_send_packed` inline
                bridge = _bridge
                if bridge is None:
                    raise RuntimeError(_NOT_INSTALLED)
                bridge.emit(self.namespace, event, payload, request_id, None)
            return await future
        finally:
            if waits is not None:
                waits.release()  # disarmed before the caller's code runs
            with self._pending_lock:
                self._pending.pop(request_id, None)

    def _arm_expiry(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Makes sure a timer of `loop` runs `_expire_overdue` by `deadline`.
        On `loop`'s thread. Requests usually share one timeout, so deadlines
        only grow and the timer armed for the oldest one serves them all."""
        timer = self._expiry_timers.get(loop)
        if timer is not None and timer.when() <= deadline:
            return
        if timer is not None:
            timer.cancel()
        self._expiry_timers[loop] = loop.call_at(deadline, self._expire_overdue, loop, deadline)

    def _expire_overdue(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        """Fails `loop`'s requests whose deadline has come with TimeoutError,
        then arms the timer for the next deadline."""
        self._expiry_timers.pop(loop, None)
        due = max(due, loop.time())
        with self._pending_lock:
            mine = [
                (entry, entry.deadline)
                for entry in self._pending.values()
                if entry.loop is loop and entry.deadline is not None
            ]
        following = None
        for entry, deadline in mine:
            if deadline <= due:
                if not entry.future.done():
                    entry.future.set_exception(TimeoutError(
                        f"namespace {self.namespace}: no reply to request {entry.event!r} within {entry.timeout} s"))
            elif following is None or deadline < following:
                following = deadline
        if following is not None:
            self._arm_expiry(loop, following)

    def _ensure_reply_handlers(self, event: str) -> None:
        for suffix, handler in ((":result", self._on_reply_result), (":error", self._on_reply_error)):
            name = event + suffix
            if handler not in self._handlers.get(name, []):
                self.on(name, handler)
        self._reply_events.add(event)

    def _on_reply_result(self, payload: Any) -> None:
        if isinstance(payload, dict):
            self._resolve(payload.get("request_id"), value=payload.get("value"))

    def _on_reply_error(self, payload: Any) -> None:
        if not isinstance(payload, dict):
            return
        error = payload.get("error")
        if not isinstance(error, dict):
            error = {"type": "RemoteSioError", "message": repr(error)}
        self._resolve(
            payload.get("request_id"),
            error=RemoteSioError(
                str(error.get("type", "Error")), str(error.get("message", "")), error.get("status_code")
            ),
        )

    def _resolve(self, request_id: Any, *, value: Any = None, error: BaseException | None = None) -> None:
        with self._pending_lock:
            entry = self._pending.get(request_id) if isinstance(request_id, str) else None
        if entry is None:
            return  # a late or repeated reply
        loop, future = entry.loop, entry.future
        if getattr(loop, "_thread_id", None) == _get_ident():
            here = loop  # `loop` runs on this thread (asyncio's loops record it)
        else:
            try:
                here = _running_loop()
            except RuntimeError:  # not on a loop's thread
                here = None
        if here is loop:  # the common case: replies arrive on the request's loop
            _settle_and_wake(loop, future, value, error)  # the awaiting task resumes now
        elif not loop.is_closed():
            loop.call_soon_threadsafe(_settle, future, value, error)

    # ── receiving ───────────────────────────────────────────────────

    def _dispatch(self, event: str, payload: Any) -> None:
        """Runs every handler of `event` with `payload`: sync ones inline
        (exceptions logged), coroutines as detached tasks (exceptions logged).
        Runs on the worker's event loop."""
        handlers = self._handlers.get(event)
        if not handlers:
            if event not in self._warned_unhandled:
                self._warned_unhandled.add(event)
                _log.warning(
                    "namespace %s received event %r with no handler (registered: %s). A typo in an "
                    "on_<event> method or a mismatched namespace string silently drops the event.",
                    self.namespace,
                    event,
                    sorted(self._handlers),
                )
            return
        # One handler (a request's reply handler, most often): no copy of
        # the list to iterate.
        for handler in (handlers[0],) if len(handlers) == 1 else list(handlers):
            try:
                result = handler(payload)
            except Exception:
                _log.exception("namespace %s: handler for %r raised", self.namespace, event)
                continue
            if result is not None and inspect.isawaitable(result):
                self._detached_tasks.start(event, asyncio.ensure_future(result))


class _DetachedTasks(set):
    """The handler tasks of one namespace object (sandbox or host side) that
    run detached from the code that started them: a `set` (the original's
    ``_detached_tasks`` was a plain set, and plugins ``add`` / ``discard``
    their own tasks in it) that holds each task strongly until it ends (a
    task must not be collected mid-run), then drops it and logs its failure
    with the namespace (and the event, for the handlers agentix starts).

    A task a plugin adds and removes itself (``add(task)`` then
    ``task.add_done_callback(s.discard)``) works as with the original;
    one it forgets to remove is dropped when it ends all the same."""

    __slots__ = ("_owner", "_events")

    def __init__(self, owner: Any) -> None:
        super().__init__()
        self._owner = owner  # has .namespace
        self._events: dict[asyncio.Future, str] = {}  # task -> the event it handles

    def start(self, event: str, task: asyncio.Future) -> None:
        """Holds `task`, which handles `event`, until it ends."""
        set.add(self, task)
        self._events[task] = event
        task.add_done_callback(self._done)

    def run(self, event: str, coroutine: Any, loop: asyncio.AbstractEventLoop) -> None:
        """Runs `coroutine`, which handles `event`, as a task of `loop` held
        until it ends: as `start`, but the task lets go of itself and logs
        its own failure, so its end schedules no done callback (one event
        loop turn less per event on the host's hot path)."""
        held = self._held(event, coroutine, loop)
        if getattr(loop, "_task_factory", _Task) is None and type(loop).create_task is _CREATE_TASK:
            task = _Task(held, loop=loop)  # what asyncio's create_task does then, without its call
        else:
            task = loop.create_task(held)
        set.add(self, task)
        if not _first_step_now(loop, task):
            # Its first step waits for the loop's next turn. Cancelled before
            # then, `_held` never runs (the cancellation is thrown in before
            # its `try`): this callback lets go of the task and closes the
            # handler's coroutine, which would otherwise be "never awaited".
            # Not on the host streams' path, whose first step runs now.
            task.add_done_callback(partial(self._ended, coroutine))

    def _ended(self, coroutine: Any, task: asyncio.Future) -> None:
        self.discard(task)
        coroutine.close()  # nothing to do once `_held` awaited it

    async def _held(self, event: str, coroutine: Any, loop: asyncio.AbstractEventLoop) -> None:
        try:
            await coroutine
        except Exception as error:
            _log.error("namespace %s: handler for %r raised", self._owner.namespace, event, exc_info=error)
        finally:
            self.discard(_current_task(loop))  # (given the loop: no getpid() call)

    def add(self, task: Any) -> None:
        """Holds `task` until it ends (a future or task; anything else is
        kept as a plain set would keep it)."""
        if task in self:
            return
        set.add(self, task)
        if isinstance(task, asyncio.Future):
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future) -> None:
        self.discard(task)
        event = self._events.pop(task, None)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        if event is None:
            _log.error("namespace %s: detached task %s raised", self._owner.namespace,
                       _task_name(task), exc_info=error)
        else:
            _log.error("namespace %s: handler for %r raised", self._owner.namespace, event, exc_info=error)


def _task_name(task: asyncio.Future) -> str:
    get_name = getattr(task, "get_name", None)
    return repr(get_name()) if get_name is not None else repr(task)


_NAMESPACE_EMIT = Namespace.emit


def _settle(future: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


_get_ident = threading.get_ident
# `asyncio.get_running_loop()` without its getpid() (agentix.runtime.shared.running_loop).
_running_loop = _loops.running_loop


_Task = asyncio.Task
_CREATE_TASK = asyncio.BaseEventLoop.create_task
_Deque = collections.deque
# `asyncio.current_task(loop)` without its Python frame: the dict its C
# implementation reads (Python 3.11–3.13), else the function itself.
_current_tasks = getattr(asyncio.tasks, "_current_tasks", None)
_current_task: Callable[[asyncio.AbstractEventLoop], asyncio.Task | None] = asyncio.current_task
if isinstance(_current_tasks, dict):
    _current_task = _current_tasks.get


def _first_step_now(loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> bool:
    """Runs `task`'s first step now, not at `loop`'s next turn (as Python
    3.12's eager tasks do), when that step is the newest callback in the
    ready queue of one of asyncio's own loops (its private ``_ready``; other
    loops and custom task factories keep the turn) and no task is running
    (a step can only run outside one). The task's own step runs, in the
    task's context: its code runs in the task as before, only ahead of the
    callbacks queued before it. Saves the namespace path a loop turn (a
    ``select`` and ~250 bytecodes) per event handled by a coroutine. The
    step is called as `Handle._run` calls it, without that frame: a task's
    step keeps its code's exceptions (as its result) and lets through only
    SystemExit and KeyboardInterrupt, which `Handle._run` re-raises too.
    Returns whether the step ran."""
    ready = getattr(loop, "_ready", None)
    if type(ready) is _Deque and ready:
        handle = ready[-1]
        if getattr(handle._callback, "__self__", None) is task and _current_task(loop) is None:
            ready.pop()
            handle._context.run(handle._callback, *handle._args)  # `handle._run()` without its frame
            return True
    return False


def _settle_and_wake(loop: asyncio.AbstractEventLoop, future: asyncio.Future, value: Any,
                     error: BaseException | None) -> None:
    """On `loop`'s thread: `_settle`, then the awaiting task's wake-up now.
    When one task's wake-up is `future`'s only callback and no task is
    running, the callback is taken off the future before it is settled and
    called right after, in its context, as the loop would (no ``call_soon``
    handle to make and take back: ~100 bytecodes of the sandbox's request);
    otherwise as `_wake_now`."""
    callbacks = None if future.done() else getattr(future, "_callbacks", None)
    if callbacks and len(callbacks) == 1 and _current_task(loop) is None:
        callback, context = callbacks[0]
        if isinstance(getattr(callback, "__self__", None), _Task) and future.remove_done_callback(callback) == 1:
            _settle(future, value, error)
            context.run(callback, future)
            return
    _settle(future, value, error)
    _wake_now(loop, future)


def _wake_now(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
    """After `future` was settled: runs the wake-up of the task awaiting it
    now, not at `loop`'s next turn, on the same terms as `_first_step_now`
    (the newest callback of one of asyncio's loops, a task's, called with
    `future`; no task running). The task resumes in its own step."""
    ready = getattr(loop, "_ready", None)
    if type(ready) is _Deque and ready:
        handle = ready[-1]
        args = handle._args
        if (len(args) == 1 and args[0] is future and isinstance(getattr(handle._callback, "__self__", None), _Task)
                and _current_task(loop) is None):
            ready.pop()
            handle._context.run(handle._callback, *handle._args)  # `handle._run()`, as in _first_step_now


class _Pending(NamedTuple):
    """A request awaiting its reply."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    event: str
    payload: bytes | None  # packed envelope; None: sent through a replaced emit
    envelope: dict[str, Any]
    deadline: float | None  # loop.time() by which it fails, None: never
    timeout: float | None


class _ReplyWaits:
    """Pinned waits for namespace replies: while a request of the worker's
    event loop is the one thing its thread waits for, the loop's selector
    blocks pinned to the CPU the daemon placed its call path on (the
    bridge's ``wait_cpu()``; the daemon's ``--calls_cpu``, default auto),
    so the daemon's thread that relays the reply wakes it there, not on a
    halted other CPU; the same for the request's own hand-off to the
    daemon. It is the loop thread's `PinnedWaits`
    (agentix.runtime.client.pinned_waits): one in-flight count with the
    thread's remote calls, if sandbox code makes any; pinned only while the
    selector blocks, never while code runs; its back-off when that CPU is
    busy. Nothing unless ``AGENTIX_CALLS_CPU`` is named in the sandbox (a
    worker since stop 63 answers ``wait_cpu()`` -1 otherwise: the reply
    comes from a host's event loop, and the two loops work better beside
    each other than after each other on one CPU), nothing with it ``off``,
    the daemon's ``--calls_cpu=off`` (``wait_cpu()`` is -1), an older worker
    (no ``wait_cpu``) or a loop without a selector of its own."""

    __slots__ = ("_wait_cpu", "_loop", "_waits")

    def __init__(self) -> None:
        self.install(None)

    def install(self, bridge: _Bridge | None) -> None:
        wait_cpu = getattr(bridge, "wait_cpu", None)
        if wait_cpu is not None:
            from agentix.runtime.client.pinned_waits import CALLS_CPU_ENV

            if os.environ.get(CALLS_CPU_ENV, "").strip().lower() == "off":
                wait_cpu = None
        self._wait_cpu: Callable[[], int] | None = wait_cpu
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop `_waits` is for
        self._waits: Any = None

    def hold(self, loop: asyncio.AbstractEventLoop) -> Any:
        """On `loop`'s thread, as a request starts: the `PinnedWaits` it
        holds (`release` it when the request ends), or None."""
        wait_cpu = self._wait_cpu
        if wait_cpu is None:
            return None
        cpu = wait_cpu()
        if cpu < 0:
            return None
        waits = self._waits if loop is self._loop else self._waits_of(loop, cpu)
        if waits is None:
            return None
        if cpu != waits.cpu and not waits.pinned:
            waits.move_to(cpu)  # the daemon moved its call path
        waits.hold()
        return waits

    def _waits_of(self, loop: asyncio.AbstractEventLoop, cpu: int) -> Any:
        from agentix.runtime.client.pinned_waits import CallsCpu, pinned_waits, wait_yield_setting

        # The running loop's (`loop`); AGENTIX_WAIT_YIELD as for a host's calls.
        waits = pinned_waits(CallsCpu("wait", cpu), yields=wait_yield_setting())
        self._loop, self._waits = loop, waits
        return waits


_reply_waits = _ReplyWaits()


def register_namespace(ns: Namespace) -> Namespace:
    """Makes `ns` receive the events hosts send on its namespace; returns it.

    Raises ValueError if the path is already registered."""
    if not isinstance(ns, Namespace):
        raise TypeError(f"register_namespace expects an agentix.Namespace, got {type(ns).__name__}")
    with _registry_lock:
        if ns.namespace in _registry:
            raise ValueError(f"namespace {ns.namespace!r} already registered")
        _registry[ns.namespace] = ns
    return ns


def _install(bridge: _Bridge | None) -> None:
    """Called by the agentix worker at start (None to uninstall)."""
    global _bridge
    _bridge = bridge
    _reply_waits.install(bridge)


def _deliver(namespace: str, event: str, payload: bytes) -> None:
    """Called by the agentix worker, on its event loop, for each host event.
    Events for a namespace nobody registered are dropped (as the original)."""
    ns = _registry.get(namespace)
    if event == _HOST_CONNECTED:
        if ns is not None:
            ns._host_connected()
        return
    if ns is None:
        # Dropped as in the original, but said once per namespace.
        if namespace not in _warned_unregistered:
            _warned_unregistered.add(namespace)
            _log.warning(
                "event %r for namespace %s dropped: no agentix.Namespace with that path is registered "
                "in the sandbox (later events of this namespace are dropped without a warning)",
                event,
                namespace,
            )
        return
    try:
        data = codec.unpack(payload)
    except Exception as exc:
        _log.warning(
            "namespace %s: event %r dropped: its payload is not valid msgpack (%s: %s)",
            namespace,
            event,
            type(exc).__name__,
            exc,
        )
        return
    ns._dispatch(event, data)


# The host side's `AsyncClientNamespace` holds its tasks the same way.
DetachedTasks = _DetachedTasks
