"""numpy values in sandbox return values, decoded without trusting the sandbox.

numpy pickles three kinds of value:

- a dtype: ``numpy.dtype(code, align, copy)`` then BUILD with its state
  (byte order, fields, item size, flags);
- an array: protocol 5 and a contiguous array give
  ``numpy.core.numeric._frombuffer(data, dtype, shape, order)``; otherwise
  ``numpy.core.multiarray._reconstruct(ndarray, (0,), b"b")`` then BUILD with
  ``(1, shape, dtype, is_fortran, data)``;
- a scalar: ``numpy.core.multiarray.scalar(dtype, data)``.

(numpy 2 names ``numpy._core...``; both spellings are served.) numpy's own
``__setstate__`` methods take whatever state they are given: BUILD on a dtype
can set its fields, offsets, item size and flags (an object field at a forged
offset makes numpy read a pointer from array data), and BUILD on an array can
replace its memory under an existing view. The C unpickler calls them
directly, so a stream naming numpy is loaded by the pure-Python unpickler
(`NumpyUnpickler`), whose BUILD is replaced:

- ``numpy.dtype`` and ``_reconstruct`` return inert placeholders; BUILD on a
  placeholder checks the state's types, builds the real value through numpy's
  public constructors (a dtype from its code, byte order, fields, offsets,
  item size and alignment; an array from data whose length must equal
  shape x item size) and puts it on the stack; a later reference to the
  placeholder through the memo yields the real value. A dtype is refused unless
  its constructor reproduces exactly the state the stream gave;
- dtypes that hold Python objects (``object``, or fields of it) are refused:
  such an array can hold any value. Return a numeric array, or set
  ``AGENTIX_PICKLE_TRUST=1``;
- BUILD on any real numpy value, array subclasses, out-of-band buffers
  (protocol 5 ``NEXT_BUFFER``) and direct ``ndarray(...)`` construction are
  refused;
- every array is charged its byte size against the load's budget, and its data
  must be present in the stream (no ``ndarray((10**10,), "f8")`` from a few
  bytes);
- the pure-Python loader runs at most `MAX_OPCODES` opcodes (it is ~30x slower
  per opcode than the C one); streams that do not name numpy never use it.
"""

from __future__ import annotations

import pickle
import re
import struct
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import numpy

from agentix.runtime.shared.pickle_bounds import REAL_CLASSES, RestrictedUnpickleError, Sealed, charge
from agentix.runtime.shared.safepickle import RestrictedLoading

# Opcodes a stream naming numpy may run (~1.5 s at pure-Python speed, ~0.3 us
# each): a hostile stream of N bytes would otherwise cost the host ~N/6 us of
# decoding, 40x the C loader's. Legitimate numpy streams are a few opcodes per
# array; 4M opcodes is a list of ~550,000 numpy scalars (7 opcodes each).
MAX_OPCODES = 1 << 22
# numpy's limit on dimensions is 32 (numpy 1) or 64 (numpy 2).
_MAX_DIMS = 64
# No array may claim more bytes than this, whatever its data (numpy's own
# limit is the signed pointer size).
_MAX_ARRAY_BYTES = 1 << 62
# A dtype code as numpy's dtype.__reduce__ writes it: 'f8', 'U5', 'V52', 'M8'.
_DTYPE_CODE = re.compile(r"[a-zA-Z][0-9]{0,20}")
_BYTE_ORDERS = ("<", ">", "|", "=")
# NPY_ALIGNED_STRUCT in a dtype's flags (a signed char in the state).
_ALIGNED_STRUCT = 0x80
_ORDERS: dict[str, Literal["C", "F", "A"]] = {"C": "C", "F": "F", "A": "A"}  # as numpy spells them
# Fields of a structured dtype, counted through nesting (a nested dtype once per
# use), and its nesting depth.
_MAX_DTYPE_FIELDS = 1 << 16
_MAX_DTYPE_DEPTH = 32

try:  # numpy >= 2 keeps the implementation in numpy._core
    from numpy._core.multiarray import scalar as _scalar
except ImportError:
    from numpy.core.multiarray import scalar as _scalar  # type: ignore[attr-defined]  # not in numpy 1's stubs


