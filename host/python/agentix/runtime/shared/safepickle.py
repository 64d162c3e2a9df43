"""Restricted unpickling of values that cross the sandbox -> host boundary.

Return values arrive as ``pickle.dumps(value)`` produced by code running in the
sandbox, which may be less trusted than the host (a cloned repository, a
generated patch, a benchmark task). Plain ``pickle.loads`` calls whatever
callables the stream names, so the host decodes through an exact allowlist:

1. classes registered with `allow_type` (returned as registered, never imported);
2. `SAFE_TYPES`: reviewed value types, imported and required to be classes;
3. inert reconstruction helpers (``copyreg`` and numpy's ``_reconstruct``);
4. ``builtins``: the builtin value types and every exception class, nothing else
   (no ``eval``, ``exec``, ``getattr``, ``__import__``, ...);
5. anything else is refused *without importing its module*, so a stream cannot
   run a module's import-time code on the host.

An allowlist rather than a denylist: a stream can name a C accelerator module
(``_operator`` for ``operator``), a callable left on pickle's stack is invoked
without passing through ``find_class``, and many constructors have side effects;
only a closed set of value types is safe against all three.

EXT1/EXT2/EXT4 opcodes are refused up front: the unpickler serves them from
``copyreg``'s extension cache without consulting ``find_class``.

Relaxing: `allow_type(Class)` trusts one exact class; ``AGENTIX_PICKLE_TRUST=1``
(or ``true``/``yes``, read on every call) restores plain ``pickle.loads``.

Host -> sandbox arguments are plain pickle: that direction is trusted.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
from typing import Any

__all__ = [
    "RestrictedUnpickleError",
    "RestrictedUnpickler",
    "SAFE_TYPES",
    "allow_type",
    "restricted_loads",
]

_GlobalName = tuple[str, str]

SAFE_TYPES: frozenset[_GlobalName] = frozenset(
    {
        ("datetime", "date"),
        ("datetime", "time"),
        ("datetime", "datetime"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("decimal", "Decimal"),
        ("fractions", "Fraction"),
        ("uuid", "UUID"),
        ("collections", "OrderedDict"),
        ("collections", "defaultdict"),
        ("collections", "Counter"),
        ("collections", "deque"),
        ("pathlib", "PurePath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
        ("pathlib", "Path"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib._local", "PurePath"),
        ("pathlib._local", "PurePosixPath"),
        ("pathlib._local", "PureWindowsPath"),
        ("pathlib._local", "Path"),
        ("pathlib._local", "PosixPath"),
        ("pathlib._local", "WindowsPath"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        # First-party plugin results: part of the bundle the host itself deploys.
        ("agentix.bridge.proxy", "TunnelHandle"),
        ("agentix.bash", "BashResult"),
        ("agentix.files", "UploadResult"),
        ("agentix.agents.claude_code.agent", "ClaudeCodeResult"),
        ("agentix.agents.qwen_code", "Result"),
        ("agentix.plugins.datasets.swe.env", "PrepareEnvResult"),
    }
)

# Functions that only rebuild a value from (also gated) arguments.
_SAFE_CALLABLES: frozenset[_GlobalName] = frozenset(
    {
        ("copyreg", "_reconstructor"),
        ("copyreg", "__newobj__"),
        ("copyreg", "__newobj_ex__"),
        ("numpy._core.multiarray", "_reconstruct"),  # numpy >= 2
        ("numpy.core.multiarray", "_reconstruct"),  # numpy < 2
    }
)

# Builtin classes admitted besides BaseException subclasses. Builtin functions
# (eval, getattr, ...) are not classes, so they can never match.
_SAFE_BUILTIN_TYPES: frozenset[type] = frozenset(
    {complex, range, slice, bytearray, frozenset, set, list, dict, tuple, bytes, str, int, float, bool}
)

_EXTENSION_OPCODES = frozenset({"EXT1", "EXT2", "EXT4"})
# The first byte of each EXT opcode; a stream without any of them has none.
_EXTENSION_OPCODE_BYTES = (b"\x82", b"\x83", b"\x84")

_allowed_types: dict[_GlobalName, type] = {}


class RestrictedUnpickleError(pickle.UnpicklingError):
    """A sandbox return value named something the host allowlist refuses."""


def allow_type(cls: type) -> None:
    """Trusts exactly `cls` (by ``__module__`` and ``__qualname__``) in return values.

    Only that class is admitted, not its module or subclasses; the stream gets
    the registered class object itself.
    """
    if not isinstance(cls, type):
        raise TypeError("allow_type() requires a class")
    _allowed_types[(cls.__module__, cls.__qualname__)] = cls


def _trust_enabled() -> bool:
    return os.environ.get("AGENTIX_PICKLE_TRUST", "").strip().lower() in ("1", "true", "yes")


class RestrictedUnpickler(pickle.Unpickler):
    """A `pickle.Unpickler` whose ``find_class`` enforces the allowlist."""

    def find_class(self, module: str, name: str) -> Any:
        global_name = (module, name)
        registered = _allowed_types.get(global_name)
        if registered is not None:
            return registered

        if global_name in SAFE_TYPES:
            found = super().find_class(module, name)
            if not isinstance(found, type):
                raise RestrictedUnpickleError(
                    f"refusing to reconstruct {module}.{name}: the allowlisted value "
                    f"global did not resolve to a type"
                )
            return found

        if global_name in _SAFE_CALLABLES:
            return super().find_class(module, name)

        if module == "builtins":
            found = super().find_class(module, name)
            if isinstance(found, type) and (found in _SAFE_BUILTIN_TYPES or issubclass(found, BaseException)):
                return found
            raise RestrictedUnpickleError(
                f"refusing builtins.{name}: only builtin value types and exceptions may "
                f"cross the sandbox→host boundary. Set AGENTIX_PICKLE_TRUST=1 to trust the "
                f"sandbox fully."
            )

        raise RestrictedUnpickleError(
            f"refusing to reconstruct {module}.{name}: it is not on the host allowlist for "
            f"sandbox return values. If this is a return type you trust, import its class "
            f"and call agentix.runtime.shared.safepickle.allow_type(Class) before the call; "
            f"or set AGENTIX_PICKLE_TRUST=1 to trust the sandbox fully."
        )


def _check_opcodes(data: bytes) -> None:
    """Refuses extension opcodes and streams that do not parse as pickle."""
    try:
        for opcode, _arg, _pos in pickletools.genops(data):
            if opcode.name in _EXTENSION_OPCODES:
                raise RestrictedUnpickleError(
                    f"refusing pickle opcode {opcode.name}: extension opcodes cannot be "
                    f"safely validated against the exact allowlist"
                )
    except RestrictedUnpickleError:
        raise
    except Exception as exc:
        raise RestrictedUnpickleError(f"refusing malformed pickle opcode stream: {exc}") from exc


def restricted_loads(data: bytes) -> Any:
    """Decodes sandbox-produced pickle bytes through the host allowlist.

    Raises `RestrictedUnpickleError` for a refused global, an extension opcode or
    a malformed stream; errors raised by an admitted constructor propagate as
    they are. ``AGENTIX_PICKLE_TRUST=1`` bypasses every check.
    """
    if _trust_enabled():
        return pickle.loads(data)
    # Scanning opcodes in Python costs ~15x the load itself, so it runs up front
    # only when an EXT opcode is possible. Otherwise it runs only if loading fails,
    # which reports a malformed stream exactly as an up-front scan would.
    if any(marker in data for marker in _EXTENSION_OPCODE_BYTES):
        _check_opcodes(data)
        return RestrictedUnpickler(io.BytesIO(data)).load()
    try:
        return RestrictedUnpickler(io.BytesIO(data)).load()
    except RestrictedUnpickleError:
        raise
    except Exception:
        _check_opcodes(data)
        raise
