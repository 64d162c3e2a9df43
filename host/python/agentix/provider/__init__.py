"""Sandbox providers: where a bundle runs.

``async with provider.session(config) as sandbox: await sandbox.remote(fn, ...)``
is the whole programming model. `SandboxProvider` (`agentix.provider.base`)
is the interface every backend implements; `providers()` finds backends through
the ``agentix.provider`` entry-point group (`agentix.provider._plugin`), and
`register_provider` adds one in-process. The built-in backend is ``local``
(`agentix.provider.local.LocalProvider`, bubblewrap on this machine through the
per-user provider service); `agentix.provider.service.ServiceProvider` talks to
any ``agentix-providerd``, and `agentix.provider.errors` holds its errors.

`agentix.provider` is a ``pkgutil`` namespace package: plugin distributions add
siblings such as ``agentix.provider.docker``. Importing it does not import gRPC.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

from agentix.provider._plugin import providers  # noqa: E402
from agentix.provider.base import (  # noqa: E402
    BundleDeployer,
    DeployedBundle,
    Sandbox,
    SandboxConfig,
    SandboxId,
    SandboxInfo,
    SandboxProvider,
    SandboxResource,
    register_provider,
)

__all__ = [
    "BundleDeployer",
    "DeployedBundle",
    "Sandbox",
    "SandboxConfig",
    "SandboxId",
    "SandboxInfo",
    "SandboxProvider",
    "SandboxResource",
    "providers",
    "register_provider",
]
