"""A corpus of hostile sandbox return values: every one is refused by the host loader
(`agentix.runtime.shared.safepickle`), with `RestrictedUnpickleError`, and none has a side
effect: payloads that would run a command, write a file or import a module aim at a marker
file (or module) that must not exist afterwards; payloads that would allocate huge memory are
loaded in a child process with an address-space limit and must fail definitely while its peak
RSS stays small.

Payloads are hand-written opcode streams (protocol 0 text opcodes, easy to review) or made by
pickling crafted classes whose ``__reduce__`` names the dangerous callable, at several
protocols. The committed copies in ``malicious_pickles/`` are the same bytes with the marker
placeholder, for fuzzers and other loaders (regenerate: ``python3 -m tests.test_safepickle_malicious``
from host/python); ``test_committed_corpus_*`` checks they match and are refused too.
"""

from __future__ import annotations

import copyreg
import fractions
import functools
import importlib
import operator
import os
import pathlib
import pickle
import struct
import subprocess
import sys
import shutil
import tempfile
import textwrap

import pytest

from agentix.runtime.shared import safepickle
from agentix.runtime.shared.safepickle import RestrictedUnpickleError, restricted_loads

# Stands for the marker path in the committed corpus; replaced per test run.
PLACEHOLDER = "/tmp/AGENTIX-PICKLE-MARKER-0000000000000000"
CORPUS_DIR = pathlib.Path(__file__).resolve().parent / "malicious_pickles"


@pytest.fixture(autouse=True)
def strict_policy(monkeypatch):
    monkeypatch.setattr(safepickle, "_allowed_types", {})
    monkeypatch.delenv("AGENTIX_PICKLE_TRUST", raising=False)


def text(stream: str) -> bytes:
    """A protocol-0 stream written one opcode per line (leading spaces ignored)."""
    return textwrap.dedent(stream).lstrip("\n").encode()


def touch_command() -> str:
    return f"touch {PLACEHOLDER}"


# --- crafted classes: pickling them produces the hostile stream -------------------------


class Reduces:
    """Pickles as ``callable(*args)`` (and optional extra reduce fields)."""

    def __init__(self, *reduce_value):
        self.reduce_value = reduce_value

    def __reduce__(self):
        return self.reduce_value


def by_reduce(*reduce_value, protocol: int = 4) -> bytes:
    return pickle.dumps(Reduces(*reduce_value), protocol=protocol)


def _touch_source() -> str:
    return f"open({PLACEHOLDER!r}, 'w').close()"


def _inner_pickle() -> bytes:
    return by_reduce(os.system, (touch_command(),))


def crafted_payloads() -> dict[str, bytes]:
    cmd = touch_command()
    out = {}
    for protocol in (0, 2, 4, 5):
        out[f"os_system_p{protocol}"] = by_reduce(os.system, (cmd,), protocol=protocol)
    out.update(
        {
            "subprocess_popen": by_reduce(subprocess.Popen, (["touch", PLACEHOLDER],)),
            "subprocess_check_output": by_reduce(subprocess.check_output, (["touch", PLACEHOLDER],)),
            "subprocess_run_shell": by_reduce(subprocess.run, (cmd,), None),
            "builtins_eval": by_reduce(eval, (_touch_source(),)),
            "builtins_exec": by_reduce(exec, (_touch_source(),)),
            "builtins_compile": by_reduce(compile, (_touch_source(), "x", "exec")),
            "builtins_open": by_reduce(open, (PLACEHOLDER, "w")),
            "builtins_import": by_reduce(__import__, ("os",)),
            "importlib_import_module": by_reduce(importlib.import_module, ("os",)),
            "operator_attrgetter": by_reduce(operator.attrgetter, ("system",)),
            "operator_methodcaller": by_reduce(operator.methodcaller, ("system", cmd)),
            "functools_partial": by_reduce(functools.partial, (os.system, cmd)),
            "pickle_loads_nested": by_reduce(pickle.loads, (_inner_pickle(),)),
            "pathlib_write_text": by_reduce(pathlib.Path.write_text, (pathlib.Path(PLACEHOLDER), "x")),
            "pathlib_touch": by_reduce(pathlib.Path.touch, (pathlib.Path(PLACEHOLDER),)),
            # An allowlisted outer callable does not launder a refused inner one.
            "nested_in_allowed_containers": pickle.dumps(
                [1, {"k": (2, Reduces(os.system, (cmd,)))}], protocol=4
            ),
            "copyreg_reconstructor_popen": by_reduce(
                copyreg._reconstructor, (subprocess.Popen, object, None)
            ),
            "copyreg_newobj_popen": by_reduce(
                copyreg.__newobj__, (subprocess.Popen, ["touch", PLACEHOLDER]), protocol=1
            ),
            # Protocol 5: a state_setter (sixth reduce field) is called as setter(obj, state).
            "reduce_state_setter": by_reduce(dict, (), (cmd,), None, None, os.system, protocol=5),
            # Items appended to an allowlisted list through a refused callable's result.
            "reduce_listitems_gadget": by_reduce(list, (), None, iter([Reduces(os.system, (cmd,))])),
            "defaultdict_factory_system": by_reduce(
                __import__("collections").defaultdict, (os.system,)
            ),
        }
    )
    return out


