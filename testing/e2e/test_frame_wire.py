"""The Calls stream on the daemon's frame wire (docs/FRAME-WIRE.md), end to end:
a `RuntimeClient` on a ``unix://`` daemon with AGENTIX_CALLS_WIRE=auto runs its calls there, and
``AGENTIX_CALLS_WIRE=grpc`` keeps them on gRPC; the same calls behave the same
on both wires (values, large arguments and results, streaming, errors,
cancellation, deadlines, reconnecting after the daemon restarts)."""

import asyncio
import os
import socket
import struct

import pytest

import e2e_targets as t
from agentix import CallTimeout, RemoteCallError, RuntimeClient, RuntimeUnreachable, Unauthenticated
from agentix.runtime.client import frames
from agentix.runtime.client.frames import FrameCallsStream
from agentix.runtime.client.stream import CallsStream, NativeCallsStream

pytestmark = pytest.mark.asyncio
MiB = 1 << 20
GRPC_STREAMS = (NativeCallsStream, CallsStream)


@pytest.fixture(params=["frames", "grpc"])
def wire(request, monkeypatch):
    """The Calls wire a test's clients use: the default (the frame wire, with
    AGENTIX_CALLS_WIRE unset) or AGENTIX_CALLS_WIRE=grpc."""
    if request.param == "grpc":
        monkeypatch.setenv("AGENTIX_CALLS_WIRE", "grpc")
    else:
        monkeypatch.delenv("AGENTIX_CALLS_WIRE", raising=False)
    return request.param


def assert_on(client: RuntimeClient, wire: str) -> None:
    if wire == "frames":
        assert type(client._stream) is FrameCallsStream
    else:
        assert type(client._stream) in GRPC_STREAMS


async def test_a_default_client_on_a_unix_socket_uses_the_frame_wire(daemon, wire):
    assert os.path.exists(f"{daemon.socket_path}.calls")
    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(t.add, 2, 3) == 5
        assert await client.remote(t.async_add, 2, b=40) == 42
        assert_on(client, wire)
        pid = await client.remote(t.getpid)
        assert pid != os.getpid()
        info = await client._info()
        assert info.worker_pid == pid


async def test_large_arguments_and_results_and_many_calls_at_once(daemon, wire):
    data = os.urandom(16 * MiB + 7)
    async with RuntimeClient(daemon.url) as client:
        small = [client.remote(t.add, i, i) for i in range(200)]
        echoed, *sums = await asyncio.gather(client.remote(t.echo, data), *small)
        assert echoed == data
        assert sums == [2 * i for i in range(200)]
        assert len(await client.remote(t.make_bytes, 9 * MiB)) == 9 * MiB
        assert_on(client, wire)


async def test_streams_errors_cancellation_and_deadlines(daemon, wire):
    async with RuntimeClient(daemon.url, stream_window=2) as client:
        assert [item async for item in client.remote_stream(t.count_sync, 7)] == [i * 10 for i in range(7)]
        assert [item async for item in client.remote_stream(t.count_async, 3)] == list(range(3))
        with pytest.raises(RemoteCallError) as info:
            await client.remote(t.raise_value_error, "boom")
        assert isinstance(info.value, ValueError) and "boom" in str(info.value)
        task = asyncio.create_task(client.remote(t.async_sleep, 60))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert_on(client, wire)
    async with RuntimeClient(daemon.url, call_deadline=0.5) as client:
        with pytest.raises(CallTimeout):
            await client.remote(t.async_sleep, 60)
        assert await client.remote(t.add, 1, 1) == 2


async def test_the_client_reconnects_after_the_daemon_restarts(start_daemon, tmp_path, wire):
    daemon = start_daemon()
    async with RuntimeClient(daemon.url, reconnection_delay=0.05) as client:
        assert await client.remote(t.add, 1, 2) == 3
        first_pid = await client.remote(t.getpid)
        daemon.stop()
        replacement = start_daemon()
        assert replacement.url == daemon.url
        assert await asyncio.wait_for(client.remote(t.add, 3, 4), 30) == 7
        assert await client.remote(t.getpid) != first_pid
        assert_on(client, wire)


async def test_without_the_calls_socket_the_client_uses_grpc(start_daemon, monkeypatch):
    daemon = start_daemon(extra_args=["--nocalls_socket"])
    assert not os.path.exists(f"{daemon.socket_path}.calls")
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "auto")
    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(t.add, 1, 2) == 3
        assert type(client._stream) in GRPC_STREAMS
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    with pytest.raises(RuntimeUnreachable, match=r"AGENTIX_CALLS_WIRE=frames.*\.calls cannot be reached \(ENOENT"):
        async with RuntimeClient(daemon.url):
            pass


async def test_the_frame_wire_checks_the_token(start_daemon, tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text("frame-wire-token-0123456789abcdef\n")
    token_file.chmod(0o600)
    daemon = start_daemon(extra_args=["--token-file", str(token_file)])
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    async with RuntimeClient(daemon.url, token="frame-wire-token-0123456789abcdef") as client:
        assert await client.remote(t.add, 1, 2) == 3
        assert type(client._stream) is FrameCallsStream
    with pytest.raises(Unauthenticated):
        async with RuntimeClient(daemon.url, token="wrong"):
            pass
    # The frame wire itself refuses a HELLO with a wrong token: STATUS 16, then EOF.
    for token in ("wrong", None):
        metadata = (("agentix-client-id", "c1"),) + ((("authorization", f"Bearer {token}"),) if token else ())
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(f"{daemon.socket_path}.calls")
            sock.sendall(frames.frame(frames.HELLO, frames.encode_hello(metadata)))
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        size, kind = struct.unpack_from("<IB", answer)
        assert kind == frames.STATUS and len(answer) == 5 + size
        assert struct.unpack_from("<I", answer, 5)[0] == 16  # UNAUTHENTICATED


@pytest.mark.parametrize("direct", ["auto", "off"])
async def test_a_host_asking_for_direct_calls_is_served_by_a_daemon_without_them(
        start_daemon, monkeypatch, direct):
    # HELLO's agentix-direct: 1 (AGENTIX_CALLS_DIRECT=auto, the default) is ignored by a daemon
    # without --direct_calls: the connection is relayed as before, payload ring included.
    daemon = start_daemon(relayed_only="a daemon without direct calls is the case")
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", direct)
    data = os.urandom(9 * MiB)
    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(t.add, 2, 3) == 5
        assert await client.remote(t.echo, data) == data
        assert type(client._stream) is FrameCallsStream
