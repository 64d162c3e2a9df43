"""Direct Namespace streams (docs/DIRECT-CALLS.md stage 8), end to end: with
--direct_calls the daemon hands a frame-wire Namespace stream whose HELLO asks
for it (the Python host's default) to the worker once the stream has opened
its name, when no other stream has that name open. The worker then answers
the host's events and writes the sandbox's events on it itself, so a sandbox
request crosses two hand-offs instead of four. Everything a relayed stream
promises holds: requests and replies, events both ways, errors and timeouts,
agentix:host_connected (requests sent again after a reconnect), the
--max-namespace-streams cap, a second stream on the name (relayed, both get
the events), the host going away mid-request, the worker dying mid-request."""

import asyncio
import os
import re
import signal
import time

import pytest

import e2e_targets as t
import plugin_targets as p
from agentix import AsyncClientNamespace, RuntimeClient, WorkerExited, request_handler

pytestmark = pytest.mark.asyncio

_HANDED = re.compile(r"namespace (/\S+) handed to the worker as direct connection (\d+)")
_CLOSED = re.compile(r"direct connection (\d+) closed")


class HostEcho(AsyncClientNamespace):
    """The host half of plugin_targets' /echo; `hold` keeps the answer to
    the question "hold" back until it is set."""

    def __init__(self):
        super().__init__("/echo")
        self.progress = []
        self.pongs = []
        self.asked = []
        self.hold = asyncio.Event()

    def on_progress(self, data):
        self.progress.append(data)

    def on_pong(self, data):
        self.pongs.append(data)

    @request_handler("answer")
    async def on_answer(self, body):
        self.asked.append(body["q"])
        if body["q"] == "fail":
            error = LookupError("no answer for 'fail'")
            error.status_code = 404
            raise error
        if body["q"] == "hold":
            await self.hold.wait()
        return {"a": body["q"].upper()}


@pytest.fixture
def direct_env(monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "auto")


def direct_daemon(start_daemon, *extra):
    return start_daemon(extra_args=["--direct_calls", "--log_level=debug", *extra])


@pytest.fixture(params=["relayed", "direct"])
def mode(request):
    """The failure cases run against a relayed daemon too: the direct
    stream must end them as the relayed one does."""
    return request.param


def daemon_in(mode, start_daemon):
    if mode == "relayed":
        return start_daemon(extra_args=["--log_level=debug"],
                            relayed_only="the relayed half of a relayed/direct pair")
    return direct_daemon(start_daemon)


async def until(predicate, timeout=15.0, what=""):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.02)


def handed(daemon) -> list[tuple[str, str]]:
    return _HANDED.findall(daemon.log())


async def test_requests_replies_and_events_go_on_the_handed_stream(start_daemon, direct_env):
    daemon = direct_daemon(start_daemon)
    host = HostEcho()
    client = RuntimeClient(daemon.url)
    client.register_namespace(host)
    async with client:
        assert await client.remote(p.ask, "hello") == {"a": "HELLO"}
        await until(lambda: len(host.progress) >= 2, what="progress events")
        assert host.progress == [{"stage": "asking", "q": "hello"}, {"stage": "answered", "q": "hello"}]
        (name, conn), = handed(daemon)
        assert name == "/echo"
        # Host -> sandbox events, and a sandbox handler answering with an event.
        await host.emit("config", {"k": 1})
        await host.emit("ping", {"n": 2})
        await until(lambda: host.pongs == [{"echo": {"n": 2}}], what="pong")
        assert await client.remote(p.configs_seen) == [{"k": 1}]
        # Errors and timeouts as relayed.
        failed = await client.remote(p.ask_failing, "fail")
        assert failed[1:] == ["LookupError", "no answer for 'fail'", 404]
        assert (await client.remote(p.ask_nobody, 0.3)).startswith("TimeoutError")
        # Many requests in a row.
        for i in range(50):
            assert await client.remote(p.ask, f"q{i}") == {"a": f"Q{i}"}
    # The host closed it: the worker reported the end, the daemon counted it.
    await until(lambda: conn in _CLOSED.findall(daemon.log()), what="direct_closed")


class CountingHost(AsyncClientNamespace):
    """Counts each request the sandbox sends (no remembered-replies rule
    between it and the wire: a request sent twice is seen twice)."""

    def __init__(self):
        super().__init__("/echo")
        self.seen = []

    async def trigger_event(self, event, *args):
        if event in ("connect", "disconnect", "connect_error"):
            return await super().trigger_event(event, *args)
        self.seen.append(event)
        return await super().trigger_event(event, *args)

    @request_handler("answer")
    async def on_answer(self, body):
        return {"a": body["q"].upper()}


