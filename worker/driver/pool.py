"""The thread pool that runs sync calls, and the record of one running call."""

import collections
import threading
import time
import queue

import _agentix_worker as _w

from .common import _ERROR, _log, _text

# How often the loop looks at the queue while sync calls wait in it: if no
# queued call started in this time, the running ones block and more threads
# are woken (see _SyncPool).
STALL_SECONDS = 0.001
# Queued calls that do start, but slowly (each blocks a little), get more
# threads once the oldest has waited this long.
_SLOW_SECONDS = 0.01

# A pool thread's wake-up token: drain the queue. (Anything else put on the
# wake-up queue is a _LeadJob to run, or None: stop.)
_RUN = object()


class _PoolJob:
    """One sync callable queued on a `_SyncPool`: `cancel()` before it starts
    and it never runs; once it runs, cancel() does nothing (the call's reply
    is dropped instead, see _Worker._finish)."""

    __slots__ = ("pool", "fn", "args", "queued_at")

    def __init__(self, pool, fn, args):
        self.pool = pool
        self.fn = fn
        self.args = args
        self.queued_at = 0.0

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
    needed, named for the OS as agentix-call.

    Jobs go into one queue that awake threads drain, each running one job
    after another. A job queued while a thread drains wakes no thread, so
    many short calls in flight cost a thread wake-up per burst, not one per
    call, and the threads do not pass the GIL round among themselves. So
    that a job never waits long behind a running one that blocks, the loop
    calls monitor() every STALL_SECONDS while jobs wait (`arm` starts that,
    see __init__): if no queued job started since the last look (the
    draining threads block), or the oldest has waited _SLOW_SECONDS (they
    are slow), as many more threads as drain already (up to one per
    waiting job and max_threads in all) are woken. A burst of short calls
    thus stays on one thread, and blocking ones spread over the pool within
    a few STALL_SECONDS (1, 2, 4, ... threads). What it keeps from ThreadPoolExecutor: jobs start in
    order, up to max_threads run at once, a job cancelled before it starts
    never runs, and shutdown() stops idle threads without waiting for
    running ones. The threads are daemon threads: an idle one never holds
    up the interpreter's exit (finish() finalises only when none is busy).
    No Future, no done callbacks: submit() costs ~1 us of the loop thread
    (docs/PERFORMANCE.md, "Per-call work trimmed").
    """

    def __init__(self, max_threads, arm=None):
        self._max_threads = max_threads
        # arm(): called on the submitting thread when a job was queued behind
        # draining threads and `armed` was False (it is True from then on):
        # it must have monitor() called about STALL_SECONDS later (and again
        # while monitor() returns True). None: nothing watches for stalls.
        self._arm = arm
        self.armed = False
        self._work = collections.deque()  # jobs in order (cancelled ones too)
        self._wake = queue.SimpleQueue()  # _RUN, a _LeadJob or None each
        self._queued = {}  # jobs not started yet (claimed by pop: run or cancel)
        self._running = set()  # jobs whose function is running
        self._threads = []
        self._stopped = False
        # Guards _draining and _idle, and every thread's choice between taking
        # a job and going idle: a thread goes idle only after it saw _work
        # empty under the lock, so a job queued meanwhile either finds a
        # thread draining or wakes one.
        self._lock = threading.Lock()
        self._draining = 0  # threads draining _work, or woken to
        self._started = 0  # jobs taken from _work
        self._seen_started = 0  # _started at the last arm() or monitor()
        self._idle = 0  # threads waiting on _wake that no wake-up is meant for
        # Threads are started by the loop thread and by intake leaders (pool
        # threads): the count check and the start must not interleave.
        self._grow = threading.Lock()

    def submit(self, fn, *args):
        """Queues fn(*args); returns its _PoolJob. Raises RuntimeError if no
        thread runs and none could be started (nothing queued then)."""
        job = _PoolJob(self, fn, args)
        job.queued_at = time.monotonic()
        self._queued[job] = None
        with self._lock:
            self._work.append(job)
            if self._draining:
                if self.armed or self._arm is None:
                    return job
                self.armed = True
                self._seen_started = self._started
                wake = False
            else:
                self._draining = 1
                wake = True
                idle = self._idle > 0
                if idle:
                    self._idle -= 1
        if not wake:
            self._arm()
        elif not idle:
            try:
                self._start_drainer()
            except RuntimeError:
                with self._lock:
                    try:
                        self._work.remove(job)
                    except ValueError:
                        return job  # a thread back from leading took it
                self._queued.pop(job, None)
                raise
        else:
            self._wake.put(_RUN)
        return job

    def monitor(self):
        """Loop, STALL_SECONDS after arm() and then as long as it returns
        True: wakes more threads if no queued job started since the last
        call or the oldest has waited _SLOW_SECONDS (the draining ones block,
        or are too few). Returns whether to be called again (jobs are still
        queued)."""
        with self._lock:
            if not self._work or self._stopped:
                self.armed = False
                return False
            progressed = self._started != self._seen_started
            self._seen_started = self._started
            if progressed and (time.monotonic() - self._work[0].queued_at
                               < _SLOW_SECONDS):
                return True
            more = min(len(self._work), max(self._draining, 1))
            self._draining += more
            idle = min(self._idle, more)
            self._idle -= idle
        for _ in range(idle):
            self._wake.put(_RUN)
        for _ in range(more - idle):
            try:
                self._start_drainer()
            except RuntimeError:
                pass  # no more threads now (uncounted): next time
        return True

    def waiting(self):
        """True while jobs are queued and monitor() will be called: a thread
        replying may leave its reply unflushed (monitor's caller flushes)."""
        return self.armed and bool(self._work)

    def _start_drainer(self):
        """Starts a thread to drain the queue, counted in _draining already;
        if max_threads run, uncounts it (the busy ones drain when done). May
        raise RuntimeError (no more threads): uncounted then too."""
        try:
            started = self._add_thread()
        except RuntimeError:
            with self._lock:
                self._draining -= 1
            raise
        if started:
            self._wake.put(_RUN)  # for the new thread, or an idle one
        else:
            with self._lock:
                self._draining -= 1

    def try_lead(self, fn):
        """Runs fn() on a thread that is idle now or can be started now, and
        returns True; False (nothing queued) when every thread is busy and
        max_threads run: fn must then not wait behind running calls."""
        if self._stopped:
            return False
        with self._lock:
            idle = self._idle > 0
            if idle:
                self._idle -= 1
        if not idle:
            try:
                if not self._add_thread():
                    return False
            except RuntimeError:
                return False  # no more threads
        self._wake.put(_LeadJob(fn))
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
        with self._lock:
            self._work.clear()
        for _ in self._threads:
            self._wake.put(None)

    def _serve(self):
        _w.set_thread_name("agentix-call")
        get, lock, work = self._wake.get, self._lock, self._work
        while (token := get()) is not None:
            if type(token) is _LeadJob:
                try:
                    token.fn()
                except BaseException as exc:  # _lead_intake never raises
                    _log(_ERROR, f"frame intake: {_text(exc)}")
                token = None
                # Back from leading: jobs queued meanwhile may count on us.
                with lock:
                    drain = bool(work) and not self._stopped
                    if drain:
                        self._draining += 1
                    else:
                        self._idle += 1
                if not drain:
                    continue
            self._drain()
            if self._stopped:
                return

    def _drain(self):
        """Runs queued jobs in order until none is left, then counts this
        thread idle."""
        lock, work, queued, running = (self._lock, self._work, self._queued,
                                       self._running)
        while True:
            with lock:
                if not work or self._stopped:
                    self._draining -= 1
                    self._idle += 1
                    return
                job = work.popleft()
                self._started += 1
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


_CANCELLED_JOB = object()
