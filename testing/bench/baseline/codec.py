"""msgpack codec and worker-pipe framing, shaped like the original's.

Original: agentix/runtime/shared/codec.py (module-level Packer with use_bin_type=True,
autoreset=True; unpackb with raw=False and default strict map keys) and
agentix/runtime/shared/framing.py (u32 little-endian length + msgpack dict, 256 MiB cap).
The original's ext types (ndarray, pydantic) are left out: the benchmark's payloads
(str, bytes, None) never use them.
"""

import asyncio
import struct

import msgpack

# One cap for the Socket.IO buffer, the websocket message size and the pipe frames,
# as in the original ("three places that must agree").
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

_HEADER = struct.Struct("<I")
_packer = msgpack.Packer(use_bin_type=True, autoreset=True)


class FrameTooLarge(ValueError):
    """A frame's length is above MAX_MESSAGE_BYTES."""


def pack(obj) -> bytes:
    """msgpack-encodes `obj` (str stays str, bytes stay bytes)."""
    return _packer.pack(obj)


def unpack(buf):
    """Decodes one msgpack object."""
    return msgpack.unpackb(buf, raw=False)


async def read_frame(reader: asyncio.StreamReader):
    """Reads one frame; returns the dict, or None on a clean EOF before a header.

    Raises asyncio.IncompleteReadError on a short body, FrameTooLarge before reading
    an oversized body, ValueError when the body is not a map.
    """
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    (length,) = _HEADER.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise FrameTooLarge(f"frame of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
    if length == 0:
        return {}
    frame = unpack(await reader.readexactly(length))
    if not isinstance(frame, dict):
        raise ValueError("frame body is not a map")
    return frame


def write_frame(writer: asyncio.StreamWriter, frame: dict) -> None:
    """Queues one frame on `writer` (the caller drains)."""
    body = pack(frame)
    if len(body) > MAX_MESSAGE_BYTES:
        raise FrameTooLarge(f"frame of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    writer.write(_HEADER.pack(len(body)))
    writer.write(body)
