"""Where the event loop's thread runs while it waits for the daemon
(``AGENTIX_CALLS_CPU``; docs/FRAME-WIRE.md, "Wake-ups").

A sequential call's hand-offs (host -> daemon -> worker and back) each wake a
thread; on an idle machine one woken on another, halted CPU costs a
cross-CPU wake-up (tens of microseconds) per hop. With the daemon's call
path on one CPU (``--calls_cpu``, or the HELLO key `CALLS_CPU_KEY`), the
host's loop thread waiting on that CPU too makes every hop a same-CPU one.

The settings (`calls_cpu_setting`):

- ``off``: nothing.
- ``wait`` (pinned waits): while exactly one `RuntimeClient.remote` call of
  the loop's thread is in flight, the thread is pinned to the CPU only while
  the loop blocks in its selector waiting for the daemon, and gets its own
  mask back as soon as the selector returns (`PinnedWaits`, `_PinningSelector`;
  not at all when an event is in already and the select will not block):
  no code runs pinned, so nothing the loop runs meanwhile (other tasks,
  threads or processes they start, which inherit the mask of the thread
  that starts them) is confined to that CPU. Before it pins, the thread
  yields its CPU once (``AGENTIX_WAIT_YIELD``, `wait_yield_setting`): the
  call path's thread that its send woke there is often still runnable, and
  finishing first it leaves the result in with no pin and no wake-up. The
  CPU is the one the thread is on when it first connects; ``wait:N`` /
  ``wait:auto`` name one (``auto``: the highest this process may use, as
  the daemon's ``--calls_cpu=auto``). A loop without a selector of its own
  (uvloop) gets no pinned waits.
- ``N`` / ``auto``: the loop thread is pinned to that CPU for good when its
  Calls stream connects (it then runs the user's code there too).

Unset or empty is `DEFAULT_SETTING`, which also follows the daemon: a Calls
frame-wire HELLO asks (`CALLS_CPU_FOLLOW_KEY`), and a daemon run with
``--calls_cpu=probe`` (its default since stop 32) answers whether pinning the
host's waits pays on this machine, and again whenever a later probe changes
that answer (`PinnedWaits.follow`). While the daemon says pin, the default
also times the thread's own sequential calls both ways now and then and
keeps the faster (`PinTrial`): the probe's round trips of two bare threads
do not show what a real call's two processes do on either side of a
hand-off. A setting named explicitly is not changed by the daemon or by the
trials.
"""

from __future__ import annotations

import asyncio
import logging
import os
import selectors
import statistics
import threading
import time
from time import perf_counter_ns as _clock_ns
from typing import Any, NamedTuple

from agentix.runtime.client.loop_slice import set_thread_slice

_log = logging.getLogger("agentix.runtime.client")

__all__ = [
    "CALLS_CPU_ENV",
    "CALLS_CPU_FOLLOW_CHANGES",
    "CALLS_CPU_FOLLOW_KEY",
    "CALLS_CPU_KEY",
    "CallsCpu",
    "DEFAULT_SETTING",
    "PinTrial",
    "PinnedWaits",
    "WAIT_YIELD_ENV",
    "calls_cpu_setting",
    "converse",
    "current_cpu",
    "follow_daemon",
    "pinned_waits",
    "run_queue_wait_ns",
    "wait_yield_setting",
]

CALLS_CPU_ENV = "AGENTIX_CALLS_CPU"
# The HELLO key of a Calls frame-wire connection naming the CPU the host
# waits on (decimal): the daemon places its call path there (docs/FRAME-WIRE.md).
CALLS_CPU_KEY = "agentix-calls-cpu"
# The HELLO key asking the daemon to say (a HELLO frame of its own, with
# CALLS_CPU_KEY "wait" or "off") whether the host should pin its waits; its
# value CALLS_CPU_FOLLOW_CHANGES asks for every later change of that answer
# too (a re-probe's; stop 31's hosts sent "1": the first answer only).
CALLS_CPU_FOLLOW_KEY = "agentix-calls-cpu-follow"
CALLS_CPU_FOLLOW_CHANGES = "2"
# What an unset or empty AGENTIX_CALLS_CPU means: pinned waits since stop 25
# (quiet noop p50 0.49x off, calls/s at 64 callers unchanged; PERFORMANCE.md).
DEFAULT_SETTING = "wait"

