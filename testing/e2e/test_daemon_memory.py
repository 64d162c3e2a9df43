"""An authenticated client cannot make the daemon hold unbounded memory, and
every malformed input gets a definite, typed answer (issue 17, items 8 and 9).

Each test sends the attack at a reduced scale against a daemon started with
small limits, asserts the bound (RSS growth, a typed error) and that the
daemon keeps serving."""

import asyncio
import pickle
import time
from pathlib import Path

import grpc
import pytest

from agentix import RuntimeClient
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc
from raw_stream import RawStream, chunk, start

pytestmark = pytest.mark.asyncio

MiB = 1 << 20
SERVICE = "/agentix.runtime.v1.RuntimeService/"
# Not a protobuf: field 1 (length-delimited) claims 100 bytes, 2 follow.
GARBAGE = b"\x0a\x64zz"


def rss_bytes(daemon, field="VmRSS"):
    for line in Path(f"/proc/{daemon.proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field}")


async def still_serving(daemon):
    """A fresh client's call works."""
    import e2e_targets as t

    async with RuntimeClient(daemon.url, logs=False, traces=False) as other:
        assert await other.remote(t.add, 2, 3) == 5


def raw_method(channel, name):
    """A bidi method that sends and receives raw bytes."""
    return channel.stream_stream(SERVICE + name)


async def test_unread_results_are_bounded_and_the_stalled_stream_is_ended(start_daemon):
    daemon = start_daemon(extra_args=[
        "--max-retained-bytes", str(32 * MiB), "--stalled-host-timeout-s", "2"])
    await still_serving(daemon)  # the worker is up: measure from here
    base = rss_bytes(daemon)
    raw = RawStream(daemon.url)
    calls, size = 16, 16 * MiB  # 256 MiB of results nobody reads
    args = pickle.dumps(((size,), {}), protocol=5)
    await raw.send(*[start(f"big{i}", "e2e_targets::make_bytes", args) for i in range(calls)])
    # Past 32 MiB unwritten the worker's output waits; after 2 s without
    # progress the stream is ended with RESOURCE_EXHAUSTED.
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        async def drain():
            await asyncio.sleep(5)  # not reading meanwhile
            while (await raw.call.read()) is not grpc.aio.EOF:
                pass
        await asyncio.wait_for(drain(), 60)
    assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "did not read its results" in ended.value.details()
    await still_serving(daemon)
    grown = rss_bytes(daemon, "VmHWM") - base
    # The unwritten bound, the retained bound, one result being produced and
    # gRPC's copies of the messages in flight; not 256 MiB.
    assert grown < 150 * MiB, f"daemon RSS grew by {grown / MiB:.0f} MiB"
    await raw.close()
    # Once the client has gone, what it made the daemon hold is given back.
    deadline = time.monotonic() + 10
    while rss_bytes(daemon) - base > 80 * MiB and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    left = rss_bytes(daemon) - base
    assert left <= 80 * MiB, f"{left / MiB:.0f} MiB still resident after the client left"


async def test_idle_log_subscribers_are_bounded(start_daemon):
    import e2e_targets as t

    daemon = start_daemon(extra_args=["--max-log-subscribers", "4"])
    channel = grpc.aio.insecure_channel(daemon.url)
    stub = pb_grpc.RuntimeServiceStub(channel)
    streams = []
    for _ in range(12):  # subscribe, then never read
        call = stub.Logs()
        await call.write(pb.LogsRequest(subscribe=pb.SubscribeLogs(after_seq=0)))
        streams.append(call)
    refused = 0
    for call in streams[4:]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(call.read(), 20)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-log-subscribers" in err.value.details()
        refused += 1
    assert refused == 8
    base = rss_bytes(daemon)
    async with RuntimeClient(daemon.url, logs=False, traces=False) as client:
        assert await client.remote(t.log_many, 20000) == 20000
    grown = rss_bytes(daemon, "VmHWM") - base
    assert grown < 100 * MiB, f"daemon RSS grew by {grown / MiB:.0f} MiB"
    for call in streams:
        call.cancel()
    await channel.close()
    await still_serving(daemon)


