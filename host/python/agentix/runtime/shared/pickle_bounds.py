"""The work bounds of a restricted load (see `agentix.runtime.shared.safepickle`):
the per-load budget and the state of the load running on this thread, the
sealed stand-ins that build builtin and standard-library values within that
budget (`BOUNDED_CONSTRUCTORS`), and the checks that a class rebuilt from the
stream is what its real constructor would have built. No allowlist here:
which names a stream may use is decided in `safepickle`."""

from __future__ import annotations

import collections
import decimal
import fractions
import pathlib
import pickle
import re
import threading
import uuid
from typing import Any, Callable

__all__ = [
    "BOUNDED_CONSTRUCTORS",
    "LoadState",
    "MAX_INT_DIGITS",
    "REAL_CLASSES",
    "RestrictedUnpickleError",
    "Sealed",
    "charge",
    "class_state",
    "current_load",
    "fresh_wrapper",
    "load_state",
]

_MISSING = object()


class RestrictedUnpickleError(pickle.UnpicklingError):
    """A sandbox return value named something the host allowlist refuses."""


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


class LoadState:
    """What one load may still do, and the instances it must check at the end."""

    __slots__ = ("budget", "rebuilt")

    def __init__(self, stream_bytes: int) -> None:
        self.budget = _BUDGET_BASE + _BUDGET_PER_BYTE * stream_bytes
        # (instance, check) for every instance of a class with forgeable state.
        self.rebuilt: list[tuple[Any, Callable[[], None]]] = []


# The load running on this thread (results are decoded on the event loop's
# thread or, when large, on a worker thread).
current_load = threading.local()


def load_state() -> LoadState | None:
    return getattr(current_load, "state", None)


def charge(units: int, what: str) -> None:
    """Spends `units` of the running load's budget, or refuses the stream."""
    state = load_state()
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
    charge(units, f"{kind}() of {units} items")


def _digit_cost(digits: int) -> int:
    return digits + digits * digits // 1024


def _refuse_digits(what: str, digits: int) -> None:
    if digits > MAX_INT_DIGITS:
        raise RestrictedUnpickleError(
            f"refusing {what} in a sandbox return value: a number of {digits} decimal "
            f"digits (the limit is {MAX_INT_DIGITS})"
        )
    charge(_digit_cost(digits), what)


def _int_digits(value: int) -> int:
    return int(abs(value).bit_length() / _BITS_PER_DIGIT) + 1


