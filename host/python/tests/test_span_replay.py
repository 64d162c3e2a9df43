"""The native span replayer (``_native_calls.SpanReplayer``,
host/python/native/side_records.h): a Traces batch replays through it, and it
makes the same processor calls as ``traces.EventReplayer.replay`` (the same
spans, in the same order, the same log record for a processor that raises,
the same refusals), handing every event its C path does not take to
``replay`` before any processor has seen it."""

import logging

import pytest

from agentix import trace
from agentix.runtime.client import traces
from agentix.runtime.client._native_calls import SpanReplayer, trace_events
from agentix.runtime.v1 import runtime_pb2 as pb
from fake_runtime import trace_event

_T = 1_764_670_000_000_001_000
_PLAIN = dict(agentix_trace_id="trace_1", agentix_span_id="span_2", name="s", call_id="call-1")
# Every shape replay meets: plain starts and ends (the C path), then ones it
# leaves to replay (span events, an error, an over-long name, an over-long id
# (refused), trace events, an unknown kind), then plain ones again.
_SHAPES = [
    (pb.TRACE_EVENT_KIND_SPAN_START, dict(_PLAIN, start_time_unix_nanos=_T, agentix_parent_id="span_1")),
    (pb.TRACE_EVENT_KIND_SPAN_END, dict(_PLAIN, start_time_unix_nanos=_T, end_time_unix_nanos=_T + 9,
                                        status=pb.SPAN_STATUS_CODE_OK, attributes={"i": -9, "s": "ünï"})),
    (pb.TRACE_EVENT_KIND_SPAN_START, dict(_PLAIN, name="raise")),
    (pb.TRACE_EVENT_KIND_SPAN_END, dict(_PLAIN, status=pb.SPAN_STATUS_CODE_ERROR, status_description="failed")),
    (pb.TRACE_EVENT_KIND_SPAN_END, dict(_PLAIN, events=[pb.SpanEventRecord(name="retry")])),
    (pb.TRACE_EVENT_KIND_SPAN_END, dict(_PLAIN, error_message="boom", error_data={"code": 7})),
    (pb.TRACE_EVENT_KIND_SPAN_START, dict(_PLAIN, name="n" * (traces.MAX_NAME_CHARS + 1))),
    (pb.TRACE_EVENT_KIND_SPAN_START, dict(_PLAIN, agentix_span_id="x" * (traces.MAX_ID_CHARS + 1))),
    (pb.TRACE_EVENT_KIND_TRACE_START, dict(_PLAIN, attributes={"user": "ada"})),
    (pb.TRACE_EVENT_KIND_TRACE_END, _PLAIN),
    (9, _PLAIN),
    (pb.TRACE_EVENT_KIND_SPAN_END, dict(_PLAIN, name="last", end_time_unix_nanos=_T + 20)),
]


def _events() -> list:
    response = pb.TracesResponse(events=[trace_event(seq, kind, **fields)
                                         for seq, (kind, fields) in enumerate(_SHAPES, 1)])
    return trace_events(response.SerializeToString())[1]


class _Keep(trace.Processor):
    """Keeps every call; raises from on_span_start for a span named "raise"."""

    def __init__(self, tag, seen):
        self.tag, self.seen = tag, seen

    def on_trace_start(self, item):
        self.seen.append((self.tag, "on_trace_start", vars(item).copy()))

    def on_trace_end(self, item):
        self.seen.append((self.tag, "on_trace_end", vars(item).copy()))

    def on_span_start(self, item):
        self.seen.append((self.tag, "on_span_start", vars(item).copy()))
        if item.name == "raise":
            raise RuntimeError(f"{self.tag} refused {item.span_id}")

    def on_span_end(self, item):
        self.seen.append((self.tag, "on_span_end", vars(item).copy()))

    def __repr__(self):
        return f"<keep {self.tag}>"


class _EndsOnly(trace.Processor):
    def __init__(self, seen):
        self.seen = seen

    def on_span_end(self, item):
        self.seen.append(("ends", "on_span_end", vars(item).copy()))


def _replay_all(replay, events, caplog):
    """What replaying `events` one by one with `replay` does: the outcome of
    each call (None or the exception's type and text) and the log records."""
    outcomes = []
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="agentix.trace"):
        for event in events:
            try:
                outcomes.append(replay(event))
            except Exception as error:
                outcomes.append((type(error), str(error)))
    records = [(r.levelno, r.getMessage(), *((r.exc_info[0], str(r.exc_info[1])) if r.exc_info else ()))
               for r in caplog.records]
    return outcomes, records


