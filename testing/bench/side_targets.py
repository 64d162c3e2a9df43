"""Functions the side-channel benchmark runs inside the sandbox (both stacks).

Imported by this top-level name (`side_targets`) by the host and by both workers, like
`bench_targets`. The log and span producers are plain sync functions (both workers run
them on a pool thread, as most user code runs); the namespace round trips are a
coroutine (`Namespace.request` is async).

- `log_burst(n)`: n stdlib `logging` records (INFO, %-formatted) on logger `LOGGER`.
- `span_burst(n)`: one `agentix.trace` trace holding n sequential spans, each with one
  attribute. On the baseline worker `agentix.trace` is the same module (the host
  package's, put on its path), with the original's forwarding processor registered.
- `ns_roundtrips(impl, n, warmup)`: `warmup` untimed then n timed sequential
  `await ns.request("echo", body, timeout=30)` on namespace `/bench`; returns the n
  latencies in µs (perf_counter around each await). `impl` picks the sandbox API:
  "agentix" (ours: `agentix.Namespace`) or "baseline" (`baseline.sio.Namespace`, the model
  of the original's).
- `ns_stream(n, warmup)` (ours; tail_probe.py --ns): as `ns_roundtrips`, but returns
  each timed request's start and latency in ns (`perf_counter_ns`: CLOCK_MONOTONIC, the
  clock `perf record -k CLOCK_MONOTONIC` stamps its events with) as
  ``{"starts": [...], "lats": [...]}``.
- `ns_legs(impl, n)`: diagnostics, after the measured requests: n requests whose body
  carries the sandbox's send time; the host handler adds its own receive time
  (`time.perf_counter`, CLOCK_MONOTONIC: one clock for every process of the machine).
  Returns the median sandbox→host and host→sandbox legs in µs.
- `worker_split(n)` (ours only; side_cpu.py --split): where the worker's calling thread
  spends a record's and a span's CPU, stage by stage (thread CPU µs per item, best of
  3 loops of n): stdlib `logging` with no handler (and through the stdlib's own
  `Logger` methods where the worker has C ones), the log bridge's `handle` and the
  durable log's `handle` on records already made, the same through their general
  (Python) paths where the worker has a C path, and `agentix.trace` alone, with the
  forwarder, and with the forwarder's general path.
"""

import logging
import time

LOGGER = "bench.side"
NAMESPACE = "/bench"


def log_burst(n):
    log = logging.getLogger(LOGGER)
    for i in range(n):
        log.info("side-channel record %d", i)
    return n


def span_burst(n):
    from agentix import trace

    with trace.trace("bench"):
        for i in range(n):
            with trace.span("s", i=i):
                pass
    return n


