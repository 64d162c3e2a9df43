"""Host exception classes: messages, attributes, mapping from RemoteError."""

import pickle

import pytest

from agentix.runtime.client.errors import (
    CallCancelled,
    CallTimeout,
    RemoteCallError,
    RuntimeUnreachable,
    WorkerExited,
    remote_call_error,
)
from agentix.runtime.shared.models import RemoteError


def test_message_without_traceback():
    error = RemoteError(type="ValueError", message="bad input")
    exc = RemoteCallError("mod::fn", error)
    assert str(exc) == "mod::fn: ValueError: bad input"
    assert exc.display_name == "mod::fn"
    assert exc.error is error
    assert isinstance(exc, RuntimeError)


def test_message_with_traceback():
    error = RemoteError(type="KeyError", message="'k'", traceback="Traceback (most recent call last):\n  ...")
    assert str(RemoteCallError("mod::fn", error)) == (
        "mod::fn: KeyError: 'k'\n--- sandbox traceback ---\nTraceback (most recent call last):\n  ..."
    )


def test_remote_error_defaults():
    error = RemoteError(type="T", message="m")
    assert (error.traceback, error.cancelled, error.returncode) == (None, False, None)


@pytest.mark.parametrize(
    ("error", "cls"),
    [
        (RemoteError(type="Cancelled", message="remote call cancelled", cancelled=True), CallCancelled),
        (RemoteError(type="WorkerDied", message="runtime worker exited: killed by signal 9", returncode=-9), WorkerExited),
        (RemoteError(type="ValueError", message="x"), RemoteCallError),
        (RemoteError(type="ResultUnavailable", message="gone"), RemoteCallError),
    ],
)
def test_mapping_picks_the_class(error, cls):
    exc = remote_call_error("mod::fn", error)
    assert type(exc) is cls
    assert isinstance(exc, RemoteCallError)


def test_worker_exited_exposes_returncode():
    exc = remote_call_error("mod::fn", RemoteError(type="WorkerDied", message="killed by signal 9", returncode=-9))
    assert exc.returncode == -9
    assert "signal 9" in str(exc)


def test_host_side_errors_are_runtime_errors():
    assert issubclass(CallTimeout, RuntimeError)
    assert issubclass(RuntimeUnreachable, RuntimeError)
    assert not issubclass(CallTimeout, RemoteCallError)


@pytest.mark.parametrize("cls", [RemoteCallError, CallCancelled, WorkerExited])
def test_remote_call_errors_survive_pickling(cls):
    exc = cls("mod::fn", RemoteError(type="WorkerDied", message="m", traceback="tb", returncode=3))
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is cls
    assert str(copy) == str(exc)
    assert copy.error == exc.error and copy.display_name == "mod::fn"
