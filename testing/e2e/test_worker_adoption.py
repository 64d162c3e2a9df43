"""agentix-launch starts the worker, then execs agentix-sandboxd, which adopts it.

The adopted worker must be the daemon's own child with everything a spawned one gets (its
environment without the token, the daemon's open-file limit); after a crash the next worker
is spawned as usual; bad adoption arguments stop the daemon with the reason; a worker the
daemon would not have spawned, or one that died before the daemon was up, is replaced.
"""

import os
import re
import subprocess

import e2e_targets as t
import pytest
from conftest import LAUNCHER, SANDBOXD, TARGETS_DIR, WORKER, _venv, wait_for

from agentix import RuntimeClient, WorkerExited


def _launcher(*worker_args, worker=WORKER):
    """agentix-launch with the worker options conftest's Daemon gives the daemon
    (the worker arguments that follow from the daemon's flags, --direct_calls
    among them, the launcher reads from the daemon's command line)."""
    return [str(LAUNCHER), "--worker", str(worker), "--venv", _venv(),
            "--python-path", str(TARGETS_DIR), *worker_args, "--"]


def _adopted_pid(log):
    found = re.search(r"worker \w+ \(generation 1\) adopted as pid (\d+)", log)
    assert found, log
    return int(found.group(1))


def _limits(pid, name="Max open files"):
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith(name):
            return line.split()[3:5]
    raise AssertionError(f"no {name} in /proc/{pid}/limits")


async def test_the_adopted_worker_serves_calls_and_a_crashed_one_is_respawned(start_daemon):
    daemon = start_daemon(prefix=_launcher(), extra_args=["--prestart_worker", "--log_level", "debug"])
    adopted = _adopted_pid(daemon.log())
    # The launcher exec'd the daemon: the worker is the daemon's child.
    stat = open(f"/proc/{adopted}/stat").read().rsplit(")", 1)[1].split()
    assert int(stat[1]) == daemon.proc.pid
    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(t.getpid) == adopted
        assert await client.remote(t.add, 2, 3) == 5
        with pytest.raises(WorkerExited) as info:
            await client.remote(t.kill_self)
        assert info.value.returncode == -9
        respawned = await client.remote(t.getpid)
    assert respawned != adopted
    assert not os.path.exists(f"/proc/{adopted}")  # reaped by the daemon
    assert re.search(rf"\(generation 2\) started as pid {respawned}\b", daemon.log())


async def test_the_adopted_worker_has_the_daemons_env_without_the_token_and_its_fd_limit(
        start_daemon, tmp_path):
    daemon = start_daemon(prefix=_launcher(), env={"AGENTIX_TOKEN": "adoption-secret"},
                          extra_args=["--prestart_worker", "--log_level", "debug"])
    adopted = _adopted_pid(daemon.log())
    environ = open(f"/proc/{adopted}/environ", "rb").read().split(b"\0")
    assert not [e for e in environ if e.startswith(b"AGENTIX_TOKEN=")]
    assert any(e.startswith(b"AGENTIX_WORKER_ID=") for e in environ)
    # The daemon raised its soft limit at start; the worker it adopted has the same.
    assert _limits(adopted) == _limits(daemon.proc.pid)
    async with RuntimeClient(daemon.url, token="adoption-secret") as client:
        assert await client.remote(t.getpid) == adopted


@pytest.mark.parametrize("flag,reason", [
    ("--adopt_worker=pid=1,id=x,channel=5,stderr=6", "is not a child of this process"),
    ("--adopt_worker=pid=12,id=x,channel=5", "lacks pid, id, channel or stderr"),
    ("--adopt_worker=colour=red", "bad field 'colour=red'"),
])
def test_bad_adoption_arguments_stop_the_daemon_with_the_reason(tmp_path, flag, reason):
    run = subprocess.run(
        [str(SANDBOXD), "--listen", f"unix://{tmp_path}/s.sock", "--worker", str(WORKER),
         "--prestart_worker", flag],
        capture_output=True, text=True, timeout=30)
    assert run.returncode == 2, run.stderr
    assert reason in run.stderr


