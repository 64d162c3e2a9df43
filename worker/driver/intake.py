"""Leader/follower intake: while sync calls come one at a time, a pool thread
reads the frame channel and runs the sync call it read itself (one wake-up
less per call than the loop reading and handing it over). A mixin of
_Worker (worker.py); see worker/README.md, "Leader/follower intake"."""

import contextvars
import os

import _agentix_worker as _w

from .calls import (_NO_ARGUMENTS, _Call, _Failure, _decode_arguments,
                    resolve_target)
from .common import (_DEBUG, _ERROR, _INVALID_ARGUMENT, _PICKLE, _UNKNOWN,
                     _WARNING, _call_id, _log, _text)
from .env import _apply_env
from .errors import _error

# The loop hands the frame channel to a pool thread (leader/follower, see
# _Worker._lead_intake) after this many sync calls in a row, each the only
# call in flight. Each time the pool gives it back because calls overlapped
# after fewer than _LEAD_SETTLED calls, the loop waits for twice as many
# (up to _LEAD_AFTER_MAX): concurrent callers whose calls only sometimes
# overlap would otherwise make the channel change hands every few calls.
_LEAD_AFTER_SYNC_CALLS = 2
_LEAD_AFTER_MAX = 4096
_LEAD_SETTLED = 256


def _lead_enabled():
    """Leader/follower intake unless $AGENTIX_WORKER_INTAKE is "loop"."""
    value = os.environ.get("AGENTIX_WORKER_INTAKE", "lead").strip().lower()
    if value not in ("lead", "loop", ""):
        _log(_WARNING, f"AGENTIX_WORKER_INTAKE={value!r} is not 'lead' or "
             "'loop'; using 'lead'")
    return value != "loop"


class _InlineTask:
    """call.task of a sync call its intake leader runs itself: like a
    started pool job, cancel() does nothing (the reply is dropped)."""

    __slots__ = ()

    def cancel(self):
        pass


_INLINE = _InlineTask()


