"""Exceptions a remote call raises on the host.

`RemoteCallError` and its subclasses report a failure the sandbox described (a
`RemoteError`); `CallTimeout` and `RuntimeUnreachable` are decided by the host.
`try_remote` turns all five into `Failed`.
"""

from __future__ import annotations

from agentix.runtime.shared.models import RemoteError
from agentix.runtime.shared.safepickle import RestrictedUnpickleError

__all__ = [
    "CallCancelled",
    "CallTimeout",
    "RemoteCallError",
    "ResultTooLarge",
    "RuntimeUnreachable",
    "WorkerExited",
    "remote_call_error",
]


class RemoteCallError(RuntimeError):
    """The remote call failed in the sandbox.

    ``str(exc)`` is ``"{display_name}: {type}: {message}"``, followed by
    ``"\\n--- sandbox traceback ---\\n{traceback}"`` when the sandbox sent one.
    """

    def __init__(self, display_name: str, error: RemoteError) -> None:
        self.display_name = display_name
        self.error = error
        text = f"{display_name}: {error.type}: {error.message}"
        if error.traceback:
            text += f"\n--- sandbox traceback ---\n{error.traceback}"
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.display_name, self.error))


class CallCancelled(RemoteCallError):
    """The sandbox cancelled the call (``error.cancelled`` is true)."""


class WorkerExited(RemoteCallError):
    """The sandbox worker process died while running the call."""

    @property
    def returncode(self) -> int | None:
        """The worker's exit code, or minus the signal that killed it."""
        return self.error.returncode


class CallTimeout(RuntimeError):
    """The call outlived the client's ``call_deadline``; the sandbox was told to cancel it."""


class ResultTooLarge(RestrictedUnpickleError):
    """The call's encoded result (or one streamed item) exceeds the client's
    ``max_result_bytes``; it was dropped unread and the sandbox told to
    cancel the call. Like any `RestrictedUnpickleError`, `try_remote` raises
    it rather than returning `Failed`."""


class RuntimeUnreachable(RuntimeError):
    """The sandbox runtime could not be reached, the connection was lost, or the
    client was closed while the call was in flight."""


def remote_call_error(display_name: str, error: RemoteError) -> RemoteCallError:
    """Returns the exception class that matches `error`: `CallCancelled` when
    cancelled, `WorkerExited` for ``"WorkerDied"``, else `RemoteCallError`."""
    if error.cancelled:
        return CallCancelled(display_name, error)
    if error.type == "WorkerDied":
        return WorkerExited(display_name, error)
    return RemoteCallError(display_name, error)
