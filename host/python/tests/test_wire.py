"""The hand-written Calls wire pieces must mean exactly what protobuf means."""

import os

import pytest

from agentix.runtime.client import stream as stream_module
from agentix.runtime.client import frames, ns_wire, wire
from agentix.runtime.v1 import runtime_pb2 as pb


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16_383, 16_384, 1 << 20])
@pytest.mark.parametrize("offset", [0, 1, 127, 128, 1 << 20, (1 << 35) + 5])
def test_argument_chunk_event_parses_as_protobuf(size, offset):
    data = os.urandom(size)
    encoded = b"".join(wire.argument_chunk_event("call-é-1", memoryview(data), offset))
    request = pb.CallsRequest.FromString(encoded)
    (event,) = request.events
    assert event.WhichOneof("kind") == "argument_chunk"
    assert event.argument_chunk.call_id == "call-é-1"
    assert event.argument_chunk.data == data
    assert event.argument_chunk.HasField("offset") and event.argument_chunk.offset == offset


@pytest.mark.parametrize("size", [0, 5, 127, 128, 200, 70_000])
@pytest.mark.parametrize(
    "call_id, callable_ref, context, stream_window",
    [("c1", "m::f", b"ctx", 4), ("", "", b"", 0), ("é" * 40, "mod.sub::Cls.method", b"x" * 300, 1 << 20)],
)
def test_start_call_event_is_what_protobuf_would_write(size, call_id, callable_ref, context, stream_window):
    arguments = os.urandom(size)
    for total in (size, size + 10, 0):
        encoded = b"".join(
            wire.start_call_event(call_id, callable_ref, memoryview(arguments), total, context, stream_window)
        )
        start = pb.StartCall(
            call_id=call_id,
            callable=callable_ref,
            encoding=pb.ENCODING_PICKLE,
            arguments=arguments,
            arguments_size=total,
            context=context,
            stream_window=stream_window,
        )
        assert encoded == pb.CallsRequest(events=[pb.HostEvent(start=start)]).SerializeToString()


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("size", [0, 5, 127, 128, 4095])
@pytest.mark.parametrize("acks", [None, ["a"], ["c" * 32] * 3, ["", "x" * 121, "y" * 300, "\u00e9" * 70]])
@pytest.mark.parametrize(
    "call_id, callable_ref, context, stream_window",
    [("c1", "m::f", b"ctx", 4), ("", "", b"", 0), ("\u00e9" * 40, "mod.sub::Cls.method", b"x" * 300, 1 << 20)],
)
@pytest.mark.parametrize("frame_kind", [0, 2])
def test_start_call_request_is_the_acks_then_the_start_call_event(
    monkeypatch, native, size, acks, call_id, callable_ref, context, stream_window, frame_kind
):
    if native:
        assert stream_module._native_calls_request is not None, "the native module is part of this build"
    else:
        monkeypatch.setattr(stream_module, "_native_calls_request", None)
    arguments = os.urandom(size)
    message = stream_module.start_call_request(
        acks, call_id, callable_ref, arguments, context, stream_window, frame_kind
    )
    expected = wire.ack_events(acks or []) + b"".join(
        wire.start_call_event(call_id, callable_ref, memoryview(arguments), size, context, stream_window)
    )
    if frame_kind:
        expected = len(expected).to_bytes(4, "little") + bytes((frame_kind,)) + expected
    assert message == expected
    if not frame_kind:
        events = pb.CallsRequest.FromString(message).events
        assert [event.ack.call_id for event in events[:-1]] == (acks or [])
        assert events[-1].start.call_id == call_id and events[-1].start.arguments == arguments


def test_start_call_request_keeps_a_plain_context_s_fields():
    from agentix.utils import context, trace

    with trace.trace("t") as t, trace.span("s") as s, context.scope(run="r42"):
        carrier = wire.context_carrier()
    assert type(carrier) is wire.ContextFields
    message = stream_module.start_call_request(None, "c1", "m::f", b"\x80x", carrier, 0, 0)
    start = pb.CallsRequest.FromString(message).events[0].start
    assert start.context == b"" and start.baggage == {"run": "r42"}
    assert start.traceparent == f"00-{t.trace_id[6:]}-{s.span_id[5:21]}-01"
    assert start.tracestate == "agentix=" + s.span_id[5:]


def test_start_call_request_refuses_an_id_protobuf_refuses():
    with pytest.raises(UnicodeEncodeError):
        stream_module.start_call_request(["\udc80"], "c1", "m::f", b"", b"", 0, 0)
    with pytest.raises(UnicodeEncodeError):
        stream_module.start_call_request(None, "\udc80", "m::f", b"", b"", 0, 0)


