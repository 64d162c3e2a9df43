"""Sandbox log records replayed into host logging (RuntimeService.Logs)."""

import asyncio
import logging
import time

import grpc
import msgpack
import pytest
import pytest_asyncio

import sandbox_functions
from agentix import RuntimeClient
from agentix.runtime.v1 import runtime_pb2 as pb
from child_paths import with_stub_paths
from fake_runtime import log_record
from test_client import eventually

pytestmark = pytest.mark.asyncio


class ListHandler(logging.Handler):
    """Keeps every record it handles; `fail_on` messages make emit raise (after keeping them)."""

    def __init__(self, fail_on=()) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []
        self.fail_on = set(fail_on)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if record.getMessage() in self.fail_on:
            raise RuntimeError(f"handler refuses {record.getMessage()!r}")

    @property
    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]


@pytest.fixture
def capture():
    """capture(name, level=DEBUG, handler=None) attaches a ListHandler to logger `name`."""
    attached = []

    def attach(name, level=logging.DEBUG, handler=None):
        logger = logging.getLogger(name)
        handler = handler or ListHandler()
        attached.append((logger, handler, logger.level, logger.propagate))
        logger.setLevel(level)
        logger.propagate = False
        logger.addHandler(handler)
        return handler

    yield attach
    for logger, handler, level, propagate in attached:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


@pytest_asyncio.fixture
async def client(runtime):
    client = RuntimeClient(runtime.url)
    yield client
    await client.close()


async def test_record_fields_are_replayed(runtime, client, capture):
    handler = capture("sandbox.test")
    created_ns = 1_700_000_000_123_456_789
    extras = msgpack.packb(
        {"user": "u1", "attempt": 3, "tags": ["a", "b"], "msg": "spoofed", "lineno": 1, "agentix_context": "spoofed"}
    )
    runtime.add_logs(
        log_record(
            1,
            "50% done for user u1",
            level=logging.WARNING,
            level_name="WARNING",
            time_unix_nanos=created_ns,
            file="/app/mypkg/tools.py",
            line=42,
            function="run",
            module="tools",
            exception_text="Traceback (most recent call last):\nValueError: bad",
            worker_id="1a2b3c4d",
            call_id="c" * 32,
            context="sandbox-box-worker-1a2b3c4d",
            extras=extras,
        )
    )
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: handler.records)

    (record,) = handler.records
    assert record.name == "sandbox.test"
    assert (record.levelno, record.levelname) == (logging.WARNING, "WARNING")
    assert record.getMessage() == "50% done for user u1" and record.args == ()
    assert (record.pathname, record.filename, record.lineno) == ("/app/mypkg/tools.py", "tools.py", 42)
    assert (record.funcName, record.module) == ("run", "tools")
    assert record.exc_text == "Traceback (most recent call last):\nValueError: bad"
    assert record.exc_info is None
    assert (record.user, record.attempt, record.tags) == ("u1", 3, ["a", "b"])
    assert record.agentix_context == "sandbox-box-worker-1a2b3c4d"
    assert record.agentix_call_id == "c" * 32
    assert record.agentix_worker_id == "1a2b3c4d"
    assert record.agentix_origin == "logging"
    assert record.created == pytest.approx(1_700_000_000.123456789)
    assert record.msecs == 123.0
    formatted = logging.Formatter("%(asctime)s %(message)s").format(record)
    assert formatted.endswith("ValueError: bad") and ",123 50% done" in formatted


async def test_unnamed_and_captured_output_records(runtime, client, capture):
    default = capture("agentix.sandbox")
    stdout = capture("agentix.sandbox.stdout")
    runtime.add_logs(
        log_record(1, "no logger", logger="", origin=pb.LOG_ORIGIN_RUNTIME),
        log_record(2, "printed line", logger="agentix.sandbox.stdout", origin=pb.LOG_ORIGIN_STDOUT, level=20),
        log_record(3, "custom level", logger="", level=25, level_name="NOTICE"),
    )
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: len(default.records) == 2 and stdout.records)

    runtime_record, custom = default.records
    assert runtime_record.getMessage() == "no logger"
    assert runtime_record.agentix_origin == "runtime"
    assert runtime_record.agentix_context == "sandbox"  # none sent
    assert runtime_record.agentix_call_id == ""
    assert (custom.levelno, custom.levelname) == (25, "NOTICE")
    (printed,) = stdout.records
    assert printed.agentix_origin == "stdout"
    assert printed.funcName == "" and printed.lineno == 0


