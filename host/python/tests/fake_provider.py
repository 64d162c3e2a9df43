"""An in-process stand-in for agentix-providerd's ProviderService, for client tests.

It follows the proto's semantics where the Python client depends on them:
idempotent CreateSandbox on request_id (a replay answers replayed=true, another
payload INVALID_ARGUMENT / REQUEST_ID_REUSED), errors as codes with
"agentix-error-reason" / "agentix-retry-after-ms" trailing metadata, paged
lists with the snapshot's resource version and epoch, watches that resume from
(epoch, resource_version) out of a bounded history and answer OUT_OF_RANGE
beyond it, long-poll waits, idempotent deletes, logs with offsets, pools and
bearer-token auth. Sandboxes are records only (no processes). Tests steer it
through its attributes (`faults`, `drop_response_after_create`, ...).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

import grpc

from agentix.provider.v1 import provider_pb2 as pb
from agentix.provider.v1 import provider_pb2_grpc as pb_grpc

REASON = "agentix-error-reason"
RETRY_AFTER = "agentix-retry-after-ms"


@dataclass
class Fault:
    """Answer the next call of `method` with `code` (and reason, retry-after)."""

    method: str
    code: grpc.StatusCode
    reason: str = ""
    retry_after_ms: int | None = None
    message: str = "injected"


async def _abort(context, code, reason, message, retry_after_ms=None):
    trailing = [(REASON, reason)] if reason else []
    if retry_after_ms is not None:
        trailing.append((RETRY_AFTER, str(retry_after_ms)))
    await context.abort(code, message, trailing_metadata=tuple(trailing))


def _matches(selector: str, labels) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _valid_selector(selector: str) -> bool:
    return all(term.strip() and " " not in term.strip() for term in selector.split(",")) if selector else True


class FakeProviderService(pb_grpc.ProviderServiceServicer):
    def __init__(self, *, token: str | None = None, history: int = 64) -> None:
        self.token = token
        self.epoch = secrets.token_hex(4)
        self.version = 0
        self.records: dict[str, pb.Sandbox] = {}
        self.tokens: dict[str, str] = {}
        self.requests: dict[str, tuple[bytes, str]] = {}  # request_id -> (payload, sandbox id)
        self.history: list[pb.SandboxEvent] = []
        self.history_size = history
        self.watchers: list[asyncio.Queue] = []
        self.logs: dict[str, bytes] = {}
        self.pools: dict[str, pb.WarmPool] = {}
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, object]] = []  # (method, request) of every call
        self.metadata_seen: list[dict] = []
        # Create the sandbox, then answer UNAVAILABLE, this many times (a dropped response).
        self.drop_response_after_create = 0
        # Watch streams re-send this many already-delivered events on (re)connect.
        self.redeliver = 0
        # StreamSandboxLogs answers in pieces of this many bytes; drops the stream once after `drop_logs_after` bytes.
        self.log_piece = 4
        self.drop_logs_after: int | None = None
        self.counter = 0
        self.endpoint_prefix = "unix:///tmp/fake-providerd"
        self.pids_limit = False  # what GetCapabilities says of the local backend
        self.ready_delay = 0.0  # seconds a first CreateSandbox takes after making the record

    def creates(self) -> list:
        """The CreateSandbox requests received, in order."""
        return [request for method, request in self.calls if method == "CreateSandbox"]

    def deletes(self) -> list:
        """The DeleteSandbox requests received, in order."""
        return [request for method, request in self.calls if method == "DeleteSandbox"]

    def assert_deleted_once(self, sandbox_id: str, grace_s: float) -> None:
        """Fails unless one DeleteSandbox came, for `sandbox_id` with `grace_s`
        seconds of grace, and left it TERMINATED."""
        (delete,) = self.deletes()
        assert delete.id == sandbox_id and delete.grace.ToTimedelta().total_seconds() == grace_s
        assert self.records[sandbox_id].status.phase == pb.SandboxStatus.TERMINATED

    # ---------------------------------------------------------------- helpers

    async def _enter(self, method, request, context) -> None:
        self.calls.append((method, request))
        metadata = {key: value for key, value in context.invocation_metadata()}
        self.metadata_seen.append(metadata)
        if self.token is not None and metadata.get("authorization") != f"Bearer {self.token}":
            await _abort(
                context, grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED", "a valid bearer token is required"
            )
        for fault in self.faults:
            if fault.method == method:
                self.faults.remove(fault)
                await _abort(context, fault.code, fault.reason, fault.message, fault.retry_after_ms)

    def _emit(self, kind, record: pb.Sandbox) -> None:
        self.version += 1
        record.resource_version = self.version
        event = pb.SandboxEvent(type=kind, sandbox=record, resource_version=self.version, epoch=self.epoch)
        self.history.append(event)
        del self.history[: -self.history_size]
        for queue in self.watchers:
            queue.put_nowait(event)

    def set_phase(self, sandbox_id: str, phase, exit_reason=0, log_tail: str = "") -> pb.Sandbox:
        record = self.records[sandbox_id]
        record.status.phase = phase
        if exit_reason:
            record.status.exit.reason = exit_reason
            record.status.exit.log_tail = log_tail
        self._emit(pb.SandboxEvent.MODIFIED, record)
        return record

    def restart(self) -> None:
        """A new epoch (as after a providerd restart): old resource versions are void."""
        self.epoch = secrets.token_hex(4)
        self.history.clear()

    def drop_watches(self) -> None:
        """Ends every open watch stream with UNAVAILABLE."""
        for queue in self.watchers:
            queue.put_nowait(None)

    # ----------------------------------------------------------------- RPCs

    async def CreateSandbox(self, request, context):
        await self._enter("CreateSandbox", request, context)
        if not request.request_id:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SPEC", "request_id is required")
        payload = pb.CreateSandboxRequest()
        payload.CopyFrom(request)
        payload.request_id = ""
        payload_bytes = payload.SerializeToString(deterministic=True)
        seen = self.requests.get(request.request_id)
        if seen is not None:
            if seen[0] != payload_bytes:
                await _abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, "REQUEST_ID_REUSED",
                    f"request_id {request.request_id} was used with another payload",
                )
            record = self.records[seen[1]]
            return pb.CreateSandboxResponse(
                sandbox=record, credentials=pb.Credentials(access_token=self.tokens[record.id]), replayed=True
            )
        spec = request.spec
        if spec.bundle.path.endswith("not-a-bundle"):
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "NOT_A_BUNDLE", f"{spec.bundle.path} is not a bundle"
            )
        if spec.resources.gpus:
            await _abort(
                context, grpc.StatusCode.FAILED_PRECONDITION, "LIMIT_NOT_ENFORCEABLE",
                "local backend has no GPU support",
            )
        if spec.image == "fail-start":
            await _abort(
                context, grpc.StatusCode.FAILED_PRECONDITION, "START_FAILED",
                "sandbox exited with code 3 before its runtime came up; its output ends with:\nboom",
            )
        if spec.image == "too-slow":
            await _abort(
                context, grpc.StatusCode.DEADLINE_EXCEEDED, "READY_TIMEOUT",
                "runtime not serving after 1s; its output ends with:\nstill starting",
            )
        if request.sandbox_id and request.sandbox_id in self.records:
            await _abort(context, grpc.StatusCode.ALREADY_EXISTS, "SANDBOX_ID_TAKEN", f"{request.sandbox_id} is taken")
        self.counter += 1
        sandbox_id = request.sandbox_id or f"sbx-{self.counter}"
        record = pb.Sandbox(id=sandbox_id, uid=secrets.token_hex(8), request_id=request.request_id, spec=spec)
        record.labels.update(request.labels)
        record.annotations.update(request.annotations)
        record.status.phase = pb.SandboxStatus.READY
        record.status.launch = pb.SandboxStatus.COLD
        record.status.endpoint.target = f"{self.endpoint_prefix}/{sandbox_id}.sock"
        self.records[sandbox_id] = record
        self.tokens[sandbox_id] = secrets.token_urlsafe(16)
        self.logs.setdefault(sandbox_id, f"log of {sandbox_id}\n".encode())
        self.requests[request.request_id] = (payload_bytes, sandbox_id)
        self._emit(pb.SandboxEvent.ADDED, record)
        await asyncio.sleep(self.ready_delay)  # made, not yet answered (a cancel here leaves it made)
        if self.drop_response_after_create:
            self.drop_response_after_create -= 1
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "", "connection reset (injected)")
        return pb.CreateSandboxResponse(
            sandbox=record, credentials=pb.Credentials(access_token=self.tokens[sandbox_id])
        )

    async def _record(self, sandbox_id, context) -> pb.Sandbox:
        record = self.records.get(sandbox_id)
        if record is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND, "SANDBOX_NOT_FOUND", f"sandbox {sandbox_id} not found")
        return record

    async def GetSandbox(self, request, context):
        await self._enter("GetSandbox", request, context)
        return await self._record(request.id, context)

    async def GetSandboxCredentials(self, request, context):
        await self._enter("GetSandboxCredentials", request, context)
        record = await self._record(request.id, context)
        if record.status.phase == pb.SandboxStatus.TERMINATED:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "SANDBOX_TERMINATED", "terminated")
        return pb.Credentials(access_token=self.tokens[request.id])

    async def ListSandboxes(self, request, context):
        await self._enter("ListSandboxes", request, context)
        if not _valid_selector(request.label_selector):
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_LABEL_SELECTOR",
                f"cannot parse label selector {request.label_selector!r}",
            )
        found = [
            record for record in self.records.values()
            if _matches(request.label_selector, record.labels)
            and (request.include_terminated or record.status.phase != pb.SandboxStatus.TERMINATED)
            and (not request.phases or record.status.phase in request.phases)
        ]
        start = int(request.page_token or 0)
        size = request.page_size or 100
        page = found[start:start + size]
        following = str(start + size) if start + size < len(found) else ""
        return pb.ListSandboxesResponse(
            sandboxes=page, next_page_token=following, resource_version=self.version, epoch=self.epoch
        )

    async def WatchSandboxes(self, request, context):
        await self._enter("WatchSandboxes", request, context)
        if request.resource_version:
            oldest = self.history[0].resource_version if self.history else self.version + 1
            if request.epoch != self.epoch or request.resource_version < oldest - 1:
                await _abort(
                    context, grpc.StatusCode.OUT_OF_RANGE, "RESOURCE_VERSION_TOO_OLD",
                    f"resource version {request.resource_version} of epoch {request.epoch} cannot be resumed",
                )
        queue: asyncio.Queue = asyncio.Queue()
        self.watchers.append(queue)
        try:
            start = max(0, request.resource_version - self.redeliver)
            for event in list(self.history):
                if event.resource_version > start and _matches(request.label_selector, event.sandbox.labels):
                    yield event
            while True:
                event = await queue.get()
                if event is None:
                    await _abort(context, grpc.StatusCode.UNAVAILABLE, "", "watch stream dropped (injected)")
                if _matches(request.label_selector, event.sandbox.labels):
                    yield event
        finally:
            self.watchers.remove(queue)

    async def WaitSandbox(self, request, context):
        await self._enter("WaitSandbox", request, context)
        record = await self._record(request.id, context)
        until = request.until or pb.SandboxStatus.READY
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(55.0, request.timeout.ToTimedelta().total_seconds())
        while True:
            phase = record.status.phase
            if phase == until or (phase > until and until != pb.SandboxStatus.READY):
                return pb.WaitSandboxResponse(sandbox=record, reached=True)
            if phase == pb.SandboxStatus.READY and until == pb.SandboxStatus.READY:
                return pb.WaitSandboxResponse(sandbox=record, reached=True)
            if phase == pb.SandboxStatus.TERMINATED or loop.time() >= deadline:
                return pb.WaitSandboxResponse(sandbox=record, reached=False)
            await asyncio.sleep(0.01)

    async def ExtendSandbox(self, request, context):
        await self._enter("ExtendSandbox", request, context)
        record = await self._record(request.id, context)
        if record.status.phase == pb.SandboxStatus.TERMINATED:
            await _abort(
                context, grpc.StatusCode.FAILED_PRECONDITION, "SANDBOX_TERMINATED", f"{request.id} is terminated"
            )
        record.status.expire_time.FromSeconds(1_000_000 + request.ttl.seconds)
        self._emit(pb.SandboxEvent.MODIFIED, record)
        return record

    async def DeleteSandbox(self, request, context):
        await self._enter("DeleteSandbox", request, context)
        record = self.records.get(request.id)
        if record is None:
            if request.allow_missing:
                return pb.DeleteSandboxResponse()
            await _abort(context, grpc.StatusCode.NOT_FOUND, "SANDBOX_NOT_FOUND", f"sandbox {request.id} not found")
        if record.status.phase != pb.SandboxStatus.TERMINATED:
            record.status.phase = pb.SandboxStatus.TERMINATED
            record.status.exit.reason = pb.Exit.DELETED
            self._emit(pb.SandboxEvent.MODIFIED, record)
        return pb.DeleteSandboxResponse(sandbox=record)

    async def StreamSandboxLogs(self, request, context):
        await self._enter("StreamSandboxLogs", request, context)
        await self._record(request.id, context)
        data = self.logs.get(request.id, b"")
        offset = request.offset
        while offset < len(data):
            if self.drop_logs_after is not None and offset >= self.drop_logs_after:
                self.drop_logs_after = None
                await _abort(context, grpc.StatusCode.UNAVAILABLE, "", "log stream dropped (injected)")
            piece = data[offset:offset + self.log_piece]
            yield pb.LogChunk(offset=offset, data=piece)
            offset += len(piece)

    async def CreateWarmPool(self, request, context):
        await self._enter("CreateWarmPool", request, context)
        if request.pool.name in self.pools:
            await _abort(context, grpc.StatusCode.ALREADY_EXISTS, "POOL_EXISTS", f"pool {request.pool.name} exists")
        pool = pb.WarmPool()
        pool.CopyFrom(request.pool)
        pool.status.ready = pool.min_ready
        pool.status.total = pool.min_ready
        self.pools[pool.name] = pool
        return pool

    async def UpdateWarmPool(self, request, context):
        await self._enter("UpdateWarmPool", request, context)
        if request.pool.name not in self.pools:
            await _abort(context, grpc.StatusCode.NOT_FOUND, "POOL_NOT_FOUND", f"no pool {request.pool.name}")
        self.pools[request.pool.name].CopyFrom(request.pool)
        return self.pools[request.pool.name]

    async def GetWarmPool(self, request, context):
        await self._enter("GetWarmPool", request, context)
        if request.name not in self.pools:
            await _abort(context, grpc.StatusCode.NOT_FOUND, "POOL_NOT_FOUND", f"no pool {request.name}")
        return self.pools[request.name]

    async def ListWarmPools(self, request, context):
        await self._enter("ListWarmPools", request, context)
        return pb.ListWarmPoolsResponse(pools=list(self.pools.values()))

    async def DeleteWarmPool(self, request, context):
        await self._enter("DeleteWarmPool", request, context)
        if request.name not in self.pools and not request.allow_missing:
            await _abort(context, grpc.StatusCode.NOT_FOUND, "POOL_NOT_FOUND", f"no pool {request.name}")
        self.pools.pop(request.name, None)
        return pb.DeleteWarmPoolResponse()

    async def GetCapabilities(self, request, context):
        await self._enter("GetCapabilities", request, context)
        return pb.Capabilities(
            backends=[pb.BackendCapabilities(name="local", memory_limit=True, pids_limit=self.pids_limit)],
            default_backend="local", version="fake", instance="fake",
        )


async def serve_provider(service: FakeProviderService, socket_path) -> grpc.aio.Server:
    """Serves `service` on ``unix://<socket_path>``; returns the started server."""
    server = grpc.aio.server()
    pb_grpc.add_ProviderServiceServicer_to_server(service, server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    return server


class FakeSpawn:
    """Stands in for ``agentix.provider.local.spawn_providerd`` (monkeypatch
    it in; it is called off the event loop): records each call's (socket,
    log, flags, detach) in `calls` and serves a new FakeProviderService on
    the socket, as the providerd it would start; `services` and `servers`
    hold them in order. `delay`: seconds to take first (a real start takes a
    while); `unlink`: remove a stale socket file first (providerd does, under
    its lock); `returns`: makes the call's result (None: a detached one)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, delay: float = 0.0, unlink: bool = False,
                 returns: Callable[[], Any] | None = None) -> None:
        self.loop = loop
        self.delay = delay
        self.unlink = unlink
        self.returns = returns
        self.calls: list[tuple] = []
        self.services: list[FakeProviderService] = []
        self.servers: list[grpc.aio.Server] = []

    def __call__(self, socket, log, flags, *, detach, timeout=30.0, binary=None):
        self.calls.append((socket, log, list(flags), detach))
        time.sleep(self.delay)
        if self.unlink:
            socket.unlink(missing_ok=True)
        service = FakeProviderService()
        server = asyncio.run_coroutine_threadsafe(serve_provider(service, socket), self.loop).result()
        self.services.append(service)
        self.servers.append(server)
        return self.returns() if self.returns else None

    async def stop(self) -> None:
        """Stops every server it started."""
        for server in self.servers:
            await server.stop(None)


async def serve_fake(directory) -> FakeProviderService:
    """A FakeProviderService served on ``<directory>/p.sock``, with `socket`,
    `url` and `server` set; stop it with ``await service.server.stop(None)``."""
    service = FakeProviderService()
    service.socket = directory / "p.sock"
    service.url = f"unix://{service.socket}"
    service.server = await serve_provider(service, service.socket)
    return service