def test_mixed_batch_keeps_event_order():
    data = os.urandom(3000)
    batch = [
        pb.HostEvent(ack=pb.AckResult(call_id="a")),
        wire.argument_chunk_event("b", memoryview(data), 10),
        pb.HostEvent(cancel=pb.CancelCall(call_id="c")),
        pb.HostEvent(ack=pb.AckResult(call_id="d")),
        wire.argument_chunk_event("e", memoryview(data)[:7], 20),
    ]
    encoded = stream_module._encode_batch(batch)
    events = pb.CallsRequest.FromString(encoded).events
    assert [event.WhichOneof("kind") for event in events] == ["ack", "argument_chunk", "cancel", "ack", "argument_chunk"]
    assert events[1].argument_chunk.data == data and events[4].argument_chunk.data == data[:7]


def test_protobuf_events_are_framed_exactly_as_protobuf_would():
    batch = [
        pb.HostEvent(ack=pb.AckResult(call_id="a")),
        pb.HostEvent(start=pb.StartCall(call_id="b", callable="m::f", arguments=b"x" * 300, arguments_size=300)),
        pb.HostEvent(stream_ack=pb.StreamAck(call_id="c", next_index=7)),
    ]
    assert stream_module._encode_batch(batch) == pb.CallsRequest(events=batch).SerializeToString()


@pytest.fixture(params=["native", "python"])
def result_reader(request, monkeypatch):
    """Runs a test with CallResults read by the native module (`call_results`: a response of
    results only) and by wire.py's own reader, which must give the same events."""
    if request.param == "native":
        assert wire._native_call_results is not None  # the package's native module is built with it
    else:
        monkeypatch.setattr(wire, "_native_call_results", None)
    return request.param


def _as_protobuf(event):
    """A parsed event as protobuf's: a `wire.RawResult` becomes the
    SandboxEvent it was read from."""
    if type(event) is not wire.RawResult:
        return event
    fields = {name: getattr(event, name) for name in wire.RawResult.__match_args__}
    return pb.SandboxEvent(result=pb.CallResult(**fields))


def test_parse_calls_response_reads_chunks_without_protobuf_and_the_rest_with_it():
    data = os.urandom(200_000)
    response = pb.CallsResponse(events=[
        pb.SandboxEvent(result_chunk=pb.ResultChunk(call_id="x", data=data)),
        pb.SandboxEvent(result=pb.CallResult(call_id="x", value=b"tail", value_size=200_004)),
        pb.SandboxEvent(result_chunk=pb.ResultChunk(call_id="y", data=b"")),
        pb.SandboxEvent(stream_item=pb.StreamItem(call_id="z", index=3, value=b"item")),
    ])
    events = wire.parse_calls_response(response.SerializeToString())
    assert isinstance(events[0], wire.RawResultChunk)
    assert events[0].call_id == "x" and bytes(events[0].data) == data
    assert type(events[1]) is wire.RawResult and _as_protobuf(events[1]) == response.events[1]
    assert isinstance(events[2], wire.RawResultChunk) and events[2].call_id == "y" and bytes(events[2].data) == b""
    assert events[3] == response.events[3]


def test_results_are_read_without_protobuf_and_a_long_response_holds_chunks_as_views(result_reader):
    results = [pb.SandboxEvent(result=pb.CallResult(call_id=f"c{i}", value=b"\x80\x05N.", value_size=4)) for i in range(30)]
    short = pb.CallsResponse(events=results).SerializeToString()
    assert len(short) < wire._PARSE_WHOLE_BYTES
    events = wire.parse_calls_response(short)
    assert all(type(event) is wire.RawResult for event in events)
    assert [_as_protobuf(event) for event in events] == results
    data = os.urandom(wire._PARSE_WHOLE_BYTES)
    long = pb.CallsResponse(events=[*results, pb.SandboxEvent(result_chunk=pb.ResultChunk(call_id="c", data=data))])
    events = wire.parse_calls_response(long.SerializeToString())
    assert [_as_protobuf(event) for event in events[:30]] == results
    assert type(events[30]) is wire.RawResultChunk and type(events[30].data) is memoryview
    assert events[30].call_id == "c" and bytes(events[30].data) == data


@pytest.mark.parametrize("ids", [[], ["a"], ["c" * 32] * 3, ["", "x" * 121, "y" * 122, "z" * 300, "\u00e9" * 70]])
def test_ack_events_are_encoded_exactly_as_protobuf_would(ids):
    expected = pb.CallsRequest(events=[pb.HostEvent(ack=pb.AckResult(call_id=i)) for i in ids]).SerializeToString()
    assert wire.ack_events(ids) == expected


