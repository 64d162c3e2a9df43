"""Exception types through `remote()` (issue 18, item 4): a sandbox exception
whose class the host admits (builtin exceptions, `allow_type` classes) is
raised as an instance of both `RemoteCallError` and that class, with its args,
attributes and the sandbox traceback; anything else is the plain
`RemoteCallError` naming the class by its qualified name. The sandbox is
untrusted: what it sends about its exception goes through the host allowlist
and never imports a module or runs a constructor it names."""

import errno
import pickle
import sys

import pytest

import exc_targets as x
from agentix import Failed, RemoteCallError, WorkerExited
from agentix.runtime.shared import safepickle

pytestmark = pytest.mark.asyncio


async def test_except_value_error_catches_a_sandbox_value_error(client):
    with pytest.raises(ValueError) as info:
        await client.remote(x.raise_value_error, "nope")
    err = info.value
    assert isinstance(err, RemoteCallError)
    assert err.args == ("nope",)
    assert err.error.type == "ValueError"
    assert err.error.message == "nope"
    assert "raise_value_error" in err.remote_traceback
    assert str(err).startswith("exc_targets::raise_value_error: ValueError: nope\n--- sandbox traceback ---\n")
    # Existing handlers keep matching, in either order.
    try:
        await client.remote(x.raise_value_error, "again")
    except RemoteCallError as again:
        assert isinstance(again, ValueError) and type(again) is type(err)


async def test_key_error_keeps_its_key(client):
    with pytest.raises(KeyError) as info:
        await client.remote(x.raise_key_error, ("a", 1))
    assert info.value.args == (("a", 1),)
    assert isinstance(info.value, LookupError) and isinstance(info.value, RemoteCallError)


async def test_os_error_keeps_errno_strerror_and_filename(client, tmp_path):
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError) as info:
        await client.remote(x.open_missing, missing)
    err = info.value
    assert isinstance(err, OSError) and isinstance(err, RemoteCallError)
    assert err.errno == errno.ENOENT
    assert err.strerror == "No such file or directory"
    assert err.filename == missing


async def test_allow_listed_user_exception_with_other_init_arguments(client):
    safepickle.allow_type(x.AppError)
    with pytest.raises(x.AppError) as info:
        await client.remote(x.raise_app_error, 7, "disk full")
    err = info.value
    assert (err.code, err.detail) == (7, "disk full")
    assert err.args == ("app error 7: disk full",)
    assert isinstance(err, RemoteCallError)
    assert "exc_targets.AppError: app error 7: disk full" in str(err)
    # The twin class is reused and the error survives pickling.
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and again.code == 7


async def test_allow_listed_os_error_subclass(client):
    safepickle.allow_type(x.AppOSError)
    with pytest.raises(x.AppOSError) as info:
        await client.remote(x.raise_app_os_error, errno.EACCES, "denied", "/etc/shadow")
    err = info.value
    assert (err.errno, err.strerror, err.filename) == (errno.EACCES, "denied", "/etc/shadow")
    assert err.hint == "check permissions"


async def test_a_class_not_allow_listed_is_a_remote_call_error_with_its_qualified_name(client):
    with pytest.raises(RemoteCallError) as info:
        await client.remote(x.raise_not_allowed, "no")
    err = info.value
    assert type(err) is RemoteCallError
    assert err.error.type == "NotAllowedError"
    assert str(err).startswith("exc_targets::raise_not_allowed: exc_targets.NotAllowedError: no")


async def test_a_class_not_importable_on_the_host(client):
    with pytest.raises(RemoteCallError) as info:
        await client.remote(x.raise_sandbox_only, "only here")
    assert type(info.value) is RemoteCallError
    assert str(info.value).startswith(
        "exc_targets::raise_sandbox_only: sandbox_only_errors.SandboxOnlyError: only here\n")


async def test_a_named_module_is_never_imported_on_the_host(client):
    # exc_sideeffect is importable on the host but not yet imported there.
    assert "exc_sideeffect" not in sys.modules
    with pytest.raises(RemoteCallError) as info:
        await client.remote(x.raise_claiming, "exc_sideeffect", "Boom", "claimed")
    assert type(info.value) is RemoteCallError
    assert (info.value.error.type_module, info.value.error.type_qualname) == ("exc_sideeffect", "Boom")
    assert "exc_sideeffect" not in sys.modules
    # A builtin name that is not an exception class, and a BaseException.
    for module, qualname in (("builtins", "eval"), ("builtins", "object"), ("os", "system"), ("builtins", "SystemExit")):
        with pytest.raises(RemoteCallError) as info:
            await client.remote(x.raise_claiming, module, qualname, "claimed")
        assert type(info.value) is RemoteCallError
        assert info.value.error.type_qualname == qualname and info.value.error.state


