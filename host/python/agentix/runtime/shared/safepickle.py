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
import collections
import copyreg
import decimal
import fractions
import importlib
import io
import os
import pathlib
import pickle
import pickletools
import re
import sys
import threading
import uuid
from typing import Any, Callable

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

_EXTENSION_OPCODES = frozenset({"EXT1", "EXT2", "EXT4"})
# The first byte of each EXT opcode; a stream without any of them has none.
_EXTENSION_OPCODE_BYTES = (b"\x82", b"\x83", b"\x84")

_allowed_types: dict[_GlobalName, type] = {}
# Functions registered with `allow_callable`.
_allowed_callables: dict[_GlobalName, Callable[..., Any]] = {}

# Py_TPFLAGS_IMMUTABLETYPE (3.10+): builtin and most C types cannot be changed.
_IMMUTABLE_TYPE_FLAG = 1 << 8
# 10**10000 takes microseconds; 10**100000000 takes minutes.
_MAX_FRACTION_EXPONENT = 10000
_FRACTION_EXPONENT = re.compile(r"[eE]\s*([-+]?[0-9_]+)")


# Largest integer (in decimal digits) a bounded conversion builds or converts:
# CPython's default int_max_str_digits. int(Decimal("1e4299")) takes ~0.5 ms;
# the cost grows with the square of the digits.
MAX_INT_DIGITS = 4300
# Work a load may do in bounded constructors, in units of roughly one element
# copied (~50 ns): this base plus _BUDGET_PER_BYTE per stream byte. A legitimate
# stream copies each element it carries at most about once (Counter(dict),
# protocol-2 set([...])); only a hostile one multiplies work through memo
# references or lazy iterables (range).
_BUDGET_BASE = 1 << 18
_BUDGET_PER_BYTE = 2
_BITS_PER_DIGIT = 3.33


class _LoadState:
    """What one load may still do, and the instances it must check at the end."""

    __slots__ = ("budget", "rebuilt")

    def __init__(self, stream_bytes: int) -> None:
        self.budget = _BUDGET_BASE + _BUDGET_PER_BYTE * stream_bytes
        # (instance, check) for every instance of a class with forgeable state.
        self.rebuilt: list[tuple[Any, Callable[[], None]]] = []


# The load running on this thread (results are decoded on the event loop's
# thread or, when large, on a worker thread).
_current = threading.local()


def _state() -> _LoadState | None:
    return getattr(_current, "state", None)


def _charge(units: int, what: str) -> None:
    """Spends `units` of the running load's budget, or refuses the stream."""
    state = _state()
    if state is None:
        return
    state.budget -= units
    if state.budget < 0:
        raise RestrictedUnpickleError(
            f"refusing {what} in a sandbox return value: the stream asks for more work "
            f"than its size allows (a per-load budget of {_BUDGET_BASE} + "
            f"{_BUDGET_PER_BYTE} units per stream byte)"
        )


def _charge_items(kind: str, args: tuple, kwargs: dict) -> None:
    """Charges a constructor that copies or iterates its arguments, by their length."""
    units = 1
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, (str, bytes, bytearray, memoryview)):
            units += len(arg) // 8
        elif isinstance(arg, range):
            # Each item is a new int object; len() overflows past sys.maxsize.
            try:
                units += 8 * len(arg)
            except OverflowError:
                units += 1 << 64
        else:
            try:
                units += len(arg)
            except (TypeError, OverflowError):
                pass
    _charge(units, f"{kind}() of {units} items")


def _digit_cost(digits: int) -> int:
    return digits + digits * digits // 1024


def _refuse_digits(what: str, digits: int) -> None:
    if digits > MAX_INT_DIGITS:
        raise RestrictedUnpickleError(
            f"refusing {what} in a sandbox return value: a number of {digits} decimal "
            f"digits (the limit is {MAX_INT_DIGITS})"
        )
    _charge(_digit_cost(digits), what)


def _int_digits(value: int) -> int:
    return int(abs(value).bit_length() / _BITS_PER_DIGIT) + 1


