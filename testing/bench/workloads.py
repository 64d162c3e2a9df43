"""The benchmark's workloads, written once against `remote(fn, *args)`.

Both stacks run exactly this code; only the `remote` coroutine differs. Definitions:

- noop latency: `remote(noop)` issued sequentially; each call timed with
  time.perf_counter() around the await. p50 = median; p99 = nearest-rank
  (the ceil(0.99 n)-th smallest sample). Reported in microseconds.
- calls/s at N callers: N tasks each loop `await remote(noop)`; after a warm-up
  period the completions inside a fixed measuring window are counted:
  calls/s = completions in window / window length.
- echo MB/s: `remote(echo, payload)` with `payload` random bytes of 1, 16 or 64 MiB;
  MB/s = 2 x payload bytes / round-trip seconds / 1e6 (the payload crosses the wire
  twice: argument and result; MB = 10^6 bytes). Median over the repetitions, after
  one warm-up call per size, which is reported on its own as `echo_first_ms_<size>`
  (the sandbox's first echo that large: fresh buffers on every side). Each result is
  checked equal to the payload (outside the timed region).
- CPU per call (when run_all gets a `cpu` meter, floors.CpuMeter): on-CPU time of
  each process of the stack (host, daemon/server, worker) over a phase divided by
  its calls: `noop_cpu_us_per_call` (the sequential noop phase, all processes),
  `echo_cpu_ms_<size>` per echo, and per process and phase in `cpu_per_call`
  (µs for noop and calls/s phases, ms for echoes).
"""

import asyncio
import math
import os
import statistics
import time
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class Plan:
    """How much of each workload to run."""
    noop_warmup: int
    noop_calls: int
    concurrency: tuple[int, ...]
    conc_warmup_s: float
    conc_measure_s: float
    # (key suffix, payload bytes, measured repetitions, warm-up calls)
    echo: tuple[tuple[str, int, int, int], ...]
    phase_timeout_s: float


FULL = Plan(noop_warmup=300, noop_calls=2000, concurrency=(1, 16, 64),
            conc_warmup_s=0.5, conc_measure_s=3.0,
            echo=(("1mib", 1 * MIB, 9, 1), ("16mib", 16 * MIB, 5, 1), ("64mib", 64 * MIB, 3, 1)),
            phase_timeout_s=180.0)
# The quick plan (smoke runs, and every busy-core pass) still takes 2,000
# sequential noops: a p99 of 200 is their 3rd slowest and resolves no tail
# finer than ~1.5 % of calls; the 1,800 more cost ~0.2 s. And five 16 MiB
# echoes after the warm-up, as FULL: a fresh sandbox's second to fourth are
# still growing its buffers (15-40 ms against 5-8 once warm, stop 65), so
# one timed echo read the busy pass's 16 MiB at 7-27 ms; ~40 ms more.
QUICK = Plan(noop_warmup=50, noop_calls=2000, concurrency=(1, 16, 64),
             conc_warmup_s=0.2, conc_measure_s=0.5,
             echo=(("1mib", 1 * MIB, 3, 1), ("16mib", 16 * MIB, 5, 1), ("64mib", 64 * MIB, 1, 0)),
             phase_timeout_s=120.0)


