"""Warm-pool arming of agentix-sandboxd end to end (--admin-token-file and
the SandboxAdmin service): a real daemon and a real Python worker, the admin
token handed over through a pipe as providerd does (/proc/self/fd/N)."""

import asyncio
import os

import grpc
import pytest

import e2e_targets as t
from admin_client import ADMIN, RUNTIME, SERVING, Admin, bearer, pb, token_pipe
from agentix import RuntimeClient, RuntimeUnreachable

pytestmark = pytest.mark.asyncio

def start_unarmed(start_daemon, extra_args=()):
    """A daemon whose admin token arrives through a pipe, as providerd sends it."""
    with token_pipe() as fd:
        return start_daemon(
            extra_args=["--admin-token-file", f"/proc/self/fd/{fd}", *extra_args],
            popen_kwargs={"pass_fds": (fd,)},
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
            with pytest.raises(RuntimeUnreachable, match="UNAUTHENTICATED"):
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
            for _ in range(200):
                status = await admin.get_status()
                if status.calls_in_flight == 1:
                    break
                await asyncio.sleep(0.01)
            assert status.calls_in_flight == 1 and status.idle_ms == 0
            assert status.worker_running and status.open_streams >= 1
            await call
        # The client's streams close with it; then the idle time grows.
        for _ in range(200):
            first = await admin.get_status()
            if first.open_streams == 0:
                break
            await asyncio.sleep(0.01)
        assert first.open_streams == 0 and first.calls_in_flight == 0
        await asyncio.sleep(0.3)
        second = await admin.get_status()
        assert second.idle_ms >= first.idle_ms + 250
        assert second.idle_ms < 10_000


async def test_prestart_worker_waits_for_activation(start_daemon):
    daemon = start_unarmed(start_daemon, ["--prestart-worker"])
    async with grpc.aio.insecure_channel(daemon.url) as channel:
        admin = Admin(channel)
        await asyncio.sleep(0.3)
        assert not (await admin.get_status()).worker_running
        await admin.activate(pb.ActivateRequest(token=RUNTIME, env={"LATE": "yes"}),
                             timeout=10, metadata=bearer(ADMIN))
        assert (await admin.get_status()).worker_running
        async with RuntimeClient(daemon.url, token=RUNTIME) as client:
            assert await client.remote(os.getenv, "LATE") == "yes"
            assert (await client._info()).workers_started == 1  # that same worker


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
