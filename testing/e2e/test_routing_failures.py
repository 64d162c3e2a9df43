"""An exception the host raises while it handles a Calls response (a host
bug, or an event it cannot use) ends the call it belongs to with a typed
error, at once, on every wire (docs/RELIABILITY.md, "Host-side failures"):
it never drops the stream into a reconnect that resumes the call, has the
daemon replay the same event and fails the same way again (a call that
hung for ever). What belongs to no one call fails the stream's calls
instead of resuming them."""

import asyncio
import logging

import pytest

import e2e_targets as t
from raw_stream import RawStream

from agentix import RuntimeClient
from agentix.runtime.client import routing, wire
from agentix.runtime.client.errors import RemoteCallError, RuntimeUnreachable
from agentix.runtime.client.frames import FrameCallsStream
from agentix.runtime.client.pending import PendingCall
from agentix.runtime.client.stream import CallsStream, NativeCallsStream
from agentix.runtime.v1 import runtime_pb2 as pb

POISON = "poison-0c1b"
STREAM_TYPES = {"frames": FrameCallsStream, "native": NativeCallsStream, "aio": CallsStream}


class Injected(Exception):
    """The exception the tests make the host raise."""


@pytest.fixture(params=list(STREAM_TYPES))
def wire_kind(request, monkeypatch):
    """Each of the Calls stream's three carriers: the frame wire (the default
    on a Unix socket), the native grpc++ transport, and grpc.aio."""
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames" if request.param == "frames" else "grpc")
    monkeypatch.setenv("AGENTIX_NATIVE_TRANSPORT", "0" if request.param == "aio" else "1")
    return request.param


@pytest.fixture
def errors(caplog):
    caplog.set_level(logging.ERROR, logger="agentix.runtime.client")
    return lambda: [r for r in caplog.records if r.name == "agentix.runtime.client" and r.levelno == logging.ERROR]


def poisoned(value) -> bool:
    data = value if isinstance(value, bytes | memoryview) else b"".join(value)
    return POISON.encode() in bytes(data)


async def assert_acknowledged(daemon, client, call_id):
    """The daemon no longer holds the call's result: the host acknowledged
    it (a resume by the same client would otherwise replay it). The probe is
    a second, gRPC connection of the client: with --direct_calls it takes the
    client's calls back from the worker (docs/DIRECT-CALLS.md, the collapse),
    which ends the host's direct connection and the host reconnects; so the
    callers check their stream's identity before it."""
    assert await client.remote(t.add, 1, 2) == 3  # acks ride along with the next write
    await asyncio.sleep(0.2)  # and the ack timer (50 ms) has fired
    assert await client.remote(t.add, 2, 2) == 4
    raw = RawStream(daemon.url, client.client_id)
    try:
        await raw.send(pb.HostEvent(resume=pb.ResumeCalls(call_ids=[call_id])))
        event = await raw.terminal(call_id)
        assert event.WhichOneof("kind") == "error" and event.error.error.type == "ResultUnavailable", event
    finally:
        await raw.close()


async def run_with_poison(client):
    """One poisoned call among 20 good ones in flight together; returns the
    poisoned call's exception and the good calls' results."""
    good = [asyncio.ensure_future(client.remote(t.echo, i)) for i in range(20)]
    bad = asyncio.ensure_future(client.remote(t.echo, POISON))
    results = await asyncio.wait_for(asyncio.gather(*good), 20)
    done, _ = await asyncio.wait([bad], timeout=20)
    assert done, "the poisoned call never ended"
    return bad.exception(), results


async def test_a_result_whose_settling_raises_fails_that_call_and_nothing_else(
        daemon, wire_kind, monkeypatch, errors):
    original = PendingCall.settle
    failed_ids = []

    def settle(self, outcome, *rest):
        if isinstance(outcome, bytes | list) and poisoned(outcome):
            failed_ids.append(self.call_id)
            raise Injected("settle")
        return original(self, outcome, *rest)

    monkeypatch.setattr(PendingCall, "settle", settle)
    async with RuntimeClient(daemon.url) as client:
        stream = client._stream
        assert type(stream) is STREAM_TYPES[wire_kind]
        error, results = await run_with_poison(client)
        assert results == list(range(20))
        [call_id] = failed_ids
        assert type(error) is RemoteCallError and error.error.type == "MalformedError"
        assert call_id in str(error) and "result" in str(error) and "Injected: settle" in str(error)
        assert type(error.__cause__) is Injected
        assert client._stream is stream and stream.alive  # not dropped, not reconnected
        assert client._pending_call_ids() == []
        logged = errors()
        assert len(logged) == 1 and call_id in logged[0].getMessage() and logged[0].exc_info[1] is error.__cause__
        await assert_acknowledged(daemon, client, call_id)
        assert failed_ids == [call_id]  # not replayed, even after a collapse's reconnect