# The back-off, as the C++ client's PinBudget (host/cc/agentix/calls_cpu.h)
# and base::PinBackoff: one pin in TIME_EVERY is timed, the loop thread's
# run-queue wait (time runnable, not running) from the pin to the unpin;
# every TIMED_PER_JUDGEMENT timed pins, above BUSY_WAIT_NS on average its
# CPU is busy with other work and waiting there costs more than a cross-CPU
# wake-up saves, so it does not pin for BACKOFF_FIRST_S, doubled (up to
# BACKOFF_LONGEST_S) while the first judgement after a back-off is still
# busy. Only pinned waits count: what the thread queues for a CPU elsewhere
# (the user's code, other clients' calls) says nothing of what pinning costs.
# A busy judgement whose pins came BURST_PINS_PER_CALL or more per call started
# (a burst of records or stream items woke the loop while a call ran: the call
# path's own traffic queued the thread, not another process's) rests only until
# no call is in flight, if that comes first: the next sequential call after a
# burst waits pinned again at once. For the same reason a burst's timed pins
# leave the judgement when it ends (no call in flight after BURST_PINS_PER_CALL
# or more pins since one was): a window that began in a burst of records and
# ended in the next call's sequential waits (namespace requests after a span
# burst) judged that call by the burst's queueing and left it unpinned for good.
TIME_EVERY = 16
TIMED_PER_JUDGEMENT = 16
BUSY_WAIT_NS = 40_000  # base::PinBackoff::kWaitPerCall
BACKOFF_FIRST_S = 1.0
BACKOFF_LONGEST_S = 64.0
BURST_PINS_PER_CALL = 16

# The yield before a pinned wait (stop 47; docs/PERFORMANCE.md "stop-47: the
# host yields before it pins"). On the pinned call path the send wakes the
# worker's thread on this CPU; when the loop gets to its selector first (the
# worker did not preempt it, or a tick gave the CPU back mid-call), one
# sched_yield lets that thread finish the call, and the result is in: no
# sched_setaffinity pair, no sleep and wake-up (a quiet noop 0.91x, host CPU
# 0.85x). With nothing else runnable here the yield returns at once (~1 us,
# then the pinned wait as before). With another busy thread on this CPU it
# may run that thread for up to a tick (4 ms here) instead: a yield that
# takes YIELD_SLOW_S or more stops the yields for YIELD_REST_FIRST_S, doubled
# (up to YIELD_REST_LONGEST_S) while one comes that slow again within a rest
# period of the last rest's end.
WAIT_YIELD_ENV = "AGENTIX_WAIT_YIELD"
YIELD_SLOW_S = 0.001
YIELD_REST_FIRST_S = 1.0
YIELD_REST_LONGEST_S = 64.0

# The trials of the default setting (stop 68; docs/DECISIONS.md "stop-68: the
# host times its own calls pinned and unpinned"). The daemon's probe says pin
# when a round trip of two bare threads is cheaper on one CPU than across two
# by more than the pins cost; on this VM at stop 68 it said so (10 against
# 21 us, pins ~7) while the real noop took 64 us pinned and 49 unpinned: two
# processes spread over two CPUs overlap what each does after a hand-off.
# So the thread's lone calls are timed: a trial is TRIAL_BLOCKS blocks of
# TRIAL_BLOCK calls, pinned and unpinned in turn, the first TRIAL_SKIP of
# each block not timed (the calls right after a switch still run where the
# other way left the threads: untimed, the trial's two medians came out
# 0.90-0.96 apart where the steady ones were 0.82); unpinned wins when its
# median is under TRIAL_MARGIN times the pinned one (pinned stays on a tie:
# its rare slow calls are fewer). The first trial comes after
# TRIAL_FIRST_AFTER lone calls (connecting and warming up are not timed),
# the next TRIAL_FIRST_EVERY_S after it ended, at the next lone call, each
# later one twice as long after the last (up to TRIAL_EVERY_S): the first
# trial often meets a moment that is not the machine's usual (the daemon's
# probes, a worker still warming up), as the daemon's re-probes do.
TRIAL_BLOCK = 48
TRIAL_SKIP = 8
TRIAL_BLOCKS = 6
TRIAL_MARGIN = 0.95
TRIAL_FIRST_AFTER = 64
TRIAL_FIRST_EVERY_S = 1.0
TRIAL_EVERY_S = 32.0


