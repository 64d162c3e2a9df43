"""numpy values and the user's own types through the host loader (issue 18 item 3).

ndarrays and numpy scalars decode without `allow_type` and without trusting the
sandbox, under pickle protocols 4 and 5, exactly as plain ``pickle.loads`` gives
them; object dtypes are refused; `agentix.allow_type` / `agentix.allow_callable`
admit the user's own types, and every refusal names the call that admits it.
"""

from __future__ import annotations

import dataclasses
import pickle
import re

import numpy
import pytest

import agentix
from agentix.runtime.shared import safepickle
from agentix.runtime.shared.safepickle import RestrictedUnpickleError, restricted_loads, restricted_loads_chunks


@pytest.fixture(autouse=True)
def strict_policy(monkeypatch):
    monkeypatch.setattr(safepickle, "_allowed_types", {})
    monkeypatch.setattr(safepickle, "_allowed_callables", {})
    monkeypatch.delenv("AGENTIX_PICKLE_TRUST", raising=False)


def _arrays() -> dict[str, numpy.ndarray]:
    base = numpy.arange(24, dtype="f8").reshape(4, 6)
    out = {
        "c_contiguous": base,
        "f_contiguous": numpy.asfortranarray(base),
        "transposed": base.T,
        "strided": base[::2, ::3],
        "negative_strides": base[::-1, ::-1],
        "zero_d": numpy.array(3.5),
        "empty": numpy.zeros((0, 5)),
        "big_endian": numpy.arange(10, dtype=">i4"),
        "read_only": numpy.arange(5),
        "structured": numpy.array([(1, [[1.5] * 3] * 2)], dtype=[("a", "<i4"), ("b", ">f8", (2, 3))]),
        "structured_titles_offsets": numpy.zeros(
            2, dtype={"names": ["x", "y"], "formats": ["u1", "f4"], "offsets": [0, 8], "itemsize": 16, "titles": ["tx", None]}
        ),
        "structured_aligned": numpy.zeros(3, dtype=numpy.dtype([("a", "i1"), ("b", "<f8")], align=True)),
        "nested_structured": numpy.zeros((2, 2), dtype=[("p", [("q", "u2"), ("r", "c8")])]),
        "unicode": numpy.array(["ab", "c"]),
        "bytes": numpy.array([b"ab", b""]),
        "datetime": numpy.arange(3).astype("M8[3ms]"),
        "timedelta": numpy.arange(3).astype("m8[D]"),
        "subarray_field_only": numpy.zeros(2, dtype=("f4", (3,))),
        "large": numpy.arange(1 << 20, dtype="f8"),  # 8 MiB
    }
    out["read_only"].flags.writeable = False
    for code in numpy.typecodes["All"]:
        if code in "OMm":  # object is refused; generic datetimes have no unit to print
            continue
        out[f"dtype_{code}"] = (numpy.arange(6) % 2).astype(code)
    return out


ARRAYS = _arrays()
SCALARS = {
    "float64": numpy.float64(1.5),
    "float16": numpy.float16(-2),
    "longdouble": numpy.longdouble("1.25"),
    "clongdouble": numpy.clongdouble(1j),
    "int8": numpy.int8(-3),
    "uint64": numpy.uint64(2**64 - 1),
    "bool": numpy.bool_(True),
    "str": numpy.str_("xy"),
    "bytes": numpy.bytes_(b"xy"),
    "datetime": numpy.datetime64("2020-01-01T12:00"),
    "timedelta": numpy.timedelta64(5, "s"),
    "void": numpy.zeros(1, dtype=[("a", "i4"), ("b", "f8")])[0],
}


def _same_array(got, want) -> None:
    assert type(got) is type(want) is numpy.ndarray
    assert got.dtype == want.dtype and got.dtype.str == want.dtype.str
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    assert got.flags.writeable == want.flags.writeable
    assert got.flags.c_contiguous == want.flags.c_contiguous
    assert got.flags.f_contiguous == want.flags.f_contiguous


@pytest.mark.parametrize("protocol", [4, 5])
@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_array_round_trips_as_plain_pickle_gives_it(name, protocol):
    data = pickle.dumps(ARRAYS[name], protocol=protocol)
    want = pickle.loads(data)
    _same_array(restricted_loads(data), want)
    # As a result arrives: in pieces.
    _same_array(restricted_loads_chunks([data[:7], data[7:40], data[40:]]), want)


