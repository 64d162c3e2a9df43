"""CallFuture (agentix.runtime.client.pending): a call's future whose
awaiting task is resumed inside the loop callback that settles it (no loop
iteration in between), and that otherwise behaves as an asyncio.Future:
set_result / set_exception / cancel / timeouts wake the task one iteration
later, done callbacks are scheduled, a failing callback is reported."""

import asyncio
import contextvars

import pytest

from agentix.runtime.client.pending import CallFuture, PendingCall, wake_all

pytestmark = pytest.mark.asyncio


async def _awaiting(future: CallFuture, order: list) -> asyncio.Task:
    """A task that records what awaiting `future` gave it; returned once it waits."""

    async def wait() -> None:
        try:
            order.append(("result", await future))
        except BaseException as error:
            order.append(("raised", type(error).__name__))
            raise

    task = asyncio.create_task(wait())
    await asyncio.sleep(0)
    return task


async def test_a_task_settled_in_a_loop_callback_resumes_before_the_callback_returns():
    loop = asyncio.get_running_loop()
    future = CallFuture(loop=loop)
    order: list = []
    task = await _awaiting(future, order)

    def read_callback() -> None:
        woken: list = []
        PendingCall("id", "fn", future).settle(b"value", woken)
        order.append("settled")
        assert woken == [future]
        for settled in woken:
            settled.wake()
        order.append("callback returns")

    loop.call_soon(read_callback)
    await task
    assert order == ["settled", ("result", b"value"), "callback returns"]


async def test_the_task_resumes_in_its_own_context():
    var = contextvars.ContextVar("var", default="loop")
    loop = asyncio.get_running_loop()
    future = CallFuture(loop=loop)
    seen = []

    async def wait() -> None:
        var.set("task")
        await future
        seen.append(var.get())

    task = asyncio.create_task(wait())
    await asyncio.sleep(0)

    def read_callback() -> None:
        woken: list = []
        PendingCall("id", "fn", future).settle(b"", woken)
        woken[0].wake()
        seen.append(var.get())

    loop.call_soon(read_callback)
    await task
    assert seen == ["task", "loop"]


async def test_settled_inside_a_task_the_waiter_is_woken_one_iteration_later():
    # A task cannot run another task's step: wake() then schedules it.
    future = CallFuture(loop=asyncio.get_running_loop())
    order: list = []
    task = await _awaiting(future, order)
    woken: list = []
    PendingCall("id", "fn", future).settle(b"x", woken)
    woken[0].wake()
    order.append("waker goes on")
    await task
    assert order == ["waker goes on", ("result", b"x")]


@pytest.mark.parametrize("how", ["set_result", "set_exception", "cancel"])
async def test_settled_without_wake_it_wakes_its_waiter_as_a_future_does(how):
    future = CallFuture(loop=asyncio.get_running_loop())
    order: list = []
    task = await _awaiting(future, order)
    if how == "set_result":
        future.set_result(7)
    elif how == "set_exception":
        future.set_exception(KeyError("k"))
    else:
        assert future.cancel()
    order.append("settled")
    await asyncio.gather(task, return_exceptions=True)
    expected = {"set_result": ("result", 7), "set_exception": ("raised", "KeyError"), "cancel": ("raised", "CancelledError")}
    assert order == ["settled", expected[how]]


async def test_cancelling_or_timing_out_the_awaiting_task_interrupts_the_wait():
    future = CallFuture(loop=asyncio.get_running_loop())
    order: list = []
    task = await _awaiting(future, order)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert future.cancelled()
    assert order == [("raised", "CancelledError")]

    future = CallFuture(loop=asyncio.get_running_loop())
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await future
    assert future.cancelled()


async def test_done_callbacks_are_kept_removed_and_scheduled_like_a_futures():
    loop = asyncio.get_running_loop()
    future = CallFuture(loop=loop)
    calls = []
    first, second = (lambda f: calls.append("first")), (lambda f: calls.append("second"))
    future.add_done_callback(first)
    future.add_done_callback(second)
    future.add_done_callback(first)
    assert future.remove_done_callback(first) == 2
    assert future.remove_done_callback(first) == 0
    future.set_result(None)
    assert calls == []  # scheduled, not run by set_result
    await asyncio.sleep(0)
    assert calls == ["second"]
    future.add_done_callback(first)  # already done: scheduled at once
    await asyncio.sleep(0)
    assert calls == ["second", "first"]


