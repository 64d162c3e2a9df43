"""`KubernetesProvider`: sandboxes as Pods, run by the provider service's
Kubernetes backend.

``KubernetesProvider().session(SandboxConfig(image=..., bundle=...))`` keeps
the shape of the other providers: ``image`` is the task image the Pod runs
(any image the cluster can pull: the bundle brings the Python), ``bundle``
the **bundle image** reference (``registry/agentix-bundle@sha256:…``; an
``oci-ref:`` prefix is accepted and dropped), mounted read-only at ``/nix``
by an image volume or copied there by an init container, as the service is
configured. A bundle *directory* or tarball cannot be used: a Pod runs on a
node that does not have this machine's files (ValueError naming the fix).

A client of ``agentix-providerd`` (it shares `LocalProvider`'s client code:
request ids, TTL renewal, delete on `aclose`, restart of a per-user
providerd that stopped answering). Which providerd:

1. the one at ``$AGENTIX_PROVIDER_URL``, when set: the usual set-up, a
   providerd running in the cluster (``deploy/kubernetes``) and reached
   through its Service; it must serve the ``kubernetes`` backend;
2. else a per-user one at ``$XDG_RUNTIME_DIR/agentix/providerd-kubernetes.sock``,
   started when none answers there with ``--kubernetes-kubeconfig`` (the
   config's ``kubeconfig``, else the first file of ``$KUBECONFIG``, else
   ``~/.kube/config``) or ``--kubernetes-in-cluster``, its own state
   directory ``/var/tmp/agx-<uid>-k8`` and an instance name of its own
   (`default_instance`: this user on this machine). It reaches the Pods at
   their Pod IPs, so this machine must route to the cluster's Pod network.
   Its Pods outlive it: a restarted providerd adopts them by label.

What differs from the docker provider: ``resource.gpu`` asks for
``nvidia.com/gpu``; pids and nofile limits have no per-Pod field and are
refused by the backend; ``network`` is ``None``/``"none"`` (a NetworkPolicy
that denies egress) or ``"host"`` (only where the service allows it).
"""

from __future__ import annotations

import getpass
import os
import re
import socket as _socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentix.provider.base import DeployedBundle, Sandbox, SandboxConfig
from agentix.provider.local import LocalProvider
from agentix.provider.service import URL_ENV, spec_from_config

__all__ = ["KubernetesProvider", "KubernetesProviderConfig", "default_instance", "default_kubeconfig"]

BACKEND = "kubernetes"
_OCI_PREFIX = "oci-ref:"
# A Kubernetes label value: what the instance name becomes on every Pod.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def default_kubeconfig() -> str | None:
    """The kubeconfig every Kubernetes client reads when none is named: the
    first existing file of ``$KUBECONFIG`` (a ``:``-separated list), else
    ``~/.kube/config``; None when there is none."""
    named = os.environ.get("KUBECONFIG", "")
    candidates = [p for p in named.split(os.pathsep) if p] if named else [str(Path.home() / ".kube" / "config")]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    return None


