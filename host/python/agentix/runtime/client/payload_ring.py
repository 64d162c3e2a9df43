"""The host's end of a frame-wire payload ring (docs/FRAME-WIRE.md, "Payload
ring"): `PayloadRing`, the RING_MESSAGE framing (`ring_frame`,
`split_message`) and `SplitMessage`, a received message whose pieces are
read in place.

Large argument pieces go to the daemon, and large result pieces come back,
as positions in a shared memfd instead of socket bytes: one memcpy on each
side instead of a kernel copy on each side (plus skb allocation, memory
accounting and the wake-ups of a megabyte through a socket). The layout and
the rules are ``worker/ipc/payload_area.h``'s, whose creator side this is
(the daemon maps it, as the worker maps the daemon's): a header page (magic,
ring size, each ring's release counter), the host's outgoing ring, then the
daemon's. Pieces are consumed in the order their frames are sent, so a ring
needs no allocator, only a release counter written by its consumer; a piece
that does not fit now is sent inline instead.

The memfd is sealed against shrinking and growing (the daemon refuses one
that is not: a shrunk file would fault its reads). Its pages are allocated
on first use and then reused: an empty ring restarts at its start.
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import mmap
import os
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

from agentix.runtime.client import wire
from agentix.runtime.shared.pickle_stream import COPY_FUNCTION_BYTES

__all__ = [
    "PREFAULT_ENV",
    "PayloadRing",
    "RING_BYTES",
    "SplitMessage",
    "native_copy",
    "native_new_buffer",
    "native_populate_fresh",
    "native_prefault",
    "ring_frame",
    "split_message",
]

# Bytes per ring (one each way), as the daemon ↔ worker rings.
RING_BYTES = 16 << 20
_HEADER_BYTES = 4096
_MAGIC = 0x314C594150584741  # "AGXPAYL1"
_TO_DAEMON_RELEASED = 64  # how far the daemon has taken our ring; it writes it
_TO_HOST_RELEASED = 128  # how far we have taken its ring; we write it
_U64 = struct.Struct("<Q")
# RING_MESSAGE's head: u16le count, then per piece u32le at, u64le pos, u64le size.
_RING_COUNT = struct.Struct("<H")
_RING_PIECE = struct.Struct("<IQQ")
_RING_MAX_PIECES = 64
PREFAULT_ENV = "AGENTIX_PREFAULT"
# Fresh ring pages a put fills at once before its copy, from this many bytes
# on (fewer are left to the copy's faults: a system call and a residency look
# are not worth a few pages).
_POPULATE_MIN_BYTES = 256 << 10
_natives: dict[str, Any] = {}


def _native(name: str, fallback: Any) -> Any:
    """``_native_calls.<name>``, loaded once; `fallback` when the native
    module cannot be loaded (the pure wheel, another interpreter, libgrpc++
    missing, ...)."""
    if name not in _natives:
        try:
            from agentix.runtime.client import _native_calls

            _natives[name] = getattr(_native_calls, name)
        except Exception:
            _natives[name] = fallback
    return _natives[name]


def _prefault_off() -> bool:
    """``AGENTIX_PREFAULT`` is ``off`` or ``0`` (any case): the A/B switch."""
    return os.environ.get(PREFAULT_ENV, "").strip().lower() in ("off", "0")


def native_copy() -> Callable[[Any, int, Any], None] | None:
    """``_native_calls.copy_payload(target, offset, source)``, or None when
    the native module cannot be loaded (then memoryview assignment copies).
    A 16 MiB echo's buffers outgrow the caches, where stores that bypass them
    write each line once instead of reading it first (base/payload_copy.h)."""
    return _native("copy_payload", None)


def native_prefault() -> Callable[[Any], tuple[int, int]] | None:
    """``_native_calls.prefault_for_write(target)``, or None when the native
    module cannot be loaded or ``AGENTIX_PREFAULT`` is ``off`` or ``0``. A
    large result value is decoded into a fresh mapping whose page faults were
    most of its decode (16,384 for 64 MiB); the kernel fills it faster at
    once, in huge pages where they are cheap here (base/fresh_pages.h)."""
    return None if _prefault_off() else _native("prefault_for_write", None)


def native_populate_fresh() -> Callable[[Any], bool] | None:
    """``_native_calls.populate_fresh(target)``, or None when the native module
    cannot be loaded or ``AGENTIX_PREFAULT`` is ``off`` or ``0``. The
    outgoing ring's pages are allocated by the first message that reaches
    them; filled at once they cost about a third of the faults a page (a
    sandbox's first 16 MiB argument: ~70 ms of faults, docs/PERFORMANCE.md
    "stop-65: a sandbox's first large echo")."""
    return None if _prefault_off() else _native("populate_fresh", None)


def native_new_buffer() -> Callable[[int], bytearray]:
    """``_native_calls.new_buffer(size)``: a bytearray whose bytes are
    undefined, for a buffer about to be written in full (a large frame's
    payload); fresh memory gets its pages at once, not a fault a page, and
    nothing is zero-filled (a sandbox's first 64 MiB result is read through
    ~48 MiB of such buffers). ``bytearray`` itself when the native module
    cannot be loaded or ``AGENTIX_PREFAULT`` is ``off`` or ``0``."""
    return bytearray if _prefault_off() else _native("new_buffer", bytearray)


class PayloadRing:
    """A fresh sealed memfd holding two rings of `ring_bytes` (whole pages),
    mapped. `fd` is for the HELLO that shares it; `close_fd` once sent (the
    mapping stays until `close`). Raises OSError when it cannot be made."""

    __slots__ = ("fd", "ring_bytes", "held", "_map", "_view", "_out", "_in", "_tail", "_floor", "_in_done", "_taken",
                 "_copy", "_populate", "_fresh_at")

    def __init__(self, ring_bytes: int = RING_BYTES) -> None:
        ring_bytes = -(-ring_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
        size = _HEADER_BYTES + 2 * ring_bytes
        fd = os.memfd_create("agentix-payloads", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.ring_bytes = ring_bytes
        struct.pack_into("<QQ", self._map, 0, _MAGIC, ring_bytes)
        view = memoryview(self._map)
        self._view: memoryview | None = view
        self._out = view[_HEADER_BYTES : _HEADER_BYTES + ring_bytes]
        self._in = view[_HEADER_BYTES + ring_bytes :]
        self._tail = 0  # the end of the last piece put
        self._floor = 0  # where an empty ring was restarted (all before it is free)
        self._in_done = 0  # how far we released the daemon's ring
        self._taken = 0  # the end of the last piece taken (held or not)
        # (end, holder) of pieces handed out as views, oldest first: each
        # holder is exported by its views only, so it is free when nothing
        # but this deque refers to it. Empty: nothing to release.
        self.held: collections.deque = collections.deque()
        self._copy = native_copy()
        # Our ring's pages from here on have never been written (a put restarts
        # at the ring's start when it is empty, so they are reached in order).
        self._fresh_at = 0
        self._populate = native_populate_fresh()

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Unmaps the rings (the daemon's mapping keeps the memory until its
        end of the connection goes). Pieces still held (a result being
        decoded) keep the mapping until they are gone."""
        self.close_fd()
        if self._view is not None:
            self._out.release()
            self._in.release()
            self._view.release()
            self.held.clear()
            try:
                self._map.close()
            except BufferError:
                pass  # unmapped when the last view of a held piece goes
            self._view = None

    def put(self, views: list, size: int) -> int | None:
        """Copies the concatenation of `views` (`size` bytes) into the
        outgoing ring; its position, or None when it does not fit now (send
        it inline). `PayloadArea::Put`'s rule: a piece never wraps, and an
        empty ring restarts at its start so the same pages keep being used."""
        ring = self.ring_bytes
        if self._view is None or size <= 0 or size > ring:
            return None
        (released,) = _U64.unpack_from(self._map, _TO_DAEMON_RELEASED)
        tail = self._tail
        free_from = max(released, self._floor)
        if released > tail or tail - free_from > ring:
            return None  # a garbage counter: the socket still works
        pos = tail
        at = pos % ring
        if released == tail:
            if at:
                pos += ring - at
            self._floor = pos
        else:
            if at + size > ring:
                pos += ring - at
            if pos + size - free_from > ring:
                return None
        out = self._out
        offset = pos % ring
        reach = offset + size
        if reach > self._fresh_at:
            if self._populate is not None and reach - self._fresh_at >= _POPULATE_MIN_BYTES:
                self._populate(out[self._fresh_at : reach])
            self._fresh_at = reach
        copy = self._copy
        for view in views:
            end = offset + len(view)
            if copy is not None and end - offset >= COPY_FUNCTION_BYTES:
                copy(out, offset, view)
            else:
                out[offset:end] = view
            offset = end
        self._tail = pos + size
        return pos

    def take(self, pos: int, size: int) -> memoryview:
        """The daemon's piece at `pos` (valid until `release` passes it).
        ValueError for one outside its ring, or before the end of the last
        piece taken (released, or overlapping it)."""
        ring = self.ring_bytes
        if self._view is None or size <= 0 or size > ring or pos < self._taken or pos % ring + size > ring:
            raise ValueError(
                f"ring piece at {pos} ({size} bytes) is outside the {ring}-byte ring or already released"
            )
        self._taken = pos + size
        offset = pos % ring
        return self._in[offset : offset + size]

    def hold(self, pos: int, size: int) -> memoryview:
        """As `take`, but the view (and any slice of it) stays valid for as
        long as it is referred to: `release_unreferenced` releases the ring
        only up to the first piece still held."""
        self.take(pos, size)
        holder = (ctypes.c_ubyte * size).from_buffer(self._map, _HEADER_BYTES + self.ring_bytes + pos % self.ring_bytes)
        self.held.append((pos + size, holder))
        return memoryview(holder).cast("B")

    def release_unreferenced(self) -> None:
        """Releases the daemon's ring past the held pieces nothing refers to
        any more, oldest first (the ring is consumed in order)."""
        held = self.held
        end = 0
        while held and sys.getrefcount(held[0][1]) <= 2:  # the deque's and the call's
            end = held.popleft()[0]
        if end:
            self.release(end)

    def release(self, end: int) -> None:
        """Hands the daemon's ring back up to `end` (the last piece taken's end)."""
        if end > self._in_done and self._view is not None:
            self._in_done = end
            _U64.pack_into(self._map, _TO_HOST_RELEASED, end)


