"""The host half of ``RuntimeService.Namespace``: one stream per plugin
namespace registered with a `RuntimeClient` (see
`agentix.runtime.client._sio_facade` for the plugin-facing classes)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from agentix.runtime.client._sio_facade import AsyncClientNamespace
from agentix.runtime.v1 import runtime_pb2 as pb

__all__ = ["NamespaceStream"]

# Seconds a new Namespace stream may take to be confirmed by the daemon.
OPEN_TIMEOUT = 10.0

_log = logging.getLogger("agentix.sio")


class NamespaceStream:
    """One open ``RuntimeService.Namespace`` stream: reads the sandbox's
    events into ``ns.trigger_event`` (in order, one at a time) and writes the
    host's events. Never raises into the client: a failure ends the stream
    (``alive`` False), delivers ``disconnect`` and is re-opened by the next
    call."""

    def __init__(self, rpc: grpc.aio.StreamStreamCall, ns: AsyncClientNamespace) -> None:
        self._rpc = rpc
        self.ns = ns
        self._write_lock = asyncio.Lock()
        self._opened: asyncio.Future = asyncio.get_running_loop().create_future()
        self._done = False
        self._task = asyncio.create_task(self._run(), name=f"agentix-namespace{ns.namespace}")

    @property
    def alive(self) -> bool:
        return not self._done

    async def wait_opened(self, timeout: float) -> None:
        """Waits for the daemon's confirmation. Raises ValueError when the
        daemon refuses the namespace, RuntimeError when the stream fails."""
        async with asyncio.timeout(timeout):
            await asyncio.shield(self._opened)

    async def send(self, event: str, payload: bytes, request_id: str, error: dict | None) -> None:
        message = pb.NamespaceEvent(event=event, data=payload, request_id=request_id)
        if error is not None:
            status = error.get("status_code")
            message.error.type = str(error.get("type", "Error"))
            message.error.message = str(error.get("message", ""))
            if isinstance(status, int) and not isinstance(status, bool) and -(2**31) <= status < 2**31:
                message.error.status_code = status
        async with self._write_lock:
            if self._done:
                raise RuntimeError(f"namespace {self.ns.namespace}: the stream to the sandbox is closed")
            await self._rpc.write(pb.NamespaceRequest(event=message))

    async def aclose(self) -> None:
        """Ends the stream; delivers ``disconnect``. Idempotent."""
        if self._done and self._task.done():
            return
        self._done = True
        self._rpc.cancel()
        if self._task is asyncio.current_task():
            return  # closed from inside a trigger: waiting would wait for itself
        await asyncio.gather(self._task, return_exceptions=True)

    def _open_timed_out(self) -> None:
        if not self._opened.done():
            _log.debug("namespace %s: no answer to OpenNamespace within %ss; re-opened by the next call",
                       self.ns.namespace, OPEN_TIMEOUT)
            self._rpc.cancel()
            self._task.cancel()  # the stuck write may not notice the RPC's cancellation

    async def _run(self) -> None:
        ns = self.ns
        connected = False
        # A stream opened while its connection is being cut was seen to hang
        # in its first write for ever; the client re-opens streams that end,
        # so one that does not open in time is ended.
        watchdog = asyncio.get_running_loop().call_later(OPEN_TIMEOUT, self._open_timed_out)
        try:
            await self._rpc.write(pb.NamespaceRequest(open=pb.OpenNamespace(namespace=ns.namespace)))
            read = self._rpc.read  # cheaper than the call's async iterator
            while (response := await read()) is not grpc.aio.EOF:
                if response.opened:
                    if not self._opened.done():
                        self._opened.set_result(None)
                    connected = True
                    await self._trigger("connect")
                for event in response.events:
                    if self._done:  # a trigger closed the stream
                        break
                    await self._trigger(event.event, event.data)
        except asyncio.CancelledError:
            pass
        except grpc.aio.AioRpcError as error:
            if not self._opened.done():
                kind = ValueError if error.code() == grpc.StatusCode.INVALID_ARGUMENT else RuntimeError
                self._opened.set_exception(
                    kind(f"namespace {ns.namespace}: the sandbox refused it: {error.code().name}: {error.details()}")
                )
                await self._trigger("connect_error", {"message": error.details()})
            elif not self._done:
                _log.warning(
                    "namespace %s: stream to the sandbox lost (%s: %s); re-opened by the next call",
                    ns.namespace,
                    error.code().name,
                    error.details(),
                )
        except Exception:
            _log.exception("namespace %s: stream failed; re-opened by the next call", ns.namespace)
        finally:
            watchdog.cancel()
            self._done = True
            if not self._opened.done():
                self._opened.set_exception(RuntimeError(f"namespace {ns.namespace}: stream ended before it opened"))
            # Retrieved here so an unawaited failure is not reported as lost.
            self._opened.exception()
            if connected:
                await self._trigger("disconnect")

    async def _trigger(self, event: str, *args: Any) -> None:
        try:
            await self.ns.trigger_event(event, *args)
        except Exception:
            _log.exception("namespace %s: handling event %r raised", self.ns.namespace, event)