# --- hand-written opcode streams ---------------------------------------------------------


def handwritten_payloads() -> dict[str, bytes]:
    m = PLACEHOLDER
    return {
        "posix_system": text(f"""
            cposix
            system
            (Vtouch {m}
            tR."""),
        "os_popen": text(f"""
            cos
            popen
            (Vtouch {m}
            tR."""),
        "getattr_import_os_system": text(f"""
            cbuiltins
            getattr
            (cbuiltins
            __import__
            (Vos
            tRVsystem
            tR(Vtouch {m}
            tR."""),
        "getattr_chain_via_dict_globals": text("""
            cbuiltins
            getattr
            (cbuiltins
            getattr
            (cpathlib
            Path
            V__init__
            tRV__globals__
            tR."""),
        "builtins_dotted_subclasses": text("""
            cbuiltins
            object.__subclasses__
            )R."""),
        "builtins_dotted_import": text("""
            cbuiltins
            __import__.__self__
            ."""),
        "builtins_setattr": text("""
            cbuiltins
            setattr
            (cfractions
            Fraction
            V__repr__
            I1
            tR."""),
        "builtins_vars_globals": text("""
            cbuiltins
            globals
            )R."""),
        "builtins_breakpoint": text("""
            cbuiltins
            breakpoint
            )R."""),
        "builtins_type_new_class": text("""
            cbuiltins
            type
            (VX
            )(dtR."""),
        "inst_opcode_os_system": text(f"""
            (Vtouch {m}
            ios
            system
            ."""),
        "obj_opcode_popen": text(f"""
            (csubprocess
            Popen
            (lVtouch
            aV{m}
            ao."""),
        "underscore_operator_attrgetter": text("""
            c_operator
            attrgetter
            (Vsystem
            tR."""),
        "underscore_pickle_loads": text("""
            c_pickle
            loads
            (S'N.'
            tR."""),
        "newobj_opcode_popen": b"\x80\x02csubprocess\nPopen\n)\x81.",
        "codecs_encode_bytes_p2": text("""
            c_codecs
            encode
            (Vx
            Vlatin1
            tR."""),
        "py2_builtin_eval": text("""
            c__builtin__
            eval
            (V1+1
            tR."""),
        "runpy_run_code": text("""
            crunpy
            _run_code
            (Vimport os
            (dtR."""),
        "ctypes_cdll": text("""
            cctypes
            CDLL
            (Vlibc.so.6
            tR."""),
        "shutil_rmtree": text(f"""
            cshutil
            rmtree
            (V{m}
            tR."""),
        "webbrowser_open": text("""
            cwebbrowser
            open
            (Vfile:///etc/passwd
            tR."""),
        "persistent_id": text("""
            Pos.system
            ."""),
        # BUILD on a class (not an instance): pickle's default __setstate__ would run
        # setattr(Fraction, "__repr__", int) for the whole host process.
        "build_poisons_allowed_class": text("""
            cfractions
            Fraction
            (N}V__repr__
            cbuiltins
            int
            stb."""),
        "build_poisons_pathlib": text("""
            cpathlib
            PurePath
            (N}V__str__
            cbuiltins
            int
            stb0N."""),
        "build_changes_bases": text("""
            cpathlib
            PosixPath
            (N}V__bases__
            (cpathlib
            PurePosixPath
            tstb0N."""),
        # EXT opcodes bypass find_class through copyreg's extension cache.
        "ext1_opcode": b"\x80\x02\x82\x01.",
        "ext4_opcode": b"\x80\x02\x84\x01\x00\x00\x00.",
    }


