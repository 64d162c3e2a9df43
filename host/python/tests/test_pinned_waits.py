"""AGENTIX_CALLS_CPU (agentix.runtime.client.pinned_waits): the settings, when
pinned waits pin and unpin the loop thread, and what a client on the frame
wire does with them (its HELLO, the loop thread's mask while a call is in
flight and once it returned)."""

import asyncio
import os
import selectors
import socket
import threading

import pytest

import sandbox_functions
from agentix import AsyncClientNamespace, RuntimeClient
from agentix.runtime.client import pinned_waits as pw
from agentix.runtime.client.frames import FrameCallsStream
from agentix.runtime.client.namespaces import FrameNamespaceStream
from agentix.runtime.client.pinned_waits import CallsCpu, PinnedWaits, calls_cpu_setting, wait_yield_setting
from agentix.runtime.shared.codec import pack
from agentix.runtime.v1 import runtime_pb2 as pb
from child_paths import run_in_fresh_interpreter
from fake_runtime import eventually
from test_loop_slice import _in_a_thread, _slice_ns, needs_slices

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
    # The default follows the daemon's probe; the same setting named does not.
    assert calls_cpu_setting() == CallsCpu("wait", None, follow=True)
    assert calls_cpu_setting(pw.DEFAULT_SETTING) == CallsCpu("wait", None, follow=False)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "  ")
    assert calls_cpu_setting() == CallsCpu("wait", None, follow=True)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "off")
    assert calls_cpu_setting() == CallsCpu("off", None)


def test_a_daemon_that_says_off_stops_the_pins_until_one_says_wait(masks):
    waits = PinnedWaits(min(ALLOWED), ALLOWED)
    waits.hold()
    waits.before_select(None)
    waits.after_select()
    assert len(masks) == 2
    waits.follow(False)
    waits.before_select(None)
    waits.after_select()
    assert len(masks) == 2 and not waits.pinned
    waits.release()
    waits.hold()
    waits.before_select(None)
    assert not waits.pinned  # for every later call too
    waits.release()
    waits.follow(True)
    waits.hold()
    waits.before_select(None)
    assert waits.pinned and masks[-1] == (0, {min(ALLOWED)})
    waits.after_select()
    waits.release()


@pytest.mark.asyncio
async def test_told_off_the_loop_runs_its_own_selector_and_told_wait_the_pinning_one(masks):
    loop = asyncio.get_running_loop()
    inner = loop._selector
    waits = pw.pinned_waits(CallsCpu("wait", min(ALLOWED), follow=True))
    try:
        assert isinstance(loop._selector, pw._PinningSelector)
        pw.follow_daemon(waits, False)
        assert loop._selector is inner and waits.told_off
        await asyncio.sleep(0)  # the loop runs on its own selector
        pw.follow_daemon(waits, True)
        assert isinstance(loop._selector, pw._PinningSelector) and not waits.told_off
    finally:
        loop._selector = inner
        pw._threads.__dict__.pop("waits", None)


@pytest.mark.asyncio
async def test_a_named_setting_pins_again_after_a_daemon_told_an_earlier_client_off(masks):
    loop = asyncio.get_running_loop()
    inner = loop._selector
    try:
        waits = pw.pinned_waits(CallsCpu("wait", min(ALLOWED), follow=True))
        pw.follow_daemon(waits, False)  # a probing daemon's answer to the default setting
        assert loop._selector is inner and waits.told_off
        # A later client on the thread that names `wait` (AGENTIX_CALLS_CPU set): pinned waits.
        assert pw.pinned_waits(CallsCpu("wait", min(ALLOWED))) is waits
        assert isinstance(loop._selector, pw._PinningSelector) and not waits.told_off
        waits.hold()
        waits.before_select(None)
        assert waits.pinned and masks[-1] == (0, {min(ALLOWED)})
        waits.after_select()
        waits.release()
        # Another client following the daemon's default keeps what it was told last.
        pw.follow_daemon(waits, False)
        assert pw.pinned_waits(CallsCpu("wait", None, follow=True)) is waits and waits.told_off
    finally:
        loop._selector = inner
        pw._threads.__dict__.pop("waits", None)


def test_current_cpu_is_one_this_thread_may_run_on():
    assert pw.current_cpu() in ALLOWED


@pytest.fixture
def masks(monkeypatch):
    """The masks PinnedWaits sets, in order (none is really set)."""
    calls = []
    monkeypatch.setattr(pw.os, "sched_setaffinity", lambda pid, mask: calls.append((pid, set(mask))))
    return calls


