"""Restricted unpickling of values that cross the sandbox -> host boundary.

Return values arrive as ``pickle.dumps(value)`` produced by code running in the
sandbox, which may be less trusted than the host (a cloned repository, a
generated patch, a benchmark task). Plain ``pickle.loads`` calls whatever
callables the stream names, so the host decodes through an exact allowlist:

1. classes registered with `allow_type` (returned as registered, never imported);
2. `SAFE_TYPES`: reviewed value types, imported and required to be classes;
3. inert reconstruction helpers (``copyreg``) and functions registered with
   `allow_callable`;
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

Work out of proportion to the bytes is bounded per load (see `restricted_loads`):

- memo indices (PUT / LONG_BINPUT) beyond the stream's length are refused: the
  unpickler sizes its memo table by the largest index, so a 9-byte stream
  could otherwise claim gigabytes;
- every bounded constructor (``list``/``tuple``/``set``/``dict``/... of an
  iterable, ``int``/``Decimal``/``Fraction`` conversions between huge
  numbers) charges its work to a per-load budget of ``_BUDGET_BASE`` units
  plus two per stream byte, so ``list(range(3 * 10**8))`` or a memo reference
  copied a million times is refused instead of allocating gigabytes, and
  ``int(Decimal("1e1000000"))`` is refused instead of computing for seconds;
- allowlisted library classes whose private state BUILD could set (pathlib
  paths, ``Fraction``, ``UUID``) are handed out as stand-ins that construct the
  real instance; after the load each such instance is compared with one
  rebuilt by its public constructor from the same arguments, and a stream that
  changed its state (a ``PosixPath`` whose ``_str`` names another file) is
  refused.

numpy arrays, dtypes and scalars are decoded by `_numpy_support` (a stream
naming numpy is loaded by the pure-Python unpickler, whose BUILD it controls):
numeric, bool, string, datetime and structured-of-those dtypes, rebuilt through
numpy's public constructors, with every array's data present in the stream and
charged to the budget; object dtypes are refused.

Relaxing: `allow_type(Class)` trusts one exact class, `allow_callable(module,
name)` one reconstruction function; ``AGENTIX_PICKLE_TRUST=1``
(or ``true``/``yes``, read on every call) restores plain ``pickle.loads``.

Host -> sandbox arguments are plain pickle: that direction is trusted.
"""

from __future__ import annotations

import builtins
import copyreg
import importlib
import io
import os
import pickle
import re
import sys
import threading
from typing import Any, Callable

from agentix.runtime.shared.pickle_stream import (
    EXTENSION_OPCODE_BYTES,
    ChunkReader,
    check_memo,
    check_opcodes,
    needs_memo_check,
)
from agentix.runtime.shared.pickle_bounds import (
    BOUNDED_CONSTRUCTORS,
    REAL_CLASSES,
    LoadState,
    RestrictedUnpickleError,
    Sealed,
    class_state,
    current_load,
    fresh_wrapper,
    load_state,
)

__all__ = [
    "RestrictedUnpickleError",
    "RestrictedUnpickler",
    "SAFE_TYPES",
    "allow_callable",
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
        # First-party plugin results: part of the bundle the host itself deploys.
        ("agentix.bridge.proxy", "TunnelHandle"),
        ("agentix.bash", "BashResult"),
        ("agentix.files", "UploadResult"),
        ("agentix.agents.claude_code.agent", "ClaudeCodeResult"),
        ("agentix.agents.qwen_code", "Result"),
        ("agentix.plugins.datasets.swe.env", "PrepareEnvResult"),
        # The stream items of the original's `agentix.bash.run_stream` (runtime-basic):
        # dataclasses of str/int fields, yielded through `remote_stream`.
        ("agentix.bash", "BashStdout"),
        ("agentix.bash", "BashStderr"),
        ("agentix.bash", "BashExit"),
        ("agentix.bash", "BashError"),
    }
)

# Functions that only rebuild a value from (also gated) arguments.
_SAFE_CALLABLES: frozenset[_GlobalName] = frozenset(
    {
        ("copyreg", "_reconstructor"),
        ("copyreg", "__newobj__"),
        ("copyreg", "__newobj_ex__"),
    }
)

