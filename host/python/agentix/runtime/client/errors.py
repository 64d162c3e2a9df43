"""Exceptions a remote call raises on the host.

`RemoteCallError` and its subclasses report a failure the sandbox described (a
`RemoteError`); `CallTimeout` and `RuntimeUnreachable` are decided by the host.
`try_remote` turns all five into `Failed`.

Exception types: when the sandbox exception's class is admitted on the host
(a builtin exception class, or a class registered with `allow_type`; see
`safepickle.admitted_class`) and is an `Exception`, `remote_call_error`
returns an instance of a class deriving from both `RemoteCallError` and that
class, so ``except ValueError`` and ``except RemoteCallError`` both catch it.
Its ``args`` and attributes are the sandbox exception's, decoded through the
host allowlist (`restricted_loads`, never plain pickle); its ``__init__`` is
not run. ``str()``, ``.display_name`` and ``.error`` are the `RemoteCallError`
ones (they win over a sandbox attribute of the same name). Anything else (a
class not admitted, arguments the allowlist refuses, a `BaseException` such
as ``KeyboardInterrupt`` or ``SystemExit``, which must not act as one on the
host) gives the plain `RemoteCallError`, whose message names the class by its
qualified name.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from agentix.runtime.shared.models import RemoteError
from agentix.runtime.shared.safepickle import (
    DecodeBusy,
    RestrictedUnpickleError,
    admitted_class,
    restricted_loads,
)

__all__ = [
    "CallCancelled",
    "CallTimeout",
    "RemoteCallError",
    "ResultTooLarge",
    "RuntimeUnreachable",
    "Unauthenticated",
    "WorkerExited",
    "remote_call_error",
    "remote_call_error_async",
]


class RemoteCallError(RuntimeError):
    """The remote call failed in the sandbox.

    ``str(exc)`` is ``"{display_name}: {type}: {message}"``, followed by
    ``"\\n--- sandbox traceback ---\\n{traceback}"`` when the sandbox sent one.
    """

    def __init__(self, display_name: str, error: RemoteError) -> None:
        self.display_name = display_name
        self.error = error
        super().__init__(_describe(display_name, error))

    def __reduce__(self):
        return (type(self), (self.display_name, self.error))

    @property
    def remote_traceback(self) -> str | None:
        """The formatted sandbox traceback, if the sandbox sent one."""
        return self.error.traceback


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


class Unauthenticated(PermissionError):
    """The daemon refused the client's bearer token (gRPC ``UNAUTHENTICATED``):
    none was sent to a daemon started with ``--token-file`` / ``$AGENTIX_TOKEN``,
    or it was the wrong one. Not retried (another attempt sends the same
    token) and not turned into `Failed` by `try_remote`: fix the token
    (``RuntimeClient(url, token=...)`` or ``$AGENTIX_TOKEN``). ``code`` is
    ``"UNAUTHENTICATED"``."""

    code = "UNAUTHENTICATED"


def remote_call_error(display_name: str, error: RemoteError, *, wait: bool = True) -> RemoteCallError:
    """Returns the exception that matches `error`: `CallCancelled` when
    cancelled, `WorkerExited` for ``"WorkerDied"``, an instance of both
    `RemoteCallError` and the sandbox exception's class when that class is
    admitted (see the module docstring), else `RemoteCallError`.

    ``wait=False`` raises `DecodeBusy` rather than wait for another thread's
    decode (see `restricted_loads`)."""
    if error.cancelled:
        return CallCancelled(display_name, error)
    if error.type == "WorkerDied":
        return WorkerExited(display_name, error)
    typed = _typed_error(display_name, error, wait)
    return typed if typed is not None else RemoteCallError(display_name, error)


async def remote_call_error_async(display_name: str, error: RemoteError) -> RemoteCallError:
    """`remote_call_error` for the event loop: decodes inline unless another
    thread holds the decoder, then on the default executor."""
    try:
        return remote_call_error(display_name, error, wait=False)
    except DecodeBusy:
        return await asyncio.get_running_loop().run_in_executor(None, remote_call_error, display_name, error)


# Bounds on what the sandbox sends about its exception (the worker and the
# daemon enforce the state bound too).
MAX_EXCEPTION_STATE_BYTES = 64 * 1024
_MAX_TYPE_NAME_CHARS = 512

# Builtin attributes kept outside args and __dict__, and the builtin class
# whose descriptor sets each (see the worker's _EXCEPTION_MEMBERS).
_MEMBERS: dict[str, type] = {
    "filename": OSError,
    "filename2": OSError,
    "name": ImportError,
    "path": ImportError,
}

# admitted class -> its RemoteCallError twin. Bounded: the admitted classes
# are the builtins and the registered ones; beyond the bound twins are built
# per error and not kept.
_TWINS_LIMIT = 512
_twins: dict[type, type[RemoteCallError]] = {}

_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python


def _qualified(error: RemoteError) -> str:
    """``module.qualname`` of the sandbox exception's class; the bare type for
    builtins and the runtime's own types."""
    module, qualname = error.type_module, error.type_qualname
    if not module or not qualname or module == "builtins":
        return error.type
    return f"{module}.{qualname}"[:_MAX_TYPE_NAME_CHARS]


