"""`ServiceProvider`: a client of the provider service, ``agentix-providerd``.

The service (proto ``agentix.provider.v1.ProviderService``, see
docs/PROVIDERS.md) owns the sandboxes: any process holding its address (and
token) can create, list, watch, reach and delete them. This class gives it the
`SandboxProvider` API (`create`, `get`, `delete`, `session`) plus the
service's own operations (`list`, `watch`, `wait`, `extend`, `logs`, warm
pools, `capabilities`)::

    provider = ServiceProvider("unix:///run/user/1000/agentix/providerd.sock")
    async with provider.session(SandboxConfig(image="host", bundle="/path/to/bundle")) as sandbox:
        print(await sandbox.remote(my_module.my_function, 1, 2))

`SandboxConfig` maps onto the service's ``SandboxSpec`` one to one (`spec_from_config`).
Every `create` carries a fresh UUID ``request_id`` and retries UNAVAILABLE,
DEADLINE_EXCEEDED (not a sandbox's own READY_TIMEOUT), RESOURCE_EXHAUSTED
(after ``agentix-retry-after-ms``) and ABORTED with that same id, a bounded
number of times: the service makes such a retry return the sandbox the first
attempt made, never a second one. A cancelled `create` replays its request in
the background and deletes what it returns. Errors are
`agentix.provider.errors` classes.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
import random
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentix.provider._sizes import parse_memory
from agentix.provider.base import Sandbox, SandboxConfig, SandboxId, SandboxInfo, SandboxProvider
from agentix.provider.errors import (
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    SandboxStartFailed,
    SandboxTerminated,
    from_rpc_error,
)

if TYPE_CHECKING:
    import grpc

    from agentix.provider.v1 import provider_pb2 as pb
    # For annotations inside functions whose local `pb` (`_pb()`) hides the module.
    from agentix.provider.v1.provider_pb2 import Sandbox as _SandboxRecord, SandboxEvent as _SandboxEvent

__all__ = ["TOKEN_ENV", "URL_ENV", "ServiceProvider", "runtime_url", "spec_from_config"]

_log = logging.getLogger(__name__)

URL_ENV = "AGENTIX_PROVIDER_URL"
TOKEN_ENV = "AGENTIX_PROVIDER_TOKEN"
# Codes after which CreateSandbox is retried with the same request_id.
_CREATE_RETRY = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"})
# Codes after which an idempotent read or delete is retried.
_READ_RETRY = frozenset({"UNAVAILABLE"})
_PHASE_NAMES = ("PENDING", "STARTING", "READY", "TERMINATING", "TERMINATED")
# What the server caps one WaitSandbox at.
_WAIT_SLICE = 55.0


def _pb() -> Any:
    from agentix.provider.v1 import provider_pb2

    return provider_pb2


def _duration(seconds: float | None) -> Any:
    from google.protobuf import duration_pb2

    if seconds is None:
        return None
    if seconds < 0:
        raise ValueError(f"a duration must be >= 0 seconds (got {seconds})")
    whole = int(seconds)
    return duration_pb2.Duration(seconds=whole, nanos=int(round((seconds - whole) * 1e9)))


def spec_from_config(
    config: SandboxConfig,
    *,
    backend: str | None = None,
    ttl: float | None = None,
    idle_timeout: float | None = None,
    warm_pool: str | None = None,
    network: str | None = None,
    pids: int | None = None,
    scratch_bytes: int | str | None = None,
    nofile: int | None = None,
) -> pb.SandboxSpec:
    """The ``SandboxSpec`` for `config`: ``image``, ``bundle`` (a path on
    providerd's machine; a relative path that exists here is made absolute;
    ``oci-ref:REF`` for a bundle image reference), ``platform``, ``env`` and
    ``resource`` (``cpu`` cores → ``cpu_millis``, ``memory`` via
    `parse_memory` → ``memory_bytes``, ``gpu`` → ``gpus``). The keywords set
    the spec's other fields (``network``: ``"none"``, ``"host"`` or ``"bridge"``)."""
    if not isinstance(config, SandboxConfig):
        raise TypeError(f"a SandboxConfig is needed (got {type(config).__name__})")
    pb = _pb()
    spec = pb.SandboxSpec(image=config.image, platform=config.platform or "", backend=backend or "")
    bundle = config.bundle
    if bundle.startswith("oci-ref:"):
        spec.bundle.oci_reference = bundle[len("oci-ref:"):]
    else:
        if bundle and not os.path.isabs(bundle) and os.path.exists(os.path.expanduser(bundle)):
            bundle = os.path.abspath(os.path.expanduser(bundle))
        spec.bundle.path = bundle
    if config.env:
        spec.env.update(config.env)
    resource = config.resource
    if resource is not None:
        if resource.cpu is not None:
            spec.resources.cpu_millis = max(1, int(round(resource.cpu * 1000)))
        if resource.memory is not None:
            try:
                spec.resources.memory_bytes = parse_memory(resource.memory)
            except ValueError as error:
                raise ValueError(f"SandboxResource.memory: {error}") from None
        if resource.gpu is not None:
            spec.resources.gpus = resource.gpu
    if pids is not None:
        spec.resources.pids = pids
    if scratch_bytes is not None:
        spec.resources.scratch_bytes = parse_memory(scratch_bytes)
    if nofile is not None:
        spec.resources.nofile = nofile
    if network is not None:
        modes = {"none": pb.Network.NONE, "host": pb.Network.HOST, "bridge": pb.Network.BRIDGE}
        if network.lower() not in modes:
            raise ValueError(f"network must be 'none', 'host' or 'bridge' (got {network!r})")
        spec.network.mode = modes[network.lower()]
    if ttl is not None:
        spec.ttl.CopyFrom(_duration(ttl))
    if idle_timeout is not None:
        spec.idle_timeout.CopyFrom(_duration(idle_timeout))
    if warm_pool:
        spec.warm_pool = warm_pool
    return spec


