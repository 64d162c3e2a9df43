"""The host's Logs / Traces response decoders (``_native_calls.log_records`` /
``trace_events``, host/python/native/side_wire.h): they read what protobuf
reads or leave the message to protobuf (None); replay makes the same records
and spans from their fields as from protobuf's messages; bytes that are not a
response raise protobuf's error, never crash, and are reported, counted and
skipped by the stream, which goes on."""

import asyncio
import logging
import random

import grpc
import pytest
from google.protobuf.message import DecodeError

from agentix import trace
from agentix.runtime.client import logs, traces
from agentix.runtime.client._native_calls import (
    LogRecordFields,
    TraceEventFields,
    iso_from_unix_nanos,
    log_records,
    span_item,
    trace_events,
)
from agentix.runtime.v1 import runtime_pb2 as pb
from fake_runtime import log_record, trace_event

LOG_FIELDS = [field.name for field in pb.LogRecord.DESCRIPTOR.fields]


def sample_logs() -> bytes:
    response = pb.LogsResponse(instance_id="d41d8cd98f00b204")
    response.records.extend([
        log_record(7, "température ✓ 𝄞", logger="sandbox.app", time_unix_nanos=1764670000123456789,
                   file="/sandbox/app.py", line=12, function="handler", module="app", worker_id="1a2b3c4d",
                   call_id="call-1", context="sandbox-host-worker-1a2b3c4d", extras=b"\x81\xa1k\x01"),
        log_record(8, "again", logger="sandbox.app", time_unix_nanos=1764670000223456789,
                   file="/sandbox/app.py", line=13, function="handler", module="app", worker_id="1a2b3c4d",
                   exception_text="Traceback ...", stack_info="Stack ..."),
        log_record(9, "odd", level=-3, line=-1, time_unix_nanos=-5, origin=77),
    ])
    return response.SerializeToString()


def sample_traces() -> bytes:
    response = pb.TracesResponse(instance_id="d41d8cd98f00b204")
    response.events.extend([
        trace_event(1, pb.TRACE_EVENT_KIND_TRACE_START, agentix_trace_id="trace_1", name="t",
                    start_time_unix_nanos=1764670000000000000, attributes={"user": "ünï", "n": 3},
                    trace_id=b"\x01" * 16),
        trace_event(2, pb.TRACE_EVENT_KIND_SPAN_END, agentix_trace_id="trace_1", agentix_span_id="span_2",
                    agentix_parent_id="span_1", name="s", start_time_unix_nanos=1764670000000001000,
                    end_time_unix_nanos=1764670000000002000, span_id=b"\x02" * 8,
                    attributes={"flag": True, "i": -9, "ratio": 0.5, "blob": b"\xff\x00", "s": "x"},
                    status=pb.SPAN_STATUS_CODE_ERROR, status_description="failed", error_message="boom",
                    error_data={"code": 7}, call_id="call-1", worker_id="1a2b3c4d",
                    events=[pb.SpanEventRecord(name="retry", time_unix_nanos=1764670000000001500,
                                               attributes=[pb.Attribute(key="unset")])]),
    ])
    return response.SerializeToString()


def protobuf_logs(message: bytes):
    response = pb.LogsResponse.FromString(message)
    return response.instance_id, [tuple(getattr(r, name) for name in LOG_FIELDS) for r in response.records]


def native_logs(message: bytes):
    decoded = log_records(message)
    if decoded is None:
        return None
    instance_id, records = decoded
    return instance_id, [tuple(getattr(r, name) for name in LOG_FIELDS) for r in records]


def trace_fields(event):
    """What replay reads of a TraceEvent, from either kind of event."""
    def pairs(items):
        return [traces.attributes([item]).popitem() if item is not None else None for item in items]

    return (event.seq, event.kind, event.agentix_trace_id, event.agentix_span_id, event.agentix_parent_id,
            event.name, event.start_time_unix_nanos, event.end_time_unix_nanos, pairs(event.attributes),
            [(e.name, e.time_unix_nanos, pairs(e.attributes)) for e in event.events], event.status,
            event.status_description, event.error_message, pairs(event.error_data), event.call_id,
            event.worker_id)


def protobuf_traces(message: bytes):
    response = pb.TracesResponse.FromString(message)
    return response.instance_id, [trace_fields(event) for event in response.events]


def native_traces(message: bytes):
    decoded = trace_events(message)
    if decoded is None:
        return None
    instance_id, events = decoded
    return instance_id, [trace_fields(event) for event in events]


