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
"""

import asyncio
import collections.abc
import importlib
import inspect
import os
import pickle
import sys
import threading
import traceback
import types
from concurrent.futures import ThreadPoolExecutor

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


def _error(exc, code, skip=0):
    """An error frame's (type, message, traceback, code) for exc."""
    return type(exc).__name__, _text(exc), _format(exc, skip), code


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


def _encode_result(encoding, value, item=None):
    """(True, bytes) or (False, error) for a call's return value, or for
    stream item number `item`."""
    try:
        if encoding == _MSGPACK:
            return True, _w.msgpack_dumps(value)
        return True, pickle.dumps(value, protocol=5)
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


class _Call:
    __slots__ = ("call_id", "reference", "encoding", "total_size", "context",
                 "parts", "received", "task", "cancelled", "stream")

    def __init__(self, call_id, reference, encoding, total_size, context,
                 stream_window):
        self.call_id = call_id
        self.reference = reference
        # The reply uses the encoding the arguments came in (0 -> pickle).
        self.encoding = encoding or _PICKLE
        self.total_size = total_size
        self.context = context
        self.parts = None  # argument pieces while chunks are still arriving
        self.received = 0
        self.task = None  # asyncio.Task or concurrent Future once running
        self.cancelled = False
        self.stream = _Stream(stream_window) if stream_window else None


class _Worker:
    """Per-process call bookkeeping; all methods run on the loop thread."""

    def __init__(self, loop, channel):
        self._loop = loop
        self._channel = channel
        # Calls that have not had their terminal frame yet, receiving or
        # running. A call leaves exactly when that frame is queued.
        self._calls = {}
        # Pool futures whose function may still be running (abandoned ones
        # included): shutdown must not wait on them.
        self._sync_futures = set()
        self._pool = ThreadPoolExecutor(
            max_workers=_SYNC_THREADS, thread_name_prefix="agentix-call",
            initializer=_w.set_thread_name, initargs=("agentix-call",))
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
                elif kind == _w.ARG_CHUNK:
                    self._on_arg_chunk(frame[1], frame[2])
                elif kind == _w.STREAM_ACK:
                    self._on_stream_ack(frame[1], frame[2])
                elif kind == _w.CANCEL:
                    self._on_cancel(frame[1])
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
                type_name, message, tb, code = payload
                self._channel.send_error(call.call_id, code, type_name,
                                         message, tb, False)
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
        if len(data) >= total_size:
            self._start(call, data)
        else:
            call.parts = [data]
            call.received = len(data)

    def _on_stream_ack(self, call_id, index):
        call = self._calls.get(call_id)
        if call is not None and call.stream is not None:
            call.stream.ack(index)

    def _on_arg_chunk(self, call_id, data):
        call = self._calls.get(call_id)
        if call is None or call.parts is None:
            return  # cancelled while its arguments were arriving
        call.parts.append(data)
        call.received += len(data)
        if call.received >= call.total_size:
            parts, call.parts = call.parts, None
            self._start(call, b"".join(parts))

    def _on_cancel(self, call_id):
        call = self._calls.pop(call_id, None)
        if call is None:
            return  # already answered, or never seen
        call.cancelled = True
        call.parts = None
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
        if call.encoding not in (_PICKLE, _MSGPACK):
            self._finish(call, False, (
                "UnsupportedEncoding",
                f"unsupported argument encoding {call.encoding} "
                "(supported: 1 = pickle, 2 = msgpack)", "", _INVALID_ARGUMENT))
            return
        if len(data) != call.total_size:
            self._finish(call, False, (
                "ArgumentsDecodeError",
                f"received {len(data)} argument bytes, but total_size is "
                f"{call.total_size}", "", _INVALID_ARGUMENT))
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
        """Runs fn(*args) on the pool as call's task."""
        future = self._pool.submit(fn, *args)
        call.task = future
        self._sync_futures.add(future)
        future.add_done_callback(self._sync_futures.discard)

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
                type_name, message, tb, code = payload
                self._channel.send_error(call.call_id, code, type_name,
                                         message, tb, False)
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
        clean = all(f.done() for f in self._sync_futures)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if clean and all(t.done() for t in tasks):
            self._loop.close()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        return self.exit_code, clean


def _on_loop_error(loop, context):
    message = context.get("message") or "event loop error"
    exc = context.get("exception")
    if exc is not None:
        message = (f"{message}: {type(exc).__name__}: {_text(exc)}\n"
                   f"{_format(exc)}")
    _log(_WARNING, message)


def main(channel_fd, worker_id):
    """Serves calls until shutdown or end of stream. Returns (exit_code,
    clean) for worker.cc."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.set_exception_handler(_on_loop_error)
    channel = _w.Channel(channel_fd)
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