async def test_requests_made_at_once_after_connecting_are_sent_once(start_daemon, direct_env):
    # The worker answers `opened` only once the sandbox has its host_connected
    # record: a request made before it would be sent again on it.
    daemon = direct_daemon(start_daemon)
    for _ in range(3):
        host = CountingHost()
        client = RuntimeClient(daemon.url)
        client.register_namespace(host)
        async with client:
            answers = await asyncio.gather(*(client.remote(p.ask, f"q{i}") for i in range(4)))
            assert answers == [{"a": f"Q{i}"} for i in range(4)]
            await asyncio.sleep(0.2)
        assert host.seen.count("answer") == 4, host.seen
    # Each client's stream was handed over (the next one waited for the
    # previous one's end to be reported, if it had to).
    assert len(handed(daemon)) == 3, daemon.log()[-4000:]


async def test_the_cap_counts_a_handed_stream_until_it_closes(start_daemon, direct_env):
    daemon = direct_daemon(start_daemon, "--max-namespace-streams", "1")
    first = RuntimeClient(daemon.url)
    first.register_namespace(HostEcho())
    async with first:
        assert await first.remote(p.ask, "one") == {"a": "ONE"}
        assert len(handed(daemon)) == 1
        second = RuntimeClient(daemon.url)
        second.register_namespace(AsyncClientNamespace("/other"))
        with pytest.raises(Exception, match="RESOURCE_EXHAUSTED.*--max-namespace-streams"):
            async with second:
                pass
        await second.close()
    (_, conn), = handed(daemon)
    await until(lambda: conn in _CLOSED.findall(daemon.log()), what="direct_closed")
    # Its slot is free again.
    third = RuntimeClient(daemon.url)
    third.register_namespace(HostEcho())
    async with third:
        assert await third.remote(p.ask, "three") == {"a": "THREE"}


async def test_a_second_stream_on_the_name_is_relayed_and_both_get_the_events(start_daemon, direct_env):
    daemon = direct_daemon(start_daemon)
    first_host, second_host = HostEcho(), HostEcho()
    first = RuntimeClient(daemon.url)
    first.register_namespace(first_host)
    second = RuntimeClient(daemon.url)
    second.register_namespace(second_host)
    async with first:
        assert await first.remote(p.ask, "a") == {"a": "A"}
        async with second:
            assert await second.remote(t.add, 1, 2) == 3  # its stream is open
            assert len(handed(daemon)) == 1  # the second one stayed relayed
            assert await first.remote(p.ask, "b") == {"a": "B"}
            # The sandbox's events reach both hosts (the worker writes them on
            # the link too once a relayed stream opened on the name).
            await until(lambda: {"stage": "answered", "q": "b"} in second_host.progress, what="relayed copy")
            await until(lambda: {"stage": "answered", "q": "b"} in first_host.progress, what="direct copy")


async def test_a_host_gone_mid_request_gets_it_again_on_its_next_stream(start_daemon, direct_env, mode):
    daemon = daemon_in(mode, start_daemon)
    host = HostEcho()
    client = RuntimeClient(daemon.url)
    client.register_namespace(host)
    async with client:
        assert await client.remote(p.ask, "warm") == {"a": "WARM"}
        pending = asyncio.ensure_future(client.remote(p.ask, "hold"))
        await until(lambda: "hold" in host.asked, what="the request")
        # The host's stream goes away with the request unanswered.
        await client._namespace_streams["/echo"].aclose()
        if mode == "direct":
            (_, conn), = handed(daemon)
            await until(lambda: conn in _CLOSED.findall(daemon.log()), what="direct_closed")
        # The next emit opens a new stream (handed over again), whose
        # agentix:host_connected makes the sandbox send the request again;
        # the host, still answering it, does not run the handler twice, and
        # its answer goes on the new stream.
        await host.emit("config", {"again": True})
        await asyncio.sleep(0.2)
        host.hold.set()
        assert await asyncio.wait_for(pending, 30) == {"a": "HOLD"}
        assert host.asked.count("hold") == 1
        assert len(handed(daemon)) == (2 if mode == "direct" else 0)


async def test_the_worker_dying_mid_request_fails_the_call_and_the_next_stream_serves(start_daemon, direct_env, mode):
    daemon = daemon_in(mode, start_daemon)
    host = HostEcho()
    client = RuntimeClient(daemon.url)
    client.register_namespace(host)
    async with client:
        pid = await client.remote(t.getpid)
        assert await client.remote(p.ask, "warm") == {"a": "WARM"}
        pending = asyncio.ensure_future(client.remote(p.ask, "hold"))
        await until(lambda: "hold" in host.asked, what="the request")
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerExited):
            await asyncio.wait_for(pending, 30)
        host.hold.set()
        # A new worker; the namespace stream is opened again (and handed over).
        assert await client.remote(t.getpid) != pid
        await host.emit("config", {"after": True})
        assert await client.remote(p.ask, "after") == {"a": "AFTER"}
    names = [name for name, _ in handed(daemon)]
    assert names == (["/echo", "/echo"] if mode == "direct" else []), daemon.log()[-4000:]
