"""Warm-pool arming of agentix-sandboxd end to end (--admin-token-file and
the SandboxAdmin service): a real daemon and a real Python worker, the admin
token handed over through a pipe as providerd does (/proc/self/fd/N)."""

import asyncio
import os
import subprocess
import time

import grpc
import pytest

import e2e_targets as t
import startup_probe
from admin_client import ADMIN, RUNTIME, SERVING, Admin, bearer, pb, token_pipe
from agentix import RuntimeClient, RuntimeUnreachable, Unauthenticated

pytestmark = pytest.mark.asyncio

def start_unarmed(start_daemon, extra_args=(), env=None):
    """A daemon whose admin token arrives through a pipe, as providerd sends it."""
    with token_pipe() as fd:
        return start_daemon(
            extra_args=["--admin-token-file", f"/proc/self/fd/{fd}", *extra_args],
            env=env, popen_kwargs={"pass_fds": (fd,)},
        )


async def code_of(awaitable):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable
    return info.value.code(), info.value.details()


async def test_unarmed_daemon_refuses_runtime_rpcs_until_activated(start_daemon):
    daemon = start_unarmed(start_daemon)
    async with grpc.aio.insecure_channel(daemon.url) as channel:
        admin = Admin(channel)
        # Health answers the admin token, before and after arming.
        assert await admin.health(b"", timeout=10, metadata=bearer(ADMIN)) == SERVING
        assert (await code_of(admin.health(b"", timeout=10)))[0] == grpc.StatusCode.UNAUTHENTICATED
        # Runtime RPCs: not activated, whatever the token.
        for md in ((), bearer(ADMIN), bearer(RUNTIME)):
            code, details = await code_of(admin.get_info(b"", timeout=10, metadata=md))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert details == "sandbox not activated"
        with pytest.raises(RuntimeUnreachable, match="FAILED_PRECONDITION"):
            async with RuntimeClient(daemon.url, token=RUNTIME, timeout=10) as client:
                await client.remote(t.add, 1, 2)
        status = await admin.get_status()
        assert not status.activated and not status.worker_running

        # A blank token is refused and changes nothing.
        code, _ = await code_of(admin.activate(pb.ActivateRequest(token="  "), timeout=10, metadata=bearer(ADMIN)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        # No token, or the runtime token, cannot activate.
        for md in ((), bearer(RUNTIME)):
            code, _ = await code_of(admin.activate(pb.ActivateRequest(token=RUNTIME), timeout=10, metadata=md))
            assert code == grpc.StatusCode.UNAUTHENTICATED
        assert not (await admin.get_status()).activated

        request = pb.ActivateRequest(token=RUNTIME, env={"GREETING": "hi there"},
                                     labels={"team": "e2e"}, sandbox_id="sbx-42")
        await admin.activate(request, timeout=10, metadata=bearer(ADMIN))
        await admin.activate(request, timeout=10, metadata=bearer(ADMIN))  # idempotent
        code, _ = await code_of(admin.activate(pb.ActivateRequest(token="another-token"),
                                               timeout=10, metadata=bearer(ADMIN)))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert (await admin.get_status()).activated

        # A real call with the new token sees the env; the tokens do not leak.
        async with RuntimeClient(daemon.url, token=RUNTIME) as client:
            assert await client.remote(os.getenv, "GREETING") == "hi there"
            assert await client.remote(os.getenv, "AGENTIX_SANDBOX_ID") == "sbx-42"
            assert await client.remote(os.getenv, "AGENTIX_TOKEN") is None
            worker_pid = await client.remote(t.getpid)
            environ = open(f"/proc/{worker_pid}/environ", "rb").read()
            assert b"GREETING=hi there" in environ
            assert RUNTIME.encode() not in environ and ADMIN.encode() not in environ
        assert await admin.health(b"", timeout=10, metadata=bearer(ADMIN)) == SERVING
        assert await admin.health(b"", timeout=10, metadata=bearer(RUNTIME)) == SERVING
        # After arming: the admin token (or another) is no runtime token, and
        # the runtime token cannot administer.
        for token in (ADMIN, "another-token"):
            with pytest.raises(Unauthenticated, match="UNAUTHENTICATED"):
                async with RuntimeClient(daemon.url, token=token, timeout=10) as client:
                    await client.remote(t.add, 1, 2)
        for rpc in (admin.get_status(RUNTIME),
                    admin.activate(request, timeout=10, metadata=bearer(RUNTIME))):
            assert (await code_of(rpc))[0] == grpc.StatusCode.UNAUTHENTICATED
    assert "hi there" not in daemon.log() and RUNTIME not in daemon.log() and ADMIN not in daemon.log()
    assert "sbx-42" in daemon.log()  # the activation is logged, without tokens


async def test_status_idle_time_grows_when_idle_and_is_zero_during_a_call(start_daemon):
    daemon = start_unarmed(start_daemon)
    async with grpc.aio.insecure_channel(daemon.url) as channel:
        admin = Admin(channel)
        await admin.activate(pb.ActivateRequest(token=RUNTIME), timeout=10, metadata=bearer(ADMIN))
        async with RuntimeClient(daemon.url, token=RUNTIME) as client:
            call = asyncio.ensure_future(client.remote(t.blocking_sleep, 1.0))
            status = await admin.await_calls_in_flight(1)
            assert status.calls_in_flight == 1 and status.idle_ms == 0
            assert status.worker_running and status.open_streams >= 1
            await call
        # The client's streams close with it; then the idle time grows.
        second = await admin.assert_idle_time_grows()
        assert second.idle_ms < 10_000


def worker_pids(daemon):
    """Pids of the daemon's live (not zombie) child processes: its worker."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == daemon.proc.pid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


async def prestarted_worker(admin, daemon):
    """Waits until the unarmed daemon's prestarted worker runs; its pid."""
    for _ in range(500):
        pids = worker_pids(daemon)
        if pids and (await admin.get_status()).worker_running:
            assert len(pids) == 1
            return pids[0]
        await asyncio.sleep(0.01)
    raise AssertionError("no prestarted worker")


async def test_prestarted_worker_gets_the_env_in_place(start_daemon, tmp_path):
    probe_log = tmp_path / "probe.log"
    daemon = start_unarmed(start_daemon, ["--prestart-worker"],
                           env={"STARTUP_PROBE_LOG": str(probe_log)})
    async with grpc.aio.insecure_channel(daemon.url) as channel:
        admin = Admin(channel)
        pid = await prestarted_worker(admin, daemon)
        await asyncio.sleep(0.5)  # booted: still, no user module is imported
        assert not probe_log.exists()
        assert not (await admin.get_status()).activated
        await admin.activate(
            pb.ActivateRequest(token=RUNTIME, sandbox_id="warm-7",
                               env={"GREETING": "hi there", "PROBE_VAR": "set-by-activate",
                                    "TZ": "AGX-3"}),
            timeout=10, metadata=bearer(ADMIN))
        async with RuntimeClient(daemon.url, token=RUNTIME) as client:
            # The first call runs in the prestarted worker and sees the env.
            assert await client.remote(os.getenv, "GREETING") == "hi there"
            assert await client.remote(t.getpid) == pid
            assert await client.remote(os.getenv, "AGENTIX_SANDBOX_ID") == "warm-7"
            # Child processes (and C getenv: they inherit the C environment).
            child_env = await client.remote(subprocess.check_output, ["env"])
            assert b"GREETING=hi there\n" in child_env
            assert b"AGENTIX_SANDBOX_ID=warm-7\n" in child_env
            # TZ takes effect (time.tzset): "AGX-3" names its zone AGX.
            assert await client.remote(time.strftime, "%Z") == "AGX"
            # A module imported by the first call saw Activate's env.
            assert await client.remote(startup_probe.seen_at_import) == "set-by-activate"
            assert probe_log.read_text() == f"{pid}\n"
            # The tokens are nowhere in the worker's environment.
            assert await client.remote(os.getenv, "AGENTIX_TOKEN") is None
            for token in (RUNTIME, ADMIN):
                assert token.encode() not in child_env
                assert token.encode() not in open(f"/proc/{pid}/environ", "rb").read()
            assert (await client._info()).workers_started == 1  # no respawn
    assert "hi there" not in daemon.log() and RUNTIME not in daemon.log()


async def test_startup_only_env_gets_a_fresh_worker(start_daemon):
    daemon = start_unarmed(start_daemon, ["--prestart-worker"])
    async with grpc.aio.insecure_channel(daemon.url) as channel:
        admin = Admin(channel)
        pid = await prestarted_worker(admin, daemon)
        await admin.activate(
            pb.ActivateRequest(token=RUNTIME, env={"LD_PRELOAD": "libBrokenLocale.so.1",
                                                   "PYTHONPATH": "/agx-nonexistent",
                                                   "GREETING": "fresh"}),
            timeout=10, metadata=bearer(ADMIN))
        async with RuntimeClient(daemon.url, token=RUNTIME) as client:
            fresh = await client.remote(t.getpid)
            assert fresh != pid
            assert pid not in worker_pids(daemon)
            # Spawned with the env: the loader preloaded the library.
            assert "libBrokenLocale.so.1" in open(f"/proc/{fresh}/maps").read()
            environ = open(f"/proc/{fresh}/environ", "rb").read()
            assert b"LD_PRELOAD=libBrokenLocale.so.1" in environ
            assert b"PYTHONPATH=/agx-nonexistent" in environ
            assert await client.remote(os.getenv, "GREETING") == "fresh"
            assert (await client._info()).workers_started == 2
    assert "LD_PRELOAD takes effect only in a new process" in daemon.log()


async def test_admin_token_file_rules(start_daemon, tmp_path):
    shared = tmp_path / "admin"
    shared.write_text(ADMIN)
    shared.chmod(0o644)
    with pytest.raises(RuntimeError, match="chmod 600"):
        start_daemon(extra_args=["--admin-token-file", str(shared)])
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(RuntimeError, match="is empty"):
        start_daemon(extra_args=["--admin-token-file", str(empty)])
    shared.chmod(0o600)
    with pytest.raises(RuntimeError, match="excludes --token-file"):
        start_daemon(extra_args=["--admin-token-file", str(shared)], env={"AGENTIX_TOKEN": RUNTIME})
