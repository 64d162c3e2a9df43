"""The daemon's frame wire (docs/FRAME-WIRE.md) in front of a FakeRuntime's
``Calls`` and ``Namespace``, for client tests: the same fake serves the Calls
stream on ``PATH.calls`` as on gRPC, and a Namespace stream on a connection
whose HELLO says ``agentix-stream: namespace`` (another value: STATUS 12). Frames are encoded and decoded here on their own
(not with agentix.runtime.client.frames), so the tests check the client
against the spec, not against itself.

`FrameServer.hellos` records each connection's HELLO metadata (a dict);
`FrameServer.tell` sends the open Calls connections a HELLO of the daemon's
own (a --calls_cpu=probe daemon's answer, and a re-probe's change of it);
`eof_instead_of_status` makes an aborted stream (e.g. `drop_streams()`) end
with a bare EOF instead of a STATUS frame. `hostile` plays a hostile peer (a
worker holding the host's connection, docs/DIRECT-CALLS.md) once: see there.
"""

import array
import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Callable

import grpc

from agentix.runtime.v1 import runtime_pb2 as pb

HEADER = struct.Struct("<IB")
HELLO, MESSAGE, HALF_CLOSE, STATUS = 1, 2, 3, 4


def encode(kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), kind) + payload


def status_frame(code: int, details: str = "") -> bytes:
    return encode(STATUS, struct.pack("<I", code) + details.encode())


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """The next (kind, payload), or None at a clean EOF."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as error:
        if error.partial:
            raise
        return None
    size, kind = HEADER.unpack(header)
    return kind, await reader.readexactly(size)


def encode_hello(pairs: dict[str, str]) -> bytes:
    """A HELLO payload: each pair as u16le key length, key, u32le value length, value."""
    out = b""
    for key, value in pairs.items():
        k, v = key.encode("ascii"), value.encode()
        out += struct.pack("<H", len(k)) + k + struct.pack("<I", len(v)) + v
    return out


def decode_hello(payload: bytes) -> dict[str, str]:
    """The metadata pairs of a HELLO payload; ValueError if it is malformed."""
    pairs: dict[str, str] = {}
    pos = 0
    while pos < len(payload):
        (key_len,) = struct.unpack_from("<H", payload, pos)
        pos += 2
        key = payload[pos : pos + key_len].decode("ascii")
        pos += key_len
        (value_len,) = struct.unpack_from("<I", payload, pos)
        pos += 4
        value = payload[pos : pos + value_len]
        if len(value) != value_len:
            raise ValueError("HELLO value runs past the payload")
        pairs[key] = value.decode()
        pos += value_len
    return pairs


class _Aborted(Exception):
    pass


class _Context:
    """What FakeRuntime.Calls uses of a grpc.aio servicer context."""

    def __init__(self, server: "FrameServer", writer: asyncio.StreamWriter) -> None:
        self._server = server
        self._writer = writer

    async def write(self, message: pb.CallsResponse) -> None:
        framed = encode(MESSAGE, message.SerializeToString())
        hostile, self._server.hostile = self._server.hostile, None
        if hostile is None:
            self._writer.write(framed)
            await self._writer.drain()
            return
        await self._writer.drain()  # nothing of ours waits in front of its bytes
        raw = self._writer.get_extra_info("socket")
        # A duplicate with a timeout (poll-based: the shared O_NONBLOCK stays set for asyncio).
        with socket.socket(fileno=os.dup(raw.fileno())) as sock:
            sock.settimeout(10)
            # On a thread: the client's reader shares this loop, and a peer may send more than a buffer's worth.
            keep = await asyncio.to_thread(hostile, sock, framed)
        if not keep:
            self._writer.transport.abort()

    async def abort(self, code, details: str) -> None:
        if not self._server.eof_instead_of_status:
            self._writer.write(status_frame(code.value[0], details))
        raise _Aborted


class _NamespaceContext(_Context):
    """What FakeRuntime.Namespace uses: `read` as on a grpc.aio context."""

    def __init__(self, server: "FrameServer", reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(server, writer)
        self._reader = reader

    async def read(self):
        next_frame = await read_frame(self._reader)
        if next_frame is None or next_frame[0] == HALF_CLOSE:
            return grpc.aio.EOF
        kind, payload = next_frame
        assert kind == MESSAGE, f"unexpected frame kind {kind}"
        return pb.NamespaceRequest.FromString(payload)


class FrameServer:
    """Serves `fake.Calls` on the Unix socket `path` over the frame wire."""

    def __init__(self, fake, path: str) -> None:
        self.fake = fake
        self.path = path
        self.hellos: list[dict[str, str]] = []
        self.eof_instead_of_status = False
        # Called once, with the connection's socket and the next response's whole
        # MESSAGE frame, instead of writing that frame: it writes what it likes
        # (or nothing); False closes the connection after it.
        self.hostile: Callable[[socket.socket, bytes], bool] | None = None
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.StreamWriter, asyncio.Task] = {}
        self._calls: list[asyncio.StreamWriter] = []

    async def start(self) -> "FrameServer":
        self._server = await asyncio.start_unix_server(self._serve, self.path)
        return self

    async def stop(self) -> None:
        """Stops listening and cuts the open connections (as a daemon that exits)."""
        assert self._server is not None
        self._server.close()
        for writer, task in list(self._connections.items()):
            writer.transport.abort()
            task.cancel()
        await asyncio.gather(*self._connections.values(), return_exceptions=True)
        await self._server.wait_closed()

    def tell(self, calls_cpu: str) -> None:
        """A HELLO frame with ``agentix-calls-cpu: calls_cpu`` to every open Calls connection."""
        for writer in self._calls:
            writer.write(encode(HELLO, encode_hello({"agentix-calls-cpu": calls_cpu})))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections[writer] = asyncio.current_task()
        try:
            first = await read_frame(reader)
            if first is None or first[0] != HELLO:
                writer.write(status_frame(3, "the first frame must be HELLO"))
                return
            hello = decode_hello(first[1])
            self.hellos.append(hello)
            stream = hello.get("agentix-stream", "calls")
            if stream == "namespace":
                try:
                    await self.fake.Namespace(None, _NamespaceContext(self, reader, writer))
                except _Aborted:
                    return
                writer.write(status_frame(0))
                return
            if stream != "calls":
                writer.write(status_frame(12, f"no stream named {stream!r}"))
                return

            self._calls.append(writer)

            async def requests():
                while (next_frame := await read_frame(reader)) is not None:
                    kind, payload = next_frame
                    if kind == HALF_CLOSE:
                        return
                    assert kind == MESSAGE, f"unexpected frame kind {kind}"
                    yield pb.CallsRequest.FromString(payload)

            try:
                await self.fake.Calls(requests(), _Context(self, writer))
            except _Aborted:
                return
            writer.write(status_frame(0))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._connections.pop(writer, None)
            if writer in self._calls:
                self._calls.remove(writer)
            writer.close()


# --- hostile-peer helpers shared by the Calls and Namespace hostile tests ---


def fds_open() -> dict[int, str]:
    """This process's open descriptors and what each names (/proc/self/fd)."""
    links = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            links[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, gone already
            pass
    return links


def with_descriptors(fd: int, count: int):
    """A `hostile` peer that sends the response as it is, with `count` copies
    of `fd` attached (SCM_RIGHTS), and stays connected."""

    def send(sock: socket.socket, response: bytes) -> bool:
        fds = array.array("i", [fd] * count)
        assert sock.sendmsg([response], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]) == len(response)
        return True

    return send


@contextlib.contextmanager
def descriptors_with_next_response(frames: "FrameServer", count: int):
    """The block makes the server send its next response with `count`
    descriptors of a fresh pipe attached (`with_descriptors`); on leaving it,
    checks that the response went and that the host received none of them."""
    before = len(fds_open())
    read_end, write_end = os.pipe()
    pipe = os.readlink(f"/proc/self/fd/{read_end}")
    frames.hostile = with_descriptors(read_end, count)
    try:
        yield
        assert frames.hostile is None  # the response came with the descriptors
    finally:
        os.close(read_end)
        os.close(write_end)
    after = fds_open()
    # Had the reader taken them, `count` descriptors of the pipe would be open here.
    assert pipe not in after.values()
    assert len(after) < before + count


def keep(data: bytes):
    """A `hostile` peer that writes `data` instead of the response, then stays connected."""

    def send(sock: socket.socket, response: bytes) -> bool:
        sock.sendall(data)
        return True

    return send


def unauthenticated(sock: socket.socket, response: bytes) -> bool:
    """A `hostile` peer that answers STATUS 16 (UNAUTHENTICATED) instead of
    the response and closes: the host must keep its token."""
    sock.sendall(status_frame(16, "the token is wrong, forget it"))
    return False