def worker_split(n):
    root = logging.getLogger()
    handlers = {type(h).__name__: h for h in root.handlers}
    bridge, durable = handlers.get("_LogBridge"), handlers.get("_DurableHandler")
    log = logging.getLogger(LOGGER + ".split")
    log.propagate = False  # the records below go to no handler: logging alone

    def per_item(fn):
        best = None
        for _ in range(3):
            start = time.thread_time()
            fn()
            cost = (time.thread_time() - start) * 1e6 / n
            best = cost if best is None else min(best, cost)
        return round(best, 2)

    def stdlib():
        for i in range(n):
            log.info("side-channel record %d", i)

    made = [log.makeRecord(LOGGER, logging.INFO, __file__, 1, "side-channel record %d",
                           (i,), None) for i in range(n)]

    def through(method):
        def run():
            for record in made:
                method(record)
        return run

    def locked_emit(handler):
        def emit(record):
            with handler.lock:
                handler.emit(record)
        return emit

    out = {"stdlib_logging": per_item(stdlib)}
    try:  # a worker with logging.Logger's methods in C keeps the stdlib's
        from _agentix_driver import logs as driver_logs
        originals = dict(driver_logs._stdlib_methods)
    except (ImportError, AttributeError):
        originals = {}
    if originals:
        ours = {name: logging.Logger.__dict__[name] for name in originals}
        for name, method in originals.items():
            setattr(logging.Logger, name, method)
        try:
            out["stdlib_logging_general_path"] = per_item(stdlib)
        finally:
            for name, method in ours.items():
                setattr(logging.Logger, name, method)
    if bridge is not None:
        out["bridge"] = per_item(through(bridge.handle))
        if hasattr(bridge, "_send_record"):  # a worker with the C path
            out["bridge_general_path"] = per_item(through(bridge.emit))
    if durable is not None:
        out["durable"] = per_item(through(durable.handle))
        if getattr(durable, "_line_formatter", None) is not None:
            out["durable_general_path"] = per_item(through(locked_emit(durable)))

    from agentix import trace

    def spans():
        with trace.trace("split"):
            for i in range(n):
                with trace.span("s", i=i):
                    pass

    processors = trace.get_processors()
    forwarder = next((p for p in processors if type(p).__name__ == "_TraceForwarder"), None)
    try:
        trace.set_processors([trace.Processor()])
        out["span_trace_module"] = per_item(spans)
        if forwarder is not None:
            trace.set_processors([forwarder])
            out["span_forwarded"] = per_item(spans)
            fast = getattr(forwarder, "_send_span", None)
            if fast is not None:
                forwarder._send_span = lambda *args: False
                try:
                    out["span_forwarded_general_path"] = per_item(spans)
                finally:
                    forwarder._send_span = fast
    finally:
        trace.set_processors(processors)
    return out


_namespaces = {}


def _namespace(impl):
    ns = _namespaces.get(impl)
    if ns is None:
        if impl == "agentix":
            from agentix import Namespace, register_namespace
        else:
            from baseline.sio import Namespace, register_namespace

        class Bench(Namespace):
            namespace = NAMESPACE

        ns = _namespaces[impl] = register_namespace(Bench())
    return ns


async def ns_roundtrips(impl, n, warmup):
    ns = _namespace(impl)
    for i in range(warmup):
        await ns.request("echo", {"i": i, "text": "ping"}, timeout=30)
    latencies = []
    perf = time.perf_counter
    for i in range(n):
        start = perf()
        reply = await ns.request("echo", {"i": i, "text": "ping"}, timeout=30)
        latencies.append((perf() - start) * 1e6)
        if reply != {"i": i, "text": "ping"}:
            raise AssertionError(f"request {i}: unexpected reply {reply!r}")
    return latencies


async def ns_stream(n, warmup):
    ns = _namespace("agentix")
    for i in range(warmup):
        await ns.request("echo", {"i": i, "text": "ping"}, timeout=30)
    starts, lats = [0] * n, [0] * n
    clock = time.perf_counter_ns
    for i in range(n):
        start = clock()
        reply = await ns.request("echo", {"i": i, "text": "ping"}, timeout=30)
        starts[i], lats[i] = start, clock() - start
        if reply != {"i": i, "text": "ping"}:
            raise AssertionError(f"request {i}: unexpected reply {reply!r}")
    return {"starts": starts, "lats": lats}


async def ns_legs(impl, n):
    ns = _namespace(impl)
    perf = time.perf_counter
    up, down = [], []
    for i in range(n):
        sent = perf()
        reply = await ns.request("echo", {"i": i, "sent": sent}, timeout=30)
        back = perf()
        up.append((reply["host_received"] - sent) * 1e6)
        down.append((back - reply["host_received"]) * 1e6)
    up.sort()
    down.sort()
    return {"up_p50_us": round(up[len(up) // 2], 1), "down_p50_us": round(down[len(down) // 2], 1)}


def log_big(n, size):
    """n records of about `size` bytes each on logger `LOGGER` (lag_burst.py)."""
    log = logging.getLogger(LOGGER)
    pad = "x" * size
    for i in range(n):
        log.info("big %d %s", i, pad)
    return n
