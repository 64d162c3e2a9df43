"""AGENTIX_LOOP_SLICE_US (agentix.runtime.client.loop_slice): the values, and
what a slice set on a thread does and does not change (its policy, its nice
value, the threads it starts)."""

import os
import platform
import re
import threading

import pytest

from agentix.runtime.client import loop_slice
from agentix.runtime.client.loop_slice import loop_slice_us, set_thread_slice


def test_values_parse_to_microseconds(monkeypatch):
    monkeypatch.delenv("AGENTIX_LOOP_SLICE_US", raising=False)
    assert loop_slice_us() == loop_slice.DEFAULT_SLICE_US
    for off in ("off", " OFF ", "0"):
        assert loop_slice_us(off) == 0
    assert loop_slice_us("3000") == 3000
    assert loop_slice_us(str(loop_slice.MIN_US)) == loop_slice.MIN_US
    assert loop_slice_us(str(loop_slice.MAX_US)) == loop_slice.MAX_US
    for bad in ("99", "100001", "-1", "3ms", "1.5", "on"):
        with pytest.raises(ValueError, match="AGENTIX_LOOP_SLICE_US"):
            loop_slice_us(bad)
    monkeypatch.setenv("AGENTIX_LOOP_SLICE_US", "2000")
    assert loop_slice_us() == 2000
    monkeypatch.setattr(loop_slice, "DEFAULT_SLICE_US", 3000)  # what the lead may flip it to
    monkeypatch.setenv("AGENTIX_LOOP_SLICE_US", "")
    assert loop_slice_us() == 3000


def _slice_ns():
    """The calling thread's slice (ns), or None where the kernel shows none."""
    with open("/proc/thread-self/sched") as f:
        for line in f:
            if line.startswith("se.slice"):
                return int(line.split(":")[1])
    return None


def _in_a_thread(fn):
    """fn() in a new thread (what it does to its thread's scheduling stays
    there); what it raises is raised here."""
    out = []

    def run():
        try:
            out.append((True, fn()))
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            out.append((False, error))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


def _kernel_has_slices() -> bool:
    """Per-thread slices for normal threads (sched_attr.sched_runtime) came in Linux 6.12."""
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return found is not None and (int(found[1]), int(found[2])) >= (6, 12)


# Skipped only where the kernel has no per-thread slice to set: decided from the
# kernel, not by trying set_thread_slice, so a broken set_thread_slice fails here.
needs_slices = pytest.mark.skipif(
    loop_slice._SYS_SCHED_SETATTR is None or _slice_ns() is None or not _kernel_has_slices(),
    reason="no per-thread slices for normal threads here (Linux before 6.12, or no sched_setattr number)")


@needs_slices
def test_a_thread_keeps_its_policy_and_nice_and_the_threads_it_starts_get_the_default_slice():
    def run():
        default = _slice_ns()
        os.setpriority(os.PRIO_PROCESS, 0, 3)  # the calling thread's nice value
        assert set_thread_slice(3000)
        started = _in_a_thread(lambda: (_slice_ns(), os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)))
        return default, _slice_ns(), os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), started

    default, ours, nice, policy, started = _in_a_thread(run)
    assert ours == 3_000_000 and nice == 3
    assert policy == os.SCHED_OTHER | loop_slice._SCHED_RESET_ON_FORK
    assert started == (default, 3, os.SCHED_OTHER)  # the default slice; its nice; no flag


@needs_slices
def test_nothing_changes_for_zero_or_a_policy_the_user_chose():
    def run(policy):
        os.sched_setscheduler(0, policy, os.sched_param(0))
        before = _slice_ns()
        return set_thread_slice(3000), _slice_ns() == before, os.sched_getscheduler(0) == policy

    assert _in_a_thread(lambda: (set_thread_slice(0), _slice_ns())) == (False, _slice_ns())
    assert _in_a_thread(lambda: run(os.SCHED_IDLE)) == (False, True, True)
    set_batch, _, _ = _in_a_thread(lambda: run(os.SCHED_BATCH))
    assert set_batch  # batch is a normal policy: it keeps it, with the slice
