"""A frame-wire HELLO payload (docs/FRAME-WIRE.md): metadata pairs, each as
``u16le key length, key, u32le value length, value``. The host sends one
first on every connection; a daemon run with ``--calls_cpu=probe`` answers a
Calls host that asked (``agentix-calls-cpu-follow``) with one of its own."""

from __future__ import annotations

import struct

__all__ = ["decode_hello", "encode_hello"]


def encode_hello(metadata: tuple[tuple[str, str], ...]) -> bytes:
    """A HELLO payload: each pair as ``u16le key length, key, u32le value
    length, value``."""
    out = bytearray()
    for key, value in metadata:
        k = key.lower().encode("ascii")
        v = value.encode("utf-8")
        out += struct.pack("<H", len(k)) + k + struct.pack("<I", len(v)) + v
    return bytes(out)


def decode_hello(payload: bytes | bytearray | memoryview) -> list[tuple[str, str]]:
    """The pairs of a HELLO payload (`encode_hello`'s); a truncated pair
    ends them."""
    pairs, pos, end = [], 0, len(payload)
    while pos + 2 <= end:
        (klen,) = struct.unpack_from("<H", payload, pos)
        pos += 2
        if pos + klen + 4 > end:
            break
        key = bytes(payload[pos : pos + klen]).decode("ascii", "replace")
        (vlen,) = struct.unpack_from("<I", payload, pos + klen)
        pos += klen + 4
        if pos + vlen > end:
            break
        pairs.append((key, bytes(payload[pos : pos + vlen]).decode("utf-8", "replace")))
        pos += vlen
    return pairs

