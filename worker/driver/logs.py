"""logging records and sys.stdout/sys.stderr lines as log frames; the stdio setup."""

import io
import logging
import os
import sys
import threading

import _agentix_worker as _w

from .common import (
    _CAPTURE_STOP_MS,
    _ERROR,
    _MAX_EXTRAS_DEPTH,
    _MAX_LINE_CHARS,
    _MSGPACK_INT,
    _ORIGIN_LOGGING,
    _ORIGIN_STDERR,
    _ORIGIN_STDOUT,
    _STANDARD_KEYS,
    _UNFORWARDED,
    _WARNING,
    _call_id,
    _log,
    _text,
)
from .durable import _expand_context, _open_durable, _pump_durable
from .env import _env_log_level

def _coerce(value, depth=0):
    """value as something msgpack can carry (SPEC 4): scalars and bytes
    kept, lists and tuples as lists, dict keys as str, anything else
    repr()."""
    if value is None or isinstance(value, (bool, float, str, bytes)):
        return value
    if isinstance(value, int):
        if _MSGPACK_INT[0] <= value < _MSGPACK_INT[1]:
            return value
    elif depth < _MAX_EXTRAS_DEPTH:
        if isinstance(value, (list, tuple)):
            return [_coerce(item, depth + 1) for item in value]
        if isinstance(value, dict):
            return {str(k): _coerce(v, depth + 1) for k, v in value.items()}
    try:
        return repr(value)
    except BaseException:
        return f"<unrepresentable {type(value).__name__} object>"


def _extras(record):
    """The msgpack map of record's extra attributes, or None."""
    attributes = record.__dict__
    # Most records have no extras: one subset test in C says so (it builds
    # no set, unlike `keys() - _STANDARD_KEYS`: half a microsecond less).
    if _STANDARD_KEYS.issuperset(attributes):
        return None
    extras = None
    for key, value in attributes.items():
        if key in _STANDARD_KEYS or key.startswith("_"):
            continue
        if extras is None:
            extras = {}
        extras[key] = _coerce(value)
    if extras is None:
        return None
    try:
        return _w.msgpack_dumps(extras)
    except BaseException:
        return None


_FORMATTER = logging.Formatter()
_stdlib_methods = {}  # the stdlib's Logger methods the C ones replaced


class _LogBridge(logging.Handler):
    """Root-logger handler: each record becomes one `log` frame, sent by the
    channel's sender thread, so records from any thread go out promptly and
    in order. Never raises into the logging call."""

    def __init__(self, channel, context):
        super().__init__()
        self._channel = channel
        self._context = context
        self._send_record = channel.send_log_record
        # handle() below in C (log_handles.h), as this instance's attribute:
        # logging calls it with no Python frame per record.
        self.handle = _w.bridge_handle(self, self._send_record, context,
                                       _call_id, _STANDARD_KEYS, _UNFORWARDED)

    def createLock(self):
        # send_log is thread-safe; a handler lock would only serialise
        # threads that log.
        self.lock = None

    def handleError(self, record):
        pass  # emit() swallows its errors; nothing to print them to

    def handle(self, record):
        # Handler.handle without its lock calls (there is no lock) and with
        # the filter call only when there are filters.
        if self.filters and not self.filter(record):
            return False
        # The common record (a plain LogRecord, no extras, no exception left
        # to format) is read and encoded in C: the same frame emit() sends,
        # without its Python. Anything else, or anything the C path declines
        # or fails on before sending, takes emit().
        try:
            if self._send_record(record, self._context, _call_id.get(),
                                 _STANDARD_KEYS, _UNFORWARDED):
                return True
        except Exception:
            pass
        self.emit(record)
        return True

    def emit(self, record):
        try:
            name = record.name
            if name.startswith(_UNFORWARDED):
                return
            try:
                message = record.getMessage()
            except Exception as exc:
                # Forwarded anyway, with what went wrong (logging itself would
                # only print "--- Logging error ---" to stderr).
                try:
                    args = repr(record.args)
                except Exception:
                    args = "<unrepresentable>"
                message = (f"{_text(record.msg)} [agentix: formatting the "
                           f"message failed: {type(exc).__name__}: "
                           f"{_text(exc)}; args={args}]")
            exc_text = record.exc_text
            if record.exc_info and not exc_text:
                exc_text = record.exc_text = _FORMATTER.formatException(
                    record.exc_info)
            context = getattr(record, "agentix_context", None)
            self._channel.send_log(
                logger=name, level=record.levelno,
                level_name=record.levelname, message=message,
                time_unix_nanos=int(record.created * 1e9),
                file=record.pathname or "", line=record.lineno or 0,
                function=record.funcName or "", module=record.module or "",
                exception_text=exc_text or "", origin=_ORIGIN_LOGGING,
                call_id=_call_id.get(),
                context=(context if isinstance(context, str)
                         else self._context),
                extras=_extras(record), stack_info=record.stack_info or "")
        except Exception:
            pass