# Builtin classes admitted besides BaseException subclasses. Builtin functions
# (eval, getattr, ...) are not classes, so they can never match.
_SAFE_BUILTIN_TYPES: frozenset[type] = frozenset(
    {complex, range, slice, bytearray, frozenset, set, list, dict, tuple, bytes, str, int, float, bool}
)

_MISSING = object()
# copyreg's extension registry (copyreg.add_extension) and its cache: the
# dicts themselves (copyreg only changes them in place), private and so not
# in typeshed.
_COPYREG_INVERTED_REGISTRY: dict[int, tuple[str, str]] = getattr(copyreg, "_inverted_registry")
_COPYREG_EXTENSION_CACHE: dict[int, Any] = getattr(copyreg, "_extension_cache")

_allowed_types: dict[_GlobalName, type] = {}
# Functions registered with `allow_callable`.
_allowed_callables: dict[_GlobalName, Callable[..., Any]] = {}

# Py_TPFLAGS_IMMUTABLETYPE (3.10+): builtin and most C types cannot be changed.
_IMMUTABLE_TYPE_FLAG = 1 << 8
def allow_type(cls: type) -> None:
    """Trusts exactly `cls` (by ``__module__`` and ``__qualname__``) in return values.

    Only that class is admitted, not its module or subclasses; the stream gets
    the registered class object itself. A dataclass or any plain class whose
    instances pickle by class and ``__dict__`` needs nothing more. Exported as
    ``agentix.allow_type``.
    """
    if not isinstance(cls, type):
        raise TypeError(
            "allow_type() requires a class; for a function that rebuilds a value use "
            "agentix.allow_callable(module, name)"
        )
    _allowed_types[(cls.__module__, cls.__qualname__)] = cls


def allow_callable(module: str, name: str) -> Callable[..., Any]:
    """Trusts one reconstruction function, named as the stream names it.

    For values whose ``__reduce__`` returns ``(function, args)`` with a
    function rather than a class (``module.name``, as a refusal message
    spells it). The host imports `module` now, so the function must be
    importable and must be a plain function (classes go to `allow_type`);
    the stream then calls it with arguments that are themselves decoded
    through the allowlist, so admit only functions that build a value from
    their arguments and do nothing else. Returns the function. Exported as
    ``agentix.allow_callable``.
    """
    if not isinstance(module, str) or not isinstance(name, str) or not module or not name:
        raise TypeError("allow_callable() takes a module name and a function name (two strings)")
    import importlib

    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    if isinstance(found, type):
        raise TypeError(f"{module}.{name} is a class: use agentix.allow_type({module}.{name})")
    if not callable(found):
        raise TypeError(f"{module}.{name} is not callable")
    _allowed_callables[(module, name)] = found
    return found


def _refusal_advice(module: str, name: str) -> str:
    """The calls that admit `module.name`, for a refusal message (the module is
    not imported to find out whether it names a class or a function)."""
    return (
        f"If you trust it: for a class, call agentix.allow_type({module}.{name}) (after "
        f"importing {module}); for a function that rebuilds a value, call "
        f"agentix.allow_callable({module!r}, {name!r}); before the call. Or set "
        f"AGENTIX_PICKLE_TRUST=1 to trust the sandbox fully."
    )


def _trust_enabled() -> bool:
    return os.environ.get("AGENTIX_PICKLE_TRUST", "").strip().lower() in ("1", "true", "yes")


# Held by a load from the first mutable host class it hands out until it has
# undone any change to them: loads interleaving on two threads (the event
# loop's and a decoding thread) would otherwise snapshot each other's changes
# and "restore" them for good.
_class_lock = threading.Lock()


class DecodeBusy(Exception):
    """``restricted_loads(..., wait=False)`` would have waited for another
    thread's load of a mutable class (decode on a worker thread instead)."""


def _import_global(module: str, name: str) -> Any:
    """``module.name``, imported (only for names already on the allowlist)."""
    found: Any = sys.modules.get(module)
    if found is None:
        import importlib

        found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