async def test_overlong_client_strings_are_refused(daemon):
    base = rss_bytes(daemon, "VmHWM")
    raw = RawStream(daemon.url)
    long_id = "i" * MiB
    for _ in range(30):  # 30 MiB of ids: refused, neither run nor stored
        await raw.send(start(long_id, "e2e_targets::noop", pickle.dumps(((), {}))))
        error = (await raw.terminal("")).error.error
        assert error.type == "BadRequest" and "exceeds the limit of 256" in error.message
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    await raw.send(chunk(long_id, b"x"))
    assert (await raw.terminal("")).error.error.type == "BadRequest"
    info = await pb_grpc.RuntimeServiceStub(raw.channel).GetInfo(pb.GetInfoRequest())
    assert info.calls_in_flight == 0
    await raw.close()
    grown = rss_bytes(daemon, "VmHWM") - base
    assert grown < 40 * MiB, f"daemon RSS grew by {grown / MiB:.0f} MiB"

    channel = grpc.aio.insecure_channel(daemon.url)
    stub = pb_grpc.RuntimeServiceStub(channel)
    for first in (
        pb.NamespaceRequest(open=pb.OpenNamespace(namespace="/" + "n" * 300)),
        None,
    ):
        call = stub.Namespace()
        if first is None:  # a good namespace, then an over-long event name
            await call.write(pb.NamespaceRequest(open=pb.OpenNamespace(namespace="/ok")))
            assert (await call.read()).opened
            first = pb.NamespaceRequest(event=pb.NamespaceEvent(event="e" * 2000, data=b"\xc0"))
        await call.write(first)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while (await call.read()) is not grpc.aio.EOF:
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "exceeds the limit" in err.value.details()
    await channel.close()
    await still_serving(daemon)


async def test_an_upload_that_stops_arriving_times_out(start_daemon):
    daemon = start_daemon(extra_args=["--upload-idle-timeout-s", "1"])
    raw = RawStream(daemon.url)
    # Announces 1 GiB of arguments, sends 10 bytes, then nothing.
    await raw.send(start("stuck", "e2e_targets::echo", b"0123456789", size=1 << 30))
    started = time.monotonic()
    error = (await raw.terminal("stuck", timeout=20)).error.error
    assert error.type == "UploadTimeout"
    assert error.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert "10 of 1073741824 bytes" in error.message
    assert time.monotonic() - started < 5
    info = await pb_grpc.RuntimeServiceStub(raw.channel).GetInfo(pb.GetInfoRequest())
    assert info.calls_in_flight == 0
    await raw.close()
    await still_serving(daemon)


async def test_garbage_on_every_stream_gets_a_typed_error(daemon):
    channel = grpc.aio.insecure_channel(daemon.url)
    # Calls: a BadRequest CallError, and the same stream goes on serving.
    calls = raw_method(channel, "Calls")()
    await calls.write(GARBAGE)
    response = pb.CallsResponse.FromString(await asyncio.wait_for(calls.read(), 20))
    assert response.events[0].error.error.type == "BadRequest"
    assert response.events[0].error.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    await calls.write(pb.CallsRequest(events=[
        start("after", "e2e_targets::echo", pickle.dumps((("ok",), {})))]).SerializeToString())
    response = pb.CallsResponse.FromString(await asyncio.wait_for(calls.read(), 20))
    assert pickle.loads(response.events[0].result.value) == "ok"
    calls.cancel()
    # Logs, Traces, Namespace: the stream ends with INVALID_ARGUMENT.
    for name in ("Logs", "Traces", "Namespace"):
        call = raw_method(channel, name)()
        await call.write(GARBAGE)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(call.read(), 20)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert "unparseable" in err.value.details()
    await channel.close()
    await still_serving(daemon)
