"""Constants and small helpers every part of the driver uses."""

import collections.abc
import contextvars
import traceback
import types

import _agentix_worker as _w

# absl::StatusCode values carried in error frames.
_CANCELLED = 1
_UNKNOWN = 2
_INVALID_ARGUMENT = 3

# agentix.runtime.v1.Encoding; 0 (unspecified) means pickle.
_PICKLE = 1
_MSGPACK = 2

# Process exit codes (mirrored in worker.h).
EXIT_OK = 0
EXIT_PROTOCOL = 4  # bad frame from the daemon: the channel is desynchronised
EXIT_CHANNEL = 5  # reading or writing the channel failed

# Sync callables share this many threads; more wait for a free one.
_SYNC_THREADS = 64

# How long shutdown lets cancelled coroutines unwind.
_CANCEL_GRACE_SECONDS = 1.0
_DEBUG, _INFO, _WARNING, _ERROR = range(4)

# Marks a sync call whose return value must still be awaited on the loop.
_AWAIT = object()

# Marks a non-streaming call whose return value is a generator.
_GENERATOR = object()

# Values a non-streaming call cannot return: they only make sense streamed.
# The ABC check costs ~0.15 us per ordinary call.
_STREAM_ONLY = (types.GeneratorType, collections.abc.AsyncIterator)

# Iterable, but refused as a stream's value: almost surely a mistake.
_NOT_STREAMS = (str, bytes, bytearray)

# The id of the call the running task or thread works for ("" outside
# calls). Set for the duration of every call; read by the log handler and the
# stdout/stderr wrappers.
_call_id = contextvars.ContextVar("agentix_call_id", default="")

# agentix.runtime.v1.LogOrigin
_ORIGIN_LOGGING = 1
_ORIGIN_STDOUT = 2
_ORIGIN_STDERR = 3

# How long shutdown waits for the capture threads to drain and send.
_CAPTURE_STOP_MS = 1000

# A Python-level line longer than this (in characters) is cut, as the
# drainers cut fd-level lines at 64 KiB.
_MAX_LINE_CHARS = 65536

# Durable log rotation (SPEC 3.4).
_DURABLE_MAX_BYTES = 64 * 1024 * 1024
_DEFAULT_LOG_DIR = "/tmp/agentix"
_DEFAULT_FORMAT = "%(asctime)s [%(agentix_context)s] [%(name)s] %(message)s"

# Records of these loggers never become log frames (SPEC 4): the bridge's own
# plumbing would feed back into itself. (The original also held back
# "agentix.sio", whose events carried the logs; here logs have their own
# channel, so plugin-namespace warnings reach the host like any record.)
_UNFORWARDED = ("agentix.utils.log",)

# LogRecord attributes that are not `extra=` fields.
_STANDARD_KEYS = frozenset((
    "name", "msg", "args", "levelname", "levelno", "pathname", "filename",
    "module", "exc_info", "exc_text", "stack_info", "lineno", "funcName",
    "created", "msecs", "relativeCreated", "thread", "threadName",
    "processName", "process", "taskName", "message", "asctime",
    "agentix_context"))
_MSGPACK_INT = (-(1 << 63), 1 << 64)
_MAX_EXTRAS_DEPTH = 16


def _log(severity, message):
    _w.log(severity, message)


def _text(exc):
    """str(exc) that cannot fail."""
    try:
        return str(exc)
    except BaseException:
        return f"<unprintable {type(exc).__name__} object>"


def _format(exc, skip=0):
    """The formatted traceback of exc without its first `skip` frames (the
    driver's own wrapper frames), or "" if formatting fails."""
    try:
        tb = exc.__traceback__
        for _ in range(skip):
            if tb is None:
                break
            tb = tb.tb_next
        return "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:
        return ""
