"""Side-channel benchmark: logs, spans and plugin-namespace requests, ours vs. the baseline.

    bazel run //testing/bench:side_channels                  # one round, both stacks
    bazel run //testing/bench:side_channels -- --rounds 3    # alternating rounds, medians
    bazel run //testing/bench:side_channels -- --quick       # smoke-sized
    bazel run //testing/bench:side_channels -- --only ours   # or --only baseline

Each stack is measured in its own child process (the "host"), like remote_calls.py:

- ours:     agentix-sandboxd (+ agentix-worker, with the agentix package on its
            --python_path) on a Unix socket, `agentix.RuntimeClient` (logs and traces on).
- baseline: baseline/ (python-socketio server + Python worker), with the original's
            /log, /trace and plugin-namespace forwarding modelled (baseline/sio.py,
            baseline/host_sio.py, README.md).

Metrics (definitions in README.md): `log_records_per_s` (100,000 sandbox `logging`
records replayed into a host handler), `spans_per_s` (sandbox spans reaching a host
`agentix.trace` Processor's on_span_end; a 10,000-span burst, and beside it,
ours only, `spans_long_per_s` of a 50,000-span one), `ns_request_p50_us` (sandbox
`Namespace.request` answered by a host `request_handler`, timed in the sandbox).

The machine's floor, in the same run (floors.py, floor/): `floor` is
floor/unix_pingpong over a Unix socket -- `ns_request_p50_us` a ping-pong of one
namespace request's size (NamespaceEvent bytes, `_ns_request_bytes`), and
`log_records_per_s` / `spans_per_s` a one-way stream of records of the size ours
put on the wire in this run (`details.ours.logs.stream.bytes_per_item`), packed
into 64 KiB writes (the unbatched rate, one write per record, is in
`details.floor`); `floor_grpc` is the ping-pong on a raw gRPC C++ bidi stream (no
record stream: gRPC's own framing of a record stream is what ours measures);
`floor_relay` the Unix-socket ping-pong through a relaying third process (a
namespace request crosses the daemon from the worker to the host and back).
Unless --no-busy, ours is measured again with one busy core (the run's plan: full
unless --quick) and the floors with it: `busy`. CPU per item of the host, the daemon and the worker sits
beside each figure (`log_cpu_us_per_record`, `span_cpu_us_per_span`,
`ns_request_cpu_us_per_call`; the floors' the same keys).
Output: human-readable lines, then LAST one JSON object.
"""

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# As in remote_calls.py: import siblings from the runfiles tree, not the source tree.
sys.path[0] = os.path.dirname(os.path.abspath(__file__))

import floors  # noqa: E402
import procs  # noqa: E402
import stack_rounds  # noqa: E402
from remote_calls import (  # noqa: E402  (generic helpers, shared on purpose)
    _exit_with_parent, _wait_for_unix_socket)

HEADLINE_KEYS = ("log_records_per_s", "spans_per_s", "ns_request_p50_us")
SERVER_START_TIMEOUT_S = 30.0
FIRST_CALL_TIMEOUT_S = 60.0
STALL_S = 20.0  # a phase gives up when nothing arrived for this long
# The rates are throughputs: the first 1/THROUGHPUT_SKIP of the items (the call's
# dispatch, the first record's trip, the first coalescing delay: the pipeline
# filling) fall before the window; see _burst.
THROUGHPUT_SKIP = 10


class Plan:
    def __init__(self, logs, logs_warmup, spans, spans_warmup, requests, requests_warmup,
                 phase_timeout_s, spans_long=0):
        self.logs, self.logs_warmup = logs, logs_warmup
        self.spans, self.spans_warmup = spans, spans_warmup
        # A second, longer span burst (ours only; 0: none): see _measure.
        self.spans_long = spans_long
        self.requests, self.requests_warmup = requests, requests_warmup
        self.phase_timeout_s = phase_timeout_s


FULL = Plan(logs=100_000, logs_warmup=2_000, spans=10_000, spans_warmup=500,
            requests=2_000, requests_warmup=200, phase_timeout_s=480.0, spans_long=50_000)
