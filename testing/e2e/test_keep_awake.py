"""--keep_awake_us (sandbox/keep_awake.h; docs/FRAME-WIRE.md, "Wake-ups"): while frames
flow between the daemon and its worker, one SCHED_IDLE busy-wait thread per allowed CPU,
pinned there, keeps the CPUs from halting; after the window the threads block."""

import os
import time

import pytest

from agentix import RuntimeClient

SPINNER = "agx-awake"


def _spinners(pid):
    """{tid: (allowed CPUs, scheduling policy)} of the daemon's keep-awake threads."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != SPINNER:
                    continue
            out[int(tid)] = (os.sched_getaffinity(int(tid)), os.sched_getscheduler(int(tid)))
        except OSError:
            continue  # ended meanwhile
    return out


def _status(pid, tid, field):
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split()[1]
    raise AssertionError(f"{field} not in /proc/{pid}/task/{tid}/status")


def _cpu_ns(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def _asleep(pid, tids):
    """Every spinner blocked (state S), checked a few times in a row."""
    return all(_status(pid, tid, "State") == "S" for tid in tids)


def _wait_asleep(pid, tids, limit_s=10.0):
    until = time.monotonic() + limit_s
    while time.monotonic() < until:
        if all(_asleep(pid, tids) for _ in range(3)):
            return True
        time.sleep(0.01)
    return False


async def test_spinners_are_pinned_idle_priority_woken_by_calls_and_asleep_after(start_daemon):
    allowed = sorted(os.sched_getaffinity(0))
    daemon = start_daemon(extra_args=["--keep_awake_us=20000"])
    pid = daemon.proc.pid
    spinners = _spinners(pid)
    # One per allowed CPU (at most 8), each pinned to its own, at SCHED_IDLE.
    assert sorted(next(iter(cpus)) for cpus, _ in spinners.values()) == allowed[:8]
    assert all(len(cpus) == 1 for cpus, _ in spinners.values())
    assert {policy for _, policy in spinners.values()} == {os.SCHED_IDLE}

    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(os.getpid) > 0
        assert _wait_asleep(pid, spinners), "spinners still running long after the window"
        woken = {tid: int(_status(pid, tid, "voluntary_ctxt_switches")) for tid in spinners}
        for _ in range(20):
            assert await client.remote(os.getpid) > 0
        # The calls woke every spinner; the window (20 ms) passed, so each blocked again.
        assert _wait_asleep(pid, spinners), "spinners still running long after the window"
        for tid, before in woken.items():
            assert int(_status(pid, tid, "voluntary_ctxt_switches")) > before, tid
        # Asleep means free: their CPU time stops growing.
        spent = {tid: _cpu_ns(pid, tid) for tid in spinners}
        time.sleep(0.3)
        for tid, before in spent.items():
            assert _cpu_ns(pid, tid) - before < 2_000_000, tid
        assert await client.remote(os.getpid) > 0  # and the daemon serves on


async def test_without_keep_awake_there_are_no_spinners(start_daemon):
    daemon = start_daemon()
    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(os.getpid) > 0
    assert _spinners(daemon.proc.pid) == {}


@pytest.mark.parametrize("value", ["-1", "2000000"])
def test_a_bad_keep_awake_us_stops_the_daemon_with_the_reason(start_daemon, value):
    with pytest.raises(RuntimeError) as failed:
        start_daemon(extra_args=[f"--keep_awake_us={value}"])
    assert "--keep_awake_us" in str(failed.value)