@pytest.mark.parametrize("daemon_args,worker_args", [
    ((), None),  # the daemon's default, whichever it is
    (("--direct_calls",), ["--direct_calls"]),
    (("--nodirect_calls",), []),
    (("--direct-calls", "--calls_cpu=off"), ["--direct_calls", "--noavoid_holder_cpu"]),
    (("--direct_calls", "--calls_cpu", "off", "--direct_calls=false"), []),
    (("--direct_calls", "--nocalls_socket"), []),  # nothing to hand over
], ids=["default", "direct", "relayed", "direct-cpu-off", "last-wins", "no-calls-socket"])
async def test_the_launcher_gives_the_worker_the_daemons_worker_arguments(
        start_daemon, monkeypatch, daemon_args, worker_args):
    """The worker arguments that follow from the daemon's flags come from the
    daemon's command line (WorkerArgsFor, as the daemon spawns): the daemon
    adopts the early worker with direct calls on, off or the default."""
    daemon = start_daemon(prefix=_launcher(),
                          extra_args=["--prestart_worker", "--log_level", "debug", *daemon_args])
    adopted = _adopted_pid(daemon.log())
    assert "could not adopt" not in daemon.log()
    cmdline = open(f"/proc/{adopted}/cmdline").read().split("\0")
    if worker_args is not None:
        assert [a for a in cmdline if a in ("--direct_calls", "--noavoid_holder_cpu")] == worker_args
    direct = worker_args is not None and "--direct_calls" in worker_args
    monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "auto")
    if direct:
        monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(t.getpid) == adopted
    if direct:
        # The adopted worker served the handed-over connection (logged at its end).
        await wait_for(lambda: re.search(r"direct connection \S+ closed", daemon.log()))


def test_adoption_needs_prestart_worker(tmp_path):
    run = subprocess.run(
        [*_launcher()[:-1], "--", str(SANDBOXD), "--listen", f"unix://{tmp_path}/s.sock",
         "--worker", str(WORKER), "--venv", _venv(), "--python-path", str(TARGETS_DIR)],
        capture_output=True, text=True, timeout=30)
    assert run.returncode == 2, run.stderr
    assert "--adopt_worker needs --prestart_worker" in run.stderr


def test_a_launcher_without_a_daemon_is_a_usage_error():
    run = subprocess.run([str(LAUNCHER), "--worker", str(WORKER)], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 2
    assert "no daemon command after '--'" in run.stderr


async def test_a_worker_the_daemon_would_not_spawn_is_replaced(start_daemon):
    # The launcher gives the worker an argument the daemon does not.
    daemon = start_daemon(prefix=_launcher("--worker-arg", "--intake-spin-us=7"),
                          extra_args=["--prestart_worker", "--log_level", "debug"])
    log = daemon.log()
    assert "could not adopt the launcher's worker (adopt: the worker's command line is not " \
           "the one this daemon would spawn" in log
    assert "'--intake-spin-us=7'" in log
    async with RuntimeClient(daemon.url) as client:
        pid = await client.remote(t.getpid)
    assert re.search(rf"\(generation 1\) started as pid {pid}\b", daemon.log())


async def test_a_worker_that_died_before_the_daemon_was_up_is_reported_and_replaced(
        start_daemon, tmp_path):
    dying = tmp_path / "dying-worker"
    dying.write_text("#!/bin/sh\necho 'no python here' >&2\nexit 3\n")
    dying.chmod(0o755)
    daemon = start_daemon(prefix=_launcher(worker=dying),
                          extra_args=["--prestart_worker", "--log_level", "debug"])
    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(t.add, 1, 1) == 2
    log = daemon.log()
    assert re.search(r"could not adopt the launcher's worker \(the adopted worker \(pid \d+\) "
                     r"exited before the daemon was up: exit code 3; its stderr: no python here\)",
                     log), log