@pytest.fixture
def clock(monkeypatch):
    """The loop thread's run-queue wait (ns, as schedstat gives it) and the
    monotonic clock PinnedWaits reads, both set by the test: ([wait], [now])."""
    waited = [0]
    now = [1000.0]
    monkeypatch.setattr(pw, "run_queue_wait_ns", lambda: waited[0])
    monkeypatch.setattr(pw, "time", type("Clock", (), {"monotonic": staticmethod(lambda: now[0])}))
    return waited, now


def _blocks(waits, timeout=None):
    """The loop blocks in its selector once (as _PinningSelector.select): whether it
    waited pinned."""
    waits.before_select(timeout)
    pinned = waits.pinned
    waits.after_select()
    assert not waits.pinned  # the selector returned: nothing runs pinned
    return pinned


def test_a_call_alone_in_flight_waits_pinned_and_runs_nothing_pinned(masks):
    waits = PinnedWaits(1, {0, 1})
    assert not _blocks(waits)  # nothing in flight
    waits.hold()
    assert masks == []  # nothing pinned until the loop blocks
    assert _blocks(waits)
    assert masks == [(0, {1}), (0, {0, 1})]
    assert not _blocks(waits, timeout=0)  # a poll that does not block: not pinned
    assert _blocks(waits, timeout=0.5)  # a timer after it (a deadline): pinned
    waits.release()
    assert not _blocks(waits)
    waits.hold()  # the next sequential call: pinned again
    assert _blocks(waits)
    waits.release()
    assert len(masks) == 6


def test_overlapping_calls_wait_unpinned(masks):
    waits = PinnedWaits(1, {0, 1})
    waits.hold()
    waits.hold()  # 1 -> 2: overlap waits anywhere
    assert not _blocks(waits)
    waits.hold()
    waits.release()
    waits.release()  # 2 -> 1: not pinned again mid-overlap
    assert not _blocks(waits)
    waits.release()
    assert masks == [] and waits.in_flight == 0
    waits.hold()
    assert _blocks(waits)


def test_a_streaming_call_counts_but_never_pins(masks):
    waits = PinnedWaits(1, {0, 1})
    waits.hold(pin=False)
    assert not _blocks(waits)
    waits.hold()  # a call beside an open stream: overlap
    assert not _blocks(waits)
    waits.release()
    waits.release()
    waits.hold()
    assert _blocks(waits)
    waits.hold(pin=False)  # a stream opened while a call waits: unpinned
    assert not _blocks(waits)


def test_namespace_traffic_leaves_the_call_in_flight_unpinned_until_the_next_lone_call(masks):
    waits = PinnedWaits(1, {0, 1})
    pw._threads.waits = waits  # this thread's, as pinned_waits() makes it
    waits.hold()
    assert _blocks(waits)
    pw.converse()  # a namespace event reached this thread's loop
    assert not _blocks(waits) and not _blocks(waits, timeout=0.5)
    waits.release()
    waits.hold()  # the next call alone in flight: pinned again
    assert _blocks(waits)
    waits.release()
    assert masks == [(0, {1}), (0, {0, 1})] * 2


def test_converse_on_a_thread_without_pinned_waits_does_nothing(masks):
    waits = PinnedWaits(1, {0, 1})
    pw._threads.waits = waits
    waits.hold()
    left = []

    def other_thread():
        pw.converse()  # its own (none): not this thread's waits
        left.append(getattr(pw._threads, "waits", None))

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert left == [None] and waits.armed and _blocks(waits)


def test_a_select_that_raises_is_unpinned_by_the_selector(masks):
    waits = PinnedWaits(1, {0, 1})

    class Interrupted:
        def select(self, timeout=None):
            assert waits.pinned  # blocking, armed: pinned
            raise KeyboardInterrupt

    selector = pw._PinningSelector(Interrupted(), waits)
    waits.hold()
    with pytest.raises(KeyboardInterrupt):
        selector.select(None)
    assert not waits.pinned and masks == [(0, {1}), (0, {0, 1})]


def test_a_wait_whose_event_is_in_already_is_not_pinned(masks):
    waits = PinnedWaits(1, {0, 1})
    ours, daemon = socket.socketpair()
    with selectors.EpollSelector() as inner, ours, daemon:  # asyncio's on Linux
        inner.register(ours, selectors.EVENT_READ)
        selector = pw._PinningSelector(inner, waits)
        waits.hold()
        assert selector.select(0.01) == []  # nothing in: the loop waited, pinned
        assert masks == [(0, {1}), (0, {0, 1})]
        daemon.send(b"result")  # in before the loop got back to its selector
        [(key, events)] = selector.select(None)
        assert key.fileobj is ours and events == selectors.EVENT_READ
        assert len(masks) == 2  # no wait, no pin
        ours.recv(16)
        waits.release()
        waits.hold()  # the next lone call waits pinned again
        assert selector.select(0.01) == [] and len(masks) == 4
        waits.release()
        daemon.send(b"late")  # nothing in flight: never pinned, whatever is in
        assert len(selector.select(None)) == 1 and len(masks) == 4


