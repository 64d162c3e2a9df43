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
