"""The frame wire's payload ring, host side (docs/FRAME-WIRE.md, "Payload
ring"): `PayloadRing` and `FrameTransport` against a socket whose other end
plays the daemon (it maps the shared memfd, as agentix-sandboxd does)."""

from __future__ import annotations

import array
import ctypes
import mmap
import os
import pickle
import socket
import struct

import pytest

from agentix.runtime.client import frames, wire
from agentix.runtime.client.frames import FrameTransport
from agentix.runtime.client.payload_ring import PayloadRing, SplitMessage, native_copy, native_new_buffer, native_prefault
from agentix.runtime.shared.pickle_stream import COPY_FUNCTION_BYTES, COPY_FUNCTION_MAX_VALUE, PREFAULT_TARGET_BYTES
from agentix.runtime.shared.safepickle import restricted_loads_chunks
from agentix.runtime.v1 import runtime_pb2 as pb
from fake_frames import HELLO, MESSAGE, decode_hello, encode

RING_MESSAGE = 5
_HEADER = 4096


class Daemon:
    """The daemon's end of a socketpair: takes HELLO with its memfd and maps it."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(5)
        self.sock = sock
        data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(4 * 4))
        size, kind = struct.unpack_from("<IB", data)
        assert kind == HELLO
        self.hello = dict(decode_hello(data[5 : 5 + size]))
        self.fds = [fd for level, typ, raw in ancillary for fd in array.array("i", raw)]
        self.map = None
        if self.fds:
            (fd,) = self.fds
            self.map = mmap.mmap(fd, os.fstat(fd).st_size)
            os.close(fd)
            self.ring_bytes = struct.unpack_from("<Q", self.map, 8)[0]

    def accept(self) -> None:
        self.sock.sendall(encode(RING_MESSAGE, b"\0\0"))

    def host_piece(self, pos: int, size: int) -> bytes:
        """Bytes the host put in its ring."""
        offset = _HEADER + pos % self.ring_bytes
        return bytes(self.map[offset : offset + size])

    def release_host(self, end: int) -> None:
        struct.pack_into("<Q", self.map, 64, end)

    def put(self, pos: int, data: bytes) -> None:
        """Into the daemon's ring (the second)."""
        offset = _HEADER + self.ring_bytes + pos % self.ring_bytes
        self.map[offset : offset + len(data)] = data

    def host_released(self) -> int:
        return struct.unpack_from("<Q", self.map, 128)[0]

    def frame(self) -> tuple[int, bytes]:
        head = b""
        while len(head) < 5:
            head += self.sock.recv(5 - len(head))
        size, kind = struct.unpack("<IB", head)
        body = b""
        while len(body) < size:
            body += self.sock.recv(size - len(body))
        return kind, body

    def message(self, kind: int, body: bytes) -> bytes:
        """A MESSAGE's bytes, or a RING_MESSAGE's with its pieces put back."""
        if kind == MESSAGE:
            return body
        assert kind == RING_MESSAGE
        (count,) = struct.unpack_from("<H", body)
        rest = body[2 + 20 * count :]
        out, done = b"", 0
        for i in range(count):
            at, pos, size = struct.unpack_from("<IQQ", body, 2 + 20 * i)
            out += rest[done:at] + self.host_piece(pos, size)
            done = at
        return out + rest[done:]

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
        self.sock.close()


@pytest.fixture
def pair(monkeypatch):
    monkeypatch.delenv(frames.PAYLOAD_RING_ENV, raising=False)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    made = []

    def connect(ring: PayloadRing | None):
        transport = FrameTransport(ours, (("k", "v"),), ring)
        daemon = Daemon(theirs)
        made.append((transport, daemon))
        return transport, daemon

    yield connect
    for transport, daemon in made:
        transport.close()
        daemon.close()


def chunk_pieces(data: bytes, offset: int = 0) -> list:
    return wire.argument_chunk_event("call-1", memoryview(data), offset)


def drain(transport: FrameTransport, want: int = 1) -> tuple[list, tuple | None]:
    got: list = []
    status = None
    for _ in range(200):
        messages, status, _ = transport.drain()
        got += [m.join() if type(m) is SplitMessage else bytes(m) for m in messages]
        if status is not None or len(got) >= want:
            break
    return got, status