def _refuse(what: str) -> RestrictedUnpickleError:
    return RestrictedUnpickleError(f"refusing {what} in a sandbox return value")


class _PendingDtype:
    """What ``numpy.dtype(...)`` returns in a stream: the real dtype is made by BUILD."""

    __slots__ = ("args", "built")

    def __init__(self, args: tuple) -> None:
        self.args = args
        self.built: Any = None


class _PendingArray:
    """What ``_reconstruct(ndarray, ...)`` returns in a stream: the array is made by BUILD."""

    __slots__ = ("built",)

    def __init__(self) -> None:
        self.built: Any = None


class _NdarrayStandIn(metaclass=Sealed):
    """Serves ``numpy.ndarray``: only `_reconstruct` may use it; calling it
    (NEWOBJ, ``copyreg.__newobj__``) would take any shape, buffer, offset and
    strides."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise _refuse("a direct numpy.ndarray(...) construction")


class _DtypeStandIn(metaclass=Sealed):
    """Serves ``numpy.dtype``: returns a placeholder completed by BUILD."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if kwargs or not 1 <= len(args) <= 3 or type(args[0]) is not str or not _DTYPE_CODE.fullmatch(args[0]):
            raise _refuse(f"numpy.dtype{args!r:.80}: only a dtype code as numpy pickles it is accepted")
        for flag in args[1:]:
            if type(flag) is not bool:
                raise _refuse("numpy.dtype() with a non-boolean flag")
        charge(1, "numpy.dtype()")
        return _PendingDtype(args)


def _checked_dtype(value: Any, what: str) -> numpy.dtype:
    """The real, object-free dtype `value` stands for, or a refusal."""
    if isinstance(value, _PendingDtype):
        value = value.built
    if not isinstance(value, numpy.dtype):
        raise _refuse(f"{what} without a built numpy dtype")
    if value.hasobject:  # never built here; kept as a second line
        raise _refuse(f"{what} of a dtype holding Python objects")
    return value


def _is_int(value: Any) -> bool:
    return type(value) is int