async def test_records_below_the_logger_level_are_skipped(runtime, client, capture):
    handler = capture("sandbox.test", level=logging.WARNING)
    runtime.add_logs(
        log_record(1, "debug", level=logging.DEBUG),
        log_record(2, "info", level=logging.INFO),
        log_record(3, "warning", level=logging.WARNING),
        log_record(4, "error", level=logging.ERROR),
    )
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: runtime.log_acks and runtime.log_acks[-1] == 4)
    assert handler.messages == ["warning", "error"]


async def test_records_arrive_in_order_and_each_response_is_acked_once(runtime, client, capture):
    handler = capture("sandbox.test")
    runtime.log_batch = 2
    runtime.add_logs(*(log_record(seq) for seq in range(1, 6)))
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: runtime.log_acks and runtime.log_acks[-1] == 5)
    assert handler.messages == [f"record {seq}" for seq in range(1, 6)]
    # Three responses ([1, 2], [3, 4], [5]): at most one ack each, never backwards.
    assert len(runtime.log_acks) <= 3
    assert set(runtime.log_acks) <= {2, 4, 5}
    assert runtime.log_acks == sorted(runtime.log_acks)
    assert runtime.log_subscriptions == [0]


async def test_live_records_are_replayed_while_connected(runtime, client, capture):
    handler = capture("sandbox.test")
    await client.remote(sandbox_functions.add, 1, 2)
    runtime.add_logs(log_record(1, "later"))
    await eventually(lambda: handler.messages == ["later"])
    runtime.add_logs(log_record(2, "even later"))
    await eventually(lambda: handler.messages == ["later", "even later"])


async def test_resubscribing_resumes_after_the_last_seq_and_never_replays_twice(runtime, client, capture):
    handler = capture("sandbox.test")
    runtime.logs_honour_after_seq = False  # a daemon that resends its whole buffer
    runtime.add_logs(*(log_record(seq) for seq in (1, 2, 3)))
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: len(handler.records) == 3)

    runtime.drop_streams()
    runtime.drop_logs()
    await eventually(lambda: client._stream is None and not client._logs.alive)
    runtime.add_logs(log_record(4))
    assert await client.remote(sandbox_functions.add, 1, 2) == 3  # reconnects both streams
    await eventually(lambda: len(handler.records) == 4)
    await asyncio.sleep(0.05)

    assert handler.messages == [f"record {seq}" for seq in (1, 2, 3, 4)]
    assert runtime.log_subscriptions == [0, 3]
    assert runtime.log_acks[-1] == 4


async def test_close_and_reuse_resume_after_the_last_seq(runtime, capture):
    handler = capture("sandbox.test")
    runtime.add_logs(log_record(1), log_record(2))
    client = RuntimeClient(runtime.url)
    async with client:
        await eventually(lambda: len(handler.records) == 2)
    runtime.add_logs(log_record(3))
    await asyncio.sleep(0.05)
    assert len(handler.records) == 2  # closed: nothing replayed
    async with client:
        await eventually(lambda: len(handler.records) == 3)
    assert runtime.log_subscriptions == [0, 2]


async def test_a_raising_handler_does_not_stop_later_records(runtime, client, capture, caplog):
    handler = capture("sandbox.test", handler=ListHandler(fail_on={"record 2", "record 3"}))
    runtime.add_logs(*(log_record(seq) for seq in (1, 2, 3, 4)))
    with caplog.at_level(logging.DEBUG, logger="agentix.runtime.client"):
        await client.remote(sandbox_functions.add, 1, 2)
        await eventually(lambda: len(handler.records) == 4)
        runtime.add_logs(log_record(5))
        await eventually(lambda: len(handler.records) == 5)
    assert handler.messages == [f"record {seq}" for seq in range(1, 6)]
    failures = [r for r in caplog.records if r.name == "agentix.runtime.client" and "replaying" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.WARNING, logging.DEBUG]
    assert "handler refuses 'record 2'" in failures[0].exc_text
    await eventually(lambda: runtime.log_acks[-1] == 5)


