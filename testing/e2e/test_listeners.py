"""Connection handling of agentix-sandboxd under a peer without the token
(issue 17): listeners that survive running out of file descriptors, caps on
connections, the timeout for connections that make no authenticated RPC,
tokens that never fail open, the token out of reach of same-uid processes,
and a stopping daemon leaving a newer daemon's socket alone.

Everything runs on loopback and Unix sockets with small limits (a low
RLIMIT_NOFILE, small caps, a short timeout), so each test is bounded."""

import asyncio
import os
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

import e2e_targets as t
from agentix import RuntimeClient, Unauthenticated
from conftest import DIRECT_CALLS_ARGS, SANDBOXD, TARGETS_DIR, WORKER, _venv

pytestmark = pytest.mark.asyncio

TOKEN = "tok-" + "5" * 40
# No capabilities: a same-uid process as sandbox code is (root's
# CAP_SYS_PTRACE would read any process, dumpable or not).
NO_CAPS = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sandboxd:
    """agentix-sandboxd on a Unix socket and a loopback TCP port, with an
    optional open-file limit and command prefix."""

    def __init__(self, tmp_path, *, name="sandboxd", extra_args=(), env=None, nofile=None,
                 prefix=(), socket_path=None):
        self.socket_path = socket_path or tmp_path / f"{name}.sock"
        self.port = _free_port()
        self.unix_url = f"unix://{self.socket_path}"
        self.tcp_url = f"127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"{name}.log"
        self._log = open(self.log_path, "wb")

        def limit_fds():
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [*prefix, str(SANDBOXD), "--listen", self.unix_url, "--listen", self.tcp_url,
             "--worker", str(WORKER), "--venv", _venv(), "--python-path", str(TARGETS_DIR),
             *DIRECT_CALLS_ARGS, *extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=limit_fds,
            env={**os.environ, "AGENTIX_LOG_DIR": "", **(env or {})},
        )

    def wait_ready(self, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandboxd exited early:\n{self.log()}")
            if self.log().count("serving agentix.runtime.v1") >= 2:
                return self
            time.sleep(0.02)
        raise RuntimeError(f"sandboxd not ready in {timeout}s:\n{self.log()}")

    def wait_exit(self, timeout=15.0):
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.proc.poll()

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if self.wait_exit() is None:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def sandboxd(tmp_path):
    started = []

    def start(**kwargs):
        daemon = Sandboxd(tmp_path, **kwargs)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def _token_args(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN)
    path.chmod(0o600)
    return ["--token-file", str(path)]


def _open_idle(port, n):
    """`n` TCP connections that never send a byte (the attack)."""
    conns = []
    for _ in range(n):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            break
        conns.append(s)
    return conns


def _closed_by_server(conn, timeout):
    """True if the daemon closed or shut down `conn` within `timeout` s
    (what it sent first, its HTTP/2 settings, is read and dropped)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        conn.settimeout(left)
        try:
            if conn.recv(4096) == b"":
                return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False
    return False


async def _works(url):
    """An authenticated client gets an answer (GetInfo needs no worker)."""
    async with RuntimeClient(url, token=TOKEN, timeout=10) as client:
        return (await client.health()).status


@pytest.mark.parametrize("caps", [[], ["--max-unauthenticated-connections-per-peer", "1000"]],
                         ids=["default-caps", "only-the-total-cap"])
async def test_idle_connections_beyond_the_fd_limit_do_not_kill_the_listeners(sandboxd, tmp_path, caps):
    # 600 idle connections against 256 descriptors: on gRPC's own, accept4
    # fails with EMFILE and gRPC drops the listener for good. Here the caps
    # (the total one lowered to fit the limit) close the excess at accept.
    daemon = sandboxd(extra_args=[*_token_args(tmp_path), *caps], nofile=256).wait_ready()
    attack = _open_idle(daemon.port, 600)
    unix_attack = []
    for _ in range(100):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(daemon.socket_path))
        unix_attack.append(s)
    await asyncio.sleep(1.5)
    assert daemon.proc.poll() is None
    for s in attack + unix_attack:
        s.close()
    await asyncio.sleep(0.5)
    # Both listeners still accept, and the daemon still has descriptors.
    assert await _works(daemon.tcp_url) == "ok"
    assert await _works(daemon.unix_url) == "ok"
    assert "Failed accept4" not in daemon.log()
    assert "refused at a cap" in daemon.log()


async def test_connections_without_an_authenticated_rpc_are_shut_down(sandboxd, tmp_path):
    daemon = sandboxd(extra_args=[*_token_args(tmp_path), "--auth-timeout-s", "1"]).wait_ready()
    async with RuntimeClient(daemon.tcp_url, token=TOKEN, timeout=10) as client:
        assert (await client.health()).status == "ok"
        idle = _open_idle(daemon.port, 20)
        unix_idle = socket.socket(socket.AF_UNIX)
        unix_idle.connect(str(daemon.socket_path))
        started = time.monotonic()
        assert all(_closed_by_server(s, 5) for s in idle)
        assert _closed_by_server(unix_idle, 5)
        assert 0.9 < time.monotonic() - started < 5
        # A connection that makes RPCs without the token is shut down too.
        with pytest.raises(Unauthenticated, match="UNAUTHENTICATED"):
            async with RuntimeClient(daemon.tcp_url, token="wrong", timeout=10) as stranger:
                await stranger.health()
        # The authenticated client is left alone past the timeout, and its
        # calls (a connection of their own) work.
        await asyncio.sleep(2)
        assert await client.remote(t.add, 2, 3) == 5
        assert (await client.health()).status == "ok"
        for s in idle + [unix_idle]:
            s.close()


async def test_a_client_idle_longer_than_the_timeout_keeps_working(sandboxd, tmp_path):
    daemon = sandboxd(extra_args=[*_token_args(tmp_path), "--auth-timeout-s", "1"]).wait_ready()
    async with RuntimeClient(daemon.unix_url, token=TOKEN, timeout=10) as client:
        assert (await client.health()).status == "ok"
        await asyncio.sleep(3)  # connections without a call yet are shut down
        assert await client.remote(t.add, 1, 2) == 3
        await asyncio.sleep(3)
        assert await client.remote(t.add, 3, 4) == 7
    # None of the client's connections was taken for an idle one (on the
    # frame wire too: its native grpc++ channel is not opened unused).
    assert "connection limits:" not in daemon.log()


def _unix_idle(path, n):
    """`n` Unix-socket connections to `path` that never send a byte."""
    conns = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(path))
        conns.append(s)
    return conns


async def test_clients_leave_the_per_peer_room_to_others(sandboxd, tmp_path):
    # Every Unix-socket peer is one peer: a client's connections must all
    # authenticate (its HELLO on the frame wire, an RPC on gRPC), or a few
    # clients use up the cap and lock the next ones out.
    daemon = sandboxd(extra_args=[*_token_args(tmp_path),
                                  "--max-unauthenticated-connections-per-peer", "4",
                                  "--auth-timeout-s", "60"]).wait_ready()
    clients = [RuntimeClient(daemon.unix_url, token=TOKEN, timeout=10) for _ in range(2)]
    try:
        for client in clients:
            await client.__aenter__()
            assert await client.remote(t.add, 1, 2) == 3
        await asyncio.sleep(0.3)
        conns = _unix_idle(daemon.socket_path, 6)
        # The cap's four places are all free for the idle connections.
        assert [_closed_by_server(s, 1.0) for s in conns] == [False] * 4 + [True] * 2
        for s in conns:
            s.close()
        for client in clients:
            assert await client.remote(t.add, 2, 2) == 4
    finally:
        for client in clients:
            await client.__aexit__(None, None, None)


async def test_frame_wire_connections_without_a_hello_are_counted(sandboxd, tmp_path):
    daemon = sandboxd(extra_args=[*_token_args(tmp_path), "--auth-timeout-s", "1"]).wait_ready()
    silent = socket.socket(socket.AF_UNIX)
    silent.connect(f"{daemon.socket_path}.calls")
    started = time.monotonic()
    # The frame wire ends it first (STATUS 4 DEADLINE_EXCEEDED, at 3/4 of
    # the timeout), and the guard's totals and warning count it.
    silent.settimeout(5)
    received = b""
    while chunk := silent.recv(4096):
        received += chunk
    silent.close()
    assert time.monotonic() - started < 5
    assert received[4] == 4 and received[5:9] == (4).to_bytes(4, "little")  # STATUS, code 4
    deadline = time.monotonic() + 5
    while "connection limits:" not in daemon.log() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert ("0 refused at a cap, 0 closed for want of a file descriptor, "
            "1 shut down without an authenticated RPC or frame-wire HELLO") in daemon.log()
    async with RuntimeClient(daemon.unix_url, token=TOKEN, timeout=10) as client:
        assert await client.remote(t.add, 1, 1) == 2


async def test_unauthenticated_connections_per_peer_are_capped(sandboxd, tmp_path):
    daemon = sandboxd(extra_args=[*_token_args(tmp_path),
                                  "--max-unauthenticated-connections-per-peer", "5",
                                  "--auth-timeout-s", "60"]).wait_ready()
    conns = _open_idle(daemon.port, 8)
    assert len(conns) == 8
    # Accepted in order: the first five are held, the last three closed.
    assert [_closed_by_server(s, 1.0) for s in conns] == [False] * 5 + [True] * 3
    for s in conns:
        s.close()
    await asyncio.sleep(0.3)
    assert await _works(daemon.tcp_url) == "ok"
    assert "refused at a cap" in daemon.log()


async def test_total_connections_are_capped(sandboxd, tmp_path):
    daemon = sandboxd(extra_args=[*_token_args(tmp_path), "--max-connections", "4",
                                  "--auth-timeout-s", "60"]).wait_ready()
    async with RuntimeClient(daemon.unix_url, token=TOKEN, timeout=10) as client:
        assert (await client.health()).status == "ok"
        conns = _open_idle(daemon.port, 10)
        closed = [_closed_by_server(s, 1.0) for s in conns]
        # The client holds one or two connections (its gRPC channel, and
        # its Calls stream's: the frame wire's or the native grpc++
        # channel's); the rest of the 4 go to the first idle ones and every
        # later one is closed at accept.
        assert closed[-6:] == [True] * 6
        assert 2 <= closed.count(False) <= 3
        assert (await client.health()).status == "ok"
        for s in conns:
            s.close()


@pytest.mark.parametrize("value", ["", " ", "\t\n"])
async def test_a_blank_token_variable_is_refused(sandboxd, value):
    daemon = sandboxd(env={"AGENTIX_TOKEN": value})
    assert daemon.wait_exit() == 2
    assert "AGENTIX_TOKEN is set but empty or blank" in daemon.log()


async def test_the_daemon_is_not_readable_by_a_same_uid_process(sandboxd):
    daemon = sandboxd(env={"AGENTIX_TOKEN": TOKEN}, prefix=NO_CAPS).wait_ready()
    pid = daemon.proc.pid
    for what, path in (("environ", f"/proc/{pid}/environ"), ("mem", f"/proc/{pid}/mem")):
        probe = subprocess.run(
            [*NO_CAPS, "/usr/bin/python3", "-c", f"open({path!r}, 'rb').read(1)"],
            capture_output=True, text=True, timeout=30,
        )
        assert probe.returncode != 0, f"{what} was readable"
        assert "PermissionError" in probe.stderr
    # Even for a reader that may (root here), the token's bytes are wiped.
    assert TOKEN.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    # The worker is exec'd, so it is dumpable again and runs code as usual.
    async with RuntimeClient(daemon.unix_url, token=TOKEN, timeout=10) as client:
        assert await client.remote(t.add, 1, 2) == 3
        worker_pid = await client.remote(t.getpid)
    probe = subprocess.run(
        [*NO_CAPS, "/usr/bin/python3", "-c", f"open('/proc/{worker_pid}/environ', 'rb').read(1)"],
        capture_output=True, text=True, timeout=30,
    )
    assert probe.returncode == 0, probe.stderr


async def test_a_stopping_daemon_leaves_a_newer_daemons_socket(sandboxd, tmp_path):
    path = tmp_path / "shared.sock"
    old = sandboxd(name="old", socket_path=path).wait_ready()
    new = sandboxd(name="new", socket_path=path).wait_ready()
    assert old.stop() == 0
    assert path.is_socket()
    assert "no longer this daemon's socket" in old.log()
    async with RuntimeClient(f"unix://{path}", timeout=10) as client:
        assert await client.remote(t.add, 2, 2) == 4
    assert new.proc.poll() is None


async def test_busy_authenticated_clients_are_never_timed_out(sandboxd, tmp_path):
    # Which connection authenticated is learnt from the thread that read the
    # call's headers; under concurrent load on every gRPC thread no busy
    # authenticated connection may be taken for an idle one.
    daemon = sandboxd(extra_args=[*_token_args(tmp_path), "--auth-timeout-s", "1"]).wait_ready()
    clients = [RuntimeClient(url, token=TOKEN, timeout=10)
               for url in [daemon.unix_url, daemon.tcp_url] * 6]
    for client in clients:
        await client.__aenter__()
    try:
        async def busy(client):
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                assert await client.remote(t.add, 1, 1) == 2
                assert (await client.health()).status == "ok"

        await asyncio.gather(*[busy(client) for client in clients])
    finally:
        for client in clients:
            await client.__aexit__(None, None, None)
    assert "connection limits:" not in daemon.log()


async def test_a_daemon_refused_for_its_tls_files_exits_before_starting_a_worker(sandboxd, tmp_path):
    # The prestarted worker starts before gRPC's own start-up (stop 61), but
    # after the files the daemon is configured with are read: a daemon that
    # cannot read one says so and exits 2 without having started a worker.
    daemon = sandboxd(extra_args=["--prestart_worker", "--log_level=debug",
                                  "--tls-cert", str(tmp_path / "missing.pem"),
                                  "--tls-key", str(tmp_path / "missing.key")])
    assert daemon.wait_exit() == 2
    log = daemon.log()
    assert f"--tls-cert {tmp_path / 'missing.pem'}: cannot open it" in log
    assert "started as pid" not in log
    assert "serving agentix.runtime.v1" not in log