class CallsCpu(NamedTuple):
    """A parsed ``AGENTIX_CALLS_CPU``: `mode` is ``off``, ``wait`` or
    ``always``; `cpu` the CPU (None for ``off``, and for ``wait`` without
    one: the thread's current CPU)."""

    mode: str
    cpu: int | None
    follow: bool = False  # the default: the daemon may say not to pin


_OFF = CallsCpu("off", None)
_DEFAULT = CallsCpu(DEFAULT_SETTING, None, follow=True)


def calls_cpu_setting(value: str | None = None) -> CallsCpu:
    """Parses `value` (default: ``AGENTIX_CALLS_CPU``; unset or empty is
    `DEFAULT_SETTING`). ValueError for anything else than the settings of
    the module docstring, or a CPU this thread may not run on."""
    if value is None:
        value = os.environ.get(CALLS_CPU_ENV, "")
    setting = value.strip().lower()
    if not setting:
        return _DEFAULT
    if setting == "off":
        return _OFF
    mode, colon, cpu_text = setting.partition(":")
    if mode == "wait":
        return CallsCpu("wait", _cpu(cpu_text, setting) if colon else None)
    if colon:
        raise ValueError(f"{CALLS_CPU_ENV}={setting!r} is not off, wait[:CPU], auto or a CPU number")
    return CallsCpu("always", _cpu(mode, setting))


def _cpu(text: str, setting: str) -> int:
    allowed = os.sched_getaffinity(0)
    if text == "auto":
        return max(allowed)
    if not text.isdigit():
        raise ValueError(f"{CALLS_CPU_ENV}={setting!r} is not off, wait[:CPU], auto or a CPU number")
    cpu = int(text)
    if cpu not in allowed:
        raise ValueError(f"{CALLS_CPU_ENV}={cpu} is not a CPU this process may run on ({sorted(allowed)})")
    return cpu


def wait_yield_setting(value: str | None = None) -> bool:
    """Whether a thread with pinned waits yields once before it pins (`value`,
    default ``AGENTIX_WAIT_YIELD``: unset, empty, ``on`` or ``1`` yes; ``off``
    or ``0`` no). ValueError for anything else."""
    if value is None:
        value = os.environ.get(WAIT_YIELD_ENV, "")
    setting = value.strip().lower()
    if setting in ("", "on", "1"):
        return True
    if setting in ("off", "0"):
        return False
    raise ValueError(f"{WAIT_YIELD_ENV}={setting!r} is not on or off")


def current_cpu() -> int:
    """The CPU the calling thread last ran on (field 39 of its
    /proc/thread-self/stat; read once per thread, so no native call)."""
    with open("/proc/thread-self/stat", "rb") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces: count fields after its ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[36])


