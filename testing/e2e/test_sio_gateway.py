"""`agentix-sio-gateway` end to end: a python-socketio `AsyncClient` and plain
HTTP emitting the ORIGINAL wire's exact shapes (SPEC §2) against the gateway
process in front of a real `agentix-sandboxd` + worker.

Every event payload is one binary attachment holding a msgpack map, as the
original host sends it (SPEC §2.2)."""

import asyncio
import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import uuid

import aiohttp
import msgpack
import pytest
import socketio

from conftest import disconnect_sio

import e2e_targets
import plugin_targets

pytestmark = pytest.mark.asyncio

MiB = 1 << 20
ERROR_KEYS = {"type", "message", "traceback", "cancelled", "returncode"}


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data):
    return msgpack.unpackb(data, raw=False)


def _gateway_main():
    import importlib.util

    # Run by path, as bootstrap.sh does (not -m: that imports agentix first).
    return importlib.util.find_spec("agentix").submodule_search_locations[0] + "/gateway/__main__.py"


GATEWAY_MAIN = _gateway_main()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GatewayProc:
    """`python -m agentix.gateway` beside a daemon, as bootstrap.sh starts it."""

    def __init__(self, tmp_path, daemon_url, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"gateway-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", GATEWAY_MAIN, "--daemon", daemon_url, "--port", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    async def wait_healthy(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, self.log()
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{self.url}/health") as r:
                        if r.status == 200:
                            return await r.json()
                await asyncio.sleep(0.02)
        raise AssertionError(f"gateway not healthy:\n{self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
async def gateway(daemon, tmp_path):
    gw = GatewayProc(tmp_path, daemon.url)
    try:
        await gw.wait_healthy()
        yield gw
    finally:
        assert gw.stop() == 0, gw.log()


class LegacyHost:
    """The original RuntimeClient's wire behaviour, by hand: per-call queues,
    `ack` for every routed result, `resume` with pending ids on connect."""

    def __init__(self, url, namespaces=("/rpc", "/trace", "/log"), **kwargs):
        self.url = url
        # (Debian's python-engineio 4.3 client has no websocket_extra_options.)
        # engine.io's handshake waits 5 s by default; a connection that arrives
        # while the gateway loads is held until it has (seconds on a loaded machine).
        kwargs.setdefault("request_timeout", 30)
        self.sio = socketio.AsyncClient(**kwargs)
        self.namespaces = list(namespaces)
        self.results = {}  # call_id -> list of (event, payload)
        self.waiters = {}
        self.pending = set()
        self.unkeyed_errors = []
        self.resume_on_connect = True
        for event in ("call:result", "call:error"):
            self.sio.on(event, self._handler(event), namespace="/rpc")
        self.sio.on("connect", self._on_connect, namespace="/rpc")

    def _handler(self, event):
        async def handle(data):
            payload = unpack(data)
            call_id = payload.get("call_id")
            if not call_id:
                self.unkeyed_errors.append(payload)
                return
            self.results.setdefault(call_id, []).append((event, payload))
            waiter = self.waiters.get(call_id)
            if waiter is not None and not waiter.done():
                waiter.set_result((event, payload))
            await self.sio.emit("ack", pack({"call_id": call_id}), namespace="/rpc")
        return handle

    async def _on_connect(self):
        if self.resume_on_connect and self.pending:
            await self.sio.emit("resume", pack({"call_ids": sorted(self.pending)}), namespace="/rpc")

    async def connect(self):
        await self.sio.connect(self.url, namespaces=self.namespaces, wait_timeout=10)

    def expect(self, call_id):
        self.pending.add(call_id)
        fut = asyncio.get_running_loop().create_future()
        self.waiters[call_id] = fut
        return fut

    async def call(self, fn, *args, timeout=60, **kwargs):
        call_id = uuid.uuid4().hex
        fut = self.expect(call_id)
        await self.sio.emit("call", pack({"call_id": call_id, "callable": f"{fn.__module__}::{fn.__qualname__}",
                                          "arguments": pickle.dumps((args, kwargs))}), namespace="/rpc")
        event, payload = await asyncio.wait_for(fut, timeout)
        self.pending.discard(call_id)
        return call_id, event, payload


@pytest.fixture
async def host(gateway):
    h = LegacyHost(gateway.url)
    await h.connect()
    yield h
    await disconnect_sio(h.sio)


def ref(fn):
    return f"{fn.__module__}::{fn.__qualname__}"


async def test_health_is_the_originals_json(gateway):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.url}/health") as r:
            assert r.status == 200
            # FastAPI's JSONResponse bytes, as the original answered.
            assert await r.read() == b'{"status":"ok","version":"0.2.7"}'
            assert r.headers["Content-Type"] == "application/json"
        async with http.post(f"{gateway.url}/_remote") as r:
            assert r.status == 404  # everything else is not ours (SPEC §2.1)


async def test_call_result_and_error_shapes(host):
    call_id, event, payload = await host.call(e2e_targets.add, 2, 3)
    assert event == "call:result" and set(payload) == {"call_id", "value"}
    assert payload["call_id"] == call_id and pickle.loads(payload["value"]) == 5

    call_id, event, payload = await host.call(e2e_targets.raise_value_error, "boom")
    assert event == "call:error" and set(payload) == {"call_id", "error"}
    error = payload["error"]
    assert set(error) == ERROR_KEYS
    assert (error["type"], error["message"], error["cancelled"], error["returncode"]) == \
        ("ValueError", "boom", False, None)
    assert "raise_value_error" in error["traceback"]

    _, event, payload = await host.call(e2e_targets.kill_self)
    assert event == "call:error" and payload["error"]["type"] == "WorkerDied"
    assert payload["error"]["returncode"] == -9
    # The worker is replaced; the gateway keeps serving.
    _, event, payload = await host.call(e2e_targets.add, 1, 1)
    assert pickle.loads(payload["value"]) == 2


async def test_concurrent_calls_multiplexed_on_one_connection(host):
    outcomes = await asyncio.gather(*(host.call(e2e_targets.add, i, i) for i in range(50)))
    assert [pickle.loads(p["value"]) for _, _, p in outcomes] == [2 * i for i in range(50)]


async def test_duplicate_call_runs_once(host):
    """`call` twice, then POST /call, then `resume` on one id: one execution."""
    call_id = uuid.uuid4().hex
    fut = host.expect(call_id)
    body = pack({"call_id": call_id, "callable": ref(e2e_targets.count_calls),
                 "arguments": pickle.dumps(((), {}))})
    before = (await host.call(e2e_targets.count_calls))[2]
    await host.sio.emit("call", body, namespace="/rpc")
    await host.sio.emit("call", body, namespace="/rpc")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{host.url}/call", data=body,
                             headers={"content-type": "application/msgpack"}) as r:
            assert r.status in (200, 202)
    event, payload = await asyncio.wait_for(fut, 30)
    assert pickle.loads(payload["value"]) == pickle.loads(before["value"]) + 1
    after = (await host.call(e2e_targets.count_calls))[2]
    assert pickle.loads(after["value"]) == pickle.loads(payload["value"]) + 1


async def test_bad_call_payloads_get_the_originals_errors(host):
    # Missing call_id -> BadRequest to that sid, call_id "".
    await host.sio.emit("call", pack({"callable": ref(e2e_targets.noop)}), namespace="/rpc")
    # Malformed msgpack and a non-binary payload -> BadRequest too.
    await host.sio.emit("call", b"\xc1\xc1\xc1", namespace="/rpc")
    await host.sio.emit("call", {"call_id": "x"}, namespace="/rpc")
    await host.sio.emit("no-such-event", pack({}), namespace="/rpc")  # ignored
    deadline = time.monotonic() + 10
    while len(host.unkeyed_errors) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert [e["error"]["type"] for e in host.unkeyed_errors] == ["BadRequest"] * 3
    assert host.unkeyed_errors[0] == {"call_id": "", "error": {
        "type": "BadRequest", "message": "missing call_id", "traceback": None, "cancelled": False,
        "returncode": None}}
    # Missing callable / arguments, wrong types: the call's own error.
    for body, expected in (({}, "KeyError"), ({"callable": ref(e2e_targets.noop)}, "KeyError"),
                           ({"callable": 3, "arguments": b""}, "ValidationError")):
        call_id = uuid.uuid4().hex
        fut = host.expect(call_id)
        await host.sio.emit("call", pack({"call_id": call_id, **body}), namespace="/rpc")
        event, payload = await asyncio.wait_for(fut, 10)
        assert event == "call:error" and payload["error"]["type"] == expected
        assert set(payload["error"]) == ERROR_KEYS
    # An unknown callable: the sandbox's resolve error.
    call_id = uuid.uuid4().hex
    fut = host.expect(call_id)
    await host.sio.emit("call", pack({"call_id": call_id, "callable": "no_such_module::f",
                                      "arguments": pickle.dumps(((), {}))}), namespace="/rpc")
    event, payload = await asyncio.wait_for(fut, 30)
    assert event == "call:error" and payload["error"]["type"] == "ModuleNotFoundError"
    # ... and the gateway keeps serving.
    _, _, payload = await host.call(e2e_targets.add, 20, 22)
    assert pickle.loads(payload["value"]) == 42


async def test_cancel_replies_cancelled_and_stops_the_call(host):
    call_id = uuid.uuid4().hex
    fut = host.expect(call_id)
    await host.sio.emit("call", pack({"call_id": call_id, "callable": ref(e2e_targets.async_sleep),
                                      "arguments": pickle.dumps(((30,), {}))}), namespace="/rpc")
    await asyncio.sleep(0.5)
    started = time.monotonic()
    await host.sio.emit("cancel", pack({"call_id": call_id}), namespace="/rpc")
    event, payload = await asyncio.wait_for(fut, 10)
    assert time.monotonic() - started < 5
    assert event == "call:error"
    assert payload == {"call_id": call_id, "error": {"type": "Cancelled", "message": "remote call cancelled",
                                                    "traceback": None, "cancelled": True, "returncode": None}}
    # Cancel of an unknown id: silence; the connection keeps working.
    await host.sio.emit("cancel", pack({"call_id": "nope"}), namespace="/rpc")
    _, _, payload = await host.call(e2e_targets.add, 1, 2)
    assert pickle.loads(payload["value"]) == 3


async def test_resume_after_a_cut_connection_delivers_once(gateway):
    """The original's test_reconnect: the websocket dies mid-call; the result
    arrives after reconnecting (by `resume`), and the function ran once."""
    host = LegacyHost(gateway.url, reconnection_delay=0.1, reconnection_delay_max=0.2)
    await host.connect()
    try:
        _, _, before = await host.call(e2e_targets.count_calls)
        call_id = uuid.uuid4().hex
        fut = host.expect(call_id)
        await host.sio.emit("call", pack({"call_id": call_id, "callable": ref(e2e_targets.blocking_sleep),
                                          "arguments": pickle.dumps(((1.0,), {}))}), namespace="/rpc")
        await asyncio.sleep(0.2)
        await host.sio.eio._trigger_event("disconnect", run_async=False)  # drop our side
        await host.sio.eio.disconnect(abort=True)
        event, payload = await asyncio.wait_for(fut, 30)
        assert event == "call:result"
        _, _, after = await host.call(e2e_targets.count_calls)
        assert pickle.loads(after["value"]) == pickle.loads(before["value"]) + 1
        assert len(host.results[call_id]) >= 1
    finally:
        await disconnect_sio(host.sio)


async def test_resume_of_unknown_id_is_result_unavailable(host):
    fut = host.expect("f" * 32)
    await host.sio.emit("resume", pack({"call_ids": ["f" * 32]}), namespace="/rpc")
    event, payload = await asyncio.wait_for(fut, 10)
    assert event == "call:error" and payload["error"]["type"] == "ResultUnavailable"
    assert payload["error"]["message"] == ("result is no longer held by the runtime (evicted or unknown "
                                           "call_id); retry as a new call")


async def test_unacked_result_is_replayed_by_resume_and_freed_by_ack(gateway):
    h = LegacyHost(gateway.url)
    await h.connect()
    try:
        # A host that does not ack: the result stays held.
        h.sio.handlers["/rpc"]["call:result"] = lambda data: None
        call_id = uuid.uuid4().hex
        await h.sio.emit("call", pack({"call_id": call_id, "callable": ref(e2e_targets.add),
                                       "arguments": pickle.dumps(((4, 5), {}))}), namespace="/rpc")
        await asyncio.sleep(1.0)
        h.sio.handlers["/rpc"]["call:result"] = h._handler("call:result")
        fut = h.expect(call_id)
        await h.sio.emit("resume", pack({"call_ids": [call_id]}), namespace="/rpc")
        event, payload = await asyncio.wait_for(fut, 10)
        assert pickle.loads(payload["value"]) == 9
        await asyncio.sleep(0.3)  # our ack reaches the gateway
        fut = h.expect(call_id)
        await h.sio.emit("resume", pack({"call_ids": [call_id]}), namespace="/rpc")
        event, payload = await asyncio.wait_for(fut, 10)
        assert payload["error"]["type"] == "ResultUnavailable"
    finally:
        await disconnect_sio(h.sio)


async def test_post_call_fast_path_and_202(gateway, host):
    async with aiohttp.ClientSession() as http:
        call_id = uuid.uuid4().hex
        body = pack({"call_id": call_id, "callable": ref(e2e_targets.add), "arguments": pickle.dumps(((6, 7), {}))})
        async with http.post(f"{gateway.url}/call", data=body, headers={
                "content-type": "application/msgpack", "prefer": "respond-async, wait=1"}) as r:
            assert r.status == 200 and r.headers["Preference-Applied"] == "wait=1"
            reply = unpack(await r.read())
        assert set(reply) == {"ok", "value"} and reply["ok"] is True and pickle.loads(reply["value"]) == 13

        # Failure over HTTP: {ok: false, error}.
        body = pack({"call_id": uuid.uuid4().hex, "callable": ref(e2e_targets.raise_value_error),
                     "arguments": pickle.dumps((("bad",), {}))})
        async with http.post(f"{gateway.url}/call", data=body, headers={"prefer": "respond-async, wait=5"}) as r:
            reply = unpack(await r.read())
        assert r.status == 200 and reply["ok"] is False and set(reply["error"]) == ERROR_KEYS
        assert reply["error"]["type"] == "ValueError"

        # Too slow for wait=0.5 -> 202 {call_id}, result on Socket.IO.
        call_id = uuid.uuid4().hex
        fut = host.expect(call_id)
        body = pack({"call_id": call_id, "callable": ref(e2e_targets.async_sleep), "arguments": pickle.dumps(((1.2,), {}))})
        async with http.post(f"{gateway.url}/call", data=body, headers={"prefer": "respond-async, wait=0.5"}) as r:
            assert r.status == 202
            assert r.headers["Preference-Applied"] == "wait=0.5"
            assert r.headers["Location"] == f"/call/{call_id}"
            assert unpack(await r.read()) == {"call_id": call_id}
        # The same id again while running -> 202, not a second run.
        async with http.post(f"{gateway.url}/call", data=body) as r:
            assert r.status == 202
        event, payload = await asyncio.wait_for(fut, 30)
        assert event == "call:result"

        # Bad input: no body, garbage, no call_id -> 400 BadRequest.
        for data in (b"", b"\xc1garbage", pack([1, 2]), pack({"callable": "x::y"})):
            async with http.post(f"{gateway.url}/call", data=data) as r:
                assert r.status == 400
                assert unpack(await r.read()) == {"ok": False, "error": {
                    "type": "BadRequest", "message": "missing or invalid call_id"}}
        async with http.get(f"{gateway.url}/health") as r:
            assert r.status == 200


async def test_logs_arrive_once_with_the_reliable_envelope(gateway):
    host = LegacyHost(gateway.url)
    records = []
    seen = []

    async def on_record(data):
        envelope = unpack(data)
        seen.append(envelope)
        if envelope["_seq"] > (records[-1][0] if records else 0):
            records.append((envelope["_seq"], envelope["data"]))
        await host.sio.emit("_ack", pack({"seq": envelope["_seq"]}), namespace="/log")

    host.sio.on("record", on_record, namespace="/log")
    await host.connect()
    try:
        token = uuid.uuid4().hex
        await host.call(e2e_targets.log_things, token)
        # All three forwarded records (warned, failed, stacked; debug is
        # below the root level), then a pause for any other record still on
        # its way: the resume check below counts envelopes.
        deadline = time.monotonic() + 10
        while (sum(token in d["message"] for _, d in records) < 3
               and time.monotonic() < deadline):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        mine = [d for _, d in records if token in d["message"]]
        assert len(mine) == 3, records
        assert set(seen[0]) == {"_sid", "_seq", "data"} and len(seen[0]["_sid"]) == 8
        assert set(mine[0]) == {"name", "level", "levelno", "message", "created", "pathname", "lineno",
                                "funcName", "module", "exc_text", "stack_info", "agentix_context", "extras"}
        seqs = [s for s, _ in records]
        assert seqs == sorted(set(seqs))
        # _resume{since_seq: 0} replays only what we have not acked: nothing.
        count = len(seen)
        await host.sio.emit("_resume", pack({"since_seq": 0}), namespace="/log")
        await asyncio.sleep(0.5)
        assert len(seen) == count, [e["_seq"] for e in seen]
    finally:
        await disconnect_sio(host.sio)


async def test_logs_emitted_while_disconnected_are_replayed_on_resume(gateway):
    """Records emitted while no host listens on /log are kept (ring buffer)
    and replayed, in order and once, to a host that connects later and
    sends `_resume{since_seq: 0}` (the original host bridge's connect)."""
    first = LegacyHost(gateway.url, namespaces=("/rpc",))  # no /log: nothing acked
    await first.connect()
    try:
        await first.call(e2e_targets.log_many, 30)
    finally:
        await disconnect_sio(first.sio)
    await asyncio.sleep(0.5)
    late = LegacyHost(gateway.url)
    got = []
    late.sio.on("record", lambda data: got.append(unpack(data)), namespace="/log")
    late.sio.on("connect", lambda: asyncio.ensure_future(
        late.sio.emit("_resume", pack({"since_seq": 0}), namespace="/log")), namespace="/log")
    await late.connect()
    try:
        deadline = time.monotonic() + 10
        many = []
        while len(many) < 30 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            many = [e for e in got if e["data"]["name"] == "e2e.many"]
        assert [e["data"]["message"] for e in many] == [f"record {i}" for i in range(30)]
        seqs = [e["_seq"] for e in got]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    finally:
        await disconnect_sio(late.sio)


async def test_spans_arrive_on_trace(gateway):
    host = LegacyHost(gateway.url)
    events = []

    async def catch_all(event, data):
        envelope = unpack(data)
        events.append((event, envelope))
        await host.sio.emit("_ack", pack({"seq": envelope["_seq"]}), namespace="/trace")

    host.sio.on("*", catch_all, namespace="/trace")
    await host.connect()
    try:
        token = uuid.uuid4().hex
        call_id, _, _ = await host.call(e2e_targets.traced_work, token)
        deadline = time.monotonic() + 10
        while not any(e == "span_end" for e, _ in events) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        names = [e for e, _ in events]
        assert "span_start" in names and "span_end" in names, names
        end = next(env["data"] for e, env in events if e == "span_end")
        assert {"trace_id", "call_id", "span_id", "parent_id", "name", "attrs", "started_at", "ended_at",
                "status", "status_description"} <= set(end)
        assert end["span_id"].startswith("span_") and end["ended_at"].endswith("Z")
        assert end["call_id"] == call_id
        seqs = [env["_seq"] for _, env in events]
        assert seqs == sorted(set(seqs))
    finally:
        await disconnect_sio(host.sio)


async def test_plugin_namespace_round_trip(gateway):
    """sandbox `request("answer")` answered by a legacy host on /echo; host
    events reach the sandbox's handlers; sandbox emits reach the host."""
    host = LegacyHost(gateway.url, namespaces=("/rpc", "/trace", "/log", "/echo"))
    progress = []

    async def on_answer(data):
        body = unpack(data)
        await host.sio.emit("answer:result", pack({"request_id": body["request_id"],
                                                    "value": {"a": body["data"]["q"] * 2}}), namespace="/echo")

    host.sio.on("answer", on_answer, namespace="/echo")
    host.sio.on("progress", lambda data: progress.append(unpack(data)), namespace="/echo")
    pongs = []
    host.sio.on("pong", lambda data: pongs.append(unpack(data)), namespace="/echo")
    await host.connect()
    try:
        _, event, payload = await host.call(plugin_targets.ask, "hi")
        assert event == "call:result", payload
        assert pickle.loads(payload["value"]) == {"a": "hihi"}
        # Events and results travel on separate daemon streams: an event
        # emitted just before the call returned may follow its result.
        deadline = time.monotonic() + 10
        while len(progress) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert [p["stage"] for p in progress] == ["asking", "answered"]
        # host -> sandbox: an event to a handler, which emits back.
        await host.sio.emit("ping", pack({"n": 1}), namespace="/echo")
        deadline = time.monotonic() + 10
        while not pongs and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert pongs == [{"echo": {"n": 1}}]
        # abridge-style names with '/' and ':' and binary bodies.
        async def on_path(data):
            body = unpack(data)
            await host.sio.emit("/v1/messages:result", pack({"request_id": body["request_id"], "value": {
                "body": body["data"]["body"][::-1], "status_code": 200}}), namespace="/echo")
        host.sio.on("/v1/messages", on_path, namespace="/echo")
        _, _, payload = await host.call(plugin_targets.proxy_request, "/v1/messages", b"\x00\x01\xff")
        assert pickle.loads(payload["value"]) == {"body": b"\xff\x01\x00", "status_code": 200}
    finally:
        await disconnect_sio(host.sio)


def _declared_oversize(port, request_line, extra=b""):
    """Sends a request declaring a 300 MiB body and 64 KiB of it; returns the
    status line of the reply, which must come without the rest being sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request_line + b"\r\nHost: x\r\nContent-Type: application/octet-stream\r\n" + extra +
                     b"Content-Length: " + str(300 * MiB).encode() + b"\r\n\r\n" + b"4" * (1 << 16))
        return conn.recv(4096).split(b"\r\n", 1)[0]


async def test_oversized_messages_are_refused_and_serving_continues(gateway):
    """Over the 256 MiB cap: refused from the declared length, before the body
    is read (the gateway must not buffer 256 MiB to refuse it); serving goes on."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.url}/socket.io/?EIO=4&transport=polling") as r:
            text = await r.text()
        sid = __import__("json").loads(text[1:])["sid"]
        line = await asyncio.to_thread(
            _declared_oversize, gateway.port,
            f"POST /socket.io/?EIO=4&transport=polling&sid={sid} HTTP/1.1".encode())
        assert line.split()[1] in (b"400", b"413"), line
        line = await asyncio.to_thread(_declared_oversize, gateway.port, b"POST /call HTTP/1.1")
        assert line.split()[1] == b"413", line
        async with http.get(f"{gateway.url}/health") as r:
            assert r.status == 200
    host = LegacyHost(gateway.url)
    await host.connect()
    try:
        _, _, payload = await host.call(e2e_targets.add, 1, 1)
        assert pickle.loads(payload["value"]) == 2
    finally:
        await disconnect_sio(host.sio)


