"""The host's Namespace streams (agentix.runtime.client.namespaces) against
FakeRuntime's Namespace method, on the native transport, on grpc.aio and on
the frame wire (fake_frames.py): all must behave the same towards the
namespace object and the client."""

import asyncio
import logging
import time

import grpc
import pytest
import pytest_asyncio

import sandbox_functions
from agentix import AsyncClientNamespace, RuntimeClient, request_handler
from agentix.runtime.client import namespaces
from agentix.runtime.client.errors import RuntimeUnreachable
from agentix.runtime.client.namespaces import FrameNamespaceStream, NamespaceStream, NativeNamespaceStream
from agentix.runtime.shared.codec import pack, unpack
from agentix.runtime.v1 import runtime_pb2 as pb
from fake_runtime import eventually

# Every test runs with the native transport, with grpc.aio and on the frame wire.
pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("transport")]


@pytest.fixture
def transport(calls_transport):
    """conftest's `calls_transport` (native, aio, frames): under "frames" the
    `runtime` fixture serves on a Unix socket with its frame wire, and the
    Namespace streams ride it as the Calls stream does."""
    return calls_transport


class Recorder(AsyncClientNamespace):
    def __init__(self, path="/plug"):
        super().__init__(path)
        self.seen = []

    def on_connect(self):
        self.seen.append("connect")

    def on_disconnect(self):
        self.seen.append("disconnect")

    def on_connect_error(self, data):
        self.seen.append(("connect_error", data))

    def on_tick(self, data):
        self.seen.append(("tick", data))

    @request_handler("echo")
    async def on_echo(self, body):
        return body

    @request_handler("blob")
    async def on_blob(self, body):
        return bytes([body]) * (3 << 20)  # more than the native send-ahead


def event(name, data, request_id=""):
    return pb.NamespaceEvent(event=name, data=pack(data), request_id=request_id)


@pytest_asyncio.fixture
async def plugin(runtime):
    ns = Recorder()
    client = RuntimeClient(runtime.url)
    client.register_namespace(ns)
    async with client:
        yield client, ns


async def test_the_selected_transport_carries_the_namespace(plugin, transport):
    client, ns = plugin
    stream = client._namespace_streams["/plug"]
    expected = {"native": NativeNamespaceStream, "aio": NamespaceStream, "frames": FrameNamespaceStream}[transport]
    assert type(stream) is expected
    assert stream.alive and ns.seen == ["connect"]


async def test_events_arrive_in_order_and_host_events_carry_their_fields(runtime, plugin):
    client, ns = plugin
    runtime.emit_namespace("/plug", event("tick", 1), event("tick", 2))
    runtime.emit_namespace("/plug", event("tick", 3))
    await eventually(lambda: len(ns.seen) == 4)
    assert ns.seen == ["connect", ("tick", 1), ("tick", 2), ("tick", 3)]

    await ns.emit("config", {"k": b"\x00"})
    await ns.emit("x:error", {"request_id": "r1", "error": {"type": "Busy", "message": "later", "status_code": 503}})
    await eventually(lambda: len(runtime.namespace_events.get("/plug", [])) == 2)
    first, second = runtime.namespace_events["/plug"]
    assert (first.event, unpack(first.data), first.request_id) == ("config", {"k": b"\x00"}, "")
    assert not first.HasField("error")
    assert (second.event, second.request_id) == ("x:error", "r1")
    assert (second.error.type, second.error.message, second.error.status_code) == ("Busy", "later", 503)


async def test_a_request_is_answered_by_the_request_handler(runtime, plugin):
    client, ns = plugin
    runtime.emit_namespace("/plug", event("echo", {"request_id": "q1", "data": {"i": 7}}, "q1"))
    await eventually(lambda: runtime.namespace_events.get("/plug"))
    (reply,) = runtime.namespace_events["/plug"]
    assert reply.event == "echo:result" and reply.request_id == "q1"
    assert unpack(reply.data) == {"request_id": "q1", "value": {"i": 7}}


