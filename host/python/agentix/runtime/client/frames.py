"""The Calls stream over the daemon's frame wire (docs/FRAME-WIRE.md).

A daemon listening on ``unix://PATH`` also listens on ``PATH.calls``, where
the Calls stream runs without gRPC: length-prefixed frames carrying the same
serialized ``CallsRequest`` / ``CallsResponse`` bytes as the gRPC stream::

    u32le N, u8 kind, N bytes of payload
    kinds: 1 HELLO (metadata), 2 MESSAGE, 3 HALF_CLOSE, 4 STATUS (u32le code, details)

No threads take part on the host: the event loop reads the socket itself
(``loop.add_reader``), `FrameTransport.write` sends at once from the
coroutine that queued the events (a non-blocking ``sendmsg``; only what the
socket does not take is left to ``loop.add_writer``). `FrameCallsStream`
is `NativeCallsStream` (batching, acks, uploads, write-ahead throttling)
over a `FrameTransport`, which offers the native transport's interface.

Which wire carries the Calls stream (`FrameWire`): ``AGENTIX_CALLS_WIRE``
``auto`` uses the frame wire when the target is ``unix://PATH``
without TLS and ``PATH.calls`` accepts a connection, else gRPC; ``frames``
requires it (`RuntimeUnreachable` when it cannot be had); ``grpc`` never
uses it. Unset is ``auto``. The same choice puts each plugin Namespace stream
on the frame wire (a connection of its own whose HELLO says
``agentix-stream: namespace``; `FrameWire.transport`); Logs and Traces stay on
gRPC.

A Calls stream's connection shares a payload ring with the daemon
(`PayloadRing`, HELLO's ``agentix-payload-ring`` with the memfd): large
argument pieces go out, and large result pieces come back, as RING_MESSAGE
frames naming their place in it instead of carrying them.
``AGENTIX_PAYLOAD_RING=off`` (or ``0``) sends none (every piece inline);
a daemon that does not answer the ring (an older one) is sent none either.

``AGENTIX_CALLS_CPU`` places the thread that runs the client's event loop
on one CPU while it waits for the daemon, or for good
(`agentix.runtime.client.pinned_waits`); a Calls stream's HELLO then names
that CPU (``agentix-calls-cpu``) so that the daemon's call path runs there
too (docs/FRAME-WIRE.md, "Wake-ups").

``AGENTIX_CALLS_DIRECT`` (`agentix.runtime.client.hello`): whether a Calls
connection asks the daemon to hand it to the worker (docs/DIRECT-CALLS.md).
"""

from __future__ import annotations

import asyncio
import array
import collections
import errno
import itertools
import logging
import os
import socket
import struct
from collections.abc import Callable

import grpc

from agentix.runtime.client import wire
from agentix.runtime.client.channels import NativeTransport
from agentix.runtime.client._sio_facade import AsyncClientNamespace
from agentix.runtime.client.errors import RuntimeUnreachable
from agentix.runtime.client.hello import (
    CALLS_DIRECT_ENV,
    NAMESPACE_STREAM,
    PAYLOAD_RING_KEY,
    STREAM_KEY,
    decode_hello,
    direct_calls_keys,
    encode_hello,
)
from agentix.runtime.client.loop_slice import loop_slice_us
from agentix.runtime.client.namespaces import (
    NAMESPACE_METHOD,
    FrameNamespaceStream,
    NamespaceStream,
    NativeNamespaceStream,
)
from agentix.runtime.client.payload_ring import PayloadRing, native_new_buffer, ring_frame, split_message
from agentix.runtime.client.pending import PendingCall
from agentix.runtime.client.pinned_waits import (
    CALLS_CPU_ENV,
    CALLS_CPU_FOLLOW_CHANGES,
    CALLS_CPU_FOLLOW_KEY,
    CALLS_CPU_KEY,
    PinnedWaits,
    calls_cpu_setting,
    follow_daemon,
    pinned_waits,
    wait_yield_setting,
)
from agentix.runtime.client.stream import CallsStream, NativeCallsStream, coalesce_starts
from agentix.runtime.client.wire_choice import (
    CALLS_WIRE_ENV,
    PAYLOAD_RING_ENV,
    calls_socket_path,
    connect_calls_socket as _connect,
    payload_ring_wanted,
    wire_mode,
)
from agentix.runtime.v1 import runtime_pb2 as pb

