"""The host half of ``RuntimeService.Logs``: sandbox log records replayed into
the host's stdlib logging.

A `LogsStream` subscribes with the last seq its client has seen, then replays
every record of every `LogsResponse` in order (`replay_record`) and
acknowledges each response with one `AckLogs`. Records whose seq is not above
the last one seen are dropped, so resubscribing never replays a record twice.

It runs beside the ``Calls`` stream and never affects it: it is its own task,
the handlers run in a worker thread (a slow handler delays logs, not the event
loop), and a failure of the stream only ends log delivery until the client
connects again. A daemon without ``Logs`` (UNIMPLEMENTED) is remembered and not
asked again.

The sandbox chooses its logger names, levels and extras, so replay bounds what
they can make the host keep (`logging.getLogger` keeps every logger, and a
placeholder for each dotted prefix, for the life of the process):

- A name is taken as it is only when `valid_logger_name` accepts it (at most
  `MAX_LOGGER_NAME_CHARS` characters and `MAX_LOGGER_NAME_PARTS` dotted parts,
  no empty part, printable characters only), and replay creates at most
  `max_sandbox_loggers()` host loggers per process (default
  `DEFAULT_MAX_SANDBOX_LOGGERS`, ``$AGENTIX_MAX_SANDBOX_LOGGERS`` or
  `set_max_sandbox_loggers`); loggers the host already has are always used.
  Other records are replayed under `FALLBACK_LOGGER`. Every replayed record
  carries the sandbox's name, cut to `MAX_LOGGER_NAME_CHARS`, in
  ``record.agentix_logger``. Each of the two reasons is warned about once per
  process; `replay_counts` gives the running counts.
- Levels outside 0..`MAX_CACHED_LEVEL` are checked without
  ``Logger.isEnabledFor``, whose per-logger cache keeps every level it is asked.
- Extras larger than `MAX_EXTRAS_BYTES` are dropped, not decoded.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from agentix.runtime.client.subscription import ReplayedOnce, ResponseDecoder, SeqCursor, SubscriptionStream
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.utils.log._config import ContextRecordFactory

__all__ = [
    "DEFAULT_LOGGER",
    "DEFAULT_MAX_SANDBOX_LOGGERS",
    "FALLBACK_LOGGER",
    "decode_response",
    "LogCursor",
    "LogsStream",
    "MAX_LOGGER_NAME_CHARS",
    "MAX_LOGGER_NAME_PARTS",
    "max_sandbox_loggers",
    "replay_counts",
    "replay_record",
    "set_max_sandbox_loggers",
    "valid_logger_name",
]

_log = logging.getLogger("agentix.runtime.client")

# The logger of records that name none.
DEFAULT_LOGGER = "agentix.sandbox"
# agentix_context of records that carry none.
_DEFAULT_CONTEXT = "sandbox"
# The logger of records whose name the host does not take (see the module docstring).
FALLBACK_LOGGER = "agentix.sandbox.other"

# A sandbox logger name is taken as it is only within these bounds.
MAX_LOGGER_NAME_CHARS = 200
MAX_LOGGER_NAME_PARTS = 16
# Host loggers replay creates per process before it uses FALLBACK_LOGGER.
DEFAULT_MAX_SANDBOX_LOGGERS = 1000
_MAX_LOGGERS_ENV = "AGENTIX_MAX_SANDBOX_LOGGERS"
# Levels checked with Logger.isEnabledFor (whose cache keeps each one asked).
MAX_CACHED_LEVEL = 100
# Extras are msgpack; small input can decode to many objects (an empty map is
# one byte, a dict 64), so larger extras are dropped.
MAX_EXTRAS_BYTES = 64 * 1024

_ORIGINS = {
    pb.LOG_ORIGIN_LOGGING: "logging",
    pb.LOG_ORIGIN_STDOUT: "stdout",
    pb.LOG_ORIGIN_STDERR: "stderr",
    pb.LOG_ORIGIN_RUNTIME: "runtime",
}

# Attributes a replayed record gets from the wire fields; extras may not
# overwrite them (nor any standard LogRecord attribute: makeRecord refuses those).
_AGENTIX_KEYS = frozenset(
    {"agentix_context", "agentix_call_id", "agentix_worker_id", "agentix_origin", "agentix_logger"}
)
_RESERVED_KEYS = frozenset(
    {
        *vars(logging.LogRecord("", logging.INFO, "", 0, "", (), None)),
        "args", "asctime", "created", "exc_info", "exc_text", "filename", "funcName", "levelname", "levelno",
        "lineno", "message", "module", "msecs", "msg", "name", "pathname", "process", "processName",
        "relativeCreated", "stack_info", "taskName", "thread", "threadName",
        *_AGENTIX_KEYS,
    }
)


class LogCursor(SeqCursor):
    """The seq of the last log record a client has replayed and the daemon
    instance it counts in (see `SeqCursor`)."""

    __slots__ = ()


def decode_extras(data: bytes) -> dict[str, object]:
    """The msgpack map of `LogRecord.extras` as ``{str: value}``, without the
    keys a replayed record sets itself. Empty, undecodable or non-map data,
    data over `MAX_EXTRAS_BYTES` (or no msgpack installed) gives ``{}``."""
    if not data:
        return {}
    if len(data) > MAX_EXTRAS_BYTES:
        _warn_once("extras", "dropping the extras of a sandbox log record: %d bytes, more than the %d replay "
                   "decodes (reported once)", len(data), MAX_EXTRAS_BYTES)
        return {}
    try:
        import msgpack

        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as error:  # ImportError included: extras are best effort
        _log.debug("dropping undecodable log record extras: %r", error)
        return {}
    if not isinstance(value, dict):
        return {}
    extras = {str(key): item for key, item in value.items()}
    return {key: item for key, item in extras.items() if key not in _RESERVED_KEYS}


# The instance id and the records of a serialized `LogsResponse`: the
# native decoder's ``LogRecordFields`` (``_native_calls.log_records``) or
# protobuf's `pb.LogRecord` messages (see `ResponseDecoder`).
decode_response = ResponseDecoder("log_records", pb.LogsResponse, "records")


def replay_record(record: pb.LogRecord) -> None:
    """Hands one sandbox record (a `pb.LogRecord`, or the native decoder's
    fields of one, see `decode_response`) to the host's logging, as if logged
    here.

    Logger ``record.logger`` (or `DEFAULT_LOGGER`; `FALLBACK_LOGGER` for a
    name the host does not take, see the module docstring); nothing happens
    when that logger is not enabled for the level. The `logging.LogRecord` is made with
    ``makeRecord(name, level, fn=file, lno=line, msg=message, args=(),
    exc_info=None, extra=<decoded extras>)`` and then gets ``funcName``,
    ``module`` (when sent), ``exc_text``, ``agentix_context``,
    ``agentix_call_id``, ``agentix_worker_id``, ``agentix_origin``,
    ``agentix_logger`` (the sandbox's name, cut to `MAX_LOGGER_NAME_CHARS`), the
    sandbox's level name for levels the host has no name for, and
    ``created``/``msecs``/``relativeCreated`` from ``time_unix_nanos`` (the
    sandbox's clock; host time when the record carries none). Exceptions from
    handlers or filters propagate.
    """
    RecordBatch(template=False).replay(record)


class RecordBatch:
    """Replays the records of one `LogsResponse` on the calling thread, each
    as `replay_record` describes.

    With the stdlib's record factory (alone or wrapped by
    ``agentix.configure_logging``) and a logger whose ``makeRecord`` is the
    stdlib's, a record is made as a copy of a template record plus the wire
    record's fields: what ``LogRecord.__init__`` would compute again for every
    record (thread, process, the file name's parts) is the same for a whole
    batch replayed by one thread, and skipping it makes replay about twice as
    cheap. Records with extras or without a time, and any other factory or
    logger class, take ``makeRecord`` itself.
    """

    __slots__ = ("_template", "_relative_ms", "_bases")

    def __init__(self, template: bool = True) -> None:
        self._template = None
        self._bases: dict[tuple, dict[str, Any]] = {}
        if template and _is_stdlib_factory(logging.getLogRecordFactory()):
            made = logging.LogRecord("", logging.INFO, "", 0, "", (), None)
            self._template = vars(made)
            # relativeCreated = created * 1000 + this (the logging module's start).
            self._relative_ms = made.relativeCreated - made.created * 1000

    def replay(self, record: pb.LogRecord) -> None:
        wire_name = record.logger
        logger = _loggers.get(wire_name) or _logger_named(wire_name)
        level = record.level
        if not (logger.isEnabledFor(level) if 0 <= level <= MAX_CACHED_LEVEL else _enabled_uncached(logger, level)):
            return
        if len(wire_name) > MAX_LOGGER_NAME_CHARS:
            wire_name = wire_name[:MAX_LOGGER_NAME_CHARS]
        template = self._template
        cls = type(logger)
        if template is not None and cls.makeRecord is _MAKE_RECORD and not record.extras:
            nanos = record.time_unix_nanos
            if nanos > 0:
                replayed = self._from_template(template, logger.name, level, record, wire_name, nanos)
                # Logger.handle without its filter call when the logger has no
                # filters (what it does then is callHandlers).
                if cls.handle is _HANDLE and not logger.filters:
                    if not logger.disabled:
                        logger.callHandlers(replayed)
                else:
                    logger.handle(replayed)
                return
        replayed = _made_record(logger, level, record)
        replayed.agentix_logger = wire_name
        logger.handle(replayed)

    def replayer(self) -> Callable[[Any], None]:
        """What replays this batch's records one call each: `replay`, or
        with the native module and the template, its ``LogReplayer``, which
        does replay's templated path in C and hands any other record to
        `replay` (log_replay.h)."""
        native, fields_type = _native_replay_types()
        if native is None or self._template is None:
            return self.replay
        return native(
            fields_type=fields_type, loggers=_loggers, logging_module=logging, record_type=_LOG_RECORD,
            relative_ms=self._relative_ms, max_name_chars=MAX_LOGGER_NAME_CHARS, base_for=self._base_for,
            fallback=self.replay, is_enabled_for=_IS_ENABLED_FOR, make_record=_MAKE_RECORD, handle=_HANDLE,
        )

    def _base_for(self, name: str, level: int, record: Any) -> dict[str, Any]:
        """The base attributes of `record` (replayed under the logger named
        `name`, its wire name within the bound) for LogReplayer."""
        template = self._template
        if template is None:  # replayer() makes no LogReplayer then
            raise RuntimeError("a RecordBatch without a template has no base attributes")
        return self._base_of(template, name, level, record, record.logger)

    def _base_of(
        self, template: dict[str, Any], name: str, level: int, record: Any, wire_name: str
    ) -> dict[str, Any]:
        # Records of one batch mostly repeat their logger, level, place and
        # ids: the attributes those give are worked out once per distinct
        # combination (a copy of the template with them), and each record is
        # a copy of that plus what is its own.
        key = (name, level, wire_name, record.file, record.module, record.function, record.context,
               record.call_id, record.worker_id, record.origin, record.level_name)
        base = self._bases.get(key)
        if base is None:
            base = self._base(template, key)
        return base

    def _from_template(
        self, template: dict[str, Any], name: str, level: int, record: Any, wire_name: str, nanos: int
    ) -> logging.LogRecord:
        # (LogReplayer makes the same dict in C: keep the two in step.)
        attrs = self._base_of(template, name, level, record, wire_name).copy()
        created = nanos / 1e9
        attrs.update({
            "msg": record.message, "lineno": record.line, "created": created,
            "msecs": float(nanos % 1_000_000_000 // 1_000_000),
            "relativeCreated": created * 1000 + self._relative_ms,
            "exc_text": record.exception_text or None,
            "stack_info": record.stack_info or None,
        })
        replayed = _new_record(logging.LogRecord)
        replayed.__dict__ = attrs
        return replayed

    def _base(self, template: dict[str, Any], key: tuple) -> dict[str, Any]:
        """The template plus the attributes `key`'s fields give (see
        _from_template), kept for the batch (at most _BASES_PER_BATCH)."""
        name, level, wire_name, path, wire_module, function, context, call_id, worker_id, origin, level_name = key
        filename, module = _file_parts.get(path) or _split_path(path)
        # _level_name(logging.getLevelName(level), record), with the common
        # case (a level the host names) as one dict lookup.
        levelname = _level_to_name.get(level)
        if levelname is None or levelname.startswith("Level "):
            host_name = logging.getLevelName(level)
            levelname = level_name if level_name and host_name == f"Level {level}" else host_name
        # Every attribute _sandbox_fields gives is written out here too
        # (rather than merged from its dict): keep the two in step.
        base = template.copy()
        base.update({
            "name": name, "args": (), "levelno": level, "agentix_logger": wire_name,
            "levelname": levelname, "pathname": path, "filename": filename,
            "module": wire_module or module, "exc_info": None,
            "funcName": function,
            "agentix_context": context or _DEFAULT_CONTEXT,
            "agentix_call_id": call_id,
            "agentix_worker_id": worker_id,
            "agentix_origin": _ORIGINS.get(origin, "unspecified"),
            # Set per record (here so that every copy has its keys already).
            "msg": None, "lineno": 0, "created": 0.0, "msecs": 0.0, "relativeCreated": 0.0,
            "exc_text": None, "stack_info": None,
        })
        if len(self._bases) >= _BASES_PER_BATCH:
            self._bases.clear()
        self._bases[key] = base
        return base


# Distinct (logger, level, place, ids) combinations a RecordBatch keeps.
_BASES_PER_BATCH = 64


# (_native_calls.LogReplayer, _native_calls.LogRecordFields), or (None,
# None) without the native module; looked up at first use (the module loads
# grpc++).
_native_types: tuple[Any, Any] | None = None


def _native_replay_types() -> tuple[Any, Any]:
    global _native_types
    if _native_types is None:
        try:
            from agentix.runtime.client import _native_calls

            _native_types = (_native_calls.LogReplayer, _native_calls.LogRecordFields)
        except (ImportError, AttributeError):
            _native_types = (None, None)
    return _native_types


def _made_record(logger: logging.Logger, level: int, record: pb.LogRecord) -> logging.LogRecord:
    """The replayed record made by ``logger.makeRecord`` (any factory, extras)."""
    extras = decode_extras(record.extras)
    try:
        replayed = logger.makeRecord(
            logger.name, level, record.file, record.line, record.message, (), None, extra=extras
        )
    except KeyError:  # an extra collides with an attribute the host's record factory sets
        replayed = logger.makeRecord(logger.name, level, record.file, record.line, record.message, (), None)
        for key, value in extras.items():
            if key not in vars(replayed):
                setattr(replayed, key, value)
    for key, value in _sandbox_fields(record).items():
        setattr(replayed, key, value)
    if record.module:
        replayed.module = record.module
    replayed.levelname = _level_name(replayed.levelname, record)
    if record.time_unix_nanos > 0:
        created = record.time_unix_nanos / 1e9
        replayed.relativeCreated += (created - replayed.created) * 1000
        replayed.created = created
        replayed.msecs = _msecs(record.time_unix_nanos)
    return replayed


def _sandbox_fields(record: pb.LogRecord) -> dict[str, Any]:
    """The attributes every replayed record takes from the wire as they are."""
    return {
        "funcName": record.function,
        "exc_text": record.exception_text or None,
        "stack_info": record.stack_info or None,
        "agentix_context": record.context or _DEFAULT_CONTEXT,
        "agentix_call_id": record.call_id,
        "agentix_worker_id": record.worker_id,
        "agentix_origin": _ORIGINS.get(record.origin, "unspecified"),
    }


def _enabled_uncached(logger: logging.Logger, level: int) -> bool:
    """``logger.isEnabledFor(level)`` without adding `level` to its cache."""
    return not logger.disabled and logger.manager.disable < level and level >= logger.getEffectiveLevel()


def _level_name(host_name: str, record: pb.LogRecord) -> str:
    """The host's name for the level, or the sandbox's where the host has none."""
    level = record.level
    return record.level_name if record.level_name and host_name == f"Level {level}" else host_name


def _msecs(nanos: int) -> float:
    """LogRecord.msecs of a wire time: whole milliseconds of its second."""
    return float(nanos % 1_000_000_000 // 1_000_000)


_MAKE_RECORD = logging.Logger.makeRecord
_HANDLE = logging.Logger.handle
_IS_ENABLED_FOR = logging.Logger.isEnabledFor
_LOG_RECORD = logging.LogRecord
# The logging module's own level names (addLevelName updates this dict in place).
_level_to_name: dict[int, str] = logging._levelToName
_new_record = object.__new__

# Loggers by wire name ("" is DEFAULT_LOGGER): names valid_logger_name accepts
# whose logger the host already had or replay created (at most
# _max_loggers of those). It saves getLogger's module lock per record.
_loggers: dict[str, logging.Logger] = {}
_loggers_lock = threading.Lock()
_created = 0  # loggers replay created
_fallbacks = {"invalid": 0, "limit": 0}  # records replayed under FALLBACK_LOGGER, by reason
_warned: set[str] = set()


def _max_loggers_from_env() -> int:
    text = os.environ.get(_MAX_LOGGERS_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_SANDBOX_LOGGERS
    try:
        value = int(text)
        if value < 0:
            raise ValueError("negative")
    except ValueError:
        _log.warning("%s=%r is not a whole number >= 0; using %d", _MAX_LOGGERS_ENV, text,
                     DEFAULT_MAX_SANDBOX_LOGGERS)
        return DEFAULT_MAX_SANDBOX_LOGGERS
    return value


_max_loggers = _max_loggers_from_env()


def max_sandbox_loggers() -> int:
    """The most host loggers log replay creates in this process."""
    return _max_loggers


def set_max_sandbox_loggers(limit: int) -> None:
    """Sets how many host loggers log replay may create in this process
    (default `DEFAULT_MAX_SANDBOX_LOGGERS`, or ``$AGENTIX_MAX_SANDBOX_LOGGERS``
    at import). Loggers already created stay in use. Raises ValueError for a
    negative `limit`."""
    global _max_loggers
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"the sandbox logger limit must be an int >= 0, not {limit!r}")
    _max_loggers = limit


def replay_counts() -> dict[str, int]:
    """This process's figures: ``loggers_created`` (host loggers replay
    created), ``fallback_invalid`` and ``fallback_limit`` (records replayed
    under `FALLBACK_LOGGER` for a name `valid_logger_name` refuses, or a new
    name past the logger limit)."""
    with _loggers_lock:
        return {
            "loggers_created": _created,
            "fallback_invalid": _fallbacks["invalid"],
            "fallback_limit": _fallbacks["limit"],
        }


def valid_logger_name(name: str) -> bool:
    """Whether replay takes `name` as a host logger name: at most
    `MAX_LOGGER_NAME_CHARS` characters and `MAX_LOGGER_NAME_PARTS` dotted
    parts, none of them empty, all characters printable."""
    return (
        len(name) <= MAX_LOGGER_NAME_CHARS
        and name.count(".") < MAX_LOGGER_NAME_PARTS
        and name.isprintable()
        and ".." not in name
        and not name.startswith(".")
        and not name.endswith(".")
    )


def _logger_named(name: str) -> logging.Logger:
    """The host logger of wire name `name` (see the module docstring); the
    cache is filled here."""
    global _created
    if not name:
        logger = logging.getLogger(DEFAULT_LOGGER)
        _loggers[""] = logger
        return logger
    if not valid_logger_name(name):
        return _fallback("invalid", name)
    existing = logging.Logger.manager.loggerDict.get(name)
    with _loggers_lock:
        cached = _loggers.get(name)
        if cached is not None:
            return cached
        if not isinstance(existing, logging.Logger):
            if _created >= _max_loggers:
                made = None
            else:
                _created += 1
                made = logging.getLogger(name)
        else:
            made = existing
        if made is not None:
            _loggers[name] = made
            return made
    return _fallback("limit", name)


def _fallback(reason: str, name: str) -> logging.Logger:
    """FALLBACK_LOGGER for a record named `name`, counted; warned about once
    per reason."""
    with _loggers_lock:
        _fallbacks[reason] += 1
    shown = name[:MAX_LOGGER_NAME_CHARS]
    if reason == "invalid":
        _warn_once(
            reason,
            "a sandbox log record names logger %r (%d characters), which the host does not take (more than %d "
            "characters or %d dotted parts, an empty part or an unprintable character); such records are "
            "replayed under logger %r, the sandbox's name (cut) in record.agentix_logger (reported once)",
            shown, len(name), MAX_LOGGER_NAME_CHARS, MAX_LOGGER_NAME_PARTS, FALLBACK_LOGGER,
        )
    else:
        _warn_once(
            reason,
            "log replay has created %d host loggers for sandbox records, its limit (%s); records under other "
            "new logger names, the first being %r, are replayed under logger %r, the sandbox's name in "
            "record.agentix_logger (reported once)",
            _max_loggers, _MAX_LOGGERS_ENV, shown, FALLBACK_LOGGER,
        )
    global _fallback_logger
    if _fallback_logger is None:
        _fallback_logger = logging.getLogger(FALLBACK_LOGGER)
    return _fallback_logger


_fallback_logger: logging.Logger | None = None


def _warn_once(key: str, message: str, *args: Any) -> None:
    """Logs `message` at WARNING the first time `key` is given in this process."""
    with _loggers_lock:
        if key in _warned:
            return
        _warned.add(key)
    _log.warning(message, *args)


# (filename, module) by pathname, as LogRecord.__init__ derives them; only
# paths of at most _FILE_PART_CHARS characters are kept.
_file_parts: dict[str, tuple[str, str]] = {}
_FILE_PARTS_MAX = 4096
_FILE_PART_CHARS = 512


def _split_path(path: str) -> tuple[str, str]:
    try:
        filename = os.path.basename(path)
        parts = (filename, os.path.splitext(filename)[0])
    except (TypeError, ValueError, AttributeError):
        parts = (path, "Unknown module")
    if len(path) > _FILE_PART_CHARS:
        return parts
    if len(_file_parts) >= _FILE_PARTS_MAX:
        _file_parts.clear()
    _file_parts[path] = parts
    return parts


def _is_stdlib_factory(factory: Any) -> bool:
    """Whether `factory` makes plain LogRecords (the stdlib's, or it wrapped by
    configure_logging, whose agentix_context replay sets anyway)."""
    while isinstance(factory, ContextRecordFactory):
        factory = factory.inner
    return factory is logging.LogRecord


# "0" turns the default handler of sandbox output off (see DefaultSandboxHandler).
_DEFAULT_HANDLER_ENV = "AGENTIX_SANDBOX_LOG_HANDLER"
_default_handler: DefaultSandboxHandler | None = None


class DefaultSandboxHandler(logging.StreamHandler):
    """What makes sandbox output visible on a host that configured no logging:
    a handler on logger `DEFAULT_LOGGER` (``agentix.sandbox``: captured
    stdout/stderr lines and the runtime's own warnings), writing to stderr in
    ``agentix.configure_logging``'s default format, as the original's
    ``configure_logging`` default gave. It prints only while the root logger
    has no handler of its own: once the host configures logging, records go
    there alone.

    Installed by the first `LogsStream` of the process unless the root logger
    already had a handler then, or ``$AGENTIX_SANDBOX_LOG_HANDLER`` is ``0``;
    `remove_default_handler` takes it away."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        super().emit(record)


def install_default_handler() -> None:
    """Installs `DefaultSandboxHandler` (once per process) when the host has
    configured no logging and ``$AGENTIX_SANDBOX_LOG_HANDLER`` is not ``0``;
    the ``agentix.sandbox`` logger then passes INFO records (unless its level
    was set)."""
    global _default_handler
    if _default_handler is not None or os.environ.get(_DEFAULT_HANDLER_ENV, "").strip() == "0":
        return
    if logging.getLogger().handlers:
        return
    from agentix.utils.log._config import DEFAULT_FORMAT

    handler = DefaultSandboxHandler()
    handler.setFormatter(logging.Formatter(os.environ.get("AGENTIX_LOG_FORMAT") or DEFAULT_FORMAT))
    logger = logging.getLogger(DEFAULT_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    _default_handler = handler


def remove_default_handler() -> None:
    """Removes the handler `install_default_handler` installed (and keeps it
    from being installed later in this process)."""
    global _default_handler
    handler = _default_handler
    _default_handler = DefaultSandboxHandler()  # a placeholder: never again
    if handler is not None:
        logging.getLogger(DEFAULT_LOGGER).removeHandler(handler)


class LogsStream(SubscriptionStream):
    """Drives one open ``Logs`` RPC; see the module docstring and
    `SubscriptionStream` (same arguments, with a `LogCursor`)."""

    _replayed_once = ReplayedOnce()
    rpc_name = "Logs"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        install_default_handler()
        super().__init__(*args, **kwargs)

    noun = "sandbox log record"
    decoder = decode_response

    def _subscribe_request(self, after_seq: int, instance_id: str) -> pb.LogsRequest:
        return pb.LogsRequest(subscribe=pb.SubscribeLogs(after_seq=after_seq, instance_id=instance_id))

    def _ack_request(self, seq: int) -> pb.LogsRequest:
        return pb.LogsRequest(ack=pb.AckLogs(seq=seq))

    def _batch_replayer(self) -> Callable[[Any], None]:
        return RecordBatch().replayer()

    def _describe(self, item: pb.LogRecord) -> str:
        return f"logger {item.logger[:MAX_LOGGER_NAME_CHARS] or DEFAULT_LOGGER!r}"
