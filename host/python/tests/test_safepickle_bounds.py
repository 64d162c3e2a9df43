"""Issue 17, items 3 and 4: the restricted loader bounds the work a stream can ask
for, and allowlisted instances end up as their public constructor made them.

Streams whose refusal must also be shown not to allocate (memo indices, huge
ranges, quadratic conversions) are in `test_safepickle_malicious.huge_payloads`,
loaded in a child process with an address-space limit; these are the in-process
cases: forged instances, the budget's edges, and legitimate values that must
keep decoding.
"""

from __future__ import annotations

import collections
import dataclasses
import decimal
import fractions
import pathlib
import pickle
import random
import struct
import sys
import threading
import time
import tracemalloc
import uuid

import pytest

from agentix.runtime.shared import pickle_stream, safepickle
from agentix.runtime.shared.safepickle import RestrictedUnpickleError, restricted_loads, restricted_loads_chunks


@pytest.fixture(autouse=True)
def strict_policy(monkeypatch):
    monkeypatch.setattr(safepickle, "_allowed_types", {})
    monkeypatch.delenv("AGENTIX_PICKLE_TRUST", raising=False)


def refused_quickly(stream: bytes, match: str = "") -> RestrictedUnpickleError:
    """Loads `stream` whole and in pieces; both refuse within 1 s and 16 MiB."""
    for load in (restricted_loads, lambda data: restricted_loads_chunks([data[:3], data[3:7], data[7:]])):
        tracemalloc.start()
        start = time.monotonic()
        try:
            with pytest.raises(RestrictedUnpickleError, match=match) as info:
                load(stream)
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert time.monotonic() - start < 1.0
        assert peak < 16 << 20, f"peak {peak} bytes"
    return info.value


# --- item 4: forged allowlisted instances -------------------------------------------------


def forged_path_stream(ok: pathlib.Path, secret: pathlib.Path) -> bytes:
    """A PosixPath made from `ok`, whose private ``_str`` BUILD sets to `secret`."""
    return (
        f"cpathlib\nPosixPath\n(V{ok}\ntR(N}}V_str\nV{secret}\nstb.".encode()
    )


def test_forged_path_string_is_rebuilt_from_the_constructor_arguments(tmp_path):
    (tmp_path / "reports").mkdir()
    ok = tmp_path / "reports" / "ok.txt"
    ok.write_text("report")
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    path = restricted_loads(forged_path_stream(ok, secret))
    assert type(path) is pathlib.PosixPath
    assert path.name == "ok.txt" and path.is_relative_to(tmp_path / "reports")
    assert str(path) == str(ok) and path.__fspath__() == str(ok)
    assert path.read_text() == "report"


def test_forged_path_parts_are_refused(tmp_path):
    stream = b"cpathlib\nPosixPath\n(Vreports/ok.txt\ntR(N}V_parts\n(lp0\nV/etc\naVpasswd\nastb."
    refused_quickly(stream, "PosixPath whose _parts was set by the stream")


@pytest.mark.parametrize("name", ["PurePath", "PurePosixPath", "Path", "PosixPath"])
def test_every_path_class_is_checked(name):
    stream = f"cpathlib\n{name}\n(Vok\ntR(N}}V_drv\nV//host\nstb.".encode()
    refused_quickly(stream, "was set by the stream")


def test_forged_fraction_is_refused():
    stream = b"cfractions\nFraction\n(I1\nI3\ntR(N}(V_numerator\nI7\nV_denominator\nI2\nutb."
    refused_quickly(stream, "Fraction whose _numerator was set by the stream")


def test_uuid_int_outside_128_bits_is_refused():
    stream = b"\x80\x02cuuid\nUUID\n)\x81}Vint\nL" + str(2**200).encode() + b"L\nsb."
    refused_quickly(stream, "not a 128-bit integer")


def test_attributes_forged_on_a_counter_are_refused():
    stream = b"ccollections\nCounter\n)R}Vmost_common\nI1\nsb."
    refused_quickly(stream, "Counter with attributes set by the stream")


