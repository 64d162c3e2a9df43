"""What a host Namespace stream does with a response it cannot read
(`agentix.runtime.client.namespaces`): the stream skips it and goes on,
counts it here (`lost_counts`), and answers the requests it can still find
in it with an error, so the sandbox does not wait out their timeout.

Ending the stream instead (as before) lost the plain events that arrived
until it was re-opened, and the sandbox re-sent its pending requests on the
new stream, where the same bytes could fail the same way again until their
timeout (docs/RELIABILITY.md, "Host-side failures").
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["REQUEST_ERROR_TYPE", "count_lost", "lost_counts", "readable_requests", "unreadable_reply"]

# The error type of the reply to a request whose message the host could not
# read (the type the host already uses for what the runtime sent that it
# cannot use, as for calls: docs/DECISIONS.md).
REQUEST_ERROR_TYPE = "MalformedError"

# What this process's Namespace streams could not deliver, by namespace path
# and reason (see lost_counts).
_lost: dict[str, dict[str, int]] = {}
_lost_lock = threading.Lock()


def lost_counts() -> dict[str, dict[str, int]]:
    """This process's count of what its Namespace streams could not deliver,
    by namespace path: ``undecodable_responses`` (responses the host could
    not read: their events are lost, the stream goes on with the next one)
    and ``answered_requests`` (requests in those responses answered with a
    ``MalformedError`` error reply). Each response is also logged."""
    with _lost_lock:
        return {path: dict(counts) for path, counts in _lost.items()}


def count_lost(path: str, responses: int, requests: int) -> int:
    """Adds to the counts of `path`; returns its undecodable responses so far."""
    with _lost_lock:
        counts = _lost.setdefault(path, {"undecodable_responses": 0, "answered_requests": 0})
        counts["undecodable_responses"] += responses
        counts["answered_requests"] += requests
        return counts["undecodable_responses"]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]  # IndexError past the end: the walk stops
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint over 64 bits")


def _fields(buf: bytes) -> list[tuple[int, Any]]:
    """The (field number, value) pairs of a protobuf message, as far as they
    can be read: a length-delimited value as bytes, others as ints."""
    fields: list[tuple[int, Any]] = []
    pos, end = 0, len(buf)
    try:
        while pos < end:
            tag, pos = _varint(buf, pos)
            kind = tag & 7
            value: int | bytes
            if kind == 0:
                value, pos = _varint(buf, pos)
            elif kind == 2:
                length, pos = _varint(buf, pos)
                if pos + length > end:
                    break
                value, pos = buf[pos : pos + length], pos + length
            elif kind in (1, 5):
                size = 8 if kind == 1 else 4
                if pos + size > end:
                    break
                value, pos = int.from_bytes(buf[pos : pos + size], "little"), pos + size
            else:
                break
            fields.append((tag >> 3, value))
    except (IndexError, ValueError):
        pass
    return fields


def readable_requests(message: bytes | memoryview) -> list[tuple[str, str]]:
    """The (event, request_id) of each request in a serialized
    NamespaceResponse that could not be read as a whole, as far as its bytes
    allow: an event (field 4) whose name (field 1) is UTF-8, not a reply
    (``...:result``, ``...:error``), and whose ``request_id`` (field 3, set
    by the sandbox on every request) is non-empty UTF-8. Never raises."""
    found = []
    for number, value in _fields(bytes(message)):
        if number != 4 or not isinstance(value, bytes):
            continue
        name = request_id = b""
        for inner, field in _fields(value):
            if inner == 1 and isinstance(field, bytes):
                name = field
            elif inner == 3 and isinstance(field, bytes):
                request_id = field
        try:
            event, ident = name.decode(), request_id.decode()
        except UnicodeDecodeError:
            continue
        if event and ident and not event.endswith((":result", ":error")):
            found.append((event, ident))
    return found


def unreadable_reply(event: str, request_id: str, error: Exception) -> tuple[str, dict[str, Any]]:
    """The ``<event>:error`` reply (name, payload) to a request the host
    could not read because reading its message raised `error`."""
    try:
        cause = f"{type(error).__name__}: {error}"
    except Exception:  # an exception whose str() raises
        cause = type(error).__name__
    return f"{event}:error", {
        "request_id": request_id,
        "error": {
            "type": REQUEST_ERROR_TYPE,
            "message": f"the host could not read the message carrying this request ({cause}); it was not handled",
        },
    }