async def test_websocket_transport_and_large_payload(gateway):
    host = LegacyHost(gateway.url)
    host.sio = socketio.AsyncClient()
    for event in ("call:result", "call:error"):
        host.sio.on(event, host._handler(event), namespace="/rpc")
    await host.sio.connect(gateway.url, namespaces=["/rpc"], transports=["websocket"], wait_timeout=10)
    try:
        assert host.sio.transport() == "websocket"
        blob = os.urandom(8 * MiB)  # over aiohttp's 4 MiB default websocket cap
        call_id = uuid.uuid4().hex
        fut = host.expect(call_id)
        await host.sio.emit("call", pack({"call_id": call_id, "callable": "builtins::len",
                                          "arguments": pickle.dumps(((blob,), {}))}), namespace="/rpc")
        event, payload = await asyncio.wait_for(fut, 60)
        assert event == "call:result", payload
        assert pickle.loads(payload["value"]) == len(blob)
    finally:
        await disconnect_sio(host.sio)


async def test_gateway_waits_for_the_daemon_and_health_says_so(start_daemon, tmp_path):
    """Started before the daemon (as bootstrap.sh does): 503 until connected."""
    sock = tmp_path / "late.sock"
    gw = GatewayProc(tmp_path, f"unix://{sock}")
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 20
            status = None
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{gw.url}/health") as r:
                        status = r.status
                        body = await r.json()
                        break
                await asyncio.sleep(0.02)
            assert status == 503 and body == {"status": "starting", "version": "0.2.7"}
            # A call that arrives before the daemon is held, then served.
            call_id = uuid.uuid4().hex
            early = asyncio.ensure_future(http.post(f"{gw.url}/call", data=pack({
                "call_id": call_id, "callable": ref(e2e_targets.add), "arguments": pickle.dumps(((1, 41), {}))}),
                headers={"prefer": "respond-async, wait=10"}))
            await asyncio.sleep(0.5)
            assert not early.done()
            d = start_daemon(extra_args=())
            os.symlink(d.socket_path, sock)
            assert await gw.wait_healthy() == {"status": "ok", "version": "0.2.7"}
            r = await asyncio.wait_for(early, 30)
            assert r.status == 200 and pickle.loads(unpack(await r.read())["value"]) == 42
            r.release()
    finally:
        assert gw.stop() == 0, gw.log()