def percentile(sorted_samples: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted samples (q in (0, 1])."""
    rank = max(1, math.ceil(q * len(sorted_samples)))
    return sorted_samples[rank - 1]


async def noop_latency(remote, targets, plan: Plan, log, cpu=None) -> dict:
    for _ in range(plan.noop_warmup):
        await remote(targets.noop)
    cpu_before = cpu.snapshot() if cpu else None
    samples = []
    clock = time.perf_counter
    for _ in range(plan.noop_calls):
        start = clock()
        result = await remote(targets.noop)
        samples.append(clock() - start)
        if result is not None:
            raise AssertionError(f"noop returned {result!r}")
    cpu_used = cpu.per_item(cpu_before, cpu.snapshot(), len(samples)) if cpu else None
    samples.sort()
    out = {
        "noop_p50_us": round(percentile(samples, 0.50) * 1e6, 1),
        "noop_p99_us": round(percentile(samples, 0.99) * 1e6, 1),
        "noop_mean_us": round(statistics.fmean(samples) * 1e6, 1),
    }
    log(f"noop latency over {plan.noop_calls} sequential calls: p50 {out['noop_p50_us']} us, "
        f"p99 {out['noop_p99_us']} us, mean {out['noop_mean_us']} us")
    if cpu_used is not None:
        out["noop_cpu_us_per_call"] = cpu_used["total"]
        out["cpu_per_call"] = {"noop_us": cpu_used}
        log(f"noop CPU per call (us): {cpu_used}")
    return out


class Callers:
    """`count` asyncio tasks, each awaiting `remote(fn)` in a loop (the calls/s
    workload); `completed` counts the calls finished so far. An async context
    manager: the callers start on entry; on exit they stop after the call in
    flight (awaited, so it finishes cleanly), or are cancelled when leaving by
    an exception."""

    def __init__(self, remote, fn, count: int) -> None:
        self.completed = 0
        self._remote = remote
        self._fn = fn
        self._count = count
        self._stop = False
        self._tasks: list[asyncio.Task] = []

    async def _caller(self) -> None:
        remote, fn = self._remote, self._fn
        while not self._stop:
            await remote(fn)
            self.completed += 1

    async def __aenter__(self) -> "Callers":
        self._tasks = [asyncio.create_task(self._caller()) for _ in range(self._count)]
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self._stop = True
        try:
            if exc_type is None:
                await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()


async def calls_per_second(remote, targets, callers: int, plan: Plan, log,
                           cpu=None, cpu_out: dict | None = None) -> float:
    async with Callers(remote, targets.noop, callers) as load:
        await asyncio.sleep(plan.conc_warmup_s)
        c0, t0 = load.completed, time.perf_counter()
        cpu_before = cpu.snapshot() if cpu else None
        await asyncio.sleep(plan.conc_measure_s)
        c1, t1 = load.completed, time.perf_counter()
        if cpu and cpu_out is not None:
            cpu_out[f"c{callers}_us"] = cpu.per_item(cpu_before, cpu.snapshot(), c1 - c0)
    rate = (c1 - c0) / (t1 - t0)
    log(f"calls/s with {callers} concurrent callers over {t1 - t0:.2f} s: {rate:,.0f}")
    return round(rate, 1)


async def echo_throughput(remote, targets, key: str, size: int, reps: int, warmup: int,
                          log, cpu=None, cpu_out: dict | None = None) -> dict:
    payload = os.urandom(size)
    first_s = None
    for _ in range(warmup):
        start = time.perf_counter()
        await remote(targets.echo, payload)
        if first_s is None:
            first_s = time.perf_counter() - start
    times = []
    cpu_spent = {}
    for _ in range(reps):
        cpu_before = cpu.snapshot() if cpu else None
        start = time.perf_counter()
        result = await remote(targets.echo, payload)
        times.append(time.perf_counter() - start)
        if cpu:  # the timed region only, not the comparison below
            for name, ms in cpu.per_item(cpu_before, cpu.snapshot(), reps, 1e3).items():
                cpu_spent[name] = round(cpu_spent.get(name, 0) + ms, 2)
        if result != payload:
            raise AssertionError(f"echo of {size} bytes returned different bytes")
        del result
    seconds = statistics.median(times)
    mb_per_s = 2 * size / seconds / 1e6
    log(f"echo {size // MIB} MiB: median {seconds * 1e3:.1f} ms over {reps} runs "
        f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}) -> {mb_per_s:,.0f} MB/s")
    out = {f"mb_per_s_{key}": round(mb_per_s, 1), f"echo_ms_{key}": round(seconds * 1e3, 2)}
    if first_s is not None:  # the sandbox's first echo this large: its buffers' pages are fresh
        out[f"echo_first_ms_{key}"] = round(first_s * 1e3, 2)
        log(f"echo {size // MIB} MiB: the first (warm-up) took {first_s * 1e3:.1f} ms")
    if cpu and cpu_out is not None:
        cpu_out[f"echo_{key}_ms"] = cpu_spent
        out[f"echo_cpu_ms_{key}"] = cpu_spent.get("total")
    return out


async def run_all(remote, targets, plan: Plan, log, cpu=None) -> dict:
    """Runs every workload in order; each phase is bounded by plan.phase_timeout_s.
    With `cpu` (floors.CpuMeter of the stack's processes) each phase also reports
    its CPU per call."""

    def bounded(coro):
        return asyncio.wait_for(coro, plan.phase_timeout_s)

    results = {}
    results.update(await bounded(noop_latency(remote, targets, plan, log, cpu)))
    cpu_out = results.get("cpu_per_call")
    for callers in plan.concurrency:
        results[f"calls_per_s_c{callers}"] = await bounded(
            calls_per_second(remote, targets, callers, plan, log, cpu, cpu_out))
    for key, size, reps, warmup in plan.echo:
        results.update(await bounded(
            echo_throughput(remote, targets, key, size, reps, warmup, log, cpu, cpu_out)))
    return results
