"""AGENTIX_CALLS_CPU (agentix.runtime.client.pinned_waits): the settings, when
pinned waits pin and unpin the loop thread, and what a client on the frame
wire does with them (its HELLO, the loop thread's mask while a call is in
flight and once it returned)."""

import asyncio
import os

import pytest
import pytest_asyncio

import sandbox_functions
from agentix import AsyncClientNamespace, RuntimeClient
from agentix.runtime.client import pinned_waits as pw
from agentix.runtime.client.frames import FrameCallsStream
from agentix.runtime.client.pinned_waits import CallsCpu, PinnedWaits, calls_cpu_setting
from fake_frames import FrameServer
from fake_runtime import FakeRuntime, serve

ALLOWED = os.sched_getaffinity(0)


def test_settings_parse_to_a_mode_and_a_cpu(monkeypatch):
    for off in ("off", " OFF ", "Off"):
        assert calls_cpu_setting(off) == CallsCpu("off", None)
    assert calls_cpu_setting("wait") == CallsCpu("wait", None)
    assert calls_cpu_setting("wait:auto") == CallsCpu("wait", max(ALLOWED))
    assert calls_cpu_setting(f"WAIT:{min(ALLOWED)}") == CallsCpu("wait", min(ALLOWED))
    assert calls_cpu_setting("auto") == CallsCpu("always", max(ALLOWED))
    assert calls_cpu_setting(str(min(ALLOWED))) == CallsCpu("always", min(ALLOWED))
    for bad in ("fast", "-1", "1.0", "wait:", "wait:x", "auto:1", "always"):
        with pytest.raises(ValueError, match="AGENTIX_CALLS_CPU"):
            calls_cpu_setting(bad)
    for setting in ("4096", "wait:4096"):  # not one this process may use
        with pytest.raises(ValueError, match="not a CPU this process may run on"):
            calls_cpu_setting(setting)


def test_unset_or_empty_is_the_default_setting(monkeypatch):
    monkeypatch.delenv("AGENTIX_CALLS_CPU", raising=False)
    assert calls_cpu_setting() == calls_cpu_setting(pw.DEFAULT_SETTING)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "  ")
    assert calls_cpu_setting() == calls_cpu_setting(pw.DEFAULT_SETTING)
    monkeypatch.setattr(pw, "DEFAULT_SETTING", "wait:auto")  # what the lead may flip it to
    assert calls_cpu_setting() == CallsCpu("wait", max(ALLOWED))
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "off")
    assert calls_cpu_setting() == CallsCpu("off", None)


def test_current_cpu_is_one_this_thread_may_run_on():
    assert pw.current_cpu() in ALLOWED


@pytest.fixture
def masks(monkeypatch):
    """The masks PinnedWaits sets, in order (none is really set)."""
    calls = []
    monkeypatch.setattr(pw.os, "sched_setaffinity", lambda pid, mask: calls.append((pid, set(mask))))
    return calls


def test_a_call_alone_in_flight_pins_and_its_end_unpins(masks):
    waits = PinnedWaits(1, {0, 1})
    waits.hold()
    assert masks == [(0, {1})] and waits.pinned
    waits.release()
    assert masks == [(0, {1}), (0, {0, 1})] and not waits.pinned
    waits.hold()  # the next sequential call: pinned again
    waits.release()
    assert len(masks) == 4


def test_overlapping_calls_unpin_and_nothing_is_set_twice(masks):
    waits = PinnedWaits(1, {0, 1})
    waits.hold()
    waits.hold()  # 1 -> 2: overlap runs anywhere
    assert masks == [(0, {1}), (0, {0, 1})]
    waits.hold()
    waits.release()
    waits.release()  # 2 -> 1: stays unpinned (not pinned again mid-overlap)
    waits.release()  # 1 -> 0: already unpinned, no call
    assert len(masks) == 2 and waits.in_flight == 0
    waits.hold()
    assert masks[-1] == (0, {1})