def test_the_yield_setting_is_on_unless_turned_off(monkeypatch):
    monkeypatch.delenv("AGENTIX_WAIT_YIELD", raising=False)
    assert wait_yield_setting() is True
    for value, yields in (("", True), ("on", True), (" 1 ", True), ("OFF", False), ("0", False)):
        assert wait_yield_setting(value) is yields, value
    monkeypatch.setenv("AGENTIX_WAIT_YIELD", "off")
    assert wait_yield_setting() is False
    with pytest.raises(ValueError, match="AGENTIX_WAIT_YIELD='sometimes' is not on or off"):
        wait_yield_setting("sometimes")


@pytest.fixture
def yields(monkeypatch):
    """Counts the loop thread's sched_yield calls; `then` (settable) runs in each,
    as another thread the yield let run would (none by default)."""

    class Yields:
        count = 0
        then = None

        def __call__(self):
            self.count += 1
            if self.then is not None:
                self.then()

    counter = Yields()
    monkeypatch.setattr(pw.os, "sched_yield", counter)
    return counter


def test_a_lone_call_yields_once_before_it_pins_and_needs_no_pin_if_the_result_came_meanwhile(masks, yields):
    waits = PinnedWaits(1, {0, 1})
    ours, daemon = socket.socketpair()
    with selectors.EpollSelector() as inner, ours, daemon:
        inner.register(ours, selectors.EVENT_READ)
        selector = pw._PinningSelector(inner, waits)
        assert selector.select(0.01) == [] and yields.count == 0  # nothing in flight: no yield, no pin
        waits.hold()
        assert selector.select(0.01) == []  # nothing came during the yield: the wait is pinned
        assert yields.count == 1 and masks == [(0, {1}), (0, {0, 1})]
        yields.then = lambda: daemon.send(b"result")  # the worker finished the call in the yield
        [(key, _)] = selector.select(None)
        assert key.fileobj is ours and yields.count == 2 and len(masks) == 2  # no pin
        ours.recv(16)
        yields.then = None
        daemon.send(b"result")  # in before the loop got back: no yield either
        assert len(selector.select(None)) == 1 and yields.count == 2
        ours.recv(16)
        assert selector.select(0) == [] and yields.count == 2  # a poll that does not block
        waits.hold()  # overlapping calls wait unpinned, without a yield
        assert selector.select(0.01) == [] and yields.count == 2 and len(masks) == 2
        waits.release()
        waits.release()
        off = PinnedWaits(1, {0, 1}, yields=False)  # AGENTIX_WAIT_YIELD=off
        selector = pw._PinningSelector(inner, off)
        off.hold()
        assert selector.select(0.01) == [] and yields.count == 2 and len(masks) == 4


def test_a_yield_that_ran_another_busy_thread_rests_the_yields_for_doubling_periods(masks, clock, yields):
    _, now = clock
    waits = PinnedWaits(1, {0, 1})
    ready = lambda timeout, most: []  # noqa: E731 (the epoll object's poll: nothing in)

    def slow():  # another busy thread on this CPU ran for a tick
        now[0] += 0.004

    def yielded_at(when):
        now[0] = when
        before = yields.count
        assert not waits.yield_first(ready)
        return yields.count > before

    waits.hold()
    assert yielded_at(1000.0)  # a fast yield: no rest
    yields.then = slow
    assert yielded_at(1001.0)  # slow: no yields for 1 s
    assert not yielded_at(1001.5) and not yielded_at(1002.0)
    assert yielded_at(1002.01)  # slow again within 1 s of the rest's end: 2 s
    assert not yielded_at(1003.9)
    yields.then = None
    assert yielded_at(1004.02)  # fast
    yields.then = slow
    assert yielded_at(1010.0)  # slow, long after the last rest ended: 1 s again
    assert not yielded_at(1010.9) and yielded_at(1011.01)
    assert masks == []  # yield_first never pins


def test_pinned_waits_that_queue_for_the_cpu_rest_the_pins_for_doubling_periods(masks, clock):
    waited, now = clock
    waits = PinnedWaits(1, {0, 1})
    calls = pw.TIME_EVERY * pw.TIMED_PER_JUDGEMENT

    def window(pinned_ns, between_ns=0):  # a judgement's worth of sequential calls; how many pinned
        pinned = 0
        for _ in range(calls):
            waits.hold()
            waits.before_select(None)
            pinned += waits.pinned
            waited[0] += pinned_ns if waits.pinned else 0
            waits.after_select()
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
    assert not _blocks(waits)
    waits.release()
    assert len(masks) == count  # resting: no system call at all
    # Still busy in the first judgement after it: twice as long.
    now[0] = waits.resting_until
    assert window(busy) == calls
    assert waits.resting_until == now[0] + 2 * pw.BACKOFF_FIRST_S
    # A quiet judgement and the next back-off is short again.
    now[0] = waits.resting_until
    assert window(quiet) == calls
    window(busy)
    assert waits.resting_until == now[0] + pw.BACKOFF_FIRST_S