class _CapturedStream(io.TextIOWrapper):
    """sys.stdout / sys.stderr: a line-buffered, write-through text wrapper
    of fd 1 / fd 2 whose write() does not reach the fd. Each complete line
    goes straight out as a stdout/stderr `log` frame tagged with the
    writer's call id; the fd-level path could not tell whose it was.
    Unfinished lines wait per thread: until the next newline, until the
    thread writes for another call (then they go out as a line of their
    own), until flush(), or until shutdown. `buffer` (and fileno()) still
    reach the fd and are captured unattributed, like child processes."""

    def __init__(self, fd, origin, channel):
        super().__init__(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                         errors="backslashreplace", line_buffering=True,
                         write_through=True)
        self._origin = origin
        self._channel = channel
        self._pending = {}  # thread id -> (call id, unfinished line)

    def _send(self, line, call_id):
        if line.endswith("\r"):
            line = line[:-1]
        try:
            self._channel.send_stdio(self._origin, line, call_id)
        except Exception:
            pass  # output must never fail the call

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError(
                f"write() argument must be str, not {type(s).__name__}")
        thread = threading.get_ident()
        call_id = _call_id.get()
        pending = self._pending.pop(thread, None)
        text = s
        if pending is not None:
            if pending[0] == call_id:
                text = pending[1] + s
            else:
                self._send(pending[1], pending[0])
        if "\n" in text:
            lines = text.split("\n")
            text = lines.pop()
            for line in lines:
                while len(line) > _MAX_LINE_CHARS:
                    self._send(line[:_MAX_LINE_CHARS], call_id)
                    line = line[_MAX_LINE_CHARS:]
                self._send(line, call_id)
        while len(text) >= _MAX_LINE_CHARS:
            self._send(text[:_MAX_LINE_CHARS], call_id)
            text = text[_MAX_LINE_CHARS:]
        if text:
            self._pending[thread] = (call_id, text)
        return len(s)

    def flush(self):
        pending = self._pending.pop(threading.get_ident(), None)
        if pending is not None:
            self._send(pending[1], pending[0])
        super().flush()

    def flush_all(self):
        """Sends every thread's unfinished line (at shutdown)."""
        while self._pending:
            try:
                _, (call_id, text) = self._pending.popitem()
            except KeyError:
                break
            self._send(text, call_id)


class _Logs:
    """The worker's log plumbing, set up at boot and torn down at exit."""

    def __init__(self, channel, worker_id):
        self._channel = channel
        self._streams = ()
        self._durable = None
        self._pump = None
        self._saved = (sys.stdout, sys.stderr)
        self._factory = None
        context = os.environ.get("AGENTIX_LOG_CONTEXT")
        self.context = _expand_context(
            context or "sandbox-{hostname}-worker-{id}", worker_id)
        self._worker_id = worker_id

    def start(self):
        channel, context = self._channel, self.context
        try:
            channel.start_capture(self._worker_id, context)
        except Exception as exc:
            _log(_ERROR, f"cannot capture stdout/stderr: {_text(exc)}")
        else:
            self._streams = (
                _CapturedStream(1, _ORIGIN_STDOUT, channel),
                _CapturedStream(2, _ORIGIN_STDERR, channel))
            sys.stdout, sys.stderr = self._streams
        # A crash in native code kills the process before any log frame can
        # leave; faulthandler writes the Python stacks to the original stderr,
        # which the daemon keeps and quotes in the WorkerDied error.
        try:
            import faulthandler
            faulthandler.enable(file=_w.diagnostic_fd(), all_threads=True)
        except Exception as exc:
            _log(_WARNING, f"cannot enable faulthandler: {_text(exc)}")

        # Records get the worker's context; the stdlib's LogRecord is built
        # in C (the same attributes in the same order, ~1.2 µs less per
        # record on the calling thread), any other factory is called.
        _w.set_log_record_factory(logging.getLogRecordFactory(), context,
                                  logging)
        logging.setLogRecordFactory(_w.make_log_record)
        # Logger._log and the level methods in C (logger_log.h): the caller
        # found, the record made and handed to the handlers without logging's
        # Python frames; the stdlib's (kept here) run for anything unusual.
        try:
            _stdlib_methods.update(_w.install_logger_log(logging))
        except Exception as exc:
            _log(_WARNING, f"logging stays all Python: {_text(exc)}")
        root = logging.getLogger()
        bridge = _LogBridge(channel, context)
        root.addHandler(bridge)
        # As the original worker: the level comes from $AGENTIX_LOG_LEVEL
        # (configure_logging; unknown names mean INFO), then the bridge raises
        # it to at least INFO so the host sees INFO records by default.
        root.setLevel(_env_log_level())
        if root.level == logging.NOTSET or root.level > logging.INFO:
            root.setLevel(logging.INFO)

        self._durable = _open_durable(channel, self._worker_id, context)
        if self._durable is not None:
            root.addHandler(self._durable)
            if self._streams:
                channel.set_durable(True)
                self._pump = threading.Thread(
                    target=_pump_durable, name="agentix-durable-log",
                    args=(channel, self._durable, context), daemon=True)
                self._pump.start()

        def after_fork_in_child():
            # The channel is the parent's (channel_module.cc drops what a
            # child sends): output goes to fds 1/2, still drained by the
            # worker, and records are not forwarded.
            sys.stdout, sys.stderr = self._saved
            root.removeHandler(bridge)

        os.register_at_fork(after_in_child=after_fork_in_child)

    def stop(self):
        """Sends what is pending and restores fds and streams. Bounded."""
        for stream in self._streams:
            stream.flush_all()
        sys.stdout, sys.stderr = self._saved
        try:
            self._channel.stop_capture(_CAPTURE_STOP_MS)
        except Exception as exc:
            _log(_WARNING, f"while stopping capture: {_text(exc)}")
        if self._pump is not None:
            self._pump.join(_CAPTURE_STOP_MS / 1000)
        if self._durable is not None:
            try:
                self._channel.set_durable(False)
                self._durable.flush()
            except Exception:
                pass