def test_records_and_events_read_as_protobuf_reads_them():
    assert native_logs(sample_logs()) == protobuf_logs(sample_logs())
    instance_id, records = log_records(sample_logs())
    assert instance_id == "d41d8cd98f00b204"
    assert type(records[0]) is LogRecordFields
    assert (records[2].level, records[2].origin, records[0].extras) == (-3, 77, b"\x81\xa1k\x01")
    # A field that repeats the previous record's text is the same object.
    assert records[1].logger is records[0].logger

    assert native_traces(sample_traces()) == protobuf_traces(sample_traces())
    _, events = trace_events(sample_traces())
    assert events[1].attributes == (("flag", True), ("i", -9), ("ratio", 0.5), ("blob", b"\xff\x00"), ("s", "x"))
    assert events[1].events[0].attributes == (("unset", None),)
    assert events[0].events == () and events[0].error_data == ()
    assert log_records(b"") == ("", []) and trace_events(b"") == ("", [])


def test_any_bytes_like_message_is_read_and_other_objects_are_refused():
    for message in (bytearray(sample_logs()), memoryview(sample_logs())):
        assert native_logs(message) == protobuf_logs(sample_logs())
    with pytest.raises(TypeError):
        log_records("not bytes")
    with pytest.raises(TypeError):
        trace_events(None)


@pytest.mark.parametrize("decode, reference, sample", [
    (native_logs, protobuf_logs, sample_logs),
    (native_traces, protobuf_traces, sample_traces),
])
def test_damaged_messages_are_read_as_protobuf_reads_them_or_left_to_it(decode, reference, sample):
    rng = random.Random(20261202)
    base = sample()
    decoded_count = refused = 0
    for _ in range(3000):
        message = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            if choice < 0.5 and message:
                message[rng.randrange(len(message))] = rng.randrange(256)
            elif choice < 0.75 and message:
                del message[rng.randrange(len(message)):]
            else:
                message.insert(rng.randrange(len(message) + 1), rng.randrange(256))
        decoded = decode(bytes(message))
        if decoded is None:
            refused += 1
        else:
            decoded_count += 1
            assert decoded == reference(bytes(message))
    assert decoded_count > 100 and refused > 100  # both branches ran


def test_malformed_responses_raise_protobufs_error():
    truncated = sample_logs()[:-3]
    bad_utf8 = pb.LogRecord(message="x").SerializeToString().replace(b"x", b"\xc3")
    bad_utf8 = b"\x0a" + bytes([len(bad_utf8)]) + bad_utf8  # records: [that record]
    for message in (truncated, bad_utf8):
        assert log_records(message) is None
        with pytest.raises(DecodeError):
            logs.decode_response(message)
        with pytest.raises(DecodeError):
            traces.decode_response(message[:-1] + b"\xff\xff")


def test_replay_makes_the_same_records_from_either_decoding(monkeypatch):
    made = []

    class Keep(logging.Handler):
        def emit(self, record):
            made.append(dict(vars(record)))

    logger = logging.getLogger("sandbox.app")
    handler = Keep()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        batch = logs.RecordBatch()  # one template for both
        for records in (log_records(sample_logs())[1], pb.LogsResponse.FromString(sample_logs()).records):
            for record in records[:2]:
                batch.replay(record)
    finally:
        logger.removeHandler(handler)
    assert len(made) == 4
    for native, protobuf in zip(made[:2], made[2:]):
        # (makeRecord's path, taken for extras, computes relativeCreated from
        # the host's clock as well: equal up to float rounding.)
        assert native.pop("relativeCreated") == pytest.approx(protobuf.pop("relativeCreated"))
        assert native == protobuf

    # Without the native module every response takes protobuf's path.
    monkeypatch.setattr(logs.decode_response, "native", lambda message: None)
    instance_id, records = logs.decode_response(sample_logs())
    assert instance_id == "d41d8cd98f00b204" and isinstance(records[0], pb.LogRecord)


def test_replay_makes_the_same_spans_from_either_decoding():
    ended = []

    class Keep(trace.Processor):
        def on_trace_start(self, item):
            ended.append(item)

        def on_span_end(self, item):
            ended.append(item)

    processor = Keep()
    trace.add_processor(processor)
    try:
        for events in (trace_events(sample_traces())[1], pb.TracesResponse.FromString(sample_traces()).events):
            replayer = traces.EventReplayer()
            for event in events:
                replayer.replay(event)
    finally:
        trace._processors = tuple(p for p in trace._processors if p is not processor)
    assert len(ended) == 4
    assert ended[:2] == ended[2:]  # dataclasses: field by field
    span = ended[1]
    assert span.attrs == {"flag": True, "i": -9, "ratio": 0.5, "blob": b"\xff\x00", "s": "x", "call_id": "call-1"}
    assert (span.error.data, span.events[0].attributes) == ({"code": 7}, {"unset": None})


