"""Which wire a client's streams use, as the environment and the target
say (docs/FRAME-WIRE.md): ``AGENTIX_CALLS_WIRE``, ``AGENTIX_PAYLOAD_RING``
and where a daemon's frame wire listens. `agentix.runtime.client.frames`
acts on them."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

__all__ = [
    "CALLS_WIRE_ENV",
    "PAYLOAD_RING_ENV",
    "calls_socket_path",
    "connect_calls_socket",
    "payload_ring_wanted",
    "wire_mode",
]

CALLS_WIRE_ENV = "AGENTIX_CALLS_WIRE"
PAYLOAD_RING_ENV = "AGENTIX_PAYLOAD_RING"
_MODES = ("auto", "frames", "grpc")
# Appended to a daemon's Unix socket path: where its frame wire listens.
_CALLS_SUFFIX = ".calls"


def wire_mode() -> str:
    """``AGENTIX_CALLS_WIRE``: ``auto`` (also when unset or empty), ``frames`` or
    ``grpc``; ValueError for anything else."""
    mode = os.environ.get(CALLS_WIRE_ENV, "").strip().lower() or "auto"
    if mode not in _MODES:
        raise ValueError(f"{CALLS_WIRE_ENV}={mode!r} is not one of {', '.join(_MODES)}")
    return mode


def payload_ring_wanted() -> bool:
    """``AGENTIX_PAYLOAD_RING``: ``off`` or ``0`` (any case) turn the payload
    ring off; anything else, or unset, leaves it on."""
    return os.environ.get(PAYLOAD_RING_ENV, "").strip().lower() not in ("off", "0")


def calls_socket_path(target: str) -> str | None:
    """``PATH.calls`` for a ``unix:`` target (``unix:///PATH`` or ``unix:/PATH``),
    None for any other target."""
    if not target.startswith("unix:"):
        return None
    return urlsplit(target).path + _CALLS_SUFFIX


def connect_calls_socket(path: str) -> socket.socket:
    """A non-blocking stream socket connected to `path` (a Unix socket
    accepts at once or fails at once; a full backlog is EAGAIN)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock
