"""A call's side output before its result (the side-channel barrier,
docs/RELIABILITY.md): every log record, output line and span a call emitted
before it returned or raised has been handed to the host's logging tree and
trace processors when `remote()` returns or raises, and when `remote_stream`
yields the item that follows it. No waiting or polling in these tests: each
check runs the moment the call returns."""

import logging

import pytest

import barrier_targets as t
from conftest import on_root_logger, relayed_or_direct
from agentix import RemoteCallError, RuntimeClient, trace

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=["relayed", "direct"])
def daemon(request, start_daemon, monkeypatch):
    """Each test against the relayed path and against direct calls."""
    yield from relayed_or_direct(request.param, start_daemon, monkeypatch)


class Seen(logging.Handler):
    """The messages the host's logging tree has handled, by logger."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = set()

    def emit(self, record):
        self.messages.add((record.name, record.getMessage()))


@pytest.fixture
def seen():
    with on_root_logger(Seen()) as handler:
        yield handler


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

    def settle(self, outcome, *rest):
        settled.append(self.barrier)
        original(self, outcome, *rest)

    PendingCall.settle = settle
    try:
        for i in range(20):
            assert await client.remote(t.nothing, i) == i
    finally:
        PendingCall.settle = original
    assert settled == [None] * 20


# ---- nothing lost, nothing doubled (issue 18 item 2) ------------------------


class Lines(logging.Handler):
    """Every message handled, in order (duplicates kept)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append((record.name, record.getMessage()))


@pytest.fixture
def lines():
    with on_root_logger(Lines()) as handler:
        yield handler


async def test_two_clients_in_one_process_print_each_line_once(daemon, lines):
    async with RuntimeClient(daemon.url) as a, RuntimeClient(daemon.url) as b:
        for i in range(20):
            await a.remote(t.log_print_return, i)
            await b.remote(t.log_print_return, 100 + i)
        # Records of no call go to both clients: replayed once here too.
        await a.remote(t.log_outside_calls, 5, "e2e.outside")
        await b.remote(t.nothing, 0)
    printed = [m for name, m in lines.messages if name == "agentix.sandbox.stdout"]
    assert sorted(printed) == sorted({f"line {i}" for i in [*range(20), *range(100, 120)]})
    outside = [m for name, m in lines.messages if name == "e2e.outside"]
    assert outside == [f"record {i}" for i in range(5)]


SECOND_PROCESS = r"""
import asyncio, json, logging, sys
from agentix import RuntimeClient

class Keep(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())

async def main():
    keep = Keep()
    logging.getLogger().addHandler(keep)
    logging.getLogger().setLevel(logging.DEBUG)
    async with RuntimeClient(sys.argv[1]) as client:
        await client.health()
        await client.remote(__import__("barrier_targets").nothing, 1)
        await asyncio.sleep(0.5)
    print(json.dumps(keep.messages))

asyncio.run(main())
"""


async def test_a_second_host_process_gets_none_of_the_first_ones_call_records(daemon, tmp_path):
    import json
    import subprocess
    import sys

    from conftest import TARGETS_DIR

    # The first client makes calls and leaves without acknowledging (logs off):
    # their records were its own, and stay so.
    async with RuntimeClient(daemon.url, logs=False) as first:
        for i in range(30):
            await first.remote(t.log_print_return, i)
    script = tmp_path / "second.py"
    script.write_text(SECOND_PROCESS)
    out = subprocess.run(
        [sys.executable, str(script), daemon.url],
        capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(TARGETS_DIR)},
    )
    assert out.returncode == 0, out.stderr
    messages = json.loads(out.stdout.strip().splitlines()[-1])
    assert not [m for m in messages if m.startswith(("record ", "line "))], messages


async def test_closing_right_after_a_call_delivers_its_records(daemon, seen):
    for i in range(20):
        async with RuntimeClient(daemon.url) as c:
            await c.remote(t.log_print_return, i)
        assert (t.LOGGER, f"record {i}") in seen.messages
        assert ("agentix.sandbox.stdout", f"line {i}") in seen.messages


async def test_close_delivers_output_of_no_call_emitted_before_it(daemon, lines):
    async with RuntimeClient(daemon.url) as c:
        await c.remote(t.log_outside_calls, 3, "e2e.bg")
    assert [m for name, m in lines.messages if name == "e2e.bg"] == [f"record {i}" for i in range(3)]


DEFAULT_HANDLER = r"""
import asyncio, sys
from agentix import RuntimeClient
import barrier_targets as t

async def main():
    async with RuntimeClient(sys.argv[1]) as client:
        await client.remote(t.log_print_return, 7)

asyncio.run(main())
"""


@pytest.mark.parametrize("opt_out", [False, True])
async def test_print_output_appears_without_logging_configured(daemon, tmp_path, opt_out):
    import os
    import subprocess
    import sys

    from conftest import TARGETS_DIR

    script = tmp_path / "plain.py"
    script.write_text(DEFAULT_HANDLER)
    env = {**os.environ, "PYTHONPATH": str(TARGETS_DIR)}
    if opt_out:
        env["AGENTIX_SANDBOX_LOG_HANDLER"] = "0"
    out = subprocess.run([sys.executable, str(script), daemon.url], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    shown = [line for line in out.stderr.splitlines() if "[agentix.sandbox.stdout] line 7" in line]
    assert shown == ([] if opt_out else [shown[0]] if shown else ["<missing>"])
    if not opt_out:
        assert len(shown) == 1
