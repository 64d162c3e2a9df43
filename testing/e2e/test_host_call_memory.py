"""The host keeps nothing alive per call, relayed and direct (issue 25's p99,
docs/PERFORMANCE.md "stop-40: the noop's slow 1 %"). A sequential noop's objects
die by reference counting, so CPython's cyclic collector — which counts container
allocations minus deallocations — does not run on the call path, and the host
touches no fresh memory a call. Counts, not times: past a warm-up longer than every
bounded per-client record (the stream's remembered acks), thousands more noops
leave the host's allocated blocks where they were and start no young collection.
"""

import gc
import sys

import pytest

import e2e_targets as t
from conftest import relayed_or_direct
from agentix import RuntimeClient
from agentix.runtime.client.stream import RECENT_ACKS

pytestmark = pytest.mark.asyncio

CALLS = 5000
# Objects the host may keep over the whole measured stretch (not per call): a
# per-call leak of one block in 20 calls exceeds it.
SLACK_BLOCKS = CALLS // 20


@pytest.fixture(params=["relayed", "direct"])
def daemon(request, start_daemon, monkeypatch):
    """Each test against the relayed path and against direct calls."""
    yield from relayed_or_direct(request.param, start_daemon, monkeypatch)


async def test_sequential_noops_keep_no_objects_and_start_no_collection(daemon):
    collections = []

    def on_gc(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    async with RuntimeClient(daemon.url) as client:
        for _ in range(RECENT_ACKS + 1000):
            assert await client.remote(t.noop) is None
        blocks = sys.getallocatedblocks()
        gc.callbacks.append(on_gc)
        try:
            for _ in range(CALLS):
                await client.remote(t.noop)
        finally:
            gc.callbacks.remove(on_gc)
        grown = sys.getallocatedblocks() - blocks
    assert grown < SLACK_BLOCKS, f"{grown} blocks kept over {CALLS} calls"
    # Young collections start every 700 net container allocations: a host
    # keeping one container in 10 calls would start 7 here.
    assert len(collections) <= 1, collections