class PinTrial:
    """Whether a thread's lone calls wait pinned, measured on those calls.

    `pins_now` says how the next lone call waits; `begin` and `end` (with
    the call's round trip in ns; it waited as `pins_now` said, which only
    `end` changes) feed it the thread's
    lone calls only (no overlap, no stream, no namespace traffic, no
    back-off rest: a call whose wait could not be what `pins_now` said).
    Between trials it keeps the last trial's answer (`pin`; True before
    the first); `last` is that trial's (pinned, unpinned) medians in us."""

    __slots__ = ("pin", "last", "_block", "_in_block", "_samples", "_lone_calls", "_next_at", "_every")

    def __init__(self) -> None:
        self.pin = True
        self.last: tuple[float, float] | None = None
        self._block = -1  # the running trial's block (even: pinned); -1: no trial
        self._in_block = 0
        self._samples: tuple[list[int], list[int]] = ([], [])  # (unpinned, pinned) round trips, ns
        self._lone_calls = 0
        self._next_at: float | None = None  # time.monotonic() the next trial is due; None: the first
        self._every = TRIAL_FIRST_EVERY_S  # from the end of the next trial to the one after it

    @property
    def running(self) -> bool:
        return self._block >= 0

    def pins_now(self) -> bool:
        return self._block % 2 == 0 if self._block >= 0 else self.pin

    def begin(self, now: float) -> None:
        """A lone call starts (`now`: time.monotonic()): a trial starts with it when one is due."""
        if self._block >= 0:
            return
        self._lone_calls += 1
        due = self._lone_calls > TRIAL_FIRST_AFTER if self._next_at is None else now >= self._next_at
        if due:
            self._block, self._in_block = 0, 0
            self._samples = ([], [])

    def end(self, took_ns: int, now: float) -> None:
        """A lone call that `begin` saw ended after `took_ns`."""
        if self._block < 0:
            return
        if self._in_block >= TRIAL_SKIP:
            self._samples[self.pins_now()].append(took_ns)
        self._in_block += 1
        if self._in_block < TRIAL_BLOCK:
            return
        self._block, self._in_block = self._block + 1, 0
        if self._block < TRIAL_BLOCKS:
            return
        unpinned, pinned_ = (statistics.median(times) / 1e3 for times in self._samples)
        pin = not unpinned < TRIAL_MARGIN * pinned_
        if pin != self.pin or self.last is None:
            _log.debug("pinned waits: a trial of the thread's lone calls keeps them %s "
                       "(median %.1f us pinned, %.1f us unpinned)",
                       "pinned" if pin else "unpinned", pinned_, unpinned)
        self.pin = pin
        self.last = (pinned_, unpinned)
        self._block = -1
        self._next_at = now + self._every
        self._every = min(self._every * 2, TRIAL_EVERY_S)