class _MalformedRpc:
    """A stream-stream call whose daemon sends `messages`, then ends."""

    def __init__(self, messages):
        self.messages = list(messages)
        self.written = []

    async def write(self, request):
        self.written.append(request)

    async def read(self):
        await asyncio.sleep(0)
        return self.messages.pop(0) if self.messages else grpc.aio.EOF

    def cancel(self):
        return True


def _response(stream_type, seq, text):
    if stream_type is logs.LogsStream:
        return pb.LogsResponse(records=[log_record(seq, text, logger="sandbox.wire")]).SerializeToString()
    return pb.TracesResponse(events=[trace_event(seq, pb.TRACE_EVENT_KIND_SPAN_END, name=text,
                                                 agentix_span_id=f"span_{seq}")]).SerializeToString()


async def _until(predicate):
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


@pytest.mark.asyncio
@pytest.mark.parametrize("stream_type", [logs.LogsStream, traces.TracesStream])
async def test_bytes_that_are_no_response_are_reported_counted_and_skipped(stream_type, caplog):
    # Ending the stream instead would have the next one resubscribe from the
    # same seq, be sent the same bytes and fail again, once a second for ever.
    from agentix.runtime.client import subscription

    bad = b"\x0a\x05\xff\xff"  # a record cut short
    rpc = _MalformedRpc([_response(stream_type, 1, "kept"), bad, bad, _response(stream_type, 2, "after")])
    cursor = logs.LogCursor() if stream_type is logs.LogsStream else traces.TraceCursor()
    caplog.set_level(logging.DEBUG, logger="agentix.runtime.client")
    before = subscription.lost_counts().get(stream_type.rpc_name, {}).get("undecodable_responses", 0)
    stream = stream_type(rpc, cursor, lambda: None)
    await _until(lambda: len(rpc.written) == 3)  # subscribe, ack 1, ack 2: both good responses were replayed
    assert cursor.last_seq == 2
    assert subscription.lost_counts()[stream_type.rpc_name]["undecodable_responses"] == before + 2
    reports = [r for r in caplog.records if "could not be decoded" in r.getMessage()]
    assert [r.levelno for r in reports] == [logging.ERROR, logging.WARNING]
    assert reports[0].exc_info[0] is DecodeError and f"{len(bad)} bytes" in reports[0].getMessage()
    await _until(lambda: not stream.alive)  # the daemon ended it: it was alive until then
    assert not any("stream failed" in r.getMessage() for r in caplog.records)
    await stream.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize("stream_type", [logs.LogsStream, traces.TracesStream])
async def test_a_batch_that_cannot_be_replayed_is_reported_counted_and_skipped(stream_type, caplog, monkeypatch):
    from agentix.runtime.client import subscription

    real = stream_type._batch_replayer
    calls = []

    def replayer(self):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected: no replayer")
        return real(self)

    monkeypatch.setattr(stream_type, "_batch_replayer", replayer)
    rpc = _MalformedRpc([_response(stream_type, 1, "lost"), _response(stream_type, 2, "kept")])
    cursor = logs.LogCursor() if stream_type is logs.LogsStream else traces.TraceCursor()
    caplog.set_level(logging.DEBUG, logger="agentix.runtime.client")
    before = subscription.lost_counts().get(stream_type.rpc_name, {}).get("failed_items", 0)
    stream = stream_type(rpc, cursor, lambda: None)
    await _until(lambda: len(rpc.written) == 3)  # both acknowledged
    assert len(calls) == 2 and cursor.last_seq == 2
    assert subscription.lost_counts()[stream_type.rpc_name]["failed_items"] == before + 1
    [report] = [r for r in caplog.records if r.levelno == logging.ERROR and "replaying" in r.getMessage()]
    assert "seq 1..1" in report.getMessage() and str(report.exc_info[1]) == "injected: no replayer"
    await stream.aclose()


