"""The /trace channel end to end: spans opened in the sandbox are replayed
into the host's agentix.trace processors, as children of the host span that
made the call, each attributed to its call."""

import asyncio

import pytest

import e2e_targets as t
from agentix import trace
from conftest import relayed_or_direct, wait_for
from raw_stream import distinct_scalar

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=["relayed", "direct"])
def daemon(request, start_daemon, monkeypatch):
    """Each test against the relayed path and against direct calls."""
    yield from relayed_or_direct(request.param, start_daemon, monkeypatch)


class Recorder(trace.Processor):
    def __init__(self):
        self.started, self.ended = [], []

    def on_span_start(self, span):
        self.started.append(span)

    def on_span_end(self, span):
        self.ended.append(span)

    def named(self, name):
        return [s for s in self.ended if s.name == name]


@pytest.fixture
def recorder():
    r = Recorder()
    trace.add_processor(r)
    yield r
    trace.remove_processor(r)


async def test_sandbox_spans_reach_host_processors_under_the_host_span(client, recorder):
    with trace.trace("host-trace") as host_trace, trace.span("host-span") as host_span:
        assert await client.remote(t.traced_work, "tk") == "tk"
    await wait_for(lambda: recorder.named("outer") and recorder.named("failing"))
    (outer,) = recorder.named("outer")
    (inner,) = recorder.named("inner")
    (failing,) = recorder.named("failing")
    assert outer.trace_id == host_trace.trace_id
    assert outer.parent_id == host_span.span_id
    assert inner.parent_id == outer.span_id and failing.parent_id == outer.span_id
    assert outer.attrs["token"] == "tk" and outer.attrs["call_id"]
    assert inner.attrs["depth"] == 2
    assert outer.status == "ok"
    assert [e.name for e in outer.events] == ["started"]
    assert failing.status == "error" and "boom tk" in failing.error.message
    assert outer.started_at and outer.ended_at and outer.ended_at >= outer.started_at


async def test_concurrent_calls_get_their_own_spans(client, recorder):
    tokens = [f"s{i}" for i in range(20)]
    assert await asyncio.gather(*(client.remote(t.traced_async, k) for k in tokens)) == tokens
    await wait_for(lambda: len(recorder.named("async-span")) >= 20)
    call_of = {s.attrs["token"]: s.attrs["call_id"] for s in recorder.named("async-span")}
    assert sorted(call_of) == sorted(tokens)
    assert len(set(call_of.values())) == 20


async def test_twenty_calls_logging_printing_and_tracing_are_each_attributed(client, recorder):
    import logging

    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Collect()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)  # captured output is replayed at INFO
    try:
        tokens = [f"a{i}" for i in range(20)]
        assert await asyncio.gather(*(client.remote(t.log_print_trace, k) for k in tokens)) == tokens

        def by_token(prefix, name):
            return {r.getMessage().split()[-1]: r.agentix_call_id for r in records
                    if r.name == name and r.getMessage().startswith(prefix)}

        await wait_for(lambda: len(by_token("log", "e2e.all")) == 20
                       and len(by_token("print", "agentix.sandbox.stdout")) == 20
                       and len(recorder.named("attributed")) == 20)
        logged = by_token("log", "e2e.all")
        printed = by_token("print", "agentix.sandbox.stdout")
        spans = {s.attrs["token"]: s.attrs["call_id"] for s in recorder.named("attributed")}
        # Every token's log record, printed line and span name the same call,
        # and the 20 calls are distinct.
        assert logged == printed == spans
        assert len(set(spans.values())) == 20
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


async def test_oversized_sandbox_spans_are_bounded_on_the_host(client, recorder):
    # issue 17, item 1: names cut, OTel's attribute and event limits, an
    # over-long id refused; later spans and calls are replayed as usual.
    import hostile_names
    from agentix.runtime.client import traces

    assert await client.remote(hostile_names.oversized_spans) == "done"
    await wait_for(lambda: recorder.named("ordinary"))
    (big,) = [s for s in recorder.ended if s.name.startswith("nnn")]
    assert big.name == "n" * traces.MAX_NAME_CHARS
    assert len(big.attrs) == traces.MAX_ATTRIBUTES + 3  # + the two dropped counts and call_id
    assert big.attrs["agentix.dropped_events"] == 1_000 - traces.MAX_EVENTS
    assert big.attrs["agentix.dropped_attributes"] == 1_000 - traces.MAX_ATTRIBUTES
    assert all(len(key) <= traces.MAX_KEY_CHARS for key in big.attrs)
    assert len(big.events) == traces.MAX_EVENTS and all(len(e.name) == traces.MAX_NAME_CHARS for e in big.events)
    assert not recorder.named("long id") and not [s for s in recorder.started if s.name == "long id"]
    assert await client.remote(t.traced_work, "after") == "after"
    await wait_for(lambda: recorder.named("outer"))


# The fields a worker does not set: the daemon numbers events, knows which
# worker sent them and derives the OpenTelemetry byte ids from the agentix
# ids.
_DAEMON_FIELDS = {"seq", "worker_id", "trace_id", "span_id", "parent_span_id"}
_AGENTIX_IDS = {"agentix_trace_id": "trace_" + "0f1e2d3c" * 4,
                "agentix_span_id": "span_" + "a1b2c3d4" * 3,
                "agentix_parent_id": "span_" + "5e6f7a8b" * 3}


def _is_choice(message):
    """A message that is one oneof of scalars (AttributeValue)."""
    return (len(message.oneofs) == 1
            and all(f.containing_oneof is not None and f.message_type is None for f in message.fields))


def _python_form(field, pb):
    """(the value send_trace takes for `field`, the value the host must
    receive), for any field of TraceEvent, following the Python forms in
    worker/channel/proto_fields.h."""
    from google.protobuf.descriptor import FieldDescriptor as F

    repeated = field.label == F.LABEL_REPEATED
    if field.type != F.TYPE_MESSAGE:
        if repeated:
            values = [distinct_scalar(field, 1), distinct_scalar(field, 2)]
            return values, values
        return distinct_scalar(field), distinct_scalar(field)
    message = field.message_type
    cls = getattr(pb, message.name)
    names = [f.name for f in message.fields]
    if _is_choice(message):  # a scalar; its type picks the member
        member = message.fields[0]
        value = distinct_scalar(member)
        return value, cls(**{member.name: value})
    if repeated and names == ["key", "value"]:  # a dict
        value_field = message.fields_by_name["value"]
        python, wire = {}, []
        if value_field.message_type is not None and _is_choice(value_field.message_type):
            # One entry per member, so every kind of value is covered.
            value_cls = getattr(pb, value_field.message_type.name)
            for member in value_field.message_type.fields:
                key, value = f"k-{member.name}", distinct_scalar(member)
                python[key] = value
                wire.append(cls(key=key, value=value_cls(**{member.name: value})))
        else:
            value, expected = _python_form(value_field, pb)
            python["k"] = value
            wire.append(cls(key="k", value=expected))
        return python, wire
    python, wire = {}, {}
    for sub in message.fields:
        python[sub.name], wire[sub.name] = _python_form(sub, pb)
    if repeated:
        return [python], [cls(**wire)]
    return python, cls(**wire)


async def test_every_trace_event_field_reaches_the_host_from_its_one_definition(daemon):
    """runtime.proto's TraceEvent is the event's only schema: every field the
    worker may set, named as there and in its Python form (attributes a dict,
    events a list of dicts), arrives on the host's Traces stream as sent, and
    the daemon adds only its own fields (a field added to the message is
    covered with no change here)."""
    from agentix.runtime.v1 import runtime_pb2 as pb
    from raw_stream import first_item_emitted

    fields, expected = {}, {}
    for field in pb.TraceEvent.DESCRIPTOR.fields:
        if field.name not in _DAEMON_FIELDS:
            fields[field.name], expected[field.name] = _python_form(field, pb)
    for name, value in _AGENTIX_IDS.items():
        fields[name] = expected[name] = value
    # call_id names no live call, so the event goes to every host stream.
    got = await first_item_emitted(
        daemon.url, "Traces", pb.TracesRequest(subscribe=pb.SubscribeTraces(after_seq=0)), "events",
        lambda event: event.name == fields["name"], t.send_trace_fields, fields)
    assert got.seq > 0
    assert len(got.worker_id) == 8
    want = pb.TraceEvent(seq=got.seq, worker_id=got.worker_id,
                         trace_id=bytes.fromhex("0f1e2d3c" * 4),
                         span_id=bytes.fromhex("a1b2c3d4" * 2),
                         parent_span_id=bytes.fromhex("5e6f7a8b" * 2), **expected)
    assert got == want


async def test_a_host_that_falls_behind_gets_every_span_of_the_burst_before_the_call_returns(client, recorder):
    import time

    import barrier_targets

    class SlowAtFirst(trace.Processor):
        """Blocks 1 s on the first big span (a host processor that stalls;
        less than the 2 s a call's barrier waits without progress)."""

        def __init__(self):
            self.indexes = []

        def on_span_start(self, span):
            pass

        def on_span_end(self, span):
            if span.name == "big-span":
                if not self.indexes:
                    time.sleep(1.0)
                self.indexes.append(int(span.attrs["index"]))

    slow = SlowAtFirst()
    trace.add_processor(slow)
    try:
        await client.remote(t.add, 1, 1)  # the Traces stream is open
        # 3,000 spans of 8 KiB (24 MiB): far past the daemon's 8 MiB unwritten
        # per stream, within its 10,000-event buffer (a span is 2 events).
        n = 3000
        assert await client.remote(barrier_targets.big_spans, n, 8192) == n
        assert slow.indexes == list(range(n))  # every span, once, in order, before the result
    finally:
        trace.remove_processor(slow)
