"""The /log channel end to end: sandbox logging and captured output replayed
into the host's stdlib logging, attributed to their calls, nothing dropped
silently."""

import asyncio
import logging
import time

import pytest

import e2e_targets as t
from agentix import RuntimeClient
from conftest import on_root_logger, relayed_or_direct, wait_for

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=["relayed", "direct"])
def daemon(request, start_daemon, monkeypatch):
    """Each test against the relayed path and against direct calls."""
    yield from relayed_or_direct(request.param, start_daemon, monkeypatch)


async def test_logging_records_are_replayed_with_their_fields(client, collected):
    await client.remote(t.log_things, "tok1")
    await wait_for(lambda: len(collected.named("e2e.app")) >= 2)
    warned, failed = collected.named("e2e.app")[:2]
    assert warned.levelno == logging.WARNING
    assert warned.getMessage() == "warned tok1"
    assert warned.token == "tok1" and warned.n == 1
    assert warned.funcName == "log_things"
    assert warned.agentix_call_id
    assert failed.levelno == logging.ERROR
    assert "KeyError: 'tok1'" in failed.exc_text
    assert failed.agentix_call_id == warned.agentix_call_id
    assert not [r for r in collected.named("e2e.app") if "invisible" in r.getMessage()]
    await wait_for(lambda: len(collected.named("e2e.app")) >= 3)
    stacked = collected.named("e2e.app")[2]
    assert stacked.getMessage() == "stacked tok1"
    assert stacked.stack_info.startswith("Stack (most recent call last)")
    assert "log_things" in stacked.stack_info and not stacked.exc_text


async def test_stdout_stderr_and_child_process_output_arrive_as_records(client, collected):
    await client.remote(t.print_things, "tok2")
    def lines(name):
        return [r.getMessage() for r in collected.named(name)]
    await wait_for(lambda: "child-err tok2" in lines("agentix.sandbox.stderr")
                   and "child-out tok2" in lines("agentix.sandbox.stdout"))
    out = lines("agentix.sandbox.stdout")
    assert "printed tok2" in out and "raw tok2" in out and "child-out tok2" in out
    assert "child-err tok2" in lines("agentix.sandbox.stderr")


async def test_concurrent_calls_each_get_their_own_records(client, collected):
    tokens = [f"c{i}" for i in range(20)]
    assert await asyncio.gather(*(client.remote(t.log_and_print_async, k) for k in tokens)) == tokens
    await wait_for(lambda: len(collected.named("e2e.concurrent")) >= 20)
    call_of = {}
    for r in collected.named("e2e.concurrent"):
        token = r.getMessage().split()[-1]
        call_of[token] = r.agentix_call_id
    assert sorted(call_of) == sorted(tokens)
    assert len(set(call_of.values())) == 20  # one distinct call per token
    await wait_for(lambda: len({r.getMessage() for r in collected.named("agentix.sandbox.stdout")
                                if r.getMessage().startswith("print from")}) >= 20)
    printed = {r.getMessage().split()[-1]: r.agentix_call_id for r in collected.named("agentix.sandbox.stdout")
               if r.getMessage().startswith("print from")}
    assert printed == call_of  # each print attributed to the call that printed it


