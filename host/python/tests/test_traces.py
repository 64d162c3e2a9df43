"""Sandbox trace/span events replayed into host trace processors (RuntimeService.Traces)."""

import asyncio
import logging
import threading

import pytest
import pytest_asyncio

import sandbox_functions
from agentix import RuntimeClient
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.utils import trace
from fake_runtime import trace_event
from test_client import eventually

pytestmark = pytest.mark.asyncio

TRACE_ID = "trace_" + "a" * 32
ROOT_ID = "span_" + "b" * 24
CHILD_ID = "span_" + "c" * 24
T0 = 1_700_000_000_123_456_789  # 2023-11-14T22:13:20.123456Z


class Recorder(trace.Processor):
    """Keeps (method, item.export()) for every call, in order, and the thread it ran on."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.threads: set[int] = set()

    def _keep(self, method, item):
        self.calls.append((method, item.export()))
        self.threads.add(threading.get_ident())

    def on_trace_start(self, item):
        self._keep("on_trace_start", item)

    def on_trace_end(self, item):
        self._keep("on_trace_end", item)

    def on_span_start(self, item):
        self._keep("on_span_start", item)

    def on_span_end(self, item):
        self._keep("on_span_end", item)

    @property
    def methods(self):
        return [method for method, _ in self.calls]


@pytest.fixture
def recorder():
    saved = trace.get_processors()
    processor = Recorder()
    trace.set_processors([processor])
    yield processor
    trace.set_processors(saved)
    trace.set_tracing_disabled(False)


@pytest_asyncio.fixture
async def client(runtime):
    client = RuntimeClient(runtime.url)
    yield client
    await client.close()


def lifecycle(first_seq: int = 1) -> list[pb.TraceEvent]:
    """A trace with a root span and a failed child span that has one event."""
    s = first_seq
    child = dict(
        agentix_trace_id=TRACE_ID, agentix_span_id=CHILD_ID, agentix_parent_id=ROOT_ID, name="tool",
        start_time_unix_nanos=T0 + 2_000_000, call_id="call-1", worker_id="1a2b3c4d",
    )
    return [
        trace_event(s, pb.TRACE_EVENT_KIND_TRACE_START, agentix_trace_id=TRACE_ID, name="agent-run",
                    start_time_unix_nanos=T0, attributes={"user": "ada"}, call_id="call-1"),
        trace_event(s + 1, pb.TRACE_EVENT_KIND_SPAN_START, agentix_trace_id=TRACE_ID, agentix_span_id=ROOT_ID,
                    name="plan", start_time_unix_nanos=T0 + 1_000_000, attributes={"step": 1}, call_id="call-1"),
        trace_event(s + 2, pb.TRACE_EVENT_KIND_SPAN_START, attributes={"flag": True, "call_id": "own"}, **child),
        trace_event(
            s + 3, pb.TRACE_EVENT_KIND_SPAN_END, **child,
            end_time_unix_nanos=T0 + 3_000_000,
            attributes={"flag": True, "ratio": 0.5, "blob": b"\x00\x01", "call_id": "own"},
            events=[pb.SpanEventRecord(name="cache_miss", time_unix_nanos=T0 + 2_500_000,
                                       attributes=[pb.Attribute(key="key", value=pb.AttributeValue(string_value="k1"))])],
            status=pb.SPAN_STATUS_CODE_ERROR, status_description="ValueError: bad",
            error_message="ValueError: bad", error_data={"attempt": 3},
        ),
        trace_event(s + 4, pb.TRACE_EVENT_KIND_SPAN_END, agentix_trace_id=TRACE_ID, agentix_span_id=ROOT_ID,
                    name="plan", start_time_unix_nanos=T0 + 1_000_000, end_time_unix_nanos=T0 + 4_000_000,
                    attributes={"step": 1}, status=pb.SPAN_STATUS_CODE_OK, call_id="call-1"),
        trace_event(s + 5, pb.TRACE_EVENT_KIND_TRACE_END, agentix_trace_id=TRACE_ID, name="",
                    start_time_unix_nanos=T0, end_time_unix_nanos=T0 + 5_000_000),
    ]


async def test_events_are_replayed_in_order_with_their_fields(runtime, client, recorder):
    runtime.add_traces(*lifecycle())
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: len(recorder.calls) == 6)
    assert recorder.methods == [
        "on_trace_start", "on_span_start", "on_span_start", "on_span_end", "on_span_end", "on_trace_end",
    ]
    trace_start, root_start, child_start, child_end, root_end, trace_end = (item for _, item in recorder.calls)
    assert trace_start == {
        "object": "trace", "id": TRACE_ID, "name": "agent-run", "metadata": {"user": "ada"},
        "started_at": "2023-11-14T22:13:20.123456Z", "ended_at": None,
    }
    assert root_start == {
        "object": "span", "id": ROOT_ID, "trace_id": TRACE_ID, "parent_id": None, "name": "plan",
        "attrs": {"step": 1, "call_id": "call-1"}, "started_at": "2023-11-14T22:13:20.124456Z", "ended_at": None,
        "status": "unset", "status_description": None, "error": None, "events": None,
    }
    assert child_start["parent_id"] == ROOT_ID
    assert child_start["attrs"] == {"flag": True, "call_id": "own"}  # setdefault: the span's own call_id wins
    assert child_end == {
        "object": "span", "id": CHILD_ID, "trace_id": TRACE_ID, "parent_id": ROOT_ID, "name": "tool",
        "attrs": {"flag": True, "ratio": 0.5, "blob": b"\x00\x01", "call_id": "own"},
        "started_at": "2023-11-14T22:13:20.125456Z", "ended_at": "2023-11-14T22:13:20.126456Z",
        "status": "error", "status_description": "ValueError: bad",
        "error": {"message": "ValueError: bad", "data": {"attempt": 3}},
        "events": [{"name": "cache_miss", "timestamp": "2023-11-14T22:13:20.125956Z", "attributes": {"key": "k1"}}],
    }
    assert root_end["status"] == "ok" and root_end["ended_at"] == "2023-11-14T22:13:20.127456Z"
    assert root_end["error"] is None and root_end["attrs"] == {"step": 1, "call_id": "call-1"}
    assert trace_end == {
        "object": "trace", "id": TRACE_ID, "name": "", "metadata": None,
        "started_at": "2023-11-14T22:13:20.123456Z", "ended_at": "2023-11-14T22:13:20.128456Z",
    }
    # Replayed off the event loop's thread.
    assert threading.get_ident() not in recorder.threads
    await eventually(lambda: runtime.trace_acks and runtime.trace_acks[-1] == 6)


async def test_replayed_items_are_fresh_objects(runtime, client):
    seen = []

    class Keep(trace.Processor):
        def on_span_start(self, span):
            seen.append(span)

        def on_span_end(self, span):
            seen.append(span)

    saved = trace.get_processors()
    trace.set_processors([Keep()])
    try:
        runtime.add_traces(*lifecycle())
        await client.remote(sandbox_functions.add, 1, 2)
        await eventually(lambda: len(seen) == 4)
    finally:
        trace.set_processors(saved)
    assert all(isinstance(span, trace.Span) for span in seen)
    assert len({id(span) for span in seen}) == 4
    assert seen[2].error == trace.SpanError("ValueError: bad", {"attempt": 3})
    assert seen[2].events[0] == trace.SpanEvent("cache_miss", "2023-11-14T22:13:20.125956Z", {"key": "k1"})


async def test_each_response_is_acked_once_and_subscription_carries_cursor(runtime, client, recorder):
    runtime.trace_batch = 2
    runtime.add_traces(*lifecycle())
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: runtime.trace_acks and runtime.trace_acks[-1] == 6)
    assert len(recorder.calls) == 6
    assert len(runtime.trace_acks) <= 3
    assert set(runtime.trace_acks) <= {2, 4, 6}
    assert runtime.trace_acks == sorted(runtime.trace_acks)
    assert runtime.trace_subscriptions == [(0, "")]
    assert client._traces._cursor.instance_id == "fake-instance-1"


async def test_resubscribing_resumes_after_the_last_seq_and_never_replays_twice(runtime, client, recorder):
    runtime.traces_honour_after_seq = False  # a daemon that resends its whole buffer
    events = lifecycle()
    runtime.add_traces(*events[:3])
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: len(recorder.calls) == 3)

    runtime.drop_traces()
    await eventually(lambda: not client._traces.alive)
    runtime.add_traces(*events[3:])
    assert await client.remote(sandbox_functions.add, 1, 2) == 3  # same Calls stream; re-opens Traces
    await eventually(lambda: len(recorder.calls) == 6)
    await asyncio.sleep(0.05)
    assert recorder.methods == [
        "on_trace_start", "on_span_start", "on_span_start", "on_span_end", "on_span_end", "on_trace_end",
    ]
    assert runtime.streams_opened == 1 and runtime.traces_opened == 2
    assert runtime.trace_subscriptions == [(0, ""), (3, "fake-instance-1")]
    await eventually(lambda: runtime.trace_acks[-1] == 6)


async def test_a_lost_trace_stream_is_reopened_at_most_once_a_second(runtime, client, recorder):
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: runtime.trace_subscriptions)
    runtime.drop_traces()
    await eventually(lambda: not client._traces.alive)
    assert await client.remote(sandbox_functions.add, 1, 2) == 3
    await eventually(lambda: client._traces.alive and len(runtime.trace_subscriptions) == 2)
    runtime.drop_traces()
    await eventually(lambda: not client._traces.alive)
    for _ in range(20):
        assert await client.remote(sandbox_functions.add, 1, 2) == 3
    assert runtime.traces_opened <= 3
    assert runtime.logs_opened == 1  # the Logs stream was never disturbed


async def test_close_and_reuse_resume_after_the_last_seq(runtime, recorder):
    events = lifecycle()
    runtime.add_traces(*events[:2])
    client = RuntimeClient(runtime.url)
    async with client:
        await eventually(lambda: len(recorder.calls) == 2)
    assert client._traces is None
    runtime.add_traces(*events[2:])
    await asyncio.sleep(0.05)
    assert len(recorder.calls) == 2  # closed: nothing replayed
    async with client:
        await eventually(lambda: len(recorder.calls) == 6)
    assert [seq for seq, _ in runtime.trace_subscriptions] == [0, 2]


async def test_unimplemented_traces_do_not_disturb_calls_or_logs(runtime, recorder, caplog):
    runtime.traces_implemented = False
    with caplog.at_level(logging.DEBUG, logger="agentix.runtime.client"):
        async with RuntimeClient(runtime.url) as client:
            assert await client.remote(sandbox_functions.add, 1, 2) == 3
            await eventually(lambda: client._traces is not None and not client._traces.alive)
            assert client._logs.alive
            for _ in range(3):
                assert await client.remote(sandbox_functions.add, 2, 2) == 4
            runtime.drop_streams()
            await eventually(lambda: client._stream is None)
            assert await client.remote(sandbox_functions.add, 3, 2) == 5  # reconnected
    assert runtime.streams_opened == 2
    assert runtime.traces_opened == 1  # not asked again after UNIMPLEMENTED
    assert runtime.logs_opened == 2
    notes = [r for r in caplog.records if "does not implement Traces" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.DEBUG
    assert recorder.calls == []


async def test_traces_false_does_not_subscribe(runtime, recorder):
    runtime.add_traces(*lifecycle())
    async with RuntimeClient(runtime.url, traces=False) as client:
        assert client.traces is False
        assert await client.remote(sandbox_functions.add, 1, 2) == 3
        await asyncio.sleep(0.05)
        assert client._traces is None
        assert client._logs is not None  # logs are independent
    assert runtime.traces_opened == 0 and recorder.calls == []


async def test_replay_honours_disabled_tracing_and_still_acks(runtime, client, recorder):
    trace.set_tracing_disabled(True)
    runtime.add_traces(*lifecycle())
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: runtime.trace_acks and runtime.trace_acks[-1] == 6)
    assert recorder.calls == []


async def test_a_raising_processor_does_not_stop_later_events(runtime, client, recorder, caplog):
    class Raising(trace.Processor):
        def on_span_start(self, span):
            raise RuntimeError("processor refuses")

    trace.set_processors([Raising(), recorder])
    runtime.add_traces(*lifecycle())
    with caplog.at_level(logging.ERROR, logger="agentix.trace"):
        await client.remote(sandbox_functions.add, 1, 2)
        await eventually(lambda: len(recorder.calls) == 6)
    assert [r for r in caplog.records if "raised in on_span_start" in r.getMessage()]
    await eventually(lambda: runtime.trace_acks and runtime.trace_acks[-1] == 6)


async def test_unknown_event_kinds_are_skipped_but_acked(runtime, client, recorder):
    runtime.add_traces(
        trace_event(1, pb.TRACE_EVENT_KIND_UNSPECIFIED, name="mystery"),
        trace_event(2, 99, name="from the future"),
        *lifecycle(3)[:1],
    )
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: runtime.trace_acks and runtime.trace_acks[-1] == 3)
    assert recorder.methods == ["on_trace_start"]


async def test_timestamps_and_values_of_unset_fields():
    from agentix.runtime.client.traces import attribute_value, iso_from_nanos, trace_item

    assert iso_from_nanos(0) is None
    assert iso_from_nanos(1) == "1970-01-01T00:00:00.000000Z"
    assert iso_from_nanos(T0) == "2023-11-14T22:13:20.123456Z"
    # The second's text is reused within a second and replaced after it.
    assert iso_from_nanos(T0 + 1_000) == "2023-11-14T22:13:20.123457Z"
    assert iso_from_nanos(T0 + 900_000_000) == "2023-11-14T22:13:21.023456Z"
    assert iso_from_nanos(T0) == "2023-11-14T22:13:20.123456Z"
    assert attribute_value(pb.AttributeValue()) is None
    assert attribute_value(pb.AttributeValue(int_value=-5)) == -5
    span = trace_item(
        pb.TraceEvent(kind=pb.TRACE_EVENT_KIND_SPAN_END, agentix_span_id=ROOT_ID, agentix_trace_id=TRACE_ID,
                      events=[pb.SpanEventRecord(name="e")])
    )
    assert span.started_at is None and span.ended_at is None and span.parent_id is None
    assert span.attrs == {}  # no call named: no call_id attribute
    assert span.error is None and span.status == "unset" and span.status_description is None
    assert span.events == [trace.SpanEvent("e", "", {})]
    assert trace_item(pb.TraceEvent(kind=pb.TRACE_EVENT_KIND_UNSPECIFIED)) is None


# ── sandbox-chosen sizes are bounded (issue 17, item 1) ──


def _many(count: int, key_size: int = 8) -> list[pb.Attribute]:
    return [pb.Attribute(key=f"{i:0{key_size}d}", value=pb.AttributeValue(int_value=i)) for i in range(count)]


async def test_oversized_names_keys_attribute_and_event_counts_are_bounded(runtime, client, recorder):
    from agentix.runtime.client import traces

    huge = "n" * 1_000_000
    span_end = trace_event(
        2, pb.TRACE_EVENT_KIND_SPAN_END, agentix_trace_id=TRACE_ID, agentix_span_id=ROOT_ID, name=huge,
        start_time_unix_nanos=T0, end_time_unix_nanos=T0 + 1,
        attributes=_many(10_000) + [pb.Attribute(key="k" * 100_000, value=pb.AttributeValue(bool_value=True))],
        events=[pb.SpanEventRecord(name="e" * 5_000, time_unix_nanos=T0, attributes=_many(200)) for _ in range(1_000)],
        error_message="bad", error_data=_many(3_000),
    )
    runtime.add_traces(
        trace_event(1, pb.TRACE_EVENT_KIND_TRACE_START, agentix_trace_id=TRACE_ID, name=huge,
                    start_time_unix_nanos=T0, attributes=_many(1_000)),
        span_end,
        trace_event(3, pb.TRACE_EVENT_KIND_SPAN_START, agentix_trace_id=TRACE_ID, agentix_span_id=CHILD_ID,
                    name="fine", attributes=[pb.Attribute(key="k" * 100_000, value=pb.AttributeValue(int_value=1))]),
    )
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: len(recorder.calls) == 3)
    (_, started), (_, ended), (_, fine) = recorder.calls
    assert started["name"] == huge[: traces.MAX_NAME_CHARS]
    assert len(started["metadata"]) == traces.MAX_ATTRIBUTES + 1
    assert started["metadata"]["agentix.dropped_attributes"] == 1_000 - traces.MAX_ATTRIBUTES
    assert len(ended["name"]) == traces.MAX_NAME_CHARS
    assert len(ended["attrs"]) == traces.MAX_ATTRIBUTES + 2  # + the dropped counts of attributes and events
    assert ended["attrs"]["agentix.dropped_attributes"] == 10_001 - traces.MAX_ATTRIBUTES
    assert ended["attrs"]["agentix.dropped_events"] == 1_000 - traces.MAX_EVENTS
    assert len(ended["events"]) == traces.MAX_EVENTS
    assert all(len(e["name"]) == traces.MAX_NAME_CHARS and len(e["attributes"]) == traces.MAX_ATTRIBUTES + 1
               for e in ended["events"])
    assert len(ended["error"]["data"]) == traces.MAX_ATTRIBUTES + 1
    assert fine["name"] == "fine" and fine["attrs"] == {"k" * traces.MAX_KEY_CHARS: 1}
    # And the stream goes on.
    runtime.add_traces(trace_event(4, pb.TRACE_EVENT_KIND_SPAN_END, agentix_trace_id=TRACE_ID,
                                   agentix_span_id=CHILD_ID, name="fine"))
    await eventually(lambda: len(recorder.calls) == 4)


async def test_an_event_with_an_over_long_id_is_refused_and_later_ones_replayed(runtime, client, recorder, caplog):
    from agentix.runtime.client import traces

    long_id = "span_" + "x" * 1_000_000
    runtime.add_traces(
        trace_event(1, pb.TRACE_EVENT_KIND_SPAN_START, agentix_trace_id=TRACE_ID, agentix_span_id=long_id, name="a"),
        trace_event(2, pb.TRACE_EVENT_KIND_SPAN_START, agentix_trace_id="t" * 200, agentix_span_id=ROOT_ID, name="b"),
        trace_event(3, pb.TRACE_EVENT_KIND_SPAN_START, agentix_trace_id=TRACE_ID, agentix_span_id=ROOT_ID,
                    agentix_parent_id="p" * (traces.MAX_ID_CHARS + 1), name="c"),
        trace_event(4, pb.TRACE_EVENT_KIND_SPAN_START, agentix_trace_id=TRACE_ID,
                    agentix_span_id="s" * traces.MAX_ID_CHARS, name="d"),
    )
    with caplog.at_level(logging.DEBUG, logger="agentix.runtime.client"):
        await client.remote(sandbox_functions.add, 1, 2)
        await eventually(lambda: runtime.trace_acks and runtime.trace_acks[-1] == 4)
    assert [item["name"] for _, item in recorder.calls] == ["d"]
    refused = [r for r in caplog.records if "failed; continuing" in r.getMessage()]
    assert len(refused) == 3 and refused[0].levelno == logging.WARNING
    assert all(len(r.getMessage()) < 2_000 for r in refused)
    assert "more than 128" in str(refused[0].exc_info[1])


async def test_the_console_processor_keeps_a_bounded_number_of_open_spans():
    import io

    console = trace.ConsoleProcessor(stream=io.StringIO())
    for i in range(console.MAX_OPEN_SPANS + 5_000):  # starts whose end never comes
        console.on_span_start(trace.Span(span_id=f"span_{i}", trace_id=TRACE_ID, parent_id=None, name="s"))
    assert len(console._depth) == console.MAX_OPEN_SPANS
    # The newest are kept: a child of the last one is indented under it.
    console.on_span_start(trace.Span(span_id="child", trace_id=TRACE_ID, parent_id=f"span_{i}", name="c"))
    assert console._depth["child"] == 2


class EndsOnly(trace.Processor):
    """Watches span ends only (as exporters do): span starts need not be built."""

    def __init__(self) -> None:
        self.ended: list[dict] = []

    def on_span_end(self, item):
        self.ended.append(item.export())


async def test_events_no_processor_watches_are_skipped_but_ids_still_checked(runtime, client, caplog):
    from agentix.runtime.client import traces

    saved = trace.get_processors()
    ends = EndsOnly()
    trace.set_processors([ends])
    built = []
    real_trace_item = traces.trace_item

    def counting_trace_item(event):
        built.append(event.kind)
        return real_trace_item(event)

    # Plain span events are built by the native span_item once a stream chose it.
    traces.choose_native()
    real_native_span = traces._native_span

    def counting_native_span(event, *args):
        item = real_native_span(event, *args)
        if item is not None:
            built.append(event.kind)
        return item

    traces.trace_item = counting_trace_item
    if real_native_span is not None:
        traces._native_span = counting_native_span
    try:
        long_id = "span_" + "x" * (traces.MAX_ID_CHARS + 1)
        runtime.add_traces(
            *lifecycle(),
            trace_event(7, pb.TRACE_EVENT_KIND_SPAN_START, agentix_trace_id=TRACE_ID, agentix_span_id=long_id,
                        name="refused"),
        )
        with caplog.at_level(logging.DEBUG, logger="agentix.runtime.client"):
            await client.remote(sandbox_functions.add, 1, 2)
            await eventually(lambda: runtime.trace_acks and runtime.trace_acks[-1] == 7)
    finally:
        traces.trace_item = real_trace_item
        traces._native_span = real_native_span
        trace.set_processors(saved)
    # Only the span ends were made into Spans; the ends carry what they always did.
    assert built == [pb.TRACE_EVENT_KIND_SPAN_END] * 2
    assert [item["name"] for item in ends.ended] == ["tool", "plan"]
    # A skipped start with an over-long id is still refused and reported.
    refused = [r for r in caplog.records if "failed; continuing" in r.getMessage()]
    assert len(refused) == 1 and "more than 128" in str(refused[0].exc_info[1])


async def test_a_processor_added_between_events_sees_the_next_start():
    from agentix.runtime.client import traces

    saved = trace.get_processors()
    ends, recorder = EndsOnly(), Recorder()
    trace.set_processors([ends])
    try:
        replay = traces.TracesStream._batch_replayer(None)
        first, second = (
            trace_event(seq, pb.TRACE_EVENT_KIND_SPAN_START, agentix_trace_id=TRACE_ID, agentix_span_id=span_id,
                        name=name, start_time_unix_nanos=T0)
            for seq, span_id, name in ((1, ROOT_ID, "before"), (2, CHILD_ID, "after"))
        )
        replay(first)
        trace.add_processor(recorder)
        replay(second)
        started = [(method, item["name"]) for method, item in recorder.calls]
        # A processor whose start method is an instance attribute is not a no-op either.
        replay_all = traces.TracesStream._batch_replayer(None)
        seen = []
        ends.on_span_start = lambda item: seen.append(item.name)
        replay_all(first)
    finally:
        trace.set_processors(saved)
    assert started == [("on_span_start", "after")]
    assert seen == ["before"]
