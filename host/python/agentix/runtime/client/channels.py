"""A client's gRPC channels: the options every channel gets, making one
(TLS or not), the native transport's extension, a failed one's error, and
closing without waiting for ever."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable
from typing import Any

import grpc

from agentix.runtime.client import wire
from agentix.runtime.client.errors import RuntimeUnreachable, Unauthenticated
from agentix.runtime.client.tls import TlsFiles
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc

__all__ = [
    "CLOSE_SECONDS",
    "CheckedChannel",
    "NativeTransport",
    "bounded",
    "channel_options",
    "close_channel",
    "native_calls_module",
    "new_channel",
    "open_channel",
    "unreachable",
]

_log = logging.getLogger("agentix.runtime.client")

# gRPC's 4 MiB default is far above what either side sends per message (payloads
# travel in 1 MiB chunks); the higher cap only guards against a stricter default.
_MAX_GRPC_MESSAGE_BYTES = 64 * 1024 * 1024
# "0" turns the native transport off (grpc.aio carries the Calls and the
# Namespace streams instead).
_NATIVE_TRANSPORT_ENV = "AGENTIX_NATIVE_TRANSPORT"
# Closing a channel or a stream waits for gRPC to wind its calls down; after
# a broken connection that was seen to take for ever, and it must never hold
# up a reconnect (which runs under the connect lock) or close().
CLOSE_SECONDS = 2.0


# The outcome of importing `_native_calls`, tried once per process: the module,
# or None when it cannot be loaded (the pure wheel, another interpreter, ...).
_NOT_TRIED = object()
_native_import: Any = _NOT_TRIED


def native_calls_module():
    """The native Calls transport (``_native_calls``, a C++ extension over
    grpc++), or None when it is turned off or cannot be loaded (then said once
    per process, at DEBUG)."""
    global _native_import
    if os.environ.get(_NATIVE_TRANSPORT_ENV, "1").strip() == "0":
        return None
    if _native_import is _NOT_TRIED:
        try:
            from agentix.runtime.client import _native_calls
        except Exception as error:  # the pure wheel, another interpreter, libgrpc++ missing, ...
            # Not worth more than DEBUG: grpc.aio does the same job, a bit slower.
            _log.debug("native Calls transport unavailable, using grpc.aio: %r", error)
            _native_import = None
        else:
            _native_import = _native_calls
    return _native_import


class NativeTransport:
    """The native transport of one client: the extension, and its grpc++
    channel to the daemon, made and replaced with the client's grpc.aio
    channel (`channel`, None while there is none). When the extension
    refuses what grpc.aio accepted, the client goes on with grpc.aio from
    then on (same behaviour, a bit slower) rather than failing.

    The grpc++ channel may also be deferred (`defer`): made, and connected,
    by the first `transport`. A client whose Calls stream runs on the frame
    wire may never need it, and a connection that carries no RPC is one the
    daemon's connection guard counts as unauthenticated (against its
    per-peer cap) and shuts down after ``--auth-timeout-s``."""

    __slots__ = ("_module", "_channel", "_deferred")

    def __init__(self) -> None:
        self._module = native_calls_module()
        self._channel: Any = None
        self._deferred: tuple[str, TlsFiles, list[tuple[str, Any]]] | None = None

    @property
    def channel(self) -> Any:
        """The current grpc++ channel, or None (none yet, or deferred)."""
        return self._channel

    @channel.setter
    def channel(self, channel: Any) -> None:
        # A new (or no) current channel replaces a deferred one.
        self._channel = channel
        self._deferred = None

    def new_channel(self, target: str, tls: TlsFiles, options: list[tuple[str, Any]]) -> Any:
        """A new grpc++ channel to `target` (not yet the current one), or
        None when the native transport is off."""
        if self._module is None:
            return None
        try:
            return self._module.Channel(target, tls.pem() if tls.enabled else None, options)
        except Exception as error:
            self._failed(error)
            return None

    def defer(self, target: str, tls: TlsFiles, options: list[tuple[str, Any]]) -> None:
        """Makes the current channel one to `target` that the first
        `transport` creates (no connection until then)."""
        self.channel = None
        if self._module is not None:
            self._deferred = (target, tls, options)

    def transport(self, metadata: tuple, method: str = wire.CALLS_METHOD) -> Any:
        """A new native ``CallsTransport`` on the current channel for
        `method` (Calls: coalescing writes, any other: a message per write),
        or None for grpc.aio (turned off, or the extension refused)."""
        if self._channel is None and self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            self._channel = self.new_channel(*deferred)
        if self._channel is None:
            return None
        try:
            if method == wire.CALLS_METHOD:
                return self._module.CallsTransport(self._channel, metadata)
            return self._module.CallsTransport(self._channel, metadata, method=method, coalesce=False)
        except Exception as error:
            self._failed(error)
            return None

    def _failed(self, error: Exception) -> None:
        _log.debug("native Calls transport failed, using grpc.aio from now on: %r", error)
        self._module = None
        self.channel = None  # and no deferred one


def channel_options(tls: TlsFiles) -> list[tuple[str, Any]]:
    """The options of a client's channels (grpc.aio and native alike)."""
    # A private subchannel pool: a fresh channel must not inherit the
    # reconnect backoff of a broken one to the same address.
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", _MAX_GRPC_MESSAGE_BYTES),
        ("grpc.max_send_message_length", _MAX_GRPC_MESSAGE_BYTES),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if tls.enabled and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return options