def _build_dtype(pending: _PendingDtype, state: Any, shapes: dict[int, tuple[Any, int, int]]) -> numpy.dtype:
    """Builds a dtype from its pickled state through numpy's public
    constructors, and refuses it unless that reproduces the state exactly.

    `shapes` maps each dtype built so far in this load (by id, kept alive) to
    (dtype, fields counted through nesting, depth): fields may share one
    nested dtype through the memo, so a dtype's expanded structure could grow
    exponentially with a linear stream; it is bounded instead.
    """
    if type(state) is not tuple or len(state) not in (8, 9) or state[0] not in (3, 4):
        raise _refuse("a numpy dtype state that numpy does not write")
    version, order, subarray, names, fields, itemsize, alignment, flags = state[:8]
    if order not in _BYTE_ORDERS or not all(_is_int(v) for v in (itemsize, alignment, flags)):
        raise _refuse("a numpy dtype state with malformed sizes or byte order")
    code: str = pending.args[0]
    metadata = state[8] if len(state) == 9 else None
    unit = ""
    if metadata is not None:
        # (metadata dict, datetime unit) for datetimes; the dict must be empty
        # (it could carry any value).
        if type(metadata) is not tuple or len(metadata) != 2 or metadata[0] not in ({}, None):
            raise _refuse("a numpy dtype with metadata")
        meta = metadata[1]
        if not (type(meta) is tuple and len(meta) == 4 and type(meta[0]) is bytes and all(_is_int(v) for v in meta[1:])):
            raise _refuse("a numpy datetime dtype with a malformed unit")
        if meta[0] != b"generic":
            unit = f"[{meta[1]}{meta[0].decode('ascii', 'replace')}]"
    try:
        if names is not None:
            if type(names) is not tuple or type(fields) is not dict or not all(type(n) is str for n in names):
                raise _refuse("a structured numpy dtype with malformed fields")
            if len(names) > 100000:
                raise _refuse("a structured numpy dtype with too many fields")
            charge(len(names) + 1, "a structured numpy dtype")
            formats: list[numpy.dtype] = []
            offsets: list[int] = []
            titles: list[str | None] = []
            children = []
            for name in names:
                field = fields.get(name)
                if type(field) is not tuple or len(field) not in (2, 3) or not _is_int(field[1]):
                    raise _refuse(f"a structured numpy dtype whose field {name!r} is malformed")
                formats.append(_checked_dtype(field[0], "a numpy dtype field"))
                children.append(formats[-1])
                offsets.append(field[1])
                title = field[2] if len(field) == 3 else None
                if title is not None and type(title) is not str:
                    raise _refuse("a numpy dtype field with a title that is not text")
                titles.append(title)
            aligned = bool(flags & _ALIGNED_STRUCT)
            if any(title is not None for title in titles):
                fresh = numpy.dtype(
                    {"names": list(names), "formats": formats, "offsets": offsets, "itemsize": itemsize, "titles": titles},
                    align=aligned,
                )
            else:
                fresh = numpy.dtype(
                    {"names": list(names), "formats": formats, "offsets": offsets, "itemsize": itemsize}, align=aligned
                )
        elif subarray is not None:
            if fields is not None or type(subarray) is not tuple or len(subarray) != 2:
                raise _refuse("a numpy subarray dtype with malformed state")
            base, shape = subarray
            if type(shape) is not tuple or len(shape) > _MAX_DIMS or not all(_is_int(n) and n >= 0 for n in shape):
                raise _refuse("a numpy subarray dtype with a malformed shape")
            children = [_checked_dtype(base, "a numpy subarray dtype")]
            fresh = numpy.dtype((children[0], shape))
        else:
            children = []
            if fields is not None:
                raise _refuse("a numpy dtype with fields but no names")
            fresh = numpy.dtype(code + unit)
            if order in "<>" and fresh.byteorder != order:
                fresh = fresh.newbyteorder(order)
    except RestrictedUnpickleError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise _refuse(f"a numpy dtype numpy's constructor rejects ({exc})") from exc
    if fresh.hasobject:
        raise _refuse(
            f"a numpy array or dtype holding Python objects ({fresh}): object arrays can carry "
            f"any value. Return a numeric array (or .tolist()), or set AGENTIX_PICKLE_TRUST=1 "
            f"to trust the sandbox fully"
        )
    size, depth = 1, 1
    for child in children:
        known = shapes.get(id(child))
        if known is None or known[0] is not child:
            raise _refuse("a numpy dtype whose fields were not built in this stream")
        size += known[1]
        depth = max(depth, known[2] + 1)
    if size > _MAX_DTYPE_FIELDS or depth > _MAX_DTYPE_DEPTH:
        raise _refuse(
            f"a numpy dtype of {size} fields nested {depth} deep (the limits are {_MAX_DTYPE_FIELDS} and "
            f"{_MAX_DTYPE_DEPTH})"
        )
    rebuilt = fresh.__reduce__()
    if rebuilt[1][0] != code or not _same_state(rebuilt[2], state):
        raise _refuse(f"a numpy dtype whose pickled state is not the one its constructor makes ({str(fresh)[:200]})")
    shapes[id(fresh)] = (fresh, size, depth)
    return fresh


def _same_state(made: Any, given: Any) -> bool:
    """Exact structural equality. A nested dtype must be the very object the
    stream built (numpy keeps the field dtypes it is given), so nothing is
    compared twice however the stream shares them."""
    if isinstance(made, numpy.dtype):
        return made is given
    if type(made) is not type(given):
        return False
    if type(made) is tuple:
        return len(made) == len(given) and all(_same_state(a, b) for a, b in zip(made, given))
    if type(made) is dict:
        return made.keys() == given.keys() and all(_same_state(made[k], given[k]) for k in made)
    return made == given


def _checked_shape(shape: Any) -> tuple[int, ...]:
    if type(shape) is not tuple or len(shape) > _MAX_DIMS or not all(_is_int(n) and n >= 0 for n in shape):
        raise _refuse("a numpy array with a malformed shape")
    return shape


