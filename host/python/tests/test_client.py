"""RuntimeClient against an in-process fake of the RuntimeService contract."""

import asyncio
import logging
import os
import pickle
import tempfile
import time

import pytest
import pytest_asyncio

import sandbox_functions
from agentix import (
    CallCancelled,
    CallTimeout,
    Failed,
    Ok,
    RemoteCallError,
    RestrictedUnpickleError,
    RuntimeClient,
    RuntimeUnreachable,
    WorkerExited,
    context,
)
from agentix.runtime.client.frames import FrameCallsStream
from agentix.runtime.client.stream import BATCH_BYTES, CHUNK_BYTES, CallsStream, NativeCallsStream
from agentix.runtime.shared import safepickle
from agentix.runtime.v1 import runtime_pb2 as pb
from fake_runtime import FakeRuntime, error_event, eventually, result_events, serve

# Every test runs with the native Calls transport, with grpc.aio and on the frame wire.
pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("calls_transport")]
MiB = 1 << 20


@pytest_asyncio.fixture
async def client(runtime):
    client = RuntimeClient(runtime.url)
    yield client
    await client.close()


async def test_the_selected_transport_carries_the_calls(client, calls_transport):
    assert await client.remote(sandbox_functions.add, 2, 3) == 5
    expected = {"native": NativeCallsStream, "aio": CallsStream, "frames": FrameCallsStream}[calls_transport]
    assert type(client._stream) is expected


async def test_remote_returns_the_value(client):
    assert await client.remote(sandbox_functions.add, 2, b=3) == 5
    assert await client.remote(sandbox_functions.echo, {"k": [1, 2]}) == {"k": [1, 2]}


async def test_a_call_from_another_threads_loop_does_not_confuse_this_loops_calls(runtime, client):
    # remote() finds its loop without asyncio's getpid() (running_loop remembers the
    # last one): the loop another thread ran last must never stand in for this one.
    assert await client.remote(sandbox_functions.add, 1, 2) == 3

    async def on_the_other_loop():
        async with RuntimeClient(runtime.url) as other:
            return await other.remote(sandbox_functions.add, 10, 20)

    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, asyncio.run, on_the_other_loop()) == 30
    assert await client.remote(sandbox_functions.add, 100, 200) == 300


async def test_start_call_fields(runtime, client):
    await client.remote(sandbox_functions.add, 1, 2)
    (start,) = runtime.events("start")
    assert start.callable == "sandbox_functions::add"
    assert start.encoding == pb.ENCODING_PICKLE
    assert len(start.call_id) == 32 and int(start.call_id, 16) >= 0
    assert pickle.loads(start.arguments) == ((1, 2), {})
    assert start.arguments_size == len(start.arguments)
    assert start.context == b""


async def test_each_result_is_acknowledged(runtime, client):
    await client.remote(sandbox_functions.add, 1, 2)
    (start,) = runtime.events("start")
    await eventually(lambda: [a.call_id for a in runtime.events("ack")] == [start.call_id])


async def test_a_results_ack_rides_ahead_of_the_next_calls_start(runtime, client, monkeypatch):
    # Sequential calls: each StartCall's message also carries the previous
    # call's AckResult, ahead of it (no message of its own for the ack).
    monkeypatch.setattr("agentix.runtime.client.stream.ACK_DELAY", 60.0)
    for i in range(4):
        assert await client.remote(sandbox_functions.add, i, 1) == i + 1
    starts = runtime.events("start")
    with_starts = [r for r in runtime.requests if any(e.WhichOneof("kind") == "start" for e in r.events)]
    assert len(with_starts) == 4
    for previous, request in zip(starts, with_starts[1:]):
        assert [e.WhichOneof("kind") for e in request.events] == ["ack", "start"]
        assert request.events[0].ack.call_id == previous.call_id


async def test_concurrent_calls_are_coalesced_into_few_messages(runtime, client):
    async with client:
        results = await asyncio.gather(*(client.remote(sandbox_functions.add, i, 1) for i in range(200)))
    assert results == [i + 1 for i in range(200)]
    messages_with_starts = [r for r in runtime.requests if any(e.WhichOneof("kind") == "start" for e in r.events)]
    assert len(messages_with_starts) <= 2
    assert len(runtime.events("start")) == 200