@pytest.mark.parametrize("protocol", [4, 5])
@pytest.mark.parametrize("name", sorted(SCALARS))
def test_scalar_round_trips(name, protocol):
    value = SCALARS[name]
    got = restricted_loads(pickle.dumps(value, protocol=protocol))
    assert type(got) is type(pickle.loads(pickle.dumps(value, protocol=protocol)))
    assert got.dtype == value.dtype and got.tobytes() == value.tobytes()


@pytest.mark.parametrize("protocol", [4, 5])
def test_dtypes_and_arrays_inside_containers(protocol):
    a = numpy.arange(3)
    value = {"dtype": numpy.dtype("i2"), "same": [a, a], "view": (a.dtype, numpy.float32(2))}
    got = restricted_loads(pickle.dumps(value, protocol=protocol))
    assert got["dtype"] == numpy.dtype("i2") and isinstance(got["dtype"], numpy.dtype)
    assert got["same"][0] is got["same"][1]  # memo references give the built array
    _same_array(got["same"][0], a)
    assert got["view"][0] == a.dtype and got["view"][1] == numpy.float32(2)


def test_the_numpy_classes_themselves_come_back_as_the_real_ones():
    assert restricted_loads(pickle.dumps(numpy.ndarray, protocol=5)) is numpy.ndarray
    assert restricted_loads(pickle.dumps(numpy.dtype, protocol=5)) is numpy.dtype


@pytest.mark.parametrize("protocol", [4, 5])
@pytest.mark.parametrize(
    "value",
    [
        numpy.array([1, "x"], dtype=object),
        numpy.zeros(2, dtype=[("a", "O"), ("b", "f8")]),
        numpy.zeros(2, dtype=[("a", "f8"), ("b", [("c", "O")])]),
        numpy.zeros(2, dtype=("O", (2,))),
    ],
    ids=["object", "object_field", "nested_object_field", "object_subarray"],
)
def test_object_dtype_arrays_stay_gated(value, protocol):
    with pytest.raises(RestrictedUnpickleError, match="holding Python objects.*AGENTIX_PICKLE_TRUST=1"):
        restricted_loads(pickle.dumps(value, protocol=protocol))


def test_object_arrays_load_when_the_sandbox_is_trusted(monkeypatch):
    monkeypatch.setenv("AGENTIX_PICKLE_TRUST", "1")
    got = restricted_loads(pickle.dumps(numpy.array([1, "x"], dtype=object), protocol=5))
    assert got.tolist() == [1, "x"]


def test_numpy_stream_is_bounded_by_the_same_budget():
    """Arrays are charged their size: 100,000 views of one 64 KiB buffer are refused."""
    def text(value: str) -> bytes:  # SHORT_BINUNICODE
        return b"\x8c" + bytes([len(value)]) + value.encode()

    buffer = b"\x96" + (1 << 16).to_bytes(8, "little") + b"\x00" * (1 << 16) + b"\x94"  # BYTEARRAY8, MEMOIZE 0
    dtype = (  # numpy.dtype('f8', False, True) + BUILD of its state, MEMOIZE 1
        text("numpy") + text("dtype") + b"\x93" + text("f8") + b"\x89\x88\x87R(K\x03" + text("<")
        + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x94"
    )
    frombuffer = text("numpy.core.numeric") + text("_frombuffer") + b"\x93\x94"  # MEMOIZE 2
    one = b"h\x02(h\x00h\x01M\x00\x20\x85" + text("C") + b"tR"  # _frombuffer(buffer, dtype, (8192,), 'C')
    stream = b"\x80\x05" + buffer + dtype + frombuffer + b"(" + one * 100000 + b"l."
    with pytest.raises(RestrictedUnpickleError, match="budget"):
        restricted_loads(stream)
    # One such view is fine.
    assert restricted_loads(b"\x80\x05" + buffer + dtype + frombuffer + one + b".").shape == (8192,)


def test_a_numpy_stream_runs_a_bounded_number_of_opcodes(monkeypatch):
    """The pure-Python loader is ~30x slower per opcode than the C one: a stream naming
    numpy then padding with cheap opcodes is refused after MAX_OPCODES (4M by default,
    ~1.5 s; 100,000 here to keep the test short)."""
    from agentix.runtime.shared import _numpy_support

    assert _numpy_support.MAX_OPCODES == 1 << 22
    monkeypatch.setattr(_numpy_support, "MAX_OPCODES", 100_000)
    stream = b"\x80\x05\x8c\x05numpy\x8c\x05dtype\x93" + b"N0" * 60_000 + b"."
    with pytest.raises(RestrictedUnpickleError, match="more than 100000 opcodes"):
        restricted_loads(stream)
    # 10,000 numpy scalars in a list (about 7 opcodes each) are fine.
    values = [numpy.float32(i) for i in range(10_000)]
    assert restricted_loads(pickle.dumps(values, protocol=5))[-1] == numpy.float32(9_999)


