"""One call's pieces: resolving the target, decoding arguments, encoding results."""

import collections.abc
import functools
import importlib
import pickle
import sys
import types

import _agentix_worker as _w

from .common import (
    _INVALID_ARGUMENT,
    _MSGPACK,
    _NOT_STREAMS,
    _PICKLE,
    _format,
    _text,
)
from .streams import _Stream

# inspect.CO_COROUTINE and inspect.CO_ITERABLE_COROUTINE (code flags; the
# worker cold-start test checks them against inspect's).
_CO_COROUTINE = 0x80
_CO_ITERABLE_COROUTINE = 0x100


def _isawaitable(value):
    """inspect.isawaitable(value), without importing inspect (and its ast,
    dis, tokenize) on a sync call's path: the worker's cold start."""
    return (isinstance(value, types.CoroutineType)
            or isinstance(value, types.GeneratorType)
            and bool(value.gi_code.co_flags & _CO_ITERABLE_COROUTINE)
            or isinstance(value, collections.abc.Awaitable))


def _iscoroutinefunction(fn):
    """asyncio.iscoroutinefunction(fn), without importing asyncio or inspect
    (the worker's cold start). As inspect: bound methods and partials are
    unwrapped, then a function's code flag decides; builtins and other
    callables without a `__code__` are not coroutine functions; anything
    else that has one (Cython functions, AsyncMock) is left to inspect.
    asyncio's own marker (`_is_coroutine`) can only be on `fn` once
    asyncio.coroutines is imported."""
    if type(fn) is types.FunctionType:  # the common case, first
        if fn.__code__.co_flags & _CO_COROUTINE:
            return True
    else:
        f = fn
        while isinstance(f, types.MethodType):
            f = f.__func__
        while isinstance(f, functools.partial):
            f = f.func
        if isinstance(f, types.FunctionType):
            if f.__code__.co_flags & _CO_COROUTINE:
                return True
        elif isinstance(getattr(f, "__code__", None), types.CodeType):
            import inspect
            if inspect.iscoroutinefunction(fn):
                return True
    coroutines = sys.modules.get("asyncio.coroutines")
    return (coroutines is not None and getattr(fn, "_is_coroutine", None)
            is getattr(coroutines, "_is_coroutine", coroutines))


# reference -> (module, top-level name, target, is a coroutine function), for
# references whose qualname is one name: resolving those again costs a
# sys.modules and an attribute lookup (checking nothing was rebound) instead
# of import_module, and iscoroutinefunction is not asked again (~4 us).
_targets = {}
_MAX_TARGETS = 4096


def resolve_target(reference):
    """(target, is_coroutine_function) for the callable a "module::qualname"
    reference names, imported.

    Raises ValueError (no "::"), ImportError/ModuleNotFoundError (or whatever
    the module raises while importing), AttributeError (a missing name on
    the qualname path) or TypeError (the target is not callable). As in the
    original, any importable callable is accepted; what may be called is
    decided on the host.
    """
    hit = _targets.get(reference)
    if hit is not None:
        module, name, target, coroutine = hit
        # Still what the module is and holds (a reload or a rebinding since
        # makes this a miss). Modules are not imported again once imported.
        if (sys.modules.get(module.__name__) is module
                and getattr(module, name, None) is target):
            return target, coroutine
    module_name, sep, qualname = reference.partition("::")
    if not sep:
        raise ValueError(
            f"invalid remote callable reference {reference!r}: "
            "expected 'module::qualname'")
    module = importlib.import_module(module_name)
    target = module
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"remote target {reference!r} is not callable "
                        f"(got {type(target).__name__})")
    coroutine = _iscoroutinefunction(target)
    if "." not in qualname and module.__name__ == module_name:
        if len(_targets) >= _MAX_TARGETS:
            _targets.clear()
        _targets[reference] = (module, qualname, target, coroutine)
    return target, coroutine


def _is_sync_stream(value):
    """Whether a streaming call may iterate value with iter()."""
    return (hasattr(type(value), "__iter__")
            and not isinstance(value, _NOT_STREAMS))


# Exact types of return values that are neither awaitable nor iterators:
# _Worker._run_pooled skips those checks (~1.5 us) for them.
_PLAIN_VALUES = frozenset((type(None), bool, int, float, str, bytes, tuple,
                           list, dict))