# --- numpy: hand-written so the bytes do not depend on the numpy version ----------------


def _u(value: str) -> bytes:
    """SHORT_BINUNICODE."""
    data = value.encode()
    return b"\x8c" + bytes([len(data)]) + data


def _g(module: str, name: str) -> bytes:
    """STACK_GLOBAL module.name."""
    return _u(module) + _u(name) + b"\x93"


def _i(value: int) -> bytes:
    """INT (protocol 0: any size)."""
    return b"I%d\n" % value


def _np_state(order: str = "<", names: bytes = b"N", fields: bytes = b"N", itemsize: int = -1,
              alignment: int = -1, flags: int = 0) -> bytes:
    """A dtype's BUILD state: (3, order, subarray, names, fields, itemsize, alignment, flags)."""
    return b"(" + _i(3) + _u(order) + b"N" + names + fields + _i(itemsize) + _i(alignment) + _i(flags) + b"t"


def _np_dtype(code: str, state: bytes | None = None, copy: bool = True) -> bytes:
    """numpy.dtype(code, False, copy) then BUILD(state), as numpy pickles a dtype."""
    return (_g("numpy", "dtype") + _u(code) + b"\x89" + (b"\x88" if copy else b"\x89") + b"\x87R"
            + (state if state is not None else _np_state()) + b"b")


_F8 = _np_dtype("f8")
_RECONSTRUCT = _g("numpy.core.multiarray", "_reconstruct")
_FROMBUFFER = _g("numpy.core.numeric", "_frombuffer")


def _np_reconstruct(state: bytes, cls: bytes = _g("numpy", "ndarray")) -> bytes:
    """_reconstruct(cls, (0,), b'b') then BUILD(state)."""
    return _RECONSTRUCT + b"(" + cls + _i(0) + b"\x85C\x01bt" + b"R" + state + b"b"


def _np_shared_fields_dtype(levels: int) -> bytes:
    """Nested structured dtypes whose two fields share the level below (through the
    memo): the expanded structure doubles per level while the stream grows linearly."""
    stream = b"\x80\x05" + _F8 + b"q\x00"
    size = 8
    for level in range(1, levels + 1):
        below = b"h" + bytes([level - 1])
        fields = b"}" + _u("a") + below + _i(0) + b"\x86s" + _u("b") + below + _i(size) + b"\x86s"
        state = b"(" + _i(3) + _u("|") + b"N" + _u("a") + _u("b") + b"\x86" + fields + _i(2 * size) + _i(1) + _i(16) + b"t"
        stream += _np_dtype(f"V{2 * size}", state) + b"q" + bytes([level])
        size *= 2
    return stream + b"."


