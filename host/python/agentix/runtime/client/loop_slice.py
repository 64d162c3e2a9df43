"""The event loop thread's scheduler slice while it uses pinned waits
(``AGENTIX_LOOP_SLICE_US``; docs/PERFORMANCE.md, "stop-28: the Python host's
pinned waits").

A sequential call's send wakes the daemon's thread on the loop thread's CPU,
which preempts it. With the kernel's default slice the scheduler (EEVDF)
often runs the loop thread again in the middle of the call, before the
worker has answered: it gets to its selector with nothing to read, pins
itself (two ``sched_setaffinity``) and blocks, and is switched out twice per
call. A longer slice gives it a later virtual deadline than the call path's
threads, so it mostly runs again once the result is in: no pinned wait, one
switch-out. The slice is the thread's for good (no system call per call),
set with ``SCHED_FLAG_RESET_ON_FORK`` so threads and processes it starts get
the default slice; its policy and nice value stay as they are. Its cost: on
a CPU shared with other busy threads, the loop thread wakes up behind them
rather than preempting them.

Values: unset or empty is `DEFAULT_SLICE_US`; ``off`` or ``0``: the kernel's
default; N: N µs (`MIN_US` to `MAX_US`, the kernel's bounds). Set only on a
loop thread that uses pinned waits, once per thread, when its first Calls
stream connects (`pinned_waits.pinned_waits`). Nothing on a machine whose
``sched_setattr`` number this module does not know; a kernel without
per-thread slices for normal threads (before Linux 6.12) ignores the value
(the thread keeps the reset-on-fork flag).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import struct

__all__ = ["DEFAULT_SLICE_US", "LOOP_SLICE_ENV", "MAX_US", "MIN_US", "loop_slice_us", "set_thread_slice"]

LOOP_SLICE_ENV = "AGENTIX_LOOP_SLICE_US"
# What an unset or empty AGENTIX_LOOP_SLICE_US means: the kernel's default
# (0). 3000 cut the sequential noop's p50 and host CPU to ~0.92x in a quiet
# same-run A/B but made p99/p50 worse (1.08x) and changes the user's thread
# for good (DECISIONS.md, "The loop thread's slice stays off").
DEFAULT_SLICE_US = 0
MIN_US = 100  # the kernel clamps sched_runtime of a normal thread to 0.1-100 ms
MAX_US = 100_000

_SYS_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}.get(platform.machine())
_SCHED_FLAG_RESET_ON_FORK = 0x01
_SCHED_RESET_ON_FORK = 0x40000000  # as sched_getscheduler reports the flag
_NORMAL_POLICIES = (os.SCHED_OTHER, os.SCHED_BATCH)

_log = logging.getLogger("agentix.runtime.client")


def loop_slice_us(value: str | None = None) -> int:
    """Parses `value` (default: ``AGENTIX_LOOP_SLICE_US``): the slice in µs,
    0 for the kernel's default. ValueError for anything else than the values
    of the module docstring."""
    if value is None:
        value = os.environ.get(LOOP_SLICE_ENV, "")
    text = value.strip().lower()
    if not text:
        return DEFAULT_SLICE_US
    if text == "off":
        return 0
    if not text.isdigit() or not (int(text) == 0 or MIN_US <= int(text) <= MAX_US):
        raise ValueError(f"{LOOP_SLICE_ENV}={value!r} is not off, 0 or a slice in µs from {MIN_US} to {MAX_US}")
    return int(text)


def set_thread_slice(us: int) -> bool:
    """Gives the calling thread a slice of `us` µs (0: nothing), keeping its
    policy and nice value, not passed on to the threads and processes it
    starts. False when not set: a policy other than normal or batch (the
    user chose one), no ``sched_setattr`` here, or the kernel refused."""
    if not us:
        return False
    policy = os.sched_getscheduler(0) & ~_SCHED_RESET_ON_FORK
    if policy not in _NORMAL_POLICIES or _SYS_SCHED_SETATTR is None:
        return False
    nice = os.getpriority(os.PRIO_PROCESS, 0)  # the calling thread's, on Linux
    # struct sched_attr (SCHED_ATTR_SIZE_VER1): size, policy, flags, nice,
    # priority, runtime (the slice, ns), deadline, period, util_min, util_max.
    attr = ctypes.create_string_buffer(
        struct.pack("=IIQiIQQQII", 56, policy, _SCHED_FLAG_RESET_ON_FORK, nice, 0, us * 1000, 0, 0, 0, 0), 56)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(ctypes.c_long(_SYS_SCHED_SETATTR), ctypes.c_long(0), attr, ctypes.c_long(0)) != 0:
        _log.debug("no %d µs slice for the event loop's thread: %s", us, os.strerror(ctypes.get_errno()))
        return False
    return True