def _check_number(kind: str, arg: Any) -> None:
    """Bounds the work a numeric constructor does with `arg`."""
    if isinstance(arg, bool):
        return
    if isinstance(arg, int):
        _charge(_int_digits(arg) // 64 + 1, f"{kind}(int)")
    elif isinstance(arg, decimal.Decimal):
        if arg.is_finite():
            # Converting to an exact integer or ratio materializes 10**exponent
            # and converts the coefficient: both quadratic in their digits.
            _refuse_digits(f"{kind}(Decimal) of magnitude 1e{arg.adjusted()}", max(abs(arg.adjusted()), len(str(arg))))
    elif isinstance(arg, fractions.Fraction):
        _charge(_digit_cost(_int_digits(arg.numerator) + _int_digits(arg.denominator)) // 64 + 1, f"{kind}(Fraction)")
    elif isinstance(arg, (str, bytes, bytearray)):
        _charge(len(arg) // 8 + 1, f"{kind}(text)")


class _Sealed(type):
    """The metaclass of every stand-in: BUILD applied to one (to rewrite it for
    the rest of the load, or for good) is refused at once."""

    def __setattr__(cls, name: str, value: Any) -> None:
        raise RestrictedUnpickleError(f"refusing to set {name} on the host class {cls.__qualname__}")

    def __delattr__(cls, name: str) -> None:
        raise RestrictedUnpickleError(f"refusing to delete {name} from the host class {cls.__qualname__}")


def _refuse_size(kind: str, args: tuple) -> None:
    if args and isinstance(args[0], int):
        raise RestrictedUnpickleError(
            f"refusing {kind}({args[0]!r}) in a sandbox return value: a size argument "
            f"would allocate memory the stream does not carry"
        )


class _BoundedBytes(bytes, metaclass=_Sealed):
    """Serves ``builtins.bytes``: the real constructor, minus ``bytes(n)``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        _refuse_size("bytes", args)
        _charge_items("bytes", args, kwargs)
        return bytes(*args, **kwargs)


class _BoundedByteArray(bytearray, metaclass=_Sealed):
    """Serves ``builtins.bytearray``: the real constructor, minus ``bytearray(n)``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        _refuse_size("bytearray", args)
        _charge_items("bytearray", args, kwargs)
        return bytearray(*args, **kwargs)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Never refills (``copyreg._reconstructor`` calls ``base.__init__``)."""


def _bounded_container(real: type) -> type:
    """A stand-in for a builtin container type: charges the items it copies.

    A subclass of `real` so ``object.__new__`` cannot make one; ``__init__``
    does nothing so ``copyreg._reconstructor`` cannot refill the result.
    """

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        _charge_items(real.__name__, args, kwargs)
        if real is collections.defaultdict and args:
            args = (_REAL_CLASSES.get(args[0], args[0]), *args[1:])
        instance = real(*args, **kwargs)
        if hasattr(instance, "__dict__"):  # Counter, OrderedDict: pickled without state
            _record(instance, lambda: _check_rebuilt(instance, real()))
        return instance

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        pass

    stand_in = _Sealed(f"_Bounded_{real.__name__}", (real,), {"__new__": __new__, "__init__": __init__, "__slots__": ()})
    _REAL_CLASSES[stand_in] = real
    return stand_in


class _BoundedStr(str, metaclass=_Sealed):
    """Serves ``builtins.str``: text and numbers only (``str(a_list)`` would
    repeat memoized values without bound)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if args:
            value = args[0]
            if isinstance(value, (str, bytes, bytearray)):
                _charge(len(value) // 8 + 1, "str(text)")
            elif isinstance(value, int) and not isinstance(value, bool):
                _refuse_digits("str(int)", _int_digits(value))
            elif not isinstance(value, (float, complex, bool, type(None))):
                raise RestrictedUnpickleError(
                    f"refusing str() of a {type(value).__name__} in a sandbox return value"
                )
        return str(*args, **kwargs)


class _BoundedInt(int, metaclass=_Sealed):
    """Serves ``builtins.int``: refuses conversions that cost far more than their bytes."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], (str, bytes, bytearray)):
            base = args[1] if len(args) > 1 else kwargs.get("base", 10)
            text = args[0]
            if base in (2, 4, 8, 16, 32):  # linear; any other base (0 reads decimal) is quadratic
                _charge(len(text) // 8 + 1, "int(text)")
            else:
                _refuse_digits("int(text)", len(text))
        else:
            for arg in args:
                _check_number("int", arg)
        return int(*args, **kwargs)


class _BoundedDecimal(decimal.Decimal, metaclass=_Sealed):
    """Serves ``decimal.Decimal``: refuses converting huge integers and ratios."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        for arg in args:
            if isinstance(arg, int) and not isinstance(arg, bool):
                _refuse_digits("Decimal(int)", _int_digits(arg))
            elif isinstance(arg, fractions.Fraction):
                _refuse_digits("Decimal(Fraction)", _int_digits(arg.numerator) + _int_digits(arg.denominator))
            else:
                _check_number("Decimal", arg)
        return decimal.Decimal(*args, **kwargs)


_FRACTION_ARG_DIGITS = 10000


def _new_fraction(*args: Any, **kwargs: Any) -> fractions.Fraction:
    for arg in args:
        if isinstance(arg, str):
            for match in _FRACTION_EXPONENT.finditer(arg):
                if abs(int(match.group(1))) > _MAX_FRACTION_EXPONENT:
                    raise RestrictedUnpickleError(
                        f"refusing Fraction({arg[:40]!r}): exponent beyond "
                        f"{_MAX_FRACTION_EXPONENT}"
                    )
            _charge(len(arg) // 8 + 1, "Fraction(text)")
        elif isinstance(arg, int) and not isinstance(arg, bool):
            # The gcd that normalizes the ratio is quadratic in the digits.
            digits = _int_digits(arg)
            if digits > _FRACTION_ARG_DIGITS:
                raise RestrictedUnpickleError(
                    f"refusing Fraction of a {digits}-digit integer: the limit is {_FRACTION_ARG_DIGITS}"
                )
            _charge(_digit_cost(digits) // 64 + 1, "Fraction(int)")
        else:
            _check_number("Fraction", arg)
    return fractions.Fraction(*args, **kwargs)


# type -> ((slot name, descriptor), ...) of the slots `_check_rebuilt` compares.
_SLOT_DESCRIPTORS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _slot_descriptors(cls: type) -> tuple[tuple[str, Any], ...]:
    found = _SLOT_DESCRIPTORS.get(cls)
    if found is None:
        pairs = []
        for klass in cls.__mro__:
            slots = klass.__dict__.get("__slots__", ())
            for name in [slots] if isinstance(slots, str) else slots:
                if name not in ("__dict__", "__weakref__") and name in klass.__dict__:
                    pairs.append((name, klass.__dict__[name]))
        found = _SLOT_DESCRIPTORS[cls] = tuple(pairs)
    return found


def _check_rebuilt(instance: Any, fresh: Any) -> None:
    """Refuses `instance` unless its state is what its constructor made (`fresh`).

    Slots the constructor left unset are lazily computed caches (a path's
    ``_str``, ``_hash``): they are cleared, so they are recomputed from the
    checked state instead of trusted.
    """
    cls = type(instance)
    for name, descriptor in _slot_descriptors(cls):
        have = _slot_value(descriptor, instance)
        if have is _MISSING:
            continue
        want = _slot_value(descriptor, fresh)
        if want is _MISSING:
            descriptor.__delete__(instance)
        elif type(have) is not type(want) or have != want:
            raise RestrictedUnpickleError(
                f"refusing a {cls.__module__}.{cls.__qualname__} whose {name} was set by the stream "
                f"(BUILD on an allowlisted instance) instead of by its constructor"
            )
    if getattr(instance, "__dict__", None):
        raise RestrictedUnpickleError(
            f"refusing a {cls.__module__}.{cls.__qualname__} with attributes set by the stream "
            f"(BUILD on an allowlisted instance)"
        )


def _slot_value(descriptor: Any, instance: Any) -> Any:
    try:
        return descriptor.__get__(instance, type(instance))
    except AttributeError:
        return _MISSING


def _rebuilt_stand_in(real: type, make: Callable[..., Any] | None = None) -> type:
    """A stand-in for a class whose private state BUILD could set.

    Calling it (REDUCE, NEWOBJ, ``copyreg.__newobj__``) returns a real `real`
    instance made by `make` (default: `real` itself); `make` records it for a
    check after the load (default: `_check_rebuilt` against a fresh instance
    made from the same arguments). Not a subclass of `real`:
    ``object.__new__(stand_in)`` (through ``copyreg._reconstructor``) only
    yields an inert object, never an unconstructed `real`.
    """

    def construct(*args: Any, **kwargs: Any) -> Any:
        instance = real(*args, **kwargs)
        _record(instance, lambda: _check_rebuilt(instance, real(*args, **kwargs)))
        return instance

    build = make or construct

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        return build(*args, **kwargs)

    stand_in = _Sealed(real.__name__, (), {"__new__": __new__, "__slots__": (), "__module__": __name__})
    _REAL_CLASSES[stand_in] = real
    return stand_in


def _record(instance: Any, check: Callable[[], None]) -> None:
    state = _state()
    if state is not None:
        state.rebuilt.append((instance, check))


def _new_fraction_checked(*args: Any, **kwargs: Any) -> fractions.Fraction:
    instance = _new_fraction(*args, **kwargs)
    _record(instance, lambda: _check_rebuilt(instance, fractions.Fraction(*args, **kwargs)))
    return instance


def _new_uuid(*args: Any, **kwargs: Any) -> uuid.UUID:
    if not args and not kwargs:  # protocol 2+: copyreg.__newobj__(UUID) then BUILD({"int": ...})
        instance = uuid.UUID.__new__(uuid.UUID)
    else:
        instance = uuid.UUID(*args, **kwargs)
    _record(instance, lambda: _check_uuid(instance))
    return instance


def _check_uuid(instance: uuid.UUID) -> None:
    """A UUID's ``__setstate__`` takes any ``int``: rebuild it through the constructor."""
    value = getattr(instance, "int", None)
    if type(value) is not int or not 0 <= value < 1 << 128:
        raise RestrictedUnpickleError("refusing a uuid.UUID whose int is not a 128-bit integer")
    _check_rebuilt(instance, uuid.UUID(int=value, is_safe=getattr(instance, "is_safe", uuid.SafeUUID.unknown)))


# Stand-in -> the class it serves: a class that is itself a value (a
# defaultdict's factory, a returned class) is given back as the real one.
_REAL_CLASSES: dict[type, type] = {}

_BOUNDED_CONSTRUCTORS: dict[_GlobalName, type] = {
    ("builtins", "bytes"): _BoundedBytes,
    ("builtins", "bytearray"): _BoundedByteArray,
    ("builtins", "int"): _BoundedInt,
    ("builtins", "str"): _BoundedStr,
    ("decimal", "Decimal"): _BoundedDecimal,
    ("fractions", "Fraction"): _rebuilt_stand_in(fractions.Fraction, _new_fraction_checked),
    ("uuid", "UUID"): _rebuilt_stand_in(uuid.UUID, _new_uuid),
}
for _container in (list, tuple, set, frozenset, dict):
    _BOUNDED_CONSTRUCTORS[("builtins", _container.__name__)] = _bounded_container(_container)
for _container in (collections.OrderedDict, collections.defaultdict, collections.Counter, collections.deque):
    _BOUNDED_CONSTRUCTORS[("collections", _container.__name__)] = _bounded_container(_container)
for _module in ("pathlib", "pathlib._local"):
    for _name in ("PurePath", "PurePosixPath", "PureWindowsPath", "Path", "PosixPath", "WindowsPath"):
        _BOUNDED_CONSTRUCTORS[(_module, _name)] = _rebuilt_stand_in(getattr(pathlib, _name))
for _stand_in in (_BoundedBytes, _BoundedByteArray, _BoundedInt, _BoundedStr, _BoundedDecimal):
    _REAL_CLASSES[_stand_in] = _stand_in.__mro__[1]


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


class _RestrictedLoading:
    """The allowlist and the per-load checks, over either unpickler
    (`RestrictedUnpickler` over the C one, `_numpy_support`'s over the
    pure-Python one); the class using it sets `_base_load`."""

    _base_load: Callable[[Any], Any]

    def _setup(self, stream_bytes: int, wait: bool) -> None:
        # id -> (class, state before this load) for every mutable class handed out.
        self._class_states: dict[int, tuple[type, tuple]] = {}
        self._stream_bytes = stream_bytes
        self._wait = wait
        self._holds_classes = False

    def _numpy_global(self, module: str, name: str) -> Any:
        raise _UseNumpyLoader()

    def load(self) -> Any:
        state = _LoadState(self._stream_bytes)
        outer = _state()
        _current.state = state
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
            _current.state = outer
        if changed:
            raise RestrictedUnpickleError(
                f"refusing a pickle stream that modified the host class(es) "
                f"{', '.join(changed)} (BUILD applied to a class); the change was undone"
            )
        for _instance, check in state.rebuilt:
            check()
        if isinstance(value, type):
            value = _REAL_CLASSES.get(value, value)
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

    def find_class(self, module: str, name: str) -> Any:  # type: ignore[override]
        found = self._find_allowed(module, name)
        if isinstance(found, type):
            if (
                not found.__flags__ & _IMMUTABLE_TYPE_FLAG
                and not isinstance(found, _Sealed)
                and id(found) not in self._class_states
            ):
                if not self._holds_classes:
                    if not _class_lock.acquire(self._wait):
                        raise DecodeBusy(f"another thread is decoding with host class {module}.{name}")
                    self._holds_classes = True
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


class RestrictedUnpickler(_RestrictedLoading, pickle.Unpickler):
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


# How each opcode's argument is laid out, for `_check_memo`: (kind, size).
_FIXED, _LENGTH, _LINES = 0, 1, 2


def _opcode_layouts() -> dict[int, tuple[int, int, bool]]:
    """Opcode byte -> (kind, size, signed length)."""
    layouts: dict[int, tuple[int, int, bool]] = {}
    for opcode in pickletools.opcodes:
        arg = opcode.arg
        if arg is None:
            layout = (_FIXED, 0, False)
        elif arg.n > 0:
            layout = (_FIXED, arg.n, False)
        elif arg.n == pickletools.UP_TO_NEWLINE:
            layout = (_LINES, 2 if arg.name == "stringnl_noescape_pair" else 1, False)
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT1:
            layout = (_LENGTH, 1, False)
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT4:
            layout = (_LENGTH, 4, True)
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT4U:
            layout = (_LENGTH, 4, False)
        else:
            layout = (_LENGTH, 8, False)
        layouts[ord(opcode.code.encode("latin-1"))] = layout
    return layouts


_LAYOUTS = _opcode_layouts()
# The same indexed by opcode byte; None for unknown opcodes and STOP (the walk ends).
_LAYOUT_TABLE = [None if code == ord(".") else _LAYOUTS.get(code) for code in range(256)]
_PUT, _LONG_BINPUT, _STOP = ord("p"), ord("r"), ord(".")
# A memo index is at most the number of objects memoized before it, each at
# least one opcode byte; this much slack admits hand-written BINPUT streams.
_MEMO_SLACK = 256


class _ForwardBytes:
    """The pieces of a stream, read forward: ``buf`` holds ``stream[base:]``
    from the read position on, one piece converted to bytes at a time (pieces
    that lie wholly inside a skipped argument are never copied)."""

    __slots__ = ("buf", "base", "_pieces")

    def __init__(self, chunks: list) -> None:
        self._pieces = iter(chunks)
        self.buf = b""
        self.base = 0

    def cover(self, pos: int, end: int) -> bool:
        """Makes ``buf`` hold ``stream[pos:end]``; False if the stream is shorter."""
        buf, base = self.buf, self.base
        while base + len(buf) < end:
            piece = next(self._pieces, None)
            if piece is None:
                return False
            piece_start = base + len(buf)
            if piece_start + len(piece) <= pos:  # inside a skipped argument
                buf, base = b"", piece_start + len(piece)
                continue
            kept = buf[pos - base :] if pos - base < len(buf) else b""
            buf = kept + bytes(piece[max(0, pos - piece_start) :])
            base = pos if kept else max(pos, piece_start)
        self.buf, self.base = buf, base
        return True

    def line_end(self, pos: int) -> int:
        """The position after the newline that ends the line at `pos`, or -1."""
        searched = pos
        while True:
            found = self.buf.find(b"\n", max(searched, self.base) - self.base)
            if found >= 0:
                return self.base + found + 1
            searched = self.base + len(self.buf)
            if not self.cover(pos, searched + 1):
                return -1


def _check_memo(chunks: list, total: int) -> None:
    """Refuses a PUT / LONG_BINPUT memo index beyond the stream's length.

    The C unpickler grows its memo table to twice the largest index it is
    given, before storing anything: one 9-byte ``LONG_BINPUT 0x8000000``
    costs 2 GiB. Only those two opcodes carry a free-form index (``BINPUT`` is
    one byte, ``MEMOIZE`` takes the next slot), so this walk runs only for
    streams holding a ``p`` or ``r`` byte, and skips over large arguments
    without reading them. A stream it cannot follow is left to the loader,
    which refuses it.
    """
    limit = total + _MEMO_SLACK
    if len(chunks) == 1 and type(chunks[0]) is bytes:
        _check_memo_bytes(chunks[0], limit)
        return
    stream = _ForwardBytes(chunks)
    layouts = _LAYOUTS
    pos = 0
    while pos < total:
        if pos + 9 > stream.base + len(stream.buf):  # an opcode and its largest fixed argument
            stream.cover(pos, min(pos + 9, total))
        buf, base = stream.buf, stream.base
        code = buf[pos - base]
        layout = layouts.get(code)
        if layout is None or code == _STOP:
            return
        pos += 1
        kind, size, signed = layout
        if kind == _FIXED:
            if code == _LONG_BINPUT:
                if pos + 4 > base + len(buf):
                    return
                index = int.from_bytes(buf[pos - base : pos - base + 4], "little")
                if index >= limit:
                    _refuse_memo(index, total)
            pos += size
        elif kind == _LENGTH:
            if pos + size > base + len(buf):
                return
            length = int.from_bytes(buf[pos - base : pos - base + size], "little", signed=signed)
            if length < 0:
                return
            pos += size + length
        else:
            start = pos
            for _ in range(size):
                pos = stream.line_end(pos)
                if pos < 0:
                    return
            if code == _PUT:
                text = stream.buf[start - stream.base : pos - stream.base] if pos - start <= 24 else b""
                try:
                    index = int(text) if text else limit
                except ValueError:
                    return
                if not 0 <= index < limit:
                    _refuse_memo(index, total)


def _check_memo_bytes(data: bytes, limit: int) -> None:
    """`_check_memo` of one bytes object (the common case, kept tight)."""
    total = len(data)
    layouts = _LAYOUT_TABLE
    from_bytes = int.from_bytes
    pos = 0
    while pos < total:
        code = data[pos]
        layout = layouts[code]
        if layout is None:
            return
        pos += 1
        kind, size, signed = layout
        if kind == _FIXED:
            if code == _LONG_BINPUT:
                if pos + 4 > total:
                    return  # truncated: the loader refuses it
                index = from_bytes(data[pos : pos + 4], "little")
                if index >= limit:
                    _refuse_memo(index, total)
            pos += size
        elif kind == _LENGTH:
            length = from_bytes(data[pos : pos + size], "little", signed=signed)
            if length < 0:
                return
            pos += size + length
        else:
            start = pos
            for _ in range(size):
                pos = data.find(b"\n", pos) + 1
                if pos == 0:
                    return
            if code == _PUT:
                try:
                    index = int(data[start:pos]) if pos - start <= 24 else limit
                except ValueError:
                    return
                if not 0 <= index < limit:
                    _refuse_memo(index, total)


def _refuse_memo(index: int, total: int) -> None:
    raise RestrictedUnpickleError(
        f"refusing memo index {index} in a {total}-byte pickle stream: the unpickler "
        f"would size its memo table by it"
    )


def _needs_memo_check(chunks: list) -> bool:
    for chunk in chunks:
        data = chunk if isinstance(chunk, bytes) else bytes(chunk)
        if data.find(b"r") >= 0 or data.find(b"p") >= 0:
            return True
    return False


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
    scan = data.find(b"r") >= 0 or data.find(b"p") >= 0
    return _restricted_load(lambda: io.BytesIO(data), lambda: data, [data], len(data), wait, scan)


def restricted_loads_chunks(chunks: list) -> Any:
    """`restricted_loads` of the concatenation of `chunks` (bytes-like
    objects) without building it: large ``bytes`` values are copied straight
    out of the chunks (a result arrives in MiB-sized pieces; joining them
    first would cost one more copy of the whole value)."""
    total = sum(len(chunk) for chunk in chunks)
    return _restricted_load(
        lambda: _ChunkReader(chunks), lambda: b"".join(chunks), chunks, total, True, _needs_memo_check(chunks)
    )


def _restricted_load(open_file: Any, whole: Any, chunks: list, total: int, wait: bool, scan: bool) -> Any:
    if _trust_enabled():
        return pickle.load(open_file())
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
    if scan:
        _check_memo(chunks, total)
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
        found = getattr(builtins, qualname, None) if qualname.isidentifier() else None
        if isinstance(found, type) and (found in _SAFE_BUILTIN_TYPES or issubclass(found, BaseException)):
            return found
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
