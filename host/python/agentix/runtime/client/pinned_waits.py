"""Where the event loop's thread runs while it waits for the daemon
(``AGENTIX_CALLS_CPU``; docs/FRAME-WIRE.md, "Wake-ups").

A sequential call's hand-offs (host -> daemon -> worker and back) each wake a
thread; on an idle machine one woken on another, halted CPU costs a
cross-CPU wake-up (tens of microseconds) per hop. With the daemon's call
path on one CPU (``--calls_cpu``, or the HELLO key `CALLS_CPU_KEY`), the
host's loop thread waiting on that CPU too makes every hop a same-CPU one.

The settings (`calls_cpu_setting`):

- ``off``: nothing.
- ``wait`` (pinned waits): the loop thread is pinned to the CPU while exactly
  one `RuntimeClient.remote` call of that thread is in flight, and gets its
  own mask back before the awaiting coroutine returns to user code
  (`PinnedWaits`). The CPU is the one the thread is on when it first
  connects; ``wait:N`` / ``wait:auto`` name one (``auto``: the highest this
  process may use, as the daemon's ``--calls_cpu=auto``).
- ``N`` / ``auto``: the loop thread is pinned to that CPU for good when its
  Calls stream connects (it then runs the user's code there too).

Unset or empty is `DEFAULT_SETTING`.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

__all__ = [
    "CALLS_CPU_ENV",
    "CALLS_CPU_KEY",
    "CallsCpu",
    "DEFAULT_SETTING",
    "PinnedWaits",
    "calls_cpu_setting",
    "current_cpu",
    "pinned_waits",
]

CALLS_CPU_ENV = "AGENTIX_CALLS_CPU"
# The HELLO key of a Calls frame-wire connection naming the CPU the host
# waits on (decimal): the daemon places its call path there (docs/FRAME-WIRE.md).
CALLS_CPU_KEY = "agentix-calls-cpu"
# What an unset or empty AGENTIX_CALLS_CPU means. "wait" is the candidate
# default once a quiet-machine A/B says it pays (docs/PERFORMANCE.md).
DEFAULT_SETTING = "off"


class CallsCpu(NamedTuple):
    """A parsed ``AGENTIX_CALLS_CPU``: `mode` is ``off``, ``wait`` or
    ``always``; `cpu` the CPU (None for ``off``, and for ``wait`` without
    one: the thread's current CPU)."""

    mode: str
    cpu: int | None


_OFF = CallsCpu("off", None)


def calls_cpu_setting(value: str | None = None) -> CallsCpu:
    """Parses `value` (default: ``AGENTIX_CALLS_CPU``; unset or empty is
    `DEFAULT_SETTING`). ValueError for anything else than the settings of
    the module docstring, or a CPU this thread may not run on."""
    if value is None:
        value = os.environ.get(CALLS_CPU_ENV, "")
    setting = value.strip().lower() or DEFAULT_SETTING
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


def current_cpu() -> int:
    """The CPU the calling thread last ran on (field 39 of its
    /proc/thread-self/stat; read once per thread, so no native call)."""
    with open("/proc/thread-self/stat", "rb") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces: count fields after its ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[36])


class PinnedWaits:
    """Pins one thread (the event loop's) to `cpu` while exactly one call of
    its is in flight; `original` is the mask it gets back.

    `hold` when a call starts, `release` (always, in a ``finally``) when its
    awaiting coroutine resumes: 0 -> 1 calls in flight pins, 1 -> 0 and
    1 -> 2 (overlap) unpin. `hold(pin=False)` (a streaming call, whose
    consumer runs user code between items) counts as in flight but never
    pins. Each change of the mask is one ``sched_setaffinity``; none when
    the mask is already right.
    """

    __slots__ = ("cpu", "original", "in_flight", "pinned", "_cpu_set", "_thread")

    def __init__(self, cpu: int, original: set[int]) -> None:
        self.cpu = cpu
        self.original = frozenset(original)
        self._cpu_set = {cpu}
        self.in_flight = 0
        self.pinned = False
        self._thread = threading.get_ident()

    def hold(self, pin: bool = True) -> None:
        self.in_flight += 1
        if self.in_flight == 1:
            if pin and not self.pinned:
                self._set(True)
        elif self.pinned:
            self._set(False)

    def release(self) -> None:
        self.in_flight -= 1
        if self.pinned and self.in_flight == 0:
            self._set(False)

    def _set(self, pinned: bool) -> None:
        if threading.get_ident() != self._thread:
            return  # (a client used from another thread's loop: never pin a thread it did not connect on)
        os.sched_setaffinity(0, self._cpu_set if pinned else self.original)
        self.pinned = pinned


_threads = threading.local()


def pinned_waits(setting: CallsCpu) -> PinnedWaits | None:
    """The calling thread's `PinnedWaits` for a ``wait`` `setting` (made on
    the first call: the CPU is the setting's, or the one the thread is on;
    the mask to give back is its mask now), None for another mode. One per
    thread: every client of a loop counts its calls in one place."""
    if setting.mode != "wait":
        return None
    waits = getattr(_threads, "waits", None)
    if waits is None:
        cpu = setting.cpu if setting.cpu is not None else current_cpu()
        waits = PinnedWaits(cpu, os.sched_getaffinity(0))
        _threads.waits = waits
    return waits