__all__ = [
    "CALLS_CPU_ENV",
    "CALLS_DIRECT_ENV",
    "CALLS_WIRE_ENV",
    "FrameCallsStream",
    "FrameTransport",
    "FrameWire",
    "HALF_CLOSE",
    "HELLO",
    "MAX_PAYLOAD",
    "MESSAGE",
    "NAMESPACE_STREAM",
    "PAYLOAD_RING_ENV",
    "PAYLOAD_RING_KEY",
    "RING_MESSAGE",
    "STATUS",
    "payload_ring_wanted",
    "STREAM_KEY",
    "calls_socket_path",
    "decode_hello",
    "encode_hello",
    "frame",
    "wire_mode",
]

_log = logging.getLogger("agentix.runtime.client")

HELLO, MESSAGE, HALF_CLOSE, STATUS, RING_MESSAGE = 1, 2, 3, 4, 5
_HEADER = struct.Struct("<IB")
_HEADER_BYTES = _HEADER.size
_unpack_header = _HEADER.unpack_from  # (size, kind) of the frame at a buffer's start
# The largest payload either side sends (the daemon's gRPC message limit,
# wire/wire_limits.h); a longer frame from the daemon is a broken stream.
MAX_PAYLOAD = (4 << 20) + (64 << 10)
_UNAVAILABLE = 14
_INTERNAL = 13
# Frames up to this size are read into one reusable buffer (and copied out);
# a longer one is read straight into a buffer of its own.
_READ_BYTES = 256 * 1024
# Buffers of long frames (result chunks) are reused once nothing refers to
# their bytes any more; at most this many bytes of them are kept (a 16 MiB
# result's 1 MiB chunks with their framing).
_SPARE_BYTES = (16 << 20) + (64 << 10)
# At most this many buffers go to one sendmsg (Linux's IOV_MAX is 1024).
_IOV_MAX = 1024


def frame(kind: int, payload: bytes = b"") -> bytes:
    """One encoded frame."""
    return _HEADER.pack(len(payload), kind) + payload


