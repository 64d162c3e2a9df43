"""agentix.sio (sandbox side of plugin namespaces) and the host facade
(AsyncClientNamespace, request_handler), without a daemon: a recording
bridge stands in for the worker's channel."""

import asyncio
import gc
import logging
import warnings

import pytest

import agentix
import agentix.sio as sio
from agentix import AsyncClientNamespace, Namespace, RemoteSioError, register_namespace, request_handler
from agentix.runtime.client._sio_facade import attach
from agentix.runtime.shared.codec import pack, unpack


def test_public_names():
    assert sorted(sio.__all__) == ["Namespace", "RESERVED_NAMESPACES", "RemoteSioError", "register_namespace"]
    for name in ("Namespace", "RemoteSioError", "register_namespace", "AsyncClientNamespace", "request_handler"):
        assert name in agentix.__all__
    assert sio.RESERVED_NAMESPACES == {"/rpc", "/log", "/trace"}


def test_namespace_path_rules():
    class Plugin(Namespace):
        namespace = "/plugin"

    assert Plugin().namespace == "/plugin"
    assert Namespace("/other").namespace == "/other"
    with pytest.raises(ValueError, match="starting with '/'"):
        Namespace("plugin")
    with pytest.raises(ValueError, match="starting with '/'"):
        Namespace()
    for reserved in ("/rpc", "/log", "/trace"):
        with pytest.raises(ValueError, match=f"namespace '{reserved}' is reserved by agentix-core"):
            Namespace(reserved)

    class Core(Namespace):
        _allow_reserved = True

    assert Core("/trace").namespace == "/trace"


def test_handlers_on_off_and_snapshot():
    calls = []

    class Plugin(Namespace):
        namespace = "/p"

        def on_hello(self, data):
            calls.append(("hello", data))

    ns = Plugin()

    def extra(data):
        calls.append(("extra", data))

    assert ns.on("x:result", extra) is extra
    snapshot = ns.registered_handlers()
    assert sorted(snapshot) == ["hello", "x:result"]
    snapshot["hello"].clear()  # a snapshot, not the live table
    ns._dispatch("hello", 1)
    ns._dispatch("x:result", 2)
    assert calls == [("hello", 1), ("extra", 2)]
    ns.off("x:result", extra)
    assert "x:result" not in ns.registered_handlers()
    ns.off("hello")
    assert ns.registered_handlers() == {}


def test_register_namespace_rejects_duplicates(bridge):
    first = register_namespace(Namespace("/dup"))
    assert sio._registry["/dup"] is first
    with pytest.raises(ValueError, match="namespace '/dup' already registered"):
        register_namespace(Namespace("/dup"))
    with pytest.raises(TypeError):
        register_namespace(object())


@pytest.mark.asyncio
async def test_emit_outside_a_worker_raises():
    with pytest.raises(RuntimeError, match="only callable from inside a sandbox runtime worker"):
        await Namespace("/p").emit("e", 1)
    with pytest.raises(RuntimeError, match="only callable from inside a sandbox runtime worker"):
        await Namespace("/p").request("e", 1)


@pytest.mark.asyncio
async def test_emit_goes_through_the_bridge(bridge):
    ns = Namespace("/p")
    await ns.emit("evt", {"k": b"\x00", "t": (1, 2)})
    assert bridge.sent == [("/p", "evt", {"k": b"\x00", "t": [1, 2]}, "", None)]


