"""`RuntimeClient`: runs functions inside a sandbox over ``RuntimeService``.

One gRPC channel and one ``Calls`` stream per client carry every call
(`agentix.runtime.client.stream`); on a ``unix://`` target whose daemon has a frame wire, the
Calls stream runs on it instead of gRPC (`agentix.runtime.client.frames`). The channel is opened
by ``async with`` or by the first `remote()` / `health()`; connecting is verified with a
``GetInfo`` probe, so an address that refuses connections fails at once with
`RuntimeUnreachable` and a silent one fails after ``timeout`` seconds.

If the stream ends or breaks while calls are in flight, the client reconnects by itself (with
backoff, see `RuntimeClient`) and resumes them on a new stream: it sends each call's StartCall
again (the daemon runs a call_id at most once and refuses to re-run a finished one) and
``ResumeCalls``, and the daemon replays what they produced; streamed items and result chunks that
arrive twice are dropped. A call's arguments are kept for this until the daemon's first result
chunk or stream item of it (it ran, so it had them all), whatever their size: an upload cut
mid-way is sent again from the start (the daemon skips the bytes it has, by
``ArgumentChunk.offset``) instead of leaving the call waiting for bytes that never come. When
reconnecting fails, or with ``reconnection=False``, pending calls fail with `RuntimeUnreachable`.
A call made while a lost connection is down reconnects under the same policy, so a cut that also
breaks its first reconnect does not fail it.

Beside the Calls stream run the ``Logs`` and ``Traces`` feeds (`agentix.runtime.client.feeds`)
and one ``Namespace`` stream per registered plugin namespace (`agentix.runtime.client.namespaces`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable
from typing import Any, ParamSpec, TypeVar, overload

import grpc

from agentix.runtime.client.errors import (CallTimeout, RemoteCallError, RuntimeUnreachable, Unauthenticated,
                                           remote_call_error_async)
from agentix.runtime.client.bundle_check import BundleCheck
from agentix.runtime.client.logs import LogCursor, LogsStream
from agentix.runtime.client._sio_facade import AsyncClientNamespace
from agentix.runtime.client.chunking import CHUNK_BYTES
from agentix.runtime.client.channels import (CheckedChannel, NativeTransport, bounded, close_channel, open_channel,
                                             unreachable)
from agentix.runtime.client.frames import FrameWire
from agentix.runtime.client.payload_ring import native_copy, native_prefault
from agentix.runtime.client.feeds import Feed, ensure_feeds, reopen_lost_feeds, settle_feeds, wait_barrier
from agentix.runtime.client.namespaces import NamespaceSet, NamespaceStream, NativeNamespaceStream
from agentix.runtime.client.reconnect import ReconnectPolicy
from agentix.runtime.client.result import Failed, Ok, Result
from agentix.runtime.client.pending import MAX_RESULT_BYTES, STREAM_END, CallFuture, PendingCall, SideBarrier, StartRequest
from agentix.runtime.client.stream import CallsStream
from agentix.runtime.client import wire
from agentix.runtime.client.target import grpc_target
from agentix.runtime.client.tls import TlsFiles
from agentix.runtime.client.traces import TraceCursor, TracesStream
from agentix.runtime.shared.callables import named_target
from agentix.runtime.shared.ids import UniqueIds
from agentix.runtime.shared.running_loop import running_loop
from agentix.runtime.shared.models import HealthResponse, RemoteError
from agentix.runtime.shared.safepickle import DecodeBusy, restricted_loads, restricted_loads_chunks
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc

__all__ = ["RuntimeClient"]

_log = logging.getLogger("agentix.runtime.client")

R = TypeVar("R")
Y = TypeVar("Y")
# remote/try_remote/remote_stream are typed so that a checker sees the
# target's parameters and result: `remote(add, 1, 2)` is an int, and
# `remote(add, "x")` an error (docs/CLI.md, "Typed API").
P = ParamSpec("P")

# Shortest interval between attempts to re-open a lost Logs or Traces stream.
_FEED_REOPEN_SECONDS = 1.0
# How long close() waits for queued cancels to reach the daemon, and at
# most for the Logs/Traces streams to go quiet (_CLOSE_QUIET_SECONDS without
# a record: the daemon holds one back at most 4 ms).
_CLOSE_FLUSH_SECONDS = 1.0
_CLOSE_QUIET_SECONDS = 0.03


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


class RuntimeClient:
    """Client of one sandbox runtime (``agentix-sandboxd``).

    Args:
      base_url: ``unix:///abs/path.sock``, ``host:port``, ``http://host:port``
        or ``https://host:port`` (TLS; see `tls_ca_file`); anything else is a
        ValueError here (see `agentix.runtime.client.target.grpc_target`).
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
        self._reconnection = ReconnectPolicy(
            reconnection, reconnection_attempts, reconnection_delay, reconnection_delay_max, randomization_factor
        )
        self.reconnection_options = self._reconnection.options
        self._reconnect_enabled = self._reconnection.enabled
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
        self._tls = TlsFiles(base_url, tls_ca_file, tls_cert_file, tls_key_file, tls_server_name)
        self._channel: grpc.aio.Channel | None = None
        self.checked_channel: CheckedChannel | None = None  # a provider's, for the first connection (Sandbox.client)
        self._channel_broken = False
        # With the native transport, the Calls stream runs on a grpc++ channel
        # to the same target, made and replaced together with `_channel`.
        self._native = NativeTransport()
        # On a unix:// target the Calls stream runs on the daemon's frame
        # wire when it has one (AGENTIX_CALLS_WIRE; agentix.runtime.client.frames).
        self._frames = FrameWire(self._target, self._tls.enabled)
        self._stream: CallsStream | None = None
        self._pending: dict[str, PendingCall] = {}
        self._connect_lock = asyncio.Lock()
        self.logs = logs
        self.traces = traces
        self._feeds = (Feed("logs", LogsStream, LogCursor()), Feed("traces", TracesStream, TraceCursor()))
        self._namespaces = NamespaceSet(base_url, self._namespace_stream, self._live_stream, self._reopen_namespaces)
        self._connected_once = False

    @property
    def _logs(self) -> LogsStream | None:
        """The current Logs stream (None before the first connection or after close())."""
        return self._feeds[0].stream

    @property
    def _traces(self) -> TracesStream | None:
        """The current Traces stream (None before the first connection or after close())."""
        return self._feeds[1].stream

    @property
    def _namespace_streams(self) -> dict[str, NamespaceStream | NativeNamespaceStream]:
        """The current stream of each registered namespace, by path (diagnostics and tests)."""
        return self._namespaces.streams

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
        self._namespaces.register(ns, self)
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
        display_name, callable_ref = named_target(fn)
        if self._bundle_check is not None:
            self._bundle_check.check(callable_ref)
        # In pieces when large: a big bytes argument is not copied into the pickle.
        arguments = wire.pickle_arguments(args, kwargs, CHUNK_BYTES)
        carrier = wire.context_carrier()
        stream = self._stream_now() or await self._stream_for_call()

        # Registering and starting happen without yielding to the loop right after
        # _live_stream() saw the stream alive, so a loss cannot slip in between.
        loop = running_loop()  # asyncio.get_running_loop() without its getpid()
        call = PendingCall(
            _call_ids.next(),
            display_name,
            # Alone in flight: resumed by the callback that reads its result (no loop turn of its
            # own); among others, one loop turn resumes many and a plain Future is cheaper to await.
            loop.create_future() if self._pending else CallFuture(loop=loop),
            start=StartRequest(callable_ref, arguments, carrier, 0),  # (_start_request's, without its call)
            max_result_bytes=self.max_result_bytes,
        )
        self._pending[call.call_id] = call
        waits = self._frames.waits  # AGENTIX_CALLS_CPU=wait: pinned while it waits alone
        if waits is not None:
            waits.hold()
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
            if waits is not None:
                waits.release()  # disarmed before the caller's code runs
            self._pending.pop(call.call_id, None)
            if call.future.cancelled():  # local cancellation or deadline
                stream.cancel_call(call.call_id)

        if call.barrier is not None:
            await self._side_barrier(call.barrier)
        if type(outcome) is not bytes:  # (the common case: one check)
            if isinstance(outcome, RemoteError):
                raise await remote_call_error_async(display_name, outcome)
            if isinstance(outcome, list):
                # consume: ring pieces are released once nothing refers to them (docs/FRAME-WIRE.md)
                return await asyncio.get_running_loop().run_in_executor(None, lambda: restricted_loads_chunks(outcome, copy=native_copy(), consume=True, prefault=native_prefault()))
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
        display_name, callable_ref = named_target(fn)
        if self._bundle_check is not None:
            self._bundle_check.check(callable_ref)
        # In pieces when large: a big bytes argument is not copied into the pickle.
        arguments = wire.pickle_arguments(args, kwargs, CHUNK_BYTES)
        carrier = wire.context_carrier()
        stream = self._stream_now() or await self._stream_for_call()

        loop = asyncio.get_running_loop()
        call = PendingCall(
            _call_ids.next(),
            display_name,
            loop.create_future(),
            streaming=True,
            start=StartRequest(callable_ref, arguments, carrier, self.stream_window),
            max_result_bytes=self.max_result_bytes,
        )
        self._pending[call.call_id] = call
        waits = self._frames.waits  # in flight, never pinned: user code runs between items
        if waits is not None:
            waits.hold(pin=False)
        window = self.stream_window
        # Not asyncio.timeout(): it would cancel whatever the consumer runs
        # between items, outside this generator.
        deadline_at = None if self.call_deadline is None else loop.time() + self.call_deadline
        consumed = acked = 0
        finished = False
        items = call.items
        assert items is not None  # a streaming PendingCall has its queue
        try:
            stream.start_call(call.call_id, callable_ref, arguments, carrier, stream_window=window)
            while True:
                if deadline_at is None:
                    item = await items.get()
                else:
                    try:
                        item = await asyncio.wait_for(items.get(), max(0.0, deadline_at - loop.time()))
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
            if waits is not None:
                waits.release()
            self._pending.pop(call.call_id, None)
            if not finished and not call.future.done():
                # The consumer stopped early, or the deadline passed.
                call.future.cancel()
                stream.cancel_call(call.call_id)
        if isinstance(outcome, RemoteError):
            raise await remote_call_error_async(display_name, outcome)

    async def _side_barrier(self, barrier: SideBarrier) -> None:
        """Waits until the log records and trace events `barrier` names have been handed to the
        host's logging and trace processors (bounded: see `feeds.BARRIER_IDLE_SECONDS`)."""
        await wait_barrier(self._feeds, barrier.log_seq, barrier.trace_seq)

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
        """Asks the runtime for its status and version. Raises `RuntimeUnreachable` when it
        cannot be reached within `timeout`, `Unauthenticated` when it refuses the token."""
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
            raise unreachable(error, self.base_url) from error

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
        await settle_feeds(self._feeds, _CLOSE_QUIET_SECONDS, _CLOSE_FLUSH_SECONDS)  # replay what came before close()
        stream, self._stream = self._stream, None
        channel, self._channel = self._channel, None
        self._native.channel = None
        feeds = [feed.detach() for feed in self._feeds]
        in_flight = list(self._pending.values())
        self._pending.clear()
        for call in in_flight:
            call.fail(RuntimeUnreachable(f"runtime client closed with remote call '{call.display_name}' in flight: "
                                         f"{self.base_url}"))
        if stream is not None:
            await stream.aclose([call.call_id for call in in_flight], _CLOSE_FLUSH_SECONDS)
        for feed_stream in feeds:
            if feed_stream is not None:
                await feed_stream.aclose()
        for namespace_stream in self._namespaces.take_streams():
            await bounded(namespace_stream.aclose(), "closing a namespace stream")
        if channel is not None:
            await close_channel(channel)

    def _stream_now(self) -> CallsStream | None:
        """The open Calls stream, or None (`_live_stream` connects); no coroutine per call."""
        stream = self._stream
        if stream is None or not stream.alive:
            return None
        if (channel := self._channel) is not None:
            reopen_lost_feeds(self._feeds, self, channel, self._metadata, _FEED_REOPEN_SECONDS)
            namespaces = self._namespaces
            if namespaces.registered and not namespaces.alive():
                now = asyncio.get_running_loop().time()
                if now - namespaces.reopened_at >= _FEED_REOPEN_SECONDS:
                    namespaces.reopened_at = now
                    namespaces.open(channel)  # not awaited: calls go on
        return stream

    async def _live_stream(self) -> CallsStream:
        """Returns the open Calls stream, connecting first if there is none."""
        if (stream := self._stream_now()) is not None:
            return stream
        async with self._connect_lock:
            if self._stream is None or not self._stream.alive:
                channel = await self._ready_channel()
                self._connected_once = True
                stream = self._stream = self._frames.calls_stream(
                    self._native, channel, self._metadata, self._pending, self._stream_lost
                )
                if self._pending:  # calls of a lost stream: re-attach them
                    stream.resume(list(self._pending.values()))
                if self._orphan_acks:
                    stream.ack_results(self._orphan_acks)
                    self._orphan_acks = []
                ensure_feeds(self._feeds, self, channel, self._metadata)
                # Events the sandbox emits during the first call must find
                # the host's namespaces open: wait for the daemon's answer.
                await self._namespaces.confirm(self._namespaces.open(channel), min(self.timeout, _CONFIRM_SECONDS))
                # The stream may be lost during that wait; its _stream_lost then
                # started no reconnect if this is one, so this one must retry.
                if self._stream is not stream or not stream.alive:
                    raise RuntimeUnreachable(f"runtime server connection lost while connecting: {self.base_url}")
            return self._stream

    async def _stream_for_call(self) -> CallsStream:
        """`_live_stream` for a new call (after a lost connection: `_reconnect_for_call`)."""
        lost = self._channel_broken
        try:
            return await self._live_stream()
        except (RuntimeUnreachable, OSError, grpc.aio.AioRpcError) as failure:
            if not (lost and self._reconnect_enabled):
                raise
            return await self._reconnect_for_call(failure)

    async def _reconnect_for_call(self, failure: BaseException) -> CallsStream:
        """The Calls stream for a new call whose first reconnect, after the
        connection was lost, failed with `failure`: retried under the
        reconnection policy (as for the calls in flight when it broke), so a
        cut during the GetInfo probe does not cost the call (see
        `ReconnectPolicy.retry`)."""
        return await self._reconnection.retry(self._live_stream, failure)

    def _namespace_stream(
        self, channel: grpc.aio.Channel, ns: AsyncClientNamespace
    ) -> NamespaceStream | NativeNamespaceStream:
        """A new Namespace stream for `ns`, on the wire the Calls stream's
        choice picks (`FrameWire.namespace_stream`)."""
        return self._frames.namespace_stream(self._native, channel, self._metadata, ns)

    async def _reopen_namespaces(self) -> None:
        """Re-opens and confirms the namespaces' lost streams (a plugin's
        emit found its stream down after the Calls stream was re-opened)."""
        async with self._connect_lock:
            channel = await self._ready_channel()
            await self._namespaces.confirm(self._namespaces.open(channel), min(self.timeout, _CONFIRM_SECONDS))

    async def _ready_channel(self) -> grpc.aio.Channel:
        """Returns a usable channel, replacing one that is known broken and
        probing a new one with GetInfo. Caller holds ``_connect_lock``."""
        channel = self._channel
        if channel is not None and not self._channel_broken:
            if channel.get_state() not in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
                return channel
        self._channel = None
        self._native.channel = None
        if channel is not None:
            await close_channel(channel)

        try:
            defer = self._frames.preferred()  # NativeTransport.defer; Namespace streams ride the frame wire too
            channel = await open_channel(
                self._target, self._tls, self._native, self.timeout, self._metadata, defer, self.checked_channel
            )
        except grpc.aio.AioRpcError as error:
            raise unreachable(error, self.base_url) from error
        self._channel = channel
        self._channel_broken = False
        return channel

    @staticmethod
    def _start_request(
        callable_ref: str, arguments: bytes | wire.Pieces, context: bytes, stream_window: int
    ) -> StartRequest:
        # Kept whatever the size, until the daemon shows it had the arguments
        # (routing drops it): a large call cut mid-upload would otherwise be
        # resumed without its missing bytes and wait out --upload-idle-timeout-s.
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
            if self._reconnection.exhausted(attempt):
                self._fail_pending(
                    f"runtime server connection lost: {self.base_url} "
                    f"(reconnecting failed {attempt} times; last: {last})",
                    last,
                )
                return
            await asyncio.sleep(self._reconnection.backoff(attempt))