def ring_frame(ring: PayloadRing, pieces: list) -> tuple[bytes | None, list, int]:
    """A RING_MESSAGE for the message made of `pieces`: each bulk field marked
    by `wire.BulkHead` that fits is copied into `ring` and left out. Returns
    (its head, the pieces left, the payload's length), or (None, `pieces`, 0)
    when none fit (send a MESSAGE)."""
    out: list = []
    refs: list = []
    at = 0  # bytes of the message so far, without the pieces left out
    index, count = 0, len(pieces)
    while index < count:
        piece = pieces[index]
        index += 1
        out.append(piece)
        at += len(piece)
        if type(piece) is not wire.BulkHead or len(refs) == _RING_MAX_PIECES:
            continue
        bulk = piece.size
        views, taken = [], 0
        while taken < bulk:  # the views holding the field's bytes
            view = pieces[index]
            index += 1
            views.append(view)
            taken += len(view)
        pos = ring.put(views, bulk)
        if pos is None:  # the ring is full: these go inline
            out.extend(views)
            at += bulk
        else:
            refs.append(_RING_PIECE.pack(at, pos, bulk))
    if not refs:
        return None, pieces, 0
    head = _RING_COUNT.pack(len(refs)) + b"".join(refs)
    return head, out, len(head) + at