@pytest.mark.parametrize("target,name", [
    (x.raise_keyboard_interrupt, "KeyboardInterrupt"),
    (x.raise_system_exit, "SystemExit"),
])
async def test_base_exceptions_are_not_re_raised_as_such(client, target, name):
    args = (3,) if name == "SystemExit" else ()
    with pytest.raises(RemoteCallError) as info:
        await client.remote(target, *args)
    err = info.value
    assert type(err) is RemoteCallError
    assert not isinstance(err, (KeyboardInterrupt, SystemExit))
    assert err.error.type == name
    assert (err.error.type_module, err.error.type_qualname) == ("builtins", name)


async def test_refused_attribute_or_argument_gives_the_plain_error_and_runs_nothing(client, tmp_path):
    for target in (x.raise_with_marker_attribute, x.raise_with_marker_arg):
        marker = tmp_path / f"{target.__name__}.ran"
        with pytest.raises(RemoteCallError) as info:
            await client.remote(target, str(marker))
        assert type(info.value) is RemoteCallError
        assert info.value.error.type == "ValueError"
        assert b"system" in info.value.error.state  # sent, and refused by the host
        assert not marker.exists()
    assert await client.remote(x.add, 1, 2) == 3  # still serving


def _reduce_stream(module, name, arg):
    """A protocol-2 pickle stream calling module.name(arg)."""
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X" + len(arg).to_bytes(4, "little") + arg.encode() + b"\x85R."


async def test_a_forged_state_never_passes_the_allowlist(client, tmp_path):
    marker = tmp_path / "forged.ran"
    forged = [
        _reduce_stream("os", "system", f"touch {marker}"),
        _reduce_stream("builtins", "eval", f"open({str(marker)!r}, 'w')"),
        _reduce_stream("subprocess", "getoutput", f"touch {marker}"),
        b"\x80\x04not a pickle",
        pickle.dumps(("not", "three")),
        pickle.dumps((("a",), {"__traceback__": None}, {})),  # not an admitted member
        pickle.dumps((("a",), {}, {1: "non-str key"})),
        pickle.dumps(["a list"]),
    ]
    for state in forged:
        with pytest.raises(RemoteCallError) as info:
            await client.remote(x.raise_with_forged_state, state)
        assert type(info.value) is RemoteCallError, state
        assert not marker.exists()
    # A well-formed forged state for an admitted class does type the error,
    # with only the values the allowlist admits.
    with pytest.raises(KeyError) as info:
        await client.remote(x.raise_with_forged_state, pickle.dumps((("k",), {}, {"note": 1})), "builtins", "KeyError")
    assert info.value.args == ("k",) and info.value.note == 1
    # Arguments a builtin constructor refuses give the plain error too.
    with pytest.raises(RemoteCallError) as info:
        await client.remote(x.raise_with_forged_state, pickle.dumps((("x",), {}, {})), "builtins", "UnicodeDecodeError")
    assert type(info.value) is RemoteCallError
    assert await client.remote(x.add, 2, 2) == 4  # still serving


async def test_bounded_state(client):
    # An attribute past the bound is dropped; the type and args still arrive.
    with pytest.raises(ValueError) as info:
        await client.remote(x.raise_with_big_attribute, 100_000)
    assert info.value.args == ("big",) and not hasattr(info.value, "blob")
    # Args past the bound: the plain error, message intact.
    with pytest.raises(RemoteCallError) as info:
        await client.remote(x.raise_huge_message, 100_000)
    assert type(info.value) is RemoteCallError
    assert info.value.error.message == "y" * 100_000


async def test_stream_errors_and_try_remote_are_typed(client):
    items = []
    with pytest.raises(KeyError) as info:
        async for item in client.remote_stream(x.stream_then_raise, 3):
            items.append(item)
    assert items == [0, 1, 2]
    assert info.value.args == ("after items",) and isinstance(info.value, RemoteCallError)

    failed = await client.try_remote(x.raise_value_error, "tried")
    assert isinstance(failed, Failed)
    assert isinstance(failed.error, ValueError) and isinstance(failed.error, RemoteCallError)
    assert not isinstance(failed.error, WorkerExited)
