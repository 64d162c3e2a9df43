"""Clients on the native Calls transport come and go, and the interpreter
exits with some still open, without gRPC aborting the process.

Why this needs its own test: the transport first ran on grpc++'s callback
API, where (grpc 1.51, Linux) every grpc::Channel that ran a callback-API call
holds a reference to one process-wide callback completion queue, and
destroying the last such channel from one of that queue's threads aborted the
process ("assertion failed: prior > 0"). It now runs on a completion queue of
its own that is never shut down (native/calls_reactor.h), and these orders of
teardown must stay harmless. The failure only shows as a dead process, so each
scenario runs in a child interpreter and its exit status is checked.
"""

import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import asyncio, gc
    import sandbox_functions
    from agentix import RuntimeClient
    from fake_runtime import FakeRuntime, serve

    left_open = []

    async def main():
        fake = FakeRuntime()
        server, port = await serve(fake, "127.0.0.1:0")
        url = f"127.0.0.1:{port}"
        for i in range(ROUNDS):
            client = RuntimeClient(url)
            assert await client.remote(sandbox_functions.add, i, 1) == i + 1
            if i % 3 == 0:
                fake.drop_streams()  # the stream ends on gRPC's side first
                assert await client.remote(sandbox_functions.add, i, 2) == i + 2
            await client.close()
            if i % 2 == 0:
                del client
                gc.collect()
        # Left for interpreter exit: one with its stream up, one whose
        # reactor may still be finishing after close().
        client = RuntimeClient(url)
        await client.remote(sandbox_functions.add, 1, 1)
        left_open.append(client)
        closed = RuntimeClient(url)
        await closed.remote(sandbox_functions.add, 1, 1)
        await closed.close()
        left_open.append(closed)
        print("done", flush=True)

    asyncio.run(main())
    """
)


# The order that used to abort: the Python channel goes first, so the
# stream's reactor holds the channel's last reference, and the stream is
# cancelled while live, so its OnDone (on a gRPC thread) comes last.
_CHANNEL_FIRST = textwrap.dedent(
    """
    import asyncio
    import grpc
    from agentix.runtime.client import _native_calls as native
    from test_native_calls import RawCalls, _SERVICE

    async def main():
        server = grpc.aio.server()
        handler = grpc.stream_stream_rpc_method_handler(RawCalls().calls)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {"Calls": handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        for _ in range(ROUNDS):
            channel = native.Channel(f"127.0.0.1:{port}", None, [("grpc.use_local_subchannel_pool", 1)])
            transport = native.CallsTransport(channel, [])
            transport.write(b"\\x0a\\x00")
            await asyncio.sleep(0.01)
            del channel
            transport.close()
            del transport
            await asyncio.sleep(0.02)
        print("done", flush=True)

    asyncio.run(main())
    """
)


def run_child(script: str, rounds: int) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("AGENTIX_NATIVE_TRANSPORT", None)
    # conftest finds the extension for a direct pytest run (bazel-bin); the
    # import fails the test if it is not there.
    script = "import conftest, agentix.runtime.client._native_calls\n" + script.replace("ROUNDS", str(rounds))
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=os.path.dirname(__file__),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "done"
    assert "assertion failed" not in done.stderr


@pytest.mark.parametrize("run", range(2))
def test_closing_clients_repeatedly_and_exiting_never_aborts(run):
    run_child(_SCRIPT, rounds=12)


@pytest.mark.parametrize("run", range(2))
def test_a_stream_outliving_its_python_channel_never_aborts(run):
    run_child(_CHANNEL_FIRST, rounds=30)
