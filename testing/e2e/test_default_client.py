"""A gRPC client with its stack's default 4 MiB receive limit reads every
message the daemon writes (docs: proto/agentix/runtime/v1/README.md, "Limits"),
and call ids of one client are refused to another ("Call ids").

The client here is a bare grpc.aio channel with no options at all, speaking
msgpack as a non-Python host would."""

import asyncio
import pickle
import uuid

import grpc
import msgpack
import pytest

import wire_targets
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc

# gRPC's default receive limit; every message must fit it with its 5-byte prefix.
LIMIT = 4 * 1024 * 1024
MiB = 1 << 20


class DefaultClient:
    """One Calls stream on a channel with no raised limits."""

    def __init__(self, url, client_id=None):
        self.channel = grpc.aio.insecure_channel(url)  # no options: the defaults
        self.stub = pb_grpc.RuntimeServiceStub(self.channel)
        self.metadata = (("agentix-client-id", client_id or uuid.uuid4().hex),)
        self.call = self.stub.Calls(metadata=self.metadata)
        self.chunks = {}
        self.items = {}
        self.terminals = {}
        self.largest = 0

    async def start(self, call_id, fn, *args, stream_window=0, module="wire_targets"):
        packed = msgpack.packb([list(args), {}])
        await self.call.write(pb.CallsRequest(events=[pb.HostEvent(start=pb.StartCall(
            call_id=call_id, callable=f"{module}::{fn}", encoding=pb.ENCODING_MSGPACK,
            arguments=packed, stream_window=stream_window))]))

    async def read_until(self, done, timeout=60):
        async def read():
            while not done():
                resp = await self.call.read()
                assert resp is not grpc.aio.EOF, "the Calls stream ended"
                self.largest = max(self.largest, resp.ByteSize() + 5)
                for e in resp.events:
                    kind = e.WhichOneof("kind")
                    if kind == "result_chunk":
                        self.chunks.setdefault(e.result_chunk.call_id, []).append(e.result_chunk.data)
                    elif kind == "stream_item":
                        item = e.stream_item
                        value = b"".join([*self.chunks.pop(item.call_id, []), item.value])
                        self.items.setdefault(item.call_id, []).append(msgpack.unpackb(value))
                        await self.call.write(pb.CallsRequest(events=[pb.HostEvent(
                            stream_ack=pb.StreamAck(call_id=item.call_id, next_index=item.index + 1))]))
                    elif kind == "result":
                        r = e.result
                        value = b"".join([*self.chunks.pop(r.call_id, []), r.value])
                        assert len(value) == r.value_size
                        # Pickle only in the tests that ask for it (trusted here).
                        decode = msgpack.unpackb if r.encoding == pb.ENCODING_MSGPACK else pickle.loads
                        self.terminals[r.call_id] = decode(value)
                    elif kind == "error":
                        self.terminals[e.error.call_id] = e.error.error

        await asyncio.wait_for(read(), timeout)

    async def result(self, call_id):
        await self.read_until(lambda: call_id in self.terminals)
        return self.terminals.pop(call_id)

    async def close(self):
        self.call.cancel()
        await self.channel.close()


@pytest.fixture
async def client(daemon):
    c = DefaultClient(daemon.url)
    yield c
    await c.close()


@pytest.mark.parametrize("size", [8 * MiB, 40 * MiB])
async def test_large_result_reaches_a_default_client(client, size):
    await client.start("big", "blob", size)
    assert await client.result("big") == wire_targets.blob(size)
    assert client.largest <= LIMIT


async def test_eight_concurrent_3mib_results_reach_a_default_client(client):
    for i in range(8):
        await client.start(f"c{i}", "blob", 3 * MiB + i)
    await client.read_until(lambda: all(f"c{i}" in client.terminals for i in range(8)))
    for i in range(8):
        assert client.terminals[f"c{i}"] == wire_targets.blob(3 * MiB + i)
    assert client.largest <= LIMIT


async def test_stream_items_over_4mib_reach_a_default_client(client):
    await client.start("items", "blob_items", 3, 6 * MiB, stream_window=2)
    assert await client.result("items") is None
    assert client.items["items"] == [bytes([i]) * (6 * MiB) for i in range(3)]
    assert client.largest <= LIMIT


async def test_huge_error_is_cut_to_fit_a_default_client(client):
    await client.start("err", "raise_big", 10 * MiB)
    error = await client.result("err")
    assert error.type == "ValueError"
    assert error.message.startswith("e" * 100_000)
    assert "[truncated: " in error.message
    assert client.largest <= LIMIT
    # The stream still serves.
    await client.start("after", "blob", 10)
    assert await client.result("after") == wire_targets.blob(10)


async def test_log_backlog_reaches_a_default_subscriber(client):
    # 6 MiB of records (one of them 6 MiB alone) wait for a subscriber.
    await client.start("logs", "log_backlog", 100, 20_000, 6 * MiB)
    assert await client.result("logs") == 201
    logs = client.stub.Logs(metadata=client.metadata)
    await logs.write(pb.LogsRequest(subscribe=pb.SubscribeLogs(after_seq=0)))
    messages = []
    largest = 0

    async def read():
        while sum(1 for m in messages if m.startswith(("s0", "big"))) < 201:
            resp = await logs.read()
            assert resp is not grpc.aio.EOF, "the Logs stream ended"
            nonlocal largest
            largest = max(largest, resp.ByteSize() + 5)
            messages.extend(r.message for r in resp.records if r.logger == "wire.backlog")

    await asyncio.wait_for(read(), 60)
    logs.cancel()
    assert largest <= LIMIT
    assert [m[:6] for m in messages if m.startswith("s")] == [f"s{i:05d}" for i in range(200)]
    (big,) = [m for m in messages if m.startswith("big")]
    assert big.startswith("big " + "b" * 100_000) and "[truncated: " in big


