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

Two more holes an allowlist of names alone leaves open are closed here:

- BUILD applied to a *class* the stream named (not to an instance) makes
  pickle's default ``__setstate__`` run ``setattr(cls, key, value)``, which
  would rewrite that class (``fractions.Fraction.__repr__``,
  ``pathlib.PurePath.__str__``, ...) for the whole host process. Every mutable
  class handed out is snapshotted; a load that changed one is undone and
  refused. Allowlisted functions are handed out as fresh per-load wrappers, so
  there is nothing shared to change.
- Size arguments: ``bytes(n)`` / ``bytearray(n)`` through REDUCE or NEWOBJ
  would allocate ``n`` bytes from a few bytes of stream, and
  ``Fraction("1e100000000")`` would compute ``10**100000000``. These
  constructors are served through bounded stand-ins that refuse an integer
  size and an exponent beyond ``_MAX_FRACTION_EXPONENT``, and otherwise return
  the real ``bytes``/``bytearray``/``Fraction``.

Relaxing: `allow_type(Class)` trusts one exact class; ``AGENTIX_PICKLE_TRUST=1``
(or ``true``/``yes``, read on every call) restores plain ``pickle.loads``.

Host -> sandbox arguments are plain pickle: that direction is trusted.
"""

from __future__ import annotations

import copyreg
import fractions
import io
import os
import pickle
import pickletools
import re
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

_MISSING = object()

_EXTENSION_OPCODES = frozenset({"EXT1", "EXT2", "EXT4"})
# The first byte of each EXT opcode; a stream without any of them has none.
_EXTENSION_OPCODE_BYTES = (b"\x82", b"\x83", b"\x84")

_allowed_types: dict[_GlobalName, type] = {}

# Py_TPFLAGS_IMMUTABLETYPE (3.10+): builtin and most C types cannot be changed.
_IMMUTABLE_TYPE_FLAG = 1 << 8
# 10**10000 takes microseconds; 10**100000000 takes minutes.
_MAX_FRACTION_EXPONENT = 10000
_FRACTION_EXPONENT = re.compile(r"[eE]\s*([-+]?[0-9_]+)")


def _refuse_size(kind: str, args: tuple) -> None:
    if args and isinstance(args[0], int):
        raise RestrictedUnpickleError(
            f"refusing {kind}({args[0]!r}) in a sandbox return value: a size argument "
            f"would allocate memory the stream does not carry"
        )


class _BoundedBytes(bytes):
    """Serves ``builtins.bytes``: the real constructor, minus ``bytes(n)``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        _refuse_size("bytes", args)
        return bytes(*args, **kwargs)


class _BoundedByteArray(bytearray):
    """Serves ``builtins.bytearray``: the real constructor, minus ``bytearray(n)``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        _refuse_size("bytearray", args)
        return bytearray(*args, **kwargs)


class _BoundedFraction(fractions.Fraction):
    """Serves ``fractions.Fraction``: refuses huge decimal exponents in strings."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        for arg in args:
            if isinstance(arg, str):
                for match in _FRACTION_EXPONENT.finditer(arg):
                    if abs(int(match.group(1))) > _MAX_FRACTION_EXPONENT:
                        raise RestrictedUnpickleError(
                            f"refusing Fraction({arg[:40]!r}): exponent beyond "
                            f"{_MAX_FRACTION_EXPONENT}"
                        )
        return fractions.Fraction(*args, **kwargs)


_BOUNDED_CONSTRUCTORS: dict[_GlobalName, type] = {
    ("builtins", "bytes"): _BoundedBytes,
    ("builtins", "bytearray"): _BoundedByteArray,
    ("fractions", "Fraction"): _BoundedFraction,
}


