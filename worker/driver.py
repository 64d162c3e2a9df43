"""The agentix worker's driver: runs remote calls for the sandbox daemon.

Compiled into agentix-worker (BUILD.bazel: driver_source) and started by
worker.cc on the interpreter's main thread as `main(channel_fd, worker_id)`.

One asyncio event loop owns the frame channel through `loop.add_reader`, so
frames reach Python without a thread hop and every wake-up handles all frames
that arrived. Coroutine functions run as tasks on that loop; everything else
runs on a thread pool, so a blocking function never stalls the loop.

Streaming calls (stream_window > 0) send each item of a generator as a
stream_item frame, at most `window` items beyond the host's last stream_ack.
Async iterators are driven by a loop task, sync iterators by a pool thread
(each next() may block); either waits, without spinning, for credit.

Invariant: every call ends in exactly one `result` or `error` frame, whatever
the user code raises (BaseException included), unless the daemon cancelled it
first, in which case the `Cancelled` error is the one frame and the call's
later output is dropped. The protocol is docs/WORKER-PROTOCOL.md.

Logs: every call runs with `_call_id` (a contextvar) set to its id: loop
tasks inherit it from `_start`, pool functions run in a copy of that context.
One handler on the root logger turns each `logging` record into a `log`
frame carrying that id. fds 1 and 2 are pipes drained by C++ threads
(channel_module.cc) into stdout/stderr `log` frames; those cannot be
attributed. Python-level writes to sys.stdout/sys.stderr (print) are: the
wrappers turn each complete line into a `log` frame with the writer's call id
right away and never write it to the fd. The durable log file gets the
records and the captured lines.

Traces: if the venv has agentix, one `agentix.trace` Processor registered at
boot (`_TraceForwarder`) turns every trace/span start and end into a `trace`
frame with the opener's call id; it rides the log queue, so it is ordered
with the records around it.
"""

import asyncio
import calendar
import collections.abc
import contextvars
import errno
import importlib
import inspect
import io
import logging
import logging.handlers
import os
import pickle
import socket
import stat
import sys
import threading
import time
import traceback
import types
import queue
from datetime import datetime, timezone

import _agentix_worker as _w

# absl::StatusCode values carried in error frames.
_CANCELLED = 1
_UNKNOWN = 2
_INVALID_ARGUMENT = 3

# agentix.runtime.v1.Encoding; 0 (unspecified) means pickle.
_PICKLE = 1
_MSGPACK = 2

# Process exit codes (mirrored in worker.h).
EXIT_OK = 0
EXIT_PROTOCOL = 4  # bad frame from the daemon: the channel is desynchronised
EXIT_CHANNEL = 5  # reading or writing the channel failed

# Sync callables share this many threads; more wait for a free one.
_SYNC_THREADS = 64
# How long shutdown lets cancelled coroutines unwind.
_CANCEL_GRACE_SECONDS = 1.0

_DEBUG, _INFO, _WARNING, _ERROR = range(4)

# Marks a sync call whose return value must still be awaited on the loop.
_AWAIT = object()
# Marks a non-streaming call whose return value is a generator.
_GENERATOR = object()

# Values a non-streaming call cannot return: they only make sense streamed.
# The ABC check costs ~0.15 us per ordinary call.
_STREAM_ONLY = (types.GeneratorType, collections.abc.AsyncIterator)
# Iterable, but refused as a stream's value: almost surely a mistake.
_NOT_STREAMS = (str, bytes, bytearray)


# The id of the call the running task or thread works for ("" outside
# calls). Set for the duration of every call; read by the log handler and the
# stdout/stderr wrappers.
_call_id = contextvars.ContextVar("agentix_call_id", default="")

# agentix.runtime.v1.LogOrigin
_ORIGIN_LOGGING = 1
_ORIGIN_STDOUT = 2
_ORIGIN_STDERR = 3

# How long shutdown waits for the capture threads to drain and send.
_CAPTURE_STOP_MS = 1000
# A Python-level line longer than this (in characters) is cut, as the
# drainers cut fd-level lines at 64 KiB.
_MAX_LINE_CHARS = 65536
# Durable log rotation (SPEC 3.4).
_DURABLE_MAX_BYTES = 64 * 1024 * 1024
_DEFAULT_LOG_DIR = "/tmp/agentix"
_DEFAULT_FORMAT = "%(asctime)s [%(agentix_context)s] [%(name)s] %(message)s"
# Records of these loggers never become log frames (SPEC 4): the bridge's own
# plumbing would feed back into itself. (The original also held back
# "agentix.sio", whose events carried the logs; here logs have their own
# channel, so plugin-namespace warnings reach the host like any record.)
_UNFORWARDED = ("agentix.utils.log",)
# LogRecord attributes that are not `extra=` fields.
_STANDARD_KEYS = frozenset((
    "name", "msg", "args", "levelname", "levelno", "pathname", "filename",
    "module", "exc_info", "exc_text", "stack_info", "lineno", "funcName",
    "created", "msecs", "relativeCreated", "thread", "threadName",
    "processName", "process", "taskName", "message", "asctime",
    "agentix_context"))
_MSGPACK_INT = (-(1 << 63), 1 << 64)
_MAX_EXTRAS_DEPTH = 16


def _log(severity, message):
    _w.log(severity, message)


def _text(exc):
    """str(exc) that cannot fail."""
    try:
        return str(exc)
    except BaseException:
        return f"<unprintable {type(exc).__name__} object>"


def _format(exc, skip=0):
    """The formatted traceback of exc without its first `skip` frames (the
    driver's own wrapper frames), or "" if formatting fails."""
    try:
        tb = exc.__traceback__
        for _ in range(skip):
            if tb is None:
                break
            tb = tb.tb_next
        return "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:
        return ""


# Bound on an exception's pickled state (ipc::kMaxExceptionStateBytes).
_MAX_EXCEPTION_STATE = 64 * 1024

# Attributes builtin exceptions hold outside args and __dict__, by the builtin
# class whose descriptors hold them (errno and strerror come from args).
_EXCEPTION_MEMBERS = ((OSError, ("filename", "filename2")),
                      (ImportError, ("name", "path")))


class _StateTooLarge(Exception):
    pass


class _CappedFile:
    """A file for pickle.dump that refuses more than _MAX_EXCEPTION_STATE
    bytes, so a huge exception attribute is never pickled whole."""

    __slots__ = ("parts", "size")

    def __init__(self):
        self.parts = []
        self.size = 0

    def write(self, data):
        self.size += len(data)
        if self.size > _MAX_EXCEPTION_STATE:
            raise _StateTooLarge
        self.parts.append(bytes(data))


def _exception_state(exc):
    """exc's (args, members, attributes) pickled with protocol 4, for the host
    to rebuild the exception's type: members are the builtin attributes of
    _EXCEPTION_MEMBERS, attributes its __dict__ (dropped if it cannot be
    pickled). None when args cannot be pickled or the state exceeds
    _MAX_EXCEPTION_STATE."""
    try:
        members = {}
        for base, names in _EXCEPTION_MEMBERS:
            if isinstance(exc, base):
                for name in names:
                    value = base.__dict__[name].__get__(exc, base)
                    if value is not None:
                        members[name] = value
        args = tuple(exc.args)
        attributes = getattr(exc, "__dict__", None)
        attributes = dict(attributes) if isinstance(attributes, dict) else {}
    except BaseException:
        return None
    for state in ((args, members, attributes), (args, members, {})):
        try:
            out = _CappedFile()
            pickle.Pickler(out, protocol=4).dump(state)
            return b"".join(out.parts)
        except BaseException:
            if not state[2]:
                return None
    return None


def _error(exc, code, skip=0):
    """An error frame's (type, message, traceback, code, type_module,
    type_qualname, state) for exc (see _exception_state)."""
    cls = type(exc)
    try:
        module = cls.__module__
    except BaseException:
        module = ""
    return (cls.__name__, _text(exc), _format(exc, skip), code,
            module if type(module) is str else "", cls.__qualname__,
            _exception_state(exc))


