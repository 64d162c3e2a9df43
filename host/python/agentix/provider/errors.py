"""Errors of the provider service (``agentix-providerd``) as Python exceptions.

Every error the service returns is a gRPC status code with a machine-readable
reason (trailing metadata ``agentix-error-reason``) and, when a later retry
may succeed, ``agentix-retry-after-ms``. `from_rpc_error` turns one into a
`ProviderError` subclass that is *also* the built-in type the in-process
`LocalProvider` raised for the same mistake, so code written against it keeps
catching what it caught:

==========================  ===================================  ===================
gRPC code / reason          class                                also a
==========================  ===================================  ===================
INVALID_ARGUMENT            `InvalidRequest`                     ValueError
NOT_FOUND                   `NotFound`                           KeyError
ALREADY_EXISTS              `AlreadyExists`                      ValueError
FAILED_PRECONDITION         `Unenforceable`                      ValueError, RuntimeError
  reason START_FAILED       `SandboxStartFailed`                 RuntimeError
  reason SANDBOX_TERMINATED `SandboxTerminated`                  RuntimeError
DEADLINE_EXCEEDED           `ProviderTimeout`                    TimeoutError
RESOURCE_EXHAUSTED          `Exhausted`                          RuntimeError
UNAVAILABLE                 `ProviderUnavailable`                ConnectionError
UNAUTHENTICATED             `Unauthenticated`                    PermissionError
anything else               `ProviderFailure`                    RuntimeError
==========================  ===================================  ===================

Each carries ``.code`` (the `grpc.StatusCode` name, e.g. ``"NOT_FOUND"``),
``.reason`` (e.g. ``"SANDBOX_NOT_FOUND"``; ``""`` when the server sent none),
``.retry_after`` (seconds or None) and ``.message`` (the server's text).
Importing this module does not import gRPC.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlreadyExists",
    "Exhausted",
    "InvalidRequest",
    "NotFound",
    "ProviderError",
    "ProviderFailure",
    "ProviderTimeout",
    "ProviderUnavailable",
    "SandboxStartFailed",
    "SandboxTerminated",
    "Unauthenticated",
    "Unenforceable",
    "from_rpc_error",
]

REASON_KEY = "agentix-error-reason"
RETRY_AFTER_KEY = "agentix-retry-after-ms"


class ProviderError(Exception):
    """An error from the provider service (or reaching it)."""

    def __init__(self, message: str, *, code: str = "UNKNOWN", reason: str = "", retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.retry_after = retry_after

    def __str__(self) -> str:  # KeyError's str() would quote the message
        return self.message

    def describe(self) -> str:
        """``REASON (CODE): message``, as the CLI prints it."""
        label = self.reason or self.code
        if self.reason and self.code and self.code != self.reason:
            label = f"{self.reason} ({self.code})"
        return f"{label}: {self.message}"


class InvalidRequest(ProviderError, ValueError):
    """INVALID_ARGUMENT: a bad spec, selector, ttl, or a reused request_id."""


class NotFound(ProviderError, KeyError):
    """NOT_FOUND: no such sandbox or pool."""


class AlreadyExists(ProviderError, ValueError):
    """ALREADY_EXISTS: the sandbox id or pool name is taken."""


class Unenforceable(ProviderError, ValueError, RuntimeError):
    """FAILED_PRECONDITION: the backend cannot do what was asked (a limit
    without a cgroup, a GPU, a foreign platform, a pool that does not match).
    A ValueError (the in-process provider refused GPUs and platforms so) and
    a RuntimeError (it refused unenforceable limits so)."""


class SandboxStartFailed(ProviderError, RuntimeError):
    """The sandbox's entry point failed before its runtime came up; the
    message ends with the sandbox's output."""


class SandboxTerminated(ProviderError, RuntimeError):
    """The sandbox is TERMINATED (or ended while it was waited for)."""


class ProviderTimeout(ProviderError, TimeoutError):
    """DEADLINE_EXCEEDED: the sandbox was not ready in time (reason
    READY_TIMEOUT, the message ends with its output) or the call ran out of time."""


class Exhausted(ProviderError, RuntimeError):
    """RESOURCE_EXHAUSTED: a quota, or an empty pool with on_pool_miss=FAIL."""


class ProviderUnavailable(ProviderError, ConnectionError):
    """UNAVAILABLE: providerd is unreachable or shutting down."""


class Unauthenticated(ProviderError, PermissionError):
    """UNAUTHENTICATED: a missing or wrong provider token."""


class ProviderFailure(ProviderError, RuntimeError):
    """Any other code: INTERNAL (a bug: report it), ABORTED, UNIMPLEMENTED, ..."""


_BY_CODE: dict[str, type[ProviderError]] = {
    "INVALID_ARGUMENT": InvalidRequest,
    "NOT_FOUND": NotFound,
    "ALREADY_EXISTS": AlreadyExists,
    "FAILED_PRECONDITION": Unenforceable,
    "DEADLINE_EXCEEDED": ProviderTimeout,
    "RESOURCE_EXHAUSTED": Exhausted,
    "UNAVAILABLE": ProviderUnavailable,
    "UNAUTHENTICATED": Unauthenticated,
}
_BY_REASON: dict[str, type[ProviderError]] = {
    "START_FAILED": SandboxStartFailed,
    "SANDBOX_TERMINATED": SandboxTerminated,
}


def _metadata_value(metadata: Any, key: str) -> str:
    for item in metadata or ():
        name, value = item[0], item[1]
        if name == key:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return ""


def from_rpc_error(error: Any, *, what: str = "") -> ProviderError:
    """The `ProviderError` for a ``grpc.aio.AioRpcError`` (or ``grpc.RpcError``).
    `what` prefixes the message (e.g. ``"create"``)."""
    code = error.code().name if error.code() is not None else "UNKNOWN"
    try:
        metadata = error.trailing_metadata()
    except Exception:  # noqa: BLE001 - a locally made error may have none
        metadata = None
    reason = _metadata_value(metadata, REASON_KEY)
    retry_ms = _metadata_value(metadata, RETRY_AFTER_KEY)
    try:
        retry_after = int(retry_ms) / 1000.0 if retry_ms else None
    except ValueError:
        retry_after = None
    message = error.details() or code
    if what:
        message = f"{what}: {message}"
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code) or ProviderFailure
    return cls(message, code=code, reason=reason, retry_after=retry_after)
