"""The daemon's frame wire (docs/FRAME-WIRE.md) against the real
`agentix-sandboxd` and `agentix-worker`, spoken with a raw socket written from
the spec: PATH.calls beside the gRPC socket, calls, the token, the connection
guard's auth timeout (a good HELLO authenticates the connection),
--nocalls_socket, and shutdown."""

import os
import pickle
import signal
import socket
import stat
import struct
import time

from agentix.runtime.v1 import runtime_pb2 as pb

TOKEN = "frame-wire-e2e-token"
HELLO, MESSAGE, HALF_CLOSE, STATUS = 1, 2, 3, 4


def _token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return str(path)


class FrameClient:
    def __init__(self, path, timeout=20.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))

    def send(self, kind, payload=b""):
        self.sock.sendall(struct.pack("<IB", len(payload), kind) + payload)

    def hello(self, token=TOKEN, client_id="e2e"):
        pairs = [("authorization", f"Bearer {token}"), ("agentix-client-id", client_id)]
        payload = b"".join(
            struct.pack("<H", len(k)) + k.encode() + struct.pack("<I", len(v)) + v.encode()
            for k, v in pairs
        )
        self.send(HELLO, payload)

    def call(self, call_id, callable_ref, *args):
        request = pb.CallsRequest()
        start = request.events.add().start
        start.call_id = call_id
        start.callable = callable_ref
        start.encoding = pb.ENCODING_PICKLE
        if args:
            start.arguments = pickle.dumps((args, {}))
        self.send(MESSAGE, request.SerializeToString())

    def _exactly(self, n):
        data = b""
        while len(data) < n:
            got = self.sock.recv(n - len(data))
            if not got:
                return None
            data += got
        return data

    def read(self):
        """(kind, payload) of the next frame, or None at EOF."""
        header = self._exactly(5)
        if header is None:
            return None
        length, kind = struct.unpack("<IB", header)
        return kind, self._exactly(length)

    def read_to_status(self):
        """(status code, details, {call_id: event}) up to the STATUS frame."""
        events = {}
        while True:
            frame = self.read()
            assert frame is not None, "EOF before STATUS"
            kind, payload = frame
            if kind == STATUS:
                assert self.read() is None  # closed after it
                return struct.unpack("<I", payload[:4])[0], payload[4:].decode(), events
            assert kind == MESSAGE
            response = pb.CallsResponse.FromString(payload)
            for event in response.events:
                which = event.WhichOneof("kind")
                events[getattr(event, which).call_id] = event

    def close(self):
        self.sock.close()


def test_calls_over_the_frame_wire(start_daemon, tmp_path):
    daemon = start_daemon(extra_args=["--token-file", _token_file(tmp_path),
                                      "--auth-timeout-s", "1"])
    calls_path = daemon.socket_path.with_name(daemon.socket_path.name + ".calls")
    mode = os.stat(calls_path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600

    c = FrameClient(calls_path)
    c.hello()
    c.call("noop", "e2e_targets::noop")
    c.call("echo", "e2e_targets::echo", "over frames")
    # Past the connection guard's auth timeout: a good HELLO authenticated
    # this connection, so it is not shut down.
    time.sleep(2.0)
    c.call("late", "e2e_targets::echo", "still open")
    c.send(HALF_CLOSE)
    code, details, events = c.read_to_status()
    assert (code, details) == (0, "")
    assert pickle.loads(events["noop"].result.value) is None
    assert pickle.loads(events["echo"].result.value) == "over frames"
    assert pickle.loads(events["late"].result.value) == "still open"
    c.close()

    bad = FrameClient(calls_path)
    bad.hello(token="wrong")
    code, details, _ = bad.read_to_status()
    assert code == 16 and "token" in details
    bad.close()

    # A client that never says HELLO is bounded by the auth timeout too.
    silent = FrameClient(calls_path)
    start = time.monotonic()
    assert silent.sock.recv(65536) is not None
    assert time.monotonic() - start < 5
    silent.close()


def test_shutdown_ends_streams_and_removes_the_socket(start_daemon, tmp_path):
    daemon = start_daemon(extra_args=["--token-file", _token_file(tmp_path)])
    calls_path = daemon.socket_path.with_name(daemon.socket_path.name + ".calls")
    c = FrameClient(calls_path)
    c.hello()
    c.call("warm", "e2e_targets::noop")
    frame = c.read()
    assert frame is not None and frame[0] == MESSAGE
    daemon.proc.send_signal(signal.SIGTERM)
    code, details, _ = c.read_to_status()
    assert code == 14, details
    deadline = time.monotonic() + 15
    while daemon.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert daemon.proc.returncode == 0, daemon.log()
    assert not calls_path.exists()
    assert not daemon.socket_path.exists()


def test_nocalls_socket_leaves_grpc_alone(start_daemon):
    daemon = start_daemon(extra_args=["--nocalls-socket"])
    calls_path = daemon.socket_path.with_name(daemon.socket_path.name + ".calls")
    assert not calls_path.exists()
    assert daemon.socket_path.exists()