def _send_error(channel, call_id, payload):
    """Sends a non-cancelled error frame for an _error() tuple or a bare
    (type, message, traceback, code) one."""
    type_name, message, tb, code, *origin = payload
    channel.send_error(call_id, code, type_name, message, tb, False, *origin)


def resolve(reference):
    """Imports the callable a "module::qualname" reference names.

    Raises ValueError (no "::"), ImportError/ModuleNotFoundError (or whatever
    the module raises while importing), AttributeError (a missing name on
    the qualname path) or TypeError (the target is not callable). As in the
    original, any importable callable is accepted; what may be called is
    decided on the host.
    """
    module_name, sep, qualname = reference.partition("::")
    if not sep:
        raise ValueError(
            f"invalid remote callable reference {reference!r}: "
            "expected 'module::qualname'")
    target = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"remote target {reference!r} is not callable "
                        f"(got {type(target).__name__})")
    return target


def _is_sync_stream(value):
    """Whether a streaming call may iterate value with iter()."""
    return (hasattr(type(value), "__iter__")
            and not isinstance(value, _NOT_STREAMS))


class _Failure(Exception):
    """A call failure with a fixed wire type (argument decoding)."""

    def __init__(self, type_name, message, tb=""):
        super().__init__(message)
        self.error = (type_name, message, tb, _INVALID_ARGUMENT)


def _decode_arguments(encoding, data):
    """Returns (args, kwargs) from the call's argument bytes."""
    try:
        if encoding == _MSGPACK:
            payload = _w.msgpack_loads(data)
        else:
            payload = pickle.loads(data)
    except BaseException as exc:
        raise _Failure(
            "ArgumentsDecodeError",
            f"failed to decode arguments: {type(exc).__name__}: {_text(exc)}",
            _format(exc)) from None
    try:
        args, kwargs = payload
        args = tuple(args)
        if not isinstance(kwargs, dict):
            raise TypeError
    except BaseException:
        raise _Failure(
            "ArgumentsDecodeError",
            "arguments must be an (args, kwargs) pair, got "
            f"{type(payload).__name__}") from None
    return args, kwargs


class _Pieces(list):
    """A file for pickle.dump that keeps what it is handed: the pickler's
    frames, and large bytes values themselves (pickle writes those straight
    to the file), so a big result is never copied into one pickle.
    Anything mutable (a large bytearray) is copied, as pickle.dumps would:
    send_result reads the pieces with the GIL released.
    Channel.send_result takes the list as the concatenation."""

    __slots__ = ()

    def write(self, data):
        self.append(data if type(data) is bytes else bytes(data))


def _encode_result(encoding, value, item=None):
    """(True, payload) or (False, error) for a call's return value (payload:
    bytes, or for pickle a _Pieces list), or for stream item number `item`
    (payload: bytes)."""
    try:
        if encoding == _MSGPACK:
            return True, _w.msgpack_dumps(value)
        if item is not None:
            return True, pickle.dumps(value, protocol=5)
        pieces = _Pieces()
        pickle.dump(value, pieces, protocol=5)
        return True, pieces
    except BaseException as exc:
        what = "return value" if item is None else f"stream item {item}"
        how = "encode {} as msgpack" if encoding == _MSGPACK else "pickle {}"
        return False, ("ResultEncodeError",
                       f"failed to {how.format(what)}: {_text(exc)}",
                       _format(exc), _INVALID_ARGUMENT)


def _run_sync(encoding, fn, args, kwargs):
    """Runs a sync callable on a pool thread; never raises."""
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        return False, _error(exc, _UNKNOWN, skip=1)
    if inspect.isawaitable(value):
        return _AWAIT, value
    if isinstance(value, _STREAM_ONLY):
        return _GENERATOR, value
    return _encode_result(encoding, value)


def _close_quietly(iterator):
    """Closes a sync iterator that has a close() (generators do), on the
    calling thread, which must be the one iterating it. Errors the
    generator raises while closing are logged: the call has its answer."""
    close = getattr(iterator, "close", None)
    if close is None:
        return
    try:
        close()
    except BaseException as exc:
        _log(_DEBUG, f"closing a generator raised {type(exc).__name__}: "
             f"{_text(exc)}")