def test_a_rest_earned_by_a_burst_inside_one_call_ends_with_that_call(masks, clock):
    """Many pinned waits per call (records or stream items waking the loop
    while one call runs) that queued for the CPU rest the pins only until no
    call is in flight; the same queueing over sequential calls rests the
    whole period."""
    waited, now = clock
    waits = PinnedWaits(1, {0, 1})
    pins = pw.TIME_EVERY * pw.TIMED_PER_JUDGEMENT
    busy = pw.BUSY_WAIT_NS * 2

    def burst_call(wakes):  # one call in flight while the loop wakes `wakes` times
        waits.hold()
        for _ in range(wakes):
            pinned = _blocks_queued(waits, waited, busy)
        return pinned

    def sequential(n):
        _sequential_queued(waits, waited, n, busy)

    assert burst_call(pins)  # the first judgement (warming up) is not one
    assert burst_call(pins) is False  # (the second call started while the first ran: 2 in flight)
    waits.release()
    waits.release()
    assert burst_call(pins - 1)
    assert _blocks_queued(waits, waited, busy)  # the window's last pin: judged busy
    assert waits.resting_until == now[0] + pw.BACKOFF_FIRST_S
    assert not _blocks_queued(waits, waited, busy)  # resting while the burst's call runs
    waits.release()  # ... and no longer once it ended
    assert waits.resting_until == 0.0
    waits.hold()
    assert _blocks_queued(waits, waited, busy)  # the next call waits pinned at once
    waits.release()
    # The same queueing one pin per call: the CPU is busy, the rest outlives the calls.
    sequential(pins - 1)
    assert waits.resting_until == now[0] + 2 * pw.BACKOFF_FIRST_S  # still busy after a back-off
    waits.hold()
    assert not _blocks_queued(waits, waited, busy)
    waits.release()
    assert waits.resting_until == now[0] + 2 * pw.BACKOFF_FIRST_S


def test_a_bursts_queued_waits_do_not_judge_the_calls_after_it(masks, clock):
    """A burst that queued for the CPU (its own records waking the loop) and
    ended before its judgement came leaves none of its waits in the
    judgement of the sequential calls after it: they wait pinned throughout
    (the namespace requests after a span burst, docs/PERFORMANCE.md
    "Figures from the stop-27 session")."""
    waited, now = clock
    waits = PinnedWaits(1, {0, 1})
    pins = pw.TIME_EVERY * pw.TIMED_PER_JUDGEMENT
    quiet, busy = pw.BUSY_WAIT_NS // 4, pw.BUSY_WAIT_NS * 4

    def sequential(n, queued_ns):
        return _sequential_queued(waits, waited, n, queued_ns)

    assert sequential(pins, quiet) == pins  # the first judgement (warming up) is not one
    waits.hold()  # a burst of most of a window, queued for the CPU
    assert all(_blocks_queued(waits, waited, busy) for _ in range(pins - pw.TIME_EVERY))
    waits.release()
    assert waits.resting_until == 0.0
    # Two windows of quiet sequential calls: judged by their own waits, never resting.
    assert sequential(2 * pins, quiet) == 2 * pins
    assert waits.resting_until == 0.0
    # Sequential calls that queue as much are judged busy as before.
    assert sequential(pins, busy) == pins
    assert waits.resting_until == now[0] + pw.BACKOFF_FIRST_S


def _sequential_queued(waits, waited, n, queued_ns):
    """`n` sequential calls, each one pinned wait queuing `queued_ns`: how many
    waited pinned."""
    pinned = 0
    for _ in range(n):
        waits.hold()
        pinned += _blocks_queued(waits, waited, queued_ns)
        waits.release()
    return pinned


def _blocks_queued(waits, waited, queued_ns):
    """As _blocks, the pinned wait queuing `queued_ns` for its CPU."""
    waits.before_select(None)
    pinned = waits.pinned
    waited[0] += queued_ns if pinned else 0
    waits.after_select()
    return pinned


@pytest.fixture
def call_clock(monkeypatch, clock):
    """The ns clock PinnedWaits times lone calls with, set by the test, beside
    `clock`: ([ns], [wait], [now])."""
    ns = [10**12]
    monkeypatch.setattr(pw, "_clock_ns", lambda: ns[0])
    waited, now = clock
    return ns, waited, now


