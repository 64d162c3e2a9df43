"""A namespace event's coroutine handler (host) and a request awaiting its
reply (sandbox) continue within the event loop callback that delivered the
event, not a loop turn later, and still run inside their task."""

import asyncio
import contextvars
import logging

import pytest

import agentix.sio as sio
from agentix import Namespace, register_namespace
from agentix.runtime.shared.codec import pack

# Every test here is a coroutine (without the mark, pytest skips them when
# asyncio_mode is not auto, as under bazel test).
pytestmark = pytest.mark.asyncio

_VAR = contextvars.ContextVar("ns32_var", default="unset")


class _Owner:
    namespace = "/p"


def _in_callback(loop, fn):
    """Runs fn() as a loop callback (as the streams' read callbacks run);
    returns a future of its result."""
    done = loop.create_future()

    def callback():
        try:
            done.set_result(fn())
        except BaseException as error:  # noqa: BLE001 (handed to the test)
            done.set_exception(error)

    loop.call_soon(callback)
    return done


async def test_a_handler_started_from_a_callback_runs_its_first_step_in_its_own_task_at_once():
    loop = asyncio.get_running_loop()
    tasks = sio.DetachedTasks(_Owner())
    seen = []

    async def handler():
        task = asyncio.current_task()
        seen.append(("first step", task is not None and task in tasks))
        _VAR.set("inside")
        async with asyncio.timeout(5):  # needs a current task
            await asyncio.sleep(0)
        seen.append(("after a suspension", asyncio.current_task() is task))

    def start():
        tasks.run("evt", handler(), loop)
        return list(seen)  # what had run when run() returned

    assert await _in_callback(loop, start) == [("first step", True)]
    assert _VAR.get() == "unset"  # the handler's context is its task's copy
    for _ in range(5):
        await asyncio.sleep(0)
    assert seen == [("first step", True), ("after a suspension", True)]
    assert not tasks  # let go of once it ended


async def test_a_handler_started_inside_a_task_waits_for_the_next_turn(caplog):
    loop = asyncio.get_running_loop()
    tasks = sio.DetachedTasks(_Owner())
    seen = []

    async def failing():
        seen.append("ran")
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, logger="agentix.sio"):
        tasks.run("evt", failing(), loop)  # this test is a task: no step can run inside it
        assert seen == []
        for _ in range(3):
            await asyncio.sleep(0)
    assert seen == ["ran"]
    assert "namespace /p: handler for 'evt' raised" in caplog.text
    assert not tasks


async def test_a_custom_task_factory_keeps_its_tasks_and_the_turn():
    loop = asyncio.get_running_loop()
    tasks = sio.DetachedTasks(_Owner())
    made = []
    seen = []

    def factory(loop, coro, **kwargs):
        task = asyncio.Task(coro, loop=loop, **kwargs)
        made.append(task)
        loop.call_soon(lambda: None)  # something scheduled behind the task's step
        return task

    async def handler():
        seen.append(asyncio.current_task() in made)

    loop.set_task_factory(factory)
    try:
        assert await _in_callback(loop, lambda: tasks.run("evt", handler(), loop) or list(seen)) == []
        for _ in range(3):
            await asyncio.sleep(0)
    finally:
        loop.set_task_factory(None)
    assert seen == [True]


async def test_a_request_resumes_within_the_callback_that_delivers_its_reply(bridge):
    loop = asyncio.get_running_loop()
    ns = register_namespace(Namespace("/p"))
    resumed = []

    async def ask():
        value = await ns.request("ask", {"q": 1}, timeout=5)
        resumed.append((value, asyncio.current_task() is request))
        return value

    request = asyncio.ensure_future(ask())
    await asyncio.sleep(0)
    request_id = bridge.sent[-1][3]

    def deliver():
        sio._deliver("/p", "ask:result", pack({"request_id": request_id, "value": 7}))
        return list(resumed)

    assert await _in_callback(loop, deliver) == [(7, True)]
    assert await request == 7
    assert ns._pending == {}


async def test_a_reply_with_other_callbacks_on_its_future_resumes_the_request_and_runs_them():
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    seen = []

    async def waiter():
        seen.append(("resumed", await future))

    task = asyncio.ensure_future(waiter())
    await asyncio.sleep(0)
    future.add_done_callback(lambda f: seen.append(("callback", f.result())))

    def settle():
        sio._settle_and_wake(loop, future, 5, None)
        return list(seen)

    assert await _in_callback(loop, settle) == []  # two callbacks: the loop runs them, in order
    await task
    assert seen == [("resumed", 5), ("callback", 5)]


async def test_an_error_reply_raises_in_the_request_within_the_delivering_callback():
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    seen = []

    async def waiter():
        try:
            await future
        except sio.RemoteSioError as error:
            seen.append((error.type, asyncio.current_task() is task))

    task = asyncio.ensure_future(waiter())
    await asyncio.sleep(0)

    def settle():
        sio._settle_and_wake(loop, future, None, sio.RemoteSioError("KeyError", "k"))
        return list(seen)

    assert await _in_callback(loop, settle) == [("KeyError", True)]
    await task
