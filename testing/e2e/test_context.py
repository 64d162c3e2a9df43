"""agentix.context propagates host -> sandbox per call (SPEC §1.10)."""

import pytest

import e2e_targets as t
from agentix import context

pytestmark = pytest.mark.asyncio


async def test_baggage_reaches_sync_and_async_callables(client):
    with context.scope(user="alice", run=7):
        assert await client.remote(t.read_baggage, "user") == "alice"
        assert await client.remote(t.read_baggage_async, "run") == 7
    # Outside the scope nothing is sent, and the worker does not leak the
    # previous call's values into the next one.
    assert await client.remote(t.read_baggage, "user") == "<unset>"
    assert await client.remote(t.read_baggage_async, "run") == "<unset>"


async def test_a_context_that_cannot_be_decoded_fails_the_call(daemon):
    import pickle

    from agentix.runtime.v1 import runtime_pb2 as pb
    from raw_stream import RawStream

    raw = RawStream(daemon.url)
    try:
        await raw.send(pb.HostEvent(start=pb.StartCall(
            call_id="ctx", callable="e2e_targets::add",
            arguments=pickle.dumps(((1, 2), {})), context=b"\x80\x05not a pickle")))
        error = (await raw.terminal("ctx")).error.error
        assert error.type == "UnpicklingError"
        assert error.traceback
    finally:
        await raw.close()


async def test_sandbox_spans_are_children_of_the_host_span(client):
    from agentix import trace

    with trace.trace("host-trace") as t_, trace.span("host-span") as s:
        ids = await client.remote(t.open_span)
    assert ids == {"trace_id": t_.trace_id, "parent_id": s.span_id}
    # Without a host span the sandbox's span is a root of no trace.
    assert (await client.remote(t.open_span))["parent_id"] is None


# ── the language-neutral carrier: StartCall.traceparent / tracestate / baggage ──

_TRACE_HEX = "4bf92f3577b34da6a3ce929d0e0e4736"
_PARENT_HEX = "00f067aa0ba902b7"


async def _raw_msgpack_call(daemon, call_id, callable_, args, **fields):
    """One call made as a non-Python client would: msgpack arguments and
    only the plain context fields. Returns the terminal SandboxEvent."""
    import msgpack

    from agentix.runtime.v1 import runtime_pb2 as pb
    from raw_stream import RawStream

    raw = RawStream(daemon.url)
    try:
        await raw.send(pb.HostEvent(start=pb.StartCall(
            call_id=call_id, callable=callable_, encoding=pb.ENCODING_MSGPACK,
            arguments=msgpack.packb([list(args), {}]), **fields)))
        return await raw.terminal(call_id)
    finally:
        await raw.close()


def _value(event):
    import msgpack

    assert event.WhichOneof("kind") == "result", event
    return msgpack.unpackb(event.result.value)


async def test_a_non_python_client_passes_baggage_without_a_pickle(daemon):
    event = await _raw_msgpack_call(
        daemon, "plain-bag", "e2e_targets::read_baggage", ["run"],
        baggage={"run": "r42", "user": "ada"})
    assert _value(event) == "r42"
    # The next call without context sees none (nothing leaks).
    event = await _raw_msgpack_call(
        daemon, "plain-bag-2", "e2e_targets::read_baggage", ["run"])
    assert _value(event) == "<unset>"


async def test_sandbox_spans_parent_to_a_w3c_traceparent(daemon):
    traceparent = f"00-{_TRACE_HEX}-{_PARENT_HEX}-01"
    event = await _raw_msgpack_call(
        daemon, "plain-tp", "e2e_targets::open_span", [], traceparent=traceparent)
    assert _value(event) == {"trace_id": "trace_" + _TRACE_HEX, "parent_id": "span_" + _PARENT_HEX}
    # tracestate's agentix= entry gives the full (24 hex) agentix span id,
    # used only when it extends the traceparent's parent-id.
    event = await _raw_msgpack_call(
        daemon, "plain-ts", "e2e_targets::open_span", [], traceparent=traceparent,
        tracestate=f"vendor=x, agentix={_PARENT_HEX}a1b2c3d4")
    assert _value(event)["parent_id"] == f"span_{_PARENT_HEX}a1b2c3d4"
    event = await _raw_msgpack_call(
        daemon, "plain-ts-other", "e2e_targets::open_span", [], traceparent=traceparent,
        tracestate="agentix=ffffffffffffffffa1b2c3d4")
    assert _value(event)["parent_id"] == "span_" + _PARENT_HEX


@pytest.mark.parametrize("fields", [
    {"traceparent": "00-abc-def-01"},
    {"traceparent": f"00-{'0' * 32}-{_PARENT_HEX}-01"},
    {"traceparent": f"00-{_TRACE_HEX.upper()}-{_PARENT_HEX}-01"},
    {"baggage": {"a": "1"}, "context": b"\x80\x05N."},
    {"baggage": {"": "1"}},
])
async def test_malformed_plain_context_is_a_bad_request(daemon, fields):
    event = await _raw_msgpack_call(daemon, "plain-bad", "e2e_targets::add", [1, 2], **fields)
    assert event.WhichOneof("kind") == "error"
    error = event.error.error
    assert error.type == "BadRequest"
    assert "StartCall." in error.message
    # The daemon keeps serving: a good call on a fresh id succeeds.
    assert _value(await _raw_msgpack_call(daemon, "plain-ok", "e2e_targets::add", [1, 2])) == 3


async def test_the_python_host_sends_string_baggage_and_trace_as_plain_fields(client, monkeypatch):
    from agentix import trace
    from raw_stream import record_start_calls

    sent = record_start_calls(monkeypatch)
    with trace.trace("host-trace") as t_, trace.span("host-span") as s, context.scope(user="alice"):
        assert await client.remote(t.read_baggage, "user") == "alice"
        ids = await client.remote(t.open_span)
    assert ids == {"trace_id": t_.trace_id, "parent_id": s.span_id}
    start = sent[-1]
    assert start.context == b""
    assert start.traceparent == f"00-{t_.trace_id[6:]}-{s.span_id[5:21]}-01"
    assert start.tracestate == "agentix=" + s.span_id[5:]
    assert dict(start.baggage) == {"user": "alice"}
    # Baggage that is not all strings still travels as the pickle.
    with context.scope(run=7):
        assert await client.remote(t.read_baggage, "run") == 7
    assert sent[-1].context and not sent[-1].baggage and not sent[-1].traceparent