# Values pickled by pickle.dumps in one piece: small by nature, or (_STRINGS)
# when shorter than _ONE_PIECE_BYTES; anything else may hold a large buffer.
_SCALARS = frozenset((type(None), bool, int, float))
_STRINGS = frozenset((str, bytes))
_ONE_PIECE_BYTES = 64 * 1024
# pickle.dumps(None, protocol=5): a None result's payload, without the
# pickler (most noops and side-effect calls return None).
_PICKLED_NONE = pickle.dumps(None, protocol=5)
# The host's pickle of a call without arguments (agentix wire.py
# _NO_ARGUMENTS): decoded without unpickling.
_NO_ARGUMENTS = pickle.dumps(((), {}), protocol=5)


class _Failure(Exception):
    """A call failure with a fixed wire type (argument decoding)."""

    def __init__(self, type_name, message, tb=""):
        super().__init__(message)
        self.error = (type_name, message, tb, _INVALID_ARGUMENT)


def _decode_arguments(encoding, data):
    """Returns (args, kwargs) from the call's argument bytes, or from
    [stream, value, ...]: pickled arguments whose large values the channel
    took out of the stream as it received them (NEXT_BUFFER in their place,
    worker/channel/pickle_splitter.h)."""
    if data == _NO_ARGUMENTS and encoding != _MSGPACK:
        return (), {}
    try:
        if encoding == _MSGPACK:
            payload = _w.msgpack_loads(data)
        elif type(data) is list:
            payload = pickle.loads(data[0], buffers=data[1:])
        else:
            payload = pickle.loads(data)
    except BaseException as exc:
        raise _Failure(
            "ArgumentsDecodeError",
            f"failed to decode arguments: {type(exc).__name__}: {_text(exc)}",
            _format(exc)) from None
    try:
        args, kwargs = payload
        args = tuple(args)
        if not isinstance(kwargs, dict):
            raise TypeError
    except BaseException:
        raise _Failure(
            "ArgumentsDecodeError",
            "arguments must be an (args, kwargs) pair, got "
            f"{type(payload).__name__}") from None
    return args, kwargs


class _Pieces(list):
    """A file for pickle.dump that keeps what it is handed: the pickler's
    frames, and large bytes values themselves (pickle writes those straight
    to the file), so a big result is never copied into one pickle.
    Anything mutable (a large bytearray) is copied, as pickle.dumps would:
    send_result reads the pieces with the GIL released.
    Channel.send_result takes the list as the concatenation."""

    __slots__ = ()

    def write(self, data):
        self.append(data if type(data) is bytes else bytes(data))


def _encode_result(encoding, value, item=None):
    """(True, payload) or (False, error) for a call's return value (payload:
    bytes, or for pickle a _Pieces list), or for stream item number `item`
    (payload: bytes)."""
    try:
        if encoding == _MSGPACK:
            return True, _w.msgpack_dumps(value)
        kind = type(value)
        if item is not None or kind in _SCALARS or (
                kind in _STRINGS and len(value) < _ONE_PIECE_BYTES):
            # No large buffer to keep out of the pickle: pickle.dumps costs
            # ~2 us less than a pickler writing to _Pieces (the same bytes).
            return True, pickle.dumps(value, protocol=5)
        pieces = _Pieces()
        pickle.dump(value, pieces, protocol=5)
        return True, pieces
    except BaseException as exc:
        what = "return value" if item is None else f"stream item {item}"
        how = "encode {} as msgpack" if encoding == _MSGPACK else "pickle {}"
        return False, ("ResultEncodeError",
                       f"failed to {how.format(what)}: {_text(exc)}",
                       _format(exc), _INVALID_ARGUMENT)


class _Call:
    __slots__ = ("call_id", "reference", "encoding", "total_size", "context",
                 "receiving", "received", "task", "cancelled", "stream")

    def __init__(self, call_id, reference, encoding, total_size, context,
                 stream_window):
        self.call_id = call_id
        self.reference = reference
        # The reply uses the encoding the arguments came in (0 -> pickle).
        self.encoding = encoding or _PICKLE
        self.total_size = total_size
        self.context = context
        # The channel assembles chunked arguments; an ARGS tuple ends this.
        self.receiving = False
        self.received = 0  # argument bytes received
        self.task = None  # asyncio.Task or _PoolJob once running
        self.cancelled = False
        self.stream = _Stream(stream_window) if stream_window else None
