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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agentix.runtime.client.subscription import SeqCursor, SubscriptionStream
from agentix.runtime.v1 import runtime_pb2 as pb

__all__ = ["DEFAULT_LOGGER", "LogCursor", "LogsStream", "replay_record"]

_log = logging.getLogger("agentix.runtime.client")

# The logger of records that name none.
DEFAULT_LOGGER = "agentix.sandbox"
# agentix_context of records that carry none.
_DEFAULT_CONTEXT = "sandbox"

_ORIGINS = {
    pb.LOG_ORIGIN_LOGGING: "logging",
    pb.LOG_ORIGIN_STDOUT: "stdout",
    pb.LOG_ORIGIN_STDERR: "stderr",
    pb.LOG_ORIGIN_RUNTIME: "runtime",
}

# Attributes a replayed record gets from the wire fields; extras may not
# overwrite them (nor any standard LogRecord attribute: makeRecord refuses those).
_AGENTIX_KEYS = frozenset({"agentix_context", "agentix_call_id", "agentix_worker_id", "agentix_origin"})
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
    keys a replayed record sets itself. Empty, undecodable or non-map data
    (or no msgpack installed) gives ``{}``."""
    if not data:
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


def replay_record(record: pb.LogRecord) -> None:
    """Hands one sandbox record to the host's logging, as if logged here.

    Logger ``record.logger`` (or `DEFAULT_LOGGER`); nothing happens when that
    logger is not enabled for the level. The `logging.LogRecord` is made with
    ``makeRecord(name, level, fn=file, lno=line, msg=message, args=(),
    exc_info=None, extra=<decoded extras>)`` and then gets ``funcName``,
    ``module`` (when sent), ``exc_text``, ``agentix_context``,
    ``agentix_call_id``, ``agentix_worker_id``, ``agentix_origin``, the
    sandbox's level name for levels the host has no name for, and
    ``created``/``msecs``/``relativeCreated`` from ``time_unix_nanos`` (the
    sandbox's clock; host time when the record carries none). Exceptions from
    handlers or filters propagate.
    """
    logger = logging.getLogger(record.logger or DEFAULT_LOGGER)
    level = record.level
    if not logger.isEnabledFor(level):
        return
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
    replayed.funcName = record.function
    if record.module:
        replayed.module = record.module
    replayed.exc_text = record.exception_text or None
    replayed.stack_info = record.stack_info or None
    if record.level_name and replayed.levelname == f"Level {level}":
        replayed.levelname = record.level_name
    replayed.agentix_context = record.context or _DEFAULT_CONTEXT
    replayed.agentix_call_id = record.call_id
    replayed.agentix_worker_id = record.worker_id
    replayed.agentix_origin = _ORIGINS.get(record.origin, "unspecified")
    if record.time_unix_nanos > 0:
        created = record.time_unix_nanos / 1e9
        replayed.relativeCreated += (created - replayed.created) * 1000
        replayed.created = created
        replayed.msecs = float(record.time_unix_nanos % 1_000_000_000 // 1_000_000)
    logger.handle(replayed)


class LogsStream(SubscriptionStream):
    """Drives one open ``Logs`` RPC; see the module docstring and
    `SubscriptionStream` (same arguments, with a `LogCursor`)."""

    rpc_name = "Logs"
    noun = "sandbox log record"

    def _subscribe_request(self, after_seq: int, instance_id: str) -> pb.LogsRequest:
        return pb.LogsRequest(subscribe=pb.SubscribeLogs(after_seq=after_seq, instance_id=instance_id))

    def _ack_request(self, seq: int) -> pb.LogsRequest:
        return pb.LogsRequest(ack=pb.AckLogs(seq=seq))

    def _items(self, response: pb.LogsResponse) -> Sequence[pb.LogRecord]:
        return response.records

    def _replay(self, item: pb.LogRecord) -> None:
        replay_record(item)

    def _describe(self, item: pb.LogRecord) -> str:
        return f"logger {item.logger or DEFAULT_LOGGER!r}"