def _lone_calls(waits, ns, count, pinned_us, unpinned_us, after_switch_us=None):
    """`count` sequential lone calls, each taking the time given for how it
    waited (as the loop's selector runs them), or `after_switch_us` for the
    first TRIAL_SKIP after a change of how; how many waited pinned."""
    pinned, last, since = 0, True, 0
    for _ in range(count):
        waits.hold()
        waited_pinned = _blocks(waits)
        pinned += waited_pinned
        since = 0 if waited_pinned != last else since + 1
        last = waited_pinned
        took = pinned_us if waited_pinned else unpinned_us
        if after_switch_us is not None and since < pw.TRIAL_SKIP:
            took = after_switch_us
        ns[0] += int(took * 1000)
        waits.release()
    return pinned


def _trial_waits():
    waits = PinnedWaits(1, {0, 1})
    waits.trial = pw.PinTrial()
    return waits


def test_the_default_times_its_lone_calls_both_ways_and_keeps_the_faster(masks, call_clock):
    ns, _, now = call_clock
    waits = _trial_waits()
    trial_calls = pw.TRIAL_BLOCK * pw.TRIAL_BLOCKS
    # Warming up: pinned, not timed.
    assert _lone_calls(waits, ns, pw.TRIAL_FIRST_AFTER, 64, 49) == pw.TRIAL_FIRST_AFTER
    assert not waits.trial.running and waits.trial.last is None
    # The trial: blocks pinned and unpinned in turn, half of its calls each.
    assert _lone_calls(waits, ns, trial_calls, 64, 49) == trial_calls // 2
    assert waits.trial.last == (64.0, 49.0) and not waits.trial.pin
    # Unpinned was faster: no pins (no system call) until the next trial is due.
    count = len(masks)
    assert _lone_calls(waits, ns, 500, 64, 49) == 0
    assert len(masks) == count
    # The next trials come 1 s, 2 s, 4 s ... (up to TRIAL_EVERY_S) after the last.
    every = pw.TRIAL_FIRST_EVERY_S
    for _ in range(8):
        now[0] += every - 0.01
        _lone_calls(waits, ns, 1, 64, 49)
        assert not waits.trial.running
        now[0] += 0.01
        assert _lone_calls(waits, ns, trial_calls, 64, 49) == trial_calls // 2
        assert not waits.trial.running and not waits.trial.pin
        every = min(every * 2, pw.TRIAL_EVERY_S)
    assert every == pw.TRIAL_EVERY_S
    now[0] += every
    # The machine changed: pinned is now the faster, and is kept.
    assert _lone_calls(waits, ns, trial_calls, 40, 70) == trial_calls // 2
    assert waits.trial.last == (40.0, 70.0) and waits.trial.pin
    assert _lone_calls(waits, ns, 100, 40, 70) == 100


def test_a_trial_that_changes_the_choice_says_so_at_debug_level(masks, call_clock, caplog):
    ns, _, now = call_clock
    waits = _trial_waits()
    trial_calls = pw.TRIAL_BLOCK * pw.TRIAL_BLOCKS
    with caplog.at_level("DEBUG", logger="agentix.runtime.client"):
        _lone_calls(waits, ns, pw.TRIAL_FIRST_AFTER + trial_calls, 64, 49)
        now[0] += pw.TRIAL_FIRST_EVERY_S
        _lone_calls(waits, ns, trial_calls, 64, 49)  # the same answer: nothing more said
        now[0] += 2 * pw.TRIAL_FIRST_EVERY_S
        _lone_calls(waits, ns, trial_calls, 40, 70)
    said = [r.getMessage() for r in caplog.records if "pinned waits" in r.getMessage()]
    assert said == ["pinned waits: a trial of the thread's lone calls keeps them unpinned "
                    "(median 64.0 us pinned, 49.0 us unpinned)",
                    "pinned waits: a trial of the thread's lone calls keeps them pinned "
                    "(median 40.0 us pinned, 70.0 us unpinned)"]


def test_pinned_stays_unless_unpinned_is_faster_by_the_margin(masks, call_clock):
    ns, _, _ = call_clock
    waits = _trial_waits()
    _lone_calls(waits, ns, pw.TRIAL_FIRST_AFTER + pw.TRIAL_BLOCK * pw.TRIAL_BLOCKS, 100, 100 * pw.TRIAL_MARGIN + 1)
    assert waits.trial.last is not None and waits.trial.pin
    assert _lone_calls(waits, ns, 10, 100, 90) == 10


def test_the_calls_right_after_a_switch_are_not_timed(masks, call_clock):
    ns, _, _ = call_clock
    waits = _trial_waits()
    calls = pw.TRIAL_FIRST_AFTER + pw.TRIAL_BLOCK * pw.TRIAL_BLOCKS
    _lone_calls(waits, ns, calls, 64, 49, after_switch_us=1000)
    assert waits.trial.last == (64.0, 49.0) and not waits.trial.pin