async def test_a_handler_task_lets_go_of_itself_as_it_ends(runtime):
    """A coroutine handler's task leaves ``_detached_tasks`` as it ends, not
    in a done callback one event loop turn later: a callback scheduled in the
    task's last step (here: after the reply's emit) already finds it gone."""

    class Probe(Recorder):
        def __init__(self):
            super().__init__()
            self.held_after = []

        async def emit(self, event, data=None, namespace=None, callback=None):
            task = asyncio.current_task()
            assert task in self._detached_tasks  # held while it runs
            await super().emit(event, data, namespace, callback)
            asyncio.get_running_loop().call_soon(lambda: self.held_after.append(task in self._detached_tasks))

    ns = Probe()
    client = RuntimeClient(runtime.url)
    client.register_namespace(ns)
    async with client:
        for i in range(3):
            runtime.emit_namespace("/plug", event("echo", {"request_id": f"q{i}", "data": i}, f"q{i}"))
        await eventually(lambda: len(runtime.namespace_events.get("/plug", [])) == 3)
        await eventually(lambda: len(ns.held_after) == 3)
    assert ns.held_after == [False] * 3
    assert not ns._detached_tasks
    assert sorted(unpack(e.data)["value"] for e in runtime.namespace_events["/plug"]) == [0, 1, 2]


async def test_a_raising_coroutine_handler_is_logged_with_its_event(runtime, caplog):
    class Failing(Recorder):
        async def on_tick(self, data):
            if data == 1:
                raise KeyError("boom")
            super().on_tick(data)

    ns = Failing()
    client = RuntimeClient(runtime.url)
    client.register_namespace(ns)
    with caplog.at_level(logging.ERROR, logger="agentix.sio"):
        async with client:
            runtime.emit_namespace("/plug", event("tick", 1), event("tick", 2))
            await eventually(lambda: ("tick", 2) in ns.seen)
            await eventually(lambda: not ns._detached_tasks)
    (record,) = [r for r in caplog.records if "raised" in r.getMessage()]
    assert record.getMessage() == "namespace /plug: handler for 'tick' raised"
    assert record.exc_info[0] is KeyError


async def test_many_requests_in_flight_each_get_their_answer(runtime, plugin):
    client, ns = plugin
    for i in range(200):
        runtime.emit_namespace("/plug", event("echo", {"request_id": f"q{i}", "data": i}, f"q{i}"))
    await eventually(lambda: len(runtime.namespace_events.get("/plug", [])) == 200)
    replies = {e.request_id: unpack(e.data)["value"] for e in runtime.namespace_events["/plug"]}
    assert replies == {f"q{i}": i for i in range(200)}


async def test_large_replies_written_while_writes_back_up_all_arrive_whole(runtime, plugin):
    # The first reply fills the transport past its send-ahead; the handlers
    # answering after it must wait for the writes instead of piling on more.
    client, ns = plugin
    for i in range(4):
        runtime.emit_namespace("/plug", event("blob", {"request_id": f"b{i}", "data": i}, f"b{i}"))
    await eventually(lambda: len(runtime.namespace_events.get("/plug", [])) == 4, timeout=30)
    replies = {e.request_id: unpack(e.data)["value"] for e in runtime.namespace_events["/plug"]}
    assert replies == {f"b{i}": bytes([i]) * (3 << 20) for i in range(4)}


async def test_a_large_event_goes_out_whole(runtime, plugin):
    client, ns = plugin
    blob = bytes(range(256)) * (12 << 10)  # 3 MiB: more than the native send-ahead
    await ns.emit("big", blob)
    await ns.emit("after", 1)
    await eventually(lambda: len(runtime.namespace_events.get("/plug", [])) == 2)
    big, after = runtime.namespace_events["/plug"]
    assert unpack(big.data) == blob and after.event == "after"


async def test_triggers_run_one_at_a_time_in_order(runtime):
    class Slow(AsyncClientNamespace):
        def __init__(self):
            super().__init__("/plug")
            self.log = []

        async def trigger_event(self, event, *args):
            self.log.append(("start", event))
            if event == "tick" and unpack(args[0]) % 2 == 0:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0)
            self.log.append(("end", event))

    ns = Slow()
    client = RuntimeClient(runtime.url)
    client.register_namespace(ns)
    async with client:
        for i in range(6):
            runtime.emit_namespace("/plug", event("tick", i), event("tick", i + 100))
        await eventually(lambda: len(ns.log) == 2 + 24)
    await eventually(lambda: ns.log[-1] == ("end", "disconnect"))
    starts = [entry for entry in ns.log if entry[0] == "start"]
    assert [e for _, e in starts] == ["connect"] + ["tick"] * 12 + ["disconnect"]
    # Never two triggers at once: starts and ends alternate.
    assert [kind for kind, _ in ns.log] == ["start", "end"] * 14


async def test_a_raising_trigger_is_logged_and_the_next_event_still_arrives(runtime, caplog):
    class Failing(Recorder):
        def on_tick(self, data):
            if data == 1:
                raise KeyError("boom")
            super().on_tick(data)

    ns = Failing()
    client = RuntimeClient(runtime.url)
    client.register_namespace(ns)
    with caplog.at_level(logging.ERROR, logger="agentix.sio"):
        async with client:
            runtime.emit_namespace("/plug", event("tick", 1), event("tick", 2))
            await eventually(lambda: ("tick", 2) in ns.seen)
    assert any("handling event 'tick' raised" in r.getMessage() for r in caplog.records)