async def _aclose_quietly(iterator):
    """Awaits iterator.aclose() if it has one (async generators do); as
    _close_quietly. Swallows a CancelledError too: this ends the task."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except BaseException as exc:
        _log(_DEBUG, f"closing an async generator raised "
             f"{type(exc).__name__}: {_text(exc)}")


def _not_iterable(call, value):
    """The TypeError of a streaming call whose value cannot be streamed."""
    return ("TypeError",
            f"remote_stream target {call.reference!r} returned "
            f"{type(value).__name__}, not an iterator; use remote()", "",
            _INVALID_ARGUMENT)


def _item_too_large(index, exc):
    """The error for an item send_item refused (over the frame limit)."""
    return ("ResultEncodeError", f"cannot send stream item {index}: "
            f"{_text(exc)}", "", _INVALID_ARGUMENT)


class _Stream:
    """Flow control of one streaming call: item i may be sent while
    i < acked + window. The loop thread acks and closes; the producer (a loop
    task or one pool thread) waits for credit: a task on `credit`, a thread
    on `cond`. `acked` and `closed` change under `cond`."""

    __slots__ = ("window", "acked", "closed", "cond", "credit")

    def __init__(self, window):
        self.window = window
        self.acked = 0
        self.closed = False  # cancelled: a pool producer must stop
        self.cond = threading.Condition()
        self.credit = asyncio.Event()

    def ack(self, index):
        with self.cond:
            if index <= self.acked:
                return  # stale or repeated
            self.acked = index
            self.cond.notify_all()
        self.credit.set()

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class _PoolJob:
    """One sync callable queued on a `_SyncPool`: `cancel()` before it starts
    and it never runs; once it runs, cancel() does nothing (the call's reply
    is dropped instead, see _Worker._finish)."""

    __slots__ = ("pool", "fn", "args")

    def __init__(self, pool, fn, args):
        self.pool = pool
        self.fn = fn
        self.args = args

    def cancel(self):
        self.pool.withdraw(self)


class _SyncPool:
    """The threads sync callables run on: up to `max_threads`, started when
    a job finds none idle, named for the OS as agentix-call.

    Cheaper per call than concurrent.futures.ThreadPoolExecutor (no Future,
    no done callbacks, no Python-level semaphore): submit() costs ~0.6 us of
    the loop thread against ~8 us (docs/PERFORMANCE.md, "Per-call work
    trimmed"). What it keeps from it: a job never waits behind a running one
    while fewer than max_threads run (each submit either takes an idle
    thread's token or starts a thread), a job cancelled before it starts
    never runs, and shutdown() stops idle threads without waiting for
    running ones. The threads are daemon threads: an idle one never holds up
    the interpreter's exit (finish() finalises only when none is busy).
    Claims go through single dict/list operations, which are atomic under
    the GIL, so the loop thread and pool threads need no lock.
    """

    def __init__(self, max_threads):
        self._max_threads = max_threads
        self._jobs = queue.SimpleQueue()
        self._queued = {}  # jobs not started yet (claimed by pop: run or cancel)
        self._running = set()  # jobs whose function is running
        self._idle = []  # one token per idle thread not yet promised a job
        self._threads = []
        self._stopped = False

    def submit(self, fn, *args):
        job = _PoolJob(self, fn, args)
        try:
            self._idle.pop()
        except IndexError:
            if len(self._threads) < self._max_threads:
                thread = threading.Thread(
                    target=self._serve, daemon=True,
                    name=f"agentix-call_{len(self._threads)}")
                thread.start()  # may raise (no more threads): nothing counted yet
                self._threads.append(thread)
        self._queued[job] = None
        self._jobs.put(job)
        return job

    def withdraw(self, job):
        """Keeps `job` from starting if it has not yet (see _PoolJob)."""
        if self._queued.pop(job, _CANCELLED_JOB) is not _CANCELLED_JOB:
            job.fn = job.args = None

    def busy(self):
        """True while a submitted function is still running."""
        return bool(self._running)

    def shutdown(self):
        """Drops the jobs not started and stops the threads once they are
        idle; does not wait."""
        self._stopped = True
        self._queued.clear()
        for _ in self._threads:
            self._jobs.put(None)

    def _serve(self):
        _w.set_thread_name("agentix-call")
        get, queued, running = self._jobs.get, self._queued, self._running
        while (job := get()) is not None:
            # Counted as running before it is claimed, so busy() is never
            # False while a claimed job has yet to start.
            running.add(job)
            try:
                if queued.pop(job, _CANCELLED_JOB) is not _CANCELLED_JOB:
                    job.fn(*job.args)
            except BaseException as exc:  # the job functions never raise
                _log(_ERROR, f"sync call pool: {_text(exc)}")
            finally:
                running.discard(job)
                # The call holds its job (call.task) and the job the call:
                # drop the arguments now rather than when the cycle collector
                # runs (a 16 MiB argument kept alive costs fresh pages later).
                job.fn = job.args = None
            job = None
            if self._stopped:
                return
            self._idle.append(None)


_CANCELLED_JOB = object()


class _Call:
    __slots__ = ("call_id", "reference", "encoding", "total_size", "context",
                 "receiving", "received", "task", "cancelled", "stream")

    def __init__(self, call_id, reference, encoding, total_size, context,
                 stream_window):
        self.call_id = call_id
        self.reference = reference
        # The reply uses the encoding the arguments came in (0 -> pickle).
        self.encoding = encoding or _PICKLE
        self.total_size = total_size
        self.context = context
        # The channel assembles chunked arguments; an ARGS tuple ends this.
        self.receiving = False
        self.received = 0  # argument bytes received
        self.task = None  # asyncio.Task or _PoolJob once running
        self.cancelled = False
        self.stream = _Stream(stream_window) if stream_window else None


_context_mod = None
_context_missing_reported = False


def _env_log_level():
    """The level $AGENTIX_LOG_LEVEL names (a level name or number), or
    INFO when it is unset or unknown."""
    value = os.environ.get("AGENTIX_LOG_LEVEL", "").strip()
    if value.isdigit():
        return int(value)
    level = logging.getLevelName(value.upper()) if value else logging.INFO
    return level if isinstance(level, int) else logging.INFO


def _context_module():
    """agentix.utils.context from the sandbox's venv, or None if the venv has
    no agentix (then there is nothing a call could read the context with)."""
    global _context_mod, _context_missing_reported
    if _context_mod is None:
        try:
            import agentix.utils.context as module
        except ImportError:
            if not _context_missing_reported:
                _context_missing_reported = True
                _log(_DEBUG, "agentix is not importable in the sandbox; "
                             "propagated call context is ignored")
            return None
        _context_mod = module
    return _context_mod


# Cached from the environment by the stdlib on first use: forgotten when
# set_env changes one of these, so the next use reads the new value.
_TEMPDIR_VARS = (b"TMPDIR", b"TEMP", b"TMP")


def _apply_env(entries):
    """Applies a set_env frame: SandboxAdmin.Activate's env, given to a worker
    that was started before activation (agentix-sandboxd
    --prestart-worker). `entries` is b"K=V\\0K=V\\0...". Returns "" once
    every entry is in os.environ (hence in the C environment, for getenv and
    child processes), else why not; the daemon then replaces this worker.
    Only runs before any call: no user code has read the environment yet."""
    try:
        keys = []
        for entry in entries.split(b"\0"):
            if not entry:
                continue
            key, sep, value = entry.partition(b"=")
            if not sep or not key:
                return f"malformed environment entry {entry[:64]!r}"
            os.environb[key] = value  # os.environ shares its data
            keys.append(key)
        if b"TZ" in keys:
            time.tzset()
        if any(k in _TEMPDIR_VARS for k in keys):
            tempfile = sys.modules.get("tempfile")
            if tempfile is not None:
                tempfile.tempdir = None
        _log(_DEBUG, f"environment updated: {len(keys)} entries")
        return ""
    except Exception as exc:
        return f"{type(exc).__name__}: {_text(exc)}"


class _Worker:
    """Per-process call bookkeeping; all methods run on the loop thread."""

    def __init__(self, loop, channel):
        self._loop = loop
        self._channel = channel
        # Calls that have not had their terminal frame yet, receiving or
        # running. A call leaves exactly when that frame is queued.
        self._calls = {}
        # Sync callables' threads; shutdown must not wait on a function that
        # is still running there (abandoned ones included).
        self._pool = _SyncPool(_SYNC_THREADS)
        # True while on_readable handles a batch of frames: replies produced
        # meanwhile share one write at the end of the batch.
        self._in_batch = False
        self.exit_code = None

    # ---- channel -----------------------------------------------------------

    def on_readable(self):
        try:
            frames = self._channel.read_frames()
        except _w.ProtocolError as exc:
            _log(_ERROR, f"frame channel desynchronised: {exc}; exiting")
            self.stop(EXIT_PROTOCOL, notify=False)
            return
        except OSError as exc:
            _log(_ERROR, f"frame channel read failed: {exc}; exiting")
            self.stop(EXIT_CHANNEL, notify=False)
            return
        if frames is None:
            _log(_DEBUG, "frame channel closed by the daemon; exiting")
            self.stop(EXIT_OK, notify=False)
            return
        self._in_batch = True
        try:
            for frame in frames:
                kind = frame[0]
                if kind == _w.CALL:
                    self._on_call(*frame[1:])
                elif kind == _w.ARGS:
                    self._on_args(frame[1], frame[2], frame[3])
                elif kind == _w.STREAM_ACK:
                    self._on_stream_ack(frame[1], frame[2])
                elif kind == _w.CANCEL:
                    self._on_cancel(frame[1])
                elif kind == _w.NS_EVENT:
                    _deliver_namespace_event(frame[1], frame[2], frame[3])
                elif kind == _w.SET_ENV:
                    self._channel.send_env_set(_apply_env(frame[1]))
                else:
                    _log(_DEBUG, "shutdown requested")
                    self.stop(EXIT_OK, notify=True)
                    return
                if self.exit_code is not None:
                    return
        finally:
            self._in_batch = False
        self._flush()

    def _queued(self):
        """Writes queued replies now, or at the end of the current batch.

        Writing at once, rather than via call_soon at the end of the loop
        iteration, saves a loop iteration per reply (measured ~15 us of a
        ~55 us round trip)."""
        if not self._in_batch:
            self._flush()

    def _flush(self):
        if self.exit_code is not None:
            return
        try:
            self._channel.flush()
        except _w.ChannelError as exc:
            self._channel_failed(exc)

    def _channel_failed(self, exc):
        _log(_ERROR, f"frame channel write failed: {exc}; exiting")
        self.stop(EXIT_CHANNEL, notify=False)

    def _finish(self, call, ok, payload):
        """Queues call's terminal frame unless it already has one."""
        # pop() is atomic under the GIL, so the loop thread and pool threads
        # (see _run_pooled) agree on who answers a call.
        if self._calls.pop(call.call_id, None) is not call:
            return  # cancelled (or the worker is stopping): drop the output
        try:
            if ok:
                self._channel.send_result(call.call_id, call.encoding, payload)
            else:
                _send_error(self._channel, call.call_id, payload)
        except _w.ChannelError as exc:
            self._channel_failed(exc)
            return
        self._queued()

    def _send_cancelled(self, call):
        self._channel.send_error(call.call_id, _CANCELLED, "Cancelled",
                                 "remote call cancelled", "", True)

    # ---- frames ------------------------------------------------------------

    def _on_call(self, call_id, reference, encoding, data, total_size,
                 context, stream_window):
        if call_id in self._calls:
            _log(_WARNING, f"ignoring a second call frame for {call_id!r}")
            return
        call = _Call(call_id, reference, encoding, total_size, context,
                     stream_window)
        self._calls[call_id] = call
        if data is None:
            call.receiving = True  # the rest comes in chunks
        else:
            call.received = len(data)
            self._start(call, data)

    def _on_stream_ack(self, call_id, index):
        call = self._calls.get(call_id)
        if call is not None and call.stream is not None:
            call.stream.ack(index)

    def _on_args(self, call_id, data, received):
        """A chunked call's arguments, assembled by the channel: data is
        None if received != total_size or they could not be allocated."""
        call = self._calls.get(call_id)
        if call is None or not call.receiving:
            return  # cancelled while its arguments were arriving
        call.receiving = False
        call.received = received
        self._start(call, data)

    def _on_cancel(self, call_id):
        call = self._calls.pop(call_id, None)
        if call is None:
            return  # already answered, or never seen
        call.cancelled = True
        call.receiving = False
        if call.task is not None:
            # A task gets CancelledError at its next await; a pool function
            # that has not started never runs; a running one is abandoned.
            call.task.cancel()
        if call.stream is not None:
            # A pool producer stops before its next item and closes the
            # generator. Closed before Cancelled is queued: an item is queued
            # only under the stream's lock, so none can follow it.
            call.stream.close()
        try:
            self._send_cancelled(call)
        except _w.ChannelError as exc:
            self._channel_failed(exc)
            return
        self._queued()

    # ---- execution ---------------------------------------------------------

    def _start(self, call, data):
        # Tasks created meanwhile copy this context; pool work runs in a copy
        # of it (_submit). Module imports by resolve() count as the call's.
        # The host's propagated context (agentix.context: baggage, registered
        # vars, trace scope) is attached the same way.
        token = _call_id.set(call.call_id)
        try:
            if not call.context:
                self._start_call(call, data)
                return
            context = _context_module()
            if context is None:
                self._start_call(call, data)
                return
            try:
                values = context.decode(call.context)
            except BaseException as exc:
                self._finish(call, False, _error(exc, _INVALID_ARGUMENT, skip=1))
                return
            with context.attach(values):
                self._start_call(call, data)
        finally:
            _call_id.reset(token)

    def _start_call(self, call, data):
        if call.encoding not in (_PICKLE, _MSGPACK):
            self._finish(call, False, (
                "UnsupportedEncoding",
                f"unsupported argument encoding {call.encoding} "
                "(supported: 1 = pickle, 2 = msgpack)", "", _INVALID_ARGUMENT))
            return
        if call.received != call.total_size:
            self._finish(call, False, (
                "ArgumentsDecodeError",
                f"received {call.received} argument bytes, but total_size is "
                f"{call.total_size}", "", _INVALID_ARGUMENT))
            return
        if data is None:
            self._finish(call, False, (
                "ArgumentsDecodeError",
                f"out of memory for {call.total_size} argument bytes", "",
                _INVALID_ARGUMENT))
            return
        try:
            fn = resolve(call.reference)
        except BaseException as exc:
            self._finish(call, False, _error(exc, _INVALID_ARGUMENT, skip=1))
            return
        try:
            args, kwargs = _decode_arguments(call.encoding, data)
        except _Failure as failure:
            self._finish(call, False, failure.error)
            return
        if call.stream is not None:
            self._start_stream(call, fn, args, kwargs)
        elif asyncio.iscoroutinefunction(fn):
            call.task = self._loop.create_task(
                self._run_coroutine(call, fn, args, kwargs))
        else:
            self._submit(call, self._run_pooled, call, fn, args, kwargs)

    def _submit(self, call, fn, *args):
        """Runs fn(*args) on the pool as call's task, in a copy of the
        current context (which holds the call's id): pool threads do not
        inherit contexts."""
        call.task = self._pool.submit(contextvars.copy_context().run, fn, *args)

    def _run_pooled(self, call, fn, args, kwargs):
        """Runs a sync callable on a pool thread and sends its reply from
        there: handing the result back to the loop first would cost a thread
        wake-up per call. Never raises."""
        status, payload = _run_sync(call.encoding, fn, args, kwargs)
        if status is _AWAIT:
            self._call_on_loop(self._await_on_loop, call, payload)
            return
        if status is _GENERATOR:
            status, payload = False, self._refuse_generator(call, payload)
        self._reply_from_thread(call, status, payload)

    def _reply_from_thread(self, call, ok, payload):
        """_finish for a pool thread: sends and flushes at once."""
        if self._calls.pop(call.call_id, None) is not call:
            return  # cancelled meanwhile, or the worker is stopping
        try:
            if ok:
                self._channel.send_result(call.call_id, call.encoding, payload)
            else:
                _send_error(self._channel, call.call_id, payload)
            self._channel.flush()
        except _w.ChannelError as exc:
            self._call_on_loop(self._channel_failed, exc)

    def _refuse_generator(self, call, value):
        """The error for a non-streaming call that returned a generator or
        an async iterator (any thread). Closes it: a sync one here, an async
        one on the loop."""
        if isinstance(value, types.GeneratorType):
            what = "a generator"
            _close_quietly(value)
        else:
            what = ("an async generator"
                    if isinstance(value, types.AsyncGeneratorType)
                    else "an async iterator")
            self._call_on_loop(self._loop.create_task, _aclose_quietly(value))
        return ("ResultEncodeError",
                f"remote target {call.reference!r} returned {what}; call it "
                "with remote_stream()", "", _INVALID_ARGUMENT)

    def _call_on_loop(self, fn, *args):
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # the loop is closed: the worker is exiting

    def _await_on_loop(self, call, awaitable):
        if self._calls.get(call.call_id) is call:
            call.task = self._loop.create_task(
                self._await_value(call, awaitable))

    async def _run_coroutine(self, call, fn, args, kwargs):
        try:
            awaitable = fn(*args, **kwargs)  # e.g. TypeError for bad arguments
        except BaseException as exc:
            self._finish(call, False, _error(exc, _UNKNOWN, skip=1))
            return
        await self._await_value(call, awaitable)

    async def _await_value(self, call, awaitable):
        try:
            value = await awaitable
        except asyncio.CancelledError as exc:
            if call.cancelled:
                return
            outcome = False, _error(exc, _UNKNOWN, skip=1)
        except BaseException as exc:
            outcome = False, _error(exc, _UNKNOWN, skip=1)
        else:
            if isinstance(value, _STREAM_ONLY):
                outcome = False, self._refuse_generator(call, value)
            else:
                outcome = _encode_result(call.encoding, value)
        self._finish(call, *outcome)

    # ---- streaming ---------------------------------------------------------

    def _start_stream(self, call, fn, args, kwargs):
        """Async generator and coroutine functions start on the loop; any
        other callable on the pool, since calling it may block."""
        if inspect.isasyncgenfunction(fn) or asyncio.iscoroutinefunction(fn):
            call.task = self._loop.create_task(
                self._run_stream_coroutine(call, fn, args, kwargs))
        else:
            self._submit(call, self._run_stream_pooled, call, fn, args, kwargs)

    async def _run_stream_coroutine(self, call, fn, args, kwargs):
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:
            self._finish(call, False, _error(exc, _UNKNOWN, skip=1))
            return
        await self._stream_value(call, value)

    def _run_stream_pooled(self, call, fn, args, kwargs):
        """Pool thread: calls fn and iterates its value here if that is a
        sync iterable; anything to await goes to the loop. Never raises."""
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:
            self._reply_from_thread(call, False, _error(exc, _UNKNOWN, skip=1))
            return
        if inspect.isawaitable(value) or hasattr(type(value), "__aiter__"):
            self._call_on_loop(self._stream_on_loop, call, value)
        elif _is_sync_stream(value):
            self._produce_sync(call, value)
        else:
            self._reply_from_thread(call, False, _not_iterable(call, value))

    def _stream_on_loop(self, call, value):
        if self._calls.get(call.call_id) is call:
            call.task = self._loop.create_task(self._stream_value(call, value))

    async def _stream_value(self, call, value):
        """Streams value, after awaiting it if it is awaitable (once, as
        ordinary calls do): on this task for an async iterable, else on a
        pool thread."""
        if inspect.isawaitable(value):
            try:
                value = await value
            except asyncio.CancelledError as exc:
                if not call.cancelled:
                    self._finish(call, False, _error(exc, _UNKNOWN, skip=1))
                return
            except BaseException as exc:
                self._finish(call, False, _error(exc, _UNKNOWN, skip=1))
                return
        if hasattr(type(value), "__aiter__"):
            await self._produce_async(call, value)
        elif _is_sync_stream(value):
            self._submit(call, self._produce_sync, call, value)
        else:
            self._finish(call, False, _not_iterable(call, value))

    async def _produce_async(self, call, iterable):
        """Loop task: sends the items of an async iterable, then the
        terminal frame; closes the iterator if it stops before the iterator
        ended. Cancellation (the task's) ends it silently: the Cancelled
        error has been sent."""
        stream = call.stream
        try:
            iterator = aiter(iterable)
        except BaseException as exc:
            self._finish(call, False, _error(exc, _UNKNOWN, skip=1))
            return
        index = 0
        ended = False  # the iterator finished or raised: nothing to close
        try:
            while True:
                while index >= stream.acked + stream.window:
                    stream.credit.clear()
                    await stream.credit.wait()
                item = await iterator.__anext__()
                if call.cancelled:
                    # The generator swallowed the CancelledError and went on.
                    outcome = None
                    break
                ok, data = _encode_result(call.encoding, item, index)
                if not ok:
                    outcome = False, data
                    break
                try:
                    self._channel.send_item(call.call_id, index, call.encoding,
                                            data)
                except (ValueError, MemoryError) as exc:
                    outcome = False, _item_too_large(index, exc)
                    break
                except _w.ChannelError as exc:
                    self._channel_failed(exc)
                    outcome = None
                    break
                self._queued()
                index += 1
        except StopAsyncIteration:
            ended = True
            outcome = _encode_result(call.encoding, None)
        except asyncio.CancelledError as exc:
            # Ours (waiting for credit or inside __anext__), unless the call
            # was not cancelled: then the iterator raised it.
            outcome = None if call.cancelled else (
                False, _error(exc, _UNKNOWN, skip=1))
        except BaseException as exc:
            ended = True
            outcome = False, _error(exc, _UNKNOWN, skip=1)
        if outcome is not None:
            self._finish(call, *outcome)
        if not ended:
            await _aclose_quietly(iterator)

    def _produce_sync(self, call, iterable):
        """Pool thread: sends the items of a sync iterable, then the
        terminal frame; closes the iterator (from this thread, as generators
        require) if it stops before the iterator ended. Never raises."""
        stream = call.stream
        try:
            iterator = iter(iterable)
        except BaseException as exc:
            self._reply_from_thread(call, False, _error(exc, _UNKNOWN, skip=1))
            return
        index = 0
        outcome = None
        ended = False  # the iterator finished or raised: nothing to close
        while True:
            with stream.cond:
                while (not stream.closed
                       and index >= stream.acked + stream.window):
                    stream.cond.wait()
                if stream.closed:
                    break
            try:
                item = next(iterator)
            except StopIteration as stop:
                ended = True
                outcome = _encode_result(call.encoding, stop.value)
                break
            except BaseException as exc:
                ended = True
                outcome = False, _error(exc, _UNKNOWN, skip=1)
                break
            ok, data = _encode_result(call.encoding, item, index)
            if not ok:
                outcome = False, data
                break
            # Queued under the lock, so that no item follows a Cancelled
            # error (see _on_cancel); flushed outside it.
            with stream.cond:
                if stream.closed:
                    break
                try:
                    self._channel.send_item(call.call_id, index, call.encoding,
                                            data)
                except (ValueError, MemoryError) as exc:
                    outcome = False, _item_too_large(index, exc)
                    break
                except _w.ChannelError as exc:
                    self._call_on_loop(self._channel_failed, exc)
                    break
            try:
                self._channel.flush()
            except _w.ChannelError as exc:
                self._call_on_loop(self._channel_failed, exc)
                break
            index += 1
        if outcome is not None:
            self._reply_from_thread(call, *outcome)
        if not ended:
            _close_quietly(iterator)

    # ---- lifecycle ---------------------------------------------------------

    def stop(self, code, notify):
        """Cancels every call and stops the loop. With `notify`, each open
        call is answered with a Cancelled error first."""
        if self.exit_code is not None:
            return
        self.exit_code = code
        try:
            self._loop.remove_reader(self._channel.fileno())
        except Exception:
            pass
        calls = list(self._calls.values())
        self._calls.clear()
        for call in calls:
            call.cancelled = True
            if call.task is not None:
                call.task.cancel()
            if call.stream is not None:
                call.stream.close()
            if notify:
                try:
                    self._send_cancelled(call)
                except _w.ChannelError:
                    notify = False
        if code != EXIT_CHANNEL:
            try:
                self._channel.flush()
            except _w.ChannelError:
                pass
        self._loop.stop()

    def finish(self):
        """After the loop stopped: lets cancelled coroutines unwind (bounded)
        and releases the pool. Returns (exit_code, clean), clean meaning no
        user function is still running on a pool thread, so interpreter
        finalisation will not wait on one."""
        tasks = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            try:
                self._loop.run_until_complete(
                    asyncio.wait(tasks, timeout=_CANCEL_GRACE_SECONDS))
            except BaseException as exc:
                _log(_WARNING, f"while cancelling calls: {_text(exc)}")
        clean = not self._pool.busy()
        self._pool.shutdown()
        if clean and all(t.done() for t in tasks):
            self._loop.close()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        return self.exit_code, clean


# ---- logs ------------------------------------------------------------------


def _coerce(value, depth=0):
    """value as something msgpack can carry (SPEC 4): scalars and bytes
    kept, lists and tuples as lists, dict keys as str, anything else
    repr()."""
    if value is None or isinstance(value, (bool, float, str, bytes)):
        return value
    if isinstance(value, int):
        if _MSGPACK_INT[0] <= value < _MSGPACK_INT[1]:
            return value
    elif depth < _MAX_EXTRAS_DEPTH:
        if isinstance(value, (list, tuple)):
            return [_coerce(item, depth + 1) for item in value]
        if isinstance(value, dict):
            return {str(k): _coerce(v, depth + 1) for k, v in value.items()}
    try:
        return repr(value)
    except BaseException:
        return f"<unrepresentable {type(value).__name__} object>"


def _extras(record):
    """The msgpack map of record's extra attributes, or None."""
    attributes = record.__dict__
    # Most records have no extras: one set difference in C says so.
    if not attributes.keys() - _STANDARD_KEYS:
        return None
    extras = None
    for key, value in attributes.items():
        if key in _STANDARD_KEYS or key.startswith("_"):
            continue
        if extras is None:
            extras = {}
        extras[key] = _coerce(value)
    if extras is None:
        return None
    try:
        return _w.msgpack_dumps(extras)
    except BaseException:
        return None


_FORMATTER = logging.Formatter()


class _LogBridge(logging.Handler):
    """Root-logger handler: each record becomes one `log` frame, sent by the
    channel's sender thread, so records from any thread go out promptly and
    in order. Never raises into the logging call."""

    def __init__(self, channel, context):
        super().__init__()
        self._channel = channel
        self._context = context

    def createLock(self):
        # send_log is thread-safe; a handler lock would only serialise
        # threads that log.
        self.lock = None

    def handleError(self, record):
        pass  # emit() swallows its errors; nothing to print them to

    def emit(self, record):
        try:
            name = record.name
            if name.startswith(_UNFORWARDED):
                return
            try:
                message = record.getMessage()
            except Exception as exc:
                # Forwarded anyway, with what went wrong (logging itself would
                # only print "--- Logging error ---" to stderr).
                try:
                    args = repr(record.args)
                except Exception:
                    args = "<unrepresentable>"
                message = (f"{_text(record.msg)} [agentix: formatting the "
                           f"message failed: {type(exc).__name__}: "
                           f"{_text(exc)}; args={args}]")
            exc_text = record.exc_text
            if record.exc_info and not exc_text:
                exc_text = record.exc_text = _FORMATTER.formatException(
                    record.exc_info)
            context = getattr(record, "agentix_context", None)
            self._channel.send_log(
                name, record.levelno, record.levelname, message,
                int(record.created * 1e9), record.pathname or "",
                record.lineno or 0, record.funcName or "",
                record.module or "", exc_text or "", _ORIGIN_LOGGING,
                _call_id.get(),
                context if isinstance(context, str) else self._context,
                _extras(record), record.stack_info or "")
        except Exception:
            pass


# ---- traces ----------------------------------------------------------------

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
    # msgpack carries only the base types, and repr() would hide the value.
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
    """The msgpack map of `mapping`'s attributes, or None if it has none."""
    if not mapping:
        return None
    out = _attribute_map(mapping)
    return _w.msgpack_dumps(out) if out else None


def _str(value):
    """value if it is a str (the common case: no call to _text)."""
    return value if type(value) is str else _text(value)


# The last "YYYY-MM-DDTHH:MM:SS" _unix_nanos converted, with its Unix
# seconds: a span's stamps (and the next span's) mostly share their second.
_last_second = ("", 0)


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
                    seconds = calendar.timegm((
                        int(head[0:4]), int(head[5:7]), int(head[8:10]),
                        int(head[11:13]), int(head[14:16]), int(head[17:19]),
                        0, 0, 0))
                    _last_second = (head, seconds)
                return seconds * _NANOS + int(stamp[20:26]) * 1000
            stamp = datetime.fromisoformat(stamp)
        if isinstance(stamp, datetime):
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=timezone.utc)
            return (calendar.timegm(stamp.utctimetuple()) * _NANOS
                    + stamp.microsecond * 1000)
    except Exception:
        pass
    return 0


def _events(events):
    """msgpack [[name, time_unix_nanos, {attributes}], ...], or None."""
    if not events:
        return None
    out = []
    for event in list(events):
        out.append([_text(getattr(event, "name", "")),
                    _unix_nanos(getattr(event, "timestamp", None)),
                    _attribute_map(getattr(event, "attributes", None))])
    return _w.msgpack_dumps(out)


def _trace_forwarder_class(base):
    class _TraceForwarder(base):
        """Sends each trace/span lifecycle event as a `trace` frame (the
        original's _ForwardProcessor). Never raises into the traced code:
        failures are counted, and the first one is reported on stderr."""

        def __init__(self, channel):
            super().__init__()
            self._channel = channel
            self.enabled = True
            self.failures = 0
            # Set while this thread forwards: a repr() or a log handler run
            # by the forwarding that opens a span must not forward again.
            self._busy = threading.local()

        def __repr__(self):
            return "<agentix-worker trace forwarder>"

        def _forward(self, kind, item):
            if not self.enabled or getattr(self._busy, "on", False):
                return
            self._busy.on = True
            try:
                self._send(kind, item)
            except BaseException as exc:
                self.failures += 1
                if self.failures == 1:
                    _log(_WARNING, "cannot forward a trace event "
                         f"({type(exc).__name__}: {_text(exc)}); "
                         "dropping it (later failures are only counted)")
            finally:
                self._busy.on = False

        def _send(self, kind, item):
            # Span events first: they are most of the traffic.
            if kind == _SPAN_END:
                parent_id = item.parent_id
                error = item.error
                error_message, error_data = "", None
                if error is not None:
                    error_message = _text(getattr(error, "message", error))
                    error_data = _attributes(getattr(error, "data", None))
                description = item.status_description
                events = item.events
                self._channel.send_trace(
                    kind, _str(item.trace_id), _str(item.span_id),
                    "" if parent_id is None else _str(parent_id),
                    _str(item.name), _unix_nanos(item.started_at),
                    _unix_nanos(item.ended_at), _attributes(item.attrs),
                    _events(events) if events else None,
                    _SPAN_STATUS.get(item.status, 0),
                    "" if description is None else _str(description),
                    error_message, error_data, _call_id.get())
            elif kind == _SPAN_START:
                parent_id = item.parent_id
                self._channel.send_trace(
                    kind, _str(item.trace_id), _str(item.span_id),
                    "" if parent_id is None else _str(parent_id),
                    _str(item.name), _unix_nanos(item.started_at), 0,
                    _attributes(item.attrs), None, 0, "", "", None,
                    _call_id.get())
            elif kind == _TRACE_START:
                self._channel.send_trace(
                    kind, _str(item.trace_id), "", "", _str(item.name),
                    _unix_nanos(item.started_at), 0,
                    _attributes(item.metadata), None, 0, "", "", None,
                    _call_id.get())
            else:
                self._channel.send_trace(
                    kind, _str(item.trace_id), "", "", "", 0,
                    _unix_nanos(item.ended_at), None, None, 0, "", "", None,
                    _call_id.get())

        def on_trace_start(self, trace):
            self._forward(_TRACE_START, trace)

        def on_trace_end(self, trace):
            self._forward(_TRACE_END, trace)

        def on_span_start(self, span):
            self._forward(_SPAN_START, span)

        def on_span_end(self, span):
            self._forward(_SPAN_END, span)

    return _TraceForwarder


def _start_trace_forwarding(channel):
    """Registers the forwarding processor if the venv has agentix; returns it
    (None without agentix)."""
    try:
        import agentix.utils.trace as trace_module
    except ImportError:
        _log(_DEBUG, "agentix is not importable in the sandbox; "
                     "traces and spans are not forwarded")
        return None
    except Exception as exc:
        _log(_WARNING, "importing agentix.utils.trace failed "
             f"({type(exc).__name__}: {_text(exc)}); traces and spans are "
             "not forwarded")
        return None
    try:
        forwarder = _trace_forwarder_class(trace_module.Processor)(channel)
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


# agentix.sio when the venv has agentix (set by _start_namespaces), else None.
_sio = None
_sio_missing_reported = False


class _NamespaceBridge:
    """What agentix.sio sends plugin-namespace events through: the channel's
    side-channel queue (thread-safe, in order with log records)."""

    def __init__(self, channel):
        self._channel = channel
        self.enabled = True

    def emit(self, namespace, event, payload, request_id, error):
        if not self.enabled:
            raise RuntimeError("agentix.sio: events can only be emitted by "
                               "the running sandbox worker (not during its "
                               "shutdown, not from a forked child)")
        if error is None:
            self._channel.send_ns_event(namespace, event, payload, request_id,
                                        None, "", 0)
            return
        status = error.get("status_code")
        self._channel.send_ns_event(
            namespace, event, payload, request_id,
            str(error.get("type", "Error")), str(error.get("message", "")),
            status if type(status) is int and -2**31 <= status < 2**31 else 0)


def _start_namespaces(channel):
    """Installs the agentix.sio bridge if the venv has agentix; returns it."""
    global _sio
    try:
        import agentix.sio as sio_module
    except ImportError:
        _log(_DEBUG, "agentix is not importable in the sandbox; plugin "
                     "namespaces are unavailable")
        return None
    except Exception as exc:
        _log(_WARNING, "importing agentix.sio failed "
             f"({type(exc).__name__}: {_text(exc)}); plugin namespaces are "
             "unavailable")
        return None
    bridge = _NamespaceBridge(channel)
    sio_module._install(bridge)

    def after_fork_in_child():
        bridge.enabled = False

    os.register_at_fork(after_in_child=after_fork_in_child)
    _sio = sio_module
    return bridge


def _deliver_namespace_event(namespace, event, payload):
    """Hands one host event to agentix.sio (on the loop); never raises."""
    global _sio_missing_reported
    if _sio is None:
        if not _sio_missing_reported:
            _sio_missing_reported = True
            logging.getLogger("agentix.sio").warning(
                "event %r for namespace %s dropped: the sandbox's venv has no "
                "agentix package, so no agentix.Namespace can receive it",
                event, namespace)
        return
    try:
        _sio._deliver(namespace, event, payload)
    except Exception:
        logging.getLogger("agentix.sio").exception(
            "delivering event %r of namespace %s failed", event, namespace)


class _CapturedStream(io.TextIOWrapper):
    """sys.stdout / sys.stderr: a line-buffered, write-through text wrapper
    of fd 1 / fd 2 whose write() does not reach the fd. Each complete line
    goes straight out as a stdout/stderr `log` frame tagged with the
    writer's call id; the fd-level path could not tell whose it was.
    Unfinished lines wait per thread: until the next newline, until the
    thread writes for another call (then they go out as a line of their
    own), until flush(), or until shutdown. `buffer` (and fileno()) still
    reach the fd and are captured unattributed, like child processes."""

    def __init__(self, fd, origin, channel):
        super().__init__(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                         errors="backslashreplace", line_buffering=True,
                         write_through=True)
        self._origin = origin
        self._channel = channel
        self._pending = {}  # thread id -> (call id, unfinished line)

    def _send(self, line, call_id):
        if line.endswith("\r"):
            line = line[:-1]
        try:
            self._channel.send_stdio(self._origin, line, call_id)
        except Exception:
            pass  # output must never fail the call

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError(
                f"write() argument must be str, not {type(s).__name__}")
        thread = threading.get_ident()
        call_id = _call_id.get()
        pending = self._pending.pop(thread, None)
        text = s
        if pending is not None:
            if pending[0] == call_id:
                text = pending[1] + s
            else:
                self._send(pending[1], pending[0])
        if "\n" in text:
            lines = text.split("\n")
            text = lines.pop()
            for line in lines:
                while len(line) > _MAX_LINE_CHARS:
                    self._send(line[:_MAX_LINE_CHARS], call_id)
                    line = line[_MAX_LINE_CHARS:]
                self._send(line, call_id)
        while len(text) >= _MAX_LINE_CHARS:
            self._send(text[:_MAX_LINE_CHARS], call_id)
            text = text[_MAX_LINE_CHARS:]
        if text:
            self._pending[thread] = (call_id, text)
        return len(s)

    def flush(self):
        pending = self._pending.pop(threading.get_ident(), None)
        if pending is not None:
            self._send(pending[1], pending[0])
        super().flush()

    def flush_all(self):
        """Sends every thread's unfinished line (at shutdown)."""
        while self._pending:
            try:
                _, (call_id, text) = self._pending.popitem()
            except KeyError:
                break
            self._send(text, call_id)


def _expand_context(template, worker_id):
    """$AGENTIX_LOG_CONTEXT placeholders (SPEC 4); unknown ones stay."""
    host = socket.gethostname()
    for key, value in (("{uname}", host), ("{hostname}", host),
                       ("{pid}", str(os.getpid())), ("{id}", worker_id)):
        template = template.replace(key, value)
    return template


class _DurableFormatter(logging.Formatter):
    """A Formatter whose default asctime reuses the date and time of the
    previous record when the second is the same: localtime() and strftime()
    per record were a good part of the durable log's cost."""

    _second = (None, "")  # (int(created), its formatted date and time)

    def formatTime(self, record, datefmt=None):
        if datefmt:
            return super().formatTime(record, datefmt)
        second, text = self._second  # one tuple: consistent across threads
        created = int(record.created)
        if second != created:
            text = time.strftime(self.default_time_format,
                                 self.converter(created))
            self._second = (created, text)
        return self.default_msec_format % (text, record.msecs)


class _DurableHandler(logging.handlers.RotatingFileHandler):
    """The durable log file (SPEC 3.4). A write failure detaches it for good
    and says so once on the stderr stream.

    Each record is formatted once and the file's size is counted here: the
    stdlib's rollover check formats every record a second time and stats
    and seeks the file, which cost more than the write itself."""

    def __init__(self, path, channel, context):
        super().__init__(path, maxBytes=_DURABLE_MAX_BYTES, backupCount=1,
                         encoding="utf-8")
        self._channel = channel
        self._context = context
        self.detached = False
        # True: _open admits regular files only (the stdlib's guard, kept).
        self._rotates = os.path.isfile(self.baseFilename)
        self._size = self._current_size()

    def _open(self):
        """Opens (or creates, mode 0600) the log file itself, never what a
        symlink in its place points to, and only if it is a regular file of
        ours with no other name (a hard link planted to make us append to, or
        expose, another of our files). Also used to reopen after rotation."""
        # O_NONBLOCK: a FIFO planted there cannot hang the worker's boot.
        flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                 | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            fd = os.open(self.baseFilename, flags, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _LogRefused("it is a symlink") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _LogRefused("it is not a regular file")
            if st.st_uid != os.geteuid():
                raise _LogRefused(f"it is owned by uid {st.st_uid}, not this "
                                  f"worker's uid {os.geteuid()}")
            if st.st_nlink != 1:
                raise _LogRefused(f"it has {st.st_nlink} hard links")
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o600)  # ours: made private, not refused
            os.set_blocking(fd, True)
            return open(fd, "a", encoding=self.encoding, errors=self.errors)
        except BaseException:
            os.close(fd)
            raise

    def _current_size(self):
        # A FIFO cannot tell(); it is not rotated, so its size does not matter.
        return self.stream.tell() if self._rotates and self.stream else 0

    def doRollover(self):
        super().doRollover()
        self._size = self._current_size()

    def emit(self, record):
        # Handler.handle holds the lock: one thread at a time.
        try:
            if not hasattr(record, "agentix_context"):
                # Made without our record factory: still formats. (Here
                # rather than in a filter: a filter is one more call per
                # record.)
                record.agentix_context = self._context
            text = self.format(record) + self.terminator
            size = len(text) if text.isascii() else len(
                text.encode("utf-8", "surrogatepass"))
            if self.stream is None:  # closed by a failed rollover
                self.stream = self._open()
                self._size = self._current_size()
            if self._rotates and self._size + size >= self.maxBytes:
                self.doRollover()
            self.stream.write(text)
            self.stream.flush()
            self._size += size
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def handleError(self, record):
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            return  # a record that does not fit the format: skip it
        self.detach(f"after a write failure ({_text(exc)})")

    def detach(self, why):
        if self.detached:
            return
        self.detached = True
        try:
            self._channel.set_durable(False)
            logging.getLogger().removeHandler(self)
            self.close()
        except Exception:
            pass
        try:
            self._channel.send_stdio(
                _ORIGIN_STDERR, f"agentix: durable sandbox log detached {why}; "
                "later output is stream-only", "")
        except Exception:
            pass


class _LogRefused(OSError):
    """The durable log's directory or file is not safely ours."""


def _private_log_dir(log_dir):
    """Creates `log_dir` (mode 0700; missing parents as os.makedirs makes
    them), or checks the existing one: a directory, not a symlink, owned by
    this uid and writable by no one else. Anyone else who can write there
    could have planted the log file or a link in its place beforehand, so
    such a directory is refused, not repaired. Raises OSError."""
    try:
        os.makedirs(log_dir, mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(log_dir)
    if stat.S_ISLNK(st.st_mode):
        raise _LogRefused(f"its directory {log_dir} is a symlink")
    if not stat.S_ISDIR(st.st_mode):
        raise _LogRefused(f"{log_dir} is not a directory")
    if st.st_uid != os.geteuid():
        raise _LogRefused(f"its directory {log_dir} is owned by uid "
                          f"{st.st_uid}, not this worker's uid {os.geteuid()}")
    if st.st_mode & 0o022:
        raise _LogRefused(f"its directory {log_dir} is writable by group or "
                          f"others (mode {stat.S_IMODE(st.st_mode):o})")


def _open_durable(channel, worker_id, context):
    """The durable log handler, or None when disabled or impossible (then
    the reason goes to the daemon's log and the stderr stream, and calls
    run as usual)."""
    log_dir = os.environ.get("AGENTIX_LOG_DIR", _DEFAULT_LOG_DIR)
    if not log_dir:
        return None
    path = os.path.join(log_dir, f"sandbox-{worker_id}.log")
    try:
        _private_log_dir(log_dir)
        handler = _DurableHandler(path, channel, context)
    except Exception as exc:
        why = f"cannot open {path}: {_text(exc)}"
        if isinstance(exc, _LogRefused):
            why = (f"refusing {path}: {_text(exc)} (set AGENTIX_LOG_DIR to a "
                   "private directory, or to \"\" to turn the log off)")
        _log(_WARNING, f"durable sandbox log disabled: {why}")
        try:
            channel.send_stdio(
                _ORIGIN_STDERR, "agentix: durable sandbox log detached: "
                f"{why}; later output is stream-only", "")
        except Exception:
            pass
        return None
    handler.setFormatter(_DurableFormatter(
        os.environ.get("AGENTIX_LOG_FORMAT") or _DEFAULT_FORMAT))
    return handler


def _pump_durable(channel, handler, context):
    """Thread: appends captured stdout/stderr lines to the durable log."""
    _w.set_thread_name("agentix-durable")
    names = {_ORIGIN_STDOUT: "agentix.sandbox.stdout",
             _ORIGIN_STDERR: "agentix.sandbox.stderr"}
    while True:
        lines = channel.wait_stdio_lines()
        if lines is None or handler.detached:
            return
        for origin, time_ns, text in lines:
            try:
                record = logging.LogRecord(names[origin], logging.INFO, "", 0,
                                           text, None, None)
                record.created = time_ns / 1e9
                record.msecs = (time_ns // 1000000) % 1000
                record.module = "stdio"
                record.agentix_context = context
                handler.handle(record)
            except Exception:
                pass


class _Logs:
    """The worker's log plumbing, set up at boot and torn down at exit."""

    def __init__(self, channel, worker_id):
        self._channel = channel
        self._streams = ()
        self._durable = None
        self._pump = None
        self._saved = (sys.stdout, sys.stderr)
        self._factory = None
        context = os.environ.get("AGENTIX_LOG_CONTEXT")
        self.context = _expand_context(
            context or "sandbox-{hostname}-worker-{id}", worker_id)
        self._worker_id = worker_id

    def start(self):
        channel, context = self._channel, self.context
        try:
            channel.start_capture(self._worker_id, context)
        except Exception as exc:
            _log(_ERROR, f"cannot capture stdout/stderr: {_text(exc)}")
        else:
            self._streams = (
                _CapturedStream(1, _ORIGIN_STDOUT, channel),
                _CapturedStream(2, _ORIGIN_STDERR, channel))
            sys.stdout, sys.stderr = self._streams
        # A crash in native code kills the process before any log frame can
        # leave; faulthandler writes the Python stacks to the original stderr,
        # which the daemon keeps and quotes in the WorkerDied error.
        try:
            import faulthandler
            faulthandler.enable(file=_w.diagnostic_fd(), all_threads=True)
        except Exception as exc:
            _log(_WARNING, f"cannot enable faulthandler: {_text(exc)}")

        factory = logging.getLogRecordFactory()

        def make_record(*args, **kwargs):
            record = factory(*args, **kwargs)
            record.agentix_context = context
            return record

        logging.setLogRecordFactory(make_record)
        root = logging.getLogger()
        bridge = _LogBridge(channel, context)
        root.addHandler(bridge)
        # As the original worker: the level comes from $AGENTIX_LOG_LEVEL
        # (configure_logging; unknown names mean INFO), then the bridge raises
        # it to at least INFO so the host sees INFO records by default.
        root.setLevel(_env_log_level())
        if root.level == logging.NOTSET or root.level > logging.INFO:
            root.setLevel(logging.INFO)

        self._durable = _open_durable(channel, self._worker_id, context)
        if self._durable is not None:
            root.addHandler(self._durable)
            if self._streams:
                channel.set_durable(True)
                self._pump = threading.Thread(
                    target=_pump_durable, name="agentix-durable-log",
                    args=(channel, self._durable, context), daemon=True)
                self._pump.start()

        def after_fork_in_child():
            # The channel is the parent's (channel_module.cc drops what a
            # child sends): output goes to fds 1/2, still drained by the
            # worker, and records are not forwarded.
            sys.stdout, sys.stderr = self._saved
            root.removeHandler(bridge)

        os.register_at_fork(after_in_child=after_fork_in_child)

    def stop(self):
        """Sends what is pending and restores fds and streams. Bounded."""
        for stream in self._streams:
            stream.flush_all()
        sys.stdout, sys.stderr = self._saved
        try:
            self._channel.stop_capture(_CAPTURE_STOP_MS)
        except Exception as exc:
            _log(_WARNING, f"while stopping capture: {_text(exc)}")
        if self._pump is not None:
            self._pump.join(_CAPTURE_STOP_MS / 1000)
        if self._durable is not None:
            try:
                self._channel.set_durable(False)
                self._durable.flush()
            except Exception:
                pass


def _on_loop_error(loop, context):
    message = context.get("message") or "event loop error"
    exc = context.get("exception")
    if exc is not None:
        message = (f"{message}: {type(exc).__name__}: {_text(exc)}\n"
                   f"{_format(exc)}")
    _log(_WARNING, message)


def main(channel_fd, worker_id, payload_fd=-1):
    """Serves calls until shutdown or end of stream. Returns (exit_code,
    clean) for worker.cc. `payload_fd`: the daemon's shared payload area, or
    -1."""
    channel = _w.Channel(channel_fd, payload_fd)
    logs = _Logs(channel, worker_id)
    logs.start()
    forwarder = _start_trace_forwarding(channel)
    namespaces = _start_namespaces(channel)
    try:
        return _serve(channel, channel_fd, worker_id)
    finally:
        if namespaces is not None:
            namespaces.enabled = False
        if forwarder is not None:
            # Spans closed during interpreter teardown have nowhere to go.
            forwarder.enabled = False
        logs.stop()


def _serve(channel, channel_fd, worker_id):
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.set_exception_handler(_on_loop_error)
    worker = _Worker(loop, channel)
    loop.add_reader(channel_fd, worker.on_readable)
    try:
        channel.send_ready(os.getpid(), "%d.%d.%d" % sys.version_info[:3])
        channel.flush()
    except _w.ChannelError as exc:
        _log(_ERROR, f"cannot send ready: {exc}")
        return EXIT_CHANNEL, True
    _log(_DEBUG, f"worker {worker_id} ready")
    while worker.exit_code is None:
        try:
            loop.run_forever()
        except BaseException as exc:
            # Only code outside our wrappers gets here (e.g. a background task
            # the user started raised SystemExit); calls are unaffected.
            _log(_WARNING, "event loop interrupted by "
                 f"{type(exc).__name__}: {_text(exc)}; continuing")
    return worker.finish()
