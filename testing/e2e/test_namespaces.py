"""Plugin namespaces end to end: a plugin written against the original API
(agentix.Namespace in the sandbox, agentix.AsyncClientNamespace +
request_handler on the host) exchanging events and requests while calls run,
over RuntimeService.Namespace streams of the real daemon."""

import asyncio
import logging
import time

import grpc
import pytest

import plugin_targets as p
from agentix import AsyncClientNamespace, RuntimeClient, request_handler
from agentix.runtime.shared.codec import pack, unpack
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc
from conftest import wait_for

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True, params=["native", "aio", "frames"])
def transport(request, monkeypatch):
    """Every test runs with the host's streams on the native transport, on
    grpc.aio, and on the daemon's frame wire (the default for a unix://
    target: AGENTIX_CALLS_WIRE=auto)."""
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "auto" if request.param == "frames" else "grpc")
    if request.param == "aio":
        monkeypatch.setenv("AGENTIX_NATIVE_TRANSPORT", "0")
    else:
        monkeypatch.delenv("AGENTIX_NATIVE_TRANSPORT", raising=False)
    return request.param


class Unprintable(Exception):
    def __str__(self):
        raise ValueError("no text")

    @property
    def status_code(self):
        raise RuntimeError("no status")


class HostEcho(AsyncClientNamespace):
    """The host half, exactly as an original plugin would write it."""

    def __init__(self):
        super().__init__("/echo")
        self.progress = []
        self.pongs = []
        self.lifecycle = []

    def on_connect(self):
        self.lifecycle.append("connect")

    def on_disconnect(self):
        self.lifecycle.append("disconnect")

    def on_progress(self, data):
        self.progress.append(data)

    def on_pong(self, data):
        self.pongs.append(data)

    @request_handler("answer")
    async def on_answer(self, body):
        if body["q"] == "fail":
            error = LookupError("no answer for 'fail'")
            error.status_code = 404
            raise error
        if body["q"] == "unprintable":
            raise Unprintable()
        await asyncio.sleep(0.05)  # the sandbox call keeps waiting meanwhile
        return {"a": body["q"].upper()}


@pytest.fixture
async def plugin(daemon):
    host = HostEcho()
    client = RuntimeClient(daemon.url)
    client.register_namespace(host)
    async with client:
        yield client, host


async def test_sandbox_requests_an_answer_from_the_host_while_the_call_runs(plugin):
    client, host = plugin
    assert await client.remote(p.ask, "hello") == {"a": "HELLO"}
    # Events emitted before and after the request, in order, from the same call.
    await wait_for(lambda: len(host.progress) >= 2)
    assert host.progress == [{"stage": "asking", "q": "hello"}, {"stage": "answered", "q": "hello"}]
    assert host.lifecycle == ["connect"]


async def test_the_selected_transport_carries_the_namespace(plugin, transport):
    from agentix.runtime.client.namespaces import FrameNamespaceStream, NamespaceStream, NativeNamespaceStream

    client, _ = plugin
    assert await client.remote(p.ask, "which") == {"a": "WHICH"}
    stream = client._namespace_streams["/echo"]
    expected = {"native": NativeNamespaceStream, "aio": NamespaceStream, "frames": FrameNamespaceStream}[transport]
    assert type(stream) is expected


async def test_concurrent_calls_each_get_their_own_answer(plugin):
    client, _ = plugin
    questions = [f"q{i}" for i in range(20)]
    answers = await asyncio.gather(*(client.remote(p.ask, q) for q in questions))
    assert answers == [{"a": q.upper()} for q in questions]


async def test_a_raising_host_handler_becomes_remote_sio_error_in_the_sandbox(plugin):
    client, _ = plugin
    text, type_, message, status = await client.remote(p.ask_failing, "fail")
    assert type_ == "LookupError"
    assert message == "no answer for 'fail'"
    assert text == "LookupError: no answer for 'fail'"
    assert status == 404


async def test_a_handler_exception_that_cannot_be_printed_still_becomes_an_error_reply(plugin):
    # Neither str() nor status_code can be read: the sandbox still gets a
    # definite error reply, not a wait for its timeout.
    client, _ = plugin
    text, type_, message, status = await asyncio.wait_for(client.remote(p.ask_failing, "unprintable", 10), 20)
    assert (type_, status) == ("Unprintable", None)
    assert message == "<str() of the Unprintable raised ValueError>" and text == f"Unprintable: {message}"


