"""What the host reads from a Namespace response it could not read as a
whole (agentix.runtime.client.namespace_failures): the requests it can still
answer with an error, and nothing from bytes that say otherwise."""

from agentix.runtime.client.namespace_failures import readable_requests, unreadable_reply
from agentix.runtime.shared.codec import pack
from agentix.runtime.v1 import runtime_pb2 as pb


def response(*events):
    return pb.NamespaceResponse(namespace="/plug", instance_id="i", events=events).SerializeToString()


def test_requests_are_found_and_replies_and_plain_events_are_not():
    message = response(
        pb.NamespaceEvent(event="tick", data=pack(1)),
        pb.NamespaceEvent(event="ask", data=pack({"request_id": "r1", "data": 2}), request_id="r1"),
        pb.NamespaceEvent(event="ask:result", data=pack({"request_id": "r0"}), request_id="r0"),
        pb.NamespaceEvent(event="v1/x:y", data=b"\xc1", request_id="r2"),
    )
    assert readable_requests(message) == [("ask", "r1"), ("v1/x:y", "r2")]


def test_a_cut_message_yields_the_requests_before_the_cut():
    first = pb.NamespaceEvent(event="ask", data=b"x", request_id="r1")
    message = response(first, pb.NamespaceEvent(event="ask", data=b"y" * 100, request_id="r2"))
    assert readable_requests(message[:-50]) == [("ask", "r1")]
    assert readable_requests(memoryview(message)) == [("ask", "r1"), ("ask", "r2")]


def test_garbage_and_non_utf8_names_or_ids_yield_nothing_and_never_raise():
    bad_name = pb.NamespaceEvent(event="ok", request_id="r1").SerializeToString().replace(b"ok", b"\xff\xfe")
    bad_id = pb.NamespaceEvent(event="ok", request_id="r1").SerializeToString().replace(b"r1", b"\xff\xfe")
    for message in (b"", b"\xff" * 20, b"\x22\xff\xff\xff\xff\x0f", b"\x23\x01", b"\x22\x05ab",
                    b"\x22" + bytes([len(bad_name)]) + bad_name, b"\x22" + bytes([len(bad_id)]) + bad_id):
        assert readable_requests(message) == []


def test_the_reply_names_the_request_and_the_cause():
    class Unprintable(Exception):
        def __str__(self):
            raise ValueError

    name, payload = unreadable_reply("ask", "r1", ValueError("bad"))
    assert name == "ask:error" and payload["request_id"] == "r1"
    assert payload["error"]["type"] == "MalformedError" and "(ValueError: bad)" in payload["error"]["message"]
    assert "(Unprintable)" in unreadable_reply("ask", "r1", Unprintable())[1]["error"]["message"]
