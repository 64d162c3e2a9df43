"""Checks on a pickle stream before and after a restricted load (see
`agentix.runtime.shared.safepickle`): extension opcodes and malformed
streams (`check_opcodes`), memo indexes beyond what the stream can have
memoized (`check_memo`, without joining a chunked stream), and the file a
chunked stream is read through (`ChunkReader`)."""

from __future__ import annotations

import pickletools
from collections.abc import Callable
from typing import Any

from agentix.runtime.shared.pickle_bounds import RestrictedUnpickleError

__all__ = ["EXTENSION_OPCODES", "EXTENSION_OPCODE_BYTES", "ChunkReader", "check_memo", "check_opcodes", "needs_memo_check"]

EXTENSION_OPCODES = frozenset({"EXT1", "EXT2", "EXT4"})
# The first byte of each EXT opcode; a stream without any of them has none.
EXTENSION_OPCODE_BYTES = (b"\x82", b"\x83", b"\x84")

def check_opcodes(data: bytes) -> None:
    """Refuses extension opcodes and streams that do not parse as pickle."""
    try:
        for opcode, _arg, _pos in pickletools.genops(data):
            if opcode.name in EXTENSION_OPCODES:
                raise RestrictedUnpickleError(
                    f"refusing pickle opcode {opcode.name}: extension opcodes cannot be "
                    f"safely validated against the exact allowlist"
                )
    except RestrictedUnpickleError:
        raise
    except Exception as exc:
        raise RestrictedUnpickleError(f"refusing malformed pickle opcode stream: {exc}") from exc


# How each opcode's argument is laid out, for `check_memo`: (kind, size).
_FIXED, _LENGTH, _LINES = 0, 1, 2


def _opcode_layouts() -> dict[int, tuple[int, int, bool]]:
    """Opcode byte -> (kind, size, signed length)."""
    layouts: dict[int, tuple[int, int, bool]] = {}
    for opcode in pickletools.opcodes:
        arg = opcode.arg
        if arg is None:
            layout = (_FIXED, 0, False)
        elif arg.n > 0:
            layout = (_FIXED, arg.n, False)
        elif arg.n == pickletools.UP_TO_NEWLINE:
            layout = (_LINES, 2 if arg.name == "stringnl_noescape_pair" else 1, False)
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT1:
            layout = (_LENGTH, 1, False)
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT4:
            layout = (_LENGTH, 4, True)
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT4U:
            layout = (_LENGTH, 4, False)
        else:
            layout = (_LENGTH, 8, False)
        layouts[ord(opcode.code.encode("latin-1"))] = layout
    return layouts


_LAYOUTS = _opcode_layouts()
# The same indexed by opcode byte; None for unknown opcodes and STOP (the walk ends).
_LAYOUT_TABLE = [None if code == ord(".") else _LAYOUTS.get(code) for code in range(256)]
_PUT, _LONG_BINPUT, _STOP = ord("p"), ord("r"), ord(".")
# A memo index is at most the number of objects memoized before it, each at
# least one opcode byte; this much slack admits hand-written BINPUT streams.
_MEMO_SLACK = 256


# Bytes _ForwardBytes converts from a piece at a time at least: enough for
# many small opcodes, far less than a large value it only needs the head of.
_WINDOW = 64 * 1024
_EMPTY = memoryview(b"")


class _ForwardBytes:
    """The pieces of a stream, read forward: ``buf`` holds ``stream[base:]``
    from the read position on, converted to bytes a window at a time (the
    parts of pieces that lie inside a skipped argument are never copied)."""

    __slots__ = ("buf", "base", "_pieces", "_piece", "_start")

    def __init__(self, chunks: list) -> None:
        self._pieces = iter(chunks)
        self._piece = _EMPTY  # what is left of the current piece
        self._start = 0  # its position in the stream
        self.buf = b""
        self.base = 0

    def cover(self, pos: int, end: int) -> bool:
        """Makes ``buf`` hold ``stream[pos:end]``; False if the stream is shorter."""
        buf, base, piece, start = self.buf, self.base, self._piece, self._start
        try:
            while base + len(buf) < end:
                if not piece or start + len(piece) <= pos:  # used up, or inside a skipped argument
                    start += len(piece)
                    following = next(self._pieces, None)
                    if following is None:
                        piece = _EMPTY
                        return False
                    piece = memoryview(following).cast("B")
                    continue
                skip = max(pos - start, 0)
                take = max(end - start - skip, _WINDOW)
                kept = buf[pos - base :] if pos - base < len(buf) else b""
                buf = kept + bytes(piece[skip : skip + take])
                base = pos if kept else start + skip
                used = min(len(piece), skip + take)
                start += used
                piece = piece[used:]
            return True
        finally:
            self.buf, self.base, self._piece, self._start = buf, base, piece, start

    def line_end(self, pos: int) -> int:
        """The position after the newline that ends the line at `pos`, or -1."""
        searched = pos
        while True:
            found = self.buf.find(b"\n", max(searched, self.base) - self.base)
            if found >= 0:
                return self.base + found + 1
            searched = self.base + len(self.buf)
            if not self.cover(pos, searched + 1):
                return -1


