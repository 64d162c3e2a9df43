"""The calls-CPU placement with --direct_calls (docs/DIRECT-CALLS.md, stage 5;
sandbox/calls_cpu.h): no relayed call ends on a direct connection, so the
daemon gives the worker the call path's CPU when it hands a connection over
(the host's HELLO agentix-calls-cpu) and when its probe's answer places it,
not only after a relayed read, and keeps a following host's CPU for the
probe's answer when the hand-over came first. The worker's thread that
waits for the next direct call waits on that CPU, and the namespace
request's chain (the worker's loop, the daemon's reader) follows it. The
daemon chooses no CPU of its own for a direct path. Timing-free: the
published word and thread masks read from /proc."""

import os
import time

import e2e_targets as t
from test_calls_cpu import (
    CpuWatch,
    _path,
    _probe_choice,
    _worker_settles_pinned_to,
)

from agentix import RuntimeClient


def _direct_host(monkeypatch, calls_cpu):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "auto")
    if calls_cpu is None:
        monkeypatch.delenv("AGENTIX_CALLS_CPU", raising=False)
    else:
        monkeypatch.setenv("AGENTIX_CALLS_CPU", calls_cpu)


def _went_direct(daemon):
    """The worker reported a handed-over connection's end (debug log; bounded)."""
    deadline = time.monotonic() + 10
    while "direct connection" not in daemon.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    return "direct connection" in daemon.log()


def _allowed():
    allowed = sorted(os.sched_getaffinity(0))
    assert len(allowed) >= 2, "needs a machine with two CPUs to tell pinned from free"
    return allowed


async def test_a_direct_hosts_cpu_places_the_workers_waits_and_the_namespace_chain(start_daemon, monkeypatch):
    allowed = _allowed()
    cpu = allowed[0]  # not the one --calls_cpu=auto or the reader would pick by themselves
    before = os.sched_getaffinity(0)
    _direct_host(monkeypatch, f"wait:{cpu}")
    daemon = start_daemon(extra_args=["--direct_calls", "--calls_cpu=auto", "--log_level=debug"],
                          env={"AGENTIX_CALLS_CPU": "wait"})  # the sandbox reads the word itself
    client = RuntimeClient(daemon.url)
    client.register_namespace(CpuWatch(settle_s=2.0))
    try:
        async with client:
            for _ in range(20):
                assert await client.remote(os.getpid) > 0
            # No relayed call ended, yet the worker was given the host's CPU
            # (its own reports keep no frame from the daemon's reader: the
            # published word is read before any namespace request).
            assert await client.remote(t.published_wait_cpu) == cpu
            for _ in range(20):  # sync calls: the pool's intake, not the loop's
                assert await client.remote(os.getpid) > 0
            # The worker's thread waiting for the
            # next call waits on the host's CPU (a follower, if any, off it).
            assert _worker_settles_pinned_to(daemon.proc.pid, cpu)
            # The namespace request: the worker's loop awaits the reply on
            # that CPU, user code runs unpinned, and the daemon's reader is
            # placed there too.
            answers = await client.remote(t.request_loop_masks, 3)
            reader = _path(daemon.proc.pid, ("agx-wrk-read",))
            namespace_stream = _path(daemon.proc.pid, ("agx-frames",))
    finally:
        os.sched_setaffinity(0, before)
    assert [saw for saw, _ in answers] == [[cpu]] * 3
    assert [after for _, after in answers] == [allowed] * 3
    assert reader == {frozenset({cpu})}
    if "handed to the worker as direct" in daemon.log():
        # DIRECT-CALLS stage 8: the worker serves the stream; no daemon thread.
        assert namespace_stream == set()
    else:  # served relayed: its frame-wire thread is placed on that CPU too
        assert namespace_stream == {frozenset({cpu})}
    assert _went_direct(daemon), daemon.log()[-4000:]


async def test_with_the_probe_a_direct_connection_places_the_worker_as_the_probe_chose(start_daemon, monkeypatch):
    # The default host follows the probe. Its connection may be handed over
    # before the probe has answered: the connection's thread, which would
    # place the path when it tells its host, is gone then, and the daemon
    # keeps the host's CPU for the answer (CallsCpu::PreferCpuOncePinned).
    # Either way no relayed call ends to place the path.
    allowed = _allowed()
    before = os.sched_getaffinity(0)
    cpu = allowed[0]
    _direct_host(monkeypatch, None)
    daemon = start_daemon(extra_args=["--direct_calls", "--calls_cpu=probe",
                                      "--calls_cpu_probe_wait_ms=600000", "--log_level=debug"],
                          env={"AGENTIX_CALLS_CPU": "wait"})  # the sandbox reads the word itself
    os.sched_setaffinity(0, {cpu})  # the default host waits where it connects
    try:
        async with RuntimeClient(daemon.url) as client:
            assert await client.remote(os.getpid) > 0
            os.sched_setaffinity(0, before)
            choice, _ = _probe_choice(daemon, timeout_s=30.0)  # once the calls rest
            for _ in range(5):
                assert await client.remote(os.getpid) > 0
            # (off only on one CPU)
            published = await client.remote(t.published_wait_cpu)
            for _ in range(20):  # sync calls: the pool's intake, not the loop's
                assert await client.remote(os.getpid) > 0
            if choice == "pin":  # the host's CPU
                assert published == cpu
                assert _worker_settles_pinned_to(daemon.proc.pid, cpu)
            else:
                # pin_daemon: hosts told not to pin. The daemon places no
                # direct path by itself (no relayed call end chooses a CPU):
                # a direct worker pinned while its host ran anywhere lost.
                assert choice == "pin_daemon"
                assert published == -1
    finally:
        os.sched_setaffinity(0, before)
    print("probe chose", choice)  # (pytest -s)
    assert _went_direct(daemon), daemon.log()[-4000:]
