"""`remote_call_error` re-raises admitted sandbox exception types (issue 18,
item 4), and what the sandbox sends about its exception never gets past the
host allowlist: the states below are built as a hostile sandbox would."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import pickle
import sys
import threading

import pytest

from agentix.runtime.client import errors
from agentix.runtime.client.errors import RemoteCallError, remote_call_error, remote_call_error_async
from agentix.runtime.shared import safepickle
from agentix.runtime.shared.models import RemoteError


def _error(cls, args, members=None, attributes=None, *, module=None, qualname=None, state=None):
    """The RemoteError the worker sends for an exception of `cls` (or for the
    `module`/`qualname` and raw `state` given)."""
    if state is None:
        state = pickle.dumps((tuple(args), members or {}, attributes or {}), protocol=4)
    return RemoteError(
        type=(qualname or cls.__qualname__).rsplit(".", 1)[-1],
        message="m",
        traceback="Traceback (most recent call last):\n  sandbox\n",
        type_module=module or cls.__module__,
        type_qualname=qualname or cls.__qualname__,
        state=state,
    )


class InitRecorder(Exception):
    """Its __init__ takes other arguments and must not run on the host."""

    inits = 0

    def __init__(self, code, detail):
        type(self).inits += 1
        super().__init__(f"{code}: {detail}")
        self.code = code


class NotRegistered(Exception):
    pass


class RefusesSubclasses(Exception):
    def __init_subclass__(cls, **kwargs):
        raise TypeError("final")


@dataclasses.dataclass
class Detail:
    value: int


@pytest.fixture(autouse=True)
def _registered():
    for cls in (InitRecorder, RefusesSubclasses, Detail):
        safepickle.allow_type(cls)
    yield
    for cls in (InitRecorder, RefusesSubclasses, Detail):
        safepickle._allowed_types.pop((cls.__module__, cls.__qualname__), None)


@pytest.mark.parametrize(
    ("cls", "args", "members"),
    [
        (ValueError, ("bad",), {}),
        (KeyError, ("k",), {}),
        (LookupError, (), {}),
        (FileNotFoundError, (errno.ENOENT, "No such file or directory"), {"filename": "/x", "filename2": "/y"}),
        (ModuleNotFoundError, ("no module named z",), {"name": "z", "path": "/p"}),
        (UnicodeDecodeError, ("utf-8", b"\xff", 0, 1, "invalid start byte"), {}),
        (StopIteration, (5,), {}),
        (NotImplementedError, ("later",), {}),
        (SyntaxError, ("bad", ("f.py", 1, 2, "x y", 1, 3)), {}),
        (ExceptionGroup, ("group", [ValueError(1), KeyError(2)]), {}),
    ],
)
def test_builtin_exceptions_are_re_raised_as_their_type(cls, args, members):
    exc = remote_call_error("mod::fn", _error(cls, args, members))
    assert isinstance(exc, cls) and isinstance(exc, RemoteCallError)
    assert type(exc).__name__ == f"RemoteCallError({cls.__qualname__})"
    assert repr(exc.args) == repr(cls(*args).args)
    for key, value in members.items():
        assert getattr(exc, key) == value
    assert exc.display_name == "mod::fn" and exc.error.type == cls.__name__
    assert exc.remote_traceback == "Traceback (most recent call last):\n  sandbox\n"
    assert str(exc) == f"mod::fn: {cls.__name__}: m\n--- sandbox traceback ---\nTraceback (most recent call last):\n  sandbox\n"
    with pytest.raises(cls):
        raise exc


def test_os_error_errno_and_strerror():
    exc = remote_call_error("f", _error(PermissionError, (errno.EACCES, "denied"), {"filename": "/etc/shadow"}))
    assert (exc.errno, exc.strerror, exc.filename) == (errno.EACCES, "denied", "/etc/shadow")


def test_user_class_attributes_without_running_its_init():
    before = InitRecorder.inits
    exc = remote_call_error("f", _error(InitRecorder, ("7: disk",), attributes={"code": 7, "detail": Detail(3)}))
    assert isinstance(exc, InitRecorder)
    assert exc.args == ("7: disk",) and exc.code == 7 and exc.detail == Detail(3)
    assert InitRecorder.inits == before
    assert str(exc).startswith(f"f: {__name__}.InitRecorder: m\n")
    # One twin per class; pickling rebuilds through the allowlist.
    again = remote_call_error("f", _error(InitRecorder, ("x",)))
    assert type(again) is type(exc)
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc) and copy.code == 7 and str(copy) == str(exc)


def test_remote_call_error_fields_win_over_sandbox_attributes():
    exc = remote_call_error("f", _error(ValueError, ("v",), attributes={"error": "mine", "display_name": "x", "note": 1}))
    assert isinstance(exc.error, RemoteError) and exc.display_name == "f" and exc.note == 1


@pytest.mark.parametrize(
    "error",
    [
        _error(NotRegistered, ("x",)),  # importable, not admitted
        _error(KeyboardInterrupt, ()),  # BaseException: not re-raised as such
        _error(SystemExit, (3,)),
        _error(GeneratorExit, ()),
        _error(None, ("x",), module="builtins", qualname="eval"),  # not a class
        _error(None, ("x",), module="builtins", qualname="object"),  # not an exception
        _error(None, ("x",), module="builtins", qualname="ValueError.__class__"),
        _error(None, ("x",), module="os", qualname="system"),
        _error(None, ("x",), module="sandbox_only", qualname="Error"),
        _error(RefusesSubclasses, ("x",)),  # cannot be combined with RemoteCallError
        _error(RemoteCallError, ("x",), module=RemoteCallError.__module__, qualname="RemoteCallError"),
    ],
)
def test_not_admitted_gives_the_plain_error_with_the_qualified_name(error):
    exc = remote_call_error("f", error)
    assert type(exc) is RemoteCallError
    if error.type_module != "builtins":
        assert f"f: {error.type_module}.{error.type_qualname}: m" in str(exc)


def _reduce_stream(module, name, arg):
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X" + len(arg).to_bytes(4, "little") + arg.encode() + b"\x85R."


@pytest.mark.parametrize(
    "state",
    [
        _reduce_stream("os", "system", "touch {marker}"),
        _reduce_stream("builtins", "exec", "open({marker!r}, 'w')"),
        _reduce_stream("subprocess", "getoutput", "touch {marker}"),
        b"\x80\x04garbage",
        b"",
        pickle.dumps(("a", "b")),
        pickle.dumps([("a",), {}, {}]),
        pickle.dumps((["a"], {}, {})),
        pickle.dumps((("a",), {"__traceback__": None}, {})),
        pickle.dumps((("a",), {"filename": "/x"}, {})),  # an OSError member on a ValueError
        pickle.dumps((("a",), {}, {1: "non-str key"})),
        pickle.dumps((("a",), {}, {"x": NotRegistered()}), protocol=4),
        b"\x80\x04" + b"(" * 100_000,  # past the state bound
    ],
)
def test_forged_states_never_pass_the_allowlist(state, tmp_path):
    marker = tmp_path / "ran"
    state = state.replace(b"{marker}", str(marker).encode()).replace(b"{marker!r}", repr(str(marker)).encode())
    exc = remote_call_error("f", _error(ValueError, (), state=state))
    assert type(exc) is RemoteCallError
    assert exc.error.type == "ValueError"
    assert not marker.exists()


def test_over_long_type_names_are_not_looked_up():
    exc = remote_call_error("f", _error(None, ("x",), module="builtins" + "." * 600, qualname="ValueError"))
    assert type(exc) is RemoteCallError
    assert len(str(exc)) < 700


def test_a_named_module_is_never_imported(tmp_path, monkeypatch):
    (tmp_path / "exc_unit_sideeffect.py").write_text("class Boom(Exception):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    exc = remote_call_error("f", _error(None, ("x",), module="exc_unit_sideeffect", qualname="Boom"))
    assert type(exc) is RemoteCallError
    assert "exc_unit_sideeffect" not in sys.modules
    # Trusting the sandbox admits any importable class.
    monkeypatch.setenv("AGENTIX_PICKLE_TRUST", "1")
    exc = remote_call_error("f", _error(None, ("x",), module="exc_unit_sideeffect", qualname="Boom"))
    assert type(exc).__name__ == "RemoteCallError(Boom)" and exc.args == ("x",)
    sys.modules.pop("exc_unit_sideeffect", None)


def test_the_twin_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(errors, "_TWINS_LIMIT", 2)
    monkeypatch.setattr(errors, "_twins", {})
    for cls in (ValueError, KeyError, IndexError, TypeError):
        exc = remote_call_error("f", _error(cls, ("x",)))
        assert isinstance(exc, cls)
    assert len(errors._twins) == 2


def test_async_mapping_decodes_off_the_loop_when_the_decoder_is_busy():
    error = _error(ValueError, ("v",), attributes={"detail": Detail(1)})
    with pytest.raises(safepickle.DecodeBusy):
        with safepickle._class_lock:
            remote_call_error("f", error, wait=False)

    async def main():
        safepickle._class_lock.acquire()
        threading.Timer(0.2, safepickle._class_lock.release).start()
        return await remote_call_error_async("f", error)

    exc = asyncio.run(main())
    assert isinstance(exc, ValueError) and exc.detail == Detail(1)