def runtime_url(endpoint: pb.Endpoint) -> str:
    """A URL `agentix.RuntimeClient` accepts for a sandbox's endpoint: a
    ``unix:`` target as is; ``ipv4:H:P`` / ``ipv6:[H]:P`` / ``dns:///H:P`` as
    ``H:P`` (``https://H:P`` when the endpoint has TLS)."""
    target = endpoint.target
    if target.startswith("unix:"):
        return target
    for prefix in ("ipv4:", "ipv6:", "dns:///", "dns:"):
        if target.startswith(prefix):
            target = target[len(prefix):]
            break
    return f"https://{target}" if endpoint.tls else target


def phase_name(value: int) -> str:
    """``"READY"`` for ``SandboxStatus.READY`` (``"UNSPECIFIED"`` for 0)."""
    return _PHASE_NAMES[value - 1] if 1 <= value <= len(_PHASE_NAMES) else "UNSPECIFIED"


def _status_text(record: pb.Sandbox) -> str:
    """The old `SandboxInfo.status` shape: ``"running"`` when READY, else the
    phase in lower case; a terminated one says why (``"exited (1)"`` when its
    entry point ended by itself, ``"terminated (ttl_expired)"`` otherwise)."""
    pb = _pb()
    status = record.status
    if status.phase == pb.SandboxStatus.READY:
        return "running"
    if status.phase == pb.SandboxStatus.TERMINATED:
        if status.exit.reason == pb.Exit.COMPLETED:
            return f"exited ({status.exit.exit_code})"
        return f"terminated ({pb.Exit.Reason.Name(status.exit.reason).lower()})"
    return phase_name(status.phase).lower()


def _ended_error(record: pb.Sandbox, what: str) -> ProviderError:
    """The error for a sandbox that ended where it should be running."""
    pb = _pb()
    exit_ = record.status.exit
    reason = pb.Exit.Reason.Name(exit_.reason)
    message = f"{what}: sandbox {record.id} ended ({reason}"
    message += f", exit code {exit_.exit_code})" if exit_.exit_code else ")"
    if exit_.message:
        message += f": {exit_.message}"
    if exit_.log_tail:
        message += f"; its output ends with:\n{exit_.log_tail}"
    if exit_.reason == pb.Exit.READY_TIMEOUT:
        return ProviderTimeout(message, code="DEADLINE_EXCEEDED", reason="READY_TIMEOUT")
    if exit_.reason in (pb.Exit.START_FAILED, pb.Exit.OOM_KILLED):
        return SandboxStartFailed(message, code="FAILED_PRECONDITION", reason="START_FAILED")
    return SandboxTerminated(message, code="FAILED_PRECONDITION", reason="SANDBOX_TERMINATED")


