"""configure_logging (SPEC §4) and the agentix.log exports."""

import io
import logging
import os
import re
import socket

import pytest

import agentix
from agentix.utils import log
from agentix.utils.log import configure_logging, install_worker_bridge

_ENV = ("AGENTIX_LOG_CONTEXT", "AGENTIX_LOG_LEVEL", "AGENTIX_LOG_FORMAT", "AGENTIX_WORKER_ID")


@pytest.fixture(autouse=True)
def pristine_logging(monkeypatch):
    """No agentix env vars; the root logger and record factory restored afterwards."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogRecordFactory())
    yield
    for handler in root.handlers:
        handler.close()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logging.setLogRecordFactory(saved[2])


def bare_root() -> None:
    """Removes the root handlers (pytest adds its own only for the test's call
    phase, so this cannot be done in a fixture); basicConfig then adds one."""
    logging.getLogger().handlers[:] = []


def emit(message="hi", name="x", level=logging.WARNING) -> logging.LogRecord:
    record = logging.getLogger(name).makeRecord(name, level, __file__, 1, message, (), None)
    logging.getLogger(name).handle(record)
    return record


def test_default_context_format_level_and_stream():
    bare_root()
    stream = io.StringIO()
    configure_logging(stream=stream)
    root = logging.getLogger()
    assert root.level == logging.INFO
    (handler,) = root.handlers
    assert handler.stream is stream
    record = emit("hello %s")
    assert record.agentix_context == "host"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[host\] \[x\] hello %s\n", stream.getvalue())
    logging.getLogger("x").debug("quiet")
    assert "quiet" not in stream.getvalue()


def test_context_placeholders(monkeypatch):
    bare_root()
    monkeypatch.setenv("AGENTIX_LOG_CONTEXT", "ctx-{uname}-{hostname}-{pid}-{id}-{nope}-{")
    configure_logging(stream=io.StringIO())
    host, pid = socket.gethostname(), os.getpid()
    assert emit().agentix_context == f"ctx-{host}-{host}-{pid}-{pid}-{{nope}}-{{"

    monkeypatch.setenv("AGENTIX_WORKER_ID", "1a2b3c4d")
    configure_logging(stream=io.StringIO())
    assert emit().agentix_context == f"ctx-{host}-{host}-{pid}-1a2b3c4d-{{nope}}-{{"


def test_default_context_argument_is_a_template_and_env_wins(monkeypatch):
    bare_root()
    configure_logging(default_context="sandbox-{uname}-worker-{id}", stream=io.StringIO())
    assert emit().agentix_context == f"sandbox-{socket.gethostname()}-worker-{os.getpid()}"
    monkeypatch.setenv("AGENTIX_LOG_CONTEXT", "from-env")
    configure_logging(default_context="ignored", stream=io.StringIO())
    assert emit().agentix_context == "from-env"


@pytest.mark.parametrize(
    "value, level",
    [("DEBUG", logging.DEBUG), ("debug", logging.DEBUG), ("error", logging.ERROR), ("15", 15),
     ("bogus", logging.INFO), ("", logging.INFO)],
)
def test_level_from_env(monkeypatch, value, level):
    bare_root()
    monkeypatch.setenv("AGENTIX_LOG_LEVEL", value)
    configure_logging(stream=io.StringIO())
    assert logging.getLogger().level == level


def test_format_from_env(monkeypatch):
    bare_root()
    monkeypatch.setenv("AGENTIX_LOG_FORMAT", "%(levelname)s|%(agentix_context)s|%(name)s|%(message)s")
    stream = io.StringIO()
    configure_logging(stream=stream)
    emit("hi", name="a.b")
    assert stream.getvalue() == "WARNING|host|a.b|hi\n"


def test_existing_handlers_are_kept_unless_forced():
    bare_root()
    first, second = io.StringIO(), io.StringIO()
    configure_logging(stream=first)
    configure_logging(stream=second)
    (handler,) = logging.getLogger().handlers
    assert handler.stream is first
    configure_logging(stream=second, force=True)
    (handler,) = logging.getLogger().handlers
    assert handler.stream is second


def test_the_record_factory_is_replaced_not_stacked(monkeypatch):
    bare_root()
    before = logging.getLogRecordFactory()
    configure_logging(stream=io.StringIO())
    installed = logging.getLogRecordFactory()
    assert installed is not before
    monkeypatch.setenv("AGENTIX_LOG_CONTEXT", "second")
    configure_logging(stream=io.StringIO())
    assert logging.getLogRecordFactory() is installed
    assert emit().agentix_context == "second"


def test_exports():
    bare_root()
    assert agentix.log is log
    assert agentix.configure_logging is configure_logging
    assert {"configure_logging", "log"} <= set(agentix.__all__)
    assert sorted(log.__all__) == ["configure_logging", "install_worker_bridge"]


def test_install_worker_bridge_is_a_no_op():
    bare_root()
    root = logging.getLogger()
    level = root.level
    assert install_worker_bridge() is None
    assert install_worker_bridge(logging.DEBUG) is None
    assert root.handlers == [] and root.level == level
