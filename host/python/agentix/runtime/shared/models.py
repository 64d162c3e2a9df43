"""Plain data the runtime reports to a host."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HealthResponse", "RemoteError"]


@dataclass(frozen=True)
class HealthResponse:
    """Answer of `RuntimeClient.health()`: ``status`` is ``"ok"`` whenever the
    runtime answers; ``version`` is the agentix version it was built from."""

    status: str
    version: str


@dataclass
class RemoteError:
    """Why a remote call failed, as reported by the sandbox.

    ``type`` is the exception class name raised by the function (``"ValueError"``)
    or one of the runtime's own types (``"Cancelled"``, ``"WorkerDied"``,
    ``"ResultUnavailable"``, ...); ``traceback`` is the formatted sandbox traceback
    when there is one; ``cancelled`` is true exactly for ``"Cancelled"``;
    ``returncode`` is the worker's exit code (minus the signal number) for
    ``"WorkerDied"``. For an exception raised by Python code, ``type_module``
    and ``type_qualname`` name its class (``"builtins"``, ``"ValueError"``) and
    ``state`` holds its arguments and attributes as the sandbox pickled them
    (decoded only through the host allowlist; see `remote_call_error`).
    """

    type: str
    message: str
    traceback: str | None = None
    cancelled: bool = False
    returncode: int | None = None
    type_module: str | None = None
    type_qualname: str | None = None
    state: bytes | None = field(default=None, repr=False)
