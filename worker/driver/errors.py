"""A call's error frame: the exception's text, traceback and bounded pickled state."""

import pickle

from .common import _format, _text

# Bound on an exception's pickled state (ipc::kMaxExceptionStateBytes).
_MAX_EXCEPTION_STATE = 64 * 1024

# Attributes builtin exceptions hold outside args and __dict__, by the builtin
# class whose descriptors hold them (errno and strerror come from args).
_EXCEPTION_MEMBERS = ((OSError, ("filename", "filename2")),
                      (ImportError, ("name", "path")))


class _StateTooLarge(Exception):
    pass


class _CappedFile:
    """A file for pickle.dump that refuses more than _MAX_EXCEPTION_STATE
    bytes, so a huge exception attribute is never pickled whole."""

    __slots__ = ("parts", "size")

    def __init__(self):
        self.parts = []
        self.size = 0

    def write(self, data):
        self.size += len(data)
        if self.size > _MAX_EXCEPTION_STATE:
            raise _StateTooLarge
        self.parts.append(bytes(data))


def _exception_state(exc):
    """exc's (args, members, attributes) pickled with protocol 4, for the host
    to rebuild the exception's type: members are the builtin attributes of
    _EXCEPTION_MEMBERS, attributes its __dict__ (dropped if it cannot be
    pickled). None when args cannot be pickled or the state exceeds
    _MAX_EXCEPTION_STATE."""
    try:
        members = {}
        for base, names in _EXCEPTION_MEMBERS:
            if isinstance(exc, base):
                for name in names:
                    value = base.__dict__[name].__get__(exc, base)
                    if value is not None:
                        members[name] = value
        args = tuple(exc.args)
        attributes = getattr(exc, "__dict__", None)
        attributes = dict(attributes) if isinstance(attributes, dict) else {}
    except BaseException:
        return None
    for state in ((args, members, attributes), (args, members, {})):
        try:
            out = _CappedFile()
            pickle.Pickler(out, protocol=4).dump(state)
            return b"".join(out.parts)
        except BaseException:
            if not state[2]:
                return None
    return None


def _error(exc, code, skip=0):
    """An error frame's (type, message, traceback, code, type_module,
    type_qualname, state) for exc (see _exception_state)."""
    cls = type(exc)
    try:
        module = cls.__module__
    except BaseException:
        module = ""
    return (cls.__name__, _text(exc), _format(exc, skip), code,
            module if type(module) is str else "", cls.__qualname__,
            _exception_state(exc))


def _send_error(channel, call_id, payload):
    """Sends a non-cancelled error frame for an _error() tuple or a bare
    (type, message, traceback, code) one."""
    type_name, message, tb, code, *origin = payload
    channel.send_error(call_id, code, type_name, message, tb, False, *origin)
