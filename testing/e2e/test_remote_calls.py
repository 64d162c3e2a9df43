"""Remote calls end to end: real daemon, real embedded-Python worker, real host
package. Each test states the user-visible behaviour it pins."""

import asyncio
import math
import pickle
import signal
import time
from pathlib import Path

import pytest

import e2e_targets as t
from agentix import (
    CallCancelled,
    CallTimeout,
    Failed,
    Ok,
    RemoteCallError,
    RestrictedUnpickleError,
    RuntimeClient,
    RuntimeUnreachable,
    WorkerExited,
)
from agentix.runtime.shared import safepickle
from raw_stream import RawStream, chunk, start

pytestmark = pytest.mark.asyncio


async def test_sync_async_and_keyword_arguments(client):
    assert await client.remote(t.add, 2, 3) == 5
    assert await client.remote(t.async_add, 2, b=40) == 42
    assert await client.remote(t.greet, "sandbox", punctuation="?") == "hello sandbox?"
    assert await client.remote(t.echo, {"k": [1, 2.5, None, "s", b"b"]}) == {
        "k": [1, 2.5, None, "s", b"b"]}


async def test_builtins_and_functions_reached_through_a_class(client):
    assert await client.remote(math.factorial, 10) == 3628800
    assert await client.remote(len, [1, 2, 3]) == 3
    assert await client.remote(t.Echo.echo, 7) == ("static", 7)
    # An unbound method with the instance passed explicitly, as the
    # bound-method error message advises.
    assert await client.remote(t.Echo.method, t.Echo(), 1) == ("method", 1)


async def test_module_state_persists_within_one_worker(client):
    first = await client.remote(t.count_calls)
    assert await client.remote(t.count_calls) == first + 1


async def test_worker_embeds_debian_python_with_the_given_venv(client):
    import sys

    facts = await client.remote(t.interpreter_facts)
    assert facts["version"].startswith("3.11.")
    assert facts["version"] != "3.11.7"  # never the pyenv interpreter on PATH
    assert facts["prefix"] == sys.prefix  # the venv the daemon was given
    assert facts["agentix_file"].startswith(sys.prefix)
    assert facts["path"][0] == str(t.__file__).rsplit("/", 1)[0]  # --python-path first


async def test_async_calls_run_concurrently(client):
    await client.remote(t.async_add, 0, 0)  # a worker's start is not what is timed
    started = time.monotonic()
    results = await asyncio.gather(*(client.remote(t.async_sleep, 0.3) for _ in range(10)))
    assert results == [0.3] * 10
    assert time.monotonic() - started < 2.0


async def test_a_blocking_sync_call_does_not_stall_async_calls(client):
    await client.remote(t.async_add, 0, 0)  # a worker's start is not what is timed
    blocker = asyncio.ensure_future(client.remote(t.blocking_sleep, 1.5))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    assert await client.remote(t.async_add, 1, 1) == 2
    assert time.monotonic() - started < 1.0
    assert await blocker == 1.5


async def test_user_exception_carries_type_message_and_traceback(client):
    with pytest.raises(RemoteCallError) as info:
        await client.remote(t.raise_value_error, "nope")
    err = info.value
    assert not isinstance(err, (WorkerExited, CallCancelled))
    assert err.error.type == "ValueError"
    assert err.error.message == "nope"
    assert "raise_value_error" in err.error.traceback
    text = str(err)
    assert "ValueError: nope" in text
    assert "--- sandbox traceback ---" in text


@pytest.mark.parametrize("target,args,etype", [
    (t.raise_system_exit, (3,), "SystemExit"),
    (t.raise_keyboard_interrupt, (), "KeyboardInterrupt"),
    (t.async_raise_system_exit, (), "SystemExit"),
])
async def test_base_exceptions_become_errors_and_the_worker_survives(client, target, args, etype):
    pid = await client.remote(t.getpid)
    with pytest.raises(RemoteCallError) as info:
        await client.remote(target, *args)
    assert info.value.error.type == etype
    assert await client.remote(t.getpid) == pid


async def test_unpicklable_result_is_a_result_encode_error(client):
    with pytest.raises(RemoteCallError) as info:
        await client.remote(t.return_unpicklable)
    assert info.value.error.type == "ResultEncodeError"
    assert await client.remote(t.add, 1, 2) == 3


async def test_results_go_through_the_restricted_unpickler(client, monkeypatch):
    with pytest.raises(RestrictedUnpickleError) as info:
        await client.remote(t.return_opaque, 1)
    assert "e2e_targets.Opaque" in str(info.value)
    monkeypatch.setenv("AGENTIX_PICKLE_TRUST", "1")
    assert await client.remote(t.return_opaque, 2) == t.Opaque(2)
    monkeypatch.delenv("AGENTIX_PICKLE_TRUST")
    safepickle.allow_type(t.Opaque)
    assert await client.remote(t.return_opaque, 3) == t.Opaque(3)


async def test_try_remote_returns_ok_or_failed(client):
    ok = await client.try_remote(t.add, 1, 1)
    assert isinstance(ok, Ok) and ok.value == 2
    failed = await client.try_remote(t.raise_value_error, "x")
    assert isinstance(failed, Failed)
    assert isinstance(failed.error, RemoteCallError)