def check_memo(chunks: list, total: int, max_steps: int | None = None) -> bool:
    """Refuses a PUT / LONG_BINPUT memo index beyond the stream's length.

    The C unpickler grows its memo table to twice the largest index it is
    given, before storing anything: one 9-byte ``LONG_BINPUT 0x8000000``
    costs 2 GiB. Only those two opcodes carry a free-form index (``BINPUT`` is
    one byte, ``MEMOIZE`` takes the next slot), so this walk runs only for
    streams holding a ``p`` or ``r`` byte, or as a short probe (`max_steps`
    opcodes), and skips over large arguments without reading them. A stream
    it cannot follow is left to the loader, which refuses it.

    Returns False if it stopped after `max_steps` opcodes without reaching
    the end, else True.
    """
    limit = total + _MEMO_SLACK
    if len(chunks) == 1 and type(chunks[0]) is bytes:
        _check_memo_bytes(chunks[0], limit)
        return True
    stream = _ForwardBytes(chunks)
    layouts = _LAYOUTS
    pos = 0
    steps = 0
    while pos < total:
        if max_steps is not None:
            if steps >= max_steps:
                return False
            steps += 1
        if pos + 9 > stream.base + len(stream.buf):  # an opcode and its largest fixed argument
            stream.cover(pos, min(pos + 9, total))
        buf, base = stream.buf, stream.base
        code = buf[pos - base]
        layout = layouts.get(code)
        if layout is None or code == _STOP:
            return True
        pos += 1
        kind, size, signed = layout
        if kind == _FIXED:
            if code == _LONG_BINPUT:
                if pos + 4 > base + len(buf):
                    return True
                index = int.from_bytes(buf[pos - base : pos - base + 4], "little")
                if index >= limit:
                    _refuse_memo(index, total)
            pos += size
        elif kind == _LENGTH:
            if pos + size > base + len(buf):
                return True
            length = int.from_bytes(buf[pos - base : pos - base + size], "little", signed=signed)
            if length < 0:
                return True
            pos += size + length
        else:
            start = pos
            for _ in range(size):
                pos = stream.line_end(pos)
                if pos < 0:
                    return True
            if code == _PUT:
                line = stream.buf[start - stream.base : pos - stream.base] if pos - start <= 24 else None
                if not _check_put(line, limit, total):
                    return True
    return True


def _check_memo_bytes(data: bytes, limit: int) -> None:
    """`check_memo` of one bytes object (the common case, kept tight)."""
    total = len(data)
    layouts = _LAYOUT_TABLE
    from_bytes = int.from_bytes
    pos = 0
    while pos < total:
        code = data[pos]
        layout = layouts[code]
        if layout is None:
            return
        pos += 1
        kind, size, signed = layout
        if kind == _FIXED:
            if code == _LONG_BINPUT:
                if pos + 4 > total:
                    return  # truncated: the loader refuses it
                index = from_bytes(data[pos : pos + 4], "little")
                if index >= limit:
                    _refuse_memo(index, total)
            pos += size
        elif kind == _LENGTH:
            length = from_bytes(data[pos : pos + size], "little", signed=signed)
            if length < 0:
                return
            pos += size + length
        else:
            start = pos
            for _ in range(size):
                pos = data.find(b"\n", pos) + 1
                if pos == 0:
                    return
            if code == _PUT and not _check_put(data[start:pos] if pos - start <= 24 else None, limit, total):
                return