@pytest.fixture
def processors():
    saved = trace.get_processors()
    traces.choose_native()
    yield
    trace.set_processors(saved)
    trace.set_tracing_disabled(False)


@pytest.mark.parametrize("watching", ["all", "ends only", "none"])
def test_the_native_replayer_makes_the_same_calls_as_replay(processors, caplog, monkeypatch, watching):
    for native in (False, True):
        monkeypatch.setattr(trace, "_warned_no_processor", False)  # warned once per process
        seen = []
        if watching == "all":
            trace.set_processors([_Keep("a", seen), _EndsOnly(seen), _Keep("b", seen)])
        elif watching == "ends only":
            trace.set_processors([_EndsOnly(seen)])
        else:
            trace.set_processors([])
        replay = traces.batch_replayer() if native else traces.EventReplayer().replay
        assert (type(replay) is SpanReplayer) is native
        result = _replay_all(replay, _events(), caplog)
        if not native:
            expected, expected_seen = result, seen
    outcomes, records = result
    assert outcomes == expected[0] and records == expected[1]
    assert seen == expected_seen
    # Each event's outcome: the over-long id refused, everything else replayed.
    assert outcomes == [None] * 7 + [(ValueError, outcomes[7][1])] + [None] * 4
    assert "more than 128" in outcomes[7][1]
    if watching == "all":
        # Both raising processors reported at ERROR with their exception; the ones after them still called.
        assert [(level, message) for level, message, *_ in records] == [
            (logging.ERROR, "trace processor <keep a> raised in on_span_start"),
            (logging.ERROR, "trace processor <keep b> raised in on_span_start"),
        ]
        assert [error for *_, error in records] == ["a refused span_2", "b refused span_2"]
        assert [(tag, method) for tag, method, _ in seen[:4]] == [
            ("a", "on_span_start"), ("b", "on_span_start"), ("a", "on_span_end"), ("ends", "on_span_end")]
        assert len(seen) == 25
    elif watching == "ends only":
        assert [item["name"] for *_, item in seen] == ["s"] * 4 + ["last"] and records == []
    else:
        assert seen == [] and [message for _, message, *_ in records] == [trace._NO_PROCESSOR_WARNING]


def test_tracing_disabled_calls_nothing_and_still_refuses_long_ids(processors, caplog):
    seen = []
    trace.set_processors([_Keep("a", seen)])
    trace.set_tracing_disabled(True)
    outcomes, records = _replay_all(traces.batch_replayer(), _events(), caplog)
    assert seen == [] and records == []
    assert [outcome for outcome in outcomes if outcome is not None] == [(ValueError, outcomes[7][1])]


def test_a_processor_list_changed_between_events_is_seen_by_the_next(processors, caplog):
    seen = []
    first, second = _Keep("a", seen), _Keep("b", seen)
    trace.set_processors([first])
    replay = traces.batch_replayer()
    events = _events()
    replay(events[0])
    trace.add_processor(second)
    replay(events[1])
    trace.set_processors([])
    replay(events[11])
    assert [(tag, method, item["name"]) for tag, method, item in seen] == [
        ("a", "on_span_start", "s"), ("a", "on_span_end", "s"), ("b", "on_span_end", "s")]


def test_a_base_exception_from_a_processor_propagates(processors):
    class Stop(BaseException):
        pass

    class Stopping(trace.Processor):
        def on_span_end(self, item):
            raise Stop(item.name)

    seen = []
    trace.set_processors([Stopping(), _Keep("after", seen)])
    with pytest.raises(Stop, match="last"):
        traces.batch_replayer()(_events()[11])
    assert seen == []


def test_protobuf_events_and_a_patched_span_item_take_the_python_path(processors, caplog, monkeypatch):
    seen = []
    trace.set_processors([_Keep("a", seen)])
    replay = traces.batch_replayer()
    replay(trace_event(1, pb.TRACE_EVENT_KIND_SPAN_END, **dict(_PLAIN, name="protobuf")))
    assert [item["name"] for *_, item in seen] == ["protobuf"]
    monkeypatch.setattr(traces, "_native_span", None)
    assert type(traces.batch_replayer()) is not SpanReplayer


def test_the_stream_replays_through_the_native_replayer():
    assert type(traces.TracesStream._batch_replayer(None)) is SpanReplayer
    with pytest.raises(TypeError):
        traces.batch_replayer()(1, 2)