QUICK = Plan(logs=3_000, logs_warmup=300, spans=500, spans_warmup=100,
             requests=200, requests_warmup=50, phase_timeout_s=60.0)


# --------------------------------------------------------------------------- host side


def _log_for(side: str):
    def log(message: str) -> None:
        print(f"[{side}] {message}", flush=True)
    return log


class _Arrivals:
    """Counts items arriving on any thread; signals the loop when `target` is reached."""

    def __init__(self, loop):
        self._loop = loop
        self._lock = threading.Lock()
        self.reset(0)

    def reset(self, target: int) -> None:
        with self._lock:
            self.count = 0
            self.target = target
            # The item that opens the throughput window (see _burst).
            self.mark = max(1, target // THROUGHPUT_SKIP)
            self.first_at = self.last_at = self.mark_at = None
            self.done = asyncio.Event()

    def hit(self) -> None:
        now = time.perf_counter()
        with self._lock:
            self.count += 1
            if self.first_at is None:
                self.first_at = now
            if self.count == self.mark:
                self.mark_at = now
            self.last_at = now
            if self.count == self.target:
                self._loop.call_soon_threadsafe(self.done.set)

    async def wait(self, timeout_s: float) -> bool:
        """True when the target arrived; False on a stall or the phase deadline."""
        deadline = time.monotonic() + timeout_s
        seen, seen_at = -1, time.monotonic()
        while time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self.done.wait(), 1.0)
                return True
            except asyncio.TimeoutError:
                pass
            if self.count != seen:
                seen, seen_at = self.count, time.monotonic()
            elif time.monotonic() - seen_at > STALL_S:
                return False
        return False


class _RecordCounter(logging.Handler):
    def __init__(self, arrivals: _Arrivals):
        super().__init__(logging.DEBUG)
        self._arrivals = arrivals

    def createLock(self):
        self.lock = None  # _Arrivals locks

    def emit(self, record):
        self._arrivals.hit()


