"""--calls_cpu and AGENTIX_CALLS_CPU (docs/FRAME-WIRE.md, "Wake-ups"): while calls
come one at a time, the daemon's frame-wire connection thread, its worker's
reader and the worker process run on one CPU; while calls overlap they may run
anywhere; the Python host's AGENTIX_CALLS_CPU pins its event loop's thread."""

import asyncio
import os

import pytest

from agentix import RuntimeClient

# The threads --calls_cpu places: the daemon's (by name) and every thread of the worker.
DAEMON_PATH_THREADS = ("agx-frames", "agx-wrk-read")


def _threads(pid):
    """{tid: (name, allowed CPUs as a set)} of process `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            out[int(tid)] = (name, os.sched_getaffinity(int(tid)))
        except OSError:
            continue  # ended meanwhile
    return out


def _worker_pid(daemon_pid):
    children = []
    for tid in os.listdir(f"/proc/{daemon_pid}/task"):
        with open(f"/proc/{daemon_pid}/task/{tid}/children") as f:
            children += [int(p) for p in f.read().split()]
    assert len(children) == 1, children
    return children[0]


def _placement(daemon_pid):
    """(CPU sets of the daemon's call-path threads, of the worker's threads, of agx-grpc)."""
    daemon = _threads(daemon_pid)
    path = {frozenset(cpus) for name, cpus in daemon.values() if name in DAEMON_PATH_THREADS}
    grpc = {frozenset(cpus) for name, cpus in daemon.values() if name == "agx-grpc"}
    worker = {frozenset(cpus) for _, cpus in _threads(_worker_pid(daemon_pid)).values()}
    return path, worker, grpc


async def test_calls_cpu_pins_one_at_a_time_calls_and_frees_overlapping_ones(start_daemon):
    allowed = os.sched_getaffinity(0)
    assert len(allowed) >= 2, "needs a machine with two CPUs to tell pinned from free"
    cpu = frozenset({max(allowed)})
    everywhere = frozenset(allowed)
    daemon = start_daemon(extra_args=["--calls_cpu=auto"])
    async with RuntimeClient(daemon.url) as client:
        for _ in range(5):
            assert await client.remote(os.getpid) > 0
        path, worker, grpc = _placement(daemon.proc.pid)
        assert path == {cpu}
        assert worker == {cpu}
        assert grpc == {everywhere}  # only the call path is placed

        # Overlapping calls: the worker answers several in one write; then every
        # thread of the worker may run anywhere.
        for _ in range(10):
            await asyncio.gather(*(client.remote(os.getpid) for _ in range(200)))
            if _placement(daemon.proc.pid)[1] == {everywhere}:
                break
        assert _placement(daemon.proc.pid)[1] == {everywhere}

        # One at a time again: pinned after a run of single results.
        for _ in range(100):
            await client.remote(os.getpid)
        path, worker, _ = _placement(daemon.proc.pid)
        assert path == {cpu}
        assert worker == {cpu}


async def test_without_calls_cpu_nothing_is_pinned(start_daemon):
    everywhere = frozenset(os.sched_getaffinity(0))
    daemon = start_daemon()
    async with RuntimeClient(daemon.url) as client:
        for _ in range(5):
            await client.remote(os.getpid)
        path, worker, grpc = _placement(daemon.proc.pid)
    assert path == worker == grpc == {everywhere}


@pytest.mark.parametrize("value", ["nope", "-1", "99999"])
def test_a_bad_calls_cpu_stops_the_daemon_with_the_reason(start_daemon, value):
    with pytest.raises(RuntimeError) as failed:
        start_daemon(extra_args=[f"--calls_cpu={value}"])
    assert "--calls_cpu" in str(failed.value)
    assert value in str(failed.value)


async def test_host_calls_cpu_pins_the_event_loop_thread(daemon, monkeypatch):
    before = os.sched_getaffinity(0)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "auto")
    try:
        async with RuntimeClient(daemon.url) as client:
            assert await client.remote(os.getpid) > 0
            assert os.sched_getaffinity(0) == {max(before)}
    finally:
        os.sched_setaffinity(0, before)


async def test_host_calls_cpu_refuses_a_bad_value(daemon, monkeypatch):
    before = os.sched_getaffinity(0)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "the-fast-one")
    with pytest.raises(ValueError, match="AGENTIX_CALLS_CPU"):
        async with RuntimeClient(daemon.url) as client:
            await client.remote(os.getpid)
    assert os.sched_getaffinity(0) == before


def _allowed_list(tid):
    """The CPUs thread `tid` of this process may run on, as /proc says (a set)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        (line,) = [l for l in f if l.startswith("Cpus_allowed_list:")]
    cpus = set()
    for part in line.split(":", 1)[1].strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


async def test_pinned_waits_pin_the_loop_thread_only_while_a_call_is_in_flight(start_daemon, monkeypatch):
    import threading
    import time

    before = os.sched_getaffinity(0)
    assert len(before) >= 2, "needs a machine with two CPUs to tell pinned from free"
    cpu = max(before)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait:auto")
    daemon = start_daemon(extra_args=["--calls_cpu=auto"])
    loop_tid = threading.get_native_id()
    seen, stop = [], threading.Event()

    def watch():  # another thread reads the loop thread's mask while a call is in flight
        while not stop.is_set():
            seen.append(frozenset(_allowed_list(loop_tid)))
            time.sleep(0.01)

    try:
        async with RuntimeClient(daemon.url) as client:
            for _ in range(20):  # sequential calls: user code after each runs unpinned
                assert await client.remote(os.getpid) > 0
                assert os.sched_getaffinity(0) == before
            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                await client.remote(time.sleep, 0.5)
            finally:
                stop.set()
                watcher.join()
            assert os.sched_getaffinity(0) == before
            assert seen.count(frozenset({cpu})) >= len(seen) // 2 > 0, seen
            # Overlapping calls wait unpinned; the next sequential one is pinned again.
            seen.clear()
            stop.clear()
            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                await asyncio.gather(*(client.remote(time.sleep, 0.3) for _ in range(2)))
            finally:
                stop.set()
                watcher.join()
            assert seen and set(seen) == {frozenset(before)}, seen
            assert os.sched_getaffinity(0) == before
    finally:
        os.sched_setaffinity(0, before)
