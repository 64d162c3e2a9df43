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

    def hello(self, token=TOKEN, client_id="e2e", extra=()):
        pairs = [("authorization", f"Bearer {token}"), ("agentix-client-id", client_id),
                 *extra]
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

    # A client that never says HELLO gets STATUS 4 before the connection
    # guard's auth timeout (1 s here) would close it without a word.
    silent = FrameClient(calls_path)
    start = time.monotonic()
    code, details, _ = silent.read_to_status()
    assert code == 4 and "HELLO" in details
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


# --- the Namespace stream on the frame wire (HELLO agentix-stream) ---------


def _namespace_hello(client, stream="namespace", token=TOKEN):
    pairs = [("authorization", f"Bearer {token}"), ("agentix-stream", stream)]
    client.send(HELLO, b"".join(
        struct.pack("<H", len(k)) + k.encode() + struct.pack("<I", len(v)) + v.encode() for k, v in pairs
    ))


def _namespace_request(**kind):
    return pb.NamespaceRequest(**kind).SerializeToString()


def _namespace_status(client):
    """(code, details) of the STATUS ending a namespace stream, skipping messages."""
    while True:
        frame = client.read()
        assert frame is not None, "EOF before STATUS"
        if frame[0] == STATUS:
            assert client.read() is None
            return struct.unpack("<I", frame[1][:4])[0], frame[1][4:].decode()


def test_a_plugin_namespace_over_the_frame_wire(start_daemon, tmp_path):
    from agentix.runtime.shared.codec import pack, unpack

    daemon = start_daemon(extra_args=["--token-file", _token_file(tmp_path), "--auth-timeout-s", "1"])
    calls_path = daemon.socket_path.with_name(daemon.socket_path.name + ".calls")
    # The sandbox registers its /echo namespace (plugin_targets.py).
    calls = FrameClient(calls_path)
    calls.hello()
    calls.call("register", "plugin_targets::configs_seen")
    calls.send(HALF_CLOSE)
    code, _, events = calls.read_to_status()
    assert code == 0 and pickle.loads(events["register"].result.value) == []
    calls.close()

    ns = FrameClient(calls_path)
    _namespace_hello(ns)
    ns.send(MESSAGE, _namespace_request(open=pb.OpenNamespace(namespace="/echo")))
    kind, payload = ns.read()
    opened = pb.NamespaceResponse.FromString(payload)
    assert kind == MESSAGE and opened.opened and opened.namespace == "/echo" and opened.instance_id
    # Past the connection guard's auth timeout: the HELLO authenticated it.
    time.sleep(2.0)
    ns.send(MESSAGE, _namespace_request(event=pb.NamespaceEvent(event="ping", data=pack({"n": 1}))))
    kind, payload = ns.read()
    (pong,) = pb.NamespaceResponse.FromString(payload).events
    assert kind == MESSAGE and pong.event == "pong" and unpack(pong.data) == {"echo": {"n": 1}}
    # The daemon's own event name is refused as on gRPC, and ends the stream.
    ns.send(MESSAGE, _namespace_request(event=pb.NamespaceEvent(event="agentix:host_connected")))
    code, details = _namespace_status(ns)
    assert code == 3 and "reserved" in details
    ns.close()


def test_namespace_frame_streams_refuse_unknown_streams_and_bad_tokens(start_daemon, tmp_path):
    daemon = start_daemon(extra_args=["--token-file", _token_file(tmp_path)])
    calls_path = daemon.socket_path.with_name(daemon.socket_path.name + ".calls")
    unknown = FrameClient(calls_path)
    _namespace_hello(unknown, stream="traces")
    code, details = _namespace_status(unknown)
    assert code == 12 and "traces" in details and "namespace" in details
    unknown.close()
    for token in ("wrong", ""):
        bad = FrameClient(calls_path)
        _namespace_hello(bad, token=token)
        code, details = _namespace_status(bad)
        assert code == 16, details
        bad.close()
    reserved = FrameClient(calls_path)
    _namespace_hello(reserved)
    reserved.send(MESSAGE, _namespace_request(open=pb.OpenNamespace(namespace="/rpc")))
    code, details = _namespace_status(reserved)
    assert code == 3 and "reserved" in details
    reserved.close()