def _check_put(line: bytes | None, limit: int, total: int) -> bool:
    """Refuses the memo index of a PUT opcode, its decimal `line` (None: too
    long to be one below `limit`), unless it is below `limit`. False if the
    line is not a number (the walk stops; the loader refuses the stream)."""
    try:
        index = int(line) if line else limit
    except ValueError:
        return False
    if not 0 <= index < limit:
        _refuse_memo(index, total)
    return True


def _refuse_memo(index: int, total: int) -> None:
    raise RestrictedUnpickleError(
        f"refusing memo index {index} in a {total}-byte pickle stream: the unpickler "
        f"would size its memo table by it"
    )


def needs_memo_check(chunks: list) -> bool:
    for chunk in chunks:
        data = chunk if isinstance(chunk, bytes) else bytes(chunk)
        if data.find(b"r") >= 0 or data.find(b"p") >= 0:
            return True
    return False


# Pieces `ChunkReader` copies with its `copy` function from this size on,
# into values below COPY_FUNCTION_MAX_VALUE (larger ones are fresh mmaps
# whose zeroed pages are cached: memcpy is faster there; base/payload_copy.h's
# kPayloadCopyStreamBytes and kPayloadCopyFreshBytes) unless their pages were
# faulted in first (`prefault`). The host's payload
# ring copies its pieces of this size or more the same way.
COPY_FUNCTION_BYTES = 256 << 10
COPY_FUNCTION_MAX_VALUE = 32 << 20
# Targets `ChunkReader` hands its `prefault` function: base/fresh_pages.h's
# kPrefaultMinBytes (smaller ones are left to their own page faults).
PREFAULT_TARGET_BYTES = 4 << 20


class ChunkReader:
    """A read-only binary file over a list of buffers, for the unpickler
    (which uses ``readinto`` for large values). `copy(target, offset,
    source)`, if given, copies pieces of COPY_FUNCTION_BYTES or more (the
    host's native copy, which bypasses the caches for them); `prefault(target)`,
    if given, is handed each target of PREFAULT_TARGET_BYTES or more before
    it is filled (the host's native prefault of a fresh value's pages)."""

    def __init__(
        self,
        chunks: list,
        copy: Callable[[Any, int, Any], None] | None = None,
        prefault: Callable[[Any], Any] | None = None,
    ) -> None:
        self._chunks = [memoryview(chunk).cast("B") for chunk in chunks if len(chunk)]
        self._index = 0  # current chunk
        self._offset = 0  # position in it
        self._copy = copy
        self._prefault = prefault

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        copy = self._copy
        if copy is not None and len(target) >= COPY_FUNCTION_MAX_VALUE:
            copy = None  # a fresh mapping: memcpy (slice assignment) is faster
        if self._prefault is not None and len(target) >= PREFAULT_TARGET_BYTES:
            huge_bytes, small_bytes = self._prefault(target)
            # Faulted in already: no freshly zeroed lines in the caches for
            # memcpy to use, so the copy function's streaming stores win
            # whatever the size (and it lets go of the GIL).
            if huge_bytes + small_bytes > 0:
                copy = self._copy
        filled = 0
        while filled < len(target) and self._index < len(self._chunks):
            chunk = self._chunks[self._index]
            count = min(len(target) - filled, len(chunk) - self._offset)
            if copy is not None and count >= COPY_FUNCTION_BYTES:
                copy(target, filled, chunk[self._offset : self._offset + count])
            else:
                target[filled : filled + count] = chunk[self._offset : self._offset + count]
            filled += count
            self._offset += count
            if self._offset == len(chunk):
                self._index += 1
                self._offset = 0
        return filled

    def read(self, size: int = -1) -> bytes:
        # Never more than what is left: a stream may claim any frame length,
        # and the buffer is allocated before it is filled.
        left = sum(len(chunk) for chunk in self._chunks[self._index :]) - self._offset
        if size is None or size < 0 or size > left:
            size = left
        buffer = bytearray(size)
        return bytes(memoryview(buffer)[: self.readinto(buffer)])

    def readline(self) -> bytes:
        line = bytearray()
        while self._index < len(self._chunks):
            chunk = self._chunks[self._index]
            end = bytes(chunk[self._offset :]).find(b"\n")
            if end >= 0:
                line += chunk[self._offset : self._offset + end + 1]
                self._offset += end + 1
                if self._offset == len(chunk):
                    self._index += 1
                    self._offset = 0
                return bytes(line)
            line += chunk[self._offset :]
            self._index += 1
            self._offset = 0
        return bytes(line)