@pytest.mark.asyncio
async def test_request_result_error_and_timeout(bridge):
    ns = register_namespace(Namespace("/p"))
    task = asyncio.ensure_future(ns.request("ask", {"q": 1}, timeout=5))
    await asyncio.sleep(0)
    namespace, event, payload, request_id, _ = bridge.sent[-1]
    assert (namespace, event, payload["data"]) == ("/p", "ask", {"q": 1})
    assert request_id == payload["request_id"] and len(request_id) == 32
    sio._deliver("/p", "ask:result", pack({"request_id": "someone-else", "value": 0}))
    sio._deliver("/p", "ask:result", pack({"request_id": request_id, "value": {"a": 2}}))
    assert await task == {"a": 2}

    task = asyncio.ensure_future(ns.request("ask", None, timeout=5))
    await asyncio.sleep(0)
    request_id = bridge.sent[-1][3]
    sio._deliver("/p", "ask:error", pack({"request_id": request_id,
                                          "error": {"type": "KeyError", "message": "m", "status_code": 418}}))
    with pytest.raises(RemoteSioError) as info:
        await task
    assert str(info.value) == "KeyError: m"
    assert (info.value.type, info.value.message, info.value.status_code) == ("KeyError", "m", 418)
    assert isinstance(info.value, RuntimeError)

    with pytest.raises(TimeoutError, match="no reply to request 'ask' within 0.05 s"):
        await ns.request("ask", None, timeout=0.05)
    assert ns._pending == {}


@pytest.mark.asyncio
async def test_request_without_timeout_waits_and_a_cancelled_one_cleans_up(bridge):
    ns = register_namespace(Namespace("/p"))
    task = asyncio.ensure_future(ns.request("ask", 1, timeout=None))
    await asyncio.sleep(0.1)
    assert not task.done()
    sio._deliver("/p", "ask:result", pack({"request_id": bridge.sent[-1][3], "value": "late"}))
    assert await task == "late"

    task = asyncio.ensure_future(ns.request("ask", 2, timeout=0.05))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ns._pending == {}
    await asyncio.sleep(0.1)  # its timer, cancelled, must not fire into anything


@pytest.mark.asyncio
async def test_request_deadlines_each_fire_on_time_whatever_is_pending(bridge):
    """Deadlines share one timer per loop: a shorter timeout than the one it
    is armed for, and several requests in a row, all still fail on time."""
    ns = register_namespace(Namespace("/p"))
    loop = asyncio.get_running_loop()
    long_wait = asyncio.ensure_future(ns.request("ask", 0, timeout=30))
    await asyncio.sleep(0)
    started = loop.time()
    with pytest.raises(TimeoutError, match="within 0.05 s"):
        await ns.request("ask", 1, timeout=0.05)
    first = loop.time() - started
    answered = asyncio.ensure_future(ns.request("ask", 2, timeout=0.1))
    later = [asyncio.ensure_future(ns.request("ask", i, timeout=0.1 + 0.05 * i)) for i in (3, 4)]
    await asyncio.sleep(0)
    sio._deliver("/p", "ask:result", pack({"request_id": bridge.sent[-3][3], "value": "ok"}))
    assert await answered == "ok"
    for task in later:
        with pytest.raises(TimeoutError):
            await task
    assert 0.04 < first < 1 and loop.time() - started < 2
    assert not long_wait.done()
    long_wait.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long_wait
    assert ns._pending == {}


@pytest.mark.asyncio
async def test_request_from_another_thread_and_loop(bridge):
    ns = register_namespace(Namespace("/p"))
    loop = asyncio.get_running_loop()
    result = loop.run_in_executor(None, lambda: asyncio.run(ns.request("ask", 1, timeout=5)))
    while not bridge.sent:
        await asyncio.sleep(0.01)
    sio._deliver("/p", "ask:result", pack({"request_id": bridge.sent[-1][3], "value": "from loop"}))
    assert await result == "from loop"


def test_remote_sio_error_status_code_is_int_only():
    assert RemoteSioError("T", "m", "500").status_code is None
    assert RemoteSioError("T", "m", True).status_code is None
    assert RemoteSioError("T", "m", 502).status_code == 502


