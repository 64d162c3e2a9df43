"""The thread pool that runs sync calls, and the record of one running call."""

import threading
import queue

import _agentix_worker as _w

from .common import _ERROR, _log, _text

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


class _LeadJob:
    """A pool thread's turn as the frame channel's reader (see
    _Worker._lead_intake): not a user function, so never counted by busy()
    and never withdrawn."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn


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
        # Threads are added by the loop thread and by intake leaders (pool
        # threads): the count check and the start must not interleave.
        self._grow = threading.Lock()

    def submit(self, fn, *args):
        job = _PoolJob(self, fn, args)
        try:
            self._idle.pop()
        except IndexError:
            self._add_thread()
        self._queued[job] = None
        self._jobs.put(job)
        return job

    def try_lead(self, fn):
        """Runs fn() on a thread that is idle now or can be started now, and
        returns True; False (nothing queued) when every thread is busy and
        max_threads run: fn must then not wait behind running calls."""
        if self._stopped:
            return False
        try:
            self._idle.pop()
        except IndexError:
            try:
                if not self._add_thread():
                    return False
            except RuntimeError:
                return False  # no more threads
        self._jobs.put(_LeadJob(fn))
        return True

    def run_inline(self, fn, *args):
        """Runs a user function on the calling pool thread (an intake leader
        that handed the reading on), counted by busy() like a job. Never
        raises."""
        token = _PoolJob(self, fn, args)
        self._running.add(token)
        try:
            fn(*args)
        except BaseException as exc:  # the job functions never raise
            _log(_ERROR, f"sync call pool: {_text(exc)}")
        finally:
            self._running.discard(token)
            token.fn = token.args = None

    def _add_thread(self):
        """Starts a thread if fewer than max_threads run; whether it did.
        May raise RuntimeError (no more threads): nothing counted then."""
        with self._grow:
            if len(self._threads) >= self._max_threads:
                return False
            thread = threading.Thread(
                target=self._serve, daemon=True,
                name=f"agentix-call_{len(self._threads)}")
            thread.start()
            self._threads.append(thread)
            return True

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
            if type(job) is _LeadJob:
                try:
                    job.fn()
                except BaseException as exc:  # _lead_intake never raises
                    _log(_ERROR, f"frame intake: {_text(exc)}")
                job = None
                if self._stopped:
                    return
                self._idle.append(None)
                continue
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
