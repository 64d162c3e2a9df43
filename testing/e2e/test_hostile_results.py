"""Results a hostile sandbox sends the host (issue 17, items 3 and 4): streams that
ask for work out of proportion to their bytes are refused with a typed error,
without stalling the event loop or growing the host's memory; a forged
allowlisted instance comes back as its constructor made it; results beyond
`max_result_bytes` are dropped with `ResultTooLarge`; large results are decoded
off the event loop. The client keeps serving after each.

The sandbox functions send exact bytes (`e2e_targets.return_raw_pickle`): code in
the sandbox shares the worker's interpreter and so controls what it sends.
"""

import asyncio
import pathlib
import struct
import threading
import time

import pytest

import e2e_targets as t
from agentix import RestrictedUnpickleError, ResultTooLarge, RuntimeClient
from agentix.runtime.client import client as client_module
from agentix.runtime.shared import safepickle

pytestmark = pytest.mark.asyncio

MiB = 1 << 20


def _status_kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def _reset_peak_rss():
    # Linux: writing 5 resets VmHWM to the current RSS.
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


class LoopWatch:
    """The longest the event loop went without running a 10 ms ticker."""

    def __init__(self):
        self.longest = 0.0
        self._task = None

    async def _tick(self):
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self):
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc_info):
        self._task.cancel()


HOSTILE = {
    # 9 bytes; the unpickler sized its memo table by the index (here 256 MiB).
    "memo_long_binput": b"\x80\x02Nr" + struct.pack("<I", 1 << 24) + b".",
    # 54 bytes; 18 s of the event loop's thread.
    "int_of_decimal": b"cbuiltins\nint\n(cdecimal\nDecimal\n(V1e1000000\ntRtR.",
    # 45 bytes; ~400 MiB of ints.
    "list_of_range": b"cbuiltins\nlist\n(cbuiltins\nrange\n(I10000000\ntRtR.",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_result_is_refused_without_stalling_or_memory(client, name):
    assert await client.remote(t.add, 1, 1) == 2  # connected, worker warm
    _reset_peak_rss()
    before = _status_kib("VmRSS")
    with LoopWatch() as watch:
        with pytest.raises(RestrictedUnpickleError):
            await client.remote(t.return_raw_pickle, HOSTILE[name])
    grown_mib = (_status_kib("VmHWM") - before) / 1024
    assert grown_mib < 100, f"{name}: peak RSS grew {grown_mib:.0f} MiB"
    assert watch.longest < 1.0, f"{name}: the event loop stalled {watch.longest:.2f} s"
    assert await client.remote(t.add, 1, 2) == 3


async def test_hostile_stream_item_is_refused_and_the_stream_ends(client):
    with pytest.raises(RestrictedUnpickleError):
        async for _item in client.remote_stream(t.stream_raw_pickles, [HOSTILE["int_of_decimal"]]):
            pass
    assert await client.remote(t.add, 1, 2) == 3


async def test_forged_path_reads_the_file_its_constructor_named(client, tmp_path):
    (tmp_path / "reports").mkdir()
    ok = tmp_path / "reports" / "ok.txt"
    ok.write_text("report")
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    forged = f"cpathlib\nPosixPath\n(V{ok}\ntR(N}}V_str\nV{secret}\nstb.".encode()
    path = await client.remote(t.return_raw_pickle, forged)
    assert isinstance(path, pathlib.PosixPath)
    assert path.name == "ok.txt" and path.is_relative_to(tmp_path / "reports")
    assert path.read_text() == "report"
    # A forged component is refused outright.
    with pytest.raises(RestrictedUnpickleError, match="_parts was set by the stream"):
        await client.remote(t.return_raw_pickle, b"cpathlib\nPosixPath\n(Vok\ntR(N}V_parts\n(lp0\nV/etc\nastb.")
    assert await client.remote(t.add, 1, 2) == 3


@pytest.mark.parametrize("size", [300 * 1024, 5 * MiB], ids=["one-message", "chunked"])
async def test_result_over_max_result_bytes_is_refused(daemon, size):
    async with RuntimeClient(daemon.url, max_result_bytes=256 * 1024) as client:
        _reset_peak_rss()
        before = _status_kib("VmRSS")
        with pytest.raises(ResultTooLarge, match="exceeds max_result_bytes=262144"):
            await client.remote(t.make_bytes, size)
        assert await client.remote(t.make_bytes, 200 * 1024) == b"x" * (200 * 1024)
        with pytest.raises(ResultTooLarge, match="stream item 0"):
            async for _item in client.remote_stream(t.numbered_blobs, 3, size if size < MiB else 300 * 1024):
                pass
        assert await client.remote(t.add, 1, 2) == 3
        # What arrived beyond the cap was dropped, not kept.
        assert (_status_kib("VmHWM") - before) / 1024 < 3 * size / MiB + 64


async def test_max_result_bytes_defaults_from_the_environment(daemon, monkeypatch):
    monkeypatch.setenv("AGENTIX_MAX_RESULT_BYTES", "1000")
    async with RuntimeClient(daemon.url) as client:
        assert client.max_result_bytes == 1000
        with pytest.raises(ResultTooLarge):
            await client.remote(t.make_bytes, 2000)
        assert await client.remote(t.add, 1, 2) == 3
    monkeypatch.delenv("AGENTIX_MAX_RESULT_BYTES")
    assert RuntimeClient(daemon.url).max_result_bytes == 1 << 30


async def test_large_results_decode_off_the_event_loop(client, monkeypatch):
    threads = []

    def recording(load):
        def decode(data, **kwargs):
            threads.append(threading.current_thread() is threading.main_thread())
            return load(data, **kwargs)

        return decode

    monkeypatch.setattr(client_module, "restricted_loads", recording(client_module.restricted_loads))
    monkeypatch.setattr(client_module, "restricted_loads_chunks", recording(client_module.restricted_loads_chunks))
    assert await client.remote(t.make_bytes, 1000) == b"x" * 1000
    assert await client.remote(t.make_bytes, 100 * 1024) == b"x" * (100 * 1024)
    assert await client.remote(t.make_bytes, 3 * MiB) == b"x" * (3 * MiB)
    # On the loop's (main) thread only for the small one.
    assert threads == [True, False, False]


async def test_small_result_waits_off_the_loop_for_a_concurrent_decode(client):
    # While another thread's decode holds the host classes (a large result of an
    # allow_type class), a small result of such a class is decoded on a worker
    # thread instead of blocking the event loop.
    safepickle.allow_type(t.Opaque)
    try:
        safepickle._class_lock.acquire()
        releaser = threading.Timer(0.5, safepickle._class_lock.release)
        releaser.start()
        with LoopWatch() as watch:
            assert await client.remote(t.return_opaque, 5) == t.Opaque(5)
        assert watch.longest < 0.4, f"the event loop stalled {watch.longest:.2f} s"
        releaser.join()
    finally:
        safepickle._allowed_types.pop((t.Opaque.__module__, t.Opaque.__qualname__), None)
    assert await client.remote(t.add, 1, 2) == 3