def test_a_streaming_call_counts_but_never_pins(masks):
    waits = PinnedWaits(1, {0, 1})
    waits.hold(pin=False)
    assert masks == []
    waits.hold()  # a call beside an open stream: overlap
    assert masks == []
    waits.release()
    waits.release()
    waits.hold()
    assert masks == [(0, {1})]
    waits.hold(pin=False)  # a stream opened while a call waits: unpinned
    assert masks[-1] == (0, {0, 1})


def test_pinned_waits_that_queue_for_the_cpu_rest_the_pins_for_doubling_periods(masks, monkeypatch):
    waited = [0]  # the loop thread's run-queue wait (ns), as schedstat gives it
    now = [1000.0]
    monkeypatch.setattr(pw, "run_queue_wait_ns", lambda: waited[0])
    monkeypatch.setattr(pw, "time", type("Clock", (), {"monotonic": staticmethod(lambda: now[0])}))
    waits = PinnedWaits(1, {0, 1})
    calls = pw.TIME_EVERY * pw.TIMED_PER_JUDGEMENT

    def window(pinned_ns, between_ns=0):  # a judgement's worth of sequential calls; how many pinned
        pinned = 0
        for _ in range(calls):
            waits.hold()
            pinned += waits.pinned
            waited[0] += pinned_ns if waits.pinned else 0
            waits.release()
            waited[0] += between_ns  # queued for the CPU outside the call: not the pins' doing
        return pinned

    quiet, busy = pw.BUSY_WAIT_NS // 4, pw.BUSY_WAIT_NS * 2
    assert window(busy) == calls  # the first judgement (warming up) is not one
    assert waits.resting_until == 0.0
    assert window(quiet, between_ns=10 * busy) == calls
    assert waits.resting_until == 0.0
    assert window(busy) == calls  # judged as the window's last call ends
    assert waits.resting_until == now[0] + pw.BACKOFF_FIRST_S
    count = len(masks)
    waits.hold()
    waits.release()
    assert len(masks) == count and not waits.pinned  # resting: no system call at all
    # Still busy in the first judgement after it: twice as long.
    now[0] = waits.resting_until
    assert window(busy) == calls
    assert waits.resting_until == now[0] + 2 * pw.BACKOFF_FIRST_S
    # A quiet judgement and the next back-off is short again.
    now[0] = waits.resting_until
    assert window(quiet) == calls
    window(busy)
    assert waits.resting_until == now[0] + pw.BACKOFF_FIRST_S


def test_run_queue_wait_is_this_threads_and_never_goes_back():
    first = pw.run_queue_wait_ns()
    assert first >= 0
    for _ in range(50):
        os.sched_yield()
    assert pw.run_queue_wait_ns() >= first


def test_another_thread_never_changes_the_mask(masks):
    waits = PinnedWaits(1, {0, 1})
    import threading

    thread = threading.Thread(target=waits.hold)
    thread.start()
    thread.join()
    assert masks == [] and waits.in_flight == 1


def test_one_pinned_waits_per_thread_counts_every_client_of_its_loop(monkeypatch):
    import threading

    monkeypatch.setattr(pw, "_threads", threading.local())
    assert pw.pinned_waits(CallsCpu("off", None)) is None
    assert pw.pinned_waits(CallsCpu("always", 0)) is None
    first = pw.pinned_waits(CallsCpu("wait", max(ALLOWED)))
    assert first is pw.pinned_waits(CallsCpu("wait", None))  # a second client of this thread
    assert (first.cpu, first.original) == (max(ALLOWED), ALLOWED)
    other = []
    thread = threading.Thread(target=lambda: other.append(pw.pinned_waits(CallsCpu("wait", None))))
    thread.start()
    thread.join()
    assert other[0] is not first and other[0].cpu in ALLOWED  # that thread's own, on its CPU


# --- a client on the frame wire ---------------------------------------------


