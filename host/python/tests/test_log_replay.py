"""The native log replayer (``_native_calls.LogReplayer``,
host/python/native/log_replay.h): it replays a batch's records as
``RecordBatch.replay`` does (the same records, attribute for attribute and in
order, to the same handlers), and hands every record its C path does not take
to ``replay`` before anything of its replay has run."""

import logging

import pytest

from agentix.runtime.client import logs
from agentix.runtime.client._native_calls import LogRecordFields, LogReplayer, log_records
from agentix.runtime.v1 import runtime_pb2 as pb
from fake_runtime import log_record

_T = 1_764_670_000_123_456_789

# Records of the shapes replay meets, on two loggers: repeated places and ids
# (one base reused), each keyed field changed in turn, texts, a level the host
# has no name for, and records the C path leaves to replay (extras, no time,
# a level past the cached ones, a level below the logger's).
_RECORDS = [
    log_record(1, "first", logger="replay.a", time_unix_nanos=_T, file="/app/a.py", line=1, function="f",
               worker_id="w1", call_id="c1", context="ctx"),
    log_record(2, "same place", logger="replay.a", time_unix_nanos=_T + 1_500_000, file="/app/a.py", line=2,
               function="f", worker_id="w1", call_id="c1", context="ctx"),
    log_record(3, "other call", logger="replay.a", time_unix_nanos=_T + 2_000_000_001, file="/app/a.py",
               line=2, function="f", worker_id="w1", call_id="c2", context="ctx"),
    log_record(4, "texts", logger="replay.b", level=logging.ERROR, level_name="ERROR", time_unix_nanos=7,
               file="/app/b.py", module="bee", exception_text="Traceback\nValueError: x",
               stack_info="Stack (most recent call last):", origin=pb.LOG_ORIGIN_STDERR),
    log_record(5, "unnamed level", logger="replay.b", level=27, level_name="NOTICE", time_unix_nanos=_T,
               file="", origin=pb.LOG_ORIGIN_STDOUT),
    log_record(6, "extras", logger="replay.a", time_unix_nanos=_T, extras=b"\x81\xa1k\x01"),
    log_record(7, "no time", logger="replay.a"),
    log_record(8, "uncached level", logger="replay.a", level=150, level_name="HIGH", time_unix_nanos=_T),
    log_record(9, "below the level", logger="replay.b", level=logging.DEBUG, level_name="DEBUG",
               time_unix_nanos=_T),
    log_record(10, "last", logger="replay.a", time_unix_nanos=_T + 3, file="/app/a.py", line=9, function="f",
               worker_id="w1", call_id="c2", context="ctx"),
]
# What the C path leaves to replay once the loggers are known.
_DECLINED = {"extras", "no time", "uncached level"}


def _fields(records):
    response = pb.LogsResponse(instance_id="i", records=records)
    instance_id, items = log_records(response.SerializeToString())
    return items


class _Keep(logging.Handler):
    def __init__(self, kept, level=logging.NOTSET):
        super().__init__(level)
        self.kept = kept

    def emit(self, record):
        self.kept.append((self.name, dict(vars(record)), type(record)))


@pytest.fixture
def loggers():
    """Loggers replay.a (level 1) and replay.b (INFO), each with a keeping handler; replay.b's parent
    `replay` has one too (propagation)."""
    kept = []
    made = []
    for name, level in (("replay.a", 1), ("replay.b", logging.INFO), ("replay", logging.INFO)):
        logger = logging.getLogger(name)
        handler = _Keep(kept)
        handler.name = name
        made.append((logger, handler, logger.level, logger.propagate))
        logger.setLevel(level)
        logger.propagate = name == "replay.b"
        logger.addHandler(handler)
    yield kept
    for logger, handler, level, propagate in made:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _replay_both(items, kept):
    """What RecordBatch.replay and the batch's LogReplayer hand the handlers for `items`, and the
    records LogReplayer left to replay."""
    batch = logs.RecordBatch()
    for item in items:  # once through replay, so both paths find the loggers known
        batch.replay(item)
    kept.clear()
    for item in items:
        batch.replay(item)
    by_replay = list(kept)
    kept.clear()
    declined = []
    original = logs.RecordBatch.replay

    def counting(self, record):
        declined.append(record.message)
        original(self, record)

    logs.RecordBatch.replay = counting
    try:
        replayer = batch.replayer()
    finally:
        logs.RecordBatch.replay = original
    assert type(replayer) is LogReplayer
    for item in items:
        replayer(item)
    return by_replay, list(kept), declined


