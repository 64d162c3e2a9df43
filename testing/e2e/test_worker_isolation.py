"""What the worker (and the user code it runs) gets from the daemon that
spawns it: only its own fds, whatever the daemon has open or inherited; a
boot under a low open-file limit; and a durable log that is private and
cannot be redirected by someone who pre-creates its directory."""

import os
import resource
import socket
import stat
from pathlib import Path

import pytest

import e2e_targets as t
import isolation_targets as iso
from agentix import RuntimeClient

pytestmark = pytest.mark.asyncio


def _fd_links(pid):
    """{fd: readlink} of process `pid`."""
    links = {}
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            links[int(entry.name)] = os.readlink(entry)
        except OSError:
            pass
    return links


async def test_the_worker_holds_none_of_the_daemons_fds(start_daemon, tmp_path):
    # The daemon inherits a file and a listening socket that are not
    # close-on-exec (as from a careless launcher), on top of its own gRPC
    # listener, epoll fds and log file.
    secret = tmp_path / "secret.txt"
    secret.write_text("token")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "stray.sock"))
    listener.listen()
    log_dir = tmp_path / "logs"
    with open(secret) as stray_file:
        d = start_daemon(env={"AGENTIX_LOG_DIR": str(log_dir)},
                         popen_kwargs={"pass_fds": (stray_file.fileno(), listener.fileno())})
    listener.close()
    async with RuntimeClient(d.url) as c:
        fds = await c.remote(iso.open_fds)
        assert await c.remote(t.add, 1, 2) == 3
    worker, daemon = fds["worker"], _fd_links(d.proc.pid)
    assert str(secret) in daemon.values()  # the daemon does hold it...
    assert str(secret) not in worker.values()  # ...the worker does not
    assert str(d.log_path) not in worker.values()
    # No socket of the daemon's (its listener, clients, the stray one) is in
    # the worker: socket inodes are per end, so only the worker's own end of
    # its channel (and sockets it made itself) can be there.
    daemon_sockets = {v for v in daemon.values() if v.startswith("socket:")}
    assert not daemon_sockets & {v for v in worker.values() if v.startswith("socket:")}
    # Of the daemon's pipes, the worker shares only the one the daemon reads
    # its stderr from (saved by the worker's capture for crash reports).
    daemon_pipes = {v for v in daemon.values() if v.startswith("pipe:")}
    assert len(daemon_pipes & {v for v in worker.values() if v.startswith("pipe:")}) == 1
    # Everything else is the worker's own: stdin is /dev/null, stdout/stderr
    # its capture pipes, its channel, its durable log, asyncio's epoll and
    # self-pipe, the intake baton's eventfds and its hand-over timerfd
    # (worker/channel/intake_baton.h: the pool reads the channel from the ready
    # frame on).
    assert worker[0] == "/dev/null"
    assert worker[3].startswith("socket:")  # the channel
    for fd, link in worker.items():
        assert (link == "/dev/null" or link.startswith(("pipe:", "socket:"))
                or link in ("anon_inode:[eventpoll]", "anon_inode:[eventfd]", "anon_inode:[timerfd]")
                or link.startswith(str(log_dir / "sandbox-"))), (fd, link)
    # A process the user code starts without close_fds gets stdio only.
    assert fds["child"] == [0, 1, 2]


async def test_the_daemon_serves_under_a_low_open_file_limit(start_daemon):
    # Soft and hard limit both: the daemon raises its soft limit as far as its
    # connection cap needs (up to the hard limit), which would hide the case.
    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    d = start_daemon(popen_kwargs={"preexec_fn": low_limit})
    async with RuntimeClient(d.url) as c:
        assert await c.remote(t.add, 2, 3) == 5
        worker_limits = await c.remote(iso.read_text, "/proc/self/limits")
    for text in (Path(f"/proc/{d.proc.pid}/limits").read_text(), worker_limits):
        assert any(line.startswith("Max open files") and line.split()[3] == "128"
                   for line in text.splitlines()), text


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


async def test_a_fresh_log_dir_is_private(start_daemon, tmp_path):
    log_dir = tmp_path / "logs" / "fresh"
    d = start_daemon(env={"AGENTIX_LOG_DIR": str(log_dir)})
    async with RuntimeClient(d.url) as c:
        await c.remote(t.print_things, "tok")
    (path,) = log_dir.glob("sandbox-*.log")
    assert _mode(log_dir) == 0o700
    assert _mode(path) == 0o600


@pytest.mark.parametrize("kind", ["world-writable", "symlink", "another uid's"])
async def test_a_log_dir_others_control_is_refused(start_daemon, tmp_path, kind):
    log_dir = tmp_path / "logs"
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    if kind == "world-writable":
        log_dir.mkdir()
        log_dir.chmod(0o1777)
        expected = "is writable by group or others"
    elif kind == "symlink":
        log_dir.symlink_to(target)
        expected = "is a symlink"
    else:
        assert os.geteuid() == 0, "chown needs root (the suite runs as root)"
        log_dir.mkdir(mode=0o700)
        os.chown(log_dir, 65534, 65534)
        expected = "is owned by uid 65534"
    d = start_daemon(env={"AGENTIX_LOG_DIR": str(log_dir)})
    async with RuntimeClient(d.url) as c:
        # Calls work as usual, with the durable log off...
        await c.remote(t.print_things, "tok")
        assert await c.remote(t.add, 1, 1) == 2
    # ...nothing was written there, and the daemon's log says why.
    assert not list(target.iterdir())
    assert not list(log_dir.glob("sandbox-*.log"))
    refusals = [line for line in d.log().splitlines()
                if "durable sandbox log disabled: refusing" in line]
    assert refusals and expected in refusals[0] and "AGENTIX_LOG_DIR" in refusals[0]