def test_a_short_response_with_other_events_is_protobuf_s_parse_whole(result_reader):
    events = [
        pb.SandboxEvent(result=pb.CallResult(call_id="a", value=b"1")),
        pb.SandboxEvent(stream_item=pb.StreamItem(call_id="b", index=0, value=b"2")),
        pb.SandboxEvent(result=pb.CallResult(call_id="c", value=b"3")),
    ]
    parsed = wire.parse_calls_response(pb.CallsResponse(events=events).SerializeToString())
    assert all(type(event) is pb.SandboxEvent for event in parsed)
    assert list(parsed) == events


def test_parse_calls_response_leaves_unknown_shapes_to_protobuf():
    data = os.urandom(wire._PARSE_WHOLE_BYTES)  # long enough to be read here
    chunk = pb.SandboxEvent(result_chunk=pb.ResultChunk(call_id="x", data=data)).SerializeToString()
    # An unknown field inside the ResultChunk: protobuf keeps the known ones.
    inner = pb.ResultChunk(call_id="x", data=b"abc").SerializeToString() + bytes([9 << 3 | 0, 1])
    event = bytes([1 << 3 | 2, len(inner)]) + inner
    message = bytes([1 << 3 | 2]) + wire._varint(len(chunk)) + chunk
    message += bytes([1 << 3 | 2, len(event)]) + event
    events = wire.parse_calls_response(message)
    assert type(events[0]) is wire.RawResultChunk and bytes(events[0].data) == data
    assert isinstance(events[1], pb.SandboxEvent) and events[1].result_chunk.data == b"abc"


@pytest.mark.parametrize(
    "result",
    [
        pb.CallResult(),
        pb.CallResult(call_id="c" * 32, value=b"\x80\x05N.", value_size=4, encoding=pb.ENCODING_PICKLE),
        pb.CallResult(call_id="\u00e9" * 200, value=bytes(range(256)) * 300, value_size=1 << 40, log_seq=1, trace_seq=(1 << 64) - 1),
        pb.CallResult(call_id="x", log_seq=127, trace_seq=128),
    ],
)
@pytest.mark.parametrize("long", [False, True])
def test_a_result_read_without_protobuf_is_what_protobuf_reads(result, long, result_reader):
    event = pb.SandboxEvent(result=result)
    events = [event]
    if long:  # and in a message long enough for views of result chunks
        events.append(pb.SandboxEvent(result_chunk=pb.ResultChunk(call_id="y", data=os.urandom(wire._PARSE_WHOLE_BYTES))))
    message = pb.CallsResponse(events=events).SerializeToString()
    (parsed, *_) = wire.parse_calls_response(message)
    assert type(parsed) is wire.RawResult and type(parsed.value) is bytes
    assert _as_protobuf(parsed) == event
    # A field written twice: the last one wins, as in protobuf.
    inner = result.SerializeToString() + pb.CallResult(call_id="again", log_seq=9).SerializeToString()
    twice = bytes([1 << 3 | 2]) + wire._varint(len(inner) + 1 + len(wire._varint(len(inner))))
    twice += bytes([2 << 3 | 2]) + wire._varint(len(inner)) + inner
    (parsed,) = wire.parse_calls_response(twice)
    assert _as_protobuf(parsed) == pb.CallsResponse.FromString(twice).events[0]


@pytest.mark.parametrize(
    "inner",
    [
        pb.CallResult(call_id="x", encoding=7).SerializeToString(),  # an encoding this host does not know
        pb.CallResult(call_id="x").SerializeToString() + bytes([9 << 3 | 0, 1]),  # an unknown field
        pb.CallResult(call_id="x").SerializeToString() + bytes([4 << 3 | 2, 0]),  # value_size with another wire type
        pb.CallResult(call_id="x").SerializeToString() + bytes([3 << 3 | 0, 1]),  # value as a varint
    ],
)
def test_a_result_of_an_unexpected_shape_is_left_to_protobuf(inner, result_reader):
    message = bytes([1 << 3 | 2, len(inner) + 2, 2 << 3 | 2, len(inner)]) + inner
    (parsed,) = wire.parse_calls_response(message)
    assert type(parsed) is pb.SandboxEvent
    assert parsed == pb.CallsResponse.FromString(message).events[0]


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x0a\x05abc",
        b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
        b"\xff",
        b"\x0a\x05\x12\x03\x0a\x05a",  # a call id longer than its result
        b"\x0a\x04\x12\x02\x0a\x01",  # a call id's bytes missing
        b"\x0a\x04\x12\x02\x28\x80",  # a log_seq's varint cut short
        b"\x0a\x05\x12\x03\x0a\x01\xff",  # a call id that is not UTF-8
    ],
)
def test_parse_calls_response_raises_like_protobuf_on_garbage(garbage, result_reader):
    with pytest.raises(Exception) as ours:
        wire.parse_calls_response(garbage)
    with pytest.raises(Exception) as theirs:
        pb.CallsResponse.FromString(garbage)
    assert type(ours.value) is type(theirs.value)