@pytest.mark.asyncio
async def test_dispatch_logs_failures_and_unhandled_events_once(bridge, caplog):
    class Plugin(Namespace):
        namespace = "/p"

        def on_sync_fail(self, data):
            raise ValueError("sync boom")

        async def on_async_fail(self, data):
            raise KeyError("async boom")

    ns = register_namespace(Plugin())
    caplog.set_level(logging.DEBUG, logger="agentix.sio")
    sio._deliver("/p", "sync_fail", pack(1))
    sio._deliver("/p", "async_fail", pack(1))
    assert len(ns._detached_tasks) == 1  # held strongly while it runs
    await asyncio.sleep(0.01)
    assert not ns._detached_tasks
    for _ in range(2):
        sio._deliver("/p", "typo", pack(1))
    sio._deliver("/p", "bad", b"\xc1")
    sio._deliver("/unregistered", "e", pack(1))
    sio._deliver("/unregistered", "e", pack(1))
    messages = [r.getMessage() for r in caplog.records]
    assert any("'sync_fail' raised" in m for m in messages)
    assert any("'async_fail' raised" in m for m in messages)
    unhandled = [m for m in messages if "'typo' with no handler" in m]
    assert len(unhandled) == 1
    assert "registered: ['async_fail', 'sync_fail']" in unhandled[0]
    assert any("'bad' dropped: its payload is not valid msgpack" in m for m in messages)
    assert len([m for m in messages if "/unregistered" in m]) == 1


@pytest.mark.asyncio
async def test_host_namespace_dispatch_and_lifecycle(caplog):
    seen = []

    class Host(AsyncClientNamespace):
        def on_connect(self):
            seen.append("connect")

        def on_data(self, data):
            seen.append(data)

        async def on_slow(self, data):
            await asyncio.sleep(10)

    ns = Host("/h")
    await ns.trigger_event("connect")
    await ns.trigger_event("data", pack({"x": b"\x01"}))
    started = asyncio.get_running_loop().time()
    await ns.trigger_event("slow", pack(None))  # detached: returns at once
    assert asyncio.get_running_loop().time() - started < 1
    assert len(ns._detached_tasks) == 1
    await ns.trigger_event("disconnect")  # no handler: fine
    caplog.set_level(logging.WARNING, logger="agentix.sio")
    await ns.trigger_event("missing", pack(1))
    await ns.trigger_event("missing", pack(1))
    assert seen == ["connect", {"x": b"\x01"}]
    assert len([r for r in caplog.records if "'missing' with no handler" in r.getMessage()]) == 1
    detached = list(ns._detached_tasks)
    for task in detached:
        task.cancel()
    await asyncio.gather(*detached, return_exceptions=True)  # ended before the loop closes
    with pytest.raises(RuntimeError, match="not registered with a RuntimeClient"):
        await ns.emit("e", 1)


class FakeLink:
    """Records what a namespace sends (its `NamespaceLink`). `nowait`:
    whether the stream takes replies without waiting (the fast path of
    request_handler)."""

    def __init__(self, path, nowait=False):
        self.path = path
        self.sent = []
        self.nowait = nowait

    def send_nowait(self, event, payload, request_id):
        if not self.nowait:
            return False
        data = unpack(payload)
        assert request_id == (data.get("request_id") if isinstance(data.get("request_id"), str) else "")
        self.sent.append((self.path, event, data))
        return True

    async def emit(self, event, data, payload=None):
        # A payload handed over must be what emit() would have packed.
        assert payload is None or payload == pack(data)
        self.sent.append((self.path, event, data))

    async def close(self):
        pass


def fake_link(ns, nowait=False):
    """Registers `ns` as a client would, with a FakeLink; returns the link."""
    link = FakeLink(ns.namespace, nowait)
    attach(ns, None, link)
    return link


