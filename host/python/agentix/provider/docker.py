"""`DockerProvider` and `PodmanProvider`: sandboxes as containers, run by the
provider service's docker / podman backends.

``DockerProvider().session(SandboxConfig(image=..., bundle=...))`` keeps the
original's shape: ``image`` is an image already loaded into the engine
(``docker load -i FILE`` / ``podman load``: nothing is pulled), ``bundle`` a
bundle directory (holding ``nix/``) or a bundle tarball (unpacked once per
sha256 into ``bundle_cache_dir``), bind-mounted read-only at ``/nix``; the
container runs the bundle's ``bootstrap.sh`` and its Python, not the image's.

Both are clients of ``agentix-providerd`` (they share `LocalProvider`'s client
code: request ids, TTL renewal, delete on `aclose`, restart of a per-user
providerd that stopped answering). Which providerd:

1. the one at ``$AGENTIX_PROVIDER_URL``, when set (it must serve the engine:
   ``--docker-socket`` / ``--podman-socket``);
2. else a per-user one for this engine at
   ``$XDG_RUNTIME_DIR/agentix/providerd-docker.sock`` (``…-podman.sock``),
   started when none answers there with ``--docker-socket SOCKET`` (or
   ``--podman-socket``), its own state directory ``/var/tmp/agx-<uid>-dk``
   (``-pm``) and instance ``providerd-docker`` (``providerd-podman``).
   Its containers outlive it: a restarted providerd adopts those still
   answering.

The engine's socket (for 2.): ``DockerProviderConfig.socket``, else
``$DOCKER_HOST`` / ``$CONTAINER_HOST`` when it is ``unix://…``, else the
first that exists of ``/run/docker.sock``, ``/var/run/docker.sock`` (docker)
or ``$XDG_RUNTIME_DIR/podman/podman.sock``, ``/run/podman/podman.sock``
(podman).

What differs from the original (which ran ``docker run`` itself): the
container has no network unless ``network="host"`` (the original's default
was the engine's bridge; BRIDGE is refused by the backend for now); the
sandbox is reached on a Unix socket in a run directory, not a published port
(``publish_host`` is accepted and unused); ``run_args`` and ``gpu_args`` cannot
be passed through the Engine API and are refused when set; GPUs
(``SandboxResource.gpu``) need an engine with an nvidia runtime.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentix.provider._local_inprocess import InProcessLocalProvider, LocalProviderConfig, _default_cache_dir
from agentix.provider.base import Sandbox, SandboxConfig
from agentix.provider.local import LocalProvider
from agentix.provider.service import URL_ENV, spec_from_config

__all__ = [
    "DockerProvider",
    "DockerProviderConfig",
    "PodmanProvider",
    "PodmanProviderConfig",
    "default_engine_socket",
]

_ENGINES = ("docker", "podman")


def default_engine_socket(engine: str) -> str | None:
    """The engine's API socket when none is configured (module docstring), or
    None when none of the usual places has one."""
    variable = "DOCKER_HOST" if engine == "docker" else "CONTAINER_HOST"
    named = os.environ.get(variable, "")
    if named.startswith("unix://"):
        return named[len("unix://"):]
    if engine == "docker":
        candidates = ["/run/docker.sock", "/var/run/docker.sock"]
    else:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        candidates = [f"{runtime}/podman/podman.sock"] if runtime else []
        candidates.append("/run/podman/podman.sock")
    for candidate in candidates:
        if os.path.exists(candidate):
            return candidate
    return None


@dataclass
class DockerProviderConfig:
    """Settings of a `DockerProvider` (all optional).

    container_engine: ``"docker"`` or ``"podman"``: the provider service's
      backend the sandboxes go to.
    socket: the engine's API socket, for the per-user providerd this provider
      starts (default: see `default_engine_socket`).
    run_args: the original's extra ``docker run`` arguments (a string is
      split like a shell would); not supported through the service: must be
      empty.
    network: ``None``/``"none"`` (loopback only) or ``"host"``.
    publish_host: accepted for compatibility; unused (the sandbox listens on
      a Unix socket, not a published port).
    gpu_args: the original's GPU flag template; must be None (GPUs are
      ``SandboxResource.gpu``).
    bundle_cache_dir: where bundle tarballs are unpacked (default
      ``~/.cache/agentix/bundles``).
    ttl: each sandbox's lifetime in seconds, renewed every ``ttl / 3`` while
      the provider is open (a process that dies without deleting leaks its
      containers for at most this long).
    ready_timeout: how long a create may take, in seconds.
    stop_grace: SIGTERM to kill on delete, in seconds.
    warm_pool: claim sandboxes from this warm pool of the service.
    """

    container_engine: str = "docker"
    socket: str | None = None
    run_args: list[str] | str = field(default_factory=list[str])
    network: str | None = None
    publish_host: str = "127.0.0.1"
    gpu_args: list[str] | str | None = None
    bundle_cache_dir: str | None = None
    ttl: float = 300.0
    ready_timeout: float = 120.0
    stop_grace: float = 2.0
    warm_pool: str | None = None

    def __post_init__(self) -> None:
        if not self.container_engine:
            raise ValueError("container_engine must not be empty")
        if self.container_engine not in _ENGINES:
            raise ValueError(f"container_engine must be one of {_ENGINES}, not {self.container_engine!r}")
        if isinstance(self.run_args, str):
            self.run_args = shlex.split(self.run_args)
        if self.run_args:
            raise ValueError(
                f"run_args {self.run_args!r}: the provider service creates containers through the Engine API, "
                "which takes no `docker run` arguments; use SandboxResource and `network` instead"
            )
        if self.gpu_args is not None:
            raise ValueError("gpu_args is not supported: ask for GPUs with SandboxResource(gpu=N)")
        if self.network is not None and self.network.lower() not in ("none", "host"):
            raise ValueError(f"network {self.network!r}: only None/'none' (loopback) and 'host' are supported")
        if self.ttl <= 0 or self.ready_timeout <= 0 or self.stop_grace < 0:
            raise ValueError("ttl and ready_timeout must be positive and stop_grace not negative")

    def to_provider(self) -> DockerProvider:
        return PodmanProvider(self) if self.container_engine == "podman" else DockerProvider(self)


@dataclass
class PodmanProviderConfig(DockerProviderConfig):
    """`DockerProviderConfig` with ``container_engine="podman"``."""

    container_engine: str = "podman"


def _state_dir(engine: str) -> str:
    # Short (providerd allows 22 bytes): the run dirs' sockets live under it.
    return f"/var/tmp/agx-{os.getuid()}-{'dk' if engine == 'docker' else 'pm'}"


class DockerProvider(LocalProvider):
    """Sandboxes as containers of the provider service's docker (or podman)
    backend (module docstring).

    `SandboxConfig` fields:
      image: an image reference the engine has (``localhost/name:tag``).
      bundle: a bundle directory (or its ``nix``), or a bundle tarball.
      platform: checked against the image's (FAILED_PRECONDITION when they differ).
      env: the sandbox worker's environment (applied when it is armed).
      resource: ``cpu``, ``memory`` and ``gpu`` as container limits.
    """

    _default_engine = "docker"
    # Not a LocalProviderConfig: the base reads only .ttl, .stop_grace and
    # .ready_timeout from it, which DockerProviderConfig has too.
    config: DockerProviderConfig  # type: ignore[assignment]

    def __init__(self, config: DockerProviderConfig | None = None, **kwargs: Any) -> None:
        if config is not None and kwargs:
            raise TypeError("pass either a config or keyword settings, not both")
        if config is None:
            kwargs.setdefault("container_engine", self._default_engine)
            config = DockerProviderConfig(**kwargs)
        self.config = config
        self.cache_dir = Path(config.bundle_cache_dir) if config.bundle_cache_dir else _default_cache_dir()
        # Bundle tarballs are unpacked here (the service runs on this machine).
        self._files = InProcessLocalProvider(LocalProviderConfig(cache_dir=str(self.cache_dir)))
        self._init_client([])

    @property
    def engine(self) -> str:
        return self.config.container_engine

    def providerd_flags(self) -> list[str]:
        """The flags of the per-user providerd this provider starts."""
        socket = self.config.socket or default_engine_socket(self.engine)
        if socket is None:
            raise FileNotFoundError(
                f"no {self.engine} API socket found (looked at "
                f"{'$DOCKER_HOST, /run/docker.sock, /var/run/docker.sock' if self.engine == 'docker' else '$CONTAINER_HOST, $XDG_RUNTIME_DIR/podman/podman.sock, /run/podman/podman.sock'}): "
                f"start the engine, or set DockerProviderConfig.socket, or {URL_ENV} to a providerd serving it"
            )
        return [
            f"--{self.engine}-socket={socket}",
            f"--state-dir={_state_dir(self.engine)}",
            f"--instance=providerd-{self.engine}",
        ]

    def _socket_name(self) -> str:
        return f"providerd-{self.engine}.sock"

    async def create(self, config: SandboxConfig) -> Sandbox:
        if not isinstance(config, SandboxConfig):
            raise TypeError(f"create() needs a SandboxConfig (got {type(config).__name__})")
        nix_dir = await asyncio.to_thread(self._files._bundle_nix_dir, config.bundle)
        bundle = nix_dir.parent if nix_dir.name == "nix" else nix_dir
        resolved = SandboxConfig(
            image=config.image, bundle=str(bundle), platform=config.platform, env=config.env, resource=config.resource,
        )
        network = self.config.network.lower() if self.config.network else None
        spec = spec_from_config(
            resolved, backend=self.engine, ttl=self.config.ttl, network=network, warm_pool=self.config.warm_pool,
        )
        return await self._create_owned(spec)


class PodmanProvider(DockerProvider):
    """`DockerProvider` on the provider service's podman backend."""

    _default_engine = "podman"

    def __init__(self, config: DockerProviderConfig | None = None, **kwargs: Any) -> None:
        if config is None:
            config = PodmanProviderConfig(**kwargs)
            kwargs = {}
        super().__init__(config, **kwargs)