def numpy_payloads() -> dict[str, bytes]:
    """numpy values a sandbox could forge: each is refused (the huge ones are below)."""
    object_field = _u("a") + b"\x85}" + _u("a") + _np_dtype("O", _np_state("|")) + _i(0) + b"\x86s"
    return {
        # An object array can carry any value: refused by its dtype, whatever it holds.
        "numpy_object_dtype_array": b"\x80\x05" + _np_reconstruct(
            b"(" + _i(1) + _i(1) + b"\x85" + _np_dtype("O", _np_state("|")) + b"\x89]" + _u("x") + b"at") + b".",
        "numpy_scalar_object_dtype": b"\x80\x05" + _g("numpy.core.multiarray", "scalar")
        + _np_dtype("O", _np_state("|")) + _u("x") + b"\x86R.",
        # A structured dtype with an object field: numpy would read pointers from array data.
        "numpy_dtype_object_field": b"\x80\x05" + _np_dtype(
            "V8", b"(" + _i(3) + _u("|") + b"N" + object_field + _i(8) + _i(1) + _i(16) + b"t") + b".",
        # A field far outside the item: numpy's constructor refuses it, so the stream may not set it.
        "numpy_dtype_field_offset_outside_item": b"\x80\x05" + _np_dtype(
            "V8", b"(" + _i(3) + _u("|") + b"N" + _u("a") + b"\x85}" + _u("a") + _F8 + _i(1000)
            + b"\x86s" + _i(8) + _i(1) + _i(16) + b"t") + b".",
        # BUILD on numpy's shared float64 dtype (copy=False) to change its item size.
        "numpy_dtype_singleton_itemsize": b"\x80\x05" + _np_dtype("f8", _np_state(itemsize=4096), copy=False) + b".",
        # A void dtype whose flags claim it holds objects (NPY_ITEM_HASOBJECT and friends).
        "numpy_dtype_forged_flags": b"\x80\x05" + _np_dtype("V8", _np_state("|", itemsize=8, alignment=1, flags=0x3F)) + b".",
        "numpy_dtype_shared_fields_exponential": _np_shared_fields_dtype(24),
        "numpy_dtype_code_not_a_code": b"\x80\x05" + _g("numpy", "dtype") + _u("[('a','O')]") + b"\x85R.",
        # ndarray(shape, dtype, buffer, offset, strides) would read anywhere in the buffer (or past it).
        "numpy_ndarray_direct_negative_strides": b"\x80\x05" + _g("numpy", "ndarray") + b"(" + _i(4) + b"\x85"
        + _u("f8") + _g("builtins", "bytes") + b"C\x20" + b"\x00" * 32 + b"\x85R" + _i(24) + _i(-64) + b"\x85tR.",
        "numpy_reconstruct_subclass": b"\x80\x05" + _np_reconstruct(
            b"(" + _i(1) + _i(1) + b"\x85" + _F8 + b"\x89C\x08" + b"\x00" * 8 + b"t", cls=_g("numpy.ma.core", "MaskedArray"))
        + b".",
        "numpy_reconstruct_of_a_builtin": b"\x80\x05" + _np_reconstruct(b"N", cls=_g("builtins", "list")) + b".",
        # A second BUILD on a built array would replace its memory under existing views.
        "numpy_build_on_a_built_array": b"\x80\x05" + _FROMBUFFER + b"(C\x08" + b"\x00" * 8 + _F8 + _i(1) + b"\x85"
        + _u("C") + b"tR(" + _i(1) + _i(2) + b"\x85" + _F8 + b"\x89C\x10" + b"\x00" * 16 + b"tb.",
        "numpy_out_of_band_buffer": b"\x80\x05" + _FROMBUFFER + b"(\x97" + _F8 + _i(1) + b"\x85" + _u("C") + b"tR.",
        "numpy_negative_shape": b"\x80\x05" + _FROMBUFFER + b"(C\x00" + _F8 + _i(-1) + b"\x85" + _u("C") + b"tR.",
        "numpy_array_data_is_not_bytes": b"\x80\x05" + _np_reconstruct(
            b"(" + _i(1) + _i(1) + b"\x85" + _F8 + b"\x89" + _u("abcdefgh") + b"t") + b".",
        "numpy_scalar_short_data": b"\x80\x05" + _g("numpy.core.multiarray", "scalar") + _F8 + b"C\x02ab\x86R.",
        # numpy functions beyond the three value constructors (numpy.load would unpickle a file).
        "numpy_load_pickle_file": b"\x80\x05" + _g("numpy", "load") + _u(PLACEHOLDER) + b"\x85R.",
        "numpy2_core_names_too": b"\x80\x05" + _g("numpy._core.multiarray", "_reconstruct")
        + b"(" + _g("numpy", "ndarray") + _i(0) + b"\x85C\x01btR(" + _i(1) + _i(1) + b"\x85"
        + _np_dtype("O", _np_state("|")) + b"\x89]" + _u("x") + b"atb.",
    }


def payloads() -> dict[str, bytes]:
    out = crafted_payloads()
    out.update(handwritten_payloads())
    out.update(numpy_payloads())
    return out


# --- huge allocations --------------------------------------------------------------------

TB = 2**40