@pytest.fixture(autouse=True)
def _frame_wire(monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
    monkeypatch.delenv("AGENTIX_NATIVE_TRANSPORT", raising=False)
    monkeypatch.setattr(pw, "_threads", pw.threading.local())  # each test makes its own PinnedWaits
    yield
    os.sched_setaffinity(0, ALLOWED)


@pytest_asyncio.fixture
async def framed(tmp_path_factory):
    """A FakeRuntime (it runs calls in this thread's loop) with a frame wire."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="agx-pw-", dir="/tmp") as directory:
        fake = FakeRuntime()
        fake.path = os.path.join(directory, "runtime.sock")
        fake.url = f"unix://{fake.path}"
        server, _ = await serve(fake, fake.url)
        fake.frames = await FrameServer(fake, fake.path + ".calls").start()
        try:
            yield fake
        finally:
            await fake.frames.stop()
            await server.stop(None)


needs_two = pytest.mark.skipif(len(ALLOWED) < 2, reason="pinning is only visible with two CPUs allowed")


@needs_two
@pytest.mark.asyncio
async def test_wait_pins_the_loop_thread_only_while_a_call_waits(framed, monkeypatch):
    cpu = max(ALLOWED)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait:auto")
    async with RuntimeClient(framed.url) as client:
        # The fake runs the call in this thread: it sees the mask of a call in flight.
        assert await client.remote(os.sched_getaffinity, 0) == {cpu}
        assert os.sched_getaffinity(0) == ALLOWED  # back to user code: unpinned
        assert type(client._stream) is FrameCallsStream
        assert framed.frames.hellos[-1]["agentix-calls-cpu"] == str(cpu)
        assert framed.frames.hellos[-1]["agentix-payload-ring"] == "1"  # beside it, not instead
        # Overlapping calls are not pinned.
        both = await asyncio.gather(*(client.remote(os.sched_getaffinity, 0) for _ in range(2)))
        assert both == [ALLOWED, ALLOWED]
        assert os.sched_getaffinity(0) == ALLOWED
        # A call that fails, or is cancelled, unpins too.
        with pytest.raises(Exception, match="boom"):
            await client.remote(sandbox_functions.fail, "boom")
        assert os.sched_getaffinity(0) == ALLOWED
        waiting = asyncio.create_task(client.remote(sandbox_functions.sleep_forever))
        await asyncio.sleep(0.05)
        assert os.sched_getaffinity(0) == {cpu}  # this test runs while the call waits: still pinned
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert os.sched_getaffinity(0) == ALLOWED
        assert await client.remote(os.sched_getaffinity, 0) == {cpu}


@needs_two
@pytest.mark.asyncio
async def test_plain_wait_pins_to_the_cpu_the_thread_connected_on(framed, monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait")
    async with RuntimeClient(framed.url) as client:
        during = await client.remote(os.sched_getaffinity, 0)
        (cpu,) = during
        assert framed.frames.hellos[-1]["agentix-calls-cpu"] == str(cpu)
        assert os.sched_getaffinity(0) == ALLOWED


@pytest.mark.asyncio
async def test_off_sends_no_cpu_and_pins_nothing(framed, monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "off")
    async with RuntimeClient(framed.url) as client:
        assert await client.remote(os.sched_getaffinity, 0) == ALLOWED
        assert "agentix-calls-cpu" not in framed.frames.hellos[-1]


@needs_two
@pytest.mark.asyncio
async def test_a_namespace_stream_carries_no_cpu_and_its_events_wait_pinned_only_inside_a_call(framed, monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait:auto")
    client = RuntimeClient(framed.url)
    client.register_namespace(AsyncClientNamespace("/plug"))
    async with client:
        assert await client.remote(os.sched_getaffinity, 0) == {max(ALLOWED)}
        namespace_hellos = [h for h in framed.frames.hellos if h.get("agentix-stream") == "namespace"]
        assert namespace_hellos and all("agentix-calls-cpu" not in h for h in namespace_hellos)
        assert os.sched_getaffinity(0) == ALLOWED
