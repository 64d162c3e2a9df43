"""The conformance cases (testing/conformance/cases.json) for the Python host
package, against the real agentix-sandboxd + agentix-worker. One test per case
id; the TypeScript client runs the same ids (test_ts_client.py), so a case
added to cases.json fails here until this client runs it too."""

import asyncio
import base64
import datetime as dt
import json
import sys
import time
from pathlib import Path

import pytest

import e2e_targets as t
from agentix import RuntimeClient, trace
from conftest import REPO, CollectedRecords, on_root_logger, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy"))
from cutting_proxy import CuttingProxy  # noqa: E402

pytestmark = pytest.mark.asyncio

SPEC = json.loads((REPO / "testing" / "conformance" / "cases.json").read_text())
VALUES = [c for c in SPEC["values"] if "python" not in c.get("not_for", ())]
BEHAVIOURS = [c["id"] for c in SPEC["behaviours"]]
MiB = 1 << 20
TOKEN = "conformance-token-0123456789abcdef"


def from_case(v):
    """A cases.json value in Python: tagged forms become int, float, bytes, datetime."""
    if isinstance(v, list):
        return [from_case(x) for x in v]
    if isinstance(v, dict):
        if "$int" in v:
            return int(v["$int"])
        if "$float" in v:
            return float(v["$float"])
        if "$bytes" in v:
            return base64.b64decode(v["$bytes"])
        if "$datetime" in v:
            return dt.datetime.fromisoformat(v["$datetime"])
        return {k: from_case(x) for k, x in v.items()}
    return v


@pytest.mark.parametrize("case", VALUES, ids=[c["id"] for c in VALUES])
async def test_value(client, case):
    value = from_case(case["value"])
    back = await client.remote(t.echo, value)
    assert back == value and type(back) is type(value)
    assert await client.remote(t.type_names, [value]) == [case["python_type"]]


class Spans(trace.Processor):
    def __init__(self):
        self.ended = []

    def on_span_start(self, span):
        pass

    def on_span_end(self, span):
        self.ended.append(span)


async def _call_plain(client, **_):
    assert await client.remote(t.add, 2, 3) == 5
    assert await client.remote(t.greet, "x", punctuation="?") == "hello x?"


async def _call_error(client, **_):
    from agentix import RemoteCallError

    with pytest.raises(RemoteCallError) as info:
        await client.remote(t.raise_value_error, "boom")
    assert info.value.error.type == "ValueError" and info.value.error.message == "boom"
    assert "raise_value_error" in info.value.error.traceback
    assert await client.remote(t.add, 1, 1) == 2


async def _call_unknown_callable(client, **_):
    from agentix import RemoteCallError

    def nothing():
        pass

    nothing.__module__ = "no_such_module"
    nothing.__qualname__ = "nothing"
    with pytest.raises(RemoteCallError, match="no_such_module") as info:
        await client.remote(nothing)
    assert info.value.error.type == "ModuleNotFoundError"
    assert await client.remote(t.add, 1, 1) == 2


