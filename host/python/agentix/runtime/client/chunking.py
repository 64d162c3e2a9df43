"""Arguments in chunks: the one size both sides cut payloads to
(`CHUNK_BYTES`, the daemon's and the worker's ``ipc::kChunkBytes`` in
``worker/ipc/chunking.h``), and the cursor that takes a call's arguments
beyond its StartCall one ``ArgumentChunk`` at a time."""

from __future__ import annotations

from agentix.runtime.client import wire

__all__ = ["CHUNK_BYTES", "Upload", "first_chunk"]

# Largest argument piece in one event; the daemon refuses larger ArgumentChunks.
CHUNK_BYTES = 1 << 20


def first_chunk(arguments: bytes | wire.Pieces) -> tuple[bytes | list[memoryview], int]:
    """The bytes a call's StartCall carries (all of `arguments`, or views
    of its first `CHUNK_BYTES`) and their size."""
    size = len(arguments)
    if size <= CHUNK_BYTES:
        # Always bytes here: wire.pickle_pieces((args, kwargs), CHUNK_BYTES)
        # makes Pieces only above CHUNK_BYTES; not re-checked on the call path.
        return arguments, size  # type: ignore[return-value]
    return wire.byte_views(arguments, 0, CHUNK_BYTES), CHUNK_BYTES


class Upload:
    """The argument bytes of one call that still have to follow its StartCall
    (which carried the first CHUNK_BYTES)."""

    __slots__ = ("call_id", "data", "offset", "dropped")

    def __init__(self, call_id: str, data: bytes | wire.Pieces) -> None:
        self.call_id = call_id
        self.data = data  # the whole arguments
        self.offset = CHUNK_BYTES
        self.dropped = False

    def next_chunk_size(self) -> int:
        return min(CHUNK_BYTES, len(self.data) - self.offset)

    def take_chunk(self) -> tuple[int, list[memoryview]]:
        """The next piece (views, not copies) and its offset within the whole arguments."""
        start = self.offset
        end = min(start + CHUNK_BYTES, len(self.data))
        self.offset = end
        return start, wire.byte_views(self.data, start, end)

    @property
    def finished(self) -> bool:
        return self.offset >= len(self.data)