def huge_payloads() -> dict[str, bytes]:
    """Streams that claim or construct far more memory than they carry."""
    big = struct.pack("<Q", TB)
    return {
        "binbytes8_2to40": b"\x80\x04\x8e" + big + b"abc.",
        "binbytes8_2to33": b"\x80\x04\x8e" + struct.pack("<Q", 2**33) + b"abc.",
        "binunicode8_2to40": b"\x80\x04\x8d" + big + b"abc.",
        "bytearray8_2to40": b"\x80\x05\x96" + big + b"abc.",
        "long4_2to31": b"\x80\x02\x8b\xff\xff\xff\x7f\x01.",
        "frame_2to40": b"\x80\x04\x95" + big + b"N.",
        "binstring_2to31": b"T\xff\xff\xff\x7fabc.",
        "bytes_of_size_2to33": text("""
            cbuiltins
            bytes
            (L8589934592L
            tR."""),
        "bytearray_of_size_2to33": text("""
            cbuiltins
            bytearray
            (L8589934592L
            tR."""),
        "bytearray_size_via_reconstructor": text("""
            ccopyreg
            _reconstructor
            (cbuiltins
            bytearray
            cbuiltins
            bytearray
            L8589934592L
            tR."""),
        "bytearray_size_via_newobj": b"\x80\x02cbuiltins\nbytearray\n\x8a\x05\x00\x00\x00\x00\x02\x85\x81.",
        "list_of_range_2to40": text("""
            cbuiltins
            list
            (cbuiltins
            range
            (L1099511627776L
            tRtR."""),
        "fraction_huge_exponent": text("""
            cfractions
            Fraction
            (V1e100000000
            tR."""),
        # Issue 17, item 3: work out of proportion to the bytes.
        # The unpickler sized its memo table by the index: 2 GiB from 9 bytes.
        "memo_long_binput_2to27": b"\x80\x02Nr\x00\x00\x00\x08.",
        "memo_put_2to27": b"Np134217728\n.",
        "list_of_range_3e8": text("""
            cbuiltins
            list
            (cbuiltins
            range
            (I300000000
            tRtR."""),
        # Never allocates, but iterates 10**18 times.
        "deque_of_range_maxlen_1": text("""
            ccollections
            deque
            (cbuiltins
            range
            (L1000000000000000000L
            tRI1
            tR."""),
        "int_of_decimal_1e1000000": text("""
            cbuiltins
            int
            (cdecimal
            Decimal
            (V1e1000000
            tRtR."""),
        "fraction_of_decimal_1e100000000": text("""
            cfractions
            Fraction
            (cdecimal
            Decimal
            (V1e100000000
            tRtR."""),
        "decimal_of_int_2to1000000": b"\x80\x02cdecimal\nDecimal\n\x8b"
        + struct.pack("<i", 125001) + b"\x00" * 125000 + b"\x01\x85R.",
        # One 1,000-item list copied by tuple() 100,000 times through memo references.
        "tuple_copies_via_memo": b"\x80\x02cbuiltins\ntuple\nq\x01]q\x02(" + b"K\x01" * 1000
        + b"e(" + b"h\x01h\x02\x85R" * 100000 + b"l.",
        # numpy: an array's size with no data behind it (10**10 float64 = 80 GB).
        "numpy_reconstruct_shape_without_data": b"\x80\x05" + _np_reconstruct(
            b"(" + _i(1) + _i(10**10) + b"\x85" + _F8 + b"\x89C\x08" + b"\x00" * 8 + b"t") + b".",
        "numpy_frombuffer_shape_without_data": b"\x80\x05" + _FROMBUFFER + b"(C\x08" + b"\x00" * 8 + _F8
        + _i(10**10) + b"\x85" + _u("C") + b"tR.",
        "numpy_ndarray_newobj_shape": b"\x80\x05" + _g("numpy", "ndarray") + b"(" + _i(10**10) + b"\x85" + _u("f8")
        + b"t\x81.",
        "numpy_copyreg_newobj_ndarray_shape": b"\x80\x05" + _g("copyreg", "__newobj__") + b"(" + _g("numpy", "ndarray")
        + _i(10**10) + b"\x85" + _u("f8") + b"tR.",
        "numpy_subarray_dtype_scalar": b"\x80\x05" + _g("numpy.core.multiarray", "scalar") + _np_dtype(
            "V8", b"(" + _i(3) + _u("|") + _F8 + _i(10**8) + b"\x85\x86NN" + _i(8 * 10**8) + _i(8) + _i(0) + b"t")
        + b"C\x08" + b"\x00" * 8 + b"\x86R.",
        # Views of one 64 KiB buffer, 3,000 times: each is charged its size.
        "numpy_views_of_one_buffer": b"\x80\x05\x96" + (1 << 16).to_bytes(8, "little") + b"\x00" * (1 << 16) + b"\x94"
        + _F8 + b"\x94" + _FROMBUFFER + b"\x94(" + (b"h\x02(h\x00h\x01M\x00\x20\x85" + _u("C") + b"tR") * 3000 + b"l.",
        # str() of a list of 1,000 references to a 4 KiB string, 1,000 times.
        "str_of_memo_list": b"\x80\x02cbuiltins\nstr\nq\x01X\x00\x10\x00\x00" + b"a" * 4096
        + b"q\x02(" + b"h\x02" * 1000 + b"lq\x03(" + b"h\x01h\x03\x85R" * 1000 + b"l.",
    }


