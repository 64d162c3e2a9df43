"""Host-side remote-call client.

The exceptions and result types import without gRPC; `RuntimeClient` (which
needs ``grpcio`` and the generated stubs) loads on first access.
"""

from agentix.runtime.client.errors import (
    CallCancelled,
    CallTimeout,
    RemoteCallError,
    ResultTooLarge,
    RuntimeUnreachable,
    Unauthenticated,
    WorkerExited,
)
from agentix.runtime.client.result import Failed, Ok, Result
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what __getattr__ returns, for type checkers
    from agentix.runtime.client.client import RuntimeClient  # noqa: F401

__all__ = [
    "CallCancelled",
    "CallTimeout",
    "Failed",
    "Ok",
    "RemoteCallError",
    "Result",
    "ResultTooLarge",
    "RuntimeClient",
    "RuntimeUnreachable",
    "Unauthenticated",
    "WorkerExited",
]


def __getattr__(name: str) -> Any:
    if name == "RuntimeClient":
        from agentix.runtime.client.client import RuntimeClient

        return RuntimeClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