def test_an_unconstructed_path_cannot_be_made():
    # copyreg._reconstructor(cls, object, None) is object.__new__(cls): with the
    # real class it yields a PosixPath no constructor ran for, ready for BUILD.
    stream = b"ccopyreg\n_reconstructor\n(cpathlib\nPosixPath\ncbuiltins\nobject\nNtR(N}V_str\nV/etc/passwd\nstb."
    try:
        value = restricted_loads(stream)
    except (RestrictedUnpickleError, AttributeError, TypeError):
        return
    assert not isinstance(value, pathlib.PurePath)


@pytest.mark.parametrize("module,name", [("pathlib", "PosixPath"), ("builtins", "list"), ("builtins", "int"),
                                         ("fractions", "Fraction"), ("decimal", "Decimal")])
def test_build_on_a_stand_in_class_is_refused(module, name):
    stream = f"c{module}\n{name}\n(N}}V__new__\ncbuiltins\ntuple\nstb0N.".encode()
    refused_quickly(stream, "refusing to set __new__ on the host class")


# --- item 3: the budget's edges -------------------------------------------------------------


def test_int_of_a_decimal_is_bounded_by_its_digits():
    stream = b"cbuiltins\nint\n(cdecimal\nDecimal\n(V1e%d\ntRtR."
    assert restricted_loads(stream % 4299) == 10**4299
    refused_quickly(stream % 4301, "4301 decimal digits")


def test_int_of_long_text_is_refused_whatever_the_interpreter_limit(monkeypatch):
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        refused_quickly(b"cbuiltins\nint\n(V" + b"9" * 100000 + b"\ntR.", "100000 decimal digits")
        refused_quickly(b"cbuiltins\nint\n(V" + b"9" * 100000 + b"\nI0\ntR.", "100000 decimal digits")  # base 0
        assert restricted_loads(b"cbuiltins\nint\n(V" + b"f" * 100000 + b"\nI16\ntR.") == 16**100000 - 1
    finally:
        sys.set_int_max_str_digits(previous)


def test_range_materialized_within_the_budget_decodes():
    assert restricted_loads(b"cbuiltins\nlist\n(cbuiltins\nrange\n(I1000\ntRtR.") == list(range(1000))
    refused_quickly(b"cbuiltins\nlist\n(cbuiltins\nrange\n(I1000000\ntRtR.", "more work than its size allows")


def test_a_range_too_long_for_len_is_refused():
    refused_quickly(b"cbuiltins\ntuple\n(cbuiltins\nrange\n(L" + b"9" * 30 + b"L\ntRtR.", "more work")


def test_str_of_a_container_is_refused():
    refused_quickly(b"cbuiltins\nstr\n((lp0\nI1\natR.", "str\\(\\) of a list")


def test_memo_index_within_the_stream_is_accepted():
    # Protocols 2 and 3 memoize with BINPUT, then LONG_BINPUT from index 256 on.
    value = [f"item {i}" for i in range(2000)]
    for protocol in (1, 2, 3):
        data = pickle.dumps(value, protocol=protocol)
        assert b"r" in data
        assert restricted_loads(data) == value
        assert restricted_loads_chunks([data[:100], data[100:101], data[101:]]) == value


def test_memo_index_beyond_the_stream_is_refused_in_pieces_too():
    stream = b"\x80\x02Nr" + struct.pack("<I", 1 << 20) + b"."
    refused_quickly(stream, "memo index 1048576 in a 9-byte")
    # Split inside the opcode's argument: the walk reads across pieces.
    with pytest.raises(RestrictedUnpickleError, match="memo index"):
        restricted_loads_chunks([stream[:4], stream[4:6], stream[6:]])


def test_a_large_legitimate_stream_fits_its_budget():
    # Protocol 3 pickles a set as set([...]): the constructor copies every item.
    values = [set(range(300000)), collections.Counter({str(i): i for i in range(100000)}),
              bytearray(b"x" * (4 << 20)), 7**50000]
    for value in values:
        for protocol in (3, 4, 5):
            assert restricted_loads(pickle.dumps(value, protocol=protocol)) == value