class FrameWire:
    """Chooses, at each (re)connection of one client, which wire its Calls
    stream runs on (see the module docstring).

    Args:
      target: the client's gRPC target (``unix:///PATH``, ``host:port``).
      tls: whether the client uses TLS (then the frame wire, which has none,
        is not used: ``auto`` falls back, ``frames`` is an error).
    """

    __slots__ = ("_path", "_tls", "waits", "_told_off")

    def __init__(self, target: str, tls: bool) -> None:
        self._path = calls_socket_path(target)
        self._tls = tls
        # The loop thread's pinned waits (``AGENTIX_CALLS_CPU=wait``) once a
        # Calls stream connected on the frame wire; None otherwise.
        self.waits: PinnedWaits | None = None
        self._told_off: PinnedWaits | None = None  # waits a daemon said not to pin

    def preferred(self) -> bool:
        """Whether the next Calls stream tries the frame wire first: the
        native transport's grpc++ channel is then only a fallback, made when
        first needed (`NativeTransport.defer`). False for a bad
        ``AGENTIX_CALLS_WIRE`` (`calls_stream` raises for it)."""
        try:
            mode = wire_mode()
        except ValueError:
            return False
        return mode != "grpc" and self._path is not None and not self._tls

    def calls_stream(
        self,
        native: NativeTransport,
        channel: grpc.aio.Channel,
        metadata: tuple,
        pending: dict[str, PendingCall],
        on_lost: Callable[[CallsStream, BaseException | None], None],
    ) -> CallsStream:
        """A new Calls stream of a client: on the frame wire (`transport`), else
        on the native transport's grpc++ channel, else on grpc.aio `channel`.
        Raises as `transport`, or ValueError for a bad setting (nothing opened)."""
        coalesce_starts()
        frames = self.transport(metadata)
        if frames is not None:
            return FrameCallsStream(frames, pending, on_lost)
        transport = native.transport(metadata)
        if transport is not None:
            return NativeCallsStream(transport, pending, on_lost)
        # Not the generated stub: argument and result chunks bypass protobuf
        # messages (wire.py). Responses come as bytes: CallsStream parses
        # them itself, where a message it cannot read is an exception it
        # sees (gRPC's deserializer would log it and hand over None).
        rpc = channel.stream_stream(
            wire.CALLS_METHOD,
            request_serializer=None,  # CallsStream writes encoded bytes
            response_deserializer=None,
        )(metadata=metadata)
        return CallsStream(rpc, pending, on_lost)

    def namespace_stream(
        self, native: NativeTransport, channel: grpc.aio.Channel, metadata: tuple, ns: AsyncClientNamespace
    ) -> NamespaceStream | NativeNamespaceStream:
        """A new Namespace stream for `ns`, chosen as `calls_stream` chooses:
        on the frame wire (HELLO ``agentix-stream: namespace``), else on the
        native transport, else on grpc.aio `channel`. Raises as `transport`."""
        frames = self.transport(metadata, NAMESPACE_STREAM)
        if frames is not None:
            return FrameNamespaceStream(frames, ns)
        transport = native.transport(metadata, NAMESPACE_METHOD)
        if transport is not None:
            return NativeNamespaceStream(transport, ns)
        # Responses come as bytes, as for CallsStream: the stream reads them.
        rpc = channel.stream_stream(NAMESPACE_METHOD, request_serializer=pb.NamespaceRequest.SerializeToString,
                                    response_deserializer=None)(metadata=metadata)
        return NamespaceStream(rpc, ns)

    def transport(self, metadata: tuple, stream: str | None = None) -> FrameTransport | None:
        """A connected `FrameTransport` (HELLO sent), or None for gRPC.
        `stream` names the RuntimeService stream it carries (HELLO's
        `STREAM_KEY`; None: Calls).

        Raises:
          RuntimeUnreachable: ``AGENTIX_CALLS_WIRE=frames`` and the frame wire
            cannot be used (no Unix target, TLS, or ``PATH.calls`` refuses).
          ValueError: ``AGENTIX_CALLS_WIRE`` has another value, or
            ``AGENTIX_CALLS_CPU`` (see `calls_cpu_setting`),
            ``AGENTIX_LOOP_SLICE_US`` (`loop_slice_us`), ``AGENTIX_WAIT_YIELD``
            (`wait_yield_setting`) or ``AGENTIX_CALLS_DIRECT`` a wrong one.
        """
        mode = wire_mode()
        direct = direct_calls_keys()
        placement = calls_cpu_setting()
        slice_us = loop_slice_us() if placement.mode == "wait" else 0
        yields = wait_yield_setting() if placement.mode == "wait" else False
        if stream is None:
            self.waits = None
        if mode == "grpc":
            return None
        if self._path is None or self._tls:
            if mode == "frames":
                why = "TLS is on" if self._tls else "the target is not a unix:// socket"
                raise RuntimeUnreachable(f"{CALLS_WIRE_ENV}=frames, but the frame wire cannot be used: {why}")
            return None
        try:
            sock = _connect(self._path)
        except OSError as error:
            if mode == "frames":
                raise RuntimeUnreachable(
                    f"{CALLS_WIRE_ENV}=frames, but the daemon's frame wire {self._path} cannot be reached "
                    f"({errno.errorcode.get(error.errno or 0, 'error')}: {error.strerror}); "
                    "is the daemon running with --calls_socket?"
                ) from error
            # An older daemon, or one run with --nocalls_socket: gRPC does the same job.
            _log.debug("frame wire %s not available, using gRPC: %r", self._path, error)
            return None
        cpu = placement.cpu
        if placement.mode == "always" and cpu is not None:
            # The calling thread only (pid 0): the loop that reads and writes the socket.
            os.sched_setaffinity(0, {cpu})
        ring = None
        metadata = (*metadata, *direct)  # either stream may be served by the worker
        if stream is not None:
            metadata = (*metadata, (STREAM_KEY, stream))
        else:  # a Calls stream
            waits = self.waits = pinned_waits(placement, slice_us, yields)
            if waits is not None:
                cpu = waits.cpu
            if cpu is not None:  # the daemon's call path may follow it
                metadata = (*metadata, (CALLS_CPU_KEY, str(cpu)))
            if waits is not None and placement.follow:  # and we may follow its probe
                metadata = (*metadata, (CALLS_CPU_FOLLOW_KEY, CALLS_CPU_FOLLOW_CHANGES))
        if stream is None and payload_ring_wanted():
            try:
                ring = PayloadRing()
            except OSError as error:  # no memfd here: every piece goes inline
                _log.debug("no payload ring for the frame wire: %r", error)
        transport = FrameTransport(sock, metadata, ring)
        if stream is None and placement.follow and self.waits is not None:
            transport.told = self._told_by_daemon
        return transport

    def _told_by_daemon(self, pin: bool) -> None:
        """The daemon's probe said whether pinning our waits pays: told off, the
        client's calls skip them (``remote`` holds none), as with ``off``."""
        waits = self.waits or self._told_off
        if waits is not None:
            follow_daemon(waits, pin)
            self.waits, self._told_off = (waits, None) if pin else (None, waits)