async def _arguments_64mib(client, **_):
    data = bytes(range(256)) * (64 * MiB // 256)
    assert await client.remote(t.echo, data) == data


async def _result_64mib(client, **_):
    assert len(await client.remote(t.make_bytes, 64 * MiB)) == 64 * MiB


async def _results_default_limit(client, **_):
    for size in (8 * MiB, 40 * MiB):
        assert len(await client.remote(t.make_bytes, size)) == size
    results = await asyncio.gather(*(client.remote(t.make_bytes, 3 * MiB) for _ in range(8)))
    assert [len(r) for r in results] == [3 * MiB] * 8


async def _concurrency_64(client, **_):
    results = await asyncio.gather(*(client.remote(t.add, i, i) for i in range(64)))
    assert results == [2 * i for i in range(64)]


async def _stream_items(daemon, **_):
    async with RuntimeClient(daemon.url, stream_window=4) as c:
        items = [i async for i in c.remote_stream(t.count_sync, 50)]
    assert items == [i * 10 for i in range(50)]


async def _stream_early_exit(client, **_):
    first = []
    stream = client.remote_stream(t.count_async, 1_000_000)
    async for item in stream:
        first.append(item)
        if len(first) == 3:
            break
    await stream.aclose()
    assert first == [0, 1, 2]
    assert await client.remote(t.add, 2, 2) == 4


async def _cancel(client, **_):
    started = time.monotonic()
    task = asyncio.ensure_future(client.remote(t.async_sleep, 30))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 10


async def _deadline(daemon, **_):
    from agentix import CallTimeout

    async with RuntimeClient(daemon.url, call_deadline=0.3) as c:
        with pytest.raises(CallTimeout):
            await c.remote(t.async_sleep, 30)


async def _resume_after_cut(daemon, tmp_path, **_):
    proxy = CuttingProxy(str(tmp_path / "proxy.sock"), str(daemon.socket_path))
    proxy.start()
    try:
        base = 2_000_000
        async with RuntimeClient(proxy.url) as c:
            calls = [asyncio.ensure_future(c.remote(t.chaos_step, base + i, 0.3)) for i in range(20)]
            await asyncio.sleep(0.1)
            proxy.cut()
            await asyncio.sleep(0.15)
            proxy.cut()
            assert await asyncio.wait_for(asyncio.gather(*calls), 30) == [2 * (base + i) for i in range(20)]
        async with RuntimeClient(daemon.url, logs=False, traces=False) as direct:
            runs = await direct.remote(t.chaos_executions)
        assert all(runs[base + i] == 1 for i in range(20)), runs
    finally:
        proxy.stop()


async def _logs(client, **_):
    token = f"py-{time.monotonic_ns()}"
    with on_root_logger(CollectedRecords()) as seen:
        assert await client.remote(t.log_things, token) == token
        await wait_for(lambda: any(r.getMessage() == f"warned {token}" for r in seen.records), timeout=15.0)
    (warned,) = [r for r in seen.records if r.getMessage() == f"warned {token}"]
    assert warned.levelname == "WARNING" and warned.name == "e2e.app"
    assert warned.token == token


async def _log_backlog_6mib(daemon, **_):
    # A call's records go to the client that made it, and a Python client's
    # id is its own: the backlog builds up while the call logs faster than
    # the records are delivered, and all of them must arrive, in order.
    n, size = 9_000, 760
    with on_root_logger(CollectedRecords()) as seen:
        async with RuntimeClient(daemon.url) as c:
            assert await c.remote(t.log_sized, n, size) == n
            await wait_for(lambda: len(seen.named("e2e.sized")) >= n, timeout=60)
    messages = [r.getMessage() for r in seen.named("e2e.sized")]
    assert [int(m[:10]) for m in messages] == list(range(n))
    assert sum(len(m) for m in messages) > 6 * MiB


async def _spans(client, **_):
    spans = Spans()
    trace.add_processor(spans)
    try:
        token = f"py-span-{time.monotonic_ns()}"
        assert await client.remote(t.traced_work, token) == token
        await wait_for(lambda: any(s.name == "outer" for s in spans.ended), timeout=15.0)
        names = [s.name for s in spans.ended if s.name in ("inner", "failing", "outer")]
        assert names == ["inner", "failing", "outer"]
    finally:
        trace.remove_processor(spans)


_CONTEXT_TRACE = "trace_4bf92f3577b34da6a3ce929d0e0e4736"
_CONTEXT_SPAN = "span_00f067aa0ba902b7a1b2c3d4"


async def _call_context(client, monkeypatch, **_):
    from agentix import context
    from raw_stream import record_start_calls

    sent = record_start_calls(monkeypatch)
    with context.scope(run="r42", user="ada"):
        assert await client.remote(t.read_baggage, "run") == "r42"
    assert await client.remote(t.read_baggage, "run") == "<unset>"
    expected = {"trace_id": _CONTEXT_TRACE, "parent_id": _CONTEXT_SPAN}
    with trace.trace("conformance", trace_id=_CONTEXT_TRACE), trace.span("caller", span_id=_CONTEXT_SPAN):
        assert await client.remote(t.open_span) == expected
        traced = sent[-1]
        with context.scope(run="r42", user="ada"):
            assert await client.remote(t.open_span) == expected
            assert await client.remote(t.read_baggage, "run") == "r42"
    # As the plain fields every client can send, not the Python-only pickle.
    assert traced.context == b"" and not traced.baggage
    assert traced.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert traced.tracestate == "agentix=00f067aa0ba902b7a1b2c3d4"
    assert sent[-1].context == b"" and dict(sent[-1].baggage) == {"run": "r42", "user": "ada"}
    assert sent[-1].traceparent == traced.traceparent


async def _auth(start_daemon, tmp_path, **_):
    secured = start_daemon(env={"AGENTIX_TOKEN": TOKEN})
    for token in ("wrong-token-0123456789", None):
        c = RuntimeClient(secured.url, token=token or "", timeout=5)
        with pytest.raises(Exception, match="UNAUTHENTICATED|nauthenticated"):
            async with c:
                await c.remote(t.add, 1, 2)
    async with RuntimeClient(secured.url, token=TOKEN) as good:
        assert await good.remote(t.add, 1, 2) == 3


CASES = {
    "call_plain": _call_plain, "call_error": _call_error, "call_unknown_callable": _call_unknown_callable,
    "arguments_64mib": _arguments_64mib, "result_64mib": _result_64mib,
    "results_default_limit": _results_default_limit, "concurrency_64": _concurrency_64,
    "stream_items": _stream_items, "stream_early_exit": _stream_early_exit, "cancel": _cancel,
    "deadline": _deadline, "resume_after_cut": _resume_after_cut, "logs": _logs,
    "log_backlog_6mib": _log_backlog_6mib, "spans": _spans, "call_context": _call_context, "auth": _auth,
}


@pytest.mark.parametrize("case", BEHAVIOURS)
async def test_behaviour(case, client, daemon, start_daemon, tmp_path, monkeypatch):
    assert case in CASES, f"cases.json names {case!r}, which the Python runner does not implement"
    monkeypatch.delenv("AGENTIX_TOKEN", raising=False)
    await CASES[case](client=client, daemon=daemon, start_daemon=start_daemon, tmp_path=tmp_path,
                      monkeypatch=monkeypatch)