async def test_a_request_nobody_answers_times_out_in_the_sandbox(plugin, collected):
    client, _ = plugin
    result = await client.remote(p.ask_nobody, 0.5)
    assert result.startswith("TimeoutError: namespace /echo: no reply to request 'silent'")
    # The host had no on_silent: it says so once, with the original's wording.
    warnings = [m for m in collected.messages("agentix.sio") if "'silent'" in m]
    assert len(warnings) == 1 and "with no handler" in warnings[0]


async def test_host_events_reach_sync_and_async_sandbox_handlers(plugin):
    client, host = plugin
    await client.remote(p.registered_events)  # registers the sandbox namespace
    await host.emit("config", {"model": "m1", "blob": b"\x00\xff"})
    await host.emit("ping", [1, 2])
    async def configs():
        return await client.remote(p.configs_seen)
    deadline = time.monotonic() + 10
    while not (seen := await configs()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert seen == [{"model": "m1", "blob": b"\x00\xff"}]
    await wait_for(lambda: host.pongs)
    assert host.pongs == [{"echo": [1, 2]}]


async def test_unhandled_sandbox_event_is_warned_once_on_the_host(plugin, collected):
    client, host = plugin
    await client.remote(p.registered_events)
    for _ in range(3):
        await host.emit("no_such_event", 1)
    await client.remote(p.emit_many, 1)  # a round trip after the three events
    await wait_for(lambda: any("no_such_event" in m for m in collected.messages("agentix.sio")))
    await asyncio.sleep(0.2)
    warnings = [m for m in collected.messages("agentix.sio") if "no_such_event" in m]
    assert len(warnings) == 1
    assert "received event 'no_such_event' with no handler" in warnings[0]
    assert "silently drops the event" in warnings[0]


async def test_abridge_style_trigger_event_override_with_binary_bodies(daemon):
    class Proxy(AsyncClientNamespace):
        """Like abridge's Proxy: overrides trigger_event, decodes payloads
        itself with codec.unpack, answers path-named requests."""

        def __init__(self):
            super().__init__("/echo")
            self.lifecycle = []

        async def trigger_event(self, event, *args):
            if event in ("connect", "disconnect", "connect_error"):
                self.lifecycle.append(event)
                return await super().trigger_event(event, *args)
            payload = unpack(args[0])
            if event == "/v1/messages":
                body = payload["data"]["body"]
                await self.emit(
                    "/v1/messages:result",
                    {"request_id": payload["request_id"],
                     "value": {"body": body[::-1], "media_type": "application/octet-stream", "status_code": 200}},
                )

    proxy = Proxy()
    client = RuntimeClient(daemon.url)
    client.register_namespace(proxy)
    async with client:
        body = bytes(range(256)) * 4096  # 1 MiB of binary
        reply = await client.remote(p.proxy_request, "/v1/messages", body)
        assert reply == {"body": body[::-1], "media_type": "application/octet-stream", "status_code": 200}
    await wait_for(lambda: proxy.lifecycle == ["connect", "disconnect"])


async def test_a_slow_host_handler_never_delays_calls(daemon):
    class Slow(AsyncClientNamespace):
        async def on_progress(self, data):
            await asyncio.sleep(30)

    client = RuntimeClient(daemon.url)
    client.register_namespace(Slow("/echo"))
    async with client:
        await client.remote(p.emit_many, 5)
        started = time.monotonic()
        assert await client.remote(abs, -5) == 5
        assert time.monotonic() - started < 5


async def test_registration_rules(daemon):
    client = RuntimeClient(daemon.url)
    for bad in ("/log", "/trace", "/rpc"):
        with pytest.raises(ValueError, match="reserved"):
            client.register_namespace(AsyncClientNamespace(bad))
    with pytest.raises(ValueError, match="start"):
        client.register_namespace(AsyncClientNamespace("echo"))
    client.register_namespace(AsyncClientNamespace("/one"))
    with pytest.raises(ValueError, match="already registered"):
        client.register_namespace(AsyncClientNamespace("/one"))
    async with client:
        with pytest.raises(RuntimeError, match="before entering the async context"):
            client.register_namespace(AsyncClientNamespace("/two"))
        # Sandbox side: reserved paths and duplicates are refused too.
        assert "reserved by agentix-core" in await client.remote(p.claim_reserved, "/trace")
        assert await client.remote(p.claim_reserved, "/mine") == "accepted"
        assert await client.remote(p.register_twice) == "namespace '/echo' already registered"


async def test_daemon_refuses_reserved_and_malformed_namespaces(daemon):
    async with grpc.aio.insecure_channel(daemon.url) as channel:
        stub = pb_grpc.RuntimeServiceStub(channel)
        for name in ("/rpc", "/log", "/trace", "/", "nope"):
            call = stub.Namespace()
            await call.write(pb.NamespaceRequest(open=pb.OpenNamespace(namespace=name)))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        # An event before OpenNamespace is a protocol error, not a crash.
        call = stub.Namespace()
        await call.write(pb.NamespaceRequest(event=pb.NamespaceEvent(event="e", data=pack(1))))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # The daemon keeps serving.
        await stub.GetInfo(pb.GetInfoRequest(), timeout=10)


async def test_undecodable_payload_is_reported_and_nothing_breaks(daemon, collected):
    async with RuntimeClient(daemon.url) as client:
        await client.remote(p.registered_events)
        async with grpc.aio.insecure_channel(daemon.url) as channel:
            call = pb_grpc.RuntimeServiceStub(channel).Namespace()
            await call.write(pb.NamespaceRequest(open=pb.OpenNamespace(namespace="/echo")))
            first = await call.read()
            assert first.opened and first.namespace == "/echo" and first.instance_id
            await call.write(pb.NamespaceRequest(event=pb.NamespaceEvent(event="config", data=b"\xc1garbage")))
            await call.write(pb.NamespaceRequest(event=pb.NamespaceEvent(event="config", data=pack({"ok": 1}))))
            deadline = time.monotonic() + 10
            while not (seen := await client.remote(p.configs_seen)) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert seen == [{"ok": 1}]
            await call.done_writing()
        await wait_for(lambda: any("not valid msgpack" in m for m in collected.messages("agentix.sio")))


async def test_events_with_no_listening_host_are_reported_not_silently_lost(client, collected):
    assert await client.remote(p.emit_unheard, 3) == 3
    await wait_for(lambda: any("/lonely" in m for m in collected.messages("agentix.sio")))
    await asyncio.sleep(0.2)
    reports = [m for m in collected.messages("agentix.sio") if "/lonely" in m]
    assert len(reports) == 1
    assert "no host had it open" in reports[0] and "'tick'" in reports[0]


async def test_raw_stream_sees_request_ids_and_errors_without_decoding(daemon):
    """A client in another language reads request ids and errors from the
    proto fields alone."""
    async with grpc.aio.insecure_channel(daemon.url) as channel:
        stub = pb_grpc.RuntimeServiceStub(channel)
        ns = stub.Namespace()
        await ns.write(pb.NamespaceRequest(open=pb.OpenNamespace(namespace="/echo")))
        assert (await ns.read()).opened
        async with RuntimeClient(daemon.url) as client:
            task = asyncio.ensure_future(client.remote(p.ask_failing, "x"))
            request = None
            while request is None:
                response = await asyncio.wait_for(ns.read(), 10)
                request = next((e for e in response.events if e.event == "answer"), None)
            assert request.request_id and unpack(request.data)["request_id"] == request.request_id
            reply = {"request_id": request.request_id, "error": {"type": "Busy", "message": "later", "status_code": 503}}
            await ns.write(pb.NamespaceRequest(event=pb.NamespaceEvent(
                event="answer:error", data=pack(reply), request_id=request.request_id,
                error=pb.NamespaceError(type="Busy", message="later", status_code=503))))
            assert await asyncio.wait_for(task, 10) == ["Busy: later", "Busy", "later", 503]
        await ns.done_writing()


async def _a_second_stream_is_refused_and_the_first_goes_on(daemon, first):
    """With --max-namespace-streams 1 and `first`'s stream open: another
    host's stream is refused with the flag named, and `first` still works."""
    second = RuntimeClient(daemon.url)
    second.register_namespace(AsyncClientNamespace("/other"))
    with pytest.raises(Exception, match="RESOURCE_EXHAUSTED.*--max-namespace-streams"):
        async with second:
            pass
    await second.close()
    assert await first.remote(p.ask, "still") == {"a": "STILL"}


async def test_namespace_streams_are_bounded(start_daemon):
    daemon = start_daemon(extra_args=["--max-namespace-streams", "1"])
    first = RuntimeClient(daemon.url)
    first.register_namespace(HostEcho())
    async with first:
        await _a_second_stream_is_refused_and_the_first_goes_on(daemon, first)


async def test_a_direct_calls_daemon_keeps_the_namespace_guarantees_on_every_transport(start_daemon, monkeypatch):
    # The host asks on every frame-wire Namespace stream (HELLO agentix-direct: 1, with
    # AGENTIX_CALLS_DIRECT=auto): a daemon with --direct_calls hands it to the worker
    # (DIRECT-CALLS.md stage 8; gRPC streams stay relayed) — requests answered, events
    # delivered, the stream counted against --max-namespace-streams, whichever transport.
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "auto")
    daemon = start_daemon(extra_args=["--direct_calls", "--max-namespace-streams", "1"])
    host = HostEcho()
    first = RuntimeClient(daemon.url)
    first.register_namespace(host)
    async with first:
        assert await first.remote(p.ask, "direct?") == {"a": "DIRECT?"}
        await wait_for(lambda: len(host.progress) >= 2)
        assert host.progress == [{"stage": "asking", "q": "direct?"}, {"stage": "answered", "q": "direct?"}]
        await _a_second_stream_is_refused_and_the_first_goes_on(daemon, first)
    assert host.lifecycle[0] == "connect"


async def test_forged_lifecycle_events_and_hostile_names_from_the_sandbox_are_dropped(plugin, collected):
    # issue 17, item 1: the sandbox chooses event names; only the host's
    # stream says connect/disconnect, and odd or many names stay bounded.
    import hostile_names

    client, host = plugin
    assert await client.remote(hostile_names.emit_hostile_events, 1_000) == 1_000
    await wait_for(lambda: {"stage": "after hostile events"} in host.progress)
    assert host.lifecycle == ["connect"]  # no forged disconnect / connect reached the plugin
    assert len(host._warned_unhandled) <= 256
    drops = [m for m in collected.messages("agentix.sio") if "dropped an event from the sandbox" in m]
    assert len(drops) == 6 and all(len(m) < 500 for m in drops)
    unhandled = [m for m in collected.messages("agentix.sio") if "with no handler" in m]
    assert len(unhandled) == 256
    assert await client.remote(p.ask, "still") == {"a": "STILL"}


# ── a response the host cannot read (docs/RELIABILITY.md, "Host-side failures") ──

UNREADABLE = "unreadable-5e2d"


class Unreadable(Exception):
    """What the tests make reading a Namespace response raise."""


async def test_a_response_the_host_cannot_read_is_skipped_and_its_request_answered_with_an_error(
        daemon, monkeypatch, collected):
    # The stream used to end on it: the sandbox re-sent the request on the
    # re-opened stream (failing the same way until its timeout) and plain
    # events sent meanwhile were lost.
    from agentix.runtime.client import namespace_failures, namespaces

    real = namespaces._native_decoder

    def poisoned_decoder():
        decode = real()

        def read(message):
            if UNREADABLE.encode() in bytes(message):
                raise Unreadable("injected")
            return decode(message)

        return read

    monkeypatch.setattr(namespaces, "_native_decoder", poisoned_decoder)
    host = HostEcho()
    client = RuntimeClient(daemon.url)
    client.register_namespace(host)
    before = namespace_failures.lost_counts().get("/echo", {"undecodable_responses": 0, "answered_requests": 0})
    async with client:
        assert await client.remote(p.ask, "before") == {"a": "BEFORE"}
        stream = client._namespace_streams["/echo"]
        for attempt in (1, 2):
            text, type_, message, status = await asyncio.wait_for(client.remote(p.ask_failing, UNREADABLE, 5), 20)
            assert type_ == "MalformedError" and status is None, text
            assert "could not read the message carrying this request (Unreadable: injected)" in message
        # The stream stayed up: no reconnect, later events and requests arrive.
        assert await client.remote(p.ask, "after") == {"a": "AFTER"}
        await wait_for(lambda: len(host.progress) >= 4)
        assert [e["q"] for e in host.progress] == ["before", "before", "after", "after"]
        assert client._namespace_streams["/echo"] is stream and stream.alive and host.lifecycle == ["connect"]
    after = namespace_failures.lost_counts()["/echo"]
    assert after["undecodable_responses"] - before["undecodable_responses"] == 2
    assert after["answered_requests"] - before["answered_requests"] == 2
    reports = [r for r in collected.named("agentix.sio") if "could not be read" in r.getMessage()]
    assert [r.levelno for r in reports] == [logging.ERROR, logging.WARNING]
    assert type(reports[0].exc_info[1]) is Unreadable and reports[1].exc_info is None
    assert "1 request(s) in it answered with an error" in reports[0].getMessage()
