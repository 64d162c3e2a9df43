"""The acks a stream re-sends after a cut: its last RECENT_ACKS acked ids, from
a deque that holds placeholders until filled (recent_acks.py)."""

from agentix.runtime.client import recent_acks
from agentix.runtime.client.stream import RECENT_ACKS, CallsStream


def _stream() -> CallsStream:
    # The stream's state without its rpc and tasks: take_unsent_acks reads only the state.
    stream = CallsStream.__new__(CallsStream)
    stream._init_state({}, lambda stream, error: None)
    return stream


def _ids(first: int, count: int) -> list[str]:
    return [f"{n:032x}" for n in range(first, first + count)]


def test_a_fresh_stream_has_no_acks_to_resend():
    assert _stream().take_unsent_acks() == []


def test_written_acks_are_resent_oldest_first_ids_of_any_length():
    stream = _stream()
    stream.ack_results(["short-id", *_ids(1, 2)])
    stream._acks.extend(_ids(3, 2))
    stream._take_acks()  # written: remembered
    stream._acks.append("waiting")  # not written yet
    assert stream.take_unsent_acks() == ["short-id", *_ids(1, 4), "waiting"]
    assert stream.take_unsent_acks() == []


def test_only_the_last_recent_acks_are_kept():
    stream = _stream()
    last = (RECENT_ACKS // 50 + 2) * 50  # past RECENT_ACKS, in whole batches
    for first in range(0, last, 50):
        stream._acks.extend(_ids(first, 50))
        stream._take_acks()
    assert stream.take_unsent_acks() == _ids(last - RECENT_ACKS, RECENT_ACKS)


def test_placeholders_are_strings_of_their_own_and_never_written():
    recent = recent_acks.reserved(16)
    assert len(recent) == 16 and recent.maxlen == 16
    assert len({id(placeholder) for placeholder in recent}) == 16  # each holds an id's memory
    assert all(len(placeholder) == 32 for placeholder in recent)
    assert recent_acks.written(recent) == []
    recent.extend(_ids(0, 3))
    assert recent_acks.written(recent) == _ids(0, 3)
    assert len(recent) == 16
    assert recent_acks.written(recent_acks.reserved(0)) == []
