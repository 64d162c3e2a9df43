"""The acks a stream wrote lately, kept with their memory taken when the stream opens.

A stream remembers its last RECENT_ACKS acked call ids (`CallsStream`) to send
them again after a cut. Filled from empty, that keeps one more id string alive
per call for the stream's first RECENT_ACKS calls: the heap grows on the call
path, a fresh page touched every ~40 calls (a fault in 1 call in 40 of a fresh
daemon's calls 3-2,302, half the host's faults there; stop 36). Filled with
placeholder strings of an id's size at the start, each acked id instead drops a
placeholder whose memory the next call's id reuses, as in a full stream.
"""

from __future__ import annotations

import collections
import itertools

__all__ = ["reserved", "written"]

# UniqueIds' ids are 32 hex digits; a placeholder is 32 NULs, which no id is.
_ID_CHARS = 32
_PLACEHOLDER = "\x00" * _ID_CHARS
_SOURCE = "\x00" * (_ID_CHARS + 1)  # sliced: each placeholder a string of its own
_TAIL = slice(1, None)


def reserved(capacity: int) -> collections.deque[str]:
    """A deque of at most `capacity` ids, filled with placeholders (one string
    each, so each takes an id's memory; ~0.1 ms for 4,096)."""
    return collections.deque(map(_SOURCE.__getitem__, itertools.repeat(_TAIL, capacity)), maxlen=capacity)


def written(recent: collections.deque[str]) -> list[str]:
    """The acked ids in `recent`, oldest first, without the placeholders."""
    return [call_id for call_id in recent if call_id != _PLACEHOLDER]
