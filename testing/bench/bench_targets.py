"""Functions the remote-call benchmark runs inside the sandbox.

Both stacks import this module in their worker by the same top-level name
(`bench_targets`): the agentix worker through `--python-path <this directory>`,
the baseline worker through `sys.path`. The host imports it by that name too,
so `fn.__module__` resolves to the same "bench_targets::<name>" reference on
both sides.

The targets are plain (sync) functions, as most user code is: both workers run
them on a thread pool, so the benchmark exercises the ordinary sync path.
"""

import os


def noop():
    """Does nothing; measures pure round-trip overhead."""
    return None


def alloc_ns(size, n):
    """ns per bytes object of `size` made and freed, over n (CPU time).
    Above 512 bytes CPython takes them from its raw allocator."""
    import time

    t0 = time.thread_time_ns()
    for _ in range(n):
        bytes(size)
    return (time.thread_time_ns() - t0) / n


def echo(data):
    """Returns its argument unchanged; measures payload transfer both ways."""
    return data


def glibc_tunables():
    """Reports the worker's GLIBC_TUNABLES, to confirm the malloc settings reached it."""
    return os.environ.get("GLIBC_TUNABLES")


def busy_loops(loops):
    """CPU-bound user code with the GIL held: `loops` empty Python loop turns (a fixed
    amount of work, ~25 ns a turn on a free CPU here), so a busy CPU shows as fewer
    calls per second."""
    for _ in range(loops):
        pass
    return loops


def busy_threads(threads, mib):
    """Starts `threads` threads that each hash `mib` MiB (a fixed amount of work
    without the GIL: hashlib releases it for large buffers), joins them and returns the
    call's wall time in ms: two threads take about as long as one on two free CPUs,
    twice as long on one (user code must not be pinned)."""
    import hashlib
    import threading
    import time

    block = bytes(1024 * 1024)

    def work():
        for _ in range(mib):
            hashlib.sha256(block).digest()

    start = time.perf_counter()
    started = [threading.Thread(target=work) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return (time.perf_counter() - start) * 1e3


# The worker's cycle collections while recording (tail_probe.py): (start ns,
# end ns, generation, collected) on the worker's CLOCK_MONOTONIC, which is the
# host's (no time namespace).
_gc_spans = []
_gc_start = [0]


def _on_gc(phase, info):
    import time
    now = time.perf_counter_ns()
    if phase == "start":
        _gc_start[0] = now
    else:
        _gc_spans.append((_gc_start[0], now, info["generation"], info["collected"]))


def gc_record_start():
    """Starts recording the worker's collections; returns gc.get_threshold()."""
    import gc
    del _gc_spans[:]
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)
    return list(gc.get_threshold())


def gc_record_stop():
    """Stops recording; returns the spans recorded."""
    import gc
    if _on_gc in gc.callbacks:
        gc.callbacks.remove(_on_gc)
    spans = list(_gc_spans)
    del _gc_spans[:]
    return spans