def _fresh_wrapper(function: Any) -> Any:
    """A per-load stand-in for an allowlisted function (BUILD can only touch it)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return call


def _class_state(cls: type) -> tuple:
    return (dict(cls.__dict__), cls.__bases__, cls.__name__, cls.__qualname__)


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
    """A `pickle.Unpickler` whose ``find_class`` enforces the allowlist.

    ``load()`` also refuses (and undoes) a stream that modified a class it named.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # id -> (class, state before this load) for every mutable class handed out.
        self._class_states: dict[int, tuple[type, tuple]] = {}

    def load(self) -> Any:
        try:
            value = super().load()
        finally:
            changed = self._undo_class_changes()
        if changed:
            raise RestrictedUnpickleError(
                f"refusing a pickle stream that modified the host class(es) "
                f"{', '.join(changed)} (BUILD applied to a class); the change was undone"
            )
        return value

    def _undo_class_changes(self) -> list[str]:
        changed = []
        for cls, before in self._class_states.values():
            if _class_state(cls) == before:
                continue
            changed.append(f"{cls.__module__}.{before[3]}")
            namespace, bases, name, qualname = before
            for key in set(cls.__dict__) - set(namespace):
                delattr(cls, key)
            for key, value in namespace.items():
                if cls.__dict__.get(key, _MISSING) is not value:
                    try:
                        setattr(cls, key, value)
                    except (AttributeError, TypeError):  # read-only slots (__dict__, ...)
                        pass
            if cls.__bases__ != bases:
                cls.__bases__ = bases
            cls.__name__, cls.__qualname__ = name, qualname
        return changed

    def persistent_load(self, pid: Any) -> Any:
        raise RestrictedUnpickleError("refusing a persistent id: sandbox return values have none")

    def find_class(self, module: str, name: str) -> Any:
        found = self._find_allowed(module, name)
        if isinstance(found, type):
            if not found.__flags__ & _IMMUTABLE_TYPE_FLAG and id(found) not in self._class_states:
                self._class_states[id(found)] = (found, _class_state(found))
            return found
        return _fresh_wrapper(found)

    def _find_allowed(self, module: str, name: str) -> Any:
        global_name = (module, name)
        registered = _allowed_types.get(global_name)
        if registered is not None:
            return registered

        bounded = _BOUNDED_CONSTRUCTORS.get(global_name)
        if bounded is not None:
            return bounded

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
            if "." in name:  # a dotted path walks attributes: no value type needs one
                raise RestrictedUnpickleError(
                    f"refusing builtins.{name}: dotted names are not on the host allowlist"
                )
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

    Raises `RestrictedUnpickleError` for a refused global, an extension opcode,
    a stream that modified a class it named, a size argument to ``bytes`` or
    ``bytearray``, or a malformed stream; errors raised by an admitted constructor propagate as
    they are. ``AGENTIX_PICKLE_TRUST=1`` bypasses every check.
    """
    return _restricted_load(io.BytesIO(data), lambda: data)


def restricted_loads_chunks(chunks: list) -> Any:
    """`restricted_loads` of the concatenation of `chunks` (bytes-like
    objects) without building it: large ``bytes`` values are copied straight
    out of the chunks (a result arrives in MiB-sized pieces; joining them
    first would cost one more copy of the whole value)."""
    return _restricted_load(_ChunkReader(chunks), lambda: b"".join(chunks))


def _restricted_load(file: Any, whole: Any) -> Any:
    if _trust_enabled():
        return pickle.load(file)
    # EXT opcodes fetch objects through copyreg's extension registry and
    # cache without asking find_class, so they must be refused up front when
    # that registry is in use. With it empty (the normal case) they can only
    # fail, and are then reported by the scan below. Scanning opcodes in
    # Python costs ~15x the load itself (and a copy of every large value), so
    # otherwise it runs only if loading fails, which reports a malformed
    # stream exactly as an up-front scan would.
    if copyreg._inverted_registry or copyreg._extension_cache:
        data = whole()
        if any(marker in data for marker in _EXTENSION_OPCODE_BYTES):
            _check_opcodes(data)
    try:
        return RestrictedUnpickler(file).load()
    except RestrictedUnpickleError:
        raise
    except pickle.UnpicklingError as exc:
        # The unpickler's own complaint (a truncated FRAME, a bad memo index):
        # malformed in ways the opcode scan does not model.
        _check_opcodes(whole())
        if type(exc) is pickle.UnpicklingError:
            raise RestrictedUnpickleError(f"refusing malformed pickle stream: {exc}") from exc
        raise
    except Exception:
        _check_opcodes(whole())
        raise


class _ChunkReader:
    """A read-only binary file over a list of buffers, for the unpickler
    (which uses ``readinto`` for large values)."""

    def __init__(self, chunks: list) -> None:
        self._chunks = [memoryview(chunk).cast("B") for chunk in chunks if len(chunk)]
        self._index = 0  # current chunk
        self._offset = 0  # position in it

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(target) and self._index < len(self._chunks):
            chunk = self._chunks[self._index]
            count = min(len(target) - filled, len(chunk) - self._offset)
            target[filled : filled + count] = chunk[self._offset : self._offset + count]
            filled += count
            self._offset += count
            if self._offset == len(chunk):
                self._index += 1
                self._offset = 0
        return filled

    def read(self, size: int = -1) -> bytes:
        # Never more than what is left: a stream may claim any frame length,
        # and the buffer is allocated before it is filled.
        left = sum(len(chunk) for chunk in self._chunks[self._index :]) - self._offset
        if size is None or size < 0 or size > left:
            size = left
        buffer = bytearray(size)
        return bytes(memoryview(buffer)[: self.readinto(buffer)])

    def readline(self) -> bytes:
        line = bytearray()
        while self._index < len(self._chunks):
            chunk = self._chunks[self._index]
            end = bytes(chunk[self._offset :]).find(b"\n")
            if end >= 0:
                line += chunk[self._offset : self._offset + end + 1]
                self._offset += end + 1
                if self._offset == len(chunk):
                    self._index += 1
                    self._offset = 0
                return bytes(line)
            line += chunk[self._offset :]
            self._index += 1
            self._offset = 0
        return bytes(line)
