"""The sandbox -> host allowlist: what decodes, what is refused, and with which message."""

import collections
import copyreg
import dataclasses
import datetime
import decimal
import fractions
import io
import os
import pathlib
import pickle
import sys
import uuid

import pytest

from agentix.runtime.shared import safepickle
from agentix.runtime.shared.safepickle import (
    SAFE_TYPES,
    RestrictedUnpickleError,
    RestrictedUnpickler,
    allow_type,
    restricted_loads,
)

NOT_ALLOWED = (
    "refusing to reconstruct {module}.{name}: it is not on the host allowlist for sandbox return values. "
    "If you trust it: for a class, call agentix.allow_type({module}.{name}) (after importing {module}); "
    "for a function that rebuilds a value, call agentix.allow_callable('{module}', '{name}'); before the "
    "call. Or set AGENTIX_PICKLE_TRUST=1 to trust the sandbox fully."
)


@dataclasses.dataclass
class Point:
    x: int
    y: int


class SubPoint(Point):
    pass


@pytest.fixture(autouse=True)
def isolated_policy(monkeypatch):
    monkeypatch.setattr(safepickle, "_allowed_types", {})
    monkeypatch.delenv("AGENTIX_PICKLE_TRUST", raising=False)


def global_stream(module: str, name: str, suffix: bytes = b")R.") -> bytes:
    """A protocol-0 GLOBAL of module.name, by default called with no arguments."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n" + suffix


VALUES = [
    None,
    True,
    7,
    2**100,
    1.5,
    complex(1, 2),
    "text",
    b"bytes",
    bytearray(b"ba"),
    [1, [2, 3]],
    (1, "two"),
    {"k": {"nested": [1]}},
    {1, 2},
    frozenset({3}),
    range(1, 10, 2),
    slice(1, 5, 2),
    datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc),
    datetime.date(2024, 1, 2),
    datetime.time(3, 4),
    datetime.timedelta(seconds=5),
    datetime.timezone(datetime.timedelta(hours=2)),
    decimal.Decimal("1.25"),
    fractions.Fraction(1, 3),
    uuid.UUID(int=12345),
    collections.OrderedDict(a=1),
    collections.Counter("aab"),
    collections.deque([1, 2], maxlen=5),
    pathlib.PurePosixPath("/a/b"),
    pathlib.Path("/tmp/x"),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("protocol", [4, 5])  # what a Python 3 worker produces
def test_allowlisted_values_round_trip(value, protocol):
    assert restricted_loads(pickle.dumps(value, protocol=protocol)) == value


def test_defaultdict_keeps_its_factory():
    value = collections.defaultdict(list, {"a": [1]})
    decoded = restricted_loads(pickle.dumps(value, protocol=5))
    assert decoded == value and decoded.default_factory is list


def test_builtin_exceptions_decode():
    decoded = restricted_loads(pickle.dumps(KeyError("missing"), protocol=5))
    assert isinstance(decoded, KeyError) and decoded.args == ("missing",)


def test_safe_types_is_the_exact_reviewed_set():
    # The original's 32 less its 2 numpy classes (numpy values are served by
    # _numpy_support's checked constructors), and agentix.bash.run_stream's 4 event types.
    assert len(SAFE_TYPES) == 34
    assert not any(module.split(".")[0] == "numpy" for module, _ in SAFE_TYPES)
    assert ("datetime", "datetime") in SAFE_TYPES
    assert ("pathlib._local", "PosixPath") in SAFE_TYPES
    assert ("agentix.bash", "BashResult") in SAFE_TYPES
    for event in ("BashStdout", "BashStderr", "BashExit", "BashError"):
        assert ("agentix.bash", event) in SAFE_TYPES
    assert all(isinstance(module, str) and isinstance(name, str) for module, name in SAFE_TYPES)


def test_unlisted_class_is_refused_with_fix():
    with pytest.raises(RestrictedUnpickleError) as info:
        restricted_loads(pickle.dumps(Point(1, 2)))
    assert str(info.value) == NOT_ALLOWED.format(module=__name__, name="Point")


@pytest.mark.parametrize(
    ("module", "name"),
    [("os", "system"), ("posix", "system"), ("subprocess", "Popen"), ("subprocess", "check_output")],
)
def test_process_spawning_globals_are_refused(module, name):
    stream = global_stream(module, name, b"(S'touch /tmp/agentix-pwned'\ntR.")
    with pytest.raises(RestrictedUnpickleError) as info:
        restricted_loads(stream)
    assert str(info.value) == NOT_ALLOWED.format(module=module, name=name)


class _SystemGadget:
    def __reduce__(self):
        return (os.system, ("true",))


def test_reduce_gadget_built_by_pickle_is_refused():
    with pytest.raises(RestrictedUnpickleError, match=r"refusing to reconstruct posix\.system"):
        restricted_loads(pickle.dumps(_SystemGadget(), protocol=5))


@pytest.mark.parametrize("name", ["eval", "exec", "getattr", "__import__", "open", "compile", "setattr", "vars"])
def test_builtin_functions_are_refused(name):
    with pytest.raises(RestrictedUnpickleError) as info:
        restricted_loads(global_stream("builtins", name, b"."))
    assert str(info.value) == (
        f"refusing builtins.{name}: only builtin value types and exceptions may cross the "
        "sandbox→host boundary. Set AGENTIX_PICKLE_TRUST=1 to trust the sandbox fully."
    )


def test_getattr_gadget_cannot_reach_os_system():
    # builtins.getattr(<allowed object>, "...") is the classic walk to an arbitrary callable.
    stream = b"cbuiltins\ngetattr\n(cbuiltins\nlist\nS'__class__'\ntR."
    with pytest.raises(RestrictedUnpickleError, match=r"refusing builtins\.getattr"):
        restricted_loads(stream)


def test_refused_module_is_never_imported(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "agentix_import_trap.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Trap: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RestrictedUnpickleError):
        restricted_loads(global_stream("agentix_import_trap", "Trap"))
    assert not marker.exists()
    assert "agentix_import_trap" not in sys.modules


@pytest.mark.parametrize(
    "stream",
    [b"\x80\x02\x82\x01.", b"\x80\x02\x83\x01\x00.", b"\x80\x02\x84\x01\x00\x00\x00."],
    ids=["EXT1", "EXT2", "EXT4"],
)
def test_extension_opcodes_are_refused(stream):
    with pytest.raises(RestrictedUnpickleError, match="extension opcodes cannot be safely validated against the exact allowlist"):
        restricted_loads(stream)


@pytest.mark.parametrize(
    "stream",
    [b"\xff\x00garbage", pickle.dumps([1, 2, 3], protocol=5)[:-4], b"(\x82", b""],
    ids=["bad-opcode", "truncated", "ext-byte-garbage", "empty"],
)
def test_malformed_streams_are_refused(stream):
    with pytest.raises(RestrictedUnpickleError, match="^refusing malformed pickle opcode stream: "):
        restricted_loads(stream)


def test_errors_of_admitted_constructors_propagate():
    # A well-formed stream whose (allowed) constructor rejects its argument.
    stream = global_stream("decimal", "Decimal", b"(S'not a number'\ntR.")
    with pytest.raises(decimal.InvalidOperation):
        restricted_loads(stream)


def test_policy_functions_are_refused():
    for name in ("allow_type", "_trust_enabled", "restricted_loads"):
        with pytest.raises(RestrictedUnpickleError, match="not on the host allowlist"):
            restricted_loads(global_stream("agentix.runtime.shared.safepickle", name, b"."))
    assert safepickle._allowed_types == {}


def test_allow_type_admits_exactly_that_class():
    allow_type(Point)
    assert restricted_loads(pickle.dumps(Point(1, 2))) == Point(1, 2)
    with pytest.raises(RestrictedUnpickleError, match=r"SubPoint"):
        restricted_loads(pickle.dumps(SubPoint(1, 2)))


def test_allow_type_returns_the_registered_class_without_importing():
    ghost = type("Ghost", (), {})
    ghost.__module__ = "agentix_ghost_module"
    allow_type(ghost)
    decoded = restricted_loads(global_stream("agentix_ghost_module", "Ghost", b")\x81."))
    assert type(decoded) is ghost
    assert "agentix_ghost_module" not in sys.modules


def test_allow_type_requires_a_class():
    with pytest.raises(TypeError) as info:
        allow_type(Point(1, 2))
    assert str(info.value) == (
        "allow_type() requires a class; for a function that rebuilds a value use agentix.allow_callable(module, name)"
    )


def test_only_exact_trust_exists(monkeypatch):
    """No module-wide trust; `allow_callable` admits one named function, not its neighbours."""
    assert not hasattr(safepickle, "allow_module")
    monkeypatch.setattr(safepickle, "_allowed_callables", {})
    safepickle.allow_callable("operator", "add")
    assert restricted_loads(global_stream("operator", "add", b"(I1\nI2\ntR.")) == 3
    with pytest.raises(RestrictedUnpickleError):
        restricted_loads(global_stream("operator", "sub", b"(I1\nI2\ntR."))


def test_safe_type_entry_must_resolve_to_a_class(monkeypatch):
    monkeypatch.setattr(safepickle, "SAFE_TYPES", SAFE_TYPES | {("os", "getcwd")})
    with pytest.raises(RestrictedUnpickleError) as info:
        restricted_loads(global_stream("os", "getcwd"))
    assert str(info.value) == "refusing to reconstruct os.getcwd: the allowlisted value global did not resolve to a type"


@pytest.mark.parametrize("setting", ["1", "true", "YES", " yes "])
def test_trust_env_restores_plain_pickle(monkeypatch, setting):
    monkeypatch.setenv("AGENTIX_PICKLE_TRUST", setting)
    assert restricted_loads(pickle.dumps(Point(3, 4))) == Point(3, 4)


@pytest.mark.parametrize("setting", ["0", "false", "", "on"])
def test_other_trust_values_keep_the_allowlist(monkeypatch, setting):
    monkeypatch.setenv("AGENTIX_PICKLE_TRUST", setting)
    with pytest.raises(RestrictedUnpickleError):
        restricted_loads(pickle.dumps(Point(3, 4)))


def test_restricted_unpickler_enforces_the_allowlist_directly():
    assert RestrictedUnpickler(io.BytesIO(pickle.dumps([1]))).load() == [1]
    with pytest.raises(RestrictedUnpickleError):
        RestrictedUnpickler(io.BytesIO(pickle.dumps(Point(1, 1)))).load()


def test_error_is_an_unpickling_error():
    assert issubclass(RestrictedUnpickleError, pickle.UnpicklingError)


class _Point:
    pass


@pytest.mark.parametrize("code", [1, 300, 70000])
def test_extension_opcodes_are_refused_while_copyreg_has_extensions(code):
    # With a registered extension, an EXT opcode would fetch the object from
    # copyreg's registry and cache without find_class: it must be refused up
    # front (the fast path relies on the registry being empty).
    copyreg.add_extension(__name__, "_Point", code)
    try:
        stream = pickle.dumps(_Point, protocol=2)
        assert stream[2] in (0x82, 0x83, 0x84)
        pickle.loads(stream)  # fills copyreg's extension cache
        with pytest.raises(RestrictedUnpickleError, match="extension opcodes"):
            restricted_loads(stream)
        with pytest.raises(RestrictedUnpickleError, match="extension opcodes"):
            safepickle.restricted_loads_chunks([stream[:3], stream[3:]])
    finally:
        copyreg.remove_extension(__name__, "_Point", code)


def _splits(data, *sizes):
    pieces, start = [], 0
    for size in sizes:
        pieces.append(data[start : start + size])
        start += size
    pieces.append(data[start:])
    return pieces


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_chunked_loading_equals_joined_loading(protocol):
    value = {"text": "é" * 1000 + "\nline", "items": list(range(2000)), "nested": [(1.5, None, True)]}
    if protocol >= 3:  # protocols 0-2 spell bytes through _codecs.encode, which is refused
        value["big"] = os.urandom(300_000)
    data = pickle.dumps(value, protocol=protocol)
    for pieces in (
        [data],
        _splits(data, 1, 1, 7),
        _splits(data, 100_000, 3),
        [memoryview(piece) for piece in _splits(data, 5000, 5000, 250_000)],
        [b"", data, b""],
    ):
        assert safepickle.restricted_loads_chunks(pieces) == value


def test_chunked_loading_refuses_what_restricted_loads_refuses():
    for stream in (global_stream("os", "system", b"(S'true'\ntR."), b"\xff\x00garbage", b"\x80\x02\x82\x01."):
        with pytest.raises(RestrictedUnpickleError) as joined:
            restricted_loads(stream)
        with pytest.raises(RestrictedUnpickleError) as chunked:
            safepickle.restricted_loads_chunks(_splits(stream, 1, 2))
        assert str(chunked.value) == str(joined.value)


def test_chunked_loading_never_allocates_a_claimed_frame_length():
    # FRAME announcing 1 TiB followed by two bytes: refused as truncated, as
    # restricted_loads does, instead of allocating what the stream claims.
    stream = b"\x80\x04\x95" + (1 << 40).to_bytes(8, "little") + b"N."
    with pytest.raises(RestrictedUnpickleError, match="malformed"):
        restricted_loads(stream)
    with pytest.raises(RestrictedUnpickleError, match="malformed"):
        safepickle.restricted_loads_chunks([stream[:5], stream[5:]])


INERT_VALUES = [None, True, 7, -(2**70), 1.5, b"xy", (1, 2), [1, [2, 3]], {1: (2.5, None)}, {1, 2}, frozenset({3})]


@pytest.mark.parametrize("value", INERT_VALUES, ids=repr)
def test_streams_that_name_nothing_skip_the_restricted_unpickler(value, monkeypatch):
    # No byte of these streams is an opcode that could name, call or build
    # anything: plain pickle.loads decodes them (the restricted unpickler costs
    # ~20x the load itself) and gives the same value.
    data = pickle.dumps(value, protocol=5)

    def refuse(*args, **kwargs):
        raise AssertionError("the restricted unpickler was used")

    monkeypatch.setattr(safepickle, "RestrictedUnpickler", refuse)
    assert restricted_loads(data) == value


@pytest.mark.parametrize(
    "value", ["abc", (b"c",), [Point(1, 2)], collections.OrderedDict(a=1), "\u20ac"], ids=repr
)
def test_streams_holding_opcode_bytes_take_the_restricted_path(value):
    # A letter of a string may be GLOBAL's byte: such a stream is not known to
    # be inert, so it is decoded (and checked) by the restricted unpickler.
    data = pickle.dumps(value, protocol=5)
    assert safepickle._NOT_INERT.search(data) is not None
    if isinstance(value, list):
        allow_type(Point)
    assert restricted_loads(data) == value


@pytest.mark.parametrize(
    "stream",
    [b"\x80\x05]", b"\x80\x05\x95\xff\x00\x00\x00\x00\x00\x00\x00N.", b"\x80\x05K", b"\x80\x05\x8b\xff\xff\xff\x7fN."],
)
def test_malformed_inert_streams_are_refused_as_before(stream):
    assert safepickle._NOT_INERT.search(stream) is None
    with pytest.raises(RestrictedUnpickleError):
        restricted_loads(stream)