async def test_large_arguments_travel_in_chunks(runtime, client):
    data = bytes(range(256)) * (3 * MiB // 256) + b"tail"
    assert await client.remote(sandbox_functions.length, data) == len(data)
    (start,) = runtime.events("start")
    chunks = runtime.events("argument_chunk")
    encoded = pickle.dumps(((data,), {}), protocol=5)
    assert len(start.arguments) == CHUNK_BYTES
    assert start.arguments_size == len(encoded)
    assert all(len(c.data) <= CHUNK_BYTES for c in chunks)
    assert start.arguments + b"".join(c.data for c in chunks) == encoded


async def test_outgoing_messages_stay_within_the_batch_budget(runtime, client):
    # Eight concurrent 1.5 MiB calls: one message holding them all would exceed
    # the server's 4 MiB receive limit and break the stream.
    payloads = [bytes([i]) * (3 * MiB // 2) for i in range(8)]
    lengths = await asyncio.gather(*(client.remote(sandbox_functions.length, p) for p in payloads))
    assert lengths == [len(p) for p in payloads]
    assert max(r.ByteSize() for r in runtime.requests) <= BATCH_BYTES + 2 * CHUNK_BYTES


async def test_small_call_is_not_stuck_behind_a_large_upload(runtime, client):
    async with client:
        big = asyncio.create_task(client.remote(sandbox_functions.length, b"x" * (24 * MiB)))
        await asyncio.sleep(0)
        assert await client.remote(sandbox_functions.add, 1, 1) == 2
        assert await big == 24 * MiB
    kinds = [(e.WhichOneof("kind"), e) for r in runtime.requests for e in r.events]
    small_start = next(i for i, (k, e) in enumerate(kinds) if k == "start" and e.start.callable.endswith("::add"))
    last_chunk = max(i for i, (k, _) in enumerate(kinds) if k == "argument_chunk")
    assert small_start < last_chunk / 4


async def test_large_results_are_reassembled(client):
    data = bytes(range(256)) * (5 * MiB // 256) + b"!"
    assert await client.remote(sandbox_functions.echo, data) == data


async def test_remote_error_maps_to_remote_call_error(client):
    with pytest.raises(RemoteCallError) as info:
        await client.remote(sandbox_functions.fail, "bad input")
    assert type(info.value) is RemoteCallError
    assert info.value.display_name == "sandbox_functions::fail"
    assert info.value.error.type == "ValueError"
    assert str(info.value).startswith("sandbox_functions::fail: ValueError: bad input\n--- sandbox traceback ---\n")


async def test_worker_death_maps_to_worker_exited(runtime, client):
    runtime.scripts["sandbox_functions::echo"] = lambda start: [
        error_event(start.call_id, "WorkerDied", "runtime worker exited: killed by signal 9 (likely OOM-killed)", returncode=-9)
    ]
    with pytest.raises(WorkerExited) as info:
        await client.remote(sandbox_functions.echo, 1)
    assert info.value.returncode == -9
    assert "signal 9" in str(info.value)


async def test_sandbox_cancellation_maps_to_call_cancelled(runtime, client):
    runtime.scripts["sandbox_functions::echo"] = lambda start: [
        error_event(start.call_id, "Cancelled", "remote call cancelled", cancelled=True)
    ]
    with pytest.raises(CallCancelled):
        await client.remote(sandbox_functions.echo, 1)


async def test_error_without_details_is_malformed(runtime, client):
    runtime.scripts["sandbox_functions::echo"] = lambda start: [
        pb.SandboxEvent(error=pb.CallError(call_id=start.call_id))
    ]
    with pytest.raises(RemoteCallError) as info:
        await client.remote(sandbox_functions.echo, 1)
    assert info.value.error.type == "MalformedError"


async def test_result_size_mismatch_is_malformed(runtime, client):
    def short_result(start):
        (event,) = result_events(start.call_id, pickle.dumps(1))
        event.result.value_size += 5
        return [event]

    runtime.scripts["sandbox_functions::echo"] = short_result
    with pytest.raises(RemoteCallError) as info:
        await client.remote(sandbox_functions.echo, 1)
    assert info.value.error.type == "MalformedError"
    assert "announced" in info.value.error.message


async def test_unexpected_result_encoding_is_malformed(runtime, client):
    def msgpack_result(start):
        (event,) = result_events(start.call_id, b"\x01")
        event.result.encoding = pb.ENCODING_MSGPACK
        return [event]

    runtime.scripts["sandbox_functions::echo"] = msgpack_result
    with pytest.raises(RemoteCallError, match="ENCODING_MSGPACK"):
        await client.remote(sandbox_functions.echo, 1)


async def test_refused_event_without_call_id_keeps_the_stream_working(runtime, client, caplog):
    runtime.scripts["sandbox_functions::echo"] = lambda start: [
        error_event("", "BadRequest", "missing call_id"),
        *result_events(start.call_id, pickle.dumps("still fine")),
    ]
    with caplog.at_level(logging.WARNING, logger="agentix.runtime.client"):
        assert await client.remote(sandbox_functions.echo, 1) == "still fine"
    assert "BadRequest: missing call_id" in caplog.text


async def test_values_go_through_the_allowlist(client, monkeypatch):
    monkeypatch.setattr(safepickle, "_allowed_types", {})
    with pytest.raises(RestrictedUnpickleError, match="sandbox_functions.Opaque"):
        await client.remote(sandbox_functions.opaque)
    safepickle.allow_type(sandbox_functions.Opaque)
    assert await client.remote(sandbox_functions.opaque) == sandbox_functions.Opaque()


async def test_try_remote_wraps_failures(client):
    assert await client.try_remote(sandbox_functions.add, 1, 1) == Ok(2)
    failed = await client.try_remote(sandbox_functions.fail, "x")
    assert isinstance(failed, Failed) and isinstance(failed.error, RemoteCallError)


async def test_try_remote_still_raises_misuse(client):
    with pytest.raises(TypeError, match="lambdas have no importable name"):
        await client.try_remote(lambda: None)


async def test_invalid_target_fails_before_connecting():
    client = RuntimeClient("unix:///nonexistent/agentix.sock")
    with pytest.raises(TypeError):
        await client.remote(lambda: None)
    assert client._channel is None


async def test_baggage_travels_with_the_call(runtime, client):
    with context.scope(run="r7"):
        assert await client.remote(sandbox_functions.baggage, "run") == "r7"
    assert await client.remote(sandbox_functions.baggage, "run") is None
    with_context, without_context = runtime.events("start")
    # String baggage travels as the plain StartCall.baggage field, no pickle.
    assert dict(with_context.baggage) == {"run": "r7"} and with_context.context == b""
    assert without_context.context == b"" and not without_context.baggage


async def test_local_cancellation_cancels_in_the_sandbox(runtime, client):
    task = asyncio.create_task(client.remote(sandbox_functions.sleep_forever))
    await eventually(lambda: runtime.started)
    (call_id,) = runtime.started
    assert client._pending_call_ids() == [call_id]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client._pending_call_ids() == []
    await eventually(lambda: [c.call_id for c in runtime.events("cancel")] == [call_id])
    # The daemon answers the cancel with a Cancelled error; the client acknowledges it.
    await eventually(lambda: [a.call_id for a in runtime.events("ack")] == [call_id])


async def test_deadline_raises_call_timeout_and_cancels(runtime):
    async with RuntimeClient(runtime.url, call_deadline=0.2) as client:
        started = time.monotonic()
        with pytest.raises(CallTimeout) as info:
            await client.remote(sandbox_functions.sleep_forever)
        assert time.monotonic() - started < 2
        assert str(info.value) == "remote call 'sandbox_functions::sleep_forever' exceeded deadline of 0.2s"
        await eventually(lambda: len(runtime.events("cancel")) == 1)
        assert await client.remote(sandbox_functions.add, 1, 1) == 2


async def test_close_fails_in_flight_calls_and_cancels_them(runtime):
    client = RuntimeClient(runtime.url)
    task = asyncio.create_task(client.remote(sandbox_functions.sleep_forever))
    await eventually(lambda: runtime.started)
    (call_id,) = runtime.started
    await client.close()
    with pytest.raises(RuntimeUnreachable) as info:
        await task
    assert str(info.value).startswith("runtime client closed with remote call 'sandbox_functions::sleep_forever' in flight")
    assert [c.call_id for c in runtime.events("cancel")] == [call_id]
    await client.close()  # idempotent
    assert await client.remote(sandbox_functions.add, 2, 2) == 4  # usable again
    await client.close()


async def test_lost_stream_fails_pending_calls_when_reconnection_is_off(runtime):
    client = RuntimeClient(runtime.url, reconnection=False)
    try:
        task = asyncio.create_task(client.remote(sandbox_functions.sleep_forever))
        await eventually(lambda: runtime.started)
        runtime.drop_streams()
        with pytest.raises(RuntimeUnreachable) as info:
            await asyncio.wait_for(task, 5)
        assert str(info.value) == f"runtime server connection lost: {runtime.url}"
        assert client._pending_call_ids() == []
        assert await client.remote(sandbox_functions.add, 3, 4) == 7
        assert runtime.streams_opened == 2
    finally:
        await client.close()


async def test_lost_stream_reconnects_and_resumes_pending_calls(runtime, client):
    task = asyncio.create_task(client.remote(sandbox_functions.sleep_forever))
    await eventually(lambda: runtime.started)
    (call_id,) = runtime.started
    runtime.drop_streams()
    # A new stream re-sends the call's start (the daemon dedups call ids) and resumes it.
    await eventually(lambda: runtime.events("resume"))
    assert runtime.streams_opened == 2
    assert list(runtime.events("resume")[0].call_ids) == [call_id]
    assert [s.call_id for s in runtime.events("start")] == [call_id, call_id]
    assert not task.done()
    assert await client.remote(sandbox_functions.add, 3, 4) == 7
    await client.close()
    with pytest.raises(RuntimeUnreachable, match="closed"):
        await task


async def test_a_call_whose_upload_is_cut_sends_its_arguments_again_on_the_new_stream(runtime, client):
    # Over 16 MiB: such a call was once only resumed, and the daemon waited
    # for the rest of its upload until --upload-idle-timeout-s (60 s) failed it.
    data = os.urandom(17 * MiB + 5)
    runtime.drop_at_start = "sandbox_functions::length"  # the stream breaks under the upload
    call = asyncio.create_task(client.remote(sandbox_functions.length, data))
    await eventually(lambda: runtime.streams_opened >= 2)
    # A bound on a hang only (the fake answers in well under a second).
    assert await asyncio.wait_for(call, 60) == len(data)
    starts = [s for s in runtime.events("start") if s.callable == "sandbox_functions::length"]
    assert len(starts) == 2 and starts[0].call_id == starts[1].call_id
    (resume,) = runtime.events("resume")
    assert list(resume.call_ids) == [starts[0].call_id]


async def test_a_call_made_after_a_cut_survives_a_cut_of_its_reconnect(runtime):
    # The connection is lost with no call in flight; the next call's first
    # reconnect is cut too (its GetInfo probe fails). It retries as calls in
    # flight do instead of failing with RuntimeUnreachable.
    client = RuntimeClient(runtime.url, reconnection_delay=0.05)
    try:
        assert await client.remote(sandbox_functions.add, 1, 2) == 3
        runtime.drop_streams()
        await eventually(lambda: client._stream is None)
        runtime.failing_probes = 2
        assert await asyncio.wait_for(client.remote(sandbox_functions.add, 3, 4), 10) == 7
        assert runtime.failing_probes == 0
        runtime.drop_streams()
        await eventually(lambda: client._stream is None)
        runtime.failing_probes = 1
        runtime.scripts["sandbox_functions::echo"] = lambda start: stream_events(start.call_id, ["a", "b"])
        items = [item async for item in client.remote_stream(sandbox_functions.echo, 1)]
        assert items == ["a", "b"]
        assert runtime.failing_probes == 0
    finally:
        await client.close()


async def test_a_call_after_a_cut_fails_once_every_reconnect_attempt_failed(runtime):
    client = RuntimeClient(runtime.url, reconnection_attempts=3, reconnection_delay=0.05)
    try:
        assert await client.remote(sandbox_functions.add, 1, 2) == 3
        runtime.drop_streams()
        await eventually(lambda: client._stream is None)
        runtime.failing_probes = 3
        with pytest.raises(RuntimeUnreachable, match="unreachable.*UNAVAILABLE: Socket closed"):
            await asyncio.wait_for(client.remote(sandbox_functions.add, 3, 4), 10)
        assert runtime.failing_probes == 0  # three attempts, no more
        assert await client.remote(sandbox_functions.add, 3, 4) == 7
    finally:
        await client.close()


async def test_a_call_after_a_cut_fails_at_once_when_reconnection_is_off(runtime):
    client = RuntimeClient(runtime.url, reconnection=False)
    try:
        assert await client.remote(sandbox_functions.add, 1, 2) == 3
        runtime.drop_streams()
        await eventually(lambda: client._stream is None)
        runtime.failing_probes = 1
        with pytest.raises(RuntimeUnreachable, match="unreachable"):
            await client.remote(sandbox_functions.add, 3, 4)
        assert await client.remote(sandbox_functions.add, 3, 4) == 7
    finally:
        await client.close()


async def test_server_going_away_fails_pending_calls_after_reconnect_attempts(runtime):
    client = RuntimeClient(runtime.url, reconnection_attempts=3, reconnection_delay=0.05)
    try:
        task = asyncio.create_task(client.remote(sandbox_functions.sleep_forever))
        await eventually(lambda: runtime.started)
        await runtime.server.stop(None)
        if runtime.frames is not None:
            await runtime.frames.stop()
        with pytest.raises(RuntimeUnreachable, match="connection lost.*reconnecting failed 3 times"):
            await asyncio.wait_for(task, 10)
        with pytest.raises(RuntimeUnreachable, match="unreachable"):
            await asyncio.wait_for(client.remote(sandbox_functions.add, 1, 1), 5)
    finally:
        await client.close()


async def test_unreachable_runtime_fails_fast():
    client = RuntimeClient("unix:///nonexistent/agentix.sock", timeout=30)
    started = time.monotonic()
    with pytest.raises(RuntimeUnreachable) as info:
        await client.remote(sandbox_functions.add, 1, 1)
    assert str(info.value).startswith("runtime server unreachable at unix:///nonexistent/agentix.sock: UNAVAILABLE")
    with pytest.raises(RuntimeUnreachable):
        async with client:
            pass
    with pytest.raises(RuntimeUnreachable):
        await client.health()
    assert time.monotonic() - started < 5
    failed = await client.try_remote(sandbox_functions.add, 1, 1)
    assert isinstance(failed, Failed) and isinstance(failed.error, RuntimeUnreachable)


async def test_connect_is_bounded_by_timeout():
    # A listener that accepts TCP but never speaks HTTP/2.
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = RuntimeClient(f"http://127.0.0.1:{port}", timeout=0.3)
        with pytest.raises(RuntimeUnreachable, match="DEADLINE_EXCEEDED"):
            await asyncio.wait_for(client.remote(sandbox_functions.add, 1, 1), 5)
    finally:
        server.close()


async def test_health_and_info(runtime, client):
    health = await client.health()
    assert (health.status, health.version) == ("ok", "fake-1.0")
    assert (await client._info()).version == "fake-1.0"


async def test_unix_socket_and_http_urls():
    fake = FakeRuntime()
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        server, _ = await serve(fake, f"unix://{directory}/runtime.sock")
        try:
            async with RuntimeClient(f"unix://{directory}/runtime.sock") as client:
                assert await client.remote(sandbox_functions.add, 1, 2) == 3
        finally:
            await server.stop(None)
    fake = FakeRuntime()
    server, port = await serve(fake, "127.0.0.1:0")
    try:
        async with RuntimeClient(f"http://127.0.0.1:{port}", http_sync_ms=None) as client:
            assert await client.remote(sandbox_functions.add, 2, 2) == 4
    finally:
        await server.stop(None)


async def test_compatibility_options_are_kept():
    client = RuntimeClient("h:1", 5, http_sync_ms=250, call_deadline=3, reconnection=False, reconnection_delay=0.5)
    assert (client.base_url, client.timeout, client.http_sync_ms, client.call_deadline) == ("h:1", 5, 250, 3)
    assert client.reconnection_options == {"reconnection": False, "reconnection_delay": 0.5}


def stream_events(call_id, values, end=None):
    items = [
        pb.SandboxEvent(stream_item=pb.StreamItem(call_id=call_id, index=i, encoding=pb.ENCODING_PICKLE, value=pickle.dumps(v)))
        for i, v in enumerate(values)
    ]
    return items + (end if end is not None else result_events(call_id, pickle.dumps(None)))


async def test_remote_stream_yields_items_and_acks_them(runtime):
    runtime.scripts["sandbox_functions::echo"] = lambda start: stream_events(start.call_id, ["a", "b", "c", "d"])
    async with RuntimeClient(runtime.url, stream_window=2) as client:
        got = [item async for item in client.remote_stream(sandbox_functions.echo, 1)]
    assert got == ["a", "b", "c", "d"]
    (start,) = runtime.events("start")
    assert start.stream_window == 2
    # One StreamAck per half window, each saying how many items were consumed.
    await eventually(lambda: [a.next_index for a in runtime.events("stream_ack")] == [1, 2, 3, 4])


async def test_remote_stream_raises_where_the_sandbox_failed(runtime, client):
    runtime.scripts["sandbox_functions::echo"] = lambda start: stream_events(
        start.call_id, [1, 2], end=[error_event(start.call_id, "ValueError", "third item failed")]
    )
    got = []
    with pytest.raises(RemoteCallError) as info:
        async for item in client.remote_stream(sandbox_functions.echo, 1):
            got.append(item)
    assert got == [1, 2]
    assert info.value.error.type == "ValueError"


async def test_a_stream_with_a_gap_fails_instead_of_skipping_items(runtime, client):
    # Item 2 never arrives: the consumer gets 0 and 1, then a typed error,
    # never [0, 1, 3, 4] as if nothing were missing; the call is cancelled.
    def script(start):
        events = stream_events(start.call_id, [0, 1, 2, 3, 4])
        return events[:2] + events[3:]

    runtime.scripts["sandbox_functions::echo"] = script
    got = []
    with pytest.raises(RemoteCallError) as info:
        async for item in client.remote_stream(sandbox_functions.echo, 1):
            got.append(item)
    assert got == [0, 1]
    assert info.value.error.type == "MalformedError"
    assert "items 2..2 were lost" in info.value.error.message
    (start,) = runtime.events("start")
    await eventually(lambda: [c.call_id for c in runtime.events("cancel")] == [start.call_id])


async def test_replayed_stream_items_are_skipped(runtime, client):
    # A resume replays items the host has: each is yielded once.
    def script(start):
        events = stream_events(start.call_id, [0, 1, 2, 3], end=[])
        return events[:3] + events[1:] + result_events(start.call_id, pickle.dumps(None))

    runtime.scripts["sandbox_functions::echo"] = script
    assert [item async for item in client.remote_stream(sandbox_functions.echo, 1)] == [0, 1, 2, 3]


async def test_leaving_a_remote_stream_early_cancels_it(runtime, client):
    # Two items and no end: the stream is still running when the consumer leaves.
    runtime.scripts["sandbox_functions::echo"] = lambda start: stream_events(start.call_id, [1, 2], end=[])
    stream = client.remote_stream(sandbox_functions.echo, 1)
    async for item in stream:
        break
    await stream.aclose()
    (start,) = runtime.events("start")
    await eventually(lambda: [c.call_id for c in runtime.events("cancel")] == [start.call_id])


async def test_stream_window_must_be_positive():
    with pytest.raises(ValueError):
        RuntimeClient("127.0.0.1:1", stream_window=0)