class _UseNumpyLoader(Exception):
    """Raised by the C loader at the first numpy global: the stream is loaded
    again by `_numpy_support`'s pure-Python loader, whose BUILD it controls."""


class RestrictedLoading:
    """The allowlist and the per-load checks, over either unpickler
    (`RestrictedUnpickler` over the C one, `_numpy_support`'s over the
    pure-Python one); the class using it sets `_base_load`."""

    # The underlying unpickler's ``load``, called as ``self._base_load()``:
    # ``pickle.Unpickler.load`` itself, or a method of the subclass.
    _base_load: Callable[..., Any]

    def _setup(self, stream_bytes: int, wait: bool) -> None:
        # id -> (class, state before this load) for every mutable class handed out.
        self._class_states: dict[int, tuple[type, tuple]] = {}
        self._stream_bytes = stream_bytes
        self._wait = wait
        self._holds_classes = False

    def _numpy_global(self, module: str, name: str) -> Any:
        raise _UseNumpyLoader()

    def load(self) -> Any:
        state = LoadState(self._stream_bytes)
        outer = load_state()
        current_load.state = state
        try:
            try:
                value = self._base_load()
            finally:
                try:
                    changed = self._undo_class_changes()
                finally:
                    if self._holds_classes:
                        self._holds_classes = False
                        _class_lock.release()
        finally:
            current_load.state = outer
        if changed:
            raise RestrictedUnpickleError(
                f"refusing a pickle stream that modified the host class(es) "
                f"{', '.join(changed)} (BUILD applied to a class); the change was undone"
            )
        for _instance, check in state.rebuilt:
            check()
        if isinstance(value, type):
            value = REAL_CLASSES.get(value, value)
        return value

    def _undo_class_changes(self) -> list[str]:
        changed = []
        for cls, before in self._class_states.values():
            if class_state(cls) == before:
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
            if (
                not found.__flags__ & _IMMUTABLE_TYPE_FLAG
                and not isinstance(found, Sealed)
                and id(found) not in self._class_states
            ):
                if not self._holds_classes:
                    if not _class_lock.acquire(self._wait):
                        raise DecodeBusy(f"another thread is decoding with host class {module}.{name}")
                    self._holds_classes = True
                self._class_states[id(found)] = (found, class_state(found))
            return found
        return fresh_wrapper(found)

    def _find_allowed(self, module: str, name: str) -> Any:
        global_name = (module, name)
        registered = _allowed_types.get(global_name)
        if registered is not None:
            return registered

        bounded = BOUNDED_CONSTRUCTORS.get(global_name)
        if bounded is not None:
            return bounded

        if global_name in SAFE_TYPES:
            found = _import_global(module, name)
            if not isinstance(found, type):
                raise RestrictedUnpickleError(
                    f"refusing to reconstruct {module}.{name}: the allowlisted value "
                    f"global did not resolve to a type"
                )
            return found

        if global_name in _SAFE_CALLABLES:
            return _import_global(module, name)

        function = _allowed_callables.get(global_name)
        if function is not None:
            return function

        if module == "numpy" or module.startswith("numpy."):
            return self._numpy_global(module, name)

        if module == "builtins":
            if "." in name:  # a dotted path walks attributes: no value type needs one
                raise RestrictedUnpickleError(
                    f"refusing builtins.{name}: dotted names are not on the host allowlist"
                )
            found = _import_global(module, name)
            if isinstance(found, type) and (found in _SAFE_BUILTIN_TYPES or issubclass(found, BaseException)):
                return found
            raise RestrictedUnpickleError(
                f"refusing builtins.{name}: only builtin value types and exceptions may "
                f"cross the sandbox→host boundary. Set AGENTIX_PICKLE_TRUST=1 to trust the "
                f"sandbox fully."
            )

        raise RestrictedUnpickleError(
            f"refusing to reconstruct {module}.{name}: it is not on the host allowlist for "
            f"sandbox return values. {_refusal_advice(module, name)}"
        )