# MemoryError is a definite refusal only where no machine could satisfy the request: the
# allocation of 2**40 slots fails at once, before anything is touched.
MEMORY_ERROR_IS_DEFINITE = {"list_of_range_2to40"}


def with_marker(data: bytes, marker: str) -> bytes:
    """Substitutes the marker path; keeps the length so binary length fields stay valid."""
    assert len(marker) == len(PLACEHOLDER)
    return data.replace(PLACEHOLDER.encode(), marker.encode())


def _short_marker() -> tuple[pathlib.Path, str]:
    """A fresh, not yet existing marker path exactly as long as the placeholder."""
    directory = tempfile.mkdtemp(prefix="agx-", dir="/tmp")
    name = directory + "/m"
    name += "x" * (len(PLACEHOLDER) - len(name))
    assert len(name) == len(PLACEHOLDER)
    return pathlib.Path(name), directory


@pytest.fixture
def marker():
    path, directory = _short_marker()
    yield path
    try:
        assert not path.exists(), f"a refused payload had a side effect: {path} exists"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


ALL = payloads()


@pytest.mark.parametrize("name", sorted(ALL))
def test_payload_is_refused_without_side_effects(name, marker):
    state_before = fractions.Fraction.__dict__.copy(), pathlib.PosixPath.__bases__
    with pytest.raises(RestrictedUnpickleError):
        restricted_loads(with_marker(ALL[name], str(marker)))
    assert not marker.exists()
    # Results arrive in pieces; the chunked loader refuses exactly the same.
    data = with_marker(ALL[name], str(marker))
    with pytest.raises(RestrictedUnpickleError):
        safepickle.restricted_loads_chunks([data[:5], data[5:9], data[9:]])
    assert not marker.exists()
    # No allowlisted class was left modified (BUILD-on-class payloads are undone).
    assert dict(fractions.Fraction.__dict__) == dict(state_before[0])
    assert pathlib.PosixPath.__bases__ == state_before[1]
    assert repr(fractions.Fraction(1, 3)) == "Fraction(1, 3)"
    assert str(pathlib.PurePath("/a")) == "/a"
    assert copyreg._reconstructor.__defaults__ is None


def test_build_on_an_allowed_function_only_touches_a_private_wrapper(marker):
    """Allowlisted functions are handed out as per-load wrappers: BUILD changes nothing shared."""
    stream = text("""
        ccopyreg
        _reconstructor
        (N}V__defaults__
        (I1
        tstb.""")
    wrapper = restricted_loads(stream)
    assert wrapper is not copyreg._reconstructor and wrapper.__defaults__ == (1,)
    assert copyreg._reconstructor.__defaults__ is None


