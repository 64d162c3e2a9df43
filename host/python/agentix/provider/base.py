"""The provider interface: configs, sandbox handles and `SandboxProvider`.

A backend implements `create`, `delete` and `get`; `session()` is inherited and
is the way callers normally use it::

    async with provider.session(SandboxConfig(image=..., bundle=...)) as sandbox:
        print(await sandbox.remote(my_module.my_function, 1, 2))

The configs are plain dataclasses that validate in ``__post_init__`` (the
original used pydantic; this package has no dependencies). Invalid values raise
`ValueError` — pydantic's ``ValidationError`` is a ``ValueError`` too, so code
that caught it keeps working. As with a default pydantic model, assigning a
field after construction is not re-validated.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NewType, ParamSpec, Protocol, TypeVar, overload, runtime_checkable

if TYPE_CHECKING:  # importing the client would import gRPC
    from agentix.runtime.client.client import RuntimeClient
    from agentix.runtime.client.result import Result
    from agentix.runtime.shared.models import HealthResponse

__all__ = [
    "BundleDeployer",
    "DeployedBundle",
    "Sandbox",
    "SandboxConfig",
    "SandboxId",
    "SandboxInfo",
    "SandboxProvider",
    "SandboxResource",
    "register_provider",
]

R = TypeVar("R")
Y = TypeVar("Y")
P = ParamSpec("P")

SandboxId = NewType("SandboxId", str)


def _positive_number(name: str, value: Any, *, integer: bool) -> Any:
    # bool is an int subclass; True as "1 GPU" is a bug, not a value.
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"SandboxResource.{name} must be {kind} > 0 (got {value!r})")
    if not (value > 0) or (not integer and not math.isfinite(value)):
        raise ValueError(f"SandboxResource.{name} must be > 0 (got {value!r})")
    return value


@dataclass
class SandboxResource:
    """Resources requested for one sandbox; ``None`` means the backend's default.

    ``cpu``: CPUs (> 0, fractions allowed); ``memory``: bytes as an int > 0 or
    a size string such as ``"512m"`` / ``"16g"`` (its meaning is the
    backend's); ``gpu``: number of GPUs (> 0).
    """

    cpu: float | None = None
    memory: int | str | None = None
    gpu: int | None = None

    def __post_init__(self) -> None:
        if self.cpu is not None:
            self.cpu = float(_positive_number("cpu", self.cpu, integer=False))
        if self.gpu is not None:
            _positive_number("gpu", self.gpu, integer=True)
        if self.memory is not None:
            if isinstance(self.memory, str):
                if not self.memory.strip():
                    raise ValueError("SandboxResource.memory must not be blank (use e.g. '512m', '16g' or bytes)")
            else:
                _positive_number("memory", self.memory, integer=True)

    def model_dump(self) -> dict[str, Any]:
        """The fields as a dict (the pydantic original's method name)."""
        return dataclasses.asdict(self)


@dataclass
class SandboxConfig:
    """What to run: ``image`` (the task image / root the sandbox runs over) and
    ``bundle`` (the backend-native reference to a deployed bundle), plus an
    optional ``platform`` (``"linux/amd64"``), extra environment ``env`` and
    ``resource`` limits. How ``image`` and ``bundle`` are interpreted is the
    backend's (see each provider's docs)."""

    image: str
    bundle: str
    platform: str | None = None
    env: dict[str, str] | None = None
    resource: SandboxResource | None = None

    def __post_init__(self) -> None:
        for name in ("image", "bundle"):
            value = getattr(self, name)
            if isinstance(value, Path):  # a convenience: paths are the common bundle reference
                value = str(value)
                setattr(self, name, value)
            if not isinstance(value, str):
                raise ValueError(f"SandboxConfig.{name} must be a string (got {type(value).__name__})")
        if self.platform is not None and (not isinstance(self.platform, str) or not self.platform.strip()):
            raise ValueError(f"SandboxConfig.platform must be a non-empty string or None (got {self.platform!r})")
        if self.env is not None:
            if not isinstance(self.env, Mapping):
                raise ValueError(f"SandboxConfig.env must be a dict of str to str (got {type(self.env).__name__})")
            for key, value in self.env.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    raise ValueError(f"SandboxConfig.env must map str to str (got {key!r}: {value!r})")
                if not key or "=" in key or "\0" in key or "\0" in value:
                    raise ValueError(f"SandboxConfig.env has an invalid variable name or value: {key!r}")
            self.env = dict(self.env)
        if isinstance(self.resource, Mapping):
            self.resource = SandboxResource(**self.resource)
        elif self.resource is not None and not isinstance(self.resource, SandboxResource):
            raise ValueError(
                f"SandboxConfig.resource must be a SandboxResource, a dict or None (got {type(self.resource).__name__})"
            )

    def model_dump(self) -> dict[str, Any]:
        """The fields as a dict (the pydantic original's method name)."""
        return dataclasses.asdict(self)


@dataclass
class SandboxInfo:
    """What `SandboxProvider.get` reports about one sandbox."""

    sandbox_id: SandboxId
    runtime_url: str
    status: str = "running"


@dataclass
class DeployedBundle:
    """Result of `BundleDeployer.deploy_bundle`: ``bundle`` is the reference to
    put in `SandboxConfig.bundle`; ``metadata`` and ``hints`` (label ->
    shell command) are shown to the user by ``agentix deploy``."""

    bundle: str
    platform: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    hints: dict[str, str] = field(default_factory=dict)


@dataclass
class Sandbox:
    """A running sandbox: where its runtime listens and how to call into it.

    The `RuntimeClient` behind `remote` & co. is created on first use (not by
    the provider), with this sandbox's ``call_deadline`` (seconds per call,
    None = unbounded; changes apply to later calls). `aclose()` (or leaving
    ``async with sandbox:``) closes that client; it does not delete the sandbox — `SandboxProvider.delete` (or
    leaving `session()`) does.
    """

    sandbox_id: SandboxId
    runtime_url: str
    status: str = "running"
    call_deadline: float | None = None
    # The bearer token the sandbox's daemon requires (None: none, or
    # $AGENTIX_TOKEN); never shown in repr.
    token: str | None = field(default=None, repr=False, compare=False)
    # The bundle's manifest.json on this machine, when known: the client
    # checks the host's copy of each called module against it (stale bundles).
    bundle_manifest: str | None = field(default=None, repr=False, compare=False)
    _client: RuntimeClient | None = field(default=None, init=False, repr=False, compare=False)
    # The provider's channel of its readiness check (`CheckedChannel`), which
    # the client's first connection takes instead of opening its own.
    checked_channel: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def client(self) -> RuntimeClient:
        """The sandbox's `RuntimeClient` (created, not yet connected, on first access)."""
        client = self._client
        if client is None:
            from agentix.runtime.client.client import RuntimeClient

            client = self._client = RuntimeClient(
                self.runtime_url, call_deadline=self.call_deadline, token=self.token,
                bundle_manifest=self.bundle_manifest,
            )
            checked = self.checked_channel
            if checked is not None and (checked.target, checked.token) == (self.runtime_url, self.token):
                client.checked_channel = checked  # taken once; aclose() closes it if never taken
        else:
            client.call_deadline = self.call_deadline
        return client

    @overload
    async def remote(self, fn: Callable[P, Coroutine[Any, Any, R]], /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    async def remote(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...

    async def remote(self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Runs ``fn(*args, **kwargs)`` in the sandbox (`RuntimeClient.remote`)."""
        return await self.client.remote(fn, *args, **kwargs)

    @overload
    async def try_remote(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Result[R]: ...
    @overload
    async def try_remote(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Result[R]: ...

    async def try_remote(self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Result[Any]:
        """Like `remote`, returning ``Ok`` / ``Failed`` (`RuntimeClient.try_remote`)."""
        return await self.client.try_remote(fn, *args, **kwargs)

    @overload
    def remote_stream(
        self, fn: Callable[P, AsyncIterable[Y]], /, *args: P.args, **kwargs: P.kwargs
    ) -> AsyncIterator[Y]: ...
    @overload
    def remote_stream(self, fn: Callable[P, Iterable[Y]], /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Y]: ...

    def remote_stream(self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Any]:
        """Yields the items of a generator ``fn`` run in the sandbox
        (`RuntimeClient.remote_stream`); use with ``async for``."""
        return self.client.remote_stream(fn, *args, **kwargs)

    async def health(self) -> HealthResponse:
        """The sandbox runtime's status and version (`RuntimeClient.health`);
        raises `agentix.RuntimeUnreachable` when it does not answer."""
        return await self.client.health()

    def register_namespace(self, namespace: Any) -> Any:
        """Attaches a host-side plugin namespace (``agentix.AsyncClientNamespace``)
        to this sandbox's client; returns what the client's method returns."""
        method = getattr(self.client, "register_namespace", None)
        if method is None:
            raise NotImplementedError(
                "this agentix RuntimeClient has no register_namespace(): plugin namespaces need an "
                "agentix version whose RuntimeClient implements them"
            )
        return method(namespace)

    async def aclose(self) -> None:
        """Closes the client if one was created. Idempotent; the sandbox keeps running."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        checked, self.checked_channel = self.checked_channel, None
        if checked is not None:
            await checked.discard()

    async def __aenter__(self) -> Sandbox:
        """``async with sandbox:`` gives the sandbox itself; leaving it closes the
        client (`aclose`), not the sandbox."""
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@runtime_checkable
class SandboxProvider(Protocol):
    """A place sandboxes run. Backends subclass this and implement
    `create`, `delete` and `get`; `session` is inherited."""

    async def create(self, config: SandboxConfig) -> Sandbox:
        """Starts a sandbox and returns once its runtime answers. Must not
        create the sandbox's `RuntimeClient` (it is made lazily on first use)."""
        ...

    async def delete(self, sandbox_id: SandboxId) -> None:
        """Stops the sandbox and removes everything created for it."""
        ...

    async def get(self, sandbox_id: SandboxId) -> SandboxInfo:
        """Reports where the sandbox listens and its status."""
        ...

    @asynccontextmanager
    async def session(self, config: SandboxConfig, *, call_deadline: float | None = None) -> AsyncIterator[Sandbox]:
        """``create`` → set ``call_deadline`` (when given) → yield the sandbox →
        close its client and delete it; the delete runs even if closing raises."""
        sandbox = await self.create(config)
        try:
            if call_deadline is not None:
                sandbox.call_deadline = call_deadline
            yield sandbox
        finally:
            try:
                await sandbox.aclose()
            finally:
                await self.delete(sandbox.sandbox_id)


@runtime_checkable
class BundleDeployer(Protocol):
    """A provider that can turn a portable bundle tarball into the reference
    its `SandboxConfig.bundle` expects (``agentix deploy <backend> BUNDLE``)."""

    async def deploy_bundle(
        self, bundle: Path, *, name: str | None = None, platform: str | None = None
    ) -> DeployedBundle: ...


def register_provider(name: str, cls: type[SandboxProvider]) -> None:
    """Registers a provider class under `name` in this process, overriding an
    entry point of the same name (``providers().get(name)`` returns `cls`)."""
    from agentix.provider._plugin import providers

    if not inspect.isclass(cls):
        raise TypeError(f"register_provider({name!r}, ...) needs a class (got {type(cls).__name__})")
    providers().register(name, cls)
