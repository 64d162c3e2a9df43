"""The event loop side of the worker: frames in, calls started, replies out.

asyncio is not imported here: the worker sends its ready frame and runs sync
calls before asyncio is imported (serve.py, worker cold start), so only the
loop's own methods, which run once the loop exists, import it.
"""

import contextvars
import sys
import threading
import types

import _agentix_worker as _w

from .calls import (
    _PICKLED_NONE,
    _PLAIN_VALUES,
    _Call,
    _Failure,
    _decode_arguments,
    _encode_result,
    _is_sync_stream,
    _isawaitable,
    _iscoroutinefunction,
    resolve_target,
)
from .common import (
    EXIT_CHANNEL,
    EXIT_OK,
    EXIT_PROTOCOL,
    _CANCELLED,
    _CANCEL_GRACE_SECONDS,
    _DEBUG,
    _ERROR,
    _INVALID_ARGUMENT,
    _MSGPACK,
    _PICKLE,
    _STREAM_ONLY,
    _SYNC_THREADS,
    _UNKNOWN,
    _WARNING,
    _call_id,
    _log,
    _text,
)
from .env import (_PLAIN_CONTEXT_MAGIC, _apply_env, _context_module,
                  _plain_context)
from .errors import _error, _send_error
from .intake import _LEAD_AFTER_SYNC_CALLS, _LeaderIntake, _lead_enabled
from .namespaces import _deliver_namespace_event
from .pool import STALL_SECONDS, _SyncPool
from .streams import (
    _aclose_quietly,
    _close_quietly,
    _item_too_large,
    _not_iterable,
)


# A pool thread draining a burst of sync calls writes its queued replies
# after this many, not only once the queue is empty: the daemon and the host
# start on the first replies while the rest run (at 64 callers a burst took
# each process in turn, 1.2-1.3x the calls/s with 8, for ~5% more CPU).
_REPLY_BATCH = 8