async def test_unimplemented_logs_do_not_disturb_calls(runtime, caplog):
    runtime.logs_implemented = False
    with caplog.at_level(logging.DEBUG, logger="agentix.runtime.client"):
        async with RuntimeClient(runtime.url) as client:
            assert await client.remote(sandbox_functions.add, 1, 2) == 3
            await eventually(lambda: client._logs is not None and not client._logs.alive)
            assert await client.remote(sandbox_functions.add, 2, 2) == 4
            runtime.drop_streams()
            await eventually(lambda: client._stream is None)
            assert await client.remote(sandbox_functions.add, 3, 2) == 5  # reconnected
    assert runtime.streams_opened == 2
    assert runtime.logs_opened == 1  # not asked again after UNIMPLEMENTED
    notes = [r for r in caplog.records if "does not implement Logs" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.DEBUG


async def test_a_lost_log_stream_leaves_calls_alone_and_is_reopened_by_the_next_call(runtime, client, capture):
    handler = capture("sandbox.test")
    runtime.add_logs(log_record(1))
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: len(handler.records) == 1)

    runtime.drop_logs()
    await eventually(lambda: not client._logs.alive)
    runtime.add_logs(log_record(2))
    # The call works on the same Calls stream and re-opens Logs, which
    # resumes after the last record seen.
    assert await client.remote(sandbox_functions.add, 1, 2) == 3
    await eventually(lambda: len(handler.records) == 2)
    assert runtime.streams_opened == 1 and runtime.logs_opened == 2
    assert runtime.log_subscriptions == [0, 1]

    # A Logs stream that keeps failing is retried at most once a second,
    # not on every call.
    runtime.drop_logs()
    await eventually(lambda: not client._logs.alive)
    for _ in range(20):
        assert await client.remote(sandbox_functions.add, 1, 2) == 3
    assert runtime.logs_opened <= 3


async def test_logs_false_does_not_subscribe(runtime, capture):
    handler = capture("sandbox.test")
    runtime.add_logs(log_record(1))
    async with RuntimeClient(runtime.url, logs=False) as client:
        assert client.logs is False
        assert await client.remote(sandbox_functions.add, 1, 2) == 3
        await asyncio.sleep(0.05)
    assert runtime.logs_opened == 0 and handler.records == []


async def test_close_waits_for_a_batch_being_replayed(runtime, capture):
    class SlowHandler(ListHandler):
        def emit(self, record):
            time.sleep(0.02)
            super().emit(record)

    handler = capture("sandbox.test", handler=SlowHandler())
    runtime.add_logs(*(log_record(seq) for seq in range(1, 11)))
    client = RuntimeClient(runtime.url)
    await client.remote(sandbox_functions.add, 1, 2)
    await eventually(lambda: handler.records)
    await client.close()
    count = len(handler.records)
    await asyncio.sleep(0.1)
    assert len(handler.records) == count  # nothing replayed after close() returned
    assert count == 10  # the batch in progress was finished


async def test_log_replay_does_not_block_the_event_loop(runtime, client, capture):
    class BlockingHandler(ListHandler):
        def emit(self, record):
            time.sleep(0.5)
            super().emit(record)

    handler = capture("sandbox.test", handler=BlockingHandler())
    await client.remote(sandbox_functions.add, 1, 2)
    started = time.monotonic()
    runtime.add_logs(log_record(1))
    await asyncio.sleep(0.05)  # the record is being handled now
    assert await client.remote(sandbox_functions.add, 1, 2) == 3
    assert time.monotonic() - started < 0.3
    assert handler.records == []
    await eventually(lambda: handler.records)


