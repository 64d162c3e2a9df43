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

import asyncio
import logging
from collections.abc import Callable

import grpc

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


class LogCursor:
    """The seq of the last record a client has replayed (0: none yet) and the
    daemon instance that seq counts in. Shared by the client's successive
    `LogsStream`s, so a new one resumes where the last one stopped; a daemon
    that restarted (new instance id) numbers from 1 again, and the cursor
    follows."""

    __slots__ = ("last_seq", "instance_id")

    def __init__(self) -> None:
        self.last_seq = 0
        self.instance_id = ""

    def adopt(self, instance_id: str) -> None:
        """Switches to the numbering of `instance_id` if it is a new one."""
        if instance_id and instance_id != self.instance_id:
            if self.instance_id:
                self.last_seq = 0
            self.instance_id = instance_id


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


class LogsStream:
    """Drives one open ``Logs`` RPC; see the module docstring.

    Args:
      rpc: the stream-stream call object returned by ``stub.Logs()``.
      cursor: the client's `LogCursor`; subscribing uses ``cursor.last_seq``,
        and it is advanced as records are replayed.
      on_unimplemented: called (once) when the daemon answers UNIMPLEMENTED.
      previous: the stream this one replaces; this one subscribes only after
        `previous` has stopped, so records are never replayed concurrently or
        out of order.
    """

    def __init__(
        self,
        rpc: grpc.aio.StreamStreamCall,
        cursor: LogCursor,
        on_unimplemented: Callable[[], None],
        previous: LogsStream | None = None,
    ) -> None:
        self._rpc = rpc
        self._cursor = cursor
        self._on_unimplemented = on_unimplemented
        self._previous = previous
        self._replaying: asyncio.Future | None = None
        self._handler_failures = 0
        self._done = False
        self._task = asyncio.create_task(self._run(), name="agentix-logs")

    @property
    def alive(self) -> bool:
        """True until the stream has ended, failed or been closed."""
        return not self._done

    async def aclose(self) -> None:
        """Stops the stream and waits until no record of it is being replayed.
        Idempotent; never raises (except when the caller is cancelled)."""
        self._done = True
        self._rpc.cancel()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if self._previous is not None:  # closed before the previous stream had stopped
            await self._previous.aclose()
        if self._replaying is not None:
            await asyncio.gather(self._replaying, return_exceptions=True)

    async def _run(self) -> None:
        try:
            if self._previous is not None:
                await self._previous.aclose()
                self._previous = None
            cursor = self._cursor
            await self._rpc.write(
                pb.LogsRequest(subscribe=pb.SubscribeLogs(after_seq=cursor.last_seq, instance_id=cursor.instance_id))
            )
            acked = None
            async for response in self._rpc:
                self._cursor.adopt(response.instance_id)
                if not response.records:
                    continue
                # The batch is replayed off the event loop; shielded so that a
                # close() in the middle still lets it finish (aclose waits).
                self._replaying = asyncio.ensure_future(asyncio.to_thread(self._replay_batch, list(response.records)))
                await asyncio.shield(self._replaying)
                self._replaying = None
                last = self._cursor.last_seq
                if last and last != acked:
                    await self._rpc.write(pb.LogsRequest(ack=pb.AckLogs(seq=last)))
                    acked = last
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                _log.debug("the runtime does not implement Logs; sandbox logs are not replayed")
                self._on_unimplemented()
            elif not self._done:
                _log.debug("sandbox log stream lost (re-opened by the next call): %s", error.code().name)
        except Exception as error:  # never let the log stream disturb the client
            if not self._done:
                _log.debug("sandbox log stream failed (re-opened by the next call): %r", error)
        else:
            _log.debug("the runtime ended the sandbox log stream (re-opened by the next call)")
        finally:
            self._done = True

    def _replay_batch(self, records: list[pb.LogRecord]) -> None:
        """Replays, in order, the records not seen yet, advancing the cursor.
        A record whose handling raises is reported and skipped."""
        cursor = self._cursor
        for record in records:
            if record.seq <= cursor.last_seq:
                continue
            try:
                replay_record(record)
            except Exception:
                self._report_handler_failure(record)
            cursor.last_seq = record.seq

    def _report_handler_failure(self, record: pb.LogRecord) -> None:
        # The first failure of a stream as a warning, later ones at debug: a
        # handler that always raises would otherwise double every record.
        self._handler_failures += 1
        try:
            _log.log(
                logging.WARNING if self._handler_failures == 1 else logging.DEBUG,
                "replaying sandbox log record %d (logger %r) failed; continuing with the next",
                record.seq,
                record.logger or DEFAULT_LOGGER,
                exc_info=True,
            )
        except Exception:  # the failing handler may be the one this goes to
            pass
