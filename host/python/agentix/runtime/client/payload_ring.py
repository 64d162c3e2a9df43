"""The host's end of a frame-wire payload ring (docs/FRAME-WIRE.md, "Payload
ring").

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

import fcntl
import mmap
import os
import struct

__all__ = ["PayloadRing", "RING_BYTES"]

# Bytes per ring (one each way), as the daemon ↔ worker rings.
RING_BYTES = 16 << 20
_HEADER_BYTES = 4096
_MAGIC = 0x314C594150584741  # "AGXPAYL1"
_TO_DAEMON_RELEASED = 64  # how far the daemon has taken our ring; it writes it
_TO_HOST_RELEASED = 128  # how far we have taken its ring; we write it
_U64 = struct.Struct("<Q")


class PayloadRing:
    """A fresh sealed memfd holding two rings of `ring_bytes` (whole pages),
    mapped. `fd` is for the HELLO that shares it; `close_fd` once sent (the
    mapping stays until `close`). Raises OSError when it cannot be made."""

    __slots__ = ("fd", "ring_bytes", "_map", "_view", "_out", "_in", "_tail", "_floor", "_in_done")

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
        self._view = memoryview(self._map)
        self._out = self._view[_HEADER_BYTES : _HEADER_BYTES + ring_bytes]
        self._in = self._view[_HEADER_BYTES + ring_bytes :]
        self._tail = 0  # the end of the last piece put
        self._floor = 0  # where an empty ring was restarted (all before it is free)
        self._in_done = 0  # how far we released the daemon's ring

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Unmaps the rings (the daemon's mapping keeps the memory until its
        end of the connection goes)."""
        self.close_fd()
        if self._view is not None:
            self._out.release()
            self._in.release()
            self._view.release()
            self._map.close()
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
        for view in views:
            end = offset + len(view)
            out[offset:end] = view
            offset = end
        self._tail = pos + size
        return pos

    def take(self, pos: int, size: int) -> memoryview:
        """The daemon's piece at `pos` (valid until `release` passes it).
        ValueError for one outside its ring or already released."""
        ring = self.ring_bytes
        if self._view is None or size <= 0 or size > ring or pos < self._in_done or pos % ring + size > ring:
            raise ValueError(
                f"ring piece at {pos} ({size} bytes) is outside the {ring}-byte ring or already released"
            )
        offset = pos % ring
        return self._in[offset : offset + size]

    def release(self, end: int) -> None:
        """Hands the daemon's ring back up to `end` (the last piece taken's end)."""
        if end > self._in_done and self._view is not None:
            self._in_done = end
            _U64.pack_into(self._map, _TO_HOST_RELEASED, end)