def new_channel(target: str, tls: TlsFiles, options: list[tuple[str, Any]]) -> grpc.aio.Channel:
    """A new grpc.aio channel to `target` (TLS when `tls` says so)."""
    if tls.enabled:
        return grpc.aio.secure_channel(target, tls.credentials(), options=options)
    return grpc.aio.insecure_channel(target, options=options)


class CheckedChannel:
    """A channel to a sandbox's daemon that its provider has just checked on
    this event loop (health with the sandbox's token, and refused without
    it): the sandbox's client takes it for its first connection instead of
    opening a second channel and probing it (issue 25: a create's host CPU
    competes with the sandbox's start on a small machine)."""

    def __init__(self, target: str, token: str | None, channel: grpc.aio.Channel) -> None:
        self.target = target
        self.token = token
        self._channel: grpc.aio.Channel | None = channel
        self._loop = asyncio.get_running_loop()

    async def take(self) -> grpc.aio.Channel | None:
        """The channel, once, on the loop it was made on (None elsewhere: a
        channel belongs to one loop), unless it broke meanwhile (then it is
        closed here)."""
        channel = self._channel
        if channel is None or asyncio.get_running_loop() is not self._loop:
            return None
        self._channel = None
        if channel.get_state() in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
            await close_channel(channel)
            return None
        return channel

    async def discard(self) -> None:
        """Closes the channel if nobody took it (on its loop; elsewhere it is
        left to gRPC's clean-up)."""
        channel, self._channel = self._channel, None
        if channel is not None and asyncio.get_running_loop() is self._loop:
            await close_channel(channel)


async def open_channel(
    target: str,
    tls: TlsFiles,
    native: NativeTransport,
    timeout: float,
    metadata: tuple,
    defer_native: bool = False,
    checked: CheckedChannel | None = None,
) -> grpc.aio.Channel:
    """A new channel to `target`, probed with ``GetInfo`` (within `timeout`),
    and the native transport's channel beside it (`native.channel`, set once
    the probe answered; with `defer_native`, deferred to its first use, see
    `NativeTransport`: `RuntimeClient` passes it when its Calls stream
    tries the frame wire first and no namespace is registered yet). Raises
    the probe's `grpc.aio.AioRpcError`, closing the channel first. With
    `checked` (its provider's channel to this target), that channel
    instead, unprobed, when it can still be taken."""
    options = channel_options(tls)
    taken = await checked.take() if checked is not None else None
    if taken is not None:
        if defer_native:
            native.defer(target, tls, options)
        else:
            native.channel = native.new_channel(target, tls, options)
        return taken
    channel = new_channel(target, tls, options)
    # Made before the probe: it starts connecting at once, so its connection
    # is set up while GetInfo runs, not after it (which made a first call
    # wait for two connections in turn).
    native_channel = None if defer_native else native.new_channel(target, tls, options)
    try:
        await pb_grpc.RuntimeServiceStub(channel).GetInfo(pb.GetInfoRequest(), timeout=timeout, metadata=metadata)
    except BaseException:
        await close_channel(channel)
        raise
    if defer_native:
        native.defer(target, tls, options)
    else:
        native.channel = native_channel
    return channel


def unreachable(error: grpc.aio.AioRpcError, base_url: str) -> RuntimeUnreachable | Unauthenticated:
    """The client's error for a channel that failed to open or probe."""
    if error.code() == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(f"runtime at {base_url} refused the token (UNAUTHENTICATED: {error.details()})")
    return RuntimeUnreachable(f"runtime server unreachable at {base_url}: {error.code().name}: {error.details()}")


async def bounded(awaitable: Awaitable[Any], what: str) -> None:
    """Awaits `awaitable` for at most `CLOSE_SECONDS`, then leaves it to
    finish in the background."""
    try:
        await asyncio.wait_for(awaitable, CLOSE_SECONDS)
    except TimeoutError:
        _log.debug("%s took over %ss; left to finish in the background", what, CLOSE_SECONDS)


async def close_channel(channel: grpc.aio.Channel) -> None:
    await bounded(channel.close(), "closing a gRPC channel")