async def test_a_refused_namespace_raises_value_error_and_delivers_connect_error(runtime):
    runtime.namespace_refusals["/plug"] = (grpc.StatusCode.INVALID_ARGUMENT, "not that one")
    ns = Recorder()
    client = RuntimeClient(runtime.url)
    client.register_namespace(ns)
    with pytest.raises(ValueError, match="namespace /plug: the sandbox refused it: INVALID_ARGUMENT: not that one"):
        async with client:
            pass
    await client.close()
    assert ns.seen == [("connect_error", {"message": "not that one"})]


async def test_a_namespace_refused_for_lack_of_room_is_unreachable(runtime):
    runtime.namespace_refusals["/plug"] = (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many (--max-namespace-streams)")
    client = RuntimeClient(runtime.url)
    client.register_namespace(Recorder())
    with pytest.raises(RuntimeUnreachable, match="RESOURCE_EXHAUSTED.*--max-namespace-streams"):
        async with client:
            pass
    await client.close()


async def test_an_unconfirmed_stream_is_ended_by_the_watchdog(runtime, monkeypatch):
    monkeypatch.setattr(namespaces, "OPEN_TIMEOUT", 0.2)
    runtime.namespace_silent.add("/plug")
    ns = Recorder()
    client = RuntimeClient(runtime.url)
    client.register_namespace(ns)
    started = time.monotonic()
    with pytest.raises(RuntimeUnreachable, match="stream ended before it opened"):
        async with client:
            pass
    assert time.monotonic() - started < 5
    await client.close()
    assert ns.seen == []


async def test_an_unreadable_confirmation_fails_the_open_at_once(runtime, monkeypatch, caplog):
    # Later unreadable responses are skipped (testing/e2e/test_namespaces.py);
    # the daemon's first answer is the stream's opening, which cannot be.
    def unreadable():
        def decode(message):
            raise ValueError("unreadable")

        return decode

    monkeypatch.setattr(namespaces, "_native_decoder", unreadable)
    client = RuntimeClient(runtime.url)
    client.register_namespace(Recorder())
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="agentix.sio"):
        with pytest.raises(RuntimeUnreachable, match="stream ended before it opened"):
            async with client:
                pass
    assert time.monotonic() - started < namespaces.OPEN_TIMEOUT / 2
    await client.close()
    (failed,) = [r for r in caplog.records if r.name == "agentix.sio" and r.levelno == logging.ERROR]
    assert "stream failed" in failed.getMessage() and type(failed.exc_info[1]) is ValueError


async def test_a_lost_stream_warns_disconnects_and_is_reopened_by_the_next_call(runtime, plugin, caplog):
    client, ns = plugin
    with caplog.at_level(logging.WARNING, logger="agentix.sio"):
        runtime.drop_namespaces(grpc.StatusCode.UNAVAILABLE, "cut")
        await eventually(lambda: ns.seen == ["connect", "disconnect"])
    (warning,) = [r for r in caplog.records if r.name == "agentix.sio"]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == (
        "namespace /plug: stream to the sandbox lost (UNAVAILABLE: cut); re-opened by the next call"
    )
    stream = client._namespace_streams["/plug"]
    assert not stream.alive
    with pytest.raises(RuntimeError, match="namespace /plug: the stream to the sandbox is closed"):
        await stream.send("e", pack(1), "", None)
    client._namespaces_reopened_at = float("-inf")
    assert await client.remote(sandbox_functions.add, 1, 2) == 3
    await eventually(lambda: client._namespace_streams["/plug"].alive and ns.seen[-1] == "connect")
    assert runtime.namespaces_opened == 2