def test_calls_that_overlap_stream_or_converse_are_not_timed(masks, call_clock):
    ns, _, _ = call_clock
    waits = _trial_waits()
    _lone_calls(waits, ns, pw.TRIAL_FIRST_AFTER + 1, 64, 49)  # the trial's first call ends
    assert waits.trial.running
    timed = waits.trial._in_block  # the trial's calls so far in its block
    waits.hold()
    waits.hold()  # overlap: neither is a lone call
    ns[0] += 10**9
    waits.release()
    waits.release()
    waits.hold(pin=False)  # a stream alone
    waits.release()
    waits.hold()
    waits.converse()  # a call that converses over a namespace
    waits.release()
    assert waits.trial._in_block == timed
    # A trial's call that the daemon told off mid-way is not timed either.
    waits.hold()
    waits.follow(False)
    waits.release()
    assert waits.trial._in_block == timed
    waits.follow(True)
    _lone_calls(waits, ns, 1, 64, 49)
    assert waits.trial._in_block == timed + 1


def test_a_resting_thread_times_nothing(masks, call_clock):
    ns, _, now = call_clock
    waits = _trial_waits()
    waits.resting_until = now[0] + 5.0  # backing off: its calls cannot wait pinned
    assert _lone_calls(waits, ns, pw.TRIAL_FIRST_AFTER + 100, 64, 49) == 0
    assert not waits.trial.running and waits.trial._lone_calls == 0


def test_only_the_default_setting_runs_trials(monkeypatch):
    import threading

    monkeypatch.setattr(pw, "_threads", threading.local())

    async def connect():
        default = pw.pinned_waits(pw._DEFAULT)
        assert isinstance(default.trial, pw.PinTrial)
        trial = default.trial
        assert pw.pinned_waits(pw._DEFAULT).trial is trial  # kept across the thread's clients
        assert pw.pinned_waits(CallsCpu("wait", None)).trial is None  # a named wait pins
        assert isinstance(pw.pinned_waits(pw._DEFAULT).trial, pw.PinTrial)

    asyncio.run(connect())


def test_run_queue_wait_is_this_threads_and_never_goes_back():
    first = pw.run_queue_wait_ns()
    assert first >= 0
    for _ in range(50):
        os.sched_yield()
    assert pw.run_queue_wait_ns() >= first


def _schedstat_wait_ns() -> int:
    with open("/proc/thread-self/schedstat", "rb") as f:
        return int(f.read().split()[1])


def _reads_its_own() -> bool:
    """Whether run_queue_wait_ns reads the calling thread's wait: between two
    readings of its schedstat (a file it keeps open for another thread, or
    from before a fork, would give that thread's figure)."""
    before = _schedstat_wait_ns()
    read = pw.run_queue_wait_ns()
    return before <= read <= _schedstat_wait_ns()


# Run in an interpreter of its own (child_paths.run_in_fresh_interpreter says
# why; seen here under asan, whose allocator has such a lock).
_FORK_CHILD = """
import os, threading
from agentix.runtime.client import pinned_waits as pw
from test_pinned_waits import _reads_its_own

assert pw.run_queue_wait_ns() >= 0 and _reads_its_own()  # the main thread's file, kept
seen = []
thread = threading.Thread(target=lambda: seen.append(_reads_its_own()))
thread.start()
thread.join()
assert seen == [True], seen
pid = os.fork()
if pid == 0:  # the child: its thread is another one
    os._exit(0 if _reads_its_own() and _reads_its_own() else 1)
assert os.waitpid(pid, 0)[1] == 0, "the forked child read another thread's wait"
assert _reads_its_own()
print("done", flush=True)
"""


def test_run_queue_wait_reads_the_calling_threads_own_also_after_a_fork():
    assert run_in_fresh_interpreter(_FORK_CHILD, timeout=120).strip() == "done"


def test_another_thread_never_changes_the_mask(masks):
    waits = PinnedWaits(1, {0, 1})

    def other():
        waits.hold()
        waits.before_select(None)
        waits.after_select()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert masks == [] and waits.in_flight == 1