async def test_a_6mib_backlog_of_records_reaches_a_default_subscriber(client):
    # The conformance case's backlog (log_backlog_6mib): 9,000 records of 760
    # bytes, over 6 MiB, logged while nobody listens; every one arrives whole
    # and in order on a Logs stream with the default receive limit.
    n, size = 9_000, 760
    await client.start("sized", "log_sized", n, size, module="e2e_targets")
    assert await client.result("sized") == n
    logs = client.stub.Logs(metadata=client.metadata)
    await logs.write(pb.LogsRequest(subscribe=pb.SubscribeLogs(after_seq=0)))
    messages = []
    largest = 0

    async def read():
        nonlocal largest
        while len(messages) < n:
            resp = await logs.read()
            assert resp is not grpc.aio.EOF, "the Logs stream ended"
            largest = max(largest, resp.ByteSize() + 5)
            messages.extend(r.message for r in resp.records if r.logger == "e2e.sized")
            if resp.records:
                await logs.write(pb.LogsRequest(ack=pb.AckLogs(seq=resp.records[-1].seq)))

    await asyncio.wait_for(read(), 60)
    logs.cancel()
    body = "y" * (size - 12)  # e2e_targets.log_sized
    assert messages == [f"{i:010d} {body}" for i in range(n)]
    assert sum(len(m) for m in messages) > 6 * MiB
    assert largest <= LIMIT


async def test_large_values_still_whole_for_the_python_host(daemon):
    """The Python host (raised limits) gets a 6 MiB stream item whole."""
    from agentix import RuntimeClient

    async with RuntimeClient(daemon.url) as host:
        items = [item async for item in host.remote_stream(wire_targets.blob_items, 2, 6 * MiB)]
    assert items == [bytes([i]) * (6 * MiB) for i in range(2)]


async def test_a_call_id_of_another_client_is_refused_at_once(daemon):
    first = DefaultClient(daemon.url, client_id="first")
    second = DefaultClient(daemon.url, client_id="second")
    try:
        await first.start("shared", "hold", 1.0, "first's")
        await asyncio.sleep(0.2)
        # In flight for `first`: refused at once, with a definite error.
        await second.start("shared", "hold", 0.0, "second's")
        error = await asyncio.wait_for(second.result("shared"), 5)
        assert error.type == "CallIdInUse"
        assert error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
        # `first` still gets its own result, once.
        assert await first.result("shared") == "first's"
        # Retained (not acked) for `first`: still refused.
        await second.start("shared", "hold", 0.0, "again")
        assert (await asyncio.wait_for(second.result("shared"), 5)).type == "CallIdInUse"
        # `first` re-sending its own StartCall (as after a reconnect) is ignored.
        await first.start("shared", "hold", 0.0, "ignored")
        await first.start("other", "hold", 0.0, "next")
        assert await first.result("other") == "next"
        assert "shared" not in first.terminals
    finally:
        await first.close()
        await second.close()


async def test_msgpack_mapping_both_directions(client):
    import datetime as dt

    utc = dt.timezone.utc
    when = dt.datetime(2026, 12, 1, 20, 30, 15, 123456, tzinfo=utc)
    values = [when, 2**63 - 1, -(2**63), 2**64 - 1, b"raw", "text", 2.0, -0.0, [1, [2]], {"k": b"v"}, None, True]
    packed = msgpack.packb([values, {}], datetime=True)
    await client.call.write(pb.CallsRequest(events=[pb.HostEvent(start=pb.StartCall(
        call_id="types", callable="wire_targets::describe", encoding=pb.ENCODING_MSGPACK, arguments=packed))]))
    await client.read_until(lambda: "types" in client.terminals)
    assert "types" not in client.chunks
    raw = client.terminals.pop("types")
    # Read again with timestamps as datetimes (DefaultClient decodes plainly).
    described = msgpack.unpackb(msgpack.packb(raw), timestamp=3)
    assert [t for t, _ in described] == [
        "datetime", "int", "int", "int", "bytes", "str", "float", "float", "list", "dict", "NoneType", "bool"]
    echoed = [v for _, v in described]
    assert echoed == values
    assert type(echoed[6]) is float and type(echoed[7]) is float  # whole floats stay floats
    assert isinstance(raw[0][1], msgpack.Timestamp)  # sent back as the timestamp extension

    await client.start("huge", "huge_int")
    error = await client.result("huge")
    assert error.type == "ResultEncodeError" and "int too big" in error.message


async def test_empty_arguments_mean_no_arguments(client):
    for call_id, encoding in (("m", pb.ENCODING_MSGPACK), ("p", pb.ENCODING_PICKLE), ("u", pb.ENCODING_UNSPECIFIED)):
        await client.call.write(pb.CallsRequest(events=[pb.HostEvent(start=pb.StartCall(
            call_id=call_id, callable="wire_targets::no_args", encoding=encoding))]))
        assert await client.result(call_id) == "none"


async def test_unspecified_encoding_with_msgpack_bytes_names_the_field(client):
    await client.call.write(pb.CallsRequest(events=[pb.HostEvent(start=pb.StartCall(
        call_id="u", callable="wire_targets::describe", arguments=msgpack.packb([[1], {}])))]))
    error = await client.result("u")
    assert error.type == "BadRequest"
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "StartCall.arguments is not a pickle" in error.message
    assert "ENCODING_MSGPACK" in error.message