async def test_records_before_a_listener_are_kept_and_drops_are_reported(start_daemon, collected):
    import barrier_targets

    d = start_daemon(extra_args=["--log-buffer-records", "50"])
    async with RuntimeClient(d.url, logs=False) as quiet:
        # Records of no call (a call's own go to its client alone).
        assert await quiet.remote(barrier_targets.log_outside_calls, 120) == 120
    async with RuntimeClient(d.url) as listening:
        await listening.remote(t.add, 1, 1)
        await wait_for(lambda: any("were dropped" in r.getMessage() for r in collected.records))
        kept = [r.getMessage() for r in collected.named("e2e.many")]
        # The newest records survive, in order; the drop is reported once.
        assert kept and kept == sorted(kept, key=lambda m: int(m.split()[-1]))
        assert kept[-1] == "record 119"
        warnings = [r for r in collected.records if "were dropped" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


async def test_durable_log_file(start_daemon, tmp_path):
    log_dir = tmp_path / "agentix-logs"
    d = start_daemon(env={"AGENTIX_LOG_DIR": str(log_dir)})
    async with RuntimeClient(d.url) as c:
        await c.remote(t.print_things, "tok3")
        await c.remote(t.log_things, "tok3")
    await wait_for(lambda: any(log_dir.glob("sandbox-*.log")))
    (path,) = log_dir.glob("sandbox-*.log")
    await wait_for(lambda: "warned tok3" in path.read_text(errors="replace"))
    text = path.read_text(errors="replace")
    assert "printed tok3" in text and "child-err tok3" in text


async def test_agentix_log_level_lowers_the_sandbox_level(start_daemon, collected):
    from agentix import RuntimeClient

    d = start_daemon(env={"AGENTIX_LOG_LEVEL": "debug"})
    async with RuntimeClient(d.url) as c:
        await c.remote(t.log_things, "tok4")
        await wait_for(lambda: any(r.getMessage() == "invisible tok4" for r in collected.named("e2e.app")))


async def test_a_record_whose_message_cannot_be_formatted_arrives_with_the_error(client, collected):
    assert await client.remote(t.log_badly_formatted) == "logged"
    await wait_for(lambda: collected.named("e2e.badfmt"))
    (record,) = collected.named("e2e.badfmt")
    message = record.getMessage()
    assert message.startswith("value %d of %s [agentix: formatting the message failed: TypeError")
    assert "args=('not-a-number',)" in message


# The host of test_hostile_logger_names..., in its own process: the limit on
# the host loggers replay creates is per process, and its address space is
# limited so that unbounded growth fails with MemoryError instead of taking
# the machine. Prints its figures as JSON.
_HOST = r"""
import asyncio, gc, json, logging, resource, sys, time
sys.path.insert(0, sys.argv[3])
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import hostile_names
from agentix import RuntimeClient

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

def rss():
    return status("VmRSS")

class Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.by_name, self.huge, self.done, self.distinct = {}, None, False, 0
    def emit(self, record):
        message = record.getMessage()
        if not message.startswith(("huge name", "distinct", "done")):
            return
        self.by_name[record.name] = self.by_name.get(record.name, 0) + 1
        if message == "huge name":
            self.huge = (record.name, len(getattr(record, "agentix_logger", "")))
        elif message == "done":
            self.done = True
        else:
            self.distinct += 1

async def main():
    keep = Keep()
    root = logging.getLogger()
    root.addHandler(keep)
    root.setLevel(logging.INFO)
    async with RuntimeClient(sys.argv[1]) as client:
        assert await client.remote(hostile_names.add, 1, 2) == 3
        gc.collect()
        loggers_before, rss_before = len(logging.Logger.manager.loggerDict), rss()
        sent = await client.remote(hostile_names.log_hostile_names, 100_000, 3_000)
        deadline = time.monotonic() + 60
        while not keep.done and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        later = await client.remote(hostile_names.add, 2, 3)
        gc.collect()
        print(json.dumps({
            "sent": sent, "done": keep.done, "huge": keep.huge, "distinct": keep.distinct, "later": later,
            "by_name": {k: v for k, v in keep.by_name.items() if not k.startswith("e2e.distinct.")},
            "logger_dict_growth": len(logging.Logger.manager.loggerDict) - loggers_before,
            "rss_growth": rss() - rss_before, "vm_peak": status("VmPeak"),
        }))

asyncio.run(main())
"""


async def test_hostile_logger_names_are_bounded_on_the_host(daemon):
    # One record under a 200 KB name of 100,000 dotted parts (stdlib
    # getLogger: a placeholder per prefix, ~10 GB) and 3,000 distinct names
    # (a logger each, kept for good): the host creates at most its limit of
    # loggers, replays every record, and goes on serving.
    import json
    import subprocess
    import sys

    from pathlib import Path

    from agentix.runtime.client.logs import DEFAULT_MAX_SANDBOX_LOGGERS, FALLBACK_LOGGER, MAX_LOGGER_NAME_CHARS

    targets = Path(__file__).resolve().parents[1] / "fixtures" / "remote_targets"

    host = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOST, daemon.url, str(3 << 30), str(targets),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(host.communicate(), timeout=60)
    finally:
        if host.returncode is None:  # timed out (old code: still making placeholders)
            host.kill()
            await host.wait()
    assert host.returncode == 0, f"the host failed ({host.returncode}): {err.decode(errors='replace')[-3000:]}"
    figures = json.loads(out.decode().splitlines()[-1])
    print(figures)
    assert figures["done"] and figures["later"] == 5 and figures["sent"] == 3_002
    # The huge name arrived, under the fallback logger, its name cut.
    assert figures["huge"] == [FALLBACK_LOGGER, MAX_LOGGER_NAME_CHARS]
    assert figures["distinct"] == 3_000  # every record arrived
    limit = DEFAULT_MAX_SANDBOX_LOGGERS
    # The first `limit` names and the placeholders "e2e", "e2e.distinct";
    # the fallback logger (and "agentix.sandbox") — old code: 3,000 and more.
    assert figures["logger_dict_growth"] <= limit + 4
    # Past the limit, records go to the fallback (+ the huge one; "done" too
    # unless its logger was made before the limit was reached).
    assert set(figures["by_name"]) <= {FALLBACK_LOGGER, "e2e.hostile"}
    assert figures["by_name"][FALLBACK_LOGGER] >= 3_000 - limit + 1
    assert figures["rss_growth"] < 64 << 20


# The fields a worker does not set: the daemon numbers records and knows
# which worker sent them.
_DAEMON_FIELDS = {"seq", "worker_id"}


def _distinct_value(field):
    """A value for `field` (a LogRecord FieldDescriptor) unlike any default."""
    from google.protobuf.descriptor import FieldDescriptor as F

    from raw_stream import distinct_scalar

    assert field.label != F.LABEL_REPEATED and field.type != F.TYPE_MESSAGE, (
        f"LogRecord.{field.name}: give repeated/message fields a Python form in "
        "worker/channel/proto_fields.cc first")
    return distinct_scalar(field)


async def test_every_log_record_field_reaches_the_host_from_its_one_definition(daemon):
    """runtime.proto's LogRecord is the record's only schema: every field the
    worker may set, named as there, arrives on the host's Logs stream as sent
    (a field added to the message is covered with no change here)."""
    from agentix.runtime.v1 import runtime_pb2 as pb
    from raw_stream import first_item_emitted

    fields = {f.name: _distinct_value(f) for f in pb.LogRecord.DESCRIPTOR.fields if f.name not in _DAEMON_FIELDS}
    # call_id names no live call, so the record goes to every host stream.
    got = await first_item_emitted(
        daemon.url, "Logs", pb.LogsRequest(subscribe=pb.SubscribeLogs(after_seq=0)), "records",
        lambda record: record.message == fields["message"], t.send_log_fields, fields)
    assert got.seq > 0
    assert len(got.worker_id) == 8
    assert got == pb.LogRecord(seq=got.seq, worker_id=got.worker_id, **fields)


class SlowAtFirst(logging.Handler):
    """Collects the indexes of `logger`'s "big N ..." records; sleeps
    `stall` seconds on the first one (a host handler that blocks), which
    makes the host fall behind the sandbox's burst."""

    def __init__(self, logger, stall):
        super().__init__(logging.DEBUG)
        self.logger, self.stall = logger, stall
        self.indexes = []
        self.stalling = False  # inside the first record's sleep

    def emit(self, record):
        if record.name != self.logger:
            return
        if not self.indexes:
            self.stalling = True
            time.sleep(self.stall)
            self.stalling = False
        self.indexes.append(int(record.getMessage().split()[1]))


async def test_a_host_that_falls_behind_gets_every_record_of_the_burst_before_the_call_returns(daemon):
    import barrier_targets

    # 3,000 records of 8 KiB (24 MiB) while the host's first replay blocks
    # for 1 s (less than the 2 s a call's barrier waits without progress):
    # the host falls far past the daemon's 8 MiB of unwritten bytes per
    # stream, within its 10,000-record buffer. The daemon used to end the
    # stream (RESOURCE_EXHAUSTED): the call returned at once without most of
    # its records, which came with the next call or were lost.
    n = 3000
    with on_root_logger(SlowAtFirst("e2e.big", stall=1.0)) as slow:
        async with RuntimeClient(daemon.url) as c:
            await c.remote(t.add, 1, 1)  # the Logs stream is open
            assert await c.remote(barrier_targets.log_big_records, n, 8192) == n
            assert slow.indexes == list(range(n))  # every one, once, in order, before the result
            assert await c.remote(barrier_targets.log_big_records, 5, 10) == 5
            assert slow.indexes == list(range(n)) + list(range(5))  # the same stream goes on


async def _logs_subscriber_fits(url):
    """Whether the daemon accepts one more Logs subscriber now: a raw stream
    that subscribes past every seq and half-closes ends OK, or is refused
    with RESOURCE_EXHAUSTED (--max-log-subscribers)."""
    import grpc
    from agentix.runtime.v1 import runtime_pb2 as pb
    from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(url) as channel:
        call = pb_grpc.RuntimeServiceStub(channel).Logs(timeout=20)
        await call.write(pb.LogsRequest(subscribe=pb.SubscribeLogs(after_seq=1 << 40)))
        await call.done_writing()
        try:
            while (await call.read()) is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
            assert "--max-log-subscribers" in error.details()
            return False
        return True


async def test_a_paused_host_that_reads_nothing_is_ended_its_place_freed_and_it_loses_nothing_unreported(
        start_daemon, collected):
    import barrier_targets

    # One Logs subscriber place, a 1 s paused-subscriber timeout, a buffer of
    # 2,000 records. The host's handler blocks 6 s on the first of 6,000
    # records of 8 KiB (48 MiB): its stream is paused 8 MiB behind, reads
    # nothing, and is ended after 1 s with its connection still open. Before
    # stop 28 it kept its stream and the one place until the connection
    # went; and a host resubscribing was told every missing seq as dropped,
    # another client's included.
    d = start_daemon(extra_args=["--paused-subscriber-timeout-s", "1", "--max-log-subscribers", "1",
                                 "--log-buffer-records", "2000"])
    n = 6000
    with on_root_logger(SlowAtFirst("e2e.big", stall=6.0)) as slow:
        async with RuntimeClient(d.url) as c:
            await c.remote(t.add, 1, 1)  # the Logs stream is open
            # Its barrier gives up without progress (2 s): the host is stuck.
            assert await c.remote(barrier_targets.log_big_records, n, 8192) == n
            # While the host is still stuck, its place is freed.
            deadline = time.monotonic() + 20
            while not await _logs_subscriber_fits(d.url):
                assert time.monotonic() < deadline, "the paused subscriber's place was never freed"
                await asyncio.sleep(0.1)
            assert slow.stalling, "the place was freed only after the host read again"
            # Another client's records pass through the buffer meanwhile
            # (nobody of its own listens): they are no loss of this host's.
            async with RuntimeClient(d.url, logs=False, traces=False) as other:
                assert await other.remote(barrier_targets.log_big_records, 3000, 100, "e2e.other") == 3000
            # The host reads again: its stream's end is typed and says why.
            await wait_for(lambda: not slow.stalling, timeout=30)
            # (The ack writer's debug record of the same end can come first:
            # wait for the reader's warning itself.)
            def stream_ends():
                return [r for r in collected.named("agentix.runtime.client") if "stream lost" in r.getMessage()]

            await wait_for(stream_ends, timeout=30)
            ended = stream_ends()
            assert len(ended) == 1 and ended[0].levelno == logging.WARNING
            assert "RESOURCE_EXHAUSTED" in ended[0].getMessage()
            assert "--paused-subscriber-timeout-s" in ended[0].getMessage()
            # The next call re-opens the stream: the backlog and the drop
            # report; every record is received once, in order, or counted.

            def dropped():
                return sum(int(r.getMessage().split()[0]) for r in collected.named("agentix.sandbox")
                           if "sandbox log records were dropped" in r.getMessage())

            deadline = time.monotonic() + 30
            while len(slow.indexes) + dropped() < n:
                assert time.monotonic() < deadline, (len(slow.indexes), dropped())
                await c.remote(t.add, 1, 1)
                await asyncio.sleep(0.2)
            assert slow.indexes == sorted(set(slow.indexes))
            assert len(slow.indexes) + dropped() == n
            assert dropped() > 0  # the buffer could not keep them all
            assert not any(r.getMessage().startswith("at most") for r in collected.named("agentix.sandbox"))
            # The same stream goes on.
            assert await c.remote(barrier_targets.log_big_records, 5, 10) == 5
            assert slow.indexes[-5:] == list(range(5))