class PinnedWaits:
    """Pins one thread (the event loop's) to `cpu` while exactly one call of
    its is in flight; `original` is the mask it gets back.

    `hold` when a call starts, `release` (always, in a ``finally``) when its
    awaiting coroutine resumes: 0 -> 1 calls in flight arms the pin, 1 -> 0
    and 1 -> 2 (overlap) disarm it. `hold(pin=False)` (a streaming call,
    whose consumer runs user code between items) counts as in flight but
    never arms it. Armed, the loop's selector pins the thread before a
    blocking ``select`` and unpins it when it returns (`before_select`,
    `after_select`): one ``sched_setaffinity`` each. While its CPU is busy
    with other work it rests (pins nothing) for a back-off period
    (`TIME_EVERY`). Before a pin the selector first yields the CPU once
    (`yield_first`, unless `yields` is False).
    """

    __slots__ = ("cpu", "original", "in_flight", "armed", "pinned", "resting_until", "told_off", "_cpu_set",
                 "_thread", "_pins", "_timed_at", "_timed", "_timed_ns", "_judged", "_period",
                 "_after_backoff", "_calls", "_window_calls", "_window_pins", "_burst_rest",
                 "_busy_since", "yields", "_yield_rest_until", "_yield_rest_ended", "_yield_period",
                 "trial", "_lone", "_lone_at")

    def __init__(self, cpu: int, original: set[int], yields: bool = True) -> None:
        self.cpu = cpu
        self.original = frozenset(original)
        self._cpu_set = {cpu}
        self.in_flight = 0
        self.armed = False  # one call in flight: its waits are pinned
        self.pinned = False
        self._thread = threading.get_ident()
        self.resting_until = 0.0  # time.monotonic() of the back-off's end; 0: none
        self.told_off = False  # a daemon said pinning does not pay here (`follow`)
        self._pins = 0
        self._timed_at = -1  # run-queue wait (ns) when a timed pin was made; -1: none
        self._timed = 0  # timed pins since the last judgement
        self._timed_ns = 0  # and their run-queue wait
        self._judged = False  # past the first judgement
        self._period = BACKOFF_FIRST_S
        self._after_backoff = False
        self._calls = 0  # holds so far
        self._window_calls = 0  # _calls and _pins when the current judgement's window began
        self._window_pins = 0
        self._burst_rest = False  # the rest ends when no call is in flight
        # Since calls went in flight (or the last judgement, if later): _pins,
        # _timed and _timed_ns then, to take a burst's out of the judgement.
        self._busy_since = (0, 0, 0)
        self.yields = yields  # yield once before a pinned wait (`yield_first`)
        self._yield_rest_until = 0.0  # time.monotonic() the yields' rest ends; 0: none
        self._yield_rest_ended: float | None = None  # when the last rest ended, if one did
        self._yield_period = YIELD_REST_FIRST_S
        # None: pinned whenever armed (a setting named explicitly); else the
        # default's trials (`PinTrial`, set by `pinned_waits`).
        self.trial: PinTrial | None = None
        self._lone = False  # the call in flight is a lone one the trial times
        self._lone_at = 0  # _clock_ns() when it started

    def hold(self, pin: bool = True) -> None:
        self.in_flight += 1
        self._calls += 1
        if self.in_flight == 1:
            self._busy_since = (self._pins, self._timed, self._timed_ns)
        self.armed = pin and self.in_flight == 1 and not self.told_off
        trial = self.trial
        self._lone = False
        if self.armed and trial is not None:
            now = time.monotonic()
            if self.resting_until and now < self.resting_until:
                return  # resting: pinned or not, nothing pins; not timed
            trial.begin(now)
            self.armed = trial.pins_now()
            self._lone = trial.running
            if self._lone:
                self._lone_at = _clock_ns()

    def move_to(self, cpu: int) -> None:
        """Waits on `cpu` from now on."""
        self.cpu = cpu
        self._cpu_set = {cpu}

    def before_select(self, timeout: float | None) -> None:
        """The loop is about to block in its selector (`timeout` None or > 0)."""
        if self.armed and not self.pinned and (timeout is None or timeout > 0) and self._may_pin():
            self._set(True)

    def after_select(self) -> None:
        if self.pinned:
            self._set(False)

    def yield_first(self, ready_now: Any) -> bool:
        """Before a pinned wait with nothing in (`ready_now`: the epoll
        object's poll): yields this thread's CPU once, so that a call path's
        thread runnable here finishes first. True if an event is in after it
        (the loop then need not pin). False at once while the yields rest
        after one that ran another busy thread (`YIELD_SLOW_S`)."""
        if not self.yields:
            return False
        if self._yield_rest_until:
            if time.monotonic() < self._yield_rest_until:
                return False
            self._yield_rest_until = 0.0
            self._yield_rest_ended = time.monotonic()
        start = time.monotonic()
        os.sched_yield()
        end = time.monotonic()
        if end - start >= YIELD_SLOW_S:
            ended = self._yield_rest_ended
            if ended is not None and end - ended < self._yield_period:
                self._yield_period = min(self._yield_period * 2, YIELD_REST_LONGEST_S)
            else:
                self._yield_period = YIELD_REST_FIRST_S
            self._yield_rest_until = end + self._yield_period
        return bool(ready_now(0, 1))

    def follow(self, pin: bool) -> None:
        """A daemon's answer to `CALLS_CPU_FOLLOW_KEY` (its probe's choice, at
        start-up or a later change): with `pin` False this thread's waits are
        not armed any more, for every client on it, until a daemon answers
        True (the latest answer wins, as the latest host's CPU does at the
        daemon)."""
        self.told_off = not pin
        if self.told_off:
            self.armed = False
            self._lone = False  # a call told off mid-way waited both ways: not timed

    def _may_pin(self) -> bool:
        if self.told_off:
            return False
        if threading.get_ident() != self._thread:
            return False  # (a client used from another thread's loop: never pin a thread it did not connect on)
        if self.resting_until:
            if time.monotonic() < self.resting_until:
                return False
            self.resting_until = 0.0
        self._pins += 1
        if self._pins % TIME_EVERY == 0:
            self._timed_at = run_queue_wait_ns()
        return True

    def _note_timed(self) -> None:
        self._timed_ns += run_queue_wait_ns() - self._timed_at
        self._timed_at = -1
        self._timed += 1
        if self._timed < TIMED_PER_JUDGEMENT:
            return
        # The first judgement holds connecting and warming up: not judged.
        busy = self._judged and self._timed_ns > BUSY_WAIT_NS * self._timed
        calls, pins = self._calls - self._window_calls, self._pins - self._window_pins
        self._window_calls, self._window_pins = self._calls, self._pins
        self._timed = self._timed_ns = 0
        self._busy_since = (self._pins, 0, 0)
        self._judged = True
        self._burst_rest = busy and pins >= BURST_PINS_PER_CALL * max(calls, 1)
        if not busy:
            self._period, self._after_backoff = BACKOFF_FIRST_S, False
            return
        if self._after_backoff:  # still busy right after a back-off: a longer one
            self._period = min(self._period * 2, BACKOFF_LONGEST_S)
        self._after_backoff = True
        self.resting_until = time.monotonic() + self._period

    def converse(self) -> None:
        """A namespace event from a sandbox reached this thread's loop: the
        call in flight converses with this loop (sandbox code's requests, or
        the replies to this loop's own), and its waits are not pinned until
        the next call goes alone in flight. Pinned, this loop and the
        sandbox's would share one CPU and run each other's work after each
        hand-off instead of beside it: a namespace request took 1.6x as long
        (docs/DECISIONS.md, "stop-63: namespace traffic is not pinned")."""
        self.armed = False
        self._lone = False

    def release(self) -> None:
        # Never pinned here: only a select is (the loop runs this coroutine).
        self.in_flight -= 1
        self.armed = False
        if self.in_flight:
            self._lone = False  # it overlapped another call: not a lone call's time
            return
        if self._lone:
            self._lone = False
            if self.trial is not None:
                self.trial.end(_clock_ns() - self._lone_at, time.monotonic())
        if self._burst_rest:
            self._burst_rest = False
            self.resting_until = 0.0
        pins, timed, timed_ns = self._busy_since
        if self._pins - pins >= BURST_PINS_PER_CALL:  # a burst: its queueing judges nothing after it
            self._window_pins += self._pins - pins
            self._timed, self._timed_ns = timed, timed_ns

    def _set(self, pinned: bool) -> None:
        if threading.get_ident() != self._thread:
            return  # (a client used from another thread's loop: never pin a thread it did not connect on)
        if not pinned and self._timed_at >= 0:
            self._note_timed()  # read while still pinned
        os.sched_setaffinity(0, self._cpu_set if pinned else self.original)
        self.pinned = pinned


