"""``_native_calls.namespace_events``: the host's NamespaceResponse decoder
(host/python/native/namespace_wire.h) reads what protobuf reads, or leaves
the message to protobuf (None)."""

import random

import pytest
from google.protobuf.message import DecodeError

from agentix.runtime.client._native_calls import namespace_events
from agentix.runtime.v1 import runtime_pb2 as pb


def protobuf_view(message: bytes):
    response = pb.NamespaceResponse.FromString(message)
    return response.opened, [(event.event, event.data) for event in response.events]


def sample() -> bytes:
    response = pb.NamespaceResponse(namespace="/llm", instance_id="d41d8cd98f00b204")
    response.events.add(event="complete", data=b"\x82\xaarequest_id\xa1x\xa4data\x00", request_id="x")
    reply = response.events.add(event="complete:error", data=b"\x80")
    reply.error.type, reply.error.message, reply.error.status_code = "ValueError", "température ✓", -429
    response.events.add(event="événement/été:𝄞")
    return response.SerializeToString()


def test_events_and_the_opened_flag_read_as_protobuf_reads_them():
    decoded = namespace_events(sample())
    assert decoded == protobuf_view(sample())
    opened, events = decoded
    assert opened is False
    assert [name for name, _ in events] == ["complete", "complete:error", "événement/été:𝄞"]
    assert all(type(name) is str and type(data) is bytes for name, data in events)

    first = pb.NamespaceResponse(namespace="/llm", opened=True).SerializeToString()
    assert namespace_events(first) == (True, [])
    assert namespace_events(b"") == (False, [])


def test_any_bytes_like_message_is_read():
    for message in (bytearray(sample()), memoryview(sample())):
        assert namespace_events(message) == protobuf_view(sample())
    with pytest.raises(TypeError):
        namespace_events("not bytes")


def test_malformed_messages_are_left_to_protobuf_which_refuses_them():
    truncated = sample()[:-3]
    bad_utf8 = pb.NamespaceEvent(event="x").SerializeToString().replace(b"x", b"\xc3")
    bad_utf8 = b"\x22" + bytes([len(bad_utf8)]) + bad_utf8  # events: [that event]
    for message in (truncated, bad_utf8):
        assert namespace_events(message) is None
        with pytest.raises(DecodeError):
            pb.NamespaceResponse.FromString(message)
    group = b"\x3b\x3c"  # field 7, start and end group: protobuf's business
    assert namespace_events(group) is None


def test_mutated_messages_are_read_as_protobuf_reads_them_or_left_to_it():
    rng = random.Random(20261130)
    base = sample()
    decoded_count = 0
    for _ in range(5000):
        message = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            if choice < 0.5 and message:
                message[rng.randrange(len(message))] = rng.randrange(256)
            elif choice < 0.75 and message:
                del message[rng.randrange(len(message)) :]
            else:
                message.insert(rng.randrange(len(message) + 1), rng.randrange(256))
        decoded = namespace_events(bytes(message))
        if decoded is not None:
            decoded_count += 1
            assert decoded == protobuf_view(bytes(message))
    assert decoded_count > 100  # the check above did run