async def test_a_result_whose_decoding_raises_fails_that_call_and_nothing_else(
        daemon, wire_kind, monkeypatch, errors):
    original = CallsStream._result_outcome
    failed_ids = []

    def result_outcome(self, result, call_id):
        if poisoned(result.value):
            failed_ids.append(call_id)
            raise Injected("decode")
        return original(self, result, call_id)

    monkeypatch.setattr(CallsStream, "_result_outcome", result_outcome)
    # Plain results are settled inline (routing), where nothing decodes them: every result takes
    # the layered path here, whose decoding step is the one made to raise.
    monkeypatch.setattr(routing, "_RawResult", Injected)
    async with RuntimeClient(daemon.url) as client:
        stream = client._stream
        error, results = await run_with_poison(client)
        assert results == list(range(20))
        # Once: the event was neither resumed nor replayed.
        [call_id] = failed_ids
        assert type(error) is RemoteCallError and error.error.type == "MalformedError"
        assert call_id in str(error) and type(error.__cause__) is Injected
        assert client._stream is stream and stream.alive
        assert len(errors()) == 1
        await assert_acknowledged(daemon, client, call_id)
        # Later calls, sequential and concurrent, are unaffected.
        assert await asyncio.gather(*(client.remote(t.add, i, 1) for i in range(50))) == list(range(1, 51))
        assert failed_ids == [call_id]


async def test_a_stream_item_whose_handling_raises_fails_that_stream_only(daemon, wire_kind, monkeypatch, errors):
    original = PendingCall.__init__
    poisoned_calls = []

    class ExplodingQueue(asyncio.Queue):
        def put_nowait(self, item):
            if item is not None and isinstance(item, bytes | memoryview) and poisoned(item):
                raise Injected("stream item")
            super().put_nowait(item)

    def init(self, call_id, display_name, future, **kwargs):
        original(self, call_id, display_name, future, **kwargs)
        if self.items is not None and not poisoned_calls:
            poisoned_calls.append(call_id)
            self.items = ExplodingQueue()

    monkeypatch.setattr(PendingCall, "__init__", init)
    async with RuntimeClient(daemon.url) as client:
        stream = client._stream
        seen = []
        with pytest.raises(RemoteCallError) as info:
            async def consume():
                async for item in client.remote_stream(t.echo_items, [1, 2, POISON, 4]):
                    seen.append(item)
            await asyncio.wait_for(consume(), 20)
        assert seen == [1, 2]
        assert info.value.error.type == "MalformedError" and "stream_item" in str(info.value)
        assert poisoned_calls[0] in str(info.value) and type(info.value.__cause__) is Injected
        assert client._stream is stream and stream.alive
        assert [item async for item in client.remote_stream(t.echo_items, [5, 6])] == [5, 6]
        assert len(errors()) == 1


async def test_a_response_the_host_cannot_read_fails_the_streams_calls_instead_of_resuming_them(
        daemon, wire_kind, monkeypatch, errors):
    original = wire.parse_calls_response
    parsed_poison = []

    def parse(message):
        events = original(message)
        for event in events:
            value = event.value if type(event) is wire.RawResult else (
                event.result.value if type(event) is not wire.RawResultChunk and event.WhichOneof("kind") == "result"
                else b"")
            if poisoned(value):
                parsed_poison.append(1)
                raise Injected("parse")
        return events

    monkeypatch.setattr(wire, "parse_calls_response", parse)
    async with RuntimeClient(daemon.url) as client:
        stream = client._stream
        slow = asyncio.ensure_future(client.remote(t.blocking_sleep, 2))
        await asyncio.sleep(0.2)
        with pytest.raises(RuntimeUnreachable) as info:
            await asyncio.wait_for(client.remote(t.echo, POISON), 20)
        assert type(info.value.__cause__) is Injected and "dropped by the host" in str(info.value)
        with pytest.raises(RuntimeUnreachable):
            await asyncio.wait_for(slow, 20)
        assert parsed_poison == [1]  # read once: not resumed and replayed
        assert not stream.alive and client._pending_call_ids() == []
        assert len(errors()) == 1 and errors()[0].exc_info[1] is info.value.__cause__
        # The next call connects again.
        assert await client.remote(t.add, 1, 1) == 2
        assert client._stream is not stream and client._stream.alive


async def test_calls_failed_with_a_dropped_stream_are_freed_in_the_daemon_by_the_next_stream(
        daemon, wire_kind, monkeypatch, errors):
    # They used to stay retained (the finished one) or run on (the other)
    # until eviction: a resume by the same client still got their events.
    original = wire.parse_calls_response
    poisoned_ids = []

    def parse(message):
        events = original(message)
        for event in events:
            if type(event) is wire.RawResult and poisoned(event.value):
                poisoned_ids.append(event.call_id)
                raise Injected("parse")
            if type(event) is not wire.RawResultChunk and type(event) is not wire.RawResult \
                    and event.WhichOneof("kind") == "result" and poisoned(event.result.value):
                poisoned_ids.append(event.result.call_id)
                raise Injected("parse")
        return events

    monkeypatch.setattr(wire, "parse_calls_response", parse)
    async with RuntimeClient(daemon.url) as client:
        slow = asyncio.ensure_future(client.remote(t.blocking_sleep, 3))
        await asyncio.sleep(0.2)
        [slow_id] = client._pending_call_ids()
        with pytest.raises(RuntimeUnreachable):
            await asyncio.wait_for(client.remote(t.echo, POISON), 20)
        with pytest.raises(RuntimeUnreachable):
            await asyncio.wait_for(slow, 20)
        [poisoned_id] = poisoned_ids
        assert await client.remote(t.add, 1, 1) == 2  # the next stream: its first message frees them
        raw = RawStream(daemon.url, client.client_id)
        try:
            await raw.send(pb.HostEvent(resume=pb.ResumeCalls(call_ids=[poisoned_id, slow_id])))
            for call_id in (poisoned_id, slow_id):
                event = await raw.terminal(call_id, timeout=10)
                assert event.WhichOneof("kind") == "error" and event.error.error.type == "ResultUnavailable", event
        finally:
            await raw.close()
