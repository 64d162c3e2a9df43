"""Faults the sandbox survives, end to end: a crash in native code (with the
crash report quoted in the error), fd exhaustion, a worker that cannot boot,
and callers that must never wait forever (a daemon killed with calls in
flight)."""

import asyncio
import os
import signal
import time

import pytest

import e2e_targets as t
from agentix import RemoteCallError, RuntimeClient, RuntimeUnreachable, WorkerExited
from conftest import TARGETS_DIR

pytestmark = pytest.mark.asyncio


async def test_a_native_crash_quotes_the_workers_crash_report(client):
    with pytest.raises(WorkerExited) as info:
        await client.remote(t.segfault)
    message = str(info.value)
    assert info.value.returncode == -11
    assert "last stderr output" in message
    assert "Fatal Python error: Segmentation fault" in message
    assert "in segfault" in message  # faulthandler's stack names the function
    assert await client.remote(t.add, 1, 1) == 2  # a fresh worker


async def test_os_exit_mid_call_fails_every_call_in_flight(client):
    slow = [asyncio.ensure_future(client.remote(t.async_sleep, 30)) for _ in range(5)]
    await asyncio.sleep(0.2)
    with pytest.raises(WorkerExited, match="exit code 7"):
        await client.remote(t.exit_hard, 7)
    for call in slow:
        with pytest.raises(WorkerExited):
            await asyncio.wait_for(call, 10)
    assert await client.remote(t.add, 2, 2) == 4


async def test_fd_exhaustion_fails_the_call_not_the_sandbox(client):
    with pytest.raises(RemoteCallError) as info:
        await client.remote(t.exhaust_fds)
    assert info.value.error.type == "OSError"
    assert "Too many open files" in info.value.error.message
    # With every fd still taken, calls keep working; then they are released.
    assert await client.remote(t.add, 3, 4) == 7
    assert await client.remote(t.release_fds) > 100
    assert await client.remote(t.add, 5, 6) == 11


async def test_a_broken_venv_is_a_boot_error_with_the_reason_not_a_timeout(start_daemon, tmp_path):
    broken = tmp_path / "venv"
    broken.mkdir()
    (broken / "pyvenv.cfg").write_text("home = /nonexistent/bin\nversion = 2.7.0\n")
    daemon = start_daemon(extra_args=["--venv", str(broken)])
    started = time.monotonic()
    async with RuntimeClient(daemon.url) as client:
        with pytest.raises(RemoteCallError) as info:
            await client.remote(t.add, 1, 2)
    assert info.value.error.type == "WorkerBootError"
    assert "venv" in info.value.error.message or "2.7" in info.value.error.message
    assert time.monotonic() - started < 10


async def test_a_failing_import_at_start_is_a_boot_error(start_daemon, tmp_path):
    # A module on the import path that shadows one the worker imports at start
    # (pickle: asyncio now comes after the ready frame, see worker/README.md).
    root = tmp_path / "startup"
    root.mkdir()
    (root / "pickle.py").write_text("raise RuntimeError('broken pickle shadow')\n")
    daemon = start_daemon(extra_args=["--python-path", f"{root}:{TARGETS_DIR}"])
    started = time.monotonic()
    async with RuntimeClient(daemon.url) as client:
        with pytest.raises(RemoteCallError) as info:
            await client.remote(t.add, 1, 2)
    assert info.value.error.type == "WorkerBootError"
    assert "broken pickle shadow" in info.value.error.message
    assert time.monotonic() - started < 10


async def test_a_daemon_killed_with_calls_in_flight_ends_every_call(start_daemon):
    daemon = start_daemon()
    client = RuntimeClient(daemon.url, reconnection_attempts=3, reconnection_delay=0.05)
    try:
        calls = [asyncio.ensure_future(client.remote(t.async_sleep, 30)) for _ in range(4)]
        await asyncio.sleep(0.3)
        os.kill(daemon.proc.pid, signal.SIGKILL)
        for call in calls:
            with pytest.raises(RuntimeUnreachable, match="connection lost"):
                await asyncio.wait_for(call, 15)
    finally:
        await client.close()
