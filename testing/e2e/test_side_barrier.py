"""A call's side output before its result (the side-channel barrier,
docs/RELIABILITY.md): every log record, output line and span a call emitted
before it returned or raised has been handed to the host's logging tree and
trace processors when `remote()` returns or raises, and when `remote_stream`
yields the item that follows it. No waiting or polling in these tests: each
check runs the moment the call returns."""

import logging

import pytest

import barrier_targets as t
from agentix import RemoteCallError, RuntimeClient, trace

pytestmark = pytest.mark.asyncio


class Seen(logging.Handler):
    """The messages the host's logging tree has handled, by logger."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = set()

    def emit(self, record):
        self.messages.add((record.name, record.getMessage()))


@pytest.fixture
def seen():
    handler = Seen()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old_level)


async def test_records_and_prints_are_replayed_before_remote_returns(client, seen):
    missing = []
    for i in range(1000):
        assert await client.remote(t.log_print_return, i) == i
        for expected in ((t.LOGGER, f"record {i}"), ("agentix.sandbox.stdout", f"line {i}")):
            if expected not in seen.messages:
                missing.append(expected)
    assert missing == []


async def test_records_are_replayed_before_remote_raises(client, seen):
    missing = []
    for i in range(200):
        with pytest.raises(RemoteCallError, match=f"failed {i}"):
            await client.remote(t.log_then_raise, i)
        if (t.LOGGER, f"failing {i}") not in seen.messages:
            missing.append(i)
    assert missing == []


async def test_fd_level_and_child_output_is_replayed_before_remote_returns(client, seen):
    missing = []
    for i in range(50):
        assert await client.remote(t.fd_output_return, i) == i
        for expected in (f"fd-line {i}", f"child-line {i}"):
            if ("agentix.sandbox.stdout", expected) not in seen.messages:
                missing.append(expected)
    assert missing == []


class Ended(trace.Processor):
    def __init__(self):
        self.names = set()

    def on_span_end(self, span):
        self.names.add(span.name)


async def test_spans_reach_processors_before_remote_returns(client):
    ended = Ended()
    trace.add_processor(ended)
    try:
        missing = []
        for i in range(200):
            assert await client.remote(t.span_return, i) == i
            if f"barrier-span-{i}" not in ended.names:
                missing.append(i)
        assert missing == []
    finally:
        trace.remove_processor(ended)


async def test_stream_items_follow_the_records_logged_before_them(client, seen):
    missing = []
    async for i in client.remote_stream(t.log_each_item, 100):
        for expected in ((t.LOGGER, f"item {i}"), ("agentix.sandbox.stdout", f"item-line {i}")):
            if expected not in seen.messages:
                missing.append(expected)
    assert missing == []


async def test_calls_that_log_nothing_carry_no_barrier(client, seen):
    # Another call's output keeps flowing: a silent call does not wait for it.
    from agentix.runtime.client.stream import PendingCall

    settled = []
    original = PendingCall.settle

    def settle(self, outcome):
        settled.append(self.barrier)
        original(self, outcome)

    PendingCall.settle = settle
    try:
        for i in range(20):
            assert await client.remote(t.nothing, i) == i
    finally:
        PendingCall.settle = original
    assert settled == [None] * 20