def test_the_native_replayer_makes_the_records_replay_makes(loggers):
    by_replay, by_native, declined = _replay_both(_fields(_RECORDS), loggers)
    assert set(declined) == _DECLINED
    # Same handlers in the same order, same records: every attribute, its
    # value and type, and the attributes' order (relativeCreated exactly:
    # one batch, one template).
    assert [name for name, _, _ in by_native] == [name for name, _, _ in by_replay]
    assert len(by_native) == 11  # record 9 is below replay.b's level; replay.b propagates to replay
    for (_, got, got_type), (_, want, want_type) in zip(by_native, by_replay):
        assert got_type is want_type is logging.LogRecord
        assert list(got) == list(want)
        clock = {"created", "msecs", "relativeCreated"} if want["msg"] == "no time" else set()
        if want["msg"] == "extras":  # makeRecord's path: relativeCreated from the host's clock too
            assert got.pop("relativeCreated") == pytest.approx(want.pop("relativeCreated"))
        for key in want:
            assert key in clock or got[key] == want[key] and type(got[key]) is type(want[key]), key
    assert [record["msg"] for _, record, _ in by_native if record["msg"] == "texts"] == ["texts", "texts"]


def test_protobuf_records_and_unknown_loggers_take_replay(loggers):
    batch = logs.RecordBatch()
    replayer = batch.replayer()
    # A logger not known yet: replay finds (or makes) it, as the first record of a stream does.
    replayer(_fields([log_record(1, "new name", logger="replay.a.fresh", time_unix_nanos=_T)])[0])
    replayer(log_record(2, "protobuf's", logger="replay.a", time_unix_nanos=_T))
    # Fields objects made by hand with items of other types: replay's, whatever it makes of them.
    odd = list(_fields([log_record(3, "odd", logger="replay.a", time_unix_nanos=_T)])[0])
    odd[5] = 1.5e18  # time_unix_nanos as a float
    replayer(LogRecordFields(odd))
    assert "replay.a.fresh" in logs._loggers
    assert [record["msg"] for _, record, _ in loggers] == ["new name", "protobuf's", "odd"]  # (propagated)
    assert loggers[-1][1]["created"] == 1.5e9


class _Counting(logging.Logger):
    """A logger class that keeps its own isEnabledFor and makeRecord, counting their calls."""

    calls: list[str] = []

    def isEnabledFor(self, level):
        self.calls.append("isEnabledFor")
        return super().isEnabledFor(level)

    def makeRecord(self, *args, **kwargs):
        self.calls.append("makeRecord")
        return super().makeRecord(*args, **kwargs)


@pytest.fixture
def counting_logger():
    manager = logging.Logger.manager
    name = "replay.counting"
    logger = _Counting(name)
    logger.parent = logging.getLogger()
    manager.loggerDict[name] = logger
    kept = []
    logger.addHandler(_Keep(kept))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    _Counting.calls.clear()
    yield logger, kept
    del manager.loggerDict[name]
    logs._loggers.pop(name, None)


def test_a_logger_class_of_its_own_is_asked_once_per_record(counting_logger):
    logger, kept = counting_logger
    items = _fields([log_record(seq, f"m{seq}", logger=logger.name, time_unix_nanos=_T, extras=extras)
                     for seq, extras in ((1, b""), (2, b""), (3, b"\x80"))])
    replayer = logs.RecordBatch().replayer()
    for item in items:
        replayer(item)
    # Its own makeRecord makes every record (replay's makeRecord path), and
    # isEnabledFor runs once per record whichever path took it.
    assert _Counting.calls == ["isEnabledFor", "makeRecord"] * 3
    assert [record["msg"] for _, record, _ in kept] == ["m1", "m2", "m3"]


def test_handle_filters_disabled_loggers_and_raising_handlers(loggers):
    logger = logging.getLogger("replay.a")
    items = _fields([log_record(seq, f"m{seq}", logger="replay.a", time_unix_nanos=_T) for seq in (1, 2, 3, 4)])
    replayer = logs.RecordBatch().replayer()
    replayer(items[0])  # known from here on
    seen = []

    def refuse(record):
        seen.append(record.getMessage())
        return False

    logger.addFilter(refuse)
    try:
        replayer(items[1])
    finally:
        logger.removeFilter(refuse)
    logger.disabled = True
    try:
        replayer(items[2])
    finally:
        logger.disabled = False

    class Raising(logging.Handler):
        def emit(self, record):
            raise RuntimeError(f"refused {record.getMessage()}")

    raising = Raising()
    logger.addHandler(raising)
    try:
        with pytest.raises(RuntimeError, match="refused m4"):
            replayer(items[3])
    finally:
        logger.removeHandler(raising)
    assert seen == ["m2"]
    assert [record["msg"] for _, record, _ in loggers] == ["m1", "m4"]


def test_the_stream_replays_through_the_native_replayer():
    assert type(logs.LogsStream._batch_replayer(None)) is LogReplayer