@pytest.mark.parametrize("target,returncode,text", [
    (t.kill_self, -9, "signal 9"),
    (t.exit_hard, 3, "exit code 3"),
    (t.segfault, -11, "signal 11"),
])
async def test_worker_death_is_worker_exited_and_next_call_respawns(client, target, returncode, text):
    pid = await client.remote(t.getpid)
    slow = asyncio.ensure_future(client.remote(t.async_sleep, 30))
    await asyncio.sleep(0.1)
    args = (3,) if target is t.exit_hard else ()
    with pytest.raises(WorkerExited) as info:
        await client.remote(target, *args)
    assert info.value.returncode == returncode
    assert text in str(info.value)
    # Every in-flight call fails the same way; nobody hangs.
    with pytest.raises(WorkerExited):
        await asyncio.wait_for(slow, 10)
    new_pid = await client.remote(t.getpid)
    assert new_pid != pid


async def test_cancelling_the_awaiting_task_cancels_the_call(client, daemon):
    task = asyncio.ensure_future(client.remote(t.async_sleep, 30))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await client.remote(t.add, 1, 1) == 2
    # The daemon saw the cancel: nothing is left running.
    for _ in range(50):
        info = await client._info()
        if info.calls_in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert info.calls_in_flight == 0


async def test_call_deadline_raises_call_timeout(daemon):
    async with RuntimeClient(daemon.url, call_deadline=0.3) as c:
        with pytest.raises(CallTimeout) as info:
            await c.remote(t.async_sleep, 5)
        assert "exceeded deadline of 0.3s" in str(info.value)
        # The client keeps working after a timeout. A loaded machine may take
        # longer than 0.3 s for this call too, so it gets a deadline that only
        # a hung client would miss.
        c.call_deadline = 30
        assert await c.remote(t.add, 2, 2) == 4


async def test_cancel_from_another_client_ends_the_call_with_call_cancelled(daemon):
    async with RuntimeClient(daemon.url) as owner:
        raw = RawStream(daemon.url)
        try:
            # The owner's call id is not public; cancel through a raw stream
            # once the call is known to the daemon.
            task = asyncio.ensure_future(owner.remote(t.async_sleep, 30))
            await asyncio.sleep(0.3)
            (call_id,) = owner._pending_call_ids()
            from agentix.runtime.v1 import runtime_pb2 as pb

            await raw.send(pb.HostEvent(cancel=pb.CancelCall(call_id=call_id)))
            with pytest.raises(CallCancelled):
                await asyncio.wait_for(task, 10)
        finally:
            await raw.close()


async def test_health_and_info(client):
    health = await client.health()
    assert health.status == "ok"
    assert health.version


async def test_standard_grpc_health_and_reflection(daemon):
    import grpc

    async with grpc.aio.insecure_channel(daemon.url) as channel:
        # grpc.health.v1.Health/Check with service "agentix.runtime.v1.RuntimeService":
        # request = field 1 (string); response = field 1 (enum), SERVING = 1.
        service = b"agentix.runtime.v1.RuntimeService"
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        reply = await check(b"\x0a" + bytes([len(service)]) + service, timeout=5)
        assert reply == b"\x08\x01"
        # Server reflection answers list_services.
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        call = reflect()
        await call.write(b"\x3a\x00")  # list_services = "" (field 7)
        reply = await asyncio.wait_for(call.read(), 5)
        assert b"agentix.runtime.v1.RuntimeService" in reply
        call.cancel()


async def test_tcp_listen_address(start_daemon):
    d = start_daemon(tcp=True)
    async with RuntimeClient(d.url) as c:
        assert await c.remote(t.add, 20, 22) == 42


async def test_unreachable_daemon_is_runtime_unreachable(tmp_path):
    c = RuntimeClient(f"unix://{tmp_path}/nothing.sock", timeout=2)
    started = time.monotonic()
    with pytest.raises(RuntimeUnreachable):
        await c.remote(t.add, 1, 2)
    assert time.monotonic() - started < 10
    await c.close()


async def test_close_fails_calls_in_flight(daemon):
    c = RuntimeClient(daemon.url)
    task = asyncio.ensure_future(c.remote(t.async_sleep, 30))
    await asyncio.sleep(0.3)
    await c.close()
    with pytest.raises(RuntimeUnreachable):
        await asyncio.wait_for(task, 5)