async def test_a_calls_stream_lost_while_its_reconnect_confirms_the_namespaces_is_reconnected_again(runtime):
    # Stop 41's direct-namespace hang: the reconnect's new Calls stream (the
    # pending call resumed on it) was lost while the reconnect waited for its
    # namespaces' confirmation; the loss did not start a reconnect (one was
    # running) and the running one returned as if connected: the call waited
    # for ever with no stream. Here the confirmation waits for a gate and the
    # new stream is dropped meanwhile: a third stream must resume the call.
    ns = Recorder()
    client = RuntimeClient(runtime.url, reconnection_delay=0.05)
    client.register_namespace(ns)
    async with client:
        call = asyncio.create_task(client.remote(sandbox_functions.sleep_forever))
        await eventually(lambda: runtime.started)
        (call_id,) = runtime.started
        runtime.namespace_gate = asyncio.Event()
        runtime.drop_namespaces()
        await eventually(lambda: not client._namespace_streams["/plug"].alive)
        namespaces_opened = runtime.namespaces_opened
        runtime.drop_streams()
        # The second stream carries the call's resume; drop it only once the
        # fake has read that (dropped earlier, the resume may never be read and
        # only the third stream's would count).
        await eventually(
            lambda: runtime.streams_opened == 2
            and runtime.namespaces_opened == namespaces_opened + 1
            and len(runtime.events("resume")) == 1
        )
        runtime.drop_streams()
        await eventually(lambda: client._stream is None)
        runtime.namespace_gate.set()
        await eventually(lambda: runtime.streams_opened == 3 and client._stream is not None and client._stream.alive)
        await eventually(lambda: len(runtime.events("resume")) == 2)
        assert [list(resume.call_ids) for resume in runtime.events("resume")] == [[call_id], [call_id]]
        assert not call.done()
        assert await client.remote(sandbox_functions.add, 3, 4) == 7
    with pytest.raises(RuntimeUnreachable, match="closed"):
        await call


async def test_aclose_is_idempotent_and_disconnects_once(runtime, plugin, caplog):
    client, ns = plugin
    stream = client._namespace_streams["/plug"]
    with caplog.at_level(logging.WARNING, logger="agentix.sio"):
        await ns.disconnect()
        await stream.aclose()
    assert not stream.alive
    assert ns.seen == ["connect", "disconnect"]
    assert not [r for r in caplog.records if r.name == "agentix.sio"]
    with pytest.raises(RuntimeError, match="the stream to the sandbox is closed"):
        await stream.send("e", pack(1), "", None)


async def test_a_handler_may_close_its_own_namespace(runtime):
    class Quitter(Recorder):
        async def trigger_event(self, event, *args):
            await super().trigger_event(event, *args)
            if event == "tick":
                await self.disconnect()

    ns = Quitter()
    client = RuntimeClient(runtime.url)
    client.register_namespace(ns)
    async with client:
        runtime.emit_namespace("/plug", event("tick", 1), event("tick", 2))
        await eventually(lambda: "disconnect" in ns.seen)
        await asyncio.sleep(0.05)
        assert ns.seen == ["connect", ("tick", 1), "disconnect"]


async def test_triggers_and_handlers_run_inside_a_task(runtime):
    """As on grpc.aio (where the stream's task runs every trigger): code that
    needs a current task (asyncio.timeout, anyio, sniffio) works in an
    overridden trigger_event, in a coroutine lifecycle handler and in a sync
    data handler."""

    class Needy(AsyncClientNamespace):
        def __init__(self):
            super().__init__("/plug")
            self.seen = []

        async def on_connect(self):
            async with asyncio.timeout(5):
                await asyncio.sleep(0)
            self.seen.append(("connect", asyncio.current_task() is not None))

        def on_tick(self, data):
            self.seen.append(("tick", data, asyncio.current_task() is not None))

    class NeedyOverride(Needy):
        async def trigger_event(self, event, *args):
            async with asyncio.timeout(5):
                return await super().trigger_event(event, *args)

    for cls in (Needy, NeedyOverride):
        ns = cls()
        client = RuntimeClient(runtime.url)
        client.register_namespace(ns)
        async with client:
            runtime.emit_namespace("/plug", event("tick", 1))
            await eventually(lambda: len(ns.seen) == 2)
        assert ns.seen == [("connect", True), ("tick", 1, True)], cls.__name__


async def test_events_the_native_decoder_leaves_to_protobuf_arrive_the_same(runtime, transport, monkeypatch):
    # The native decoder hands rare message forms to protobuf; make it hand
    # over every message, and the stream must deliver exactly as before.
    handed_over = []

    def protobuf_only():
        def decode(message):
            handed_over.append(message)
            return None

        return decode

    monkeypatch.setattr(namespaces, "_native_decoder", protobuf_only)
    ns = Recorder()
    client = RuntimeClient(runtime.url)
    client.register_namespace(ns)
    async with client:
        runtime.emit_namespace("/plug", event("tick", 1), event("tick", 2))
        runtime.emit_namespace("/plug", event("echo", {"request_id": "q1", "data": "hé"}, "q1"))
        await eventually(lambda: len(ns.seen) == 3 and runtime.namespace_events.get("/plug"))
        assert ns.seen == ["connect", ("tick", 1), ("tick", 2)]
        (reply,) = runtime.namespace_events["/plug"]
        assert unpack(reply.data) == {"request_id": "q1", "value": "hé"}
    if transport in ("native", "frames"):
        assert handed_over  # every message went by protobuf