def split_message(ring: PayloadRing, payload: bytes | bytearray | memoryview, max_bytes: int) -> SplitMessage:
    """The message of a RING_MESSAGE from the daemon, uncopied: its bytes and
    a view of the ring per piece (`PayloadRing.hold`: result chunks keep them
    until decoded; the ring is released past them once nothing refers to
    them). ValueError for a malformed one or a piece outside the ring."""
    if len(payload) < 2:
        raise ValueError(f"a RING_MESSAGE of {len(payload)} bytes")
    (count,) = _RING_COUNT.unpack_from(payload)
    start = 2 + count * _RING_PIECE.size
    if count > _RING_MAX_PIECES or len(payload) < start:
        raise ValueError(f"a RING_MESSAGE with {count} pieces in {len(payload)} bytes")
    rest = memoryview(payload)[start:]
    refs = [_RING_PIECE.unpack_from(payload, 2 + i * _RING_PIECE.size) for i in range(count)]
    size = len(rest) + sum(ref[2] for ref in refs)
    if size > max_bytes:
        raise ValueError(f"a RING_MESSAGE of {size} bytes")
    pieces = []
    done = 0
    for at, pos, length in refs:
        if at < done or at > len(rest):
            raise ValueError(f"a ring piece at offset {at} of {len(rest)} bytes, out of order")
        pieces.append((at, ring.hold(pos, length)))
        done = at
    return SplitMessage(rest, pieces)