def _describe(display_name: str, error: RemoteError) -> str:
    text = f"{display_name}: {_qualified(error)}: {error.message}"
    if error.traceback:
        text += f"\n--- sandbox traceback ---\n{error.traceback}"
    return text


def _twin_str(self: RemoteCallError) -> str:
    return _describe(self.display_name, self.error)


def _twin_reduce(self: RemoteCallError) -> tuple:
    return (remote_call_error, (self.display_name, self.error))


def _twin(cls: type) -> type[RemoteCallError]:
    """The class deriving from `RemoteCallError` and `cls`; raises TypeError
    when they cannot be combined."""
    twin = _twins.get(cls)
    if twin is None:
        name = f"RemoteCallError({cls.__qualname__})"
        namespace = {"__module__": __name__, "__qualname__": name, "__str__": _twin_str, "__reduce__": _twin_reduce}
        twin = cast("type[RemoteCallError]", type(name, (RemoteCallError, cls), namespace))
        if len(_twins) < _TWINS_LIMIT:
            _twins[cls] = twin
    return twin


def _builtin_base(cls: type) -> type[BaseException]:
    """The first class of cls's MRO implemented in C (whose __new__ and
    __init__ run no Python code); for an exception class, BaseException or a
    builtin subclass of it."""
    for base in cls.__mro__:
        if not base.__flags__ & _HEAP_TYPE and issubclass(base, BaseException):
            return base
    return BaseException


def _typed_error(display_name: str, error: RemoteError, wait: bool) -> RemoteCallError | None:
    """The exception of both `RemoteCallError` and the sandbox exception's
    class, or None when that class is not admitted or the state is refused.
    Raises `DecodeBusy` (``wait=False`` only)."""
    module, qualname, state = error.type_module, error.type_qualname, error.state
    if not module or not qualname or not state:
        return None
    if len(state) > MAX_EXCEPTION_STATE_BYTES or len(module) + len(qualname) > _MAX_TYPE_NAME_CHARS:
        return None
    cls = admitted_class(module, qualname)
    if cls is None or not issubclass(cls, Exception) or issubclass(cls, RemoteCallError):
        return None
    try:
        decoded = restricted_loads(state, wait=wait)
    except DecodeBusy:
        raise
    except Exception:  # refused or malformed: the plain error
        return None
    try:
        return _build(cls, display_name, error, decoded)
    except Exception:  # layout conflict, or arguments the builtin refuses
        return None


def _build(cls: type, display_name: str, error: RemoteError, decoded: Any) -> RemoteCallError | None:
    if type(decoded) is not tuple or len(decoded) != 3:
        return None
    args, members, attributes = decoded
    if type(args) is not tuple or type(members) is not dict or type(attributes) is not dict:
        return None
    if not all(type(key) is str for key in attributes):
        return None
    twin = _twin(cls)
    # Built the way unpickling builds an exception, minus cls's own Python
    # __new__/__init__ (which may take other arguments, or have effects):
    # the C base's __new__ and __init__ take args as the original did.
    static = twin
    while static.__flags__ & _HEAP_TYPE:  # the C base whose layout twin has
        static = static.__base__
    instance = static.__new__(twin, *args)
    _builtin_base(cls).__init__(instance, *args)
    for key, value in members.items():
        owner = _MEMBERS.get(key) if type(key) is str else None
        if owner is None or not isinstance(instance, owner):
            return None
        owner.__dict__[key].__set__(instance, value)
    instance.__dict__.update(attributes)
    instance.__dict__.update(display_name=display_name, error=error)
    return instance