class ServiceProvider(SandboxProvider):
    """A `SandboxProvider` backed by ``agentix-providerd`` (module docstring).

    Args:
      address: ``unix:///path/providerd.sock``, ``host:port``,
        ``http://host:port`` or ``https://host:port``.
      token: providerd's bearer token (None: ``$AGENTIX_PROVIDER_TOKEN``, if set).
      tls: use TLS (None: for ``https://`` addresses). ``tls_ca_file`` /
        ``tls_server_name`` pick the roots and the name checked.
      backend: the backend sandboxes go to ("" / None: the server's default).
      default_ttl: the ``ttl`` `create` passes when not given one (None: the
        server's, 300 s). A sandbox nobody deletes ends when it passes.
      ready_timeout: how long `create` lets a sandbox take to become READY
        (None: the server's, 120 s).
      labels: added to every sandbox this provider creates.
      create_attempts: how many times `create` sends one request (>= 1).
      rpc_timeout: seconds per unary call other than create and wait.
      max_retry_delay: the longest pause between two attempts.
    """

    def __init__(
        self,
        address: str,
        token: str | None = None,
        *,
        tls: bool | None = None,
        tls_ca_file: str | None = None,
        tls_server_name: str | None = None,
        backend: str | None = None,
        default_ttl: float | None = None,
        ready_timeout: float | None = None,
        labels: Mapping[str, str] | None = None,
        create_attempts: int = 6,
        rpc_timeout: float = 30.0,
        max_retry_delay: float = 5.0,
    ) -> None:
        from agentix.runtime.client.target import grpc_target, wants_tls

        self.address = address
        self._target = grpc_target(address)  # ValueError for an address it cannot use
        self.token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
        self.tls = (wants_tls(address) or tls_ca_file is not None) if tls is None else bool(tls)
        self.tls_ca_file = tls_ca_file
        self.tls_server_name = tls_server_name
        self.backend = backend or ""
        self.default_ttl = default_ttl
        self.ready_timeout = ready_timeout
        self.labels = dict(labels or {})
        if create_attempts < 1:
            raise ValueError(f"create_attempts must be >= 1 (got {create_attempts})")
        self.create_attempts = create_attempts
        self.rpc_timeout = rpc_timeout
        self.max_retry_delay = max_retry_delay
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._collectors: set[asyncio.Task[None]] = set()  # deletes after cancelled creates

    def __repr__(self) -> str:
        return f"ServiceProvider({self.address!r})"

    # ------------------------------------------------------------- plumbing

    def _service(self) -> Any:
        """The stub, on a channel of the running loop (made on first use; a
        channel belongs to one event loop)."""
        loop = asyncio.get_running_loop()
        # A channel of another (finished) loop cannot be closed from this one:
        # it is dropped, and grpc frees it with its last reference.
        if self._stub is None or self._loop is not loop:
            import grpc

            from agentix.provider.v1 import provider_pb2_grpc

            options: list[tuple[str, int | str]] = [("grpc.enable_retries", 0)]
            if self.tls_server_name:
                options.append(("grpc.ssl_target_name_override", self.tls_server_name))
            if self.tls:
                root = None
                if self.tls_ca_file:
                    with open(self.tls_ca_file, "rb") as handle:
                        root = handle.read()
                credentials = grpc.ssl_channel_credentials(root_certificates=root)
                self._channel = grpc.aio.secure_channel(self._target, credentials, options=options)
            else:
                self._channel = grpc.aio.insecure_channel(self._target, options=options)
            self._stub = provider_pb2_grpc.ProviderServiceStub(self._channel)
            self._loop = loop
        return self._stub

    def _metadata(self, extra: Sequence[tuple[str, str]] = ()) -> tuple[tuple[str, str], ...] | None:
        items = tuple(extra)
        if self.token:
            items = (("authorization", f"Bearer {self.token}"), *items)
        return items or None

    async def aclose(self) -> None:
        """Closes the channel (sandboxes are the service's and keep running),
        after the deletes of cancelled creates still under way."""
        if self._collectors:
            await asyncio.gather(*self._collectors, return_exceptions=True)
        channel, self._channel, self._stub, self._loop = self._channel, None, None, None
        if channel is not None:
            try:
                await channel.close()
            except RuntimeError:  # its loop is gone
                pass

    async def __aenter__(self) -> ServiceProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _delay(self, attempt: int, error: ProviderError) -> float:
        if error.retry_after is not None:
            return min(error.retry_after, max(self.max_retry_delay, 30.0))
        return min(self.max_retry_delay, 0.05 * (2**attempt)) * (0.5 + random.random() / 2)

    async def _unary(
        self, method: str, request: Any, *, what: str, timeout: float | None = None, retry: frozenset = _READ_RETRY,
        attempts: int = 4, sandbox_id: str | None = None,
    ) -> Any:
        """One unary RPC, retried on `retry` codes (for idempotent calls only)."""
        import grpc

        for attempt in range(attempts):
            call = getattr(self._service(), method)
            try:
                return await call(request, timeout=timeout or self.rpc_timeout, metadata=self._metadata())
            except grpc.aio.AioRpcError as rpc_error:
                error = self._error(rpc_error, what, sandbox_id)
                if error.code not in retry or attempt + 1 == attempts:
                    raise error from None
                await asyncio.sleep(self._delay(attempt, error))
        raise AssertionError("unreachable")

    async def _on_sandbox(self, method: str, request: Any, sandbox_id: str, timeout: float | None = None) -> Any:
        """`_unary` for an RPC about one sandbox (NOT_FOUND says which)."""
        return await self._unary(method, request, what=_about(sandbox_id), sandbox_id=sandbox_id, timeout=timeout)

    def _error(self, rpc_error: Any, what: str, sandbox_id: str | None = None) -> ProviderError:
        error = from_rpc_error(rpc_error, what=what)
        if sandbox_id is not None and error.code == "NOT_FOUND":
            # The in-process provider's KeyError message shape.
            error.message = (
                f"no sandbox {sandbox_id!r} on the provider service at {self.address} "
                f"(never created, or deleted and forgotten): {rpc_error.details()}"
            )
            error.args = (error.message,)
        if isinstance(error, ProviderUnavailable) and not error.reason:
            error.message += f" (is agentix-providerd running at {self.address}?)"
            error.args = (error.message,)
        return error

    # ------------------------------------------------------ SandboxProvider

    async def create(
        self,
        config: SandboxConfig | None,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        sandbox_id: str | None = None,
        ttl: float | None = None,
        ready_timeout: float | None = None,
        warm_pool: str | None = None,
        on_pool_miss: str | None = None,
        request_id: str | None = None,
        spec: pb.SandboxSpec | None = None,
    ) -> Sandbox:
        """Creates a sandbox (from a warm pool when one matches) and returns
        once it is READY, with its runtime URL and access token. `labels` add
        to the provider's; `ttl` / `ready_timeout` override its defaults;
        `on_pool_miss` is ``"cold_start"``, ``"wait_for_member"`` or ``"fail"``.
        `spec` replaces the one made from `config` (`spec_from_config`; then
        `config` may be None)."""
        response = await self.create_sandbox(
            config, labels=labels, annotations=annotations, sandbox_id=sandbox_id, ttl=ttl,
            ready_timeout=ready_timeout, warm_pool=warm_pool, on_pool_miss=on_pool_miss, request_id=request_id,
            spec=spec,
        )
        return self._sandbox(response.sandbox, response.credentials.access_token)

    def _sandbox(self, record: pb.Sandbox, token: str) -> Sandbox:
        return Sandbox(
            sandbox_id=SandboxId(record.id), runtime_url=runtime_url(record.status.endpoint),
            status=_status_text(record), token=token or None,
        )

    async def create_sandbox(
        self,
        config: SandboxConfig | None,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        sandbox_id: str | None = None,
        ttl: float | None = None,
        ready_timeout: float | None = None,
        warm_pool: str | None = None,
        on_pool_miss: str | None = None,
        request_id: str | None = None,
        spec: pb.SandboxSpec | None = None,
    ) -> pb.CreateSandboxResponse:
        """`create`, returning the service's ``CreateSandboxResponse`` (the
        record, the credentials and ``replayed``)."""
        import grpc

        pb = _pb()
        if spec is None:
            if config is None:
                raise TypeError("create_sandbox() needs a SandboxConfig or a spec")
            spec = spec_from_config(
                config, backend=self.backend, ttl=ttl if ttl is not None else self.default_ttl, warm_pool=warm_pool,
            )
        request = pb.CreateSandboxRequest(
            request_id=request_id or str(uuid.uuid4()), sandbox_id=sandbox_id or "", spec=spec,
            wait=pb.CreateSandboxRequest.WAIT_READY,
        )
        request.labels.update(self.labels)
        request.labels.update(labels or {})
        request.annotations.update(annotations or {})
        ready = ready_timeout if ready_timeout is not None else self.ready_timeout
        if ready is not None:
            request.ready_timeout.CopyFrom(_duration(ready))
        if on_pool_miss is not None:
            try:
                request.on_pool_miss = pb.CreateSandboxRequest.PoolMiss.Value(on_pool_miss.upper())
            except ValueError:
                raise ValueError(
                    f"on_pool_miss must be 'cold_start', 'wait_for_member' or 'fail' (got {on_pool_miss!r})"
                ) from None
        # The server bounds the wait by ready_timeout (default 120 s); this
        # deadline only catches a server that never answers.
        deadline = (ready if ready is not None else 120.0) + 30.0
        what = "create sandbox"
        for attempt in range(self.create_attempts):
            try:
                response = await self._service().CreateSandbox(request, timeout=deadline, metadata=self._metadata())
            except asyncio.CancelledError:
                # The service goes on creating it; nobody will use it.
                self._collect_later(request, deadline)
                raise
            except grpc.aio.AioRpcError as rpc_error:
                error = self._error(rpc_error, what)
                retry = error.code in _CREATE_RETRY and error.reason not in ("READY_TIMEOUT", "REQUEST_ID_REUSED")
                if not retry or attempt + 1 == self.create_attempts:
                    raise error from None
                delay = self._delay(attempt, error)
                _log.info(
                    "create sandbox (request %s): %s; retrying in %.2fs", request.request_id, error.describe(), delay
                )
                await asyncio.sleep(delay)
                continue
            phase = response.sandbox.status.phase
            if phase != pb.SandboxStatus.READY:
                if phase in (pb.SandboxStatus.TERMINATING, pb.SandboxStatus.TERMINATED):
                    raise _ended_error(response.sandbox, what)
                raise ProviderError(
                    f"{what}: the service answered with sandbox {response.sandbox.id} in phase "
                    f"{phase_name(phase)}, not READY", code="INTERNAL",
                )
            return response
        raise AssertionError("unreachable")

    def _collect_later(self, request: pb.CreateSandboxRequest, deadline: float) -> None:
        """After a cancelled create: replays it (same request_id, so the
        service answers with the sandbox it made, once it is up) and deletes
        that sandbox, in the background. If this loop ends first, the
        sandbox's TTL ends it."""

        async def collect() -> None:
            try:
                response = await self._service().CreateSandbox(request, timeout=deadline, metadata=self._metadata())
                await self.delete(response.sandbox.id, allow_missing=True)
                _log.debug("deleted sandbox %s of a cancelled create", response.sandbox.id)
            except Exception as error:  # noqa: BLE001 - best effort; the TTL is the backstop
                _log.info("could not delete the sandbox of a cancelled create (request %s): %s",
                          request.request_id, error)

        task = asyncio.get_running_loop().create_task(collect())
        self._collectors.add(task)
        task.add_done_callback(self._collectors.discard)

    async def get(self, sandbox_id: SandboxId) -> SandboxInfo:
        """Where the sandbox listens and its status (``"running"`` when READY).
        `KeyError` (`NotFound`) for an id the service does not know."""
        return self.info(await self.describe(sandbox_id))

    @staticmethod
    def info(record: pb.Sandbox) -> SandboxInfo:
        """The `SandboxInfo` of a service record (as `get` returns it)."""
        return SandboxInfo(
            sandbox_id=SandboxId(record.id), runtime_url=runtime_url(record.status.endpoint),
            status=_status_text(record),
        )

    async def describe(self, sandbox_id: str) -> pb.Sandbox:
        """The service's whole record of the sandbox."""
        return await self._on_sandbox("GetSandbox", _pb().GetSandboxRequest(id=sandbox_id), sandbox_id)

    async def credentials(self, sandbox_id: str) -> str:
        """The sandbox's runtime access token (for a sandbox another process made)."""
        reply = await self._on_sandbox("GetSandboxCredentials", _pb().GetSandboxRequest(id=sandbox_id), sandbox_id)
        return reply.access_token

    async def connect(self, sandbox_id: str) -> Sandbox:
        """A `Sandbox` handle for an existing sandbox (made by any process):
        its runtime URL and token from the service."""
        record = await self.describe(sandbox_id)
        token = await self.credentials(sandbox_id)
        return self._sandbox(record, token)

    async def delete(self, sandbox_id: SandboxId, *, grace: float | None = None, allow_missing: bool = False) -> None:
        """Deletes the sandbox and returns once it is TERMINATED. Deleting a
        terminated one is fine; an unknown id raises `KeyError` (`NotFound`)
        unless `allow_missing`."""
        await self.delete_sandbox(sandbox_id, grace=grace, allow_missing=allow_missing)

    async def delete_sandbox(
        self, sandbox_id: str, *, grace: float | None = None, allow_missing: bool = False, wait: bool = True
    ) -> pb.Sandbox:
        """`delete`, returning the record the service answered with."""
        pb = _pb()
        request = pb.DeleteSandboxRequest(
            id=sandbox_id, request_id=str(uuid.uuid4()), allow_missing=allow_missing, wait=wait
        )
        if grace is not None:
            request.grace.CopyFrom(_duration(grace))
        timeout = self.rpc_timeout + (grace or 2.0)
        reply = await self._on_sandbox("DeleteSandbox", request, sandbox_id, timeout=timeout)
        return reply.sandbox

    # --------------------------------------------------------- the service's own

    async def list(
        self,
        label_selector: str = "",
        *,
        include_terminated: bool = False,
        phases: Sequence[str | int] = (),
        page_size: int = 0,
    ) -> list[pb.Sandbox]:
        """Every sandbox matching `label_selector` (Kubernetes syntax:
        ``"k=v,k2 in (a,b),!k3"``), all pages followed."""
        sandboxes, _, _ = await self.list_snapshot(
            label_selector, include_terminated=include_terminated, phases=phases, page_size=page_size
        )
        return sandboxes

    async def list_snapshot(
        self,
        label_selector: str = "",
        *,
        include_terminated: bool = False,
        phases: Sequence[str | int] = (),
        page_size: int = 0,
    ) -> tuple[builtins.list[pb.Sandbox], int, str]:
        """`list`, with the resource version and epoch of the first page's
        snapshot (where a watch continues from)."""
        pb = _pb()
        wanted = [p if isinstance(p, int) else pb.SandboxStatus.Phase.Value(p.upper()) for p in phases]
        request = pb.ListSandboxesRequest(
            label_selector=label_selector, phases=wanted, page_size=page_size, include_terminated=include_terminated
        )
        sandboxes: list[_SandboxRecord] = []
        version, epoch = 0, ""
        first = True
        while True:
            reply = await self._unary("ListSandboxes", request, what="list sandboxes")
            if first:
                version, epoch, first = reply.resource_version, reply.epoch, False
            sandboxes.extend(reply.sandboxes)
            if not reply.next_page_token:
                return sandboxes, version, epoch
            request.page_token = reply.next_page_token

    async def watch(
        self,
        label_selector: str = "",
        *,
        send_initial: bool = True,
        bookmarks: bool = False,
        max_reconnects: int = 10,
    ) -> AsyncIterator[pb.SandboxEvent]:
        """Yields ``SandboxEvent`` s for the sandboxes matching
        `label_selector`: with `send_initial`, the current ones as ADDED first.

        The stream survives reconnects: it resumes from the last resource
        version it saw; when the service answers OUT_OF_RANGE (that version is
        too old, or the service restarted: a new epoch) it lists again and
        yields what changed meanwhile (MODIFIED, ADDED, and DELETED for
        sandboxes gone from the list), then watches on. Events are
        deduplicated by resource version, so each change is yielded once.
        BOOKMARK events are yielded only with `bookmarks`. Gives up with
        `ProviderUnavailable` after `max_reconnects` failures in a row."""
        import grpc

        pb = _pb()
        known: dict[str, _SandboxRecord] = {}  # id -> the last record yielded
        version, epoch = 0, ""
        failures = 0

        def fresh(record: _SandboxRecord) -> bool:
            seen = known.get(record.id)
            return seen is None or record.resource_version > seen.resource_version

        async def relist(initial: bool) -> AsyncIterator[_SandboxEvent]:
            nonlocal version, epoch
            records, version, epoch = await self.list_snapshot(label_selector, include_terminated=True)
            listed = {record.id: record for record in records}
            for record in records:
                if not fresh(record):
                    continue
                kind = pb.SandboxEvent.ADDED if record.id not in known else pb.SandboxEvent.MODIFIED
                known[record.id] = record
                if initial and not send_initial:
                    continue
                yield pb.SandboxEvent(type=kind, sandbox=record, resource_version=record.resource_version, epoch=epoch)
            for gone in [sandbox_id for sandbox_id in known if sandbox_id not in listed]:
                record = known.pop(gone)
                yield pb.SandboxEvent(
                    type=pb.SandboxEvent.DELETED, sandbox=record, resource_version=version, epoch=epoch
                )

        async for event in relist(initial=True):
            yield event
        while True:
            request = pb.WatchSandboxesRequest(
                label_selector=label_selector, resource_version=version, epoch=epoch, bookmarks=True
            )
            call = self._service().WatchSandboxes(request, metadata=self._metadata())
            new_epoch = False
            try:
                async for event in call:
                    failures = 0
                    if event.epoch and epoch and event.epoch != epoch:
                        new_epoch = True  # the service restarted under us
                        break
                    if event.resource_version and event.resource_version <= version:
                        continue  # delivered before (at-least-once)
                    if event.resource_version:
                        version = event.resource_version
                    if event.type == pb.SandboxEvent.BOOKMARK:
                        if bookmarks:
                            yield event
                        continue
                    record = event.sandbox
                    if event.type == pb.SandboxEvent.DELETED:
                        known.pop(record.id, None)
                    elif not fresh(record):
                        continue
                    else:
                        known[record.id] = record
                    yield event
                # Ended without an error (the server is going away): resume
                # from the last version, or relist after an epoch change.
                if new_epoch:
                    async for relisted in relist(initial=False):
                        yield relisted
                continue
            except grpc.aio.AioRpcError as rpc_error:
                error = self._error(rpc_error, "watch sandboxes")
                if error.code == "OUT_OF_RANGE":
                    _log.info("watch: %s; listing again", error.describe())
                    async for relisted in relist(initial=False):
                        yield relisted
                    continue
                if error.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN", "CANCELLED"):
                    raise error from None
                failures += 1
                if failures > max_reconnects:
                    raise ProviderUnavailable(
                        f"watch sandboxes: {failures} reconnects in a row failed; last: {error.message}",
                        code=error.code, reason=error.reason,
                    ) from None
                await asyncio.sleep(self._delay(failures, error))
            finally:
                call.cancel()

    async def wait(
        self, sandbox_id: str, until: str | int = "READY", *, timeout: float | None = None
    ) -> pb.Sandbox:
        """Waits until the sandbox reaches phase `until` (or a later one) and
        returns its record. `TimeoutError` (`ProviderTimeout`) after `timeout`
        seconds; `SandboxTerminated` / `SandboxStartFailed` when it ended
        before reaching a phase short of TERMINATED."""
        pb = _pb()
        target = until if isinstance(until, int) else pb.SandboxStatus.Phase.Value(until.upper())
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = _WAIT_SLICE if deadline is None else max(0.0, min(_WAIT_SLICE, deadline - loop.time()))
            request = pb.WaitSandboxRequest(id=sandbox_id, until=target, timeout=_duration(left))
            reply = await self._on_sandbox("WaitSandbox", request, sandbox_id, timeout=left + self.rpc_timeout)
            if reply.reached:
                return reply.sandbox
            if reply.sandbox.status.phase == pb.SandboxStatus.TERMINATED:
                raise _ended_error(reply.sandbox, f"wait for {phase_name(target)}")
            if deadline is not None and loop.time() >= deadline:
                raise ProviderTimeout(
                    f"wait: sandbox {sandbox_id} is {phase_name(reply.sandbox.status.phase)}, not "
                    f"{phase_name(target)}, after {timeout}s", code="DEADLINE_EXCEEDED",
                )

    async def extend(self, sandbox_id: str, ttl: float) -> pb.Sandbox:
        """Sets the sandbox's expiry to now + `ttl` seconds (capped by the
        service's maximum lifetime); returns its record."""
        request = _pb().ExtendSandboxRequest(id=sandbox_id, ttl=_duration(ttl))
        return await self._on_sandbox("ExtendSandbox", request, sandbox_id)

    async def logs(self, sandbox_id: str, *, follow: bool = False, offset: int = 0) -> AsyncIterator[bytes]:
        """Yields the sandbox's output (bootstrap, daemon and worker
        stdout/stderr) from byte `offset`; with `follow`, until it ends.
        Resumes after a dropped stream from the last byte received."""
        import grpc

        pb = _pb()
        failures = 0
        while True:
            call = self._service().StreamSandboxLogs(
                pb.StreamSandboxLogsRequest(id=sandbox_id, offset=offset, follow=follow), metadata=self._metadata()
            )
            try:
                async for chunk in call:
                    failures = 0
                    if chunk.offset + len(chunk.data) <= offset:
                        continue  # already yielded
                    data = chunk.data[max(0, offset - chunk.offset):]
                    offset = chunk.offset + len(chunk.data)
                    yield bytes(data)
                return
            except grpc.aio.AioRpcError as rpc_error:
                error = self._error(rpc_error, _about(sandbox_id), sandbox_id)
                failures += 1
                if error.code != "UNAVAILABLE" or failures > 5:
                    raise error from None
                await asyncio.sleep(self._delay(failures, error))
            finally:
                call.cancel()

    async def capabilities(self) -> pb.Capabilities:
        """What each backend can enforce on providerd's machine, and its limits."""
        return await self._unary("GetCapabilities", _pb().GetCapabilitiesRequest(), what="capabilities")

    # ----------------------------------------------------------------- pools

    def _pool(
        self,
        name: str,
        config: SandboxConfig | None,
        template: pb.SandboxSpec | None,
        min_ready: int,
        max_total: int,
        max_creating: int,
        labels: Mapping[str, str] | None,
        member_max_age: float | None,
        update_strategy: str | None,
    ) -> pb.WarmPool:
        pb = _pb()
        if template is None:
            if config is None:
                raise TypeError("a pool needs a SandboxConfig or a template spec")
            template = spec_from_config(config, backend=self.backend)
        pool = pb.WarmPool(
            name=name, template=template, min_ready=min_ready, max_total=max_total, max_creating=max_creating
        )
        pool.labels.update(labels or {})
        if member_max_age is not None:
            pool.member_max_age.CopyFrom(_duration(member_max_age))
        if update_strategy is not None:
            try:
                pool.update_strategy = pb.WarmPool.Strategy.Value(update_strategy.upper())
            except ValueError:
                raise ValueError(
                    f"update_strategy must be 'recreate' or 'on_replenish' (got {update_strategy!r})"
                ) from None
        return pool

    async def create_pool(
        self,
        name: str,
        config: SandboxConfig | None = None,
        *,
        min_ready: int,
        max_total: int = 0,
        max_creating: int = 0,
        labels: Mapping[str, str] | None = None,
        member_max_age: float | None = None,
        update_strategy: str | None = None,
        template: pb.SandboxSpec | None = None,
    ) -> pb.WarmPool:
        """Creates warm pool `name` of ready sandboxes made from `config`
        (or `template`): a matching `create` takes one instead of starting
        one. ``max_total`` 0 means ``min_ready``; ``max_creating`` 0, the server's 4."""
        pool = self._pool(name, config, template, min_ready, max_total or min_ready, max_creating, labels,
                          member_max_age, update_strategy)
        return await self._unary("CreateWarmPool", _pb().CreateWarmPoolRequest(pool=pool), what=f"pool {name}")

    async def update_pool(
        self,
        name: str,
        config: SandboxConfig | None = None,
        *,
        min_ready: int,
        max_total: int = 0,
        max_creating: int = 0,
        labels: Mapping[str, str] | None = None,
        member_max_age: float | None = None,
        update_strategy: str | None = None,
        template: pb.SandboxSpec | None = None,
    ) -> pb.WarmPool:
        """Replaces pool `name`'s settings (members of an old template are
        replaced as its ``update_strategy`` says)."""
        pool = self._pool(name, config, template, min_ready, max_total or min_ready, max_creating, labels,
                          member_max_age, update_strategy)
        return await self._unary("UpdateWarmPool", _pb().UpdateWarmPoolRequest(pool=pool), what=f"pool {name}")

    async def get_pool(self, name: str) -> pb.WarmPool:
        return await self._unary("GetWarmPool", _pb().GetWarmPoolRequest(name=name), what=f"pool {name}")

    async def list_pools(self) -> builtins.list[pb.WarmPool]:
        reply = await self._unary("ListWarmPools", _pb().ListWarmPoolsRequest(), what="list pools")
        return list(reply.pools)

    async def delete_pool(self, name: str, *, allow_missing: bool = False) -> None:
        """Deletes pool `name` and its unclaimed members (claimed sandboxes stay)."""
        request = _pb().DeleteWarmPoolRequest(name=name, allow_missing=allow_missing)
        await self._unary("DeleteWarmPool", request, what=f"pool {name}")


def _about(sandbox_id: str) -> str:
    return f"sandbox {sandbox_id!r}"