class EndedByTheDaemonRpc:
    """A Logs call the daemon has ended (RESOURCE_EXHAUSTED: the host fell
    too far behind) while `responses` still wait unread on the host, as
    grpc.aio behaves then (stop-26): `read` returns them, then raises the
    status; a `write` fails and, before raising, waits for the status, which
    gRPC delivers only once every response has been read."""

    def __init__(self, responses, code=grpc.StatusCode.RESOURCE_EXHAUSTED):
        self._responses = list(responses)
        self._code = code
        self._all_read = asyncio.Event()
        self.acks_tried = []

    def _status(self):
        return grpc.aio.AioRpcError(
            self._code, grpc.aio.Metadata(), grpc.aio.Metadata(),
            details="this subscriber left more than 8388608 bytes unread")

    async def write(self, request):
        if request.WhichOneof("kind") != "ack":
            return
        self.acks_tried.append(request.ack.seq)
        await self._all_read.wait()
        raise self._status()

    async def read(self):
        await asyncio.sleep(0)
        if self._responses:
            return self._responses.pop(0)
        self._all_read.set()
        raise self._status()

    def cancel(self):
        pass


async def test_a_stream_the_daemon_ended_is_read_to_its_end_and_reported_lost(capture, caplog):
    from agentix.runtime.client.logs import LogCursor, LogsStream

    handler = capture("sandbox.test")
    responses = [
        pb.LogsResponse(instance_id="daemon-1", records=[log_record(seq) for seq in range(first, first + 3)])
        .SerializeToString()
        for first in (1, 4, 7, 10)
    ]
    rpc = EndedByTheDaemonRpc(responses)
    caplog.set_level(logging.DEBUG, logger="agentix.runtime.client")
    stream = LogsStream(rpc, LogCursor(), lambda: None)
    try:
        # Awaiting each ack before the next read hung here for good after the
        # first response: the stream neither replayed the rest nor ended.
        await eventually(lambda: not stream.alive)
    finally:
        await stream.aclose()
    assert handler.messages == [f"record {seq}" for seq in range(1, 13)]
    assert rpc.acks_tried and rpc.acks_tried == sorted(rpc.acks_tried)
    lost = [r for r in caplog.records if "stream lost" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING
    assert "RESOURCE_EXHAUSTED" in lost[0].getMessage() and "8388608 bytes unread" in lost[0].getMessage()


class BufferedRpc:
    """A Logs call of a daemon that still buffers `responses`: it sends those
    with records past the subscribe's after_seq, then nothing more."""

    def __init__(self, responses):
        self._responses = list(responses)
        self.after_seq = None

    async def write(self, request):
        if request.WhichOneof("kind") == "subscribe":
            self.after_seq = request.subscribe.after_seq

    async def read(self):
        await asyncio.sleep(0)
        while self._responses:
            response = self._responses.pop(0)
            if pb.LogsResponse.FromString(response).records[-1].seq > self.after_seq:
                return response
        await asyncio.Event().wait()  # open, quiet

    def cancel(self):
        pass


def _responses(*firsts, per=3):
    return [
        pb.LogsResponse(instance_id="daemon-1", records=[log_record(seq) for seq in range(first, first + per)])
        .SerializeToString()
        for first in firsts
    ]


def _scripted_feed(rpcs):
    """A logs Feed whose streams get the calls in `rpcs`, in order."""
    from agentix.runtime.client.feeds import Feed
    from agentix.runtime.client.logs import LogCursor, LogsStream

    class ScriptedLogsStream(LogsStream):
        opened = 0

        @classmethod
        def open_rpc(cls, channel, metadata):
            cls.opened += 1
            return rpcs.pop(0)

    return Feed("logs", ScriptedLogsStream, LogCursor()), ScriptedLogsStream


async def test_a_call_waiting_for_records_reopens_a_stream_the_daemon_ended_and_gets_them(capture):
    # A daemon before stop 27 ends the stream of a host that fell 8 MiB
    # behind (RESOURCE_EXHAUSTED) while it still buffers the records: the
    # call waiting for them (its side-channel barrier) re-subscribes at once
    # with the cursor instead of returning without them.
    handler = capture("sandbox.test")
    resumed = BufferedRpc(_responses(1, 4, 7, 10))
    feed, stream_type = _scripted_feed([EndedByTheDaemonRpc(_responses(1, 4)), resumed])
    feed.ensure(object(), None)
    try:
        await asyncio.wait_for(feed.wait_replayed(12), 10)
        assert handler.messages == [f"record {seq}" for seq in range(1, 13)]  # each once, in order
        assert resumed.after_seq == 6 and stream_type.opened == 2
    finally:
        await feed.detach().aclose()


@pytest.mark.parametrize("first_code", ["RESOURCE_EXHAUSTED", "UNAVAILABLE"])
async def test_only_a_stream_ended_after_replaying_because_the_host_fell_behind_is_reopened_at_once(
        capture, first_code):
    handler = capture("sandbox.test")
    rpcs = [EndedByTheDaemonRpc(_responses(1), getattr(grpc.StatusCode, first_code)),
            EndedByTheDaemonRpc([]), EndedByTheDaemonRpc([])]
    feed, stream_type = _scripted_feed(rpcs)
    feed.ensure(object(), None)
    try:
        await asyncio.wait_for(feed.wait_replayed(12), 10)
        assert handler.messages == [f"record {seq}" for seq in range(1, 4)]
        # RESOURCE_EXHAUSTED after replaying 1..3: re-opened; the second
        # stream, refused before replaying anything (e.g. too many
        # subscribers), is not. A stream lost otherwise (UNAVAILABLE: a cut
        # connection) is left to the client's reconnection.
        assert stream_type.opened == (2 if first_code == "RESOURCE_EXHAUSTED" else 1)
    finally:
        await feed.detach().aclose()


async def test_cursor_follows_a_restarted_daemon():
    from agentix.runtime.client.logs import LogCursor

    cursor = LogCursor()
    cursor.adopt("daemon-a")
    cursor.last_seq = 40
    cursor.adopt("daemon-a")
    assert cursor.last_seq == 40
    cursor.adopt("")  # an older daemon without instance ids: no change
    assert cursor.last_seq == 40
    cursor.adopt("daemon-b")  # restarted: numbering starts again
    assert (cursor.instance_id, cursor.last_seq) == ("daemon-b", 0)


_WIRE_RECORDS = [
    log_record(1, "plain", time_unix_nanos=1_700_000_000_123_456_789, file="/app/pkg/tools.py", line=42,
               function="run", worker_id="w1", call_id="c1", context="ctx"),
    log_record(2, "module sent, exception", level=logging.ERROR, level_name="ERROR", time_unix_nanos=5,
               file="/app/pkg/tools.py", module="other", exception_text="Traceback\nValueError: x",
               stack_info="Stack (most recent call last):"),
    log_record(3, "custom level", level=25, level_name="NOTICE", time_unix_nanos=1_999_999_999_999_999_999,
               file="", origin=pb.LOG_ORIGIN_STDOUT),
    log_record(4, "no name known", level=7, level_name="", time_unix_nanos=1_000_000_000, file="weird.name.py"),
    log_record(5, "unnamed logger", logger="", time_unix_nanos=2_000_000_000, origin=pb.LOG_ORIGIN_RUNTIME),
]
# A batch keeps what records of one logger, level, place and ids share
# (RecordBatch._base): records that repeat the first's, or differ from it in
# one of those fields, must still each get their own attributes.
_WIRE_RECORDS += [
    log_record(6, "same place, other line and time", time_unix_nanos=1_700_000_001_000_000_000,
               file="/app/pkg/tools.py", line=43, function="run", worker_id="w1", call_id="c1", context="ctx"),
    log_record(7, "other call", time_unix_nanos=1_700_000_002_000_000_000, file="/app/pkg/tools.py", line=42,
               function="run", worker_id="w1", call_id="c2", context="ctx"),
    log_record(8, "other function, worker, context", time_unix_nanos=1_700_000_002_000_000_000,
               file="/app/pkg/tools.py", line=42, function="walk", worker_id="w2", context="ctx2"),
    log_record(9, "other level name", level=25, level_name="NOTE", time_unix_nanos=7, file="",
               origin=pb.LOG_ORIGIN_STDOUT),
    log_record(10, "other module", level=logging.ERROR, level_name="ERROR", time_unix_nanos=5,
               file="/app/pkg/tools.py", module="third"),
    log_record(11, "other origin", time_unix_nanos=2_000_000_000, origin=pb.LOG_ORIGIN_STDERR, logger=""),
]


@pytest.mark.parametrize("configured", [False, True], ids=["stdlib factory", "configure_logging factory"])
async def test_batch_replay_makes_the_records_makerecord_makes(capture, configured):
    # The batch replayer builds records from a template (RecordBatch); they
    # must be what the makeRecord path gives, attribute for attribute.
    from agentix.runtime.client.logs import RecordBatch
    from agentix.utils.log._config import _install_context_factory

    saved = logging.getLogRecordFactory()
    if configured:
        _install_context_factory("host-context")
    try:
        fast = capture("sandbox.test", level=1)
        default = capture("agentix.sandbox", level=1)
        batch = RecordBatch()
        assert batch._template is not None
        for record in _WIRE_RECORDS:
            batch.replay(record)
        via_template = fast.records + default.records
        fast.records.clear()
        default.records.clear()
        slow = RecordBatch(template=False)
        for record in _WIRE_RECORDS:
            slow.replay(record)
        via_make_record = fast.records + default.records
    finally:
        logging.setLogRecordFactory(saved)
    assert len(via_template) == len(via_make_record) == len(_WIRE_RECORDS)
    for made, expected in zip(via_template, via_make_record):
        got, want = vars(made), vars(expected)
        assert got.pop("relativeCreated") == pytest.approx(want.pop("relativeCreated"))
        assert got == want
        assert type(made) is logging.LogRecord


async def test_a_batch_keeps_a_bounded_number_of_shared_attribute_sets(capture):
    from agentix.runtime.client import logs

    handler = capture("sandbox.test", level=1)
    batch = logs.RecordBatch()
    for seq in range(1, 301):
        batch.replay(log_record(seq, "m", time_unix_nanos=1, call_id=f"call-{seq}"))
    assert len(batch._bases) <= logs._BASES_PER_BATCH
    assert [record.agentix_call_id for record in handler.records] == [f"call-{seq}" for seq in range(1, 301)]


async def test_a_custom_record_factory_is_used(capture):
    from agentix.runtime.client.logs import RecordBatch

    class Tagged(logging.LogRecord):
        pass

    saved = logging.getLogRecordFactory()
    logging.setLogRecordFactory(Tagged)
    try:
        handler = capture("sandbox.test")
        RecordBatch().replay(_WIRE_RECORDS[0])
    finally:
        logging.setLogRecordFactory(saved)
    assert type(handler.records[0]) is Tagged


# ── sandbox-chosen names, levels and extras are bounded (issue 17, item 1) ──

# Replays the records `make_records(**params)` yields in a fresh interpreter
# (the logger limit is per process) under an address-space limit, so code
# that grows without bound fails with MemoryError instead of taking the
# machine; prints the figures as JSON.
_CHILD = r"""
import gc, json, logging, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from agentix.runtime.client import logs
from agentix.runtime.v1 import runtime_pb2 as pb

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

class Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.count, self.first, self.by_logger = 0, None, {}
    def emit(self, record):
        self.count += 1
        self.first = self.first or (record.name, getattr(record, "agentix_logger", None), record.getMessage())
        self.by_logger[record.name] = self.by_logger.get(record.name, 0) + 1

kept, warnings = Keep(), Keep()
root = logging.getLogger()
root.setLevel(logging.INFO)
root.addHandler(kept)
logging.getLogger("agentix.runtime.client").addHandler(warnings)
logging.getLogger("agentix.runtime.client").propagate = False
names = json.loads(sys.stdin.read())
logging.getLogger(logs.FALLBACK_LOGGER)  # the fallback exists before the figures are taken
gc.collect()
loggers_before, rss_before, started = len(logging.Logger.manager.loggerDict), rss(), time.monotonic()
for batch_start in range(0, len(names), 1000):
    replay = logs.RecordBatch().replay
    for i, name in enumerate(names[batch_start:batch_start + 1000], batch_start):
        if name.startswith("*"):  # "*<parts>": that many dotted parts
            name = ".".join(["a"] * int(name[1:]))
        replay(pb.LogRecord(seq=i + 1, logger=name, level=logging.WARNING, message=f"m{i}",
                            time_unix_nanos=1_700_000_000_000_000_000))
after = logs.RecordBatch().replay
after(pb.LogRecord(seq=len(names) + 1, logger="agentix.sandbox.later", level=logging.WARNING, message="later",
                   time_unix_nanos=1_700_000_000_000_000_000))
gc.collect()
print(json.dumps({
    "seconds": time.monotonic() - started,
    "logger_dict_growth": len(logging.Logger.manager.loggerDict) - loggers_before,
    "cache": len(logs._loggers),
    "rss_growth": rss() - rss_before,
    "replayed": kept.count,
    "first": kept.first,
    "by_logger": {k: v for k, v in kept.by_logger.items() if not k.startswith("n.")},
    "warnings": warnings.count,
    "counts": logs.replay_counts(),
}))
"""


def _replay_in_child(names: list[str], address_space: int = 2 << 30, timeout: float = 120) -> dict:
    """Runs _CHILD over `names` ("*N": a name of N dotted parts, made in the child)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop("AGENTIX_MAX_SANDBOX_LOGGERS", None)
    env.pop("LD_PRELOAD", None)  # a sanitizer runtime cannot map its shadow under RLIMIT_AS
    done = subprocess.run([sys.executable, "-c", with_stub_paths(_CHILD), str(address_space)], input=json.dumps(names),
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"the replaying host failed ({done.returncode}): {done.stderr[-2000:]}"
    return json.loads(done.stdout.splitlines()[-1])


async def test_a_200kb_dotted_logger_name_creates_no_loggers_and_is_replayed_under_the_fallback():
    from agentix.runtime.client.logs import FALLBACK_LOGGER, MAX_LOGGER_NAME_CHARS

    # 100,000 parts, 200 KB: stdlib getLogger would make a placeholder per
    # prefix (~10 GB; the child's 2 GiB address space fails first on old code).
    parts = 100_000
    figures = _replay_in_child([f"*{parts}", f"*{parts}", "fine.name"])
    assert figures["seconds"] < 20
    assert figures["replayed"] == 4  # both huge-name records, the valid one, the later one
    name, sandbox_name, message = figures["first"]
    assert (name, message) == (FALLBACK_LOGGER, "m0")
    assert sandbox_name == ".".join(["a"] * parts)[:MAX_LOGGER_NAME_CHARS]
    assert figures["by_logger"] == {FALLBACK_LOGGER: 2, "fine.name": 1, "agentix.sandbox.later": 1}
    # fine.name and agentix.sandbox.later (+ its placeholder parent at most).
    assert figures["logger_dict_growth"] <= 4
    assert figures["rss_growth"] < 20 << 20
    assert figures["warnings"] == 1  # once, not per record
    assert figures["counts"]["fallback_invalid"] == 2


async def test_200k_distinct_logger_names_create_at_most_the_limit_of_host_loggers():
    from agentix.runtime.client.logs import DEFAULT_MAX_SANDBOX_LOGGERS, FALLBACK_LOGGER

    figures = _replay_in_child([f"n.{i}" for i in range(200_000)])
    limit = DEFAULT_MAX_SANDBOX_LOGGERS
    assert figures["replayed"] == 200_001  # every record arrives
    # The first `limit` names got their loggers (and "n" its one
    # placeholder); the rest, and the later record's new name, the fallback.
    assert figures["logger_dict_growth"] == limit + 1  # old code: 200,002
    assert figures["rss_growth"] < 40 << 20  # old code: ~300 MiB kept
    assert figures["cache"] <= limit
    assert figures["by_logger"] == {FALLBACK_LOGGER: 200_000 - limit + 1}
    assert figures["counts"] == {"loggers_created": limit, "fallback_invalid": 0,
                                 "fallback_limit": 200_000 - limit + 1}
    assert figures["warnings"] == 1


@pytest.mark.parametrize(
    "name",
    [
        "x" * 201,
        ".".join(["p"] * 17),
        "a..b",
        ".lead",
        "trail.",
        "bad\nname",
        "tab\tname",
        "nul\x00name",
    ],
    ids=["long", "17-parts", "empty-part", "leading-dot", "trailing-dot", "newline", "tab", "nul"],
)
async def test_a_name_the_host_does_not_take_is_replayed_under_the_fallback(capture, name):
    from agentix.runtime.client import logs

    fallback = capture(logs.FALLBACK_LOGGER)
    before = set(logging.Logger.manager.loggerDict)
    counts = logs.replay_counts()
    logs.RecordBatch().replay(log_record(1, "odd", logger=name, time_unix_nanos=1))
    assert set(logging.Logger.manager.loggerDict) == before
    (record,) = fallback.records
    assert record.getMessage() == "odd"
    assert record.agentix_logger == name[: logs.MAX_LOGGER_NAME_CHARS]
    assert logs.replay_counts()["fallback_invalid"] == counts["fallback_invalid"] + 1
    assert logs.replay_counts()["loggers_created"] == counts["loggers_created"]


@pytest.mark.parametrize("name", ["x" * 200, ".".join(["p"] * 16), "ünïcode.name with space"])
async def test_names_within_the_bounds_keep_their_logger(capture, name):
    from agentix.runtime.client import logs

    assert logs.valid_logger_name(name)
    handler = capture(name)  # the host's own logger: used whatever the limit
    logs.RecordBatch().replay(log_record(1, "kept", logger=name, time_unix_nanos=1))
    (record,) = handler.records
    assert (record.name, record.agentix_logger) == (name, name)


async def test_the_logger_limit_is_configurable(monkeypatch):
    from agentix.runtime.client import logs

    with pytest.raises(ValueError):
        logs.set_max_sandbox_loggers(-1)
    monkeypatch.setattr(logs, "_max_loggers", logs.max_sandbox_loggers())
    logs.set_max_sandbox_loggers(5)
    assert logs.max_sandbox_loggers() == 5
    monkeypatch.setenv("AGENTIX_MAX_SANDBOX_LOGGERS", "12")
    assert logs._max_loggers_from_env() == 12
    monkeypatch.setenv("AGENTIX_MAX_SANDBOX_LOGGERS", "lots")
    assert logs._max_loggers_from_env() == logs.DEFAULT_MAX_SANDBOX_LOGGERS


async def test_distinct_levels_do_not_grow_the_loggers_level_cache(capture):
    from agentix.runtime.client.logs import RecordBatch

    handler = capture("sandbox.levels", level=logging.INFO)
    logger = logging.getLogger("sandbox.levels")
    replay = RecordBatch().replay
    for i in range(20_000):
        replay(log_record(i + 1, f"level {i}", logger="sandbox.levels", level=1000 + i, time_unix_nanos=1))
    replay(log_record(30_000, "negative", logger="sandbox.levels", level=-5, time_unix_nanos=1))
    replay(log_record(30_001, "low", logger="sandbox.levels", level=5, time_unix_nanos=1))
    assert len(handler.records) == 20_000  # every high level passes INFO, -5 and 5 do not
    assert len(logger._cache) <= 101


async def test_oversized_extras_are_dropped_not_decoded(capture):
    from agentix.runtime.client.logs import MAX_EXTRAS_BYTES, RecordBatch

    handler = capture("sandbox.extras")
    # 200,000 empty maps in one array: 200 KB that decode to ~13 MB of dicts.
    bomb = msgpack.packb({"bomb": [{}] * 200_000})
    assert len(bomb) > MAX_EXTRAS_BYTES
    small = msgpack.packb({"fine": [1, 2]})
    RecordBatch().replay(log_record(1, "bomb", logger="sandbox.extras", extras=bomb, time_unix_nanos=1))
    RecordBatch().replay(log_record(2, "small", logger="sandbox.extras", extras=small, time_unix_nanos=1))
    bombed, fine = handler.records
    assert bombed.getMessage() == "bomb" and not hasattr(bombed, "bomb")
    assert fine.fine == [1, 2]


async def test_long_file_paths_are_not_kept_by_the_path_cache(capture):
    from agentix.runtime.client import logs

    handler = capture("sandbox.paths")
    replay = logs.RecordBatch().replay
    for i in range(1000):
        replay(log_record(i + 1, "p", logger="sandbox.paths", file=f"/{i}/" + "d" * 20_000 + "/mod.py",
                          time_unix_nanos=1))
    assert len(handler.records) == 1000 and handler.records[-1].filename == "mod.py"
    assert sum(map(len, logs._file_parts)) <= logs._FILE_PARTS_MAX * logs._FILE_PART_CHARS
    assert all(len(path) <= logs._FILE_PART_CHARS for path in logs._file_parts)
