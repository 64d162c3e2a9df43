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
