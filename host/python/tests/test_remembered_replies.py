"""The host's remembered replies (`request_handler`'s answers to repeated
request ids): `begin` marks a request in progress, `finish` stores its answer;
both keep the count and byte bounds, forgetting the oldest first."""

from agentix.runtime.client import _sio_facade
from agentix.runtime.client._sio_facade import _IN_PROGRESS, _RememberedReplies


def test_begin_forgets_the_oldest_past_the_count_bound(monkeypatch):
    monkeypatch.setattr(_sio_facade, "_REMEMBERED_REPLIES", 3)
    replies = _RememberedReplies()
    for rid in ("a", "b", "c"):
        replies.begin(rid)
        replies.finish(rid, ("ask:result", rid), 10)
    assert list(replies) == ["a", "b", "c"] and replies.bytes == 30
    replies.begin("d")
    assert list(replies) == ["b", "c", "d"] and replies.bytes == 20
    assert replies.get("d") is _IN_PROGRESS
    replies.finish("d", ("ask:result", "d"), 5)
    assert replies.get("d") == ("ask:result", "d") and replies.bytes == 25


def test_a_request_forgotten_while_in_progress_is_remembered_when_it_finishes(monkeypatch):
    monkeypatch.setattr(_sio_facade, "_REMEMBERED_REPLIES", 2)
    replies = _RememberedReplies()
    replies.begin("slow")
    for rid in ("x", "y"):
        replies.begin(rid)
        replies.finish(rid, ("ask:result", rid), 1)
    assert "slow" not in replies
    replies.finish("slow", ("ask:result", "slow"), 4)
    assert list(replies) == ["y", "slow"] and replies.bytes == 5


def test_finish_keeps_the_byte_bound_forgetting_an_answer_alone_over_it(monkeypatch):
    monkeypatch.setattr(_sio_facade, "_REMEMBERED_REPLY_BYTES", 100)
    replies = _RememberedReplies()
    for rid, size in (("a", 40), ("b", 40)):
        replies.begin(rid)
        replies.finish(rid, ("ask:result", rid), size)
    replies.begin("c")
    replies.finish("c", ("ask:result", "c"), 30)  # 110 bytes: "a" goes
    assert list(replies) == ["b", "c"] and replies.bytes == 70
    replies.begin("huge")
    replies.finish("huge", ("ask:result", "huge"), 500)  # over the bound alone: everything goes
    assert list(replies) == [] and replies.bytes == 0