def test_every_payload_is_dangerous_under_plain_pickle():
    """The corpus is real: without the allowlist, the command payloads do run."""
    for key in ("os_system_p0", "os_system_p5", "posix_system", "getattr_import_os_system",
                "subprocess_check_output", "builtins_exec", "pickle_loads_nested"):
        path, directory = _short_marker()
        try:
            pickle.loads(with_marker(ALL[key], str(path)))
            assert path.exists(), key
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def test_refused_module_is_never_imported(tmp_path, monkeypatch):
    flag = tmp_path / "imported"
    (tmp_path / "agentix_evil_module.py").write_text(f"open({str(flag)!r}, 'w').close()\nrun = print\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stream = text("""
        cagentix_evil_module
        run
        (Vx
        tR.""")
    with pytest.raises(RestrictedUnpickleError):
        restricted_loads(stream)
    assert not flag.exists()
    assert "agentix_evil_module" not in sys.modules


HUGE = huge_payloads()

_CHILD = r"""
import resource, sys, time
limit = 1 << 30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from agentix.runtime.shared.safepickle import RestrictedUnpickleError, restricted_loads, restricted_loads_chunks
data = sys.stdin.buffer.read()
start = time.monotonic()
try:
    if sys.argv[1] == "chunks":  # as a result arrives: in pieces
        restricted_loads_chunks([data[:3], data[3:11], data[11:]])
    else:
        restricted_loads(data)
    outcome = "ACCEPTED"
except RestrictedUnpickleError:
    outcome = "RestrictedUnpickleError"
except MemoryError:
    outcome = "MemoryError"
except BaseException as exc:
    outcome = type(exc).__name__
# VmHWM: this process's peak RSS (ru_maxrss would carry over the parent's peak,
# which Linux keeps across fork and exec).
with open("/proc/self/status") as status:
    rss_kb = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
print(outcome, rss_kb, round(time.monotonic() - start, 3))
"""


@pytest.mark.parametrize("loader", ["whole", "chunks"])
@pytest.mark.parametrize("name", sorted(HUGE))
def test_huge_allocation_is_refused_without_allocating(name, loader):
    package_root = pathlib.Path(safepickle.__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(package_root))
    # The child is pure Python under an address-space limit, which a preloaded
    # sanitizer runtime (--config=asan) could not map its shadow memory in.
    env.pop("LD_PRELOAD", None)
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, loader],
        input=HUGE[name],
        capture_output=True,
        env=env,
        timeout=30,  # Fraction("1e100000000") would take minutes
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    outcome, rss_kb, seconds = result.stdout.decode().split()
    allowed = {"RestrictedUnpickleError"}
    if name in MEMORY_ERROR_IS_DEFINITE:
        allowed.add("MemoryError")
    assert outcome in allowed, f"{name}: {outcome}"
    # Nothing close to the claimed size was touched (the child imports ~30 MiB of modules).
    assert int(rss_kb) < 200 * 1024, f"{name}: peak RSS {rss_kb} KiB"
    assert float(seconds) < 5, f"{name}: took {seconds}s"


# --- the committed corpus ----------------------------------------------------------------


def corpus() -> dict[str, bytes]:
    out = {f"{k}.pickle": v for k, v in payloads().items()}
    out.update({f"huge_{k}.pickle": v for k, v in HUGE.items()})
    return out


def write_corpus(directory: pathlib.Path = CORPUS_DIR) -> None:
    directory.mkdir(exist_ok=True)
    for old in directory.glob("*.pickle"):
        old.unlink()
    for name, data in corpus().items():
        (directory / name).write_bytes(data)


def _committed() -> dict[str, bytes]:
    assert CORPUS_DIR.is_dir(), f"{CORPUS_DIR} is missing (a data dependency of //host/python:unit_tests)"
    return {p.name: p.read_bytes() for p in sorted(CORPUS_DIR.glob("*.pickle"))}


def test_committed_corpus_matches_the_generators():
    committed = _committed()
    expected = corpus()
    # Crafted payloads embed this file's module path for the Reduces class only when
    # pickled by reference; they don't (they pickle the callable), so bytes are stable.
    assert sorted(committed) == sorted(expected)
    stale = [name for name in expected if committed[name] != expected[name]]
    assert not stale, f"regenerate malicious_pickles/: {stale}"


def test_committed_corpus_is_refused(marker):
    for name, data in _committed().items():
        if name.startswith("huge_"):
            continue  # loaded in a limited child process above
        with pytest.raises(RestrictedUnpickleError):
            restricted_loads(with_marker(data, str(marker)))


if __name__ == "__main__":
    write_corpus()
    print(f"wrote {len(corpus())} payloads to {CORPUS_DIR}")