def default_instance() -> str:
    """The per-user providerd's instance name: ``agx-<user>-<host>`` made a
    Kubernetes label value (≤ 63 characters). The instance labels every Pod
    and a starting providerd destroys the Pods of its instance it does not
    know, so two users (or machines) sharing a namespace must not share it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"u{os.getuid()}"
    raw = f"agx-{user}-{_socket.gethostname()}"
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", raw)[:63].rstrip("-_.")
    return name or f"agx-u{os.getuid()}"


@dataclass
class KubernetesProviderConfig:
    """Settings of a `KubernetesProvider` (all optional).

    kubeconfig: the kubeconfig of the per-user providerd this provider starts
      (default: `default_kubeconfig`); unused with ``$AGENTIX_PROVIDER_URL``.
    context: its context (default: the kubeconfig's current-context).
    namespace: the Pods' namespace (default: the context's, else ``default``).
    in_cluster: the per-user providerd uses this Pod's service account
      instead of a kubeconfig (it runs in the cluster itself).
    runtime_port: the daemon's port inside each Pod (the endpoint is
      ``podIP:port``).
    instance: the per-user providerd's instance name (default:
      `default_instance`), a Kubernetes label value.
    network: ``None``/``"none"`` (no egress: a NetworkPolicy) or ``"host"``.
    ttl: each sandbox's lifetime in seconds, renewed every ``ttl / 3`` while
      the provider is open (``activeDeadlineSeconds`` on the Pod is the
      service's backstop when nothing renews or deletes it).
    ready_timeout: how long a create may take, in seconds (image pulls count).
    stop_grace: SIGTERM to kill on delete, in seconds.
    warm_pool: claim sandboxes from this warm pool of the service.
    """

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    in_cluster: bool = False
    runtime_port: int = 50051
    instance: str | None = None
    network: str | None = None
    ttl: float = 300.0
    ready_timeout: float = 300.0
    stop_grace: float = 3.0
    warm_pool: str | None = None

    def __post_init__(self) -> None:
        if self.in_cluster and self.kubeconfig:
            raise ValueError("kubeconfig and in_cluster exclude each other")
        if not 1 <= self.runtime_port <= 65535:
            raise ValueError(f"runtime_port must be in 1..65535 (got {self.runtime_port})")
        if self.instance is not None and not _LABEL_VALUE.match(self.instance):
            raise ValueError(
                f"instance {self.instance!r} must be a Kubernetes label value "
                "(≤ 63 of [A-Za-z0-9-_.], starting and ending alphanumeric)"
            )
        if self.network is not None and self.network.lower() not in ("none", "host"):
            raise ValueError(f"network {self.network!r}: only None/'none' and 'host' are supported")
        if self.ttl <= 0 or self.ready_timeout <= 0 or self.stop_grace < 0:
            raise ValueError("ttl and ready_timeout must be positive and stop_grace not negative")

    def to_provider(self) -> KubernetesProvider:
        return KubernetesProvider(self)


def bundle_reference(bundle: str) -> str:
    """The bundle image reference of ``SandboxConfig.bundle`` (``oci-ref:``
    dropped); ValueError for a path or tarball on this machine."""
    reference = bundle[len(_OCI_PREFIX):] if bundle.startswith(_OCI_PREFIX) else bundle
    if not reference:
        raise ValueError("SandboxConfig.bundle must name the bundle image (registry/agentix-bundle@sha256:...)")
    looks_local = reference.startswith(("/", "./", "../", "~")) or reference.endswith((".tar", ".tar.gz", ".tgz"))
    if looks_local or os.path.exists(os.path.expanduser(reference)):
        raise ValueError(
            f"bundle {bundle!r} is a path on this machine, which a Pod cannot mount: push the bundle as an "
            "OCI image (the bundler writes an OCI layout under its output `oci/`) and pass its reference, "
            "pinned by digest: registry/agentix-bundle@sha256:..."
        )
    return reference


def _state_dir() -> str:
    # Short (providerd allows 22 bytes).
    return f"/var/tmp/agx-{os.getuid()}-k8"


class KubernetesProvider(LocalProvider):
    """Sandboxes as Pods of the provider service's Kubernetes backend (module
    docstring).

    `SandboxConfig` fields:
      image: the task image (pulled by the cluster as the Pod's
        ``imagePullPolicy`` says).
      bundle: the bundle image reference (``oci-ref:`` optional), best pinned
        by digest (required for the image-volume mode).
      platform: passed on (the cluster schedules by it).
      env: the sandbox worker's environment (applied when it is armed, never
        in the Pod object).
      resource: ``cpu``, ``memory`` and ``gpu`` as Pod requests = limits.
    """

    def __init__(self, config: KubernetesProviderConfig | None = None, **kwargs: Any) -> None:
        if config is not None and kwargs:
            raise TypeError("pass either a KubernetesProviderConfig or keyword settings, not both")
        self.config = config if config is not None else KubernetesProviderConfig(**kwargs)  # type: ignore[assignment]
        self._init_client([])

    def providerd_flags(self) -> list[str]:
        """The flags of the per-user providerd this provider starts."""
        config: KubernetesProviderConfig = self.config  # type: ignore[assignment]
        if config.in_cluster:
            flags = ["--kubernetes-in-cluster"]
        else:
            kubeconfig = config.kubeconfig or default_kubeconfig()
            if kubeconfig is None:
                raise FileNotFoundError(
                    "no kubeconfig found (looked at $KUBECONFIG and ~/.kube/config): set "
                    f"KubernetesProviderConfig.kubeconfig or in_cluster, or {URL_ENV} to a providerd serving "
                    "the kubernetes backend"
                )
            flags = [f"--kubernetes-kubeconfig={os.path.abspath(os.path.expanduser(kubeconfig))}"]
            if config.context:
                flags.append(f"--kubernetes-context={config.context}")
        if config.namespace:
            flags.append(f"--kubernetes-namespace={config.namespace}")
        flags += [
            f"--kubernetes-runtime-port={config.runtime_port}",
            f"--state-dir={_state_dir()}",
            f"--instance={config.instance or default_instance()}",
        ]
        return flags

    def _socket_name(self) -> str:
        return "providerd-kubernetes.sock"

    async def create(self, config: SandboxConfig) -> Sandbox:
        if not isinstance(config, SandboxConfig):
            raise TypeError(f"create() needs a SandboxConfig (got {type(config).__name__})")
        if not config.image or config.image in ("host", "/"):
            raise ValueError("SandboxConfig.image must name the task image the Pod runs")
        reference = bundle_reference(config.bundle)
        resolved = SandboxConfig(
            image=config.image, bundle=_OCI_PREFIX + reference, platform=config.platform, env=config.env,
            resource=config.resource,
        )
        provider_config: KubernetesProviderConfig = self.config  # type: ignore[assignment]
        network = provider_config.network.lower() if provider_config.network else None
        spec = spec_from_config(
            resolved, backend=BACKEND, ttl=provider_config.ttl, network=network, warm_pool=provider_config.warm_pool,
        )
        return await self._create_owned(spec)

    async def deploy_bundle(
        self, bundle: Path, *, name: str | None = None, platform: str | None = None
    ) -> DeployedBundle:
        """Not available: a Pod's bundle is an image the cluster pulls; push
        the bundle's OCI image and pass its reference as ``bundle``."""
        raise NotImplementedError(
            "KubernetesProvider takes the bundle as an image reference: push the bundle's OCI image "
            "(the bundler writes it as an OCI layout under its output's `oci/`) to a registry the cluster pulls from"
        )

    def prune(self) -> list[str]:
        """Nothing on this machine to prune: returns []."""
        return []
