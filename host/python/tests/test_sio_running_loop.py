"""agentix.sio finds the running loop without asyncio's per-call getpid():
the loop it remembers must never stand in for another (a later loop on the
same thread, another thread's loop, a forked child's copy)."""

import asyncio
import threading

import pytest

import agentix.sio as sio
from agentix import Namespace, register_namespace
from agentix.runtime.shared.codec import pack
from child_paths import run_in_fresh_interpreter


async def _ask_and_answer(bridge, ns, value):
    """One request of `ns`, answered from a loop callback as the worker does."""
    request = asyncio.ensure_future(ns.request("ask", value, timeout=5))
    await asyncio.sleep(0)
    request_id = bridge.sent[-1][3]
    asyncio.get_running_loop().call_soon(
        sio._deliver, ns.namespace, "ask:result", pack({"request_id": request_id, "value": value * 10}))
    return await request


def test_requests_of_successive_loops_on_one_thread_get_their_replies(bridge):
    ns = register_namespace(Namespace("/p"))
    # Each asyncio.run is a new loop on this thread; the first is closed by
    # the time the second asks.
    assert asyncio.run(_ask_and_answer(bridge, ns, 1)) == 10
    assert asyncio.run(_ask_and_answer(bridge, ns, 2)) == 20
    assert ns._pending == {}


def test_a_thread_sees_its_own_loop_while_another_threads_loop_runs(bridge):
    ns = register_namespace(Namespace("/p"))
    seen = {}

    async def main_side():
        assert sio._running_loop() is asyncio.get_running_loop()  # remembered: this loop
        other = threading.Thread(target=lambda: seen.update(
            value=asyncio.run(_ask_and_answer(bridge, ns, 3)),
            outside=_no_loop()))
        other.start()
        await asyncio.get_running_loop().run_in_executor(None, other.join)
        # Back on this loop, after the other thread's loop was remembered.
        assert sio._running_loop() is asyncio.get_running_loop()
        return await _ask_and_answer(bridge, ns, 4)

    assert asyncio.run(main_side()) == 40
    assert seen == {"value": 30, "outside": True}


def _no_loop():
    try:
        sio._running_loop()
    except RuntimeError:
        return True
    return False


def test_no_loop_outside_a_loop_even_after_one_ran_on_the_thread():
    async def inside():
        return sio._running_loop() is asyncio.get_running_loop()

    assert asyncio.run(inside())
    with pytest.raises(RuntimeError):
        sio._running_loop()


_FORK_INSIDE_A_LOOP = """
import asyncio, os
import agentix.sio as sio

async def fork_inside():
    assert sio._running_loop() is asyncio.get_running_loop()
    pid = os.fork()
    if pid == 0:  # the child: asyncio's process check finds no loop here
        code = 0
        try:
            sio._running_loop()
            code = 3
        except RuntimeError:
            pass
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)

print("child exit", asyncio.run(fork_inside()))
"""


def test_a_forked_child_has_no_running_loop_as_asyncio_says():
    # Forked from a fresh interpreter (child_paths.run_in_fresh_interpreter says why).
    assert run_in_fresh_interpreter(_FORK_INSIDE_A_LOOP).splitlines()[-1] == "child exit 0"