# --- allow_type / allow_callable, and refusals that name them -----------------------------


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Celsius:
    """A value reduced by a module-level function, not by its class."""

    def __init__(self, degrees: float) -> None:
        self.degrees = degrees

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Celsius) and other.degrees == self.degrees

    def __reduce__(self):
        return (make_celsius, (self.degrees,))


def make_celsius(degrees: float) -> Celsius:
    return Celsius(degrees)


def _follow(message: str, call: str) -> None:
    """Runs the `call` (agentix.allow_type / allow_callable) a refusal message names."""
    found = re.search(rf"(agentix\.{call}\(([^()]*)\))", message)
    assert found, message
    statement = found.group(1)
    if call == "allow_type":
        module = found.group(2).rsplit(".", 1)[0]
        assert f"after importing {module}" in message
        exec(f"import {module}\n{statement}", {"agentix": agentix})
    else:
        exec(statement, {"agentix": agentix})


def test_allow_type_and_allow_callable_are_exported():
    assert agentix.allow_type is safepickle.allow_type
    assert agentix.allow_callable is safepickle.allow_callable
    assert {"allow_type", "allow_callable"} <= set(agentix.__all__)


@pytest.mark.parametrize("with_numpy", [False, True])
@pytest.mark.parametrize("protocol", [4, 5])
def test_a_refused_dataclass_is_admitted_by_the_call_its_message_names(protocol, with_numpy):
    value = [Point(1, 2.5), numpy.arange(2)] if with_numpy else [Point(1, 2.5)]
    data = pickle.dumps(value, protocol=protocol)
    with pytest.raises(RestrictedUnpickleError) as info:
        restricted_loads(data)
    _follow(str(info.value), "allow_type")
    got = restricted_loads(data)
    assert got[0] == Point(1, 2.5)
    if with_numpy:
        _same_array(got[1], value[1])


@pytest.mark.parametrize("protocol", [4, 5])
def test_a_refused_reconstruction_function_is_admitted_by_allow_callable(protocol):
    data = pickle.dumps({"t": Celsius(21.5)}, protocol=protocol)
    with pytest.raises(RestrictedUnpickleError) as info:
        restricted_loads(data)
    message = str(info.value)
    assert f"agentix.allow_callable({__name__!r}, 'make_celsius')" in message
    _follow(message, "allow_callable")
    assert restricted_loads(data) == {"t": Celsius(21.5)}
    # Exactly that function: the class itself stays refused.
    with pytest.raises(RestrictedUnpickleError):
        restricted_loads(pickle.dumps(Point(1, 2), protocol=protocol))


def test_allow_callable_takes_only_importable_functions():
    with pytest.raises(TypeError, match=r"is a class: use agentix.allow_type"):
        agentix.allow_callable(__name__, "Point")
    with pytest.raises(TypeError, match="two strings"):
        agentix.allow_callable(make_celsius, "x")
    with pytest.raises(ModuleNotFoundError):
        agentix.allow_callable("agentix_no_such_module", "f")
    with pytest.raises(AttributeError):
        agentix.allow_callable(__name__, "no_such_function")
    assert agentix.allow_callable(__name__, "make_celsius") is make_celsius
    with pytest.raises(TypeError, match="allow_callable"):
        agentix.allow_type(make_celsius)


def test_numpy_globals_outside_the_value_set_are_refused_without_import():
    stream = b"cnumpy.testing\nassert_equal\n(I1\nI1\ntR."
    with pytest.raises(RestrictedUnpickleError, match="numpy values are accepted as arrays"):
        restricted_loads(stream)


def test_plain_results_do_not_take_the_numpy_loader(monkeypatch):
    """Only a stream that names numpy pays for the pure-Python loader."""
    from agentix.runtime.shared import _numpy_support

    def refuse(*args, **kwargs):
        raise AssertionError("the numpy loader ran")

    monkeypatch.setattr(_numpy_support, "NumpyUnpickler", refuse)
    assert restricted_loads(pickle.dumps({"a": [1, 2.5, b"x"]}, protocol=5)) == {"a": [1, 2.5, b"x"]}