# --- legitimate values keep their types --------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        pathlib.PurePosixPath("/a/b"),
        pathlib.PosixPath("reports/ok.txt"),
        pathlib.PurePath("x"),
        fractions.Fraction(-7, 3),
        decimal.Decimal("-1.25e-3"),
        uuid.UUID(int=2**127 + 5),
        collections.Counter("aab"),
        collections.OrderedDict(a=1),
        collections.deque([1, 2], maxlen=5),
        {pathlib.PurePosixPath("/k"): fractions.Fraction(1, 2)},
    ],
    ids=lambda value: type(value).__name__,
)
@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_allowlisted_values_keep_their_exact_type(value, protocol):
    decoded = restricted_loads(pickle.dumps(value, protocol=protocol))
    assert decoded == value and type(decoded) is type(value)
    if isinstance(value, pathlib.PurePath):
        assert str(decoded) == str(value) and hash(decoded) == hash(value)


@pytest.mark.parametrize("cls", [list, dict, set, int, str, bytes, fractions.Fraction, decimal.Decimal,
                                 pathlib.PosixPath, collections.Counter])
def test_a_returned_class_is_the_real_class(cls):
    assert restricted_loads(pickle.dumps(cls, protocol=5)) is cls


def test_defaultdict_factory_is_the_real_class():
    value = collections.defaultdict(set, {"a": {1}})
    decoded = restricted_loads(pickle.dumps(value, protocol=5))
    assert decoded == value and decoded.default_factory is set


# --- loads on two threads (large results decode on a worker thread) ----------------------


@dataclasses.dataclass
class Point:
    x: int


class PausingFile:
    """A stream that stops being readable at `pause_at` until `go` is set."""

    def __init__(self, data: bytes, pause_at: int) -> None:
        self._data, self._pos, self._pause_at = data, 0, pause_at
        self.reached, self.go = threading.Event(), threading.Event()

    def _wait(self, end: int) -> None:
        if self._pos <= self._pause_at < end:
            self.reached.set()
            assert self.go.wait(10)

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._pos + size
        self._wait(end)
        out = self._data[self._pos : end]
        self._pos += len(out)
        return out

    def readline(self) -> bytes:
        end = self._data.index(b"\n", self._pos) + 1
        self._wait(end)
        out = self._data[self._pos : end]
        self._pos = end
        return out


def test_a_concurrent_load_cannot_keep_a_class_change_another_load_undid():
    safepickle.allow_type(Point)
    name = f"c{__name__}\nPoint\n".encode()
    # Load 1 sets Point.pwned (BUILD on the class), then pauses before it ends.
    poisoning = name + b"(N}Vpwned\nI1\nstb"
    first = PausingFile(poisoning + b"0N.", len(poisoning))
    # Load 2 names Point while it is changed; without mutual exclusion it
    # snapshots the change, and "restores" it after load 1 undid it.
    second = PausingFile(name + b")\x81}Vx\nI1\nsb.", len(name))
    outcomes = {}

    def load(key, file):
        try:
            outcomes[key] = safepickle.RestrictedUnpickler(file).load()
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            outcomes[key] = exc

    one = threading.Thread(target=load, args=("first", first))
    two = threading.Thread(target=load, args=("second", second))
    one.start()
    assert first.reached.wait(10)
    two.start()
    second.reached.wait(0.5)  # reached at once without the lock; with it, waits for load 1
    first.go.set()
    one.join(10)
    assert second.reached.wait(10)
    second.go.set()
    two.join(10)
    poisoned = Point.__dict__.get("pwned")
    if poisoned is not None:
        del Point.pwned
    assert poisoned is None, "the class kept a change a refused load made"
    assert isinstance(outcomes["first"], RestrictedUnpickleError)
    assert outcomes["second"] == Point(1)


def test_a_load_that_would_wait_raises_decode_busy_when_asked_not_to():
    safepickle.allow_type(Point)
    data = pickle.dumps(Point(3), protocol=5)
    with safepickle._class_lock:
        with pytest.raises(safepickle.DecodeBusy):
            restricted_loads(data, wait=False)
        assert restricted_loads(pickle.dumps([1, "a"], protocol=5), wait=False) == [1, "a"]  # no class: no wait
    assert restricted_loads(data, wait=False) == Point(3)