def _check_number(kind: str, arg: Any) -> None:
    """Bounds the work a numeric constructor does with `arg`."""
    if isinstance(arg, bool):
        return
    if isinstance(arg, int):
        charge(_int_digits(arg) // 64 + 1, f"{kind}(int)")
    elif isinstance(arg, decimal.Decimal):
        if arg.is_finite():
            # Converting to an exact integer or ratio materializes 10**exponent
            # and converts the coefficient: both quadratic in their digits.
            _refuse_digits(f"{kind}(Decimal) of magnitude 1e{arg.adjusted()}", max(abs(arg.adjusted()), len(str(arg))))
    elif isinstance(arg, fractions.Fraction):
        charge(_digit_cost(_int_digits(arg.numerator) + _int_digits(arg.denominator)) // 64 + 1, f"{kind}(Fraction)")
    elif isinstance(arg, (str, bytes, bytearray)):
        charge(len(arg) // 8 + 1, f"{kind}(text)")


class Sealed(type):
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


class _BoundedBytes(bytes, metaclass=Sealed):
    """Serves ``builtins.bytes``: the real constructor, minus ``bytes(n)``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        _refuse_size("bytes", args)
        _charge_items("bytes", args, kwargs)
        return bytes(*args, **kwargs)


class _BoundedByteArray(bytearray, metaclass=Sealed):
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
            args = (REAL_CLASSES.get(args[0], args[0]), *args[1:])
        instance = real(*args, **kwargs)
        if hasattr(instance, "__dict__"):  # Counter, OrderedDict: pickled without state
            _record(instance, lambda: _check_rebuilt(instance, real()))
        return instance

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        pass

    stand_in = Sealed(f"_Bounded_{real.__name__}", (real,), {"__new__": __new__, "__init__": __init__, "__slots__": ()})
    REAL_CLASSES[stand_in] = real
    return stand_in


# typeshed declares str a Sequence (an ABCMeta class); at run time type(str) is
# type, which Sealed derives from.
class _BoundedStr(str, metaclass=Sealed):  # type: ignore[misc]
    """Serves ``builtins.str``: text and numbers only (``str(a_list)`` would
    repeat memoized values without bound)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if args:
            value = args[0]
            if isinstance(value, (str, bytes, bytearray)):
                charge(len(value) // 8 + 1, "str(text)")
            elif isinstance(value, int) and not isinstance(value, bool):
                _refuse_digits("str(int)", _int_digits(value))
            elif not isinstance(value, (float, complex, bool, type(None))):
                raise RestrictedUnpickleError(
                    f"refusing str() of a {type(value).__name__} in a sandbox return value"
                )
        return str(*args, **kwargs)


class _BoundedInt(int, metaclass=Sealed):
    """Serves ``builtins.int``: refuses conversions that cost far more than their bytes."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], (str, bytes, bytearray)):
            base = args[1] if len(args) > 1 else kwargs.get("base", 10)
            text = args[0]
            if base in (2, 4, 8, 16, 32):  # linear; any other base (0 reads decimal) is quadratic
                charge(len(text) // 8 + 1, "int(text)")
            else:
                _refuse_digits("int(text)", len(text))
        else:
            for arg in args:
                _check_number("int", arg)
        return int(*args, **kwargs)


class _BoundedDecimal(decimal.Decimal, metaclass=Sealed):
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
            charge(len(arg) // 8 + 1, "Fraction(text)")
        elif isinstance(arg, int) and not isinstance(arg, bool):
            # The gcd that normalizes the ratio is quadratic in the digits.
            digits = _int_digits(arg)
            if digits > _FRACTION_ARG_DIGITS:
                raise RestrictedUnpickleError(
                    f"refusing Fraction of a {digits}-digit integer: the limit is {_FRACTION_ARG_DIGITS}"
                )
            charge(_digit_cost(digits) // 64 + 1, "Fraction(int)")
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

    stand_in = Sealed(real.__name__, (), {"__new__": __new__, "__slots__": (), "__module__": __name__})
    REAL_CLASSES[stand_in] = real
    return stand_in


def _record(instance: Any, check: Callable[[], None]) -> None:
    state = load_state()
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
REAL_CLASSES: dict[type, type] = {}

BOUNDED_CONSTRUCTORS: dict[tuple[str, str], type] = {
    ("builtins", "bytes"): _BoundedBytes,
    ("builtins", "bytearray"): _BoundedByteArray,
    ("builtins", "int"): _BoundedInt,
    ("builtins", "str"): _BoundedStr,
    ("decimal", "Decimal"): _BoundedDecimal,
    ("fractions", "Fraction"): _rebuilt_stand_in(fractions.Fraction, _new_fraction_checked),
    ("uuid", "UUID"): _rebuilt_stand_in(uuid.UUID, _new_uuid),
}
for _container in (list, tuple, set, frozenset, dict):
    BOUNDED_CONSTRUCTORS[("builtins", _container.__name__)] = _bounded_container(_container)
for _container in (collections.OrderedDict, collections.defaultdict, collections.Counter, collections.deque):
    BOUNDED_CONSTRUCTORS[("collections", _container.__name__)] = _bounded_container(_container)
for _module in ("pathlib", "pathlib._local"):
    for _name in ("PurePath", "PurePosixPath", "PureWindowsPath", "Path", "PosixPath", "WindowsPath"):
        BOUNDED_CONSTRUCTORS[(_module, _name)] = _rebuilt_stand_in(getattr(pathlib, _name))
for _stand_in in (_BoundedBytes, _BoundedByteArray, _BoundedInt, _BoundedStr, _BoundedDecimal):
    REAL_CLASSES[_stand_in] = _stand_in.__mro__[1]


def fresh_wrapper(function: Any) -> Any:
    """A per-load stand-in for an allowlisted function (BUILD can only touch it)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return call


def class_state(cls: type) -> tuple:
    return (dict(cls.__dict__), cls.__bases__, cls.__name__, cls.__qualname__)
