"""agentix.sio's pinned reply waits (`_ReplyWaits`): in a worker whose bridge
names the daemon's call-path CPU (``wait_cpu()``), the event loop's selector
blocks pinned to it while a lone request awaits its reply, and the thread
gets its own mask back before any code runs; nothing is pinned otherwise."""

import asyncio

import pytest

import agentix.sio as sio
from agentix import Namespace, register_namespace
from agentix.runtime.client import pinned_waits as pw
from agentix.runtime.shared.codec import pack
from conftest import RecordingBridge

pytestmark = pytest.mark.asyncio


class PlacedBridge(RecordingBridge):
    """A worker's bridge: `cpu` is what its wait_cpu() says (-1: none)."""

    def __init__(self, cpu):
        super().__init__()
        self.cpu = cpu

    def wait_cpu(self):
        return self.cpu


@pytest.fixture
def masks(monkeypatch):
    """The masks set on this thread, in order, each with whether a pinned
    wait was under way then (none is really set); a fresh PinnedWaits."""
    calls = []
    monkeypatch.setattr(pw, "_threads", pw.threading.local())
    monkeypatch.setattr(pw.os, "sched_setaffinity", lambda pid, mask: calls.append((pid, set(mask))))
    return calls


def _install(bridge):
    sio._install(bridge)
    return register_namespace(Namespace("/p"))


@pytest.fixture(autouse=True)
def _uninstall():
    yield
    sio._install(None)
    sio._registry.clear()


async def _answered_later(ns, bridge, value, delay=0.05):
    """Requests "ask"; the reply comes `delay` s later, from a timer, while
    the loop blocks in its selector."""
    loop = asyncio.get_running_loop()
    loop.call_later(delay, lambda: sio._deliver(
        "/p", "ask:result", pack({"request_id": bridge.sent[-1][3], "value": value})))
    return await ns.request("ask", value, timeout=5)


async def test_a_lone_request_waits_pinned_and_its_caller_runs_unpinned(masks):
    bridge = PlacedBridge(1)
    ns = _install(bridge)
    original = pw.os.sched_getaffinity(0)
    assert await _answered_later(ns, bridge, "a") == "a"
    # Pinned while the selector blocked for the reply, the whole mask back
    # after it returned: before the reply's handler and the caller ran.
    assert masks[0] == (0, {1}) and masks[-1] == (0, original)
    assert masks[1::2] == [(0, original)] * (len(masks) // 2)
    waits = pw._threads.waits
    assert not waits.pinned and waits.in_flight == 0
    count = len(masks)
    await asyncio.sleep(0.05)  # no request in flight: the loop blocks unpinned
    assert len(masks) == count
    bridge.cpu = 0  # the daemon moved its call path: the next wait follows
    assert await _answered_later(ns, bridge, "b") == "b"
    assert masks[count] == (0, {0})


async def test_overlapping_requests_wait_unpinned(masks):
    bridge = PlacedBridge(1)
    ns = _install(bridge)
    loop = asyncio.get_running_loop()
    first = asyncio.ensure_future(ns.request("ask", 1, timeout=5))
    second = asyncio.ensure_future(ns.request("ask", 2, timeout=5))
    await asyncio.sleep(0.05)
    for _, _, payload, request_id, _ in bridge.sent:
        sio._deliver("/p", "ask:result", pack({"request_id": request_id, "value": payload["data"]}))
    assert await asyncio.gather(first, second) == [1, 2]
    assert masks == []
    assert loop is asyncio.get_running_loop()


@pytest.mark.parametrize("case", ["no daemon cpu", "older worker", "env off"])
async def test_nothing_is_pinned_without_a_placement_or_when_turned_off(masks, monkeypatch, case):
    if case == "no daemon cpu":  # the daemon's --calls_cpu=off, or another thread's loop
        bridge = PlacedBridge(-1)
    elif case == "older worker":  # a bridge without wait_cpu
        bridge = RecordingBridge()
    else:
        monkeypatch.setenv("AGENTIX_CALLS_CPU", "off")
        bridge = PlacedBridge(1)
    ns = _install(bridge)
    assert await _answered_later(ns, bridge, "x") == "x"
    assert masks == []


async def test_a_failed_send_releases_the_wait(masks):
    class Broken(PlacedBridge):
        def emit(self, *args):
            raise RuntimeError("channel gone")

    ns = _install(Broken(1))
    with pytest.raises(RuntimeError, match="channel gone"):
        await ns.request("ask", 1, timeout=5)
    assert pw._threads.waits.in_flight == 0 and masks == []