def test_the_memo_walk_agrees_whole_and_in_pieces():
    """The single-buffer walk and the one over pieces refuse exactly the same streams."""
    rng = random.Random(17)
    alphabet = b"prq\x80\x02NX\x8c\x94\n0123456789.(tlas"

    def refused(chunks, total):
        try:
            pickle_stream.check_memo(chunks, total)
        except RestrictedUnpickleError:
            return True
        return False

    seen = set()
    for i in range(3000):
        if i % 3 == 0:
            value = [rng.choice([1, "pr" * rng.randint(0, 50), b"rrr", None, {"a": i}]) for _ in range(rng.randint(0, 300))]
            data = pickle.dumps(value, rng.randint(0, 5))
        else:
            data = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        cuts = sorted({rng.randint(1, max(1, len(data) - 1)) for _ in range(3)})
        pieces = [memoryview(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)]) if b > a]
        whole = refused([data], len(data))
        assert whole == refused(pieces, len(data)), data
        seen.add(whole)
    assert seen == {True, False}


def test_a_few_large_values_in_pieces_are_walked_without_the_byte_scan(monkeypatch):
    """A big result arrives as MiB-sized views: the memo walk's short probe
    covers a stream of a few large values, so no piece is copied for the
    byte scan; a bad memo index after them is still refused; a stream of
    many small opcodes still gets the scan."""
    scanned = []
    real_scan = safepickle.needs_memo_check
    monkeypatch.setattr(safepickle, "needs_memo_check", lambda chunks: scanned.append(1) or real_scan(chunks))

    def pieces(data):
        view = memoryview(data)
        return [view[at : at + (1 << 20)] for at in range(0, len(data), 1 << 20)]

    value = (bytes(3 << 20), b"r" * 100, bytearray(b"p" * (2 << 20)))
    stream = pickle.dumps(value, protocol=5)
    assert restricted_loads_chunks(pieces(stream)) == value
    assert scanned == []

    bad = stream[:-1] + b"r\xff\xff\xff\x7f."  # LONG_BINPUT 2**31 - 1 before STOP
    with pytest.raises(RestrictedUnpickleError, match="memo index"):
        restricted_loads_chunks(pieces(bad))
    assert scanned == []

    many = pickle.dumps(list(range(1000)), protocol=5)
    assert restricted_loads_chunks([many[:10], many[10:]]) == list(range(1000))
    assert scanned == [1]


def test_chunked_decode_copies_large_pieces_of_values_below_32_mib_with_the_given_copy():
    copied = []

    def copy(target, offset, source):
        copied.append((len(target), len(source)))
        memoryview(target)[offset : offset + len(source)] = source

    value = random.randbytes(3 << 20)
    stream = pickle.dumps(value, protocol=5)
    pieces = [stream[i : i + (1 << 20)] for i in range(0, len(stream), 1 << 20)]
    assert restricted_loads_chunks(pieces, copy=copy) == value
    assert copied and all(size >= pickle_stream.COPY_FUNCTION_BYTES for _, size in copied)
    # A value of 32 MiB or more is a fresh mapping: copied as before.
    copied.clear()
    big = bytes(pickle_stream.COPY_FUNCTION_MAX_VALUE)
    stream = pickle.dumps(big, protocol=5)
    pieces = [stream[i : i + (1 << 20)] for i in range(0, len(stream), 1 << 20)]
    assert restricted_loads_chunks(pieces, copy=copy) == big
    assert copied == []


def test_chunked_decode_with_consume_empties_the_list_however_it_ends():
    # The host's ring pieces are released only once nothing refers to them:
    # a consumed list keeps none, after a value and after a refusal alike.
    value = random.randbytes(3 << 20)
    stream = pickle.dumps(value, protocol=5)
    pieces = [memoryview(stream)[i : i + (1 << 20)] for i in range(0, len(stream), 1 << 20)]
    kept = list(pieces)
    assert restricted_loads_chunks(kept) == value
    assert kept == pieces  # not consumed unless asked
    assert restricted_loads_chunks(kept, consume=True) == value
    assert kept == []
    bad = [b"\x80\x05c", b"os\nsystem\n", b"."]
    with pytest.raises(RestrictedUnpickleError):
        restricted_loads_chunks(bad, consume=True)
    assert bad == []
