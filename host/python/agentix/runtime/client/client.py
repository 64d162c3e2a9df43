"""`RuntimeClient`: runs functions inside a sandbox over ``RuntimeService``.

One gRPC channel and one ``Calls`` stream per client carry every call
(`agentix.runtime.client.stream`). The channel is opened by ``async with`` or by
the first `remote()` / `health()`; connecting is verified with a ``GetInfo``
probe, so an address that refuses connections fails at once with
`RuntimeUnreachable` and a silent one fails after ``timeout`` seconds.

If the stream ends or breaks while calls are in flight, the client reconnects
by itself (with backoff, see `RuntimeClient`) and resumes them on a new
stream: it sends each call's StartCall again (the daemon runs a call_id at
most once and refuses to re-run a finished one) and ``ResumeCalls``, and the
daemon replays what they produced; streamed items and result chunks that
arrive twice are dropped. Calls whose arguments were larger than
`_RESEND_ARGUMENTS_BYTES` are only resumed (if their start never reached the
daemon they fail with ``ResultUnavailable``). When reconnecting fails, or with
``reconnection=False``, pending calls fail with `RuntimeUnreachable`. A call
made while a lost connection is down reconnects under the same policy, so a
cut that also breaks its first reconnect does not fail it.

Whenever the Calls stream is opened, a ``Logs`` and a ``Traces`` stream are
opened beside it (each unless already running): the first replays the
sandbox's log records into the host's stdlib logging
(`agentix.runtime.client.logs`), the second the sandbox's trace and span
events into the host's trace processors (`agentix.runtime.client.traces`).
``logs=False`` / ``traces=False`` turn them off. Either one, when lost while
calls keep working, is re-opened by the next call (at most once per second
each); a daemon that does not implement one is not asked for it again.

Plugin namespaces (`agentix.AsyncClientNamespace`) registered with
`register_namespace` before the first connection get one ``Namespace``
stream each, opened with the Calls stream and confirmed by the daemon
before the first call is sent (`agentix.runtime.client.namespaces`); like
the Calls stream, it runs on the native transport unless that is off or
unavailable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from typing import Any, ParamSpec, TypeVar, overload

import grpc

from agentix.runtime.client.errors import (
    CallTimeout,
    RemoteCallError,
    RuntimeUnreachable,
    Unauthenticated,
    remote_call_error_async,
)
from agentix.runtime.client.bundle_check import BundleCheck
from agentix.runtime.client.logs import LogCursor, LogsStream
from agentix.runtime.client._sio_facade import RESERVED_NAMESPACES, AsyncClientNamespace
from agentix.runtime.client.namespaces import NAMESPACE_METHOD, NamespaceStream, NativeNamespaceStream
from agentix.runtime.client.subscription import SeqCursor, SubscriptionStream
from agentix.runtime.client.result import Failed, Ok, Result
from agentix.runtime.client.stream import (
    CHUNK_BYTES,
    MAX_RESULT_BYTES,
    STREAM_END,
    CallsStream,
    NativeCallsStream,
    PendingCall,
    SideBarrier,
    StartRequest,
)
from agentix.runtime.client import wire
from agentix.runtime.client.target import grpc_target, wants_tls
from agentix.runtime.client.traces import TraceCursor, TracesStream
from agentix.runtime.shared import codec
from agentix.runtime.shared.callables import RemoteCallable, display_name_for
from agentix.runtime.shared.ids import UniqueIds
from agentix.runtime.shared.models import HealthResponse, RemoteError
from agentix.runtime.shared.safepickle import DecodeBusy, restricted_loads, restricted_loads_chunks
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc
from agentix.utils import context

__all__ = ["RuntimeClient"]

_log = logging.getLogger("agentix.runtime.client")

R = TypeVar("R")
Y = TypeVar("Y")
# remote/try_remote/remote_stream are typed so that a checker sees the
# target's parameters and result: `remote(add, 1, 2)` is an int, and
# `remote(add, "x")` an error (docs/CLI.md, "Typed API").
P = ParamSpec("P")

# gRPC's 4 MiB default is far above what either side sends per message (payloads
# travel in 1 MiB chunks); the higher cap only guards against a stricter default.
_MAX_GRPC_MESSAGE_BYTES = 64 * 1024 * 1024
# Shortest interval between attempts to re-open a lost Logs or Traces stream.
_FEED_REOPEN_SECONDS = 1.0
# How long close() waits for queued cancels to reach the daemon, and at
# most for the Logs/Traces streams to go quiet (_CLOSE_QUIET_SECONDS without
# a record: the daemon holds one back at most 4 ms).
_CLOSE_FLUSH_SECONDS = 1.0
_CLOSE_QUIET_SECONDS = 0.03
# A call's result waits for the sandbox's records it carries the seq of (the
# side-channel barrier) as long as replay makes progress; it stops waiting
# once none is replayed for this long (docs/RELIABILITY.md).
_BARRIER_IDLE_SECONDS = 2.0


# Call ids (and client ids): see UniqueIds.
_call_ids = UniqueIds()
# The metadata key that names a client (RuntimeClient.client_id) to the daemon.
_CLIENT_ID_HEADER = "agentix-client-id"


_TOKEN_ENV = "AGENTIX_TOKEN"
# Default for `max_result_bytes` when the argument is not given.
_MAX_RESULT_BYTES_ENV = "AGENTIX_MAX_RESULT_BYTES"
# Results this large or larger are decoded on a worker thread: decoding is
# bounded (safepickle's per-load budget grows with the stream), but a large
# stream may still take milliseconds the event loop should not stall for.
# Smaller results decode inline, without a thread hop.
_INLINE_DECODE_BYTES = 64 * 1024
# "0" turns the native transport off (grpc.aio carries the Calls and the
# Namespace streams instead).
_NATIVE_TRANSPORT_ENV = "AGENTIX_NATIVE_TRANSPORT"


# The outcome of importing `_native_calls`, tried once per process: the module,
# or None when it cannot be loaded (the pure wheel, another interpreter, ...).
_NOT_TRIED = object()
_native_import: Any = _NOT_TRIED


def _native_calls_module():
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


# Reconnection defaults (see RuntimeClient).
_RECONNECT_ATTEMPTS = 8
_RECONNECT_DELAY = 0.25
_RECONNECT_DELAY_MAX = 5.0
_RANDOMIZATION = 0.5
# Arguments up to this size are kept until the call ends so its StartCall can
# be sent again after a reconnect; larger calls are only resumed.
_RESEND_ARGUMENTS_BYTES = 16 * 1024 * 1024


# Closing a channel or a stream waits for gRPC to wind its calls down; after
# a broken connection that was seen to take for ever, and it must never hold
# up a reconnect (which runs under the connect lock) or close().
_CLOSE_SECONDS = 2.0
# Longest wait for the daemon to confirm a namespace stream (under the
# connect lock, so it must be short).
_CONFIRM_SECONDS = 15.0


async def _decode_item(loop: asyncio.AbstractEventLoop, item: bytes) -> Any:
    """A streamed item's value: decoded inline when small, else (or when another
    thread's decode holds the classes it names) on a worker thread."""
    if len(item) < _INLINE_DECODE_BYTES:
        try:
            return restricted_loads(item, wait=False)
        except DecodeBusy:
            pass
    return await loop.run_in_executor(None, restricted_loads, item)