def test_large_bulk_fields_are_marked_small_ones_are_not():
    big = chunk_pieces(b"x" * wire.BULK_MIN_BYTES)
    (head,) = [piece for piece in big if type(piece) is wire.BulkHead]
    assert head.size == wire.BULK_MIN_BYTES
    assert not any(type(piece) is wire.BulkHead for piece in chunk_pieces(b"x" * (wire.BULK_MIN_BYTES - 1)))
    start = wire.start_call_event("c", "mod::fn", memoryview(b"a" * 100_000), 0, b"", 0)
    assert [piece.size for piece in start if type(piece) is wire.BulkHead] == [100_000]


@pytest.mark.asyncio
async def test_hello_shares_a_sealed_ring_and_pieces_go_through_it_once_accepted(pair):
    import fcntl

    ring = PayloadRing(1 << 20)
    transport, daemon = pair(ring)
    assert daemon.hello[frames.PAYLOAD_RING_KEY] == "1"
    assert daemon.ring_bytes == 1 << 20
    assert ring.fd == -1  # the host's descriptor is closed once sent
    data = os.urandom(100 * 1024)  # fits the socket's buffer: no loop turn needed
    # Before the daemon says it maps the ring, everything goes inline.
    expected = b"".join(bytes(piece) for piece in chunk_pieces(data))
    assert transport.write(chunk_pieces(data)) >= 0
    kind, body = daemon.frame()
    assert (kind, body) == (MESSAGE, expected)
    daemon.accept()
    assert drain(transport, 0) == ([], None)
    # Now the bulk bytes go into the ring; the frame says where.
    transport.write(chunk_pieces(data, 5))
    kind, body = daemon.frame()
    assert kind == RING_MESSAGE and len(body) < 100
    assert daemon.message(kind, body) == b"".join(bytes(piece) for piece in chunk_pieces(data, 5))
    # Small messages are untouched.
    transport.write([wire.ack_events(["a"])])
    assert daemon.frame() == (MESSAGE, wire.ack_events(["a"]))
    # A fresh memfd of our own is sealed the same way (the daemon checks it).
    other = PayloadRing(1 << 16)
    seals = fcntl.fcntl(other.fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
    other.close()


def test_the_native_copy_copies_any_piece_and_refuses_one_that_does_not_fit():
    copy = native_copy()
    assert copy is not None  # the unit tests run with the native module
    source = os.urandom(COPY_FUNCTION_BYTES * 2 + 77)
    for size, at, start in ((COPY_FUNCTION_BYTES * 2 + 70, 65, 3), (COPY_FUNCTION_BYTES, 0, 64), (1000, 7, 1)):
        target = bytearray(size + at + 130)
        copy(memoryview(target), at, memoryview(source)[start : start + size])
        assert target[at : at + size] == source[start : start + size]
        assert target[:at] == bytes(at) and target[at + size :] == bytes(130)
    target = bytearray(100)
    with pytest.raises(ValueError, match="does not fit|offset"):
        copy(target, 90, b"x" * 11)
    with pytest.raises(ValueError):
        copy(target, -1, b"x")
    with pytest.raises(BufferError):
        copy(b"read-only" * 10, 0, b"x")
    assert target == bytes(100)


def _address(view) -> int:
    """Where a writable buffer's bytes start."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _resident_pages(view) -> int:
    """Pages of `view` (page-aligned start and length) resident now."""
    libc = ctypes.CDLL(None, use_errno=True)
    vec = (ctypes.c_ubyte * (len(view) // mmap.PAGESIZE))()
    assert libc.mincore(ctypes.c_void_p(_address(view)), ctypes.c_size_t(len(view)), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec)


def test_the_prefault_fills_the_whole_huge_pages_of_a_large_target_only():
    prefault = native_prefault()
    assert prefault is not None  # the unit tests run with the native module
    huge = 2 << 20
    for size in (PREFAULT_TARGET_BYTES, 12 * huge + 4097, 64 << 20):
        region = mmap.mmap(-1, size + 3 * huge)  # fresh pages, none touched
        view = memoryview(region)
        start = -_address(view) % huge + 4096  # one page past a huge page's start
        target = view[start : start + size]
        huge_bytes, small_bytes = prefault(target)
        done = huge_bytes + small_bytes
        # Every whole 2 MiB page inside the target: all but under 2 MiB at each end.
        assert done % huge == 0 and size - 2 * huge < done <= size
        inside = view[start + huge - 4096 : start + huge - 4096 + done]
        assert _resident_pages(inside) == done // mmap.PAGESIZE
        assert _resident_pages(view[start - 4096 : start + huge - 4096]) == 0  # the head: left to the writes
        assert bytes(target[-4096:]) == bytes(4096)
        del target, inside, view
        region.close()
    assert prefault(bytearray(PREFAULT_TARGET_BYTES - 1)) == (0, 0)
    with pytest.raises(BufferError):
        prefault(b"read-only" * (1 << 20))


def test_agentix_prefault_off_turns_the_prefault_off(monkeypatch):
    from agentix.runtime.client import payload_ring

    for setting, on in (("off", False), ("0", False), (" OFF ", False), ("", True), ("on", True)):
        monkeypatch.setenv(payload_ring.PREFAULT_ENV, setting)
        assert (native_prefault() is not None) is on
    monkeypatch.delenv(payload_ring.PREFAULT_ENV)
    assert native_prefault() is not None


def test_a_new_buffer_is_a_bytearray_of_its_size_with_a_fresh_ones_pages_filled_at_once():
    new_buffer = native_new_buffer()
    assert new_buffer is not bytearray  # the unit tests run with the native module
    for size in (0, 1, 300 * 1024, (4 << 20) + (64 << 10)):
        buffer = new_buffer(size)
        assert type(buffer) is bytearray and len(buffer) == size
        buffer[:] = b"\x01" * size  # writable in full, as a frame read into it
        assert buffer.count(1) == size
    # A fresh allocation (above 32 MiB glibc always maps one afresh, whatever
    # its sliding mmap threshold): its whole pages are there before anything
    # is written.
    buffer = new_buffer(33 << 20)
    view = memoryview(buffer)
    inside = view[-_address(view) % mmap.PAGESIZE :]
    whole = len(inside) // mmap.PAGESIZE
    assert _resident_pages(inside[: whole * mmap.PAGESIZE]) == whole
    del inside, view
    with pytest.raises(ValueError):
        new_buffer(-1)
    with pytest.raises(TypeError):
        new_buffer("4096")


def test_puts_fill_only_ring_pages_no_put_reached_before_large_runs_of_them():
    from agentix.runtime.client import payload_ring

    minimum = payload_ring._POPULATE_MIN_BYTES
    ring = PayloadRing(4 * minimum)
    try:
        assert ring._populate is not None  # the unit tests run with the native module
        filled = []

        def record(target):
            filled.append(len(target))
            return payload_ring.native_populate_fresh()(target)

        ring._populate = record
        big = os.urandom(minimum + 4096)
        first = ring.put([memoryview(big)], len(big))
        assert first == 0 and filled == [len(big)]
        assert bytes(ring._out[: len(big)]) == big
        # Released: the ring restarts at its start, whose pages are not fresh.
        struct.pack_into("<Q", ring._map, 64, len(big))
        again = ring.put([memoryview(big)], len(big))
        assert again % ring.ring_bytes == 0 and filled == [len(big)]
        # A small piece past them is left to the copy; the next large one
        # fills only what is fresh after it.
        small = b"s" * 8192
        ring.put([memoryview(small)], len(small))
        assert filled == [len(big)]
        nxt = os.urandom(minimum)
        at = ring.put([memoryview(nxt)], len(nxt))
        assert filled == [len(big), len(nxt)]
        offset = at % ring.ring_bytes
        assert bytes(ring._out[offset : offset + len(nxt)]) == nxt
    finally:
        ring.close()


def test_agentix_prefault_off_leaves_the_rings_pages_to_the_copy(monkeypatch):
    from agentix.runtime.client import payload_ring

    monkeypatch.setenv(payload_ring.PREFAULT_ENV, "off")
    assert payload_ring.native_populate_fresh() is None
    ring = PayloadRing(1 << 20)
    try:
        assert ring._populate is None
        data = os.urandom(600 << 10)
        assert ring.put([memoryview(data)], len(data)) == 0
        assert bytes(ring._out[: len(data)]) == data
    finally:
        ring.close()
    monkeypatch.delenv(payload_ring.PREFAULT_ENV)
    assert payload_ring.native_populate_fresh() is not None


def test_agentix_prefault_off_makes_new_buffers_plain_bytearrays(monkeypatch):
    from agentix.runtime.client import payload_ring

    monkeypatch.setenv(payload_ring.PREFAULT_ENV, "off")
    assert native_new_buffer() is bytearray
    monkeypatch.delenv(payload_ring.PREFAULT_ENV)
    assert native_new_buffer() is not bytearray


def test_a_chunked_decode_prefaults_each_large_value_before_filling_it():
    handed = []

    def prefault(target):
        handed.append(len(target))
        return (0, 0)

    value = ([os.urandom(PREFAULT_TARGET_BYTES + 5), b"y" * (PREFAULT_TARGET_BYTES - 1)], bytearray(b"z" * (5 << 20)))
    data = pickle.dumps(value, protocol=5)
    chunks = [data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    assert restricted_loads_chunks(chunks, copy=native_copy(), prefault=prefault) == value
    # The two values of 4 MiB or more, each handed over once (before its
    # bytes are copied in: they are right afterwards); the smaller one never.
    assert handed == [PREFAULT_TARGET_BYTES + 5, 5 << 20]


def test_a_prefaulted_value_of_32_mib_or_more_is_copied_by_the_copy_function():

    value = os.urandom(1 << 20) * (COPY_FUNCTION_MAX_VALUE // (1 << 20) + 1)
    data = pickle.dumps(value, protocol=5)
    chunks = [data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    for done, copied in (((0, 0), False), ((2 << 20, len(value) - (4 << 20)), True)):
        copies = []

        def copy(target, offset, source):
            copies.append(len(source))
            native_copy()(target, offset, source)

        # A fresh mapping left to fault in is filled by memcpy (its zeroed
        # lines are cached); one faulted in first by the copy function.
        assert restricted_loads_chunks(list(chunks), copy=copy, prefault=lambda target: done) == value
        assert (sum(copies) > len(value) // 2) is copied


@pytest.mark.asyncio
async def test_pieces_of_a_mebibyte_go_through_the_ring_byte_for_byte(pair):
    transport, daemon = pair(PayloadRing(4 << 20))
    daemon.accept()
    drain(transport, 0)
    data = os.urandom((1 << 20) + 13)  # streamed by the native copy
    transport.write(chunk_pieces(data, 3))
    kind, body = daemon.frame()
    assert kind == RING_MESSAGE
    assert daemon.message(kind, body) == b"".join(bytes(piece) for piece in chunk_pieces(data, 3))


@pytest.mark.asyncio
async def test_a_full_ring_sends_inline_and_a_released_one_restarts_at_its_start(pair):
    transport, daemon = pair(PayloadRing(256 * 1024))
    daemon.accept()
    drain(transport, 0)
    first, second = os.urandom(200 * 1024), os.urandom(100 * 1024)
    transport.write(chunk_pieces(first))
    kind, body = daemon.frame()
    assert kind == RING_MESSAGE
    assert struct.unpack_from("<IQQ", body, 2)[1] == 0
    transport.write(chunk_pieces(second))  # 56 KiB left: inline
    kind, body = daemon.frame()
    assert kind == MESSAGE and daemon.message(kind, body).count(second) == 1
    daemon.release_host(200 * 1024)  # the daemon took the first
    transport.write(chunk_pieces(second))
    kind, body = daemon.frame()
    assert kind == RING_MESSAGE
    # An empty ring starts again at its start (the next lap's offset 0).
    assert struct.unpack_from("<IQQ", body, 2)[1] == 256 * 1024
    assert daemon.message(kind, body) == b"".join(bytes(piece) for piece in chunk_pieces(second))
    # A garbage release counter from the daemon only makes pieces go inline.
    daemon.release_host(1 << 40)
    transport.write(chunk_pieces(first))
    assert daemon.frame()[0] == MESSAGE


@pytest.mark.asyncio
async def test_results_come_back_through_the_ring_and_it_is_released(pair):
    transport, daemon = pair(PayloadRing(1 << 20))
    daemon.accept()
    value = os.urandom(400 * 1024)
    # A message "head" + value + "tail", the value in the daemon's ring.
    daemon.put(0, value)
    ring_frame = struct.pack("<HIQQ", 1, 4, 0, len(value)) + b"headtail"
    daemon.sock.sendall(encode(RING_MESSAGE, ring_frame) + encode(MESSAGE, b"after"))
    got, status = drain(transport, 2)
    assert status is None
    assert got == [b"head" + value + b"tail", b"after"]
    # Released once nothing refers to the piece any more (the next read or write).
    transport.drain()
    assert daemon.host_released() == len(value)


@pytest.mark.asyncio
async def test_a_result_chunk_in_the_ring_is_a_view_kept_until_it_is_dropped(pair):
    transport, daemon = pair(PayloadRing(1 << 20))
    daemon.accept()
    data = os.urandom(200 * 1024)
    daemon.put(0, data)
    daemon.put(len(data), data[::-1])
    # Two ResultChunk events, each with its data in the ring, and a result.
    response = pb.CallsResponse()
    response.events.add().result_chunk.call_id = "c1"
    response.events[0].result_chunk.data = data
    response.events.add().result_chunk.call_id = "c1"
    response.events[1].result_chunk.data = data[::-1]
    response.events.add().result.call_id = "c1"
    message = response.SerializeToString()
    first = message.find(data)
    second = message.find(data[::-1])
    rest = message[:first] + message[first + len(data) : second] + message[second + len(data) :]
    head = struct.pack("<HIQQIQQ", 2, first, 0, len(data), second - len(data), len(data), len(data))
    daemon.sock.sendall(encode(RING_MESSAGE, head + rest))
    (split,) = transport.drain()[0]
    assert type(split) is SplitMessage and split.join() == message
    chunk_a, chunk_b, result = wire.parse_calls_response(split)
    assert type(chunk_a) is wire.RawResultChunk and chunk_a.call_id == "c1"
    assert bytes(chunk_a.data) == data and bytes(chunk_b.data) == data[::-1]
    assert result.call_id == "c1"
    del split
    transport.drain()
    assert daemon.host_released() == 0  # both chunks are referred to
    keep = chunk_b.data[10:]  # a slice keeps its piece too
    del chunk_a
    transport.drain()
    assert daemon.host_released() == len(data)  # the first is free; the second is not
    del chunk_b
    transport.drain()
    assert daemon.host_released() == len(data)
    assert bytes(keep) == data[::-1][10:]
    del keep
    transport.write([wire.ack_events(["c1"])])  # a write releases too
    assert daemon.host_released() == 2 * len(data)


@pytest.mark.parametrize(
    "piece, why",
    [
        ((4, (1 << 20) - 5, 10), "outside"),  # across the ring's end
        ((4, 0, 0), "outside"),  # empty
        ((9, 0, 10), "out of order"),  # past the bytes that came
    ],
)
@pytest.mark.asyncio
async def test_a_bad_ring_piece_from_the_daemon_fails_the_stream(pair, piece, why):
    transport, daemon = pair(PayloadRing(1 << 20))
    daemon.accept()
    daemon.sock.sendall(encode(RING_MESSAGE, struct.pack("<HIQQ", 1, *piece) + b"headtail"))
    got, status = drain(transport, 1)
    assert got == []
    assert status is not None and status[0] == 13 and why in status[1], status


@pytest.mark.asyncio
async def test_a_released_piece_cannot_be_taken_again(pair):
    transport, daemon = pair(PayloadRing(1 << 20))
    daemon.accept()
    daemon.put(0, b"v" * 100)
    one = encode(RING_MESSAGE, struct.pack("<HIQQ", 1, 0, 0, 100))
    daemon.sock.sendall(one + one)  # the second names released bytes
    got, status = drain(transport, 2)
    assert got == [b"v" * 100]
    assert status is not None and status[0] == 13 and "already released" in status[1]


@pytest.mark.asyncio
async def test_a_ring_message_without_a_ring_fails_the_stream(pair):
    transport, daemon = pair(None)
    assert frames.PAYLOAD_RING_KEY not in daemon.hello and daemon.fds == []
    daemon.accept()
    got, status = drain(transport, 1)
    assert status is not None and status[0] == 13 and "unasked" in status[1]


@pytest.mark.asyncio
async def test_agentix_payload_ring_off_shares_no_ring(monkeypatch, tmp_path):
    path = str(tmp_path / "d.sock.calls")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    wire_choice = frames.FrameWire(f"unix://{tmp_path / 'd.sock'}", tls=False)
    try:
        for setting, shared in (("off", False), ("0", False), ("", True), ("on", True)):
            monkeypatch.setenv(frames.PAYLOAD_RING_ENV, setting)
            transport = wire_choice.transport(())
            conn, _ = listener.accept()
            daemon = Daemon(conn)
            assert (frames.PAYLOAD_RING_KEY in daemon.hello) is shared
            assert bool(daemon.fds) is shared
            # A Namespace stream never shares one.
            transport.close()
            daemon.close()
        ns = wire_choice.transport((), frames.NAMESPACE_STREAM)
        conn, _ = listener.accept()
        daemon = Daemon(conn)
        assert frames.PAYLOAD_RING_KEY not in daemon.hello and daemon.fds == []
        ns.close()
        daemon.close()
    finally:
        listener.close()