class SplitMessage:
    """A CallsResponse whose large bulk fields are not in its bytes (the frame
    wire's payload ring): `rest` is the message without them, `pieces` the
    (offset into `rest`, view) of each, in order."""

    __slots__ = ("rest", "pieces")

    def __init__(self, rest: bytes | memoryview, pieces: list) -> None:
        self.rest = rest
        self.pieces = pieces

    def join(self) -> bytes:
        """The whole message (a copy)."""
        parts: list = []
        done = 0
        for at, view in self.pieces:
            parts += (self.rest[done:at], view)
            done = at
        parts.append(self.rest[done:])
        return b"".join(parts)

    def events(self) -> Sequence[wire.CallsEvent]:
        """`wire.parse_calls_response` of the whole message: an event that is
        exactly a ResultChunk whose data is a piece becomes a
        `wire.RawResultChunk` holding that piece's view (no copy); any other
        event is put back together and parsed as usual. A malformed message
        is joined and left to that parser, which reports it as it would."""
        try:
            return _split_events(self)
        except Exception:  # malformed, a bad UTF-8 id
            return wire.parse_calls_response(self.join())


def _split_events(message: SplitMessage) -> Sequence[wire.CallsEvent]:
    rest = memoryview(message.rest)
    pieces = message.pieces
    end = len(rest)
    events: list = []
    pos = 0
    index = 0
    while pos < end:
        if rest[pos] != wire._EVENTS:
            raise ValueError("malformed")
        length, start = wire._read_varint(rest, pos + 1, end)
        piece = pieces[index] if index < len(pieces) else None
        if piece is not None and start <= piece[0] and len(piece[1]) <= length and piece[0] - start <= length - len(piece[1]):
            at, view = piece
            index += 1
            stop = start + length - len(view)  # the event's end in `rest`
            if stop > end:
                raise ValueError("malformed")
            event = _split_chunk(rest, start, stop, at, view)
            if event is None:  # not a bare chunk: as a message of its own
                event_bytes = b"".join((wire.length_header(wire._EVENTS, length), rest[start:at], view, rest[at:stop]))
                events.extend(wire.parse_calls_response(event_bytes))
            else:
                events.append(event)
            pos = stop
        else:
            stop = start + length
            if stop > end:
                raise ValueError("malformed")
            event_bytes = rest[pos:stop]  # long: its chunks stay views of it
            events.extend(wire.parse_calls_response(event_bytes if stop - pos >= wire._PARSE_WHOLE_BYTES else bytes(event_bytes)))
            pos = stop
    if index != len(pieces):
        raise ValueError("malformed")
    return events


def _split_chunk(rest: memoryview, start: int, stop: int, at: int, view: memoryview) -> wire.RawResultChunk | None:
    """The event rest[start:stop] as a ResultChunk whose data (the piece
    `view`, left out at `at`) is its only bulk field; None if it is not one."""
    if rest[start] != wire._SANDBOX_RESULT_CHUNK:
        return None
    inner, pos = wire._read_varint(rest, start + 1, stop)
    if pos + inner - len(view) != stop:
        return None
    call_id = ""
    data = None
    while pos < stop:
        tag, pos = wire._read_varint(rest, pos, stop)
        length, pos = wire._read_varint(rest, pos, stop)
        if tag == wire._CHUNK_DATA and pos == at and length == len(view) and data is None:
            data = view
            continue
        if tag != wire._CHUNK_CALL_ID or length > stop - pos or pos <= at < pos + length:
            return None
        call_id = str(rest[pos : pos + length], "utf-8")
        pos += length
    return None if data is None else wire.RawResultChunk(call_id, data)
