"""Agentix: run Python functions inside sandboxes from a host program.

``await client.remote(fn, *args, **kwargs)`` runs the importable function `fn`
in the sandbox and returns its value; `try_remote` returns `Ok` / `Failed`
instead of raising. Results are decoded through an allowlist (the standard
value types and numpy arrays included); `allow_type(Class)` and
`allow_callable(module, name)` admit more. Sandbox log records are replayed
into the host's stdlib logging; `configure_logging` (``agentix.log``) sets up a handler and format.
``agentix.trace`` records traces and spans (`agentix.utils.trace`); the current
trace/span travels with every remote call through ``agentix.context``.

`agentix` is a ``pkgutil`` namespace package: plugin distributions add sibling
modules (``agentix.bash``, ``agentix.files``, ...). Importing it does not import
gRPC; `RuntimeClient` (and with it gRPC) and the provider API load on first
access.
"""

from pkgutil import extend_path
from typing import TYPE_CHECKING, Any

__path__ = extend_path(__path__, __name__)

__version__ = "0.3.0"

from agentix.runtime.client.errors import (  # noqa: E402
    CallCancelled,
    CallTimeout,
    RemoteCallError,
    ResultTooLarge,
    RuntimeUnreachable,
    Unauthenticated,
    WorkerExited,
)
from agentix.runtime.client.bundle_check import StaleModuleError  # noqa: E402
from agentix.runtime.client._sio_facade import AsyncClientNamespace, request_handler  # noqa: E402
from agentix.runtime.client.result import Failed, Ok, Result  # noqa: E402
from agentix.runtime.shared.callables import RemoteCallable  # noqa: E402
from agentix.runtime.shared.safepickle import RestrictedUnpickleError, allow_callable, allow_type  # noqa: E402
from agentix.sio import Namespace, RemoteSioError, register_namespace  # noqa: E402
from agentix.utils import context, log, trace  # noqa: E402
from agentix.utils.log import configure_logging  # noqa: E402

__all__ = [
    "AsyncClientNamespace",
    "BundleDeployer",
    "CallCancelled",
    "CallTimeout",
    "DeployedBundle",
    "Failed",
    "Namespace",
    "Ok",
    "RemoteCallError",
    "RemoteCallable",
    "RemoteSioError",
    "RestrictedUnpickleError",
    "Result",
    "ResultTooLarge",
    "RuntimeClient",
    "RuntimeUnreachable",
    "Sandbox",
    "SandboxConfig",
    "SandboxId",
    "SandboxInfo",
    "SandboxProvider",
    "SandboxResource",
    "StaleModuleError",
    "Unauthenticated",
    "WorkerExited",
    "__version__",
    "allow_callable",
    "allow_type",
    "configure_logging",
    "context",
    "log",
    "providers",
    "register_namespace",
    "register_provider",
    "request_handler",
    "trace",
]


if TYPE_CHECKING:  # what __getattr__ returns, for type checkers
    from agentix.provider import (  # noqa: F401
        BundleDeployer,
        DeployedBundle,
        Sandbox,
        SandboxConfig,
        SandboxId,
        SandboxInfo,
        SandboxProvider,
        SandboxResource,
        providers,
        register_provider,
    )
    from agentix.runtime.client.client import RuntimeClient  # noqa: F401

# Loaded on first access: the provider API imports importlib.metadata (~30 ms),
# which every sandbox worker would otherwise pay at start without using it.
_PROVIDER_NAMES = frozenset(
    {
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
    }
)


def __getattr__(name: str) -> Any:
    if name == "RuntimeClient":
        from agentix.runtime.client import RuntimeClient

        return RuntimeClient
    if name in _PROVIDER_NAMES:
        import agentix.provider

        return getattr(agentix.provider, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