@pytest.mark.parametrize("split", [[], [1], [5, 9], [3, 3, 3]])
def test_events_from_a_list_of_views_mean_their_concatenation(split):
    data = os.urandom(12)
    cuts = [0, *split, len(data)]
    views = [memoryview(data)[a:b] for a, b in zip(cuts, cuts[1:])]
    chunk = b"".join(wire.argument_chunk_event("c", views, 7))
    assert chunk == b"".join(wire.argument_chunk_event("c", memoryview(data), 7))
    assert b"".join(wire.start_call_event("c1", "m::f", views, 12, b"", 0)) == b"".join(
        wire.start_call_event("c1", "m::f", memoryview(data), 12, b"", 0)
    )


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((), {}),
        ((1, 2.5, None, True, -(10**40)), {}),
        (("s" * 4095, b"b" * 4095, "\u00e9"), {}),
        (("s" * 4096,), {}),  # long enough to go through pickle_pieces
        ((b"b" * (2 << 20),), {}),
        ((1,), {"k": 2}),
        (([1, 2], {"a": b"x"}), {}),
    ],
)
def test_pickle_arguments_is_pickle_pieces(args, kwargs):
    ours = wire.pickle_arguments(args, kwargs, 1 << 20)
    theirs = wire.pickle_pieces((args, kwargs), 1 << 20)
    assert type(ours) is type(theirs)
    if type(ours) is wire.Pieces:
        assert b"".join(ours.views) == b"".join(theirs.views)
    else:
        assert ours == theirs


def test_pickle_pieces_is_pickle_dumps_without_copying_large_bytes():
    import pickle

    big = os.urandom(3 << 20)
    args = ((big, "x"), {"k": bytearray(b"m" * 200_000)})
    pieces = wire.pickle_pieces(args, 1 << 20)
    assert type(pieces) is wire.Pieces
    joined = b"".join(pieces.views)
    assert len(pieces) == len(joined)
    assert pickle.loads(joined) == args
    # The bytes value is the caller's own object; the bytearray was copied.
    assert any(view.obj is big for view in pieces.views)
    assert not any(type(view.obj) is bytearray for view in pieces.views)
    for start, end in [(0, 1), (5, 1 << 20), ((1 << 20) - 3, (2 << 20) + 9), (0, len(joined)),
                       (len(joined) - 4, len(joined))]:
        assert b"".join(wire.byte_views(pieces, start, end)) == joined[start:end]
    # Small pickles are plain bytes, equal to pickle.dumps.
    small = wire.pickle_pieces(((b"abc",), {}), 1 << 20)
    assert type(small) is bytes and pickle.loads(small) == ((b"abc",), {})
    assert b"".join(wire.byte_views(small, 1, 4)) == small[1:4]


@pytest.mark.parametrize("event", ["", "e", "answer:result", "/v1/messages:error", "é" * 70])
# 125 / 126: the whole event's length just under and at two bytes (no name, no id).
@pytest.mark.parametrize("size", [0, 1, 90, 125, 126, 127, 128, 16383, 16384, 1 << 20])
@pytest.mark.parametrize("request_id", ["", "0123456789abcdef0123456789abcdef", "r" * 127, "r" * 128])
def test_namespace_event_request_is_what_protobuf_serializes(event, size, request_id):
    payload = os.urandom(size)
    expected = pb.NamespaceRequest(
        event=pb.NamespaceEvent(event=event, data=payload, request_id=request_id)
    ).SerializeToString()
    assert b"".join(ns_wire.namespace_event_request(event, payload, request_id)) == expected
    # Again: the event name's field now comes from the encoder's cache.
    assert b"".join(ns_wire.namespace_event_request(event, payload, request_id)) == expected
    # As one frame-wire MESSAGE frame: the header frames.py writes, then the message.
    if size <= ns_wire.FRAME_PAYLOAD_MAX:
        frame = ns_wire.namespace_event_frame(event, payload, request_id)
        assert frame == frames._HEADER.pack(len(expected), frames.MESSAGE) + expected