def test_native_stamps_are_the_python_ones():
    # Day, month, year and leap-year edges, the int64 end, random instants.
    values = [1, 999, 1000, 1_000_000, 86_399_999_999_999, 86_400_000_000_000,
              951_782_400_000_000_000, 951_868_799_999_999_999, 4_107_542_400_000_000_000,
              1_764_670_000_123_456_789, 2**63 - 1]
    rng = random.Random(25)
    values += [rng.randrange(1, 2**63) for _ in range(20_000)]
    for nanos in values:
        assert iso_from_unix_nanos(nanos) == traces.iso_from_nanos(nanos), nanos
    for nanos in (0, -1, -(2**63)):
        assert iso_from_unix_nanos(nanos) is None and traces.iso_from_nanos(nanos) is None
    with pytest.raises(OverflowError):
        iso_from_unix_nanos(2**63)
    with pytest.raises(TypeError):
        iso_from_unix_nanos(1.5)


def test_replay_stamps_spans_alike_with_either_stamp(monkeypatch):
    ended = []

    class Keep(trace.Processor):
        def on_span_end(self, item):
            ended.append(item)

    processor = Keep()
    trace.add_processor(processor)
    try:
        for stamp in (iso_from_unix_nanos, traces.iso_from_nanos):
            monkeypatch.setattr(traces, "_stamp", stamp)
            replayer = traces.EventReplayer()
            for event in trace_events(sample_traces())[1]:
                replayer.replay(event)
    finally:
        trace._processors = tuple(p for p in trace._processors if p is not processor)
    assert len(ended) == 2 and ended[0] == ended[1]
    assert (ended[0].started_at, ended[0].ended_at) == ("2025-12-02T10:06:40.000001Z", "2025-12-02T10:06:40.000002Z")
    assert ended[0].events[0].timestamp == "2025-12-02T10:06:40.000001Z"


def test_without_the_native_module_responses_take_protobufs_path(monkeypatch):
    import sys

    import agentix.runtime.client as client_package
    from agentix.runtime.client import subscription

    # As in the pure wheel: importing _native_calls fails.
    monkeypatch.delattr(client_package, "_native_calls")
    monkeypatch.setitem(sys.modules, "agentix.runtime.client._native_calls", None)
    decoder = subscription.native_decoder("trace_events")
    assert decoder(sample_traces()) is None
    monkeypatch.setattr(traces.decode_response, "native", decoder)
    monkeypatch.setattr(logs.decode_response, "native", subscription.native_decoder("log_records"))
    instance_id, events = traces.decode_response(sample_traces())
    assert instance_id == "d41d8cd98f00b204" and isinstance(events[0], pb.TraceEvent)
    assert [trace_fields(event) for event in events] == protobuf_traces(sample_traces())[1]
    _, records = logs.decode_response(sample_logs())
    assert isinstance(records[0], pb.LogRecord)
    assert traces.native_stamp() is traces.iso_from_nanos
    with pytest.raises(DecodeError):
        logs.decode_response(sample_logs()[:-3])


LIMITS = (traces.MAX_ID_CHARS, traces.MAX_NAME_CHARS, traces.MAX_KEY_CHARS, traces.MAX_ATTRIBUTES)