class _Worker(_LeaderIntake):
    """Per-process call bookkeeping. Methods run on the loop thread, except
    where said (pool threads: _run_pooled and what it calls, and the intake
    leader's _lead_intake and the _start path it shares with the loop)."""

    def __init__(self, loop, channel):
        self._loop = loop
        self._channel = channel
        # Calls that have not had their terminal frame yet, receiving or
        # running. A call leaves exactly when that frame is queued.
        self._calls = {}
        # Calls (and an intake leader's set_envs) received so far: a change
        # between two looks means the worker was not idle in between
        # (serve.py's idle test), even if each call was done by the time
        # anyone looked.
        self.calls_started = 0
        # True while an intake leader holds frames it has read but whose
        # calls are not yet in _calls: the channel no longer shows them, so
        # a look from the main thread must see this (idle_since).
        self._intake_reading = False
        # Sync callables' threads; shutdown must not wait on a function that
        # is still running there (abandoned ones included).
        self._pool = _SyncPool(_SYNC_THREADS, self._arm_pool_monitor)
        # True while on_readable handles a batch of frames: replies produced
        # meanwhile share one write at the end of the batch.
        self._in_batch = False
        self.exit_code = None
        self._loop_thread = threading.get_ident()
        # Who reads the frame channel: the loop (its reader registered) or,
        # while sync calls come in a row, the pool thread holding the intake
        # baton (_lead_intake). Exactly one of them at any time.
        self._lead_on = _lead_enabled()
        self._sync_streak = 0  # sync calls the loop started since another kind
        self._lead_after = _LEAD_AFTER_SYNC_CALLS
        self._led = 0  # calls intake leaders ran since the pool last took over
        self._unflushed = 0  # replies pool threads queued since their last flush

    @property
    def busy(self):
        """True while a call has not had its terminal frame."""
        return bool(self._calls)

    def idle_since(self, started):
        """True if no call is running, none came since calls_started was
        `started`, and no frame waits unread in the channel (a reader slow to
        run on a loaded machine is not a pause: frames sent with the ready
        frame must not find the event loop's start or the warm-up under
        them). Called at most every 0.1 s, off the calls' path."""
        if (self._calls or self._intake_reading
                or self.calls_started != started):
            return False
        import select  # a builtin module; asyncio imports it anyway
        try:
            readable, _, _ = select.select([self._channel.fileno()], [], [], 0)
        except (OSError, ValueError):
            return True  # a closed channel: the reader sees its end
        return not readable

    # ---- channel -----------------------------------------------------------

    def on_readable(self):
        try:
            frames = self._channel.read_frames()
        except (_w.ProtocolError, OSError) as exc:
            self._read_failed(exc)
            return
        if frames is None:
            _log(_DEBUG, "frame channel closed by the daemon; exiting")
            self.stop(EXIT_OK, notify=False)
            return
        self._dispatch(frames)
        if (self._sync_streak >= self._lead_after and self._lead_on
                and len(self._calls) <= 1 and self.exit_code is None):
            self._hand_intake_to_pool()

    def _read_failed(self, exc):
        """Loop: read_frames raised exc (on the loop or an intake leader)."""
        if isinstance(exc, _w.ProtocolError):
            _log(_ERROR, f"frame channel desynchronised: {exc}; exiting")
            self.stop(EXIT_PROTOCOL, notify=False)
        else:
            _log(_ERROR, f"frame channel read failed: {exc}; exiting")
            self.stop(EXIT_CHANNEL, notify=False)

    def _dispatch(self, frames):
        """Handles frames in order on the loop; replies share one write."""
        self._in_batch = True
        try:
            for frame in frames:
                # Records of _agentix_worker (CallFrame, ArgsFrame, ...).
                kind = frame.kind
                if kind == _w.CALL:
                    self._on_call(frame)
                elif kind == _w.ARGS:
                    self._on_args(frame.call_id, frame.data, frame.received)
                elif kind == _w.STREAM_ACK:
                    self._on_stream_ack(frame.call_id, frame.index)
                elif kind == _w.CANCEL:
                    self._on_cancel(frame.call_id)
                elif kind == _w.NS_EVENT:
                    self._sync_streak = 0
                    _deliver_namespace_event(frame.namespace, frame.event,
                                             frame.data)
                elif kind == _w.SET_ENV:
                    self._channel.send_env_set(_apply_env(frame.entries))
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
        if threading.get_ident() != self._loop_thread:
            # An intake leader failing a call it was starting.
            self._reply_from_thread(call, ok, payload)
            return
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

    def _on_call(self, frame):
        """A CallFrame: starts the call, or waits for its arguments when
        frame.data is None (ARGS follows)."""
        call_id = frame.call_id
        if call_id in self._calls:
            _log(_WARNING, f"ignoring a second call frame for {call_id!r}")
            return
        call = _Call(call_id, frame.callable, frame.encoding, frame.total_size,
                     frame.context, frame.stream_window)
        self._calls[call_id] = call
        self.calls_started += 1
        data = frame.data
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

    def _start(self, call, data, pending=None):
        # Tasks created meanwhile copy this context; pool work runs in a copy
        # of it (_submit). Module imports by resolve_target() count as the call's.
        # The host's propagated context (agentix.context: baggage, registered
        # vars, trace scope) is attached the same way.
        token = _call_id.set(call.call_id)
        try:
            if not call.context:
                self._start_call(call, data, pending)
                return
            context = _context_module()
            if context is None:
                self._start_call(call, data, pending)
                return
            try:
                if call.context.startswith(_PLAIN_CONTEXT_MAGIC):
                    values = _plain_context(context, call.context)
                else:
                    values = context.decode(call.context)
            except BaseException as exc:
                self._finish(call, False, _error(exc, _INVALID_ARGUMENT, skip=1))
                return
            with context.attach(values):
                self._start_call(call, data, pending)
        finally:
            _call_id.reset(token)

    def _start_call(self, call, data, pending=None):
        """Checks, resolves and decodes, then starts the call: on the loop,
        as a task or on the pool; for an intake leader (`pending` a list),
        appended to `pending` as (call, context, fn, args, kwargs, sync)."""
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
            fn, coroutine = resolve_target(call.reference)
        except BaseException as exc:
            self._finish(call, False, _error(exc, _INVALID_ARGUMENT, skip=1))
            return
        try:
            args, kwargs = _decode_arguments(call.encoding, data)
        except _Failure as failure:
            self._finish(call, False, failure.error)
            return
        if pending is not None:  # an intake leader; never a stream
            pending.append((call, contextvars.copy_context(), fn, args, kwargs,
                            not coroutine))
        elif call.stream is not None:
            self._sync_streak = 0
            self._start_stream(call, fn, args, kwargs)
        elif coroutine:
            self._sync_streak = 0
            call.task = self._loop.create_task(
                self._run_coroutine(call, fn, args, kwargs))
        else:
            # Counts calls that ran alone (see _LEAD_AFTER_SYNC_CALLS).
            self._sync_streak = (self._sync_streak + 1
                                 if len(self._calls) <= 1 else 0)
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
        # _run_sync's steps, inline: one Python call less per sync call.
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:
            self._reply_from_thread(call, False, _error(exc, _UNKNOWN, skip=1))
            return
        encoding = call.encoding
        if value is None and encoding != _MSGPACK:
            self._reply_from_thread(call, True, _PICKLED_NONE)
        elif type(value) in _PLAIN_VALUES:  # neither awaitable nor a stream
            self._reply_from_thread(call, *_encode_result(encoding, value))
        elif _isawaitable(value):
            self._call_on_loop(self._await_on_loop, call, value)
        elif isinstance(value, _STREAM_ONLY):
            self._reply_from_thread(call, False,
                                    self._refuse_generator(call, value))
        else:
            self._reply_from_thread(call, *_encode_result(encoding, value))

    def _reply_from_thread(self, call, ok, payload):
        """_finish for a pool thread: sends, and flushes at once unless more
        sync calls wait for this thread: then the reply goes out with the
        next ones (every _REPLY_BATCH replies), or at the latest with the
        pool monitor's flush (STALL_SECONDS), one write for several replies."""
        if self._calls.pop(call.call_id, None) is not call:
            return  # cancelled meanwhile, or the worker is stopping
        try:
            if ok:
                self._channel.send_result(call.call_id, call.encoding, payload)
            else:
                _send_error(self._channel, call.call_id, payload)
            self._unflushed += 1
            if self._unflushed >= _REPLY_BATCH or not self._pool.waiting():
                self._unflushed = 0
                self._channel.flush()
        except _w.ChannelError as exc:
            self._call_on_loop(self._channel_failed, exc)

    def _arm_pool_monitor(self):
        """Any thread: the pool queued a sync call behind running ones; from
        STALL_SECONDS on, _pool_monitor watches the queue."""
        if (threading.get_ident() == self._loop_thread
                and not getattr(self._loop, "booting", False)):
            self._start_pool_monitor()
        else:
            # Before the event loop exists (serve._BootLoop: calls run from
            # the ready frame on) this starts it; the monitor needs it.
            self._call_on_loop(self._start_pool_monitor)

    def _start_pool_monitor(self):
        """Loop: the monitor's first look, STALL_SECONDS from now."""
        self._loop.call_later(STALL_SECONDS, self._pool_monitor)

    def _pool_monitor(self):
        """Loop: writes replies pool threads left queued, and lets the pool
        wake more threads if its queue stalled; again in STALL_SECONDS while
        calls are queued."""
        if self.exit_code is not None:
            return
        self._flush()
        if self._pool.monitor():
            self._loop.call_later(STALL_SECONDS, self._pool_monitor)

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
            self._call_on_loop(self._create_task, _aclose_quietly(value))
        return ("ResultEncodeError",
                f"remote target {call.reference!r} returned {what}; call it "
                "with remote_stream()", "", _INVALID_ARGUMENT)

    def _create_task(self, coroutine):
        """Loop: runs coroutine as a task (for pool threads, through
        _call_on_loop: self._loop may still be serve's boot stand-in)."""
        self._loop.create_task(coroutine)

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
        from asyncio import CancelledError
        try:
            value = await awaitable
        except CancelledError as exc:
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
        import inspect
        if inspect.isasyncgenfunction(fn) or _iscoroutinefunction(fn):
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
        if _isawaitable(value) or hasattr(type(value), "__aiter__"):
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
        from asyncio import CancelledError
        if _isawaitable(value):
            try:
                value = await value
            except CancelledError as exc:
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

    def _send_item(self, call, index, data):
        """Queues stream item `index`. None once queued; the stream's failure
        (False, error) for an item over the frame limit; the ChannelError if
        the channel failed (the caller reports it on the loop)."""
        try:
            self._channel.send_item(call.call_id, index, call.encoding, data)
        except (ValueError, MemoryError) as exc:
            return False, _item_too_large(index, exc)
        except _w.ChannelError as exc:
            return exc
        return None

    async def _produce_async(self, call, iterable):
        """Loop task: sends the items of an async iterable, then the
        terminal frame; closes the iterator if it stops before the iterator
        ended. Cancellation (the task's) ends it silently: the Cancelled
        error has been sent."""
        from asyncio import CancelledError
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
                failure = self._send_item(call, index, data)
                if failure is not None:
                    if isinstance(failure, _w.ChannelError):
                        self._channel_failed(failure)
                        failure = None
                    outcome = failure
                    break
                self._queued()
                index += 1
        except StopAsyncIteration:
            ended = True
            outcome = _encode_result(call.encoding, None)
        except CancelledError as exc:
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
                failure = self._send_item(call, index, data)
                if isinstance(failure, _w.ChannelError):
                    self._call_on_loop(self._channel_failed, failure)
                    break
                if failure is not None:
                    outcome = failure
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
        self._stop_intake_leaders()
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
        # Direct connections (docs/DIRECT-CALLS.md): the errors above went
        # to their hosts; then STATUS 14 on each (the host reconnects).
        try:
            self._channel.finish_direct(14, "the worker is shutting down")
        except _w.ChannelError:
            pass
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
        tasks = []
        if not getattr(self._loop, "booting", False):  # a loop was started
            import asyncio
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