class RestrictedUnpickler(RestrictedLoading, pickle.Unpickler):
    """A `pickle.Unpickler` whose ``find_class`` enforces the allowlist.

    ``load()`` also refuses (and undoes) a stream that modified a class it
    named. A stream naming numpy makes ``load()`` raise `_UseNumpyLoader`
    (`restricted_loads` then loads it with `_numpy_support`).
    """

    _base_load = pickle.Unpickler.load

    def __init__(self, *args: Any, stream_bytes: int = 0, wait: bool = True, **kwargs: Any) -> None:
        """`stream_bytes` (the stream's length) sizes the work budget of `load`;
        `wait=False` raises `DecodeBusy` instead of waiting for another load."""
        pickle.Unpickler.__init__(self, *args, **kwargs)
        self._setup(stream_bytes, wait)


# Every opcode that names or calls a global (GLOBAL, STACK_GLOBAL, INST, OBJ,
# REDUCE, BUILD, NEWOBJ, NEWOBJ_EX, EXT1/2/4, PERSID, BINPERSID), carries a
# free-form memo index (PUT, LONG_BINPUT, GET) or text the unpickler converts
# (INT, LONG, FLOAT, STRING, UNICODE), or takes an out-of-band buffer
# (NEXT_BUFFER, READONLY_BUFFER). A stream in which none of these bytes
# occurs, anywhere, cannot execute any of them: what is left builds builtin
# values (None, bools, ints, floats, str, bytes, bytearray, tuples, lists,
# dicts, sets) from bytes in the stream, so nothing the allowlist or the
# budget guards can happen, and plain pickle.loads decodes it exactly as the
# restricted loader would, ~40x faster (a noop's None, small numbers, many
# short values). Any other stream takes the full path.
_NOT_INERT = re.compile(rb"[c\x93ioRb\x81\x92\x82\x83\x84PQprgILFSV\x97\x98]")
# The byte scan is C-fast, but beyond this the full path's costs no longer
# dominate a load.
_INERT_MAX_BYTES = 64 * 1024
# The worker's pickle of None (protocol 5), every call's value that returns nothing: no scan.
_PICKLED_NONE = pickle.dumps(None, protocol=5)


def restricted_loads(data: bytes, *, wait: bool = True) -> Any:
    """Decodes sandbox-produced pickle bytes through the host allowlist.

    Raises `RestrictedUnpickleError` for a refused global, an extension opcode,
    a stream that modified a class it named, a size argument to ``bytes`` or
    ``bytearray``, a memo index beyond the stream's length, work beyond the
    load's budget (see the module docstring), a number beyond `MAX_INT_DIGITS`
    digits in a conversion, an allowlisted instance whose private state the
    stream set, or a malformed stream; errors raised by an admitted
    constructor propagate as they are. ``AGENTIX_PICKLE_TRUST=1`` bypasses
    every check.

    A load that names a mutable host class (one registered with `allow_type`)
    excludes other such loads until it is done; with ``wait=False`` (the
    event loop's thread) it raises `DecodeBusy` instead of waiting.
    """
    if data == _PICKLED_NONE:
        return None
    if len(data) <= _INERT_MAX_BYTES and _NOT_INERT.search(data) is None:
        try:
            return pickle.loads(data)
        except Exception:
            pass  # malformed: the full path below reports it as it would
    scan = data.find(b"r") >= 0 or data.find(b"p") >= 0
    return _restricted_load(lambda: io.BytesIO(data), lambda: data, [data], len(data), wait, scan)


def restricted_loads_chunks(
    chunks: list,
    copy: Callable[[Any, int, Any], None] | None = None,
    consume: bool = False,
    prefault: Callable[[Any], Any] | None = None,
) -> Any:
    """`restricted_loads` of the concatenation of `chunks` (bytes-like
    objects) without building it: large ``bytes`` values are copied straight
    out of the chunks (a result arrives in MiB-sized pieces; joining them
    first would cost one more copy of the whole value), by `copy` if given,
    into values whose pages `prefault` (if given) faulted in first (both as
    `ChunkReader`'s). With `consume`, `chunks` is emptied when the load ends,
    however it ends: the chunks may be views of a payload ring that is
    released only once nothing refers to them, and the caller's list (an
    executor's work item) can outlive the load."""
    total = sum(len(chunk) for chunk in chunks)
    try:
        return _restricted_load(lambda: ChunkReader(chunks, copy, prefault), lambda: b"".join(chunks), chunks, total, True, None)
    finally:
        if consume:
            chunks.clear()