# ── sandbox-chosen event names and request ids are bounded (issue 17, item 1) ──


async def test_sandbox_events_with_names_the_host_refuses_are_dropped(runtime, plugin, caplog):
    client, ns = plugin
    refused = ["disconnect", "connect", "connect_error", "", "t" * 100_000, "bad\nname", "nul\x00"]
    with caplog.at_level(logging.DEBUG, logger="agentix.sio"):
        runtime.emit_namespace("/plug", *(event(name, 0) for name in refused), event("tick", 1))
        await eventually(lambda: ("tick", 1) in ns.seen)
        runtime.emit_namespace("/plug", event("disconnect", 0), event("tick", 2))
        await eventually(lambda: ("tick", 2) in ns.seen)
    # No forged lifecycle event reached the plugin; the stream is still up.
    assert ns.seen == ["connect", ("tick", 1), ("tick", 2)]
    assert client._namespace_streams["/plug"].alive
    drops = [r for r in caplog.records if "dropped an event from the sandbox" in r.getMessage()]
    assert len(drops) == len(refused) + 1
    assert [r.levelno for r in drops] == [logging.WARNING] + [logging.DEBUG] * len(refused)
    assert all(len(r.getMessage()) < 500 for r in drops)
    runtime.emit_namespace("/plug", event("echo", {"request_id": "q1", "data": 5}, "q1"))
    await eventually(lambda: runtime.namespace_events.get("/plug"))
    assert unpack(runtime.namespace_events["/plug"][0].data) == {"request_id": "q1", "value": 5}


async def test_event_names_at_the_bound_are_delivered():
    assert namespaces.valid_event_name("e" * namespaces.MAX_EVENT_NAME_CHARS)
    assert namespaces.valid_event_name("ünï:result")
    assert not namespaces.valid_event_name("e" * (namespaces.MAX_EVENT_NAME_CHARS + 1))


async def test_distinct_unhandled_event_names_are_reported_a_bounded_number_of_times(runtime, plugin, caplog):
    client, ns = plugin
    with caplog.at_level(logging.WARNING, logger="agentix.sio"):
        for start in range(0, 2_000, 500):
            runtime.emit_namespace("/plug", *(event(f"nohandler{i}", i) for i in range(start, start + 500)))
        runtime.emit_namespace("/plug", event("tick", 1))
        await eventually(lambda: ("tick", 1) in ns.seen, timeout=20)
    warned = [r for r in caplog.records if "with no handler" in r.getMessage()]
    assert len(ns._warned_unhandled) == len(warned) == 256
    assert "later names without a handler are not" in warned[-1].getMessage()


async def test_over_long_request_ids_are_answered_but_not_remembered(runtime, plugin):
    client, ns = plugin
    long_id = "r" * 1_000_000
    for _ in range(2):  # a repeat of a remembered id would get the first reply again, not a new answer
        runtime.emit_namespace("/plug", event("echo", {"request_id": long_id, "data": 1}))
    runtime.emit_namespace("/plug", event("echo", {"request_id": "q1", "data": 2}, "q1"))
    await eventually(lambda: len(runtime.namespace_events.get("/plug", [])) == 3)
    answers = [unpack(e.data) for e in runtime.namespace_events["/plug"]]
    assert sorted(a["value"] for a in answers) == [1, 1, 2]
    assert list(ns._agentix_replies) == ["q1"]


async def test_remembered_replies_are_bounded_in_bytes(runtime, plugin, monkeypatch):
    from agentix.runtime.client import _sio_facade

    client, ns = plugin
    monkeypatch.setattr(_sio_facade, "_REMEMBERED_REPLY_BYTES", 8 << 20)
    for i in range(12):  # "blob" answers 3 MiB each
        runtime.emit_namespace("/plug", event("blob", {"request_id": f"b{i}", "data": i}, f"b{i}"))
    await eventually(lambda: len(runtime.namespace_events.get("/plug", [])) == 12, timeout=30)
    replies = ns._agentix_replies
    assert len(replies) == 2 and list(replies) == ["b10", "b11"]
    assert sum(len(pack(replies.get(i)[1])) for i in replies) <= 8 << 20
    # A repeat of a remembered id gets its answer again without a second call.
    runtime.emit_namespace("/plug", event("blob", {"request_id": "b11", "data": 0}, "b11"))
    await eventually(lambda: len(runtime.namespace_events["/plug"]) == 13, timeout=30)
    assert unpack(runtime.namespace_events["/plug"][-1].data)["value"] == bytes([11]) * (3 << 20)
