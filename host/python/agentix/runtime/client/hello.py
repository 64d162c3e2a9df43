"""A frame-wire HELLO payload (docs/FRAME-WIRE.md): metadata pairs, each as
``u16le key length, key, u32le value length, value``. The host sends one
first on every connection; a daemon run with ``--calls_cpu=probe`` answers a
Calls host that asked (``agentix-calls-cpu-follow``) with one of its own.

The HELLO keys of the host's own (not gRPC metadata) are named here, with
``AGENTIX_CALLS_DIRECT``, which decides whether a Calls connection, and a
Namespace stream, asks to be served by the worker (docs/DIRECT-CALLS.md):
``auto`` (also unset or empty) sends ``agentix-direct: 1``, ``off`` never.
A daemon run with ``--nodirect_calls`` (``--direct_calls`` is its default
since stop 43), or one that does not know the key, ignores it; one with
``--direct_calls`` may hand the connection to the worker
(a Namespace stream after its ``open``), whose frames the reader then treats
as a hostile peer's (it already treats the daemon's so)."""

from __future__ import annotations

import os
import struct

__all__ = [
    "CALLS_DIRECT_ENV",
    "DIRECT_KEY",
    "NAMESPACE_STREAM",
    "PAYLOAD_RING_KEY",
    "STREAM_KEY",
    "decode_hello",
    "direct_calls_keys",
    "encode_hello",
]

# The HELLO key that shares the payload ring (its memfd rides with HELLO).
PAYLOAD_RING_KEY = "agentix-payload-ring"
# The HELLO key naming the RuntimeService stream a connection carries
# (absent: Calls), and the Namespace stream's value.
STREAM_KEY = "agentix-stream"
NAMESPACE_STREAM = "namespace"
# The HELLO key of a connection that asks to be served by the worker
# (docs/DIRECT-CALLS.md): Calls connections and, from stop 41, Namespace
# streams (stage 8).
DIRECT_KEY = "agentix-direct"
CALLS_DIRECT_ENV = "AGENTIX_CALLS_DIRECT"
_DIRECT_MODES = ("auto", "off")


def direct_calls_keys() -> tuple[tuple[str, str], ...]:
    """The HELLO pairs ``AGENTIX_CALLS_DIRECT`` adds to a frame-wire connection:
    ``((DIRECT_KEY, "1"),)`` for ``auto`` (also unset or empty, any case),
    none for ``off``; ValueError naming the variable for anything else."""
    mode = os.environ.get(CALLS_DIRECT_ENV, "").strip().lower() or "auto"
    if mode not in _DIRECT_MODES:
        raise ValueError(f"{CALLS_DIRECT_ENV}={mode!r} is not one of {', '.join(_DIRECT_MODES)}")
    return ((DIRECT_KEY, "1"),) if mode == "auto" else ()


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

