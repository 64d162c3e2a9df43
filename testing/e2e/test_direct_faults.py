"""A worker's death with direct calls in flight (docs/DIRECT-CALLS.md, stage
4: the ledger): the daemon with --direct_calls hands the Python host's Calls
connection to the worker, which writes each direct call's id into the ledger
the daemon formatted in the payload area. When the worker is killed, the
daemon reads the ledger, so the host's reconnect gets today's outcome:
re-sent starts of the calls that were running are not run again, their
resumes replay WorkerDied (the host's WorkerExited), and the next call runs
on a fresh worker. GetStatus counts a running direct call (the payload
header's counters)."""

import asyncio
import os
import re
import signal
import time

import pytest

import e2e_targets as t
from admin_client import ADMIN, RUNTIME, Admin, bearer, pb, token_pipe
from agentix import RuntimeClient, WorkerExited
from agentix.runtime.client.frames import FrameCallsStream

pytestmark = pytest.mark.asyncio

_CLOSED = re.compile(r"direct connection (\d+) closed")
_ADOPTED = re.compile(r"direct calls: (\d+) ended with WorkerDied")


@pytest.fixture
def direct_env(monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "auto")


@pytest.fixture
def direct_daemon(start_daemon, direct_env):
    return start_daemon(extra_args=["--direct_calls", "--log_level=debug"])


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


async def _until(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_kill_9_with_direct_calls_in_flight_raises_worker_exited_runs_nothing_twice(
        direct_daemon, tmp_path):
    runs = tmp_path / "runs"
    async with RuntimeClient(direct_daemon.url) as client:
        pid = await client.remote(t.getpid)
        assert await client.remote(t.mark_and_sleep, str(runs), "finished") == "finished"
        slow = [asyncio.ensure_future(client.remote(t.mark_and_sleep, str(runs), f"slow{i}", 60))
                for i in range(4)]
        await _until(lambda: len(_lines(runs)) == 5)
        assert type(client._stream) is FrameCallsStream
        os.kill(pid, signal.SIGKILL)
        for call in slow:
            with pytest.raises(WorkerExited) as raised:
                await asyncio.wait_for(call, 20)  # not a hang
            assert raised.value.returncode == -signal.SIGKILL
        # The next call runs on a fresh worker (relayed: the daemon holds
        # this client's WorkerDied calls until the host acks them).
        assert await client.remote(t.getpid) != pid
        assert await client.remote(t.add, 2, 3) == 5
        await asyncio.sleep(0.5)  # a re-run would have marked by now
    # Each call ran once: the host's reconnect re-sent the four pending
    # starts, which the daemon knew from the ledger and ignored.
    assert sorted(_lines(runs)) == ["finished", "slow0", "slow1", "slow2", "slow3"]
    # The four went direct: the daemon found them in the dead worker's ledger.
    log = direct_daemon.log()
    adopted = _ADOPTED.findall(log)
    assert adopted and int(adopted[0]) == 4, log[-4000:]


async def test_direct_calls_after_the_death_go_direct_again_once_acked(direct_daemon, tmp_path):
    runs = tmp_path / "runs"
    async with RuntimeClient(direct_daemon.url) as client:
        pid = await client.remote(t.getpid)
        call = asyncio.ensure_future(client.remote(t.mark_and_sleep, str(runs), "slow", 60))
        await _until(lambda: len(_lines(runs)) == 1)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerExited):
            await asyncio.wait_for(call, 20)
        assert await client.remote(t.getpid) != pid
    closed_before = set(_CLOSED.findall(direct_daemon.log()))
    # A new client connection: the dead call is acked, so it is direct.
    async with RuntimeClient(direct_daemon.url) as client:
        assert await client.remote(t.add, 1, 1) == 2
    deadline = time.monotonic() + 10
    while set(_CLOSED.findall(direct_daemon.log())) <= closed_before:
        assert time.monotonic() < deadline, direct_daemon.log()[-4000:]
        await asyncio.sleep(0.05)
    assert _lines(runs) == ["slow"]


async def test_get_status_counts_a_running_direct_call(start_daemon, direct_env):
    with token_pipe() as fd:
        daemon = start_daemon(
            extra_args=["--admin-token-file", f"/proc/self/fd/{fd}", "--direct_calls",
                        "--log_level=debug"],
            popen_kwargs={"pass_fds": (fd,)},
        )
    import grpc

    async with grpc.aio.insecure_channel(daemon.url) as channel:
        admin = Admin(channel)
        await admin.activate(pb.ActivateRequest(token=RUNTIME), timeout=10, metadata=bearer(ADMIN))
        async with RuntimeClient(daemon.url, token=RUNTIME) as client:
            assert await client.remote(t.add, 1, 2) == 3  # the connection is direct now
            call = asyncio.ensure_future(client.remote(t.blocking_sleep, 1.0))
            status = await admin.await_calls_in_flight(1)
            assert status.calls_in_flight == 1 and status.idle_ms == 0
            await call
            status = await admin.get_status()
            assert status.calls_in_flight == 0 and status.open_streams >= 1
        # The direct connection closes with the client (direct_closed); then
        # the idle time grows.
        await admin.assert_idle_time_grows()
    assert _CLOSED.search(daemon.log()), daemon.log()[-4000:]  # it went direct
