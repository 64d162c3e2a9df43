"""Direct calls end to end (docs/DIRECT-CALLS.md, stage 3): the daemon with
--direct_calls hands the Python host's frame-wire Calls connection (HELLO
agentix-direct: 1, the host's default) to the real agentix-worker, which
serves it; the host cannot tell but by speed. Each test checks the calls
really went direct: the worker reports each handed-over connection's end
(direct_closed), which the daemon logs at debug level."""

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import pytest

import e2e_targets as t
from agentix import RemoteCallError, RuntimeClient
from agentix.runtime.client.frames import FrameCallsStream

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy"))
from cutting_proxy import start_pair  # noqa: E402

MiB = 1024 * 1024
_CLOSED = re.compile(r"direct connection (\d+) closed")


@pytest.fixture
def direct_daemon(start_daemon, monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "auto")
    return start_daemon(extra_args=["--direct_calls", "--log_level=debug"])


def _direct_closed(daemon, at_least=1, timeout=10.0):
    """The daemon's log names at least `at_least` direct connections the
    worker served and closed (bounded wait: direct_closed is asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        closed = set(_CLOSED.findall(daemon.log()))
        if len(closed) >= at_least or time.monotonic() > deadline:
            return closed


async def test_calls_go_direct_noop_echo_stream_exception_cancel(direct_daemon):
    data = os.urandom(16 * MiB)
    async with RuntimeClient(direct_daemon.url) as client:
        assert await client.remote(t.noop) is None
        assert await client.remote(t.add, 2, 3) == 5
        assert await client.remote(t.echo, data) == data  # through both rings
        assert [i async for i in client.remote_stream(t.count_async, 50)] == list(range(50))
        with pytest.raises(RemoteCallError) as raised:
            await client.remote(t.raise_value_error, "from a direct call")
        assert "from a direct call" in str(raised.value)
        sleeper = asyncio.ensure_future(client.remote(t.async_sleep, 30))
        await asyncio.sleep(0.3)
        sleeper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeper
        assert await client.remote(t.add, 1, 1) == 2  # the stream goes on
        assert type(client._stream) is FrameCallsStream
    assert _direct_closed(direct_daemon), direct_daemon.log()[-4000:]


async def test_a_cut_direct_connection_resumes_its_running_call(direct_daemon, tmp_path):
    # The proxy relays bytes, so the daemon hands the proxy's connection to
    # the worker; a cut ends it, the host reconnects (handed over again, to
    # the same session) and resumes the call that kept running.
    upstream = str(direct_daemon.socket_path)
    proxies = start_pair(str(tmp_path / "p.sock"), upstream)
    try:
        async with RuntimeClient(proxies[0].url) as client:
            call = asyncio.ensure_future(client.remote(t.chaos_step, 7, 0.6))
            await asyncio.sleep(0.3)
            assert sum(p.cut() for p in proxies) >= 1
            assert await asyncio.wait_for(call, 20) == 14
            assert proxies[1].connections >= 2  # it reconnected
            assert await client.remote(t.chaos_executions) == {7: 1}  # ran once
    finally:
        for p in proxies:
            p.stop()
    assert len(_direct_closed(direct_daemon, at_least=2)) >= 2, direct_daemon.log()[-4000:]