@pytest.mark.asyncio
@pytest.mark.parametrize("nowait", [False, True], ids=["awaited", "nowait"])
async def test_request_handler_replies(nowait):
    class Host(AsyncClientNamespace):
        @request_handler("ask")
        async def on_ask(self, body):
            if body == "fail":
                error = LookupError("nope")
                error.status_code = 404
                raise error
            if body == "unencodable":
                return object()
            return {"echo": body}

        @request_handler("plain")
        def on_plain(self, body):
            return body * 2

    ns = Host("/h")
    link = fake_link(ns, nowait)
    await ns.on_ask({"request_id": "r1", "data": "hi"})
    await ns.on_ask({"request_id": "r2", "data": "fail"})
    await ns.on_ask({"request_id": "r3", "data": "unencodable"})
    await ns.on_plain(21)  # not an envelope: body as is, request_id None
    sent = link.sent
    assert sent[0] == ("/h", "ask:result", {"request_id": "r1", "value": {"echo": "hi"}})
    assert sent[1] == ("/h", "ask:error",
                       {"request_id": "r2", "error": {"type": "LookupError", "message": "nope", "status_code": 404}})
    assert sent[2][1] == "ask:error" and sent[2][2]["error"]["type"] == "TypeError"
    assert sent[3] == ("/h", "plain:result", {"request_id": None, "value": 42})


@pytest.mark.asyncio
async def test_request_handler_replies_through_an_overridden_emit():
    class Host(AsyncClientNamespace):
        def __init__(self):
            super().__init__("/h")
            self.emitted = []

        async def emit(self, event, data=None, namespace=None, callback=None):
            self.emitted.append((event, data))
            await super().emit(event, data)

        @request_handler("ask")
        async def on_ask(self, body):
            return body

    ns = Host()
    link = fake_link(ns)
    await ns.on_ask({"request_id": "r1", "data": 5})
    await ns.on_ask({"request_id": "r1", "data": 5})  # repeated: the reply is replayed
    assert ns.emitted == [("ask:result", {"request_id": "r1", "value": 5})] * 2
    assert link.sent == [("/h", "ask:result", {"request_id": "r1", "value": 5})] * 2


@pytest.mark.asyncio
async def test_pending_requests_are_sent_again_when_a_host_connects(bridge):
    ns = register_namespace(Namespace("/p"))
    task = asyncio.ensure_future(ns.request("ask", {"q": 1}, timeout=5))
    await asyncio.sleep(0)
    first = bridge.sent[-1]
    sio._deliver("/p", "agentix:host_connected", pack(None))
    assert bridge.sent[-1] == first  # the same request, same request_id
    assert len(bridge.sent) == 2
    sio._deliver("/p", "ask:result", pack({"request_id": first[3], "value": 7}))
    assert await task == 7
    sio._deliver("/p", "agentix:host_connected", pack(None))  # nothing pending any more
    sio._deliver("/unregistered", "agentix:host_connected", pack(None))  # silent
    assert len(bridge.sent) == 2


@pytest.mark.asyncio
async def test_request_handler_answers_a_repeated_request_once():
    calls = []

    class Host(AsyncClientNamespace):
        @request_handler("ask")
        async def on_ask(self, body):
            calls.append(body)
            await asyncio.sleep(0.05)
            return body + 1

    ns = Host("/h")
    link = fake_link(ns)
    envelope = {"request_id": "r1", "data": 1}
    await asyncio.gather(ns.on_ask(envelope), ns.on_ask(envelope))  # the second while in progress
    await ns.on_ask(envelope)  # after the answer: the reply is replayed
    assert calls == [1]
    assert link.sent == [("/h", "ask:result", {"request_id": "r1", "value": 2})] * 2


@pytest.mark.asyncio
async def test_a_detached_handler_cancelled_before_its_first_step_is_let_go_and_closed():
    """A coroutine handler detached from inside a running task starts at the
    loop's next turn; cancelled before then (a plugin cancelling its
    namespace's tasks, a loop shutting down), its task still leaves
    ``_detached_tasks`` and the handler's coroutine is closed, not left
    "never awaited"."""
    started = []

    class Host(AsyncClientNamespace):
        async def on_slow(self, data):
            started.append(data)
            await asyncio.sleep(10)

    ns = Host("/h")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await ns.trigger_event("slow", pack(1))  # from this task: its first step waits for the next turn
        (task,) = ns._detached_tasks
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)  # the done callbacks' turn
        assert task.cancelled() and started == []
        assert not ns._detached_tasks
        del task
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