async def test_a_failing_callback_is_reported_and_the_others_still_run():
    loop = asyncio.get_running_loop()
    reported = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
    try:
        future = CallFuture(loop=loop)
        calls = []

        def broken(_future):
            raise ValueError("broken callback")

        future.add_done_callback(broken)
        future.add_done_callback(lambda f: calls.append(f.result()))
        done = asyncio.Event()

        def read_callback() -> None:
            woken: list = []
            PendingCall("id", "fn", future).settle(b"r", woken)
            woken[0].wake()
            done.set()

        loop.call_soon(read_callback)
        await done.wait()
        assert calls == [b"r"]
        assert [type(error) for error in reported] == [ValueError]
    finally:
        loop.set_exception_handler(None)


async def test_a_future_done_before_settle_is_left_alone():
    future = CallFuture(loop=asyncio.get_running_loop())
    future.cancel()
    woken: list = []
    PendingCall("id", "fn", future).settle(b"late", woken)
    assert woken == []
    assert future.cancelled()


async def test_an_interrupt_in_a_callback_propagates_and_the_rest_are_scheduled():
    loop = asyncio.get_running_loop()
    future = CallFuture(loop=loop)
    calls = []

    def interrupted(_future):
        raise KeyboardInterrupt

    future.add_done_callback(interrupted)
    future.add_done_callback(lambda f: calls.append(f.result()))
    raised = []

    def read_callback() -> None:
        woken: list = []
        PendingCall("id", "fn", future).settle(b"r", woken)
        try:
            woken[0].wake()
        except KeyboardInterrupt:
            raised.append("KeyboardInterrupt")
        assert calls == []  # not run in the interrupted wake: scheduled

    loop.call_soon(read_callback)
    for _ in range(3):
        await asyncio.sleep(0)
    assert raised == ["KeyboardInterrupt"]
    assert calls == [b"r"]


async def test_wake_all_schedules_the_later_wakeups_when_one_raises_keyboard_interrupt():
    # A task's KeyboardInterrupt propagates out of the read callback; the calls settled by the
    # same read after it still resume (one iteration later), none is left waiting forever.
    loop = asyncio.get_running_loop()
    futures = [CallFuture(loop=loop) for _ in range(3)]
    order: list = []
    tasks = [await _awaiting(future, order) for future in futures[1:]]

    def interrupt(future: CallFuture) -> None:
        order.append("interrupt")
        raise KeyboardInterrupt

    futures[0].add_done_callback(interrupt)
    raised: list = []

    def read_callback() -> None:
        woken: list = []
        for index, future in enumerate(futures):
            PendingCall(f"id{index}", "fn", future).settle(index, woken)
        try:
            wake_all(woken)
        except KeyboardInterrupt:
            raised.append("KeyboardInterrupt")
        order.append("callback returns")

    loop.call_soon(read_callback)
    for _ in range(5):  # (a task left unwoken would wait forever: not awaited here)
        await asyncio.sleep(0)
    assert [task.done() for task in tasks] == [True, True]
    assert raised == ["KeyboardInterrupt"]
    assert order == ["interrupt", "callback returns", ("result", 1), ("result", 2)]


async def test_wake_all_resumes_each_settled_task_in_order_inside_the_callback():
    loop = asyncio.get_running_loop()
    futures = [CallFuture(loop=loop) for _ in range(3)]
    order: list = []
    tasks = [await _awaiting(future, order) for future in futures]

    def read_callback() -> None:
        woken: list = []
        for index, future in enumerate(futures):
            PendingCall(f"id{index}", "fn", future).settle(index, woken)
        wake_all(woken)
        order.append("callback returns")

    loop.call_soon(read_callback)
    await asyncio.gather(*tasks)
    assert order == [("result", 0), ("result", 1), ("result", 2), "callback returns"]