def _data_length(shape: tuple[int, ...], dtype: numpy.dtype, data: Any, what: str) -> None:
    """Refuses `data` unless it holds exactly ``shape x itemsize`` bytes, and
    charges the array's size to the load's budget."""
    if type(data) not in (bytes, bytearray):
        raise _refuse(f"{what} whose data is not bytes (out-of-band buffers are not accepted)")
    count = 1
    for n in shape:
        count *= n
    nonzero = 1
    for n in shape:
        nonzero *= max(n, 1)
    if nonzero * max(dtype.itemsize, 1) > _MAX_ARRAY_BYTES:
        raise _refuse(f"{what} of shape {shape}: larger than any array numpy can hold")
    if count * dtype.itemsize != len(data):
        raise _refuse(
            f"{what} of shape {shape} and dtype {dtype} from {len(data)} bytes of data: "
            f"the data must be present in the stream"
        )
    charge(len(data) // 8 + 1, what)


def _reconstruct(cls: Any, shape: Any, code: Any) -> _PendingArray:
    """Serves numpy's ``_reconstruct``: a placeholder that BUILD fills."""
    if cls is not _NdarrayStandIn:
        raise _refuse("numpy _reconstruct of anything but numpy.ndarray (array subclasses are not accepted)")
    return _PendingArray()


def _build_array(state: Any) -> numpy.ndarray:
    if type(state) is not tuple or len(state) != 5 or state[0] != 1 or type(state[0]) is not int:
        raise _refuse("a numpy array state that numpy does not write")
    _version, shape, dtype, is_fortran, data = state
    shape = _checked_shape(shape)
    dtype = _checked_dtype(dtype, "a numpy array")
    if type(is_fortran) is not bool:
        raise _refuse("a numpy array state with a non-boolean order")
    _data_length(shape, dtype, data, "a numpy array")
    array = numpy.ndarray.__new__(numpy.ndarray, (0,), "b")
    array.__setstate__((1, shape, dtype, is_fortran, bytes(data)))
    return array


def _frombuffer(data: Any, dtype: Any, shape: Any, order: Any) -> numpy.ndarray:
    """Serves numpy's protocol-5 ``_frombuffer``."""
    dtype = _checked_dtype(dtype, "a numpy array")
    shape = _checked_shape(shape)
    if order not in _ORDERS or type(order) is not str:
        raise _refuse("a numpy array with a malformed order")
    _data_length(shape, dtype, data, "a numpy array")
    if not len(data):
        return numpy.empty(shape, dtype, order="F" if order == "F" else "C")
    return numpy.frombuffer(data, dtype=dtype).reshape(shape, order=_ORDERS[order])


def _new_scalar(dtype: Any, data: Any) -> Any:
    """Serves numpy's ``scalar``: a numpy scalar from exactly its item's bytes."""
    dtype = _checked_dtype(dtype, "a numpy scalar")
    if type(data) is not bytes or len(data) != dtype.itemsize:
        raise _refuse(f"a numpy scalar of dtype {dtype} whose data is not {dtype.itemsize} bytes")
    charge(len(data) // 8 + 1, "a numpy scalar")
    return _scalar(dtype, data)


# A returned class is given back as the real one.
REAL_CLASSES[_NdarrayStandIn] = numpy.ndarray
REAL_CLASSES[_DtypeStandIn] = numpy.dtype

# (module, name) -> what the stream gets. Modules are numpy 1 and numpy 2 spellings.
_GLOBALS: dict[tuple[str, str], Any] = {("numpy", "ndarray"): _NdarrayStandIn, ("numpy", "dtype"): _DtypeStandIn}
for _core in ("numpy.core", "numpy._core"):
    _GLOBALS[(f"{_core}.multiarray", "_reconstruct")] = _reconstruct
    _GLOBALS[(f"{_core}.multiarray", "scalar")] = _new_scalar
    _GLOBALS[(f"{_core}.numeric", "_frombuffer")] = _frombuffer


class NumpyUnpickler(RestrictedLoading, pickle._Unpickler):
    """The restricted loader over the pure-Python unpickler, with numpy's
    globals served by this module and BUILD on numpy values checked."""

    # pickle calls an entry with the unpickler itself, so this class's table
    # holds functions of this class; typeshed declares the base's table as
    # taking the base class, which a subclass's table cannot narrow.
    dispatch: ClassVar[dict[int, Callable[[NumpyUnpickler], None]]] = dict(  # type: ignore[assignment]
        pickle._Unpickler.dispatch
    )

    memo: dict[int, Any]  # set by pickle._Unpickler.__init__ (not in typeshed)

    def __init__(self, file: Any, *, stream_bytes: int = 0, wait: bool = True) -> None:
        pickle._Unpickler.__init__(self, file)
        self._file = file
        # id -> (dtype, fields through nesting, depth) of every dtype built by this load.
        self._dtype_shapes: dict[int, tuple[Any, int, int]] = {}
        self._setup(stream_bytes, wait)

    def _base_load(self) -> Any:
        """``pickle._Unpickler.load`` with a bound on the opcodes it runs."""
        self._unframer = pickle._Unframer(self._file_read, self._file_readline)  # type: ignore[attr-defined]
        self.read = self._unframer.read
        self.readinto = self._unframer.readinto
        self.readline = self._unframer.readline
        self.metastack: list = []
        self.stack: list = []
        self.append = self.stack.append
        self.proto = 0
        read = self.read
        dispatch = self.dispatch
        left = MAX_OPCODES
        try:
            while True:
                key = read(1)
                if not key:
                    raise EOFError
                left -= 1
                if left < 0:
                    raise _refuse(
                        f"a stream of more than {MAX_OPCODES} opcodes that names numpy (decoded at "
                        f"pure-Python speed): return numpy data as arrays rather than as many scalars"
                    )
                dispatch[key[0]](self)
        except pickle._Stop as stop:  # type: ignore[attr-defined]
            return stop.value
        except (IndexError, EOFError, struct.error) as exc:  # the pure-Python machine's own complaints
            raise RestrictedUnpickleError(f"refusing malformed pickle stream: {type(exc).__name__}: {exc}") from exc

    def _numpy_global(self, module: str, name: str) -> Any:
        found = _GLOBALS.get((module, name))
        if found is None:
            raise RestrictedUnpickleError(
                f"refusing to reconstruct {module}.{name}: numpy values are accepted as arrays, "
                f"dtypes and scalars of numeric, bool, text, datetime and structured dtypes only. "
                f"Return one of those, or set AGENTIX_PICKLE_TRUST=1 to trust the sandbox fully."
            )
        return found

    def load_build(self) -> None:
        stack = self.stack
        state = stack.pop()
        inst = stack[-1]
        if isinstance(inst, _PendingDtype) and inst.built is None:
            inst.built = stack[-1] = _build_dtype(inst, state, self._dtype_shapes)
        elif isinstance(inst, _PendingArray) and inst.built is None:
            inst.built = stack[-1] = _build_array(state)
        elif isinstance(inst, (numpy.ndarray, numpy.dtype, numpy.generic, _PendingDtype, _PendingArray)):
            raise _refuse("BUILD on a numpy value that is already built")
        else:
            stack.append(state)
            pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]

    dispatch[pickle.BUILD[0]] = load_build

    def _fetch(self, key: Any) -> None:
        try:
            value = self.memo[key]
        except KeyError:
            raise pickle.UnpicklingError(f"Memo value not found at index {key}") from None
        if isinstance(value, (_PendingDtype, _PendingArray)) and value.built is not None:
            value = value.built
        self.append(value)

    def load_get(self) -> None:
        self._fetch(int(self.readline()[:-1]))

    def load_binget(self) -> None:
        self._fetch(self.read(1)[0])

    def load_long_binget(self) -> None:
        self._fetch(int.from_bytes(self.read(4), "little"))

    dispatch[pickle.GET[0]] = load_get
    dispatch[pickle.BINGET[0]] = load_binget
    dispatch[pickle.LONG_BINGET[0]] = load_long_binget

    def load_bytearray8(self) -> None:
        size = int.from_bytes(self.read(8), "little")
        if size > self._stream_bytes:
            raise _refuse(f"a {size}-byte bytearray in a {self._stream_bytes}-byte stream")
        if self._unframer.current_frame:  # a small value inside a frame
            data = bytearray(self.read(size))
            filled = len(data)
        else:  # large values are written outside frames: read straight into place
            data = bytearray(size)
            filled = self._file.readinto(data)
        if filled != size:
            raise pickle.UnpicklingError("pickle data was truncated")
        self.append(data)

    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8

    def load_next_buffer(self) -> None:
        raise _refuse("an out-of-band buffer (protocol 5 NEXT_BUFFER)")

    dispatch[pickle.NEXT_BUFFER[0]] = load_next_buffer