def converse() -> None:
    """`PinnedWaits.converse` for the calling thread's waits, if it has any
    (a namespace stream's reader calls it on its loop's thread)."""
    waits = getattr(_threads, "waits", None)
    if waits is not None:
        waits.converse()


def run_queue_wait_ns() -> int:
    """The calling thread's run-queue wait so far in ns (the second field of
    /proc/thread-self/schedstat); 0 where the kernel does not keep it.

    The file stays open for the thread (a thread-local, dropped in a forked
    child): one ``pread`` per reading, ~0.5 us against ~4 us for opening,
    reading and closing it, which a timed pin does twice (docs/DECISIONS.md,
    "The noop's p99")."""
    try:
        stat = getattr(_threads, "schedstat", None)
        if stat is None:
            stat = _threads.schedstat = open("/proc/thread-self/schedstat", "rb", buffering=0)
        return int(os.pread(stat.fileno(), 96, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


_threads = threading.local()


def _forget_schedstat() -> None:
    # A forked child's thread is another one: its schedstat is another file.
    stat = _threads.__dict__.pop("schedstat", None)
    if stat is not None:
        stat.close()


os.register_at_fork(after_in_child=_forget_schedstat)


class _PinningSelector:
    """The running loop's selector, wrapped: a blocking ``select`` is a pinned
    wait while `waits` is armed, unless an event is there already (the loop
    then does not wait: `_ready_now`). Everything else goes to the loop's own
    selector."""

    __slots__ = ("_inner", "_waits", "_ready_now")

    def __init__(self, inner: Any, waits: PinnedWaits) -> None:
        self._inner = inner
        self._waits = waits
        # The epoll object's own poll, called with (0, 1): an event ready now,
        # without the selector's key lookups; level-triggered (all of asyncio's),
        # so the select after it still returns that event. None for another
        # selector: its waits are pinned without a look first.
        poller = getattr(inner, "_selector", None)
        self._ready_now = poller.poll if isinstance(inner, selectors.EpollSelector) and poller is not None else None

    def select(self, timeout: float | None = None) -> Any:
        waits = self._waits
        ready_now = self._ready_now
        # A sequential call's result is often in before the loop gets back here (the daemon's
        # thread it woke preempted it, and the whole call ran meanwhile): one epoll_wait instead
        # of two sched_setaffinity, and the placement they would change for nothing. If not,
        # the thread it woke may still be runnable on this CPU: one yield lets it finish first.
        if (waits.armed and not waits.resting_until and (timeout is None or timeout > 0)
                and ready_now is not None and (ready_now(0, 1) or waits.yield_first(ready_now))):
            return self._inner.select(timeout)
        waits.before_select(timeout)
        try:
            return self._inner.select(timeout)
        finally:
            waits.after_select()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def follow_daemon(waits: PinnedWaits, pin: bool) -> None:
    """A daemon's answer to `CALLS_CPU_FOLLOW_KEY`, on the thread of the loop
    `waits` belongs to: `PinnedWaits.follow`, and with `pin` False the loop's
    selector unwrapped, so that the loop runs as with ``off`` (no look ahead,
    no calls around each select); True wraps it again."""
    waits.follow(pin)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    selector = getattr(loop, "_selector", None)
    if not pin and isinstance(selector, _PinningSelector):
        loop._selector = selector._inner  # type: ignore[attr-defined]
    elif pin and selector is not None and not isinstance(selector, _PinningSelector):
        loop._selector = _PinningSelector(selector, waits)  # type: ignore[attr-defined]


def pinned_waits(setting: CallsCpu, slice_us: int = 0, yields: bool = True) -> PinnedWaits | None:
    """The calling thread's `PinnedWaits` for a ``wait`` `setting` (made on
    the first call: the CPU is the setting's, or the one the thread is on;
    the mask to give back is its mask now; the thread then gets a `slice_us`
    slice if not 0, `loop_slice.set_thread_slice`), None for another mode or
    a running loop without a selector of its own. One per thread: every
    client of a loop counts its calls in one place; its running loop's
    selector is wrapped once (`_PinningSelector`). `yields`: whether its
    waits yield once before they pin (`wait_yield_setting`; the latest
    client's word)."""
    if setting.mode != "wait":
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    selector = getattr(loop, "_selector", None)
    if selector is None or not callable(getattr(selector, "select", None)):
        return None  # (uvloop and other loops with their own polling)
    waits = getattr(_threads, "waits", None)
    if waits is None:
        cpu = setting.cpu if setting.cpu is not None else current_cpu()
        waits = PinnedWaits(cpu, os.sched_getaffinity(0))
        _threads.waits = waits
        set_thread_slice(slice_us)
    elif setting.cpu is not None and setting.cpu != waits.cpu and not waits.pinned:
        waits.move_to(setting.cpu)  # a CPU named by a later client wins, as at the daemon
    if waits.told_off and not setting.follow:
        # A client that named its placement pins as it says, whatever a
        # probing daemon told an earlier client of this thread (the latest
        # word wins, as above): one told `off` must not leave a later
        # ``asyncio.run`` on the thread unpinned for good.
        waits.follow(True)
    waits.yields = yields
    # The latest client's word, as `yields`: the default times its calls
    # both ways (`PinTrial`, kept across its clients), a named wait pins.
    if not setting.follow:
        waits.trial = None
    elif waits.trial is None:
        waits.trial = PinTrial()
    if not isinstance(selector, _PinningSelector):
        loop._selector = _PinningSelector(selector, waits)  # type: ignore[attr-defined]
    return waits