def test_one_pinned_waits_per_thread_counts_every_client_of_its_loop(monkeypatch):
    import threading

    monkeypatch.setattr(pw, "_threads", threading.local())
    assert pw.pinned_waits(CallsCpu("wait", None)) is None  # no running loop: nothing to pin

    async def connect():
        loop = asyncio.get_running_loop()
        assert pw.pinned_waits(CallsCpu("off", None)) is None
        assert pw.pinned_waits(CallsCpu("always", 0)) is None
        first = pw.pinned_waits(CallsCpu("wait", max(ALLOWED)))
        selector = loop._selector
        assert isinstance(selector, pw._PinningSelector)
        assert first is pw.pinned_waits(CallsCpu("wait", None))  # a second client of this thread
        assert loop._selector is selector  # wrapped once
        await asyncio.sleep(0.01)  # the loop blocks in the wrapped selector: nothing in flight
        return first

    first = asyncio.run(connect())
    assert (first.cpu, first.original) == (max(ALLOWED), ALLOWED)

    async def name(cpu):
        return pw.pinned_waits(CallsCpu("wait", cpu))

    assert asyncio.run(name(min(ALLOWED))) is first and first.cpu == min(ALLOWED)  # the latest named wins
    assert asyncio.run(name(None)).cpu == min(ALLOWED)  # plain wait keeps it
    assert asyncio.run(connect()) is first  # a new loop of the same thread: wrapped too
    other = []
    thread = threading.Thread(target=lambda: other.append(asyncio.run(connect())))
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


needs_two = pytest.mark.skipif(len(ALLOWED) < 2, reason="pinning is only visible with two CPUs allowed")