def span_events() -> list:
    """Span events of every shape replay meets: plain starts and ends (attributes
    of each type, a repeated key, a call_id attribute, unset stamps, statuses
    known and not), and ones span_item leaves to trace_item (events, an error,
    over-long names, keys, ids and attribute counts, other kinds)."""
    plain = dict(agentix_trace_id="trace_1", agentix_span_id="span_2", name="s", call_id="call-1")
    many = {f"k{i}": i for i in range(traces.MAX_ATTRIBUTES + 1)}
    shapes = [
        (pb.TRACE_EVENT_KIND_SPAN_START, dict(plain, start_time_unix_nanos=1764670000000001000,
                                              agentix_parent_id="span_1")),
        (pb.TRACE_EVENT_KIND_SPAN_END, dict(plain, start_time_unix_nanos=1764670000000001000,
                                            end_time_unix_nanos=1764670000999999999, status=pb.SPAN_STATUS_CODE_OK,
                                            attributes={"flag": True, "i": -9, "ratio": 0.5, "blob": b"\xff",
                                                        "s": "ünï"})),
        (pb.TRACE_EVENT_KIND_SPAN_END, dict(plain, status=pb.SPAN_STATUS_CODE_ERROR, status_description="failed",
                                            attributes=[pb.Attribute(key="a", value=pb.AttributeValue(int_value=1)),
                                                        pb.Attribute(key="call_id"),
                                                        pb.Attribute(key="a", value=pb.AttributeValue(int_value=2))])),
        (pb.TRACE_EVENT_KIND_SPAN_END, dict(agentix_span_id="span_3", status=77, start_time_unix_nanos=-5)),
        (pb.TRACE_EVENT_KIND_SPAN_END, dict(plain, name="n" * traces.MAX_NAME_CHARS,
                                            agentix_parent_id="p" * traces.MAX_ID_CHARS,
                                            attributes={"k" * traces.MAX_KEY_CHARS: 1})),
        # Left to trace_item:
        (pb.TRACE_EVENT_KIND_SPAN_END, dict(plain, events=[pb.SpanEventRecord(name="retry")])),
        (pb.TRACE_EVENT_KIND_SPAN_END, dict(plain, error_message="boom", error_data={"code": 7})),
        (pb.TRACE_EVENT_KIND_SPAN_END, dict(plain, name="n" * (traces.MAX_NAME_CHARS + 1))),
        (pb.TRACE_EVENT_KIND_SPAN_END, dict(plain, attributes={"k" * (traces.MAX_KEY_CHARS + 1): 1})),
        (pb.TRACE_EVENT_KIND_SPAN_START, dict(plain, attributes=many)),
        (pb.TRACE_EVENT_KIND_TRACE_START, dict(plain, attributes={"user": "ada"})),
        (pb.TRACE_EVENT_KIND_TRACE_END, plain),
        (9, plain),
    ]
    response = pb.TracesResponse(events=[trace_event(seq, kind, **fields)
                                         for seq, (kind, fields) in enumerate(shapes, 1)])
    return trace_events(response.SerializeToString())[1]


def test_native_spans_are_the_ones_trace_item_makes():
    built = 0
    for event in span_events():
        expected = traces.trace_item(event)
        made = span_item(event, trace.Span, *LIMITS)
        if made is None:  # left to trace_item (which seqs: below)
            continue
        built += 1
        assert type(made) is trace.Span and made == expected
        # The same fields in the same order: export() and repr() see no difference.
        assert list(vars(made).items()) == list(vars(expected).items())
        assert made.attrs is not expected.attrs and made.events == [] and made.events is not expected.events
    assert built == 5
    declined = [event.seq for event in span_events() if span_item(event, trace.Span, *LIMITS) is None]
    assert declined == list(range(6, 14))


def test_events_span_item_cannot_read_take_the_python_path_or_raise_a_type_error():
    ids = ("trace_1", "span_2", "")
    odd = [
        (1, 4, *ids, "s", 0, 0, (("k",),), (), 0, "", "", (), "", ""),  # a pair that is no pair
        (1, 4, *ids, "s", 0, 0, (), (), 0, "", "", (), 5, ""),  # a call id that is no str
        (1, 4, *ids, "s", 2**70, 0, (), (), 0, "", "", (), "", ""),  # beyond int64
        (1, 4, *ids, "s", "0", 0, (), (), 0, "", "", (), "", ""),
        (1, 4, 7, "span_2", "", "s", 0, 0, (), (), 0, "", "", (), "", ""),
        (1, "4", *ids, "s", 0, 0, (), (), 0, "", "", (), "", ""),
    ]
    for fields in odd:
        assert span_item(TraceEventFields(fields), trace.Span, *LIMITS) is None
    assert span_item(pb.TraceEvent(kind=pb.TRACE_EVENT_KIND_SPAN_END), trace.Span, *LIMITS) is None
    with pytest.raises(TypeError):
        span_item(span_events()[0], trace.Span)
    with pytest.raises(TypeError):
        span_item(span_events()[0], "Span", *LIMITS)


def test_replay_makes_the_same_spans_with_or_without_span_item(monkeypatch):
    seen = []

    class Keep(trace.Processor):
        def on_span_start(self, item):
            seen.append(("start", item))

        def on_span_end(self, item):
            seen.append(("end", item))

    processor = Keep()
    trace.add_processor(processor)
    try:
        traces.choose_native()
        assert traces._native_span is span_item
        for native in (span_item, None):
            monkeypatch.setattr(traces, "_native_span", native)
            replayer = traces.EventReplayer()
            for event in span_events():
                replayer.replay(event)
    finally:
        trace._processors = tuple(p for p in trace._processors if p is not processor)
    half = len(seen) // 2
    assert half == 10 and seen[:half] == seen[half:]
    assert [vars(item) for _, item in seen[:half]] == [vars(item) for _, item in seen[half:]]