# Opcodes the memo walk of a chunked stream tries first: a stream of a few
# large values (a big result) is done by then, and is not copied for the
# byte scan (`needs_memo_check`) that longer ones get.
_MEMO_PROBE_STEPS = 64


def _restricted_load(open_file: Any, whole: Any, chunks: list, total: int, wait: bool, scan: bool | None) -> Any:
    """`scan`: whether the memo walk must run; None (chunks) to find out."""
    if _trust_enabled():
        return pickle.load(open_file())
    # EXT opcodes fetch objects through copyreg's extension registry and
    # cache without asking find_class, so they must be refused up front when
    # that registry is in use. With it empty (the normal case) they can only
    # fail, and are then reported by the scan below. Scanning opcodes in
    # Python costs ~15x the load itself (and a copy of every large value), so
    # otherwise it runs only if loading fails, which reports a malformed
    # stream exactly as an up-front scan would.
    if _COPYREG_INVERTED_REGISTRY or _COPYREG_EXTENSION_CACHE:
        data = whole()
        if any(marker in data for marker in EXTENSION_OPCODE_BYTES):
            check_opcodes(data)
    if scan is None:
        if not check_memo(chunks, total, _MEMO_PROBE_STEPS) and needs_memo_check(chunks):
            check_memo(chunks, total)
    elif scan:
        check_memo(chunks, total)
    try:
        try:
            return RestrictedUnpickler(open_file(), stream_bytes=total, wait=wait).load()
        except _UseNumpyLoader:
            # The C loader stopped at the first numpy global (work before it
            # is bounded by the same budget); numpy values need the loader
            # whose BUILD can check them.
            try:
                from agentix.runtime.shared import _numpy_support
            except ImportError as exc:
                raise RestrictedUnpickleError(
                    f"refusing a sandbox return value that holds numpy values: numpy is not "
                    f"importable on the host ({exc})"
                ) from exc
            return _numpy_support.NumpyUnpickler(open_file(), stream_bytes=total, wait=wait).load()
    except (RestrictedUnpickleError, DecodeBusy):
        raise
    except pickle.UnpicklingError as exc:
        # The unpickler's own complaint (a truncated FRAME, a bad memo index):
        # malformed in ways the opcode scan does not model.
        check_opcodes(whole())
        if type(exc) is pickle.UnpicklingError:
            raise RestrictedUnpickleError(f"refusing malformed pickle stream: {exc}") from exc
        raise
    except Exception:
        check_opcodes(whole())
        raise


def admitted_class(module: str, qualname: str) -> type | None:
    """The class the allowlist admits as ``module.qualname``, or None.

    Admitted: a class registered with `allow_type`; a builtin value type or
    exception class; a `SAFE_TYPES` class whose module is already imported.
    Nothing is imported, so a sandbox-chosen name cannot run a module's
    import-time code on the host. With ``AGENTIX_PICKLE_TRUST=1`` any class
    importable on the host is admitted (its module imported if need be).
    """
    registered = _allowed_types.get((module, qualname))
    if registered is not None:
        return registered
    if module == "builtins":
        builtin = getattr(builtins, qualname, None) if qualname.isidentifier() else None
        if isinstance(builtin, type) and (builtin in _SAFE_BUILTIN_TYPES or issubclass(builtin, BaseException)):
            return builtin
        return None
    trusted = _trust_enabled()
    if (module, qualname) not in SAFE_TYPES and not trusted:
        return None
    if "<" in qualname:  # <locals>: not reachable by name
        return None
    found: Any = sys.modules.get(module)
    if found is None and trusted:
        try:
            found = importlib.import_module(module)
        except Exception:
            return None
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None