def test_namespace_event_request_caches_a_bounded_number_of_event_names(monkeypatch):
    monkeypatch.setattr(ns_wire, "_NS_NAME_FIELDS", {})
    monkeypatch.setattr(ns_wire, "_NS_NAME_FIELDS_KEPT", 3)
    for i in range(10):
        name = f"event{i}"
        expected = pb.NamespaceRequest(event=pb.NamespaceEvent(event=name, data=b"x")).SerializeToString()
        assert b"".join(ns_wire.namespace_event_request(name, b"x", "")) == expected
    assert list(ns_wire._NS_NAME_FIELDS) == ["event0", "event1", "event2"]


def test_namespace_event_request_refuses_what_protobuf_refuses():
    with pytest.raises(ValueError):
        pb.NamespaceEvent(event="\udc80")
    with pytest.raises(ValueError):  # UnicodeEncodeError
        ns_wire.namespace_event_request("\udc80", b"", "")
    with pytest.raises(ValueError):
        ns_wire.namespace_event_frame("\udc80", b"", "")


def _start_of(context_pieces):
    pieces = wire.start_call_event("c1", "m::f", memoryview(b"\x80x"), 2, context_pieces, 0)
    return pb.CallsRequest.FromString(b"".join(bytes(p) for p in pieces)).events[0].start


def test_context_carrier_is_empty_without_context():
    assert wire.context_carrier() == b""


def test_string_baggage_and_trace_scope_travel_as_plain_fields():
    from agentix.utils import context, trace

    with trace.trace("t") as t, trace.span("s") as s, context.scope(run="r42", step="3"):
        carrier = wire.context_carrier()
    assert type(carrier) is wire.ContextFields
    start = _start_of(carrier)
    assert start.context == b""
    assert start.traceparent == f"00-{t.trace_id[6:]}-{s.span_id[5:21]}-01"
    assert start.tracestate == f"agentix={s.span_id[5:]}"
    assert dict(start.baggage) == {"run": "r42", "step": "3"}


@pytest.mark.parametrize("case", ["int-baggage", "custom-var", "trace-without-span", "custom-span-id"])
def test_anything_else_keeps_the_pickled_carrier(case):
    import contextlib
    import pickle

    from agentix.utils import context, trace

    with contextlib.ExitStack() as stack:
        if case == "int-baggage":
            stack.enter_context(context.scope(run=7))
        elif case == "custom-var":
            var = context.var("test_wire_custom", default=None)
            token = var.set("x")
            stack.callback(var.reset, token)
        elif case == "trace-without-span":
            stack.enter_context(trace.trace("t"))
        else:
            stack.enter_context(trace.trace("t"))
            stack.enter_context(trace.span("s", span_id="my-span"))
        carrier = wire.context_carrier()
        expected = context.capture()
    assert type(carrier) is bytes
    start = _start_of(carrier)
    assert not start.traceparent and not start.baggage
    assert pickle.loads(start.context).keys() == expected.keys()


def test_the_encoded_fields_follow_each_new_scope_and_span():
    from agentix.utils import context, trace

    with trace.trace("t"), trace.span("outer") as outer, context.scope(k="1"):
        first = _start_of(wire.context_carrier())
        with trace.span("inner") as inner, context.scope(k="2"):
            second = _start_of(wire.context_carrier())
        again = _start_of(wire.context_carrier())
    assert (first.tracestate, dict(first.baggage)) == (f"agentix={outer.span_id[5:]}", {"k": "1"})
    assert (second.tracestate, dict(second.baggage)) == (f"agentix={inner.span_id[5:]}", {"k": "2"})
    assert again == first


def test_without_the_native_module_results_are_wire_s_own_raw_results(monkeypatch):
    """The pure wheel (no `_native_calls`): `RawResult` is wire.py's class, made by its reader."""
    import importlib.util
    import sys

    monkeypatch.setitem(sys.modules, "agentix.runtime.client._native_calls", None)  # import fails
    spec = importlib.util.spec_from_file_location("wire_without_native", wire.__file__)
    pure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pure)
    assert pure._native_call_results is None and pure.RawResult.__module__ == "wire_without_native"
    result = pb.CallResult(call_id="c" * 32, value=b"\x80\x05N.", value_size=4, encoding=pb.ENCODING_PICKLE, log_seq=3)
    (parsed,) = pure.parse_calls_response(pb.CallsResponse(events=[pb.SandboxEvent(result=result)]).SerializeToString())
    assert type(parsed) is pure.RawResult
    assert pb.CallResult(**{name: getattr(parsed, name) for name in pure.RawResult.__match_args__}) == result