async def first_health_status(url, timeout=20.0):
    """The status of the first `GET /health` the gateway at `url` answers (None
    if none within `timeout`)."""
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/health") as r:
                    return r.status
            await asyncio.sleep(0.01)
    return None


async def test_stage_one_imports_only_what_health_needs(tmp_path):
    """Until the daemon is up the gateway answers /health from a stage that
    imports no more than `_socket` and `select`: `socket`, `threading`, `os`
    and an `idna`-encoded host name pull in enum, selectors, collections and
    re, ~100 ms of this loaded machine's time before the port is bound.
    Stage two's first import is `site` (run with -S); everything before it
    is stage one's."""
    port = free_port()
    log_path = tmp_path / "importtime.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-X", "importtime", GATEWAY_MAIN, "--daemon",
             f"unix://{tmp_path}/never.sock", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        assert await first_health_status(f"http://127.0.0.1:{port}") == 503
    finally:
        proc.kill()
        proc.wait()
    stage_one = []
    for line in log_path.read_text().splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            module = line.rsplit("|", 1)[1].strip()
            if module == "site":
                break
            stage_one.append(module)
    assert "_socket" in stage_one and "select" in stage_one, stage_one
    heavy = {"socket", "threading", "os", "enum", "selectors", "collections", "re", "encodings.idna", "argparse"}
    assert not heavy & set(stage_one), stage_one