async def test_main_script_targets_are_refused_at_the_host(daemon):
    script = str(t.__file__).replace("e2e_targets.py", "main_script.py")
    proc = await asyncio.create_subprocess_exec(
        __import__("sys").executable, script,
        daemon.url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1 and out == b""
    assert (f"TypeError: cannot remote '__main__::shout': it is defined in __main__, the script you ran "
            f"({script})") in err.decode()
    assert "Move shout into a module of your project" in err.decode()


# --- bad input: a typed error and a daemon that keeps serving -------------

async def test_unknown_module_attribute_and_non_callable_targets(daemon):
    raw = RawStream(daemon.url)
    try:
        args = pickle.dumps(((), {}))
        await raw.send(start("m", "no_such_module_xyz::f", args),
                       start("a", "e2e_targets::no_such_function", args),
                       start("n", "e2e_targets::NOT_CALLABLE", args),
                       start("s", "not a reference", args))
        assert (await raw.terminal("m")).error.error.type == "ModuleNotFoundError"
        assert (await raw.terminal("a")).error.error.type == "AttributeError"
        assert (await raw.terminal("n")).error.error.type == "TypeError"
        assert (await raw.terminal("s")).error.error.type == "ValueError"
    finally:
        await raw.close()


async def test_garbage_arguments_and_malformed_events(daemon):
    raw = RawStream(daemon.url)
    try:
        await raw.send(start("g", "e2e_targets::add", b"\x80\x05garbage"))
        e = (await raw.terminal("g")).error.error
        assert e.type == "ArgumentsDecodeError"
        await raw.send(start("", "e2e_targets::add", pickle.dumps(((1, 2), {}))))
        assert (await raw.terminal("")).error.error.type == "BadRequest"
        await raw.send(chunk("ghost", b"data"))
        e = (await raw.terminal("ghost")).error.error
        assert e.type == "BadRequest" and "unknown call_id" in e.message
        await raw.send(start("ok", "e2e_targets::add", pickle.dumps(((1, 2), {}))))
        ok = (await raw.terminal("ok")).result
        assert pickle.loads(ok.value) == 3
    finally:
        await raw.close()


async def test_sigterm_stops_cleanly_and_fails_calls_in_flight(start_daemon):
    d = start_daemon()
    c = RuntimeClient(d.url)
    try:
        task = asyncio.ensure_future(c.remote(t.async_sleep, 30))
        await asyncio.sleep(0.3)
        code = await asyncio.get_running_loop().run_in_executor(None, d.stop)
        assert code == 0
        assert not d.socket_path.exists()
        with pytest.raises((WorkerExited, RuntimeUnreachable, RemoteCallError)):
            await asyncio.wait_for(task, 10)
    finally:
        await c.close()


def _blocked_signals(status_text):
    """The signal numbers of a /proc/.../status SigBlk line."""
    (line,) = [l for l in status_text.splitlines() if l.startswith("SigBlk:")]
    mask = int(line.split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


async def test_a_sigterm_at_any_moment_reaches_the_shutdown(daemon):
    # The daemon takes SIGTERM/SIGINT with sigwait on its main thread; a
    # thread that does not block them would receive one sent before (or
    # beside) the sigwait, and the default action would end the daemon at
    # once: no shutdown, its socket left behind. Seen once in 100 SIGTERMs
    # sent as "serving" appeared, when the connection guard's thread started
    # before the signals were blocked.
    pid = daemon.proc.pid
    unblocking = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        if int(task.name) == pid:
            continue  # in sigwait, which unblocks them while it waits
        try:
            blocked = _blocked_signals((task / "status").read_text())
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # ended meanwhile (the placement probe's threads are short-lived)
        if not {signal.SIGTERM, signal.SIGINT} <= blocked:
            unblocking.append(name)
    assert unblocking == []


async def test_msgpack_encoding_for_non_python_clients(daemon):
    """A client that speaks only the proto + msgpack: [args, kwargs] in, the
    value out, no pickle anywhere."""
    import msgpack

    from agentix.runtime.v1 import runtime_pb2 as pb

    raw = RawStream(daemon.url)
    try:
        await raw.send(start("mp", "e2e_targets::greet",
                             msgpack.packb([["grpc"], {"punctuation": "."}]),
                             encoding=pb.ENCODING_MSGPACK),
                       start("mp-bad", "e2e_targets::return_opaque",
                             msgpack.packb([[1], {}]), encoding=pb.ENCODING_MSGPACK))
        ok = (await raw.terminal("mp")).result
        assert ok.encoding == pb.ENCODING_MSGPACK
        assert msgpack.unpackb(ok.value) == "hello grpc."
        bad = (await raw.terminal("mp-bad")).error.error
        assert bad.type == "ResultEncodeError"
    finally:
        await raw.close()


async def test_the_installed_package_carries_calls_natively_unless_turned_off(client):
    """The wheel ships the native Calls transport and the client uses it by
    default where the frame wire is not used (test_frame_wire.py); with
    AGENTIX_CALLS_WIRE=grpc and AGENTIX_NATIVE_TRANSPORT=0 (this suite can run
    under both) grpc.aio carries the calls."""
    import os

    from agentix.runtime.client.frames import FrameCallsStream
    from agentix.runtime.client.stream import CallsStream, NativeCallsStream

    assert await client.remote(t.add, 1, 1) == 2
    native_off = os.environ.get("AGENTIX_NATIVE_TRANSPORT", "1").strip() == "0"
    if os.environ.get("AGENTIX_CALLS_WIRE", "auto").strip().lower() in ("auto", "frames", ""):
        assert type(client._stream) is FrameCallsStream  # the client fixture's daemon is on a Unix socket
    else:
        assert type(client._stream) is (CallsStream if native_off else NativeCallsStream)