class FrameTransport:
    """One frame-wire connection, with the interface `NativeCallsStream`
    uses of the native ``CallsTransport``: `fileno` (watched for reading),
    `write`, `notify_below`, `writes_done`, `drain`, `close`. Write progress
    (leftovers written, an error seen) is signalled by calling `on_progress`.

    Takes over `sock` (connected, non-blocking) and sends the HELLO frame
    carrying `metadata` at once; MESSAGE frames may follow without waiting.
    With `ring` (taken over too), HELLO shares it; large bulk pieces go
    through it once the daemon has answered that it maps it.
    """

    __slots__ = (
        "_sock",
        "_fd",
        "_loop",
        "_out",
        "_waiting",
        "_notify_at",
        "_below",
        "_status",
        "_write_error",
        "_closed",
        "_buf",
        "_view",
        "_have",
        "_big",
        "_big_size",
        "_big_have",
        "_big_kind",
        "_header_first",
        "_spare",
        "_spare_bytes",
        "_ring",
        "_ring_ready",
        "on_progress",
        "told",
    )

    def __init__(self, sock: socket.socket, metadata: tuple, ring: PayloadRing | None = None) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._out: collections.deque = collections.deque()  # unwritten bytes, in order
        self._waiting = 0  # their count
        self._notify_at: int | None = None
        self._below = False
        self._status: tuple[int, str] | None = None
        self._write_error: OSError | None = None
        self._closed = False
        self._buf = bytearray(_READ_BYTES)
        self._view = memoryview(self._buf)
        self._have = 0
        self._big: bytearray | None = None  # a frame longer than _buf, being read
        self._big_size = 0  # its payload's length (the buffer may be longer)
        self._big_have = 0
        self._big_kind = 0
        # After a long frame, the next one's header is read alone, so that a
        # long frame's bytes go straight into its own buffer, not via _buf.
        self._header_first = False
        self._spare: collections.deque[bytearray] = collections.deque()  # buffers of long frames, oldest first
        self._spare_bytes = 0
        self.on_progress: Callable[[], None] | None = None
        # Takes the daemon's HELLO answer to CALLS_CPU_FOLLOW_KEY: pin or not.
        self.told: Callable[[bool], None] | None = None
        self._ring = ring
        self._ring_ready = False  # the daemon said it maps the ring
        fds = None
        if ring is not None:
            metadata = (*metadata, (PAYLOAD_RING_KEY, "1"))
            fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", (ring.fd,)))]
        hello = encode_hello(metadata)
        self._send([_HEADER.pack(len(hello), HELLO), hello], _HEADER_BYTES + len(hello), fds)
        if ring is not None:
            ring.close_fd()  # the daemon has its own descriptor now (or none: the stream failed)

    def fileno(self) -> int:
        return self._fd

    def write(self, pieces: list | bytes) -> int:
        """Sends one MESSAGE frame of the concatenated `pieces` (bytes and
        memoryviews, kept until written; or one bytes message, as the native
        transport takes it); returns the bytes still waiting to be written,
        or -1 when the stream is ending (`drain` brings its status)."""
        if self._write_error is not None or self._status is not None or self._closed:
            return -1
        if isinstance(pieces, bytes):
            pieces = [pieces]
        size = 0
        for piece in pieces:
            size += len(piece)
        ring = self._ring
        if self._ring_ready and ring is not None:
            if ring.held:
                ring.release_unreferenced()  # results decoded since the last read
            if size >= wire.BULK_MIN_BYTES:
                head, pieces, length = ring_frame(ring, pieces)
                if head is not None:  # some bulk bytes went into the ring
                    pieces.insert(0, _HEADER.pack(length, RING_MESSAGE) + head)
                    return self._send(pieces, length + _HEADER_BYTES)
        pieces.insert(0, _HEADER.pack(size, MESSAGE))
        size += _HEADER_BYTES
        if self._out or len(pieces) > _IOV_MAX:
            return self._send(pieces, size)
        # _send's common case inline (nothing waiting, the socket takes it all): no call per message.
        try:
            sent = self._sock.sendmsg(pieces)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as error:
            self._failed(error)
            return -1
        return 0 if sent == size else self._keep_unsent(pieces, sent)

    def write_frame(self, frame: bytes) -> int:
        """`write` of one whole MESSAGE frame, header included, with no bulk piece for the ring."""
        if self._out or self._write_error is not None or self._status is not None or self._closed:
            return self.write(frame[_HEADER_BYTES:])  # bytes waiting, or the stream ending: write's path
        if self._ring_ready and self._ring is not None and self._ring.held:
            self._ring.release_unreferenced()  # results decoded since the last read
        try:
            sent = self._sock.sendmsg((frame,))
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as error:
            self._failed(error)
            return -1
        return 0 if sent == len(frame) else self._keep_unsent([frame], sent)

    def writes_done(self) -> None:
        """Sends HALF_CLOSE: no more messages from the host."""
        if self._write_error is None and not self._closed:
            self._send([_HEADER.pack(0, HALF_CLOSE)], _HEADER_BYTES)

    def notify_below(self, threshold: int) -> None:
        """Calls `on_progress` (and makes `drain` say so) once at most
        `threshold` bytes wait to be written."""
        if self._waiting <= threshold:
            self._notify_at = None
            self._loop.call_soon(self._progress)
        else:
            self._notify_at = threshold

    def drain(self) -> tuple[list, tuple[int, str] | None, bool]:
        """Reads what the socket holds: (the MESSAGE payloads, the stream's
        status once it ended, whether write progress was signalled)."""
        messages: list = []
        ring = self._ring
        if ring is not None and ring.held:
            ring.release_unreferenced()
        if self._status is None and not self._closed:
            sock, buf = self._sock, self._buf  # the read loop is inline: no call per response
            while self._status is None:
                big = self._big
                if big is not None:
                    target = memoryview(big)[self._big_have : self._big_size]
                elif self._header_first and self._have < _HEADER_BYTES:
                    target = self._view[self._have : _HEADER_BYTES]
                else:
                    target = self._view[self._have :]
                # Never recvmsg: no control buffer, so the kernel closes any fds a
                # peer sends with SCM_RIGHTS (a direct peer is untrusted; DIRECT-CALLS.md).
                try:
                    count = sock.recv_into(target)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as error:
                    self._status = (_UNAVAILABLE, f"frame wire read failed: {error}")
                    break
                if count == 0:
                    self._status = (_UNAVAILABLE, "the daemon closed the frame wire without a status")
                    break
                if big is not None:
                    self._big_have += count
                    if self._big_have == self._big_size:
                        self._big = None
                        self._header_first = True
                        # A view, never the buffer itself: while the message (or
                        # a result chunk cut from it) is alive, _take skips it.
                        self._frame(self._big_kind, memoryview(big)[: self._big_size], messages)
                        self._keep(big)
                elif self._have or count <= _HEADER_BYTES or _unpack_header(buf) != (count - _HEADER_BYTES, MESSAGE):
                    self._have += count
                    self._parse(messages)
                else:  # one whole MESSAGE frame into an empty buffer (a sequential call's result): no _parse
                    messages.append(bytes(self._view[_HEADER_BYTES:count]))
                    self._header_first = False
                if count < len(target):
                    break  # the socket had no more
            if self._status is None and self._write_error is not None:
                self._status = (_UNAVAILABLE, f"frame wire write failed: {self._write_error}")
        below, self._below = self._below, False
        return messages, self._status, below

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._out:
                self._out.clear()
                self._loop.remove_writer(self._fd)
            self._sock.close()
            self._spare.clear()
            self._spare_bytes = 0
            if self._ring is not None:
                self._ring.close()

    def _progress(self) -> None:
        if self._closed:
            return
        self._below = True
        if self.on_progress is not None:
            self.on_progress()

    def _send(self, pieces: list, size: int, fds: list | None = None) -> int:
        out = self._out
        if out:  # leftovers are waiting: these go after them
            out.extend(pieces)
            self._waiting += size
            return self._waiting
        try:
            if len(pieces) > _IOV_MAX:
                pieces = [b"".join(pieces)]
            sent = self._sock.sendmsg(pieces, fds) if fds else self._sock.sendmsg(pieces)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as error:
            self._failed(error)
            return -1
        if sent == size:
            return 0
        return self._keep_unsent(pieces, sent)

    def _keep_unsent(self, pieces: list, sent: int) -> int:
        """Queues what `sendmsg` did not take of `pieces` (it took `sent`
        bytes) for `_on_writable`; returns the bytes waiting."""
        out = self._out
        for piece in pieces:
            length = len(piece)
            if sent >= length:
                sent -= length
            elif sent:
                out.append(memoryview(piece)[sent:])
                sent = 0
            else:
                out.append(piece)
        self._waiting = sum(len(piece) for piece in out)
        self._loop.add_writer(self._fd, self._on_writable)
        return self._waiting

    def _on_writable(self) -> None:
        out = self._out
        while out:
            batch = list(itertools.islice(out, _IOV_MAX))
            try:
                sent = self._sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                self._failed(error)
                return
            self._waiting -= sent
            short = sent < sum(len(piece) for piece in batch)
            while sent:
                length = len(out[0])
                if sent >= length:
                    out.popleft()
                    sent -= length
                else:
                    out[0] = memoryview(out[0])[sent:]
                    sent = 0
            if short:
                return  # the socket is full: wait until it is writable again
        self._loop.remove_writer(self._fd)
        if self._notify_at is not None and self._waiting <= self._notify_at:
            self._notify_at = None
            self._progress()

    def _failed(self, error: OSError) -> None:
        """A write failed (the daemon went away): the reader brings the
        status it sent, if any; the stream is told now."""
        self._write_error = error
        if self._out:
            self._out.clear()
            self._loop.remove_writer(self._fd)
        self._waiting = 0
        self._loop.call_soon(self._progress)

    def _parse(self, messages: list) -> None:
        buf, view, have = self._buf, self._view, self._have
        pos = 0
        while have - pos >= _HEADER_BYTES and self._status is None:
            size, kind = _HEADER.unpack_from(buf, pos)
            end = pos + _HEADER_BYTES + size
            if end <= have:
                self._header_first = False
                if kind == MESSAGE:  # (no call for the common case)
                    messages.append(bytes(view[pos + _HEADER_BYTES : end]))
                else:
                    self._frame(kind, bytes(view[pos + _HEADER_BYTES : end]), messages)
                pos = end
                continue
            if _HEADER_BYTES + size > len(buf):
                if size > MAX_PAYLOAD:
                    self._status = (_INTERNAL, f"frame wire: the daemon sent a frame of {size} bytes")
                    return
                big = self._take(size)
                part = have - pos - _HEADER_BYTES
                big[:part] = view[pos + _HEADER_BYTES : have]
                self._big, self._big_size, self._big_have, self._big_kind = big, size, part, kind
                pos = have
            break
        rest = have - pos
        if rest and pos:
            buf[:rest] = bytes(view[pos:have])
        self._have = rest

    def _take(self, size: int) -> bytearray:
        """A buffer for a frame payload of `size` bytes (longer than `_buf`):
        a kept one of at least that size (at most twice) whose bytes nobody
        refers to any more, else a new one (`native_new_buffer`: not zero-
        filled, fresh pages filled at once; a spare needs neither)."""
        for index, spare in enumerate(self._spare):
            if size <= len(spare) <= 2 * size and _unreferenced(spare):
                del self._spare[index]
                self._spare_bytes -= len(spare)
                return spare
        return native_new_buffer()(size)

    def _keep(self, buf: bytearray) -> None:
        """Remembers the buffer of a frame just read for reuse by `_take`,
        once the views made of its bytes (result chunks) are gone."""
        self._spare.append(buf)
        self._spare_bytes += len(buf)
        while self._spare_bytes > _SPARE_BYTES:
            self._spare_bytes -= len(self._spare.popleft())

    def _frame(self, kind: int, payload: bytes | bytearray | memoryview, messages: list) -> None:
        if kind == MESSAGE:
            messages.append(payload)
        elif kind == RING_MESSAGE:
            # The first, empty one says the daemon maps the ring; any other is
            # a message whose pieces lie in the daemon's ring.
            if self._ring is None:
                self._status = (_INTERNAL, "frame wire: the daemon sent a RING_MESSAGE unasked")
            elif len(payload) == 2 and payload[0] == payload[1] == 0:
                self._ring_ready = True
            else:
                try:
                    messages.append(split_message(self._ring, payload, MAX_PAYLOAD))
                except ValueError as error:
                    self._status = (_INTERNAL, f"frame wire: {error}")
        elif kind == HELLO:
            # The daemon's probe says whether pinning our waits pays (sent
            # only when asked: CALLS_CPU_FOLLOW_KEY).
            told = dict(decode_hello(payload)).get(CALLS_CPU_KEY)
            if told is not None and self.told is not None:
                self.told(told != "off")
        elif kind == STATUS and len(payload) >= 4:
            (code,) = struct.unpack_from("<I", payload)
            self._status = (code, bytes(payload[4:]).decode("utf-8", "replace"))
        else:
            self._status = (_INTERNAL, f"frame wire: the daemon sent a frame of kind {kind} ({len(payload)} bytes)")


def _unreferenced(buf: bytearray) -> bool:
    """True when no memoryview of `buf` (or of a slice of one) is alive: a
    bytearray whose buffer is exported cannot change size. The probe pops
    and re-appends the last byte, which never reallocates."""
    try:
        last = buf.pop()
    except BufferError:
        return False
    buf.append(last)
    return True


class FrameCallsStream(NativeCallsStream):
    """A `CallsStream` over a `FrameTransport` (the daemon's frame wire):
    `NativeCallsStream`'s logic, with the socket itself watched for reading
    and write progress reported by the transport's `on_progress`.

    Args:
      transport: a new `FrameTransport`; this stream owns and closes it.
      pending, on_lost: as for `CallsStream`.
    """

    def __init__(
        self,
        transport: FrameTransport,
        pending: dict[str, PendingCall],
        on_lost: Callable[[CallsStream, BaseException | None], None],
    ) -> None:
        super().__init__(transport, pending, on_lost)
        transport.on_progress = self._on_readable
        self._write_message, self._frame_kind = transport.write_frame, MESSAGE
