"""The msgpack codec of plugin-namespace payloads (SPEC §8.1).

`pack` keeps ``str`` and ``bytes`` apart (bin type), turns tuples into
arrays, and encodes two extension types: 1 = a numpy ``ndarray`` (header
``"<dtype.str>|<shape>"``, a NUL, the raw bytes), 2 = a pydantic model (its
``model_dump(mode="python")``, decoded as a plain dict). `unpack` reverses
it; unknown extension codes decode to an inert ``msgpack.ExtType``.

Host code (for example an `AsyncClientNamespace.trigger_event` override)
calls `unpack` on the payload bytes of a data event. The msgpack package
is used when installed; inside a sandbox worker without it, the worker's
built-in converter (basic types only, no extension types) stands in.
"""

from __future__ import annotations

import math
import threading
from typing import Any

__all__ = ["ExtDecodeError", "pack", "unpack"]

_EXT_NDARRAY = 1
_EXT_PYDANTIC = 2
# Nesting allowed inside one pydantic extension payload.
_MAX_PYDANTIC_DEPTH = 16


class ExtDecodeError(ValueError):
    """A msgpack extension value could not be decoded."""


try:
    import msgpack as _msgpack
except ImportError:  # a sandbox venv without msgpack: use the worker's converter
    _msgpack = None


def _encode_ext(obj: Any) -> Any:
    numpy = _numpy()
    if numpy is not None and isinstance(obj, numpy.ndarray):
        if obj.dtype.hasobject or obj.dtype.fields is not None:
            raise TypeError(f"agentix.codec: cannot encode an ndarray of dtype {obj.dtype}")
        header = f"{obj.dtype.str}|{','.join(str(n) for n in obj.shape)}".encode("ascii")
        return _msgpack.ExtType(_EXT_NDARRAY, header + b"\x00" + obj.tobytes())
    dump = getattr(obj, "model_dump", None)
    if callable(dump) and hasattr(type(obj), "model_fields"):
        return _msgpack.ExtType(_EXT_PYDANTIC, pack(dump(mode="python")))
    raise TypeError(f"agentix.codec: cannot encode {type(obj).__name__}")


def _numpy() -> Any:
    import sys

    # Only an already-imported numpy can have produced an ndarray.
    return sys.modules.get("numpy")


def _decode_ndarray(data: bytes) -> Any:
    try:
        import numpy
    except ImportError:
        raise ExtDecodeError("ndarray ext: numpy is not installed") from None
    nul = data.find(b"\x00")
    if nul < 0:
        raise ExtDecodeError("ndarray ext: missing header terminator")
    try:
        header = data[:nul].decode("ascii")
    except UnicodeDecodeError:
        raise ExtDecodeError("ndarray ext: header is not ASCII") from None
    raw = data[nul + 1 :]
    dtype_text, sep, shape_text = header.rpartition("|")
    if not sep:
        raise ExtDecodeError(f"ndarray ext: malformed header {header!r}")
    try:
        dtype = numpy.dtype(dtype_text)
    except Exception as exc:
        raise ExtDecodeError(f"ndarray ext: bad dtype {dtype_text!r}: {exc}") from None
    if dtype.hasobject or dtype.itemsize == 0 or dtype.subdtype is not None or dtype.kind == "V":
        raise ExtDecodeError(f"ndarray ext: refused dtype {dtype_text!r}")
    try:
        shape = tuple(int(n) for n in shape_text.split(",")) if shape_text else ()
    except ValueError:
        raise ExtDecodeError(f"ndarray ext: bad shape {shape_text!r}") from None
    if any(n < 0 for n in shape) or math.prod(shape) * dtype.itemsize != len(raw):
        raise ExtDecodeError(f"ndarray ext: shape {shape} does not match {len(raw)} bytes")
    try:
        return numpy.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    except Exception as exc:
        raise ExtDecodeError(f"ndarray ext: {exc}") from None


_pydantic_depth = 0


def _decode_ext(code: int, data: bytes) -> Any:
    global _pydantic_depth
    if code == _EXT_NDARRAY:
        return _decode_ndarray(data)
    if code == _EXT_PYDANTIC:
        if _pydantic_depth >= _MAX_PYDANTIC_DEPTH:
            raise ExtDecodeError("pydantic ext: nested too deeply")
        _pydantic_depth += 1
        try:
            value = unpack(data)
        except ExtDecodeError:
            raise
        except Exception:
            raise ExtDecodeError(f"pydantic ext: malformed payload: {data[:64]!r}") from None
        finally:
            _pydantic_depth -= 1
        if not isinstance(value, dict):
            raise ExtDecodeError(f"pydantic ext: malformed payload: {data[:64]!r}")
        return value
    return _msgpack.ExtType(code, data)


# Each thread's idle Packer (see `pack`).
_packers = threading.local()


def pack(obj: Any) -> bytes:
    """Encodes `obj` as msgpack (see the module docstring).

    Raises TypeError for values msgpack cannot represent."""
    if _msgpack is None:
        return _worker_module().msgpack_dumps(obj)
    # A Packer per thread, reused: making one costs about as much as packing
    # a small value (a namespace request's envelope). It is taken out while
    # in use, so a nested pack (a pydantic extension value) makes its own.
    packer = getattr(_packers, "idle", None)
    if packer is None:
        packer = _msgpack.Packer(default=_encode_ext, use_bin_type=True)
    else:
        _packers.idle = None
    try:
        return packer.pack(obj)  # resets the Packer's buffer when it raises, too
    finally:
        _packers.idle = packer


def unpack(buf: bytes | bytearray | memoryview) -> Any:
    """Decodes one msgpack value produced by `pack` (or any msgpack encoder).

    Raises ExtDecodeError for a malformed extension value and ValueError (or
    a msgpack exception, itself a ValueError) for malformed data."""
    if _msgpack is None:
        return _worker_module().msgpack_loads(buf)
    return _msgpack.unpackb(buf, ext_hook=_decode_ext, raw=False)


def _worker_module() -> Any:
    try:
        import _agentix_worker
    except ImportError:
        raise RuntimeError(
            "agentix.runtime.shared.codec needs the msgpack package "
            "(Debian: python3-msgpack) outside a sandbox worker"
        ) from None
    return _agentix_worker