class _Watcher:
    """Another thread sampling the loop thread's mask every 2 ms."""

    def __init__(self):
        import threading

        self.tid = threading.get_native_id()
        self.seen: list[frozenset] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self):
        while not self._stop.is_set():
            self.seen.append(frozenset(os.sched_getaffinity(self.tid)))
            self._stop.wait(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@needs_two
@pytest.mark.asyncio
async def test_wait_pins_the_loop_thread_only_while_it_blocks_for_a_lone_call(framed, monkeypatch):
    cpu = max(ALLOWED)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait:auto")
    async with RuntimeClient(framed.url) as client:
        # The fake runs the call in this loop: code the loop runs is never pinned.
        assert await client.remote(os.sched_getaffinity, 0) == ALLOWED
        assert os.sched_getaffinity(0) == ALLOWED
        assert type(client._stream) is FrameCallsStream
        assert framed.frames.hellos[-1]["agentix-calls-cpu"] == str(cpu)
        assert framed.frames.hellos[-1]["agentix-payload-ring"] == "1"  # beside it, not instead
        # While a lone call waits the loop blocks on the CPU; a thread it starts meanwhile
        # (asyncio.to_thread's pool) runs anywhere.
        waiting = asyncio.create_task(client.remote(sandbox_functions.sleep_forever))
        with _Watcher() as watcher:
            await asyncio.sleep(0.1)
            started = await asyncio.to_thread(os.sched_getaffinity, 0)
        assert started == ALLOWED
        assert frozenset({cpu}) in watcher.seen and frozenset(ALLOWED) in watcher.seen
        assert os.sched_getaffinity(0) == ALLOWED
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # Overlapping calls wait unpinned.
        with _Watcher() as watcher:
            await asyncio.gather(*(client.remote(sandbox_functions.sleep_for, 0.1) for _ in range(2)))
        assert set(watcher.seen) == {frozenset(ALLOWED)}
        # A call that fails unpins too; the next lone call waits pinned again.
        with pytest.raises(Exception, match="boom"):
            await client.remote(sandbox_functions.fail, "boom")
        assert os.sched_getaffinity(0) == ALLOWED
        with _Watcher() as watcher:
            await client.remote(sandbox_functions.sleep_for, 0.1)
        assert frozenset({cpu}) in watcher.seen
        assert os.sched_getaffinity(0) == ALLOWED


@needs_two
@pytest.mark.asyncio
async def test_plain_wait_pins_to_the_cpu_the_thread_connected_on(framed, monkeypatch):
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait")
    async with RuntimeClient(framed.url) as client:
        with _Watcher() as watcher:
            await client.remote(sandbox_functions.sleep_for, 0.1)
        cpu = int(framed.frames.hellos[-1]["agentix-calls-cpu"])
        assert cpu in ALLOWED and frozenset({cpu}) in watcher.seen
        assert os.sched_getaffinity(0) == ALLOWED


@needs_two
@pytest.mark.asyncio
async def test_the_default_follows_each_answer_of_a_daemon_that_probes_again(framed, monkeypatch):
    # A --calls_cpu=probe daemon answers once its probe has chosen, and again
    # whenever a later probe changes its answer (agentix-calls-cpu-follow: 2).
    monkeypatch.delenv("AGENTIX_CALLS_CPU", raising=False)
    async with RuntimeClient(framed.url) as client:
        await client.remote(os.getpid)
        assert framed.frames.hellos[-1]["agentix-calls-cpu-follow"] == "2"
        cpu = int(framed.frames.hellos[-1]["agentix-calls-cpu"])
        loop = asyncio.get_running_loop()
        for told, pinned in (("off", False), ("wait", True), ("off", False), ("wait", True)):
            framed.frames.tell(told)
            await eventually(lambda: isinstance(loop._selector, pw._PinningSelector) == pinned)
            with _Watcher() as watcher:
                await client.remote(sandbox_functions.sleep_for, 0.1)
            assert (frozenset({cpu}) in watcher.seen) == pinned, (told, set(watcher.seen))
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
        assert await client.remote(os.sched_getaffinity, 0) == ALLOWED
        namespace_hellos = [h for h in framed.frames.hellos if h.get("agentix-stream") == "namespace"]
        assert namespace_hellos and all("agentix-calls-cpu" not in h for h in namespace_hellos)
        assert os.sched_getaffinity(0) == ALLOWED


@needs_two
@pytest.mark.asyncio
async def test_a_call_that_converses_over_a_namespace_waits_unpinned_from_then_on(framed, monkeypatch):
    # Sandbox code that makes namespace requests (or gets the host's) during a
    # call: this loop and the sandbox's hand work to each other, and pinned to
    # one CPU each would run after the other instead of beside it
    # (docs/DECISIONS.md, "stop-63: namespace traffic is not pinned").
    cpu = max(ALLOWED)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait:auto")
    ticks = asyncio.Event()

    class Plug(AsyncClientNamespace):
        def on_tick(self, data):
            ticks.set()

    client = RuntimeClient(framed.url, logs=False, traces=False)
    client.register_namespace(Plug("/plug"))
    async with client:
        await client.remote(os.getpid)
        assert type(client._namespace_streams["/plug"]) is FrameNamespaceStream
        waiting = asyncio.create_task(client.remote(sandbox_functions.sleep_for, 0.6))
        with _Watcher() as watcher:
            await asyncio.sleep(0.15)
        assert frozenset({cpu}) in watcher.seen  # a lone call: pinned waits
        framed.emit_namespace("/plug", pb.NamespaceEvent(event="tick", data=pack(1)))
        await asyncio.wait_for(ticks.wait(), 10)
        with _Watcher() as watcher:
            await waiting
        assert set(watcher.seen) == {frozenset(ALLOWED)}  # the rest of that call
        with _Watcher() as watcher:
            await client.remote(sandbox_functions.sleep_for, 0.15)
        assert frozenset({cpu}) in watcher.seen  # the next lone call: pinned again
        assert os.sched_getaffinity(0) == ALLOWED


@needs_slices
@pytest.mark.asyncio
async def test_a_loop_thread_with_pinned_waits_gets_the_slice_asked_for(framed, monkeypatch):
    async def connect_and_call():
        before = _slice_ns()
        async with RuntimeClient(framed.url) as client:
            assert await client.remote(os.getpid) == os.getpid()
            return before, _slice_ns()

    def client_thread():  # a new thread, its own loop: the slice stays with that thread
        return _in_a_thread(lambda: asyncio.run(connect_and_call()))

    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait")
    monkeypatch.setenv("AGENTIX_LOOP_SLICE_US", "2000")
    before, after = await asyncio.to_thread(client_thread)
    assert before != 2_000_000 and after == 2_000_000
    monkeypatch.setenv("AGENTIX_LOOP_SLICE_US", "off")
    before, after = await asyncio.to_thread(client_thread)
    assert after == before
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "off")  # no pinned waits: no slice either
    monkeypatch.setenv("AGENTIX_LOOP_SLICE_US", "2000")
    before, after = await asyncio.to_thread(client_thread)
    assert after == before
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait")
    monkeypatch.setenv("AGENTIX_LOOP_SLICE_US", "5ms")
    with pytest.raises(ValueError, match="AGENTIX_LOOP_SLICE_US"):
        await asyncio.to_thread(client_thread)


@pytest.mark.asyncio
async def test_a_client_with_pinned_waits_takes_its_yield_setting_at_connect(framed, monkeypatch):
    async def connect_and_call():
        async with RuntimeClient(framed.url) as client:
            assert await client.remote(os.getpid) == os.getpid()
            return pw._threads.waits.yields

    def client_thread():
        return _in_a_thread(lambda: asyncio.run(connect_and_call()))

    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait")
    monkeypatch.delenv("AGENTIX_WAIT_YIELD", raising=False)
    assert await asyncio.to_thread(client_thread) is True
    monkeypatch.setenv("AGENTIX_WAIT_YIELD", "off")
    assert await asyncio.to_thread(client_thread) is False
    monkeypatch.setenv("AGENTIX_WAIT_YIELD", "maybe")
    with pytest.raises(ValueError, match="AGENTIX_WAIT_YIELD"):
        await asyncio.to_thread(client_thread)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "off")  # no pinned waits: the setting is not read
    assert await asyncio.to_thread(lambda: _in_a_thread(lambda: asyncio.run(_call_only(framed)))) == os.getpid()


async def _call_only(framed):
    async with RuntimeClient(framed.url) as client:
        return await client.remote(os.getpid)
