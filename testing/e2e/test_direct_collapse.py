"""Direct calls, stage 4b (docs/DIRECT-CALLS.md, "collapse"): a direct
client's session comes back to the daemon when the client reconnects
without direct calls, or when it has had no connection for
--direct_orphan_s. The daemon logs each session it takes back (debug)."""

import asyncio
import sys
import time
from pathlib import Path

import pytest

import e2e_targets as t
from agentix import RuntimeClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy"))
from cutting_proxy import start_pair  # noqa: E402

_BACK = "a direct session came back from the worker"


@pytest.fixture
def orphan_daemon(start_daemon, monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "auto")
    return start_daemon(
        extra_args=["--direct_calls", "--direct_orphan_s=1", "--log_level=debug"])


def _collapses(daemon):
    return daemon.log().count(_BACK)


@pytest.mark.parametrize("reconnect", [("AGENTIX_CALLS_DIRECT", "off"),
                                       ("AGENTIX_CALLS_WIRE", "grpc")],
                         ids=["frames-without-key", "grpc"])
async def test_a_relayed_reconnect_takes_the_running_call_back(orphan_daemon, tmp_path,
                                                              monkeypatch, reconnect):
    # The proxy relays bytes: the first connection goes direct. The host's
    # reconnect after the cut does not ask for direct calls (the frame wire
    # without the key, or gRPC), so the daemon collapses the client's
    # session before serving it, and the resume finds the call there: its
    # result arrives once, it ran once.
    upstream = str(orphan_daemon.socket_path)
    proxies = start_pair(str(tmp_path / "p.sock"), upstream)
    try:
        async with RuntimeClient(proxies[0].url) as client:
            assert await client.remote(t.add, 1, 2) == 3  # direct
            call = asyncio.ensure_future(client.remote(t.chaos_step, 11, 0.8))
            await asyncio.sleep(0.3)
            monkeypatch.setenv(*reconnect)
            assert proxies[1].cut() >= 1
            assert await asyncio.wait_for(call, 20) == 22
            assert await client.remote(t.chaos_executions) == {11: 1}  # ran once
            assert await client.remote(t.add, 2, 2) == 4  # relayed, goes on
    finally:
        for p in proxies:
            p.stop()
    assert _collapses(orphan_daemon) >= 1, orphan_daemon.log()[-4000:]


async def test_an_orphaned_session_is_collapsed(orphan_daemon):
    async with RuntimeClient(orphan_daemon.url) as client:
        assert await client.remote(t.add, 1, 1) == 2
    # The host's connection ended; none of its came back within 1 s.
    deadline = time.monotonic() + 10
    while _collapses(orphan_daemon) < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert _collapses(orphan_daemon) >= 1, orphan_daemon.log()[-4000:]
