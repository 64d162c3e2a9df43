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
- `ns_legs(impl, n)`: diagnostics, after the measured requests: n requests whose body
  carries the sandbox's send time; the host handler adds its own receive time
  (`time.perf_counter`, CLOCK_MONOTONIC: one clock for every process of the machine).
  Returns the median sandbox→host and host→sandbox legs in µs.
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
