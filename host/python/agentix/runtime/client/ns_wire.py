"""Protobuf wire encoding of the host's events on a ``Namespace`` stream
(moved here from `agentix.runtime.client.wire`).

A host event is the per-request write of a plugin's request handler;
building a NamespaceEvent inside a NamespaceRequest and serializing it costs
several times more than these few bytes of framing. The bytes are exactly
what protobuf produces (``tests/test_wire.py`` checks). Over the frame wire
(docs/FRAME-WIRE.md) `namespace_event_frame` gives the whole MESSAGE frame
as one ``bytes``: the stream writes it with one ``sendmsg`` and no list of
pieces to size and prefix (the frame transport's `write_frame`).

Field numbers are those of ``agentix/runtime/v1/runtime.proto``.
"""

from __future__ import annotations

import struct

from agentix.runtime.client.wire import BULK_MIN_BYTES, length_header

__all__ = ["FRAME_PAYLOAD_MAX", "namespace_event_frame", "namespace_event_request"]

_NS_REQUEST_EVENT = 2 << 3 | 2  # NamespaceRequest.event
_NS_EVENT_NAME = 1 << 3 | 2  # NamespaceEvent.event
_NS_EVENT_DATA = 2 << 3 | 2  # NamespaceEvent.data
_NS_EVENT_REQUEST_ID = 3 << 3 | 2  # NamespaceEvent.request_id

# A frame's header (docs/FRAME-WIRE.md: u32le payload size, kind byte) and
# the MESSAGE kind, as `agentix.runtime.client.frames` writes them (which
# imports this module's users, so it cannot be imported here;
# tests/test_wire.py checks they agree).
_FRAME_HEADER = struct.Struct("<IB").pack
_MESSAGE = 2
# Payloads below this go in one frame (`namespace_event_frame`); larger ones
# take the transport's `write`, which may put their bytes in the payload ring.
FRAME_PAYLOAD_MAX = BULK_MIN_BYTES - 1


def _name_field(event: str) -> bytes:
    """The event name's field, kept for the next events of that name."""
    name = event.encode()
    name_field = length_header(_NS_EVENT_NAME, len(name)) + name if name else b""
    if len(_NS_NAME_FIELDS) < _NS_NAME_FIELDS_KEPT:
        _NS_NAME_FIELDS[event] = name_field
    return name_field


def namespace_event_request(event: str, payload: bytes, request_id: str) -> list:
    """The pieces (joined: the serialized message) of
    ``NamespaceRequest{event: {event, data: payload, request_id}}``, exactly
    as protobuf serializes it (empty fields left out); `payload` is not
    copied here. Raises UnicodeEncodeError for names protobuf refuses too.
    Events with an ``error`` go through the generated classes."""
    name_field = _NS_NAME_FIELDS.get(event)
    if name_field is None:
        name_field = _name_field(event)
    count = len(payload)
    if not count:
        data_head = b""
    elif count < 0x80:
        data_head = _NS_DATA_HEADS[count]
    else:
        data_head = length_header(_NS_EVENT_DATA, count)
    ident = request_id.encode()
    if not ident:
        tail = b""
    elif len(ident) < 0x80:
        tail = _NS_ID_HEADS[len(ident)] + ident
    else:
        tail = length_header(_NS_EVENT_REQUEST_ID, len(ident)) + ident
    size = len(name_field) + len(data_head) + count + len(tail)
    outer = _NS_OUTER_HEADS[size] if size < 0x80 else length_header(_NS_REQUEST_EVENT, size)
    return [outer + name_field + data_head, payload, tail]


def namespace_event_frame(event: str, payload: bytes, request_id: str) -> bytes:
    """The MESSAGE frame (header included) carrying
    `namespace_event_request`'s message, as one ``bytes`` (`payload` is
    copied into it: for payloads of at most `FRAME_PAYLOAD_MAX` bytes)."""
    name_field = _NS_NAME_FIELDS.get(event)
    if name_field is None:
        name_field = _name_field(event)
    count = len(payload)
    ident = request_id.encode()
    # The common sizes (under 128 bytes each: one-byte lengths) from the
    # tables; anything else as `namespace_event_request` makes it.
    if 0 < count < 0x80 and 0 < len(ident) < 0x80:
        size = len(name_field) + count + len(ident) + 4
        if size < 0x80:
            return b"".join((_FRAME_HEADER(size + 2, _MESSAGE), _NS_OUTER_HEADS[size], name_field,
                             _NS_DATA_HEADS[count], payload, _NS_ID_HEADS[len(ident)], ident))
    head, _, tail = namespace_event_request(event, payload, request_id)
    return b"".join((_FRAME_HEADER(len(head) + count + len(tail), _MESSAGE), head, payload, tail))


# The per-request parts of `namespace_event_request` that repeat: each event
# name's field (a plugin uses a handful; bounded all the same) and the
# one-byte-length field heads.
_NS_NAME_FIELDS: dict[str, bytes] = {}
_NS_NAME_FIELDS_KEPT = 1024
_NS_DATA_HEADS = [bytes((_NS_EVENT_DATA, n)) for n in range(0x80)]
_NS_ID_HEADS = [bytes((_NS_EVENT_REQUEST_ID, n)) for n in range(0x80)]
_NS_OUTER_HEADS = [bytes((_NS_REQUEST_EVENT, n)) for n in range(0x80)]