class _LeaderIntake:
    """The intake half of _Worker: every method here uses its state."""

    def _hand_intake_to_pool(self):
        """Loop: lets a pool thread read the channel instead (one wake-up
        less per sync call), if one is free now."""
        fd = self._channel.fileno()
        try:
            self._channel.intake_to_pool()
        except OSError as exc:
            _log(_WARNING, f"leader/follower intake off: {_text(exc)}")
            self._lead_on = False
            return
        self._loop.remove_reader(fd)
        self._led = 0
        if not self._pool.try_lead(self._lead_intake):
            self._channel.intake_to_loop()
            self._loop.add_reader(fd, self.on_readable)

    def prepare_boot_intake(self):
        """Main thread, before the ready frame and the event loop: pool mode
        on, and a follower waiting, so that after ready (lead_from_boot) the
        first call's reader hands the baton on without starting a thread
        before it runs the call (a thread start is 0.1 ms on a quiet
        machine, 5-10 ms when page faults are slow). Whether the pool may
        read the channel from ready on (serve.py, worker cold start)."""
        if not self._lead_on:
            return False
        try:
            self._channel.intake_to_pool()
        except OSError as exc:
            _log(_WARNING, f"leader/follower intake off: {_text(exc)}")
            self._lead_on = False
            return False
        self._led = 0
        self._pool.try_lead(self._follow_intake)
        return True

    def lead_from_boot(self):
        """Main thread, right after the ready frame: a pool thread reads the
        channel from now on, so sync calls run before asyncio is imported.
        False (the loop must read) if no thread could start."""
        if self._pool.try_lead(self._lead_intake):
            return True
        self._channel.intake_to_loop()
        return False

    def _follow_intake(self):
        """Pool thread: waits as the intake's follower (lead_from_boot)."""
        self._lead_intake(holding=False)

    def adopt_loop(self, loop):
        """Main thread: the event loop now exists; serve.py's stand-in
        passes on whatever it was handed."""
        self._loop = loop

    def resume_loop_intake(self, frames, overlapped=False):
        """Loop: takes the channel back from the last intake leader and
        handles the frames it left (in order; None: the end of the stream,
        which the loop's read sees again), then reads on. `overlapped`:
        given back because calls overlapped."""
        self._sync_streak = 0
        if overlapped and self._led < _LEAD_SETTLED:
            self._lead_after = min(2 * self._lead_after, _LEAD_AFTER_MAX)
        elif self._led >= _LEAD_SETTLED:
            self._lead_after = _LEAD_AFTER_SYNC_CALLS
        if self.exit_code is not None:
            return
        if frames:
            self._dispatch(frames)
            if self.exit_code is not None:
                return
        try:
            self._loop.add_reader(self._channel.fileno(), self.on_readable)
        except Exception as exc:  # the loop is closing
            _log(_DEBUG, f"cannot read the channel again: {_text(exc)}")
        # on_readable reads what is there, an end of stream included.

    def _to_loop(self, frames, overlapped=False):
        """Intake leader: the loop reads from now on, starting with
        `frames` (the rest of a batch, in order). Followers leave."""
        self._channel.intake_to_loop()
        self._call_on_loop(self.resume_loop_intake, frames, overlapped)

    def _lead_intake(self, holding=True):
        """Pool thread: the channel's reader while it holds the intake baton
        (channel/intake_baton.h). Waits for frames (GIL released), starts
        the calls among them, and runs the last sync one itself after
        offering the baton to the follower (taken if the call still runs
        after 1 ms; with no follower waiting, passed to a fresh pool thread;
        if none is free, the loop reads on), so a long call never holds up
        the next frames for long; then polls on if the baton is still its
        own, or waits as a follower. A set_env before any call is
        applied here too. Anything else (cancels, acks, namespace events,
        coroutine or streaming calls, chunked arguments, end of stream,
        errors) goes to the loop with the rest of its batch, in order, and
        the loop reads on. Never raises."""
        try:
            self._lead(holding)
        except BaseException as exc:
            # Not expected (the steps below catch what they may raise). If
            # the baton was still ours the loop must read on; if not, the
            # loop reading too is harmless once the followers left.
            _log(_ERROR, f"frame intake: {_text(exc)}; the loop reads on")
            self._intake_reading = False
            self._to_loop(())

    def _lead(self, holding):
        channel = self._channel
        lead = channel.intake_lead
        read_frames = channel.read_frames
        while True:
            if lead(holding) != 0 or self.exit_code is not None:
                return  # not needed (another reads), or stopping
            holding = True
            self._intake_reading = True  # until the batch's calls are known
            try:
                frames = read_frames()
            except (_w.ProtocolError, OSError) as exc:
                self._intake_reading = False
                channel.intake_to_loop()
                self._call_on_loop(self._read_failed, exc)
                return
            if frames is None:  # end of stream: the loop reads it again
                self._intake_reading = False
                self._to_loop(None)
                return
            pending = []
            rest = ()
            for i, frame in enumerate(frames):
                if (frame.kind == _w.SET_ENV and not pending
                        and not self._calls and self.exit_code is None):
                    self._lead_set_env(frame)
                    continue
                if (frame.kind != _w.CALL or frame.data is None
                        or frame.stream_window or self.exit_code is not None):
                    rest = frames[i:]
                    break
                self._lead_call(frame, pending)
            # Calls are in _calls now; the rest of the batch goes to the
            # loop, which counts as not idle (serve.py's `needed`).
            self._intake_reading = False
            if (len(pending) == 1 and not rest and pending[0][5]
                    and len(self._calls) == 1):
                # One sync call, alone in flight (the common case): it runs
                # here; _lead_batch would come to the same.
                inline, to_loop, overlapped = pending[0], False, False
            else:
                inline, to_loop, overlapped = self._lead_batch(pending, rest)
            if inline is None and not to_loop:
                continue  # nothing to run (errors answered): read on
            if inline is not None:
                inline[0].task = _INLINE
            # The baton goes on last: until here, a failure leaves it ours.
            if to_loop:
                self._to_loop(rest, overlapped)
                return
            # Offered, not passed: the follower takes the baton only if the
            # call still runs after IntakeBaton::kDeferBound (1 ms), so a
            # short call wakes no second thread. With no follower waiting,
            # a fresh reader starts now, as before.
            if not (channel.intake_defer() or channel.intake_pass()
                    or self._pool.try_lead(self._lead_intake)):
                self._to_loop(())
            call, context, fn, args, kwargs, _ = inline
            self._led += 1
            self._pool.run_inline(context.run, self._run_pooled, call, fn,
                                  args, kwargs)
            # The call's arguments and its frame's bytes go now, not when
            # the next frames come (maybe never): a large argument would
            # keep its pages.
            frames = frame = pending = inline = None
            call = context = fn = args = kwargs = None
            # Still ours if not taken: poll on; else a follower now.
            holding = channel.intake_reclaim()

    def _lead_batch(self, pending, rest):
        """Intake leader: starts the calls of a batch that `_lead` does not
        run itself; returns (the call to run inline or None, whether the
        loop reads on, whether calls overlapped)."""
        # Calls one at a time gain from running where they were read; with
        # several in flight the hand-over would be paid per batch and
        # compete with the running calls for the GIL: the loop reads then.
        overlapped = len(self._calls) > 1
        to_loop = bool(rest) or overlapped
        runs = []
        for entry in pending:
            call, context, fn, args, kwargs, sync = entry
            if sync:
                runs.append(entry)
            else:  # a coroutine function: the workload wants the loop
                to_loop = True
                self._call_on_loop_in(context, self._start_on_loop, call,
                                      fn, args, kwargs)
        # The last sync call runs here, unless the batch goes on to the
        # loop: then every call goes to the pool, as the loop would have
        # sent it (a call queued behind busy threads can still be
        # withdrawn by a cancel later in the batch).
        inline = runs.pop() if runs and not to_loop else None
        for call, context, fn, args, kwargs, _ in runs:
            try:
                call.task = self._pool.submit(
                    context.run, self._run_pooled, call, fn, args, kwargs)
            except RuntimeError as exc:  # no thread could be started
                self._reply_from_thread(call, False,
                                        _error(exc, _UNKNOWN, skip=1))
        return inline, to_loop, overlapped

    def _lead_set_env(self, frame):
        """Intake leader: applies a set_env frame (SandboxAdmin.Activate's
        env, sent before any call) here rather than on the loop, so that a
        claimed or just-activated sandbox's first call does not wait for
        `import asyncio` (worker cold start). No call is in flight, so no
        user code reads the environment meanwhile."""
        # Activity for serve.py's idle test, before anything that may let
        # the GIL go (the call read with it may not have started yet).
        self.calls_started += 1
        try:
            self._channel.send_env_set(_apply_env(frame.entries))
            self._channel.flush()
        except _w.ChannelError as exc:
            self._call_on_loop(self._channel_failed, exc)

    def _lead_call(self, frame, pending):
        """Intake leader: _on_call for a call frame with its arguments; the
        started call goes to `pending` instead of the pool or the loop."""
        call_id = frame.call_id
        if call_id in self._calls:
            _log(_WARNING, f"ignoring a second call frame for {call_id!r}")
            return
        call = _Call(call_id, frame.callable, frame.encoding, frame.total_size,
                     frame.context, 0)
        self._calls[call_id] = call
        self.calls_started += 1
        data = frame.data
        call.received = len(data)
        if (frame.context or call.encoding != _PICKLE
                or call.received != call.total_size):
            self._start(call, data, pending)
            return
        # The common case (pickled arguments, all here, no propagated
        # context): _start and _start_call's steps, without their checks
        # and calls (a sequential noop's worker CPU, issue 25).
        token = _call_id.set(call_id)
        try:
            try:
                fn, coroutine = resolve_target(call.reference)
            except BaseException as exc:
                self._finish(call, False, _error(exc, _INVALID_ARGUMENT, skip=1))
                return
            if data == _NO_ARGUMENTS:
                args, kwargs = (), {}
            else:
                try:
                    args, kwargs = _decode_arguments(_PICKLE, data)
                except _Failure as failure:
                    self._finish(call, False, failure.error)
                    return
            pending.append((call, contextvars.copy_context(), fn, args, kwargs,
                            not coroutine))
        finally:
            _call_id.reset(token)

    def _call_on_loop_in(self, context, fn, *args):
        try:
            self._loop.call_soon_threadsafe(fn, *args, context=context)
        except RuntimeError:
            pass  # the loop is closed: the worker is exiting

    def _start_on_loop(self, call, fn, args, kwargs):
        """Loop: starts a coroutine call an intake leader set up."""
        if self._calls.get(call.call_id) is call:
            call.task = self._loop.create_task(
                self._run_coroutine(call, fn, args, kwargs))

    def _stop_intake_leaders(self):
        self._channel.intake_stop()