class _Warnings(logging.Handler):
    """Keeps WARNING+ records from other loggers (e.g. "records dropped") to report."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        if len(self.messages) < 20:
            self.messages.append(f"{record.name}: {record.getMessage()}"[:300])


def _span_counter(arrivals: _Arrivals):
    from agentix import trace

    class SpanCounter(trace.Processor):
        def on_span_end(self, span):
            if span.name == "s":
                arrivals.hit()

    return SpanCounter()


class _Cpu:
    """CPU seconds used by the host, the server/daemon and the worker during a phase:
    where the time goes, independent of how busy the rest of the machine is."""

    def __init__(self, server_pid: int):
        self._server = server_pid

    def pids(self) -> dict:
        workers = procs.children(self._server)
        pids = {"host": os.getpid(), "server": self._server}
        if workers:
            pids["worker"] = workers[0]
        return pids

    def snapshot(self) -> dict:
        # schedstat (ns), not /proc/<pid>/stat's 10 ms ticks: the quick plan's
        # phases use a few tens of ms of CPU per process.
        return {name: floors.process_cpu_s(pid) for name, pid in self.pids().items()}

    @staticmethod
    def used(before: dict, after: dict) -> dict:
        return {name: round(after[name] - before[name], 4) for name in after
                if before.get(name) is not None and after[name] is not None}


async def _burst(remote, fn, n: int, arrivals: _Arrivals, timeout_s: float,
                 cpu: _Cpu | None = None) -> dict:
    """Runs `fn(n)` remotely. `per_s` is the throughput: items (k, n] over the time
    from the k-th to the n-th arrival, k = n / THROUGHPUT_SKIP, so the fixed cost of
    starting (call dispatch, first item's trip, first coalescing delay) does not
    count, which with few items (--quick) dominated the old figure; that one,
    n / (n-th arrival - call start), stays as `end_to_end_per_s`."""
    arrivals.reset(n)
    cpu_before = cpu.snapshot() if cpu else None
    start = time.perf_counter()
    try:
        await asyncio.wait_for(remote(fn, n), timeout_s)
        returned = time.perf_counter()
        complete = await arrivals.wait(max(timeout_s - (returned - start), 1.0))
    except asyncio.TimeoutError:  # the call itself did not finish in time
        returned = time.perf_counter()
        complete = False
    last = arrivals.last_at if arrivals.last_at is not None else returned
    first = arrivals.first_at if arrivals.first_at is not None else returned
    elapsed = last - start
    end_to_end = round(arrivals.count / elapsed, 1) if arrivals.count else 0.0
    mark_at = arrivals.mark_at
    per_s = end_to_end
    if complete and mark_at is not None and last > mark_at:
        per_s = round((arrivals.count - arrivals.mark) / (last - mark_at), 1)
    result = {"n": n, "received": arrivals.count, "complete": complete,
              "per_s": per_s, "end_to_end_per_s": end_to_end,
              "window_start_s": round((mark_at if mark_at is not None else returned) - start, 3),
              "call_returned_s": round(returned - start, 3),
              "first_arrival_s": round(first - start, 3),
              "last_arrival_s": round(elapsed, 3)}
    if cpu:
        used = _Cpu.used(cpu_before, cpu.snapshot())
        result["cpu_s"] = used
        result["cpu_us_per_item"] = {name: round(v * 1e6 / n, 1) for name, v in used.items()}
    return result


def _total(per_process: dict | None) -> float | None:
    """CPU per item of all processes (host + server + worker)."""
    return round(sum(per_process.values()), 2) if per_process else None


async def _measure(remote, impl: str, plan: Plan, log, cpu: _Cpu, batches=None) -> dict:
    import bench_targets
    import side_targets

    start = time.perf_counter()
    await asyncio.wait_for(remote(bench_targets.noop), FIRST_CALL_TIMEOUT_S)
    log(f"first call (may include worker start) took {(time.perf_counter() - start) * 1e3:.1f} ms")
    loop = asyncio.get_running_loop()
    results = {}

    # Logs: sandbox logging → host handler on the same logger name.
    arrivals = _Arrivals(loop)
    logger = logging.getLogger(side_targets.LOGGER)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(_RecordCounter(arrivals))
    warnings = _Warnings()
    logging.getLogger().addHandler(warnings)
    warm = await _burst(remote, side_targets.log_burst, plan.logs_warmup, arrivals,
                        plan.phase_timeout_s)
    log(f"logs warm-up: {warm['received']}/{warm['n']} records, {warm['per_s']:,.0f}/s")
    if batches is not None:
        batches.take("logs")  # forget the warm-up's responses
    logs = await _burst(remote, side_targets.log_burst, plan.logs, arrivals,
                        plan.phase_timeout_s, cpu)
    log(f"logs: {logs['received']:,}/{logs['n']:,} records in {logs['last_arrival_s']} s: "
        f"{logs['per_s']:,.0f}/s throughput, {logs['end_to_end_per_s']:,.0f}/s end to end "
        f"(call returned after {logs['call_returned_s']} s, first record at "
        f"{logs['first_arrival_s']} s)")
    log(f"logs: CPU µs per record: {logs.get('cpu_us_per_item')}")
    if batches is not None:
        logs["stream"] = batches.take("logs")
        log(f"logs: Logs stream responses: {logs['stream']}")
    if not logs["complete"]:
        log(f"!! only {logs['received']} of {logs['n']} records arrived")
    results["log_records_per_s"] = logs["per_s"] if logs["complete"] else None
    results["log_cpu_us_per_record"] = _total(logs.get("cpu_us_per_item"))
    results["logs"] = logs

    # Spans: sandbox agentix.trace spans → host Processor.on_span_end.
    from agentix import trace
    trace.add_processor(_span_counter(arrivals))
    warm = await _burst(remote, side_targets.span_burst, plan.spans_warmup, arrivals,
                        plan.phase_timeout_s)
    log(f"spans warm-up: {warm['received']}/{warm['n']} spans, {warm['per_s']:,.0f}/s")
    if batches is not None:
        batches.take("traces")
    spans = await _burst(remote, side_targets.span_burst, plan.spans, arrivals,
                         plan.phase_timeout_s, cpu)
    log(f"spans: {spans['received']:,}/{spans['n']:,} in {spans['last_arrival_s']} s: "
        f"{spans['per_s']:,.0f}/s throughput, {spans['end_to_end_per_s']:,.0f}/s end to end "
        f"(call returned after {spans['call_returned_s']} s, first span at "
        f"{spans['first_arrival_s']} s)")
    log(f"spans: CPU µs per span: {spans.get('cpu_us_per_item')}")
    if batches is not None:
        spans["stream"] = batches.take("traces")
        log(f"spans: Traces stream responses: {spans['stream']}")
    if not spans["complete"]:
        log(f"!! only {spans['received']} of {spans['n']} spans arrived")
    results["spans_per_s"] = spans["per_s"] if spans["complete"] else None
    results["span_cpu_us_per_span"] = _total(spans.get("cpu_us_per_item"))
    results["spans"] = spans
    if plan.spans_long and impl == "agentix":
        # The 10,000-span burst (the headline, comparable with every earlier
        # run) lasts ~70-80 ms, so start-up transients (the first coalescing
        # delays, thread wake-ups) weigh on it; a burst as long as the logs'
        # (~0.5 s) shows the steady rate. Ours only: the baseline's ~1,000
        # spans/s would make it a minute.
        spans_long = await _burst(remote, side_targets.span_burst, plan.spans_long, arrivals,
                                  plan.phase_timeout_s, cpu)
        log(f"spans (long burst): {spans_long['received']:,}/{spans_long['n']:,} in "
            f"{spans_long['last_arrival_s']} s: {spans_long['per_s']:,.0f}/s throughput, "
            f"{spans_long['end_to_end_per_s']:,.0f}/s end to end")
        log(f"spans (long burst): CPU µs per span: {spans_long.get('cpu_us_per_item')}")
        if batches is not None:
            spans_long["stream"] = batches.take("traces")
        if not spans_long["complete"]:
            log(f"!! only {spans_long['received']} of {spans_long['n']} spans arrived")
        results["spans_long_per_s"] = spans_long["per_s"] if spans_long["complete"] else None
        results["span_long_cpu_us_per_span"] = _total(spans_long.get("cpu_us_per_item"))
        results["spans_long"] = spans_long

    # Namespace requests: timed inside the sandbox, per request.
    resting = _host_pins_resting_s() if impl == "agentix" else None
    if resting is not None:
        results["ns_host_pins_resting_s"] = resting
        log(f"namespace requests start with the host's pinned waits resting for {resting:.2f} s")
    cpu_before = cpu.snapshot()
    try:
        latencies = await asyncio.wait_for(
            remote(side_targets.ns_roundtrips, impl, plan.requests, plan.requests_warmup),
            plan.phase_timeout_s)
    except asyncio.TimeoutError:
        log(f"!! namespace requests did not finish within {plan.phase_timeout_s:.0f} s")
        results["ns_request_p50_us"] = None
        results["warnings"] = warnings.messages
        return results
    ns_cpu = floors.CpuMeter.per_item(cpu_before, cpu.snapshot(),
                                      plan.requests + plan.requests_warmup)
    results["ns_request_cpu_us_per_call"] = ns_cpu["total"]
    results["ns_request_cpu_us"] = ns_cpu
    log(f"namespace requests: CPU µs per request (warm-up included): {ns_cpu}")
    ordered = sorted(latencies)
    results["ns_request_p50_us"] = round(statistics.median(ordered), 1)
    results["ns_request_p99_us"] = round(ordered[max(0, -(-99 * len(ordered) // 100) - 1)], 1)
    results["ns_request_mean_us"] = round(statistics.fmean(ordered), 1)
    results["ns_requests"] = len(ordered)
    log(f"namespace request round trip: p50 {results['ns_request_p50_us']:,.0f} µs, "
        f"p99 {results['ns_request_p99_us']:,.0f} µs over {len(ordered)} requests")
    # Diagnostics (not a headline figure): the two legs of a request, timestamped.
    legs = await asyncio.wait_for(
        remote(side_targets.ns_legs, impl, max(plan.requests // 4, 50)), plan.phase_timeout_s)
    results["ns_leg_up_p50_us"] = legs["up_p50_us"]
    results["ns_leg_down_p50_us"] = legs["down_p50_us"]
    log(f"namespace request legs (p50): sandbox→host handler {legs['up_p50_us']:,.0f} µs, "
        f"host handler→sandbox {legs['down_p50_us']:,.0f} µs")
    results["warnings"] = warnings.messages
    for message in warnings.messages:
        log(f"host saw warning: {message}")
    return results


class _Batches:
    """Diagnostics for ours: how many items each Logs / Traces response carried.

    Wraps `_decode` (a serialized response -> instance id, items) of the host
    package's stream classes in this (benchmark) process only, or `_items` (a
    parsed response -> items) of host packages before stop 23; every response
    passes through it once."""

    def __init__(self):
        from agentix.runtime.client.logs import LogsStream
        from agentix.runtime.client.traces import TracesStream

        self.sizes = {"logs": [], "traces": []}
        self.bytes = {"logs": 0, "traces": 0}
        for name, cls in (("logs", LogsStream), ("traces", TracesStream)):
            sizes = self.sizes[name]
            if hasattr(cls, "_decode"):
                def decode(stream, message, _original=cls._decode, _sizes=sizes, _name=name):
                    result = _original(stream, message)
                    _sizes.append(len(result[1]))
                    self.bytes[_name] += len(message)
                    return result

                cls._decode = decode
                continue

            def items(stream, response, _original=cls._items, _sizes=sizes, _name=name):
                result = _original(stream, response)
                _sizes.append(len(result))
                self.bytes[_name] += response.ByteSize()
                return result

            cls._items = items

    def take(self, name: str) -> dict:
        sizes, self.sizes[name][:] = list(self.sizes[name]), []
        total_bytes, self.bytes[name] = self.bytes[name], 0
        if not sizes:
            return {}
        return {"responses": len(sizes), "items_per_response_mean": round(statistics.fmean(sizes), 1),
                "items_per_response_max": max(sizes),
                # What one item costs on the wire (the floor streams records of this size).
                "bytes_per_item": round(total_bytes / max(sum(sizes), 1), 1)}


def _host_namespace(base):
    """The host half of the `/bench` namespace on `base` (ours or the baseline's)."""
    import side_targets

    if base is None:
        from agentix import AsyncClientNamespace as base, request_handler
    else:
        from baseline.host_sio import request_handler

    class BenchHost(base):
        @request_handler("echo")
        async def on_echo(self, body):
            if "sent" in body:  # ns_legs diagnostics only
                return {**body, "host_received": time.perf_counter()}
            return body

    return BenchHost(side_targets.NAMESPACE)


def _host_python_dir() -> str:
    """The directory holding the `agentix` package this host imports (in the runfiles)."""
    import agentix

    return os.path.dirname(os.path.dirname(os.path.abspath(agentix.__file__)))


def _run_baseline(args, plan, log, tmp) -> dict:
    from baseline.client import BaselineClient
    from baseline.host_sio import AsyncClientNamespace

    env = dict(os.environ)
    # The worker imports baseline/, side_targets and (for spans) agentix.trace.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(procs.bench_dir()), _host_python_dir(), env.get("PYTHONPATH", "")] if p)
    env["AGENTIX_LOG_DIR"] = tmp
    server = procs.start_process(
        [sys.executable, "-m", "baseline.server", "--bench-dir", procs.bench_dir()],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=procs.bench_dir())
    try:
        line = procs.read_line(server, SERVER_START_TIMEOUT_S)
        if not line or not line.startswith("LISTENING "):
            raise RuntimeError(f"baseline server did not start (got {line!r})")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        log(f"baseline server pid {server.pid} listening on {url}")

        async def session():
            client = BaselineClient(url, side_channels=True,
                                    namespaces=[_host_namespace(AsyncClientNamespace)])
            async with client:
                return await _measure(client.remote, "baseline", plan, log, _Cpu(server.pid))

        return asyncio.run(session())
    finally:
        procs.stop_process(server)


def _run_ours(args, plan, log, tmp) -> dict:
    sandboxd = args.sandboxd or procs.runfile("sandbox/agentix-sandboxd")
    worker = args.worker or procs.runfile("worker/agentix-worker")
    if not sandboxd or not worker:
        raise RuntimeError(
            f"agentix-sandboxd ({sandboxd}) / agentix-worker ({worker}) not found in the "
            f"runfiles under {procs.runfiles_root()} (build them, or pass --sandboxd and --worker)")
    from agentix import RuntimeClient

    sock = os.path.join(tmp, "sandboxd.sock")
    url = f"unix://{sock}"
    env = dict(os.environ, AGENTIX_LOG_DIR=tmp)
    # The worker needs the agentix package for agentix.trace / agentix.Namespace: the
    # host package's directory from the runfiles goes on its --python_path, after the
    # bench directory (same sources as a venv with the wheel installed).
    daemon_log_path = os.path.join(tmp, "sandboxd.log")
    daemon_log = open(daemon_log_path, "wb")
    # The daemon's output goes to a file (a log-buffer overflow warns every 1,000
    # records); its warnings are summarised in the result instead.
    daemon = procs.start_process(
        [sandboxd, "--listen", url, f"--worker={worker}",
         f"--python_path={procs.bench_dir()}:{_host_python_dir()}", "--log_level=warning",
         *args.daemon_arg],
        env=env, stdout=daemon_log, stderr=subprocess.STDOUT)
    results = None
    try:
        _wait_for_unix_socket(sock, daemon, SERVER_START_TIMEOUT_S)
        log(f"agentix-sandboxd pid {daemon.pid} listening on {url}")

        async def session():
            client = RuntimeClient(url)
            client.register_namespace(_host_namespace(None))
            async with client:
                return await _measure(client.remote, "agentix", plan, log, _Cpu(daemon.pid),
                                      _Batches())

        results = asyncio.run(session())
        return results
    finally:
        procs.stop_process(daemon)
        daemon_log.close()
        with open(daemon_log_path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        warnings = [l for l in lines if " W " in l or " E " in l]
        if warnings:
            log(f"agentix-sandboxd wrote {len(warnings)} warning/error lines; first: "
                f"{warnings[0][:200]!r}; last: {warnings[-1][:200]!r}")
        if results is not None:
            results["daemon_warning_lines"] = len(warnings)
            results["daemon_warnings_sample"] = [w[:200] for w in warnings[:2] + warnings[-1:]]


def _host_pins_resting_s():
    """How long this thread's pinned waits (AGENTIX_CALLS_CPU=wait) still rest after a
    back-off (0.0: not resting), None without any. Diagnostics: the namespace phase follows
    the span bursts, which can make the host's waits back off for a second, and its loop
    then waits unpinned (docs/PERFORMANCE.md, "stop-26: namespace request")."""
    try:
        from agentix.runtime.client import pinned_waits
    except ImportError:
        return None
    waits = getattr(pinned_waits._threads, "waits", None)
    if waits is None:
        return None
    return round(max(0.0, waits.resting_until - time.monotonic()), 2)


def run_side(args) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.parent_pid:
        _exit_with_parent(args.parent_pid)
    plan = QUICK if args.quick else FULL
    log = _log_for(args.side)
    runner = _run_baseline if args.side == "baseline" else _run_ours
    tmp = tempfile.mkdtemp(prefix="agx-side-", dir="/tmp")  # socket + durable logs
    try:
        results = runner(args, plan, log, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stack_rounds.print_result(results)
    return 0


# --------------------------------------------------------------------------- driver


TARGETS = (
    stack_rounds.Target("log_records_per_s_ours_over_baseline", "log_records_per_s", False, 10,
                        "log_records_per_s_at_least_10x_baseline"),
    stack_rounds.Target("spans_per_s_ours_over_baseline", "spans_per_s", False, 10,
                        "spans_per_s_at_least_10x_baseline"),
    stack_rounds.Target("ns_request_p50_baseline_over_ours", "ns_request_p50_us", True, 5,
                        "ns_request_p50_at_most_one_fifth_of_baseline"),
)


def _summarise(ours, base, args) -> dict:
    report = stack_rounds.headline(ours, base, HEADLINE_KEYS, TARGETS)
    plan = QUICK if args.quick else FULL
    report["details"] = {
        "ours": ours, "baseline": base, "mode": "quick" if args.quick else "full",
        "workload": {"log_records": plan.logs, "spans": plan.spans, "spans_long": plan.spans_long,
                     "ns_requests": plan.requests, "ns_requests_warmup": plan.requests_warmup},
        "definitions": {
            "log_records_per_s": "throughput: records (k, n] / (n-th record in the host handler - "
                                 "k-th), k = n/10 (end to end, n / (n-th - remote() start): "
                                 "details.<side>.logs.end_to_end_per_s)",
            "spans_per_s": "throughput: spans (k, n] / (n-th on_span_end in the host processor - "
                           "k-th), k = n/10 (end to end: details.<side>.spans.end_to_end_per_s), "
                           "of the burst of workload.spans spans",
            "spans_long_per_s": "the same of a second burst of workload.spans_long spans (ours only; "
                                "details.ours.spans_long), start-up transients weighing 5x less",
            "ns_request_p50_us": "median of per-request perf_counter round trips in the sandbox",
        },
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "machine": procs.machine(),
    }
    return report


# Figures of ours and of the floors, and whether lower is better.
FLOOR_RATIO_KEYS = {"ns_request_p50_us": True, "log_records_per_s": False, "spans_per_s": False}
CPU_KEYS = ("ns_request_cpu_us_per_call", "log_cpu_us_per_record", "span_cpu_us_per_span")
FLOOR_KEYS = tuple(FLOOR_RATIO_KEYS) + CPU_KEYS
# Records of the stream floor (whatever the plan: the floor needs a few ms to time),
# and the record sizes used when ours did not report its own.
FLOOR_STREAM_RECORDS = 200_000
DEFAULT_RECORD_BYTES = {"logs": 200, "spans": 150}


def _ns_request_bytes() -> int:
    """Bytes of one benchmark namespace request on the wire: the NamespaceEvent the
    sandbox sends ("echo", msgpack {request_id, data: {"i", "text"}}, request_id)."""
    from agentix.runtime.shared import codec
    from agentix.runtime.v1 import runtime_pb2 as pb

    request_id = "0" * 32
    data = codec.pack({"request_id": request_id, "data": {"i": 1000, "text": "ping"}})
    return pb.NamespaceEvent(event="echo", data=data, request_id=request_id).ByteSize()


def _record_bytes(ours: dict | None, phase: str) -> int:
    stream = ((ours or {}).get(phase) or {}).get("stream") or {}
    return int(round(stream.get("bytes_per_item") or DEFAULT_RECORD_BYTES[phase]))


def _floors(args, ours: dict | None, log) -> dict:
    """{"floor": ..., "floor_grpc": ..., "floor_relay": ...} with the keys of ours
    (FLOOR_KEYS; the relayed floor has the namespace request only: a request from the
    worker crosses the daemon to the host and back, the shape of the relayed ping-pong)."""
    quick = args.quick
    ns_bytes = _ns_request_bytes()
    small = [f"--small-bytes={ns_bytes}", "--big-mib=", "--concurrency="]
    raw = floors.run_floor("unix_pingpong", small, quick=quick, log=log)
    grpc = floors.run_floor("grpc_pingpong", small, quick=quick, log=log)
    relay = floors.run_floor("unix_pingpong", ["--relay", *small], quick=quick, log=log)
    floor = {"ns_request_p50_us": raw["noop_p50_us"],
             "ns_request_cpu_us_per_call": raw["noop_cpu_us_per_call"]}
    details = {"ns_request_bytes": ns_bytes, "ping_pong": raw}
    for phase, key, cpu_key in (("logs", "log_records_per_s", "log_cpu_us_per_record"),
                                ("spans", "spans_per_s", "span_cpu_us_per_span")):
        stream = floors.run_floor(
            "unix_pingpong", [f"--stream-records={FLOOR_STREAM_RECORDS}",
                              f"--record-bytes={_record_bytes(ours, phase)}"], quick=quick, log=log)
        floor[key] = stream["records_per_s"]
        floor[cpu_key] = stream["cpu_us_per_record"]
        details[phase] = stream
    floor["details"] = details
    return {"floor": floor,
            "floor_grpc": {"ns_request_p50_us": grpc["noop_p50_us"],
                           "ns_request_cpu_us_per_call": grpc["noop_cpu_us_per_call"],
                           "details": grpc},
            "floor_relay": {"ns_request_p50_us": relay["noop_p50_us"],
                            "ns_request_cpu_us_per_call": relay["noop_cpu_us_per_call"],
                            "details": relay}}


def _add_floors_and_busy(report: dict, args, env: dict, timeout_s: float, ours) -> list[str]:
    """`floor`, `floor_grpc`, `floor_relay`, `busy` and their ratios (floors.py)."""
    if args.only == "baseline":
        return []
    log = _log_for("floor")
    errors = []
    try:
        measured = _floors(args, ours, log)
    except procs.RUN_FAILURES as error:
        return [f"floor: {error}"]
    report.update(measured)
    report["ratios"].update(floors.floor_ratios(report, measured, FLOOR_RATIO_KEYS))
    if args.no_busy:
        return errors

    busy_floors = {}

    def busy_floor(name):
        def run():  # both floors in one go, under the busy core
            if not busy_floors:
                busy_floors.update(_floors(args, ours, _log_for("busy floor")))
            return busy_floors[name]
        return run

    # The run's own plan, not the quick one: the quick plan's 500-span burst arrives
    # in two or three responses, and a rate over their arrivals read 1.1-1.3 M spans/s.
    busy, busy_errors = floors.busy_child_pass(
        stack_rounds, __file__, args, env, timeout_s,
        {name: busy_floor(name) for name in ("floor", "floor_grpc", "floor_relay")}, FLOOR_KEYS,
        quick=False)
    report["busy"] = busy
    if busy:
        report["ratios"].update(floors.floor_ratios(
            busy, {name: busy.get(name) for name in floors.FLOOR_PROGRAMS}, FLOOR_RATIO_KEYS,
            prefix="busy_"))
    return errors + busy_errors


def run_driver(args) -> int:
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES)
    timeout_s = 150.0 if args.quick else 1200.0
    rounds = stack_rounds.Rounds(__file__, args, env, timeout_s)
    os.environ["GLIBC_TUNABLES"] = procs.MALLOC_TUNABLES  # reported in details
    report = _summarise(rounds.combined("ours"), rounds.combined("baseline"), args)
    report["details"].update(rounds.details(HEADLINE_KEYS))
    # The headline's spans_per_s is of the 10,000-span burst; the long one beside it.
    report["spans_per_s_burst"] = (QUICK if args.quick else FULL).spans
    report["spans_long_per_s"] = (rounds.combined("ours") or {}).get("spans_long_per_s")
    report["spans_long_per_s_burst"] = (QUICK if args.quick else FULL).spans_long
    report["span_long_cpu_us_per_span"] = (rounds.combined("ours") or {}).get("span_long_cpu_us_per_span")
    for key in CPU_KEYS:  # beside the figures
        report[key] = (rounds.combined("ours") or {}).get(key)
        if report["baseline"] is not None:
            report["baseline"][key] = (rounds.combined("baseline") or {}).get(key)
    errors = rounds.errors + _add_floors_and_busy(report, args, env, timeout_s,
                                                  rounds.combined("ours"))
    missing = [f"{side}: {key} not measured" for side, results in rounds.results.items()
               for r in results for key in HEADLINE_KEYS if r.get(key) is None]
    if errors or missing:
        report["errors"] = errors + sorted(set(missing))
    stack_rounds.print_table(report, HEADLINE_KEYS)
    for name in ("floor", "floor_grpc"):
        print(f"{name}: {({k: v for k, v in (report.get(name) or {}).items() if k != 'details'})}")
    busy = report.get("busy") or {}
    print(f"busy (spinner {busy.get('spinner')}): "
          f"{({k: busy.get(k) for k in FLOOR_KEYS})}", flush=True)
    print(json.dumps(report), flush=True)
    return 1 if errors or missing else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Side-channel benchmark (ours vs. baseline).")
    stack_rounds.add_arguments(parser, quick_help="small workloads (smoke run)")
    parser.add_argument("--no-busy", action="store_true",
                        help="skip the second pass of ours and the floors with one busy core")
    args = parser.parse_args(argv)
    if args.side:
        return run_side(args)
    return stack_rounds.run_interruptibly(run_driver, args)

if __name__ == "__main__":
    sys.exit(main())