async def test_sigterm_while_loading_ends_the_gateway_cleanly(tmp_path):
    """A SIGTERM that arrives before the server has loaded (here: the daemon never
    comes, so stage one keeps answering 503) ends the gateway with exit code 0,
    as a SIGTERM after it loaded does, not by the signal's default action."""
    gw = GatewayProc(tmp_path, f"unix://{tmp_path}/never.sock")
    try:
        assert await first_health_status(gw.url) == 503
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(20) == 0, gw.log()
    finally:
        gw.stop()


async def test_results_reach_every_rpc_client_on_either_transport(gateway):
    """A result is broadcast on /rpc (as the original) to a polling-only and
    a websocket client alike, one frame each, in the order the calls ended;
    the gateway queues the frames on Engine.IO's send queues itself."""
    polling = LegacyHost(gateway.url, namespaces=("/rpc",))
    socket_host = LegacyHost(gateway.url, namespaces=("/rpc",))
    await polling.sio.connect(gateway.url, namespaces=["/rpc"], transports=["polling"], wait_timeout=10)
    await socket_host.sio.connect(gateway.url, namespaces=["/rpc"], transports=["websocket"], wait_timeout=10)
    try:
        assert (polling.sio.transport(), socket_host.sio.transport()) == ("polling", "websocket")
        ids = []
        for i in range(20):
            call_id, event, payload = await polling.call(e2e_targets.add, i, 1)
            assert event == "call:result" and pickle.loads(payload["value"]) == i + 1
            ids.append(call_id)
        call_id, event, payload = await socket_host.call(e2e_targets.raise_value_error, "both")
        assert event == "call:error" and payload["error"]["message"] == "both"
        ids.append(call_id)
        deadline = time.monotonic() + 10
        while len(polling.results) < len(ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for h in (polling, socket_host):
            assert list(h.results) == ids  # every result, in order
            assert all(len(frames) == 1 for frames in h.results.values())  # once each
        assert socket_host.results[ids[0]][0][1] == polling.results[ids[0]][0][1]
    finally:
        await disconnect_sio(polling.sio)
        await disconnect_sio(socket_host.sio)