async def _bounded(awaitable: Awaitable[Any], what: str) -> None:
    try:
        await asyncio.wait_for(awaitable, _CLOSE_SECONDS)
    except TimeoutError:
        _log.debug("%s took over %ss; left to finish in the background", what, _CLOSE_SECONDS)


async def _close_channel(channel: grpc.aio.Channel) -> None:
    await _bounded(channel.close(), "closing a gRPC channel")


class _TlsFiles:
    """The TLS settings of a client: whether to use TLS and its credentials."""

    def __init__(
        self, url: str, ca_file: str | None, cert_file: str | None, key_file: str | None, server_name: str | None
    ) -> None:
        if (cert_file is None) != (key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together (mutual TLS needs both)")
        self.enabled = wants_tls(url) or any(f is not None for f in (ca_file, cert_file, key_file))
        self.files = (ca_file, cert_file, key_file)
        self.server_name = server_name

    def pem(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """The CA bundle, certificate chain and key (None where not given)."""

        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        ca, cert, key = (read(path) for path in self.files)
        return ca, cert, key

    def credentials(self) -> grpc.ChannelCredentials:
        ca, cert, key = self.pem()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


class _Feed:
    """One subscription stream of a client (``Logs`` or ``Traces``): the
    current stream, the channel it runs on, the cursor its successive
    streams share, whether the daemon lacks the RPC, and when it was last
    re-opened. `flag` names the client attribute that turns it on."""

    __slots__ = ("flag", "stream_type", "cursor", "stream", "channel", "unimplemented", "reopened_at")

    def __init__(self, flag: str, stream_type: type[SubscriptionStream], cursor: SeqCursor) -> None:
        self.flag = flag
        self.stream_type = stream_type
        self.cursor = cursor
        self.stream: SubscriptionStream | None = None
        self.channel: grpc.aio.Channel | None = None
        self.unimplemented = False
        self.reopened_at = float("-inf")

    def ensure(self, channel: grpc.aio.Channel, metadata: tuple | None) -> None:
        """Opens the stream on `channel` unless one is running there or the
        daemon does not implement it. Does not wait for anything."""
        if self.unimplemented:
            return
        previous = self.stream
        if previous is not None and previous.alive and self.channel is channel:
            return
        rpc = getattr(pb_grpc.RuntimeServiceStub(channel), self.stream_type.rpc_name)(metadata=metadata)
        self.stream = self.stream_type(rpc, self.cursor, self._not_implemented, previous=previous)
        self.channel = channel

    def _not_implemented(self) -> None:
        self.unimplemented = True

    async def wait_replayed(self, seq: int) -> None:
        """Waits until this feed has replayed up to `seq` (a call's barrier),
        across a re-opened stream, while replay makes progress; returns at
        once when there is no live stream."""
        cursor = self.cursor
        while cursor.last_seq < seq:
            stream = self.stream
            if stream is None or not stream.alive:
                return
            before = cursor.last_seq
            await stream.wait_replayed(seq, _BARRIER_IDLE_SECONDS)
            if self.stream is stream and cursor.last_seq == before:
                return  # no progress for the whole bound

    def detach(self) -> SubscriptionStream | None:
        """Forgets the stream and channel and returns the stream (to close)."""
        stream, self.stream, self.channel = self.stream, None, None
        return stream


class RuntimeClient:
    """Client of one sandbox runtime (``agentix-sandboxd``).

    Args:
      base_url: ``unix:///abs/path.sock``, ``host:port`` or ``http://host:port``
        (see `agentix.runtime.client.target.grpc_target`).
      timeout: seconds allowed for connecting (the ``GetInfo`` probe) and for
        `health()`. Remote calls are bounded only by `call_deadline`.
      http_sync_ms: accepted for compatibility and ignored: the original's HTTP
        fast path has no counterpart, every call uses the gRPC stream.
      call_deadline: seconds a `remote()` call may take once connected (None: no
        limit). On expiry the call raises `CallTimeout` and is cancelled in the
        sandbox.
      stream_window: how many items of a `remote_stream()` call the sandbox
        may produce ahead of the consumer (back-pressure).
      reconnection, reconnection_attempts, reconnection_delay,
      reconnection_delay_max, randomization_factor: what happens when the
        connection breaks with calls in flight. By default the client
        reconnects by itself and resumes them (first attempt at once, then
        after `reconnection_delay` = 0.25 s doubling up to
        `reconnection_delay_max` = 5 s, each ±`randomization_factor` = 0.5;
        `reconnection_attempts` = 8 attempts, 0 = unlimited); when every
        attempt fails they fail with `RuntimeUnreachable`. A new call that
        finds the connection lost retries the same way before failing.
        ``reconnection=False`` fails them at once.
      logs: replay the sandbox's log records into the host's logging (True),
        or do not subscribe to them at all (False).
      traces: replay the sandbox's trace and span events into the host's
        `agentix.trace` processors (True), or do not subscribe to them at
        all (False).
      token: the sandbox's bearer token, sent with every RPC (default: the
        ``AGENTIX_TOKEN`` environment variable; neither: none is sent). A
        daemon started with ``--token-file`` refuses RPCs without it or
        with another one: `agentix.Unauthenticated`.
      tls_ca_file, tls_cert_file, tls_key_file, tls_server_name: TLS for
        ``https://`` URLs or when any file is given: the CA bundle that
        signed the daemon's certificate (default: the system roots), the
        client certificate and key for mutual TLS, and the name to verify
        the daemon's certificate against instead of the URL's host.
      max_result_bytes: the largest encoded result (and streamed item) a call
        may return (default: the ``AGENTIX_MAX_RESULT_BYTES`` environment
        variable, else 1 GiB). A larger one is dropped as it arrives and the
        call fails with `ResultTooLarge`; the client keeps working.
      bundle_manifest: the sandbox's bundle (its directory or its
        ``manifest.json``; default ``$AGENTIX_BUNDLE_MANIFEST``): at the
        first call of each of the project's modules the host's copy is
        compared with the bundle's and a stale one is reported
        (`agentix.runtime.client.bundle_check`).
      stale_modules: ``"warn"`` (default; once per module, on the
        ``agentix.bundle`` logger), ``"strict"`` (a stale module's calls
        raise `StaleModuleError`, nothing sent) or ``"off"``; default
        ``$AGENTIX_STALE_MODULES``.

    Use as ``async with RuntimeClient(url) as client:`` (connects on entry,
    closes on exit) or call `close()` yourself. A closed client connects again
    on its next use.
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = 300,
        *,
        http_sync_ms: int | None = 1000,
        call_deadline: float | None = None,
        stream_window: int = 16,
        reconnection: bool | None = None,
        reconnection_attempts: int | None = None,
        reconnection_delay: float | None = None,
        reconnection_delay_max: float | None = None,
        randomization_factor: float | None = None,
        logs: bool = True,
        traces: bool = True,
        token: str | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        tls_server_name: str | None = None,
        max_result_bytes: int | None = None,
        bundle_manifest: str | os.PathLike[str] | None = None,
        stale_modules: str | None = None,
    ) -> None:
        self.base_url = base_url
        self._bundle_check = BundleCheck.create(bundle_manifest, stale_modules)
        if max_result_bytes is None:
            max_result_bytes = int(os.environ.get(_MAX_RESULT_BYTES_ENV) or MAX_RESULT_BYTES)
        if max_result_bytes < 1:
            raise ValueError(f"max_result_bytes must be at least 1 (got {max_result_bytes})")
        self.max_result_bytes = max_result_bytes
        self.timeout = timeout
        self.http_sync_ms = http_sync_ms
        self.call_deadline = call_deadline
        if stream_window < 1:
            raise ValueError(f"stream_window must be at least 1 (got {stream_window})")
        self.stream_window = stream_window
        self.reconnection_options = {
            name: value
            for name, value in (
                ("reconnection", reconnection),
                ("reconnection_attempts", reconnection_attempts),
                ("reconnection_delay", reconnection_delay),
                ("reconnection_delay_max", reconnection_delay_max),
                ("randomization_factor", randomization_factor),
            )
            if value is not None
        }
        # Reconnecting (the original's socketio defaults, but a first attempt
        # at once and a bounded number of attempts, so no call waits forever).
        self._reconnect_enabled = reconnection is not False
        self._reconnect_attempts = _RECONNECT_ATTEMPTS if reconnection_attempts is None else reconnection_attempts
        self._reconnect_delay = _RECONNECT_DELAY if reconnection_delay is None else reconnection_delay
        self._reconnect_delay_max = _RECONNECT_DELAY_MAX if reconnection_delay_max is None else reconnection_delay_max
        self._randomization = _RANDOMIZATION if randomization_factor is None else randomization_factor
        self._reconnector: asyncio.Task | None = None
        # Acks a lost stream never wrote; the next stream sends them.
        self._orphan_acks: list[str] = []
        self._target = grpc_target(base_url)
        if token is None:
            token = os.environ.get(_TOKEN_ENV) or None
        # Sent with every RPC; the daemon checks it before any handler runs.
        # Names this client to the daemon on every RPC: the log records and
        # trace events of its calls go to its own Logs/Traces streams only.
        self.client_id = _call_ids.next()
        client_header = (_CLIENT_ID_HEADER, self.client_id)
        self._metadata = (
            (("authorization", f"Bearer {token}"), client_header) if token else (client_header,)
        )
        self._tls = _TlsFiles(base_url, tls_ca_file, tls_cert_file, tls_key_file, tls_server_name)
        self._channel: grpc.aio.Channel | None = None
        self._channel_broken = False
        # With the native transport, the Calls stream runs on a grpc++ channel
        # to the same target, made and replaced together with `_channel`.
        self._native = _native_calls_module()
        self._native_channel = None
        self._stream: CallsStream | None = None
        self._pending: dict[str, PendingCall] = {}
        self._connect_lock = asyncio.Lock()
        self.logs = logs
        self.traces = traces
        self._feeds = (_Feed("logs", LogsStream, LogCursor()), _Feed("traces", TracesStream, TraceCursor()))
        self._namespaces: dict[str, AsyncClientNamespace] = {}
        self._namespace_streams: dict[str, NamespaceStream | NativeNamespaceStream] = {}
        self._namespaces_reopened_at = float("-inf")
        self._connected_once = False

    @property
    def _logs(self) -> LogsStream | None:
        """The current Logs stream (None before the first connection or after close())."""
        return self._feeds[0].stream

    @property
    def _traces(self) -> TracesStream | None:
        """The current Traces stream (None before the first connection or after close())."""
        return self._feeds[1].stream

    def register_namespace(self, ns: AsyncClientNamespace) -> AsyncClientNamespace:
        """Adds a plugin namespace; must precede the first connection (the
        set of streams is fixed when the client connects). Returns `ns`.

        Raises:
          RuntimeError: the client has already connected.
          ValueError: the path does not start with "/", is reserved
            (``/rpc``, ``/log``, ``/trace``) or is already registered.
        """
        if self._connected_once:
            raise RuntimeError("register_namespace must be called before entering the async context")
        path = getattr(ns, "namespace", None)
        if not isinstance(path, str) or not path.startswith("/") or path == "/":
            raise ValueError(f"namespace must be a path starting with '/' (e.g. '/myplugin'), got {path!r}")
        if path in RESERVED_NAMESPACES:
            raise ValueError(f"namespace {path!r} is reserved by agentix-core; choose another path for the plugin")
        if path in self._namespaces:
            raise ValueError(f"namespace {path!r} already registered")
        ns.client = self
        self._namespaces[path] = ns
        return ns

    async def __aenter__(self) -> RuntimeClient:
        await self._live_stream()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @overload
    async def remote(self, fn: Callable[P, Coroutine[Any, Any, R]], /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    async def remote(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...

    async def remote(self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Runs ``fn(*args, **kwargs)`` in the sandbox and returns its value.

        `fn` must be an importable top-level function (`RemoteCallable`);
        otherwise `TypeError` is raised before anything is sent. Arguments are
        pickled on the host (pickling errors propagate as they are); the value
        is decoded through `restricted_loads`.

        Raises:
          RemoteCallError: the call failed in the sandbox (`CallCancelled` when
            cancelled there, `WorkerExited` when the worker died). When the
            sandbox exception's class is admitted on the host (builtin
            exceptions, `allow_type` classes), also an instance of that class
            with its args (see `agentix.runtime.client.errors`).
          CallTimeout: `call_deadline` passed; the sandbox is told to cancel.
          RuntimeUnreachable: connecting failed, the connection was lost, or the
            client was closed while the call was in flight.
          Unauthenticated: the daemon refused the token (not retried).
          StaleModuleError: strict mode, and the host's copy of `fn`'s module
            differs from the bundle's (`bundle_manifest`); nothing was sent.
          RestrictedUnpickleError: the value is not on the host allowlist, or
            asks for work out of proportion to its size (safepickle's bounds).
          ResultTooLarge: the encoded value exceeds `max_result_bytes` (a
            `RestrictedUnpickleError`).
        Results of 64 KiB or more are decoded on a worker thread, smaller ones
        on the event loop.
        Cancelling the awaiting task cancels the call in the sandbox too.
        """
        display_name = display_name_for(fn)
        callable_ref = RemoteCallable._resolve(fn)
        if self._bundle_check is not None:
            self._bundle_check.check(callable_ref)
        # In pieces when large: a big bytes argument is not copied into the pickle.
        arguments = wire.pickle_pieces((args, kwargs), CHUNK_BYTES)
        carrier = context.encode() or b""
        lost = self._channel_broken
        try:
            stream = await self._live_stream()
        except (RuntimeUnreachable, OSError, grpc.aio.AioRpcError) as failure:
            if not (lost and self._reconnect_enabled):
                raise
            stream = await self._reconnect_for_call(failure)

        # Registering and starting happen without yielding to the loop right after
        # _live_stream() saw the stream alive, so a loss cannot slip in between.
        call = PendingCall(
            _call_ids.next(),
            display_name,
            asyncio.get_running_loop().create_future(),
            start=self._start_request(callable_ref, arguments, carrier, 0),
            max_result_bytes=self.max_result_bytes,
        )
        self._pending[call.call_id] = call
        deadline = None
        try:
            stream.start_call(call.call_id, callable_ref, arguments, carrier)
            if self.call_deadline is None:
                outcome = await call.future
            else:
                async with asyncio.timeout(self.call_deadline) as deadline:
                    outcome = await call.future
        except TimeoutError:
            if deadline is not None and deadline.expired():
                raise CallTimeout(
                    f"remote call '{display_name}' exceeded deadline of {self.call_deadline}s"
                ) from None
            raise
        finally:
            self._pending.pop(call.call_id, None)
            if call.future.cancelled():  # local cancellation or deadline
                stream.cancel_call(call.call_id)

        if call.barrier is not None:
            await self._side_barrier(call.barrier)
        if isinstance(outcome, RemoteError):
            raise await remote_call_error_async(display_name, outcome)
        if isinstance(outcome, list):
            return await asyncio.get_running_loop().run_in_executor(None, restricted_loads_chunks, outcome)
        if len(outcome) < _INLINE_DECODE_BYTES:
            try:
                return restricted_loads(outcome, wait=False)
            except DecodeBusy:  # a worker thread is decoding a value of a mutable class
                pass
        return await asyncio.get_running_loop().run_in_executor(None, restricted_loads, outcome)

    @overload
    def remote_stream(
        self, fn: Callable[P, AsyncIterable[Y]], /, *args: P.args, **kwargs: P.kwargs
    ) -> AsyncIterator[Y]: ...
    @overload
    def remote_stream(self, fn: Callable[P, Iterable[Y]], /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Y]: ...

    async def remote_stream(self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Any]:
        """Runs a generator, async generator or iterator-returning ``fn`` in
        the sandbox and yields its items as they are produced.

        At most `stream_window` items are produced ahead of the consumer. An
        exception in the sandbox is raised here after the items produced
        before it. Leaving the ``async for`` early (or ``aclose()``) cancels
        the call in the sandbox, which closes its generator. `call_deadline`
        bounds the whole stream. Same target rules and errors as `remote()`;
        a target that returns something not iterable raises `RemoteCallError`
        with type ``TypeError``.
        """
        display_name = display_name_for(fn)
        callable_ref = RemoteCallable._resolve(fn)
        if self._bundle_check is not None:
            self._bundle_check.check(callable_ref)
        # In pieces when large: a big bytes argument is not copied into the pickle.
        arguments = wire.pickle_pieces((args, kwargs), CHUNK_BYTES)
        carrier = context.encode() or b""
        lost = self._channel_broken
        try:
            stream = await self._live_stream()
        except (RuntimeUnreachable, OSError, grpc.aio.AioRpcError) as failure:
            if not (lost and self._reconnect_enabled):
                raise
            stream = await self._reconnect_for_call(failure)

        loop = asyncio.get_running_loop()
        call = PendingCall(
            _call_ids.next(),
            display_name,
            loop.create_future(),
            streaming=True,
            start=self._start_request(callable_ref, arguments, carrier, self.stream_window),
            max_result_bytes=self.max_result_bytes,
        )
        self._pending[call.call_id] = call
        window = self.stream_window
        # Not asyncio.timeout(): it would cancel whatever the consumer runs
        # between items, outside this generator.
        deadline_at = None if self.call_deadline is None else loop.time() + self.call_deadline
        consumed = acked = 0
        finished = False
        try:
            stream.start_call(call.call_id, callable_ref, arguments, carrier, stream_window=window)
            while True:
                if deadline_at is None:
                    item = await call.items.get()
                else:
                    try:
                        item = await asyncio.wait_for(call.items.get(), max(0.0, deadline_at - loop.time()))
                    except TimeoutError:
                        raise CallTimeout(
                            f"remote stream '{display_name}' exceeded deadline of {self.call_deadline}s"
                        ) from None
                if item is STREAM_END:
                    break
                if type(item) is SideBarrier:
                    await self._side_barrier(item)
                    continue
                consumed += 1
                call.consumed = consumed
                # Ack in half-window steps: one StreamAck per few items, and
                # the producer never waits a full round trip for credit.
                if consumed - acked >= max(1, window // 2):
                    stream = self._stream or stream  # the stream may have been replaced by a reconnect
                    stream.ack_stream(call.call_id, consumed)
                    acked = consumed
                yield await _decode_item(loop, item)
            outcome = call.future.result()
            finished = True
            if call.barrier is not None:
                await self._side_barrier(call.barrier)
        finally:
            self._pending.pop(call.call_id, None)
            if not finished and not call.future.done():
                # The consumer stopped early, or the deadline passed.
                call.future.cancel()
                stream.cancel_call(call.call_id)
        if isinstance(outcome, RemoteError):
            raise await remote_call_error_async(display_name, outcome)

    async def _side_barrier(self, barrier: SideBarrier) -> None:
        """Waits until the log records and trace events `barrier` names have
        been handed to the host's logging and trace processors (bounded: see
        `_BARRIER_IDLE_SECONDS`)."""
        for feed, seq in zip(self._feeds, (barrier.log_seq, barrier.trace_seq)):
            if seq > feed.cursor.last_seq:
                await feed.wait_replayed(seq)

    @overload
    async def try_remote(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Result[R]: ...
    @overload
    async def try_remote(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Result[R]: ...

    async def try_remote(self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Result[Any]:
        """Like `remote()`, but returns `Ok(value)`, or `Failed(error)` for a
        `RemoteCallError`, `CallTimeout` or `RuntimeUnreachable`. Misuse
        (`TypeError`), `RestrictedUnpickleError` and cancellation still raise."""
        try:
            return Ok(await self.remote(fn, *args, **kwargs))
        except (RemoteCallError, CallTimeout, RuntimeUnreachable) as error:
            return Failed(error)

    async def health(self) -> HealthResponse:
        """Asks the runtime for its status and version.

        Raises `RuntimeUnreachable` when it cannot be reached within `timeout`,
        `Unauthenticated` when it refuses the token.
        """
        info = await self._info()
        return HealthResponse(status=info.status, version=info.version)

    async def _info(self) -> pb.GetInfoResponse:
        """The runtime's full ``GetInfo`` answer (worker pid, calls in flight, ...),
        for diagnostics and tests; errors as for `health()`."""
        async with self._connect_lock:
            channel = await self._ready_channel()
        try:
            return await pb_grpc.RuntimeServiceStub(channel).GetInfo(
                pb.GetInfoRequest(), timeout=self.timeout, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as error:
            raise self._unreachable(error) from error

    def _pending_call_ids(self) -> list[str]:
        """Ids of the calls still awaiting their terminal event, for diagnostics and tests."""
        return list(self._pending)

    async def close(self) -> None:
        """Closes the connection. Calls still in flight fail with
        `RuntimeUnreachable` and are cancelled in the sandbox (best effort).
        Idempotent; the client connects again if used afterwards."""
        reconnector, self._reconnector = self._reconnector, None
        if reconnector is not None:
            reconnector.cancel()
        # What the sandbox emitted before close() is replayed first (bounded).
        live_feeds = [feed.stream for feed in self._feeds if feed.stream is not None and feed.stream.alive]
        if live_feeds:
            await asyncio.gather(
                *(feed.settle(_CLOSE_QUIET_SECONDS, _CLOSE_FLUSH_SECONDS) for feed in live_feeds),
                return_exceptions=True,
            )
        stream, self._stream = self._stream, None
        channel, self._channel = self._channel, None
        self._native_channel = None
        feeds = [feed.detach() for feed in self._feeds]
        in_flight = list(self._pending.values())
        self._pending.clear()
        for call in in_flight:
            call.fail(
                RuntimeUnreachable(
                    f"runtime client closed with remote call '{call.display_name}' in flight: {self.base_url}"
                )
            )
        if stream is not None:
            await stream.aclose([call.call_id for call in in_flight], _CLOSE_FLUSH_SECONDS)
        for feed_stream in feeds:
            if feed_stream is not None:
                await feed_stream.aclose()
        namespace_streams = list(self._namespace_streams.values())
        self._namespace_streams.clear()
        for namespace_stream in namespace_streams:
            await _bounded(namespace_stream.aclose(), "closing a namespace stream")
        if channel is not None:
            await _close_channel(channel)

    async def _live_stream(self) -> CallsStream:
        """Returns the open Calls stream, connecting first if there is none."""
        stream = self._stream
        if stream is not None and stream.alive:
            for feed in self._feeds:
                feed_stream = feed.stream
                if feed_stream is not None and not feed_stream.alive and self._channel is not None:
                    # The Logs/Traces stream broke while calls kept working:
                    # re-open it (at most once per _FEED_REOPEN_SECONDS, so a
                    # daemon that keeps failing it costs nothing per call).
                    now = asyncio.get_running_loop().time()
                    if now - feed.reopened_at >= _FEED_REOPEN_SECONDS and getattr(self, feed.flag):
                        feed.reopened_at = now
                        feed.ensure(self._channel, self._metadata)
            if self._namespaces and self._channel is not None and not self._namespaces_alive():
                now = asyncio.get_running_loop().time()
                if now - self._namespaces_reopened_at >= _FEED_REOPEN_SECONDS:
                    self._namespaces_reopened_at = now
                    self._open_namespaces(self._channel)  # not awaited: calls go on
            return stream
        async with self._connect_lock:
            if self._stream is None or not self._stream.alive:
                channel = await self._ready_channel()
                self._connected_once = True
                transport = self._native_transport()
                if transport is not None:
                    self._stream = NativeCallsStream(transport, self._pending, self._stream_lost)
                else:
                    # Not the generated stub: argument and result chunks bypass
                    # protobuf messages (wire.py).
                    rpc = channel.stream_stream(
                        wire.CALLS_METHOD,
                        request_serializer=None,  # CallsStream writes encoded bytes
                        response_deserializer=wire.parse_calls_response,
                    )(metadata=self._metadata)
                    self._stream = CallsStream(rpc, self._pending, self._stream_lost)
                if self._pending:  # calls of a lost stream: re-attach them
                    self._stream.resume(list(self._pending.values()))
                if self._orphan_acks:
                    self._stream.ack_results(self._orphan_acks)
                    self._orphan_acks = []
                self._ensure_feeds(channel)
                # Events the sandbox emits during the first call must find
                # the host's namespaces open: wait for the daemon's answer.
                await self._confirm_namespaces(self._open_namespaces(channel))
            return self._stream

    async def _reconnect_for_call(self, failure: BaseException) -> CallsStream:
        """The Calls stream for a new call whose first reconnect, after the
        connection was lost, failed with `failure`: retried under the
        reconnection policy (as for the calls in flight when it broke), so a
        cut during the GetInfo probe does not cost the call. (A first
        connection, and a client with ``reconnection=False``, fail at once.)
        Raises the last attempt's error when every attempt failed."""
        attempt = 1
        while not (self._reconnect_attempts and attempt >= self._reconnect_attempts):
            await asyncio.sleep(self._backoff(attempt))
            try:
                return await self._live_stream()
            except (RuntimeUnreachable, OSError, grpc.aio.AioRpcError) as error:
                failure = error
                attempt += 1
        raise failure

    def _backoff(self, attempt: int) -> float:
        """Seconds to wait after the `attempt`-th failed reconnect (1, 2, ...)."""
        delay = min(self._reconnect_delay * 2 ** (attempt - 1), self._reconnect_delay_max)
        return max(0.0, delay * (1 + self._randomization * (2 * random.random() - 1)))

    def _namespaces_alive(self) -> bool:
        return all(
            (stream := self._namespace_streams.get(path)) is not None and stream.alive for path in self._namespaces
        )

    def _open_namespaces(self, channel: grpc.aio.Channel) -> list[NamespaceStream | NativeNamespaceStream]:
        """Opens a Namespace stream for every registered namespace that has
        no live one; returns the new streams (not yet confirmed)."""
        opened = []
        for path, ns in self._namespaces.items():
            current = self._namespace_streams.get(path)
            if current is not None and current.alive:
                continue
            stream = self._namespace_stream(channel, ns)
            self._namespace_streams[path] = stream
            opened.append(stream)
        return opened

    def _namespace_stream(
        self, channel: grpc.aio.Channel, ns: AsyncClientNamespace
    ) -> NamespaceStream | NativeNamespaceStream:
        """A new Namespace stream for `ns`: on the native transport like the
        Calls stream when it is in use, else on grpc.aio."""
        transport = self._native_transport(NAMESPACE_METHOD)
        if transport is not None:
            return NativeNamespaceStream(transport, ns)
        return NamespaceStream(pb_grpc.RuntimeServiceStub(channel).Namespace(metadata=self._metadata), ns)

    async def _confirm_namespaces(self, streams: list[NamespaceStream | NativeNamespaceStream]) -> None:
        """Waits until the daemon has confirmed each new stream.

        Raises ValueError when it refuses a namespace, RuntimeUnreachable
        when a stream fails or no answer comes within `timeout`."""
        for stream in streams:
            try:
                await stream.wait_opened(min(self.timeout, _CONFIRM_SECONDS))
            except TimeoutError:
                raise RuntimeUnreachable(
                    f"runtime at {self.base_url} did not confirm namespace {stream.ns.namespace} "
                    f"within {min(self.timeout, _CONFIRM_SECONDS)}s"
                ) from None
            except RuntimeError as error:
                raise RuntimeUnreachable(f"runtime at {self.base_url}: {error}") from error

    def _send_namespace_event_nowait(self, path: str, event: str, payload: bytes, request_id: str) -> bool:
        """`_emit_namespace_event` of an encoded event without an error,
        when its namespace's stream is open and takes it without waiting
        (`request_handler`'s replies); False when nothing was sent."""
        stream = self._namespace_streams.get(path)
        return stream is not None and stream.alive and stream.send_nowait(event, payload, request_id)

    async def _emit_namespace_event(self, path: str, event: str, data: Any, payload: bytes | None = None) -> None:
        """Sends one event of a registered namespace (AsyncClientNamespace.emit);
        `payload`, when given, is ``codec.pack(data)`` already."""
        if payload is None:
            payload = codec.pack(data)
        error = None
        if event.endswith(":error") and isinstance(data, dict) and isinstance(data.get("error"), dict):
            error = data["error"]
        request_id = data.get("request_id") if isinstance(data, dict) else None
        stream = self._namespace_streams.get(path)
        if stream is None or not stream.alive:
            # (A request handler's reply, the hot path, finds its stream open.)
            await self._live_stream()
            stream = self._namespace_streams.get(path)
        if stream is None or not stream.alive:
            async with self._connect_lock:
                channel = await self._ready_channel()
                await self._confirm_namespaces(self._open_namespaces(channel))
            stream = self._namespace_streams[path]
        await stream.send(event, payload, request_id if isinstance(request_id, str) else "", error)

    async def _close_namespace(self, path: str) -> None:
        stream = self._namespace_streams.pop(path, None)
        if stream is not None:
            await stream.aclose()

    def _ensure_feeds(self, channel: grpc.aio.Channel) -> None:
        """Opens the Logs and Traces streams on `channel`, each unless one is
        running there, it is turned off (``logs`` / ``traces``), or the daemon
        does not implement it. Called whenever a Calls stream is opened and
        when a lost one is re-opened; does not wait for anything."""
        for feed in self._feeds:
            if getattr(self, feed.flag):
                feed.ensure(channel, self._metadata)

    async def _ready_channel(self) -> grpc.aio.Channel:
        """Returns a usable channel, replacing one that is known broken and
        probing a new one with GetInfo. Caller holds ``_connect_lock``."""
        channel = self._channel
        if channel is not None and not self._channel_broken:
            if channel.get_state() not in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
                return channel
        self._channel = None
        self._native_channel = None
        if channel is not None:
            await _close_channel(channel)

        # A private subchannel pool: a fresh channel must not inherit the
        # reconnect backoff of a broken one to the same address.
        options = [
            ("grpc.max_receive_message_length", _MAX_GRPC_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_GRPC_MESSAGE_BYTES),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self._tls.enabled:
            if self._tls.server_name:
                options.append(("grpc.ssl_target_name_override", self._tls.server_name))
            channel = grpc.aio.secure_channel(self._target, self._tls.credentials(), options=options)
        else:
            channel = grpc.aio.insecure_channel(self._target, options=options)
        native_channel = None
        if self._native is not None:
            try:
                # Made before the probe: it starts connecting at once, so its
                # connection is set up while GetInfo runs, not after it
                # (which made a first call wait for two connections in turn).
                native_channel = self._native.Channel(
                    self._target, self._tls.pem() if self._tls.enabled else None, options
                )
            except Exception as error:
                self._native_failed(error)
        try:
            await pb_grpc.RuntimeServiceStub(channel).GetInfo(
                pb.GetInfoRequest(), timeout=self.timeout, metadata=self._metadata
            )
        except BaseException as error:
            await _close_channel(channel)
            if isinstance(error, grpc.aio.AioRpcError):
                raise self._unreachable(error) from error
            raise
        self._native_channel = native_channel
        self._channel = channel
        self._channel_broken = False
        return channel

    def _native_transport(self, method: str = wire.CALLS_METHOD):
        """A new native ``CallsTransport`` on the current channel for
        `method` (Calls: coalescing writes, any other: a message per write),
        or None for grpc.aio (turned off, or the extension refused)."""
        if self._native_channel is None:
            return None
        try:
            if method == wire.CALLS_METHOD:
                return self._native.CallsTransport(self._native_channel, self._metadata)
            return self._native.CallsTransport(self._native_channel, self._metadata, method=method, coalesce=False)
        except Exception as error:
            self._native_failed(error)
            return None

    def _native_failed(self, error: Exception) -> None:
        """The extension refused what grpc.aio accepted: this client goes on
        with grpc.aio (same behaviour, a bit slower) rather than failing."""
        _log.debug("native Calls transport failed, using grpc.aio from now on: %r", error)
        self._native = None
        self._native_channel = None

    def _unreachable(self, error: grpc.aio.AioRpcError) -> RuntimeUnreachable | Unauthenticated:
        if error.code() == grpc.StatusCode.UNAUTHENTICATED:
            return Unauthenticated(f"runtime at {self.base_url} refused the token (UNAUTHENTICATED: {error.details()})")
        return RuntimeUnreachable(
            f"runtime server unreachable at {self.base_url}: {error.code().name}: {error.details()}"
        )

    @staticmethod
    def _start_request(
        callable_ref: str, arguments: bytes | wire.Pieces, context: bytes, stream_window: int
    ) -> StartRequest | None:
        if len(arguments) > _RESEND_ARGUMENTS_BYTES:
            return None
        return StartRequest(callable_ref, arguments, context, stream_window)

    def _stream_lost(self, stream: CallsStream, error: BaseException | None) -> None:
        """Reconnects and resumes the pending calls of the lost stream (or
        fails them when reconnection is off); without pending calls the next
        call reconnects."""
        if stream is not self._stream:
            return
        self._stream = None
        self._channel_broken = True
        self._orphan_acks = [*self._orphan_acks, *stream.take_unsent_acks()][-2 * 4096 :]
        if not self._pending:
            return
        if not self._reconnect_enabled:
            self._fail_pending(f"runtime server connection lost: {self.base_url}", error)
            return
        if self._reconnector is None or self._reconnector.done():
            self._reconnector = asyncio.get_running_loop().create_task(
                self._reconnect(error), name="agentix-reconnect"
            )

    def _fail_pending(
        self, message: str, cause: BaseException | None, kind: type[Exception] = RuntimeUnreachable
    ) -> None:
        lost = list(self._pending.values())
        self._pending.clear()
        for call in lost:
            failure = kind(message)
            if cause is not None:
                failure.__cause__ = cause
            call.fail(failure)

    async def _reconnect(self, error: BaseException | None) -> None:
        """Opens a new stream (which resumes the pending calls), retrying
        with backoff; fails the pending calls when every attempt failed."""
        attempt = 0
        last: BaseException | None = error
        while self._pending:
            stream = self._stream
            if stream is not None and stream.alive:
                return  # a new call reconnected meanwhile (and resumed them)
            try:
                await self._live_stream()
                _log.info("reconnected to %s; resumed %d call(s)", self.base_url, len(self._pending))
                return
            except Unauthenticated as failure:  # the same token would be refused again
                self._fail_pending(str(failure), failure, Unauthenticated)
                return
            except (RuntimeUnreachable, OSError, grpc.aio.AioRpcError) as failure:
                last = failure
            attempt += 1
            if self._reconnect_attempts and attempt >= self._reconnect_attempts:
                self._fail_pending(
                    f"runtime server connection lost: {self.base_url} "
                    f"(reconnecting failed {attempt} times; last: {last})",
                    last,
                )
                return
            await asyncio.sleep(self._backoff(attempt))
