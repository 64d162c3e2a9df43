"""Provider service benchmark: agentix-providerd vs. the old in-process LocalProvider.

    bazel run //testing/bench:provider                  # full run (a few minutes)
    bazel run //testing/bench:provider -- --quick       # smoke-sized run
    bazel run //testing/bench:provider -- --rounds 3    # medians of 3 alternating rounds

It starts its own `agentix-providerd` (Unix socket, own state dir, token) and
talks to it with plain grpcio stubs of proto/agentix/provider/v1/provider.proto.
Sandboxes run a development bundle: its bootstrap.sh execs the Bazel-built
daemon from the runfiles (image "host": the host's root, read-only); the
remote target is `bench_targets.noop`.

What it measures (see README.md, "Provider service"):

  warm_acquire_*        CreateSandbox RPC -> response READY and armed, from a warm
                        pool (a hit: launch WARM), sequential and 16 concurrent;
                        claims come in batches no larger than the pool's ready
                        count, with a refill wait (not timed) between batches
  cold_create_*         CreateSandbox (no pool) -> READY; then the first completed
                        remote(noop) through the returned endpoint and token
  delete_*              DeleteSandbox(wait) RPC -> response TERMINATED
  watch_event_*         a watch stream's arrival time of READY / TERMINATED events
                        minus the record's ready_time / end_time (server clock; the
                        same machine)
  idle_sandboxes_per_gib N idle sandboxes (no call: the worker not spawned):
                        N / ((MemAvailable before - after) in GiB)
  baseline              the same keys for the old in-process LocalProvider
                        (create -> first call, delete, density)
  docker_* / podman_*   with --engines (default in a full run when the engines are
                        installed; --quick skips them unless asked): a dockerd and a
                        podman service started here as the e2e suite does (own roots,
                        a busybox-only image, the real bundler's bundle), one providerd
                        per engine (--docker-socket / --podman-socket):
                        <engine>_cold_create_p50_ms (CreateSandbox -> READY, no pool),
                        <engine>_warm_acquire_p50_ms (a claim from a warm pool), and
                        <engine>_run_true_p50_ms (a bare `<engine> run --rm --network
                        none IMAGE true` through the engine's CLI, same run).
                        Targets: warm <= 10 ms; cold <= bare run + 150 ms. In
                        details: <engine>_warm_acquire_quiet_p50_ms, the same
                        claim one at a time, 1 s after the pool is full, and
                        <engine>_warm_acquire_quiet_server_p50_ms, its part in
                        providerd (the record's create_time -> ready_time)
  warm_acquire_quiet_*  the local backend's quiet claim, as the engines' (details.ours)

The machine's floor, in the same run (floors.py, floor/; README.md, "The floor
in every benchmark"):

  floor                 warm_acquire_p50_ms / _p99_ms: a raw ping-pong of one
                        CreateSandbox response's size between two processes over a
                        Unix socket (floor/unix_pingpong); cold_create_to_first_call_
                        p50_ms: fork + exec + wait of /bin/true (floor/spawn_true),
                        the least any cold start costs
  floor_grpc            warm_acquire_p50_ms / _p99_ms: a raw unary gRPC C++ call of
                        that size over a Unix socket (floor/grpc_pingpong --unary):
                        what one CreateSandbox RPC costs before providerd does anything
  busy                  the headline figures again (3 cold runs, 16 warm claims, one
                        round of 16 at once, no density) with one busy core, and the
                        floors under it
  *_cpu_ms_per_call     CPU beside the latencies: per warm claim, the benchmark process
                        and providerd (schedstat, around each claim); per cold create ->
                        first call, those two plus the processes of the sandbox (its
                        cgroup's cgroup.procs, schedstat, right after the first call)

Output: human-readable lines, then, LAST, one JSON object. Bounded: every step
has a timeout; every sandbox and process is removed on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

# As in remote_calls.py: import the siblings from the runfiles tree, not the source tree.
sys.path[0] = os.path.dirname(os.path.abspath(__file__))

import floors  # noqa: E402
import procs  # noqa: E402

TARGETS = {"warm_acquire_p50_ms": 5.0, "warm_acquire_p99_ms": 25.0,
           "cold_create_to_first_call_p50_ms": 150.0, "delete_p50_ms": 50.0,
           "k8s_api_writes_per_warm_claim": 2.0}
CREATE_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 60.0
DELETE_TIMEOUT_S = 30.0
REFILL_TIMEOUT_S = 120.0
RUN_DEADLINE_S = {"full": 1500.0, "quick": 400.0}


def log(message: str) -> None:
    print(f"[provider] {message}", flush=True)


def _pct(values, q):
    """Nearest-rank percentile (q in 0..100); None for no values."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    rank = max(1, -(-q * len(values) // 100))
    return round(values[int(rank) - 1], 2)


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def _machine() -> dict:
    return {**procs.machine(), "mem_total_gib": round(_meminfo("MemTotal") / 2**30, 1)}


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _repo_root() -> Path:
    return Path(os.path.abspath(__file__)).parents[2]


def _find(relpath: str) -> Path | None:
    found = procs.runfile(relpath)
    if found:
        return found
    candidate = _repo_root() / "bazel-bin" / relpath
    return candidate if candidate.exists() else None


def _pss_bytes(pids) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def _density(n: int, before: int, after: int, pss: int, processes: int) -> dict:
    """Idle sandboxes per GiB from MemAvailable before/after (the headline), and
    from the sandboxes' own PSS. MemAvailable is machine-wide: when it fell by
    less than the sandboxes' own PSS (other processes freed memory meanwhile)
    the headline falls back to the PSS figure and says so (density_method)."""
    used = before - after
    r = {"idle_pss_mib_per_sandbox": round(pss / n / 2**20, 2),
         "idle_sandboxes_per_gib_pss": round(n / (pss / 2**30), 1) if pss > 0 else None,
         "idle_processes_per_sandbox": round(processes / n, 2), "density_n": n,
         "memavailable_delta_mib": round(used / 2**20, 1)}
    if used >= pss:
        r["idle_sandboxes_per_gib"] = round(n / (used / 2**30), 1)
        r["idle_mib_per_sandbox"] = round(used / n / 2**20, 2)
        r["density_method"] = "MemAvailable"
    else:  # less than the sandboxes' own pages: others freed memory meanwhile
        r["idle_sandboxes_per_gib"] = r["idle_sandboxes_per_gib_pss"]
        r["idle_mib_per_sandbox"] = r["idle_pss_mib_per_sandbox"]
        r["density_method"] = "PSS (MemAvailable fell less than the sandboxes' PSS: other processes freed memory)"
    return r


def _fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


# --------------------------------------------------------------------------- ours


class Ours:
    """One providerd and a grpc.aio channel to it."""

    def __init__(self, harness, pd, bundle: Path, mark: str):
        import grpc

        self.h = harness
        self.pb, self.pb_grpc = harness.stubs()
        self.pd = pd
        self.bundle = bundle
        self.mark = mark
        self.channel = grpc.aio.insecure_channel(pd.target)
        self.stub = self.pb_grpc.ProviderServiceStub(self.channel)
        self.md = pd.metadata

    def spec(self, **fields):
        pb = self.pb
        return pb.SandboxSpec(image="host", bundle=pb.BundleRef(path=str(self.bundle)),
                              ttl=self.h.duration(900), **fields)

    async def create(self, spec, **fields):
        request = self.pb.CreateSandboxRequest(request_id=str(uuid.uuid4()), spec=spec, **fields)
        return await self.stub.CreateSandbox(request, metadata=self.md, timeout=CREATE_TIMEOUT_S)

    async def delete(self, sandbox_id, wait=True):
        request = self.pb.DeleteSandboxRequest(id=sandbox_id, request_id=str(uuid.uuid4()), wait=wait)
        return await self.stub.DeleteSandbox(request, metadata=self.md, timeout=DELETE_TIMEOUT_S)

    async def pool_status(self, name):
        pool = await self.stub.GetWarmPool(self.pb.GetWarmPoolRequest(name=name), metadata=self.md, timeout=10)
        return pool.status

    async def wait_ready(self, name, n):
        deadline = time.monotonic() + REFILL_TIMEOUT_S
        while time.monotonic() < deadline:
            status = await self.pool_status(name)
            if status.ready >= n:
                return status
            await asyncio.sleep(0.02)
        raise TimeoutError(f"pool {name} did not reach {n} ready members in {REFILL_TIMEOUT_S} s")

    async def delete_all(self):
        pb = self.pb
        try:
            pools = await self.stub.ListWarmPools(pb.ListWarmPoolsRequest(), metadata=self.md, timeout=10)
            for pool in pools.pools:
                await self.stub.DeleteWarmPool(pb.DeleteWarmPoolRequest(name=pool.name, allow_missing=True),
                                               metadata=self.md, timeout=60)
        except Exception as error:  # cleanup goes on
            log(f"cleanup: pools: {error}")
        token = ""
        live, names = [], set()
        for _ in range(1000):
            page = await self.stub.ListSandboxes(pb.ListSandboxesRequest(page_token=token, page_size=1000,
                                                                         include_terminated=True),
                                                 metadata=self.md, timeout=10)
            live += [s.id for s in page.sandboxes if s.status.phase != pb.SandboxStatus.TERMINATED]
            names |= {s.id for s in page.sandboxes} | {s.uid for s in page.sandboxes}
            names |= {s.status.backend_ref.split(":")[0] for s in page.sandboxes if s.status.backend_ref}
            token = page.next_page_token
            if not token:
                break
        held = self.pd.state_dir / "sb"  # the local backend's sandbox dirs, pool members' too
        if held.is_dir():
            names |= set(os.listdir(held))
        semaphore = asyncio.Semaphore(16)

        async def one(i):
            async with semaphore:
                try:
                    await self.delete(i)
                except Exception:
                    pass

        await asyncio.gather(*(one(i) for i in live))
        return names

    async def close(self):
        await self.channel.close()


async def _first_call(target: str, token: str) -> float:
    """Seconds for a fresh client's first completed remote(noop)."""
    from agentix import RuntimeClient
    import bench_targets

    start = time.perf_counter()
    async with RuntimeClient(target, token=token) as client:
        await asyncio.wait_for(client.remote(bench_targets.noop), CALL_TIMEOUT_S)
        return time.perf_counter() - start


class WatchTimer:
    """A watch stream that notes, per event, arrival minus the record's own
    transition time (ready_time for READY, end_time for TERMINATED)."""

    def __init__(self, ours: Ours):
        self.ours = ours
        self.latencies_ms: list[float] = []
        self.task = None

    async def start(self):
        pb = self.ours.pb
        first = await self.ours.stub.ListSandboxes(pb.ListSandboxesRequest(page_size=1), metadata=self.ours.md,
                                                   timeout=10)
        request = pb.WatchSandboxesRequest(resource_version=first.resource_version, epoch=first.epoch)
        call = self.ours.stub.WatchSandboxes(request, metadata=self.ours.md)
        seen = set()

        async def run():
            async for event in call:
                arrived = time.time()
                status = event.sandbox.status
                key = (event.sandbox.id, status.phase)
                if key in seen:
                    continue
                if status.phase == pb.SandboxStatus.READY and status.ready_time.seconds:
                    stamp = self.ours.h.ts_seconds(status.ready_time)
                elif status.phase == pb.SandboxStatus.TERMINATED and status.end_time.seconds:
                    stamp = self.ours.h.ts_seconds(status.end_time)
                else:
                    continue
                seen.add(key)
                self.latencies_ms.append((arrived - stamp) * 1000)

        self.task = asyncio.create_task(run())
        self.call = call

    async def stop(self):
        self.call.cancel()
        if self.task:
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass


async def measure_ours(args, harness, pd, bundle: Path, mark: str) -> dict:
    ours = Ours(harness, pd, bundle, mark)
    r: dict = {}
    watch = WatchTimer(ours)
    try:
        await watch.start()
        # 1. cold: create -> READY -> first call; delete.
        cold_create, cold_first, cold_total, deletes = [], [], [], []
        cpu = _ProviderCpu(pd.pid)
        cold_cpu = {}
        for i in range(args.cold_runs + 1):
            cpu_before = cpu.snapshot()
            t0 = time.perf_counter()
            response = await ours.create(ours.spec())
            t1 = time.perf_counter()
            first = await _first_call(response.sandbox.status.endpoint.target, response.credentials.access_token)
            t2 = t1 + first
            if i:  # create -> first call: this process, providerd, the sandbox's cgroup
                used = floors.CpuMeter.per_item(cpu_before, cpu.snapshot(), args.cold_runs, 1e3)
                used.pop("total")
                used["sandbox"] = round((_cgroup_cpu_s(harness, response.sandbox) or 0) * 1e3
                                        / args.cold_runs, 3)
                for name, ms in used.items():
                    cold_cpu[name] = round(cold_cpu.get(name, 0) + ms, 3)
            t3 = time.perf_counter()
            deleted = await ours.delete(response.sandbox.id)
            t4 = time.perf_counter()
            if deleted.sandbox.status.phase != ours.pb.SandboxStatus.TERMINATED:
                raise RuntimeError(f"delete answered {deleted.sandbox.status}")
            if i == 0:
                log(f"[ours] warm-up cold run (not counted): {(t2 - t0) * 1000:.0f} ms to the first call")
                continue
            cold_create.append((t1 - t0) * 1000)
            cold_first.append(first * 1000)
            cold_total.append((t2 - t0) * 1000)
            deletes.append((t4 - t3) * 1000)
        cold_cpu["total"] = round(sum(cold_cpu.values()), 3)
        r["cold_cpu_ms_per_call"] = cold_cpu
        r["cold_create_to_first_call_cpu_ms_per_call"] = cold_cpu["total"]
        r["cold_create_p50_ms"] = _median(cold_create)
        r["cold_create_p99_ms"] = _pct(cold_create, 99)
        r["cold_create_to_first_call_p50_ms"] = _median(cold_total)
        r["cold_create_to_first_call_p99_ms"] = _pct(cold_total, 99)
        r["first_call_after_cold_p50_ms"] = _median(cold_first)
        r["delete_p50_ms"] = _median(deletes)
        r["delete_p99_ms"] = _pct(deletes, 99)
        log(f"[ours] cold: create {r['cold_create_p50_ms']} ms + first call {r['first_call_after_cold_p50_ms']} "
            f"ms = {r['cold_create_to_first_call_p50_ms']} ms (p50, {args.cold_runs} runs); delete "
            f"{r['delete_p50_ms']} ms")

        # 2. warm: a pool, sequential claims in batches, then 16 at once.
        pb = ours.pb
        batch = 8
        await ours.stub.CreateWarmPool(pb.CreateWarmPoolRequest(pool=pb.WarmPool(
            name="bench", template=ours.spec(), min_ready=16, max_total=48)), metadata=ours.md, timeout=10)
        await ours.wait_ready("bench", 16)
        warm, misses, warm_first = [], 0, []
        claim_cpu = {}  # sequential claims: CPU summed over the timed RPCs

        async def claim(timings, cpu_sum=None):
            nonlocal misses
            spec = ours.spec(warm_pool="bench")
            spec.env["BENCH_CLAIM"] = "1"
            before = cpu.snapshot() if cpu_sum is not None else None
            t0 = time.perf_counter()
            response = await ours.create(spec)
            elapsed = (time.perf_counter() - t0) * 1000
            if response.sandbox.status.launch == pb.SandboxStatus.WARM:
                timings.append(elapsed)
                if cpu_sum is not None:
                    for name, ms in floors.CpuMeter.per_item(
                            before, cpu.snapshot(), 1, 1e3).items():
                        cpu_sum[name] = cpu_sum.get(name, 0) + ms
            else:
                misses += 1
            r["create_response_bytes"] = response.ByteSize()  # the floors' message size
            return response

        while len(warm) < args.warm:
            claimed = []
            for _ in range(min(batch, args.warm - len(warm))):
                claimed.append(await claim(warm, claim_cpu))
            if len(warm_first) < 5:  # a warm sandbox's first call (spawns its worker)
                warm_first.append(await _first_call(claimed[0].sandbox.status.endpoint.target,
                                                    claimed[0].credentials.access_token) * 1000)
            await asyncio.gather(*(ours.delete(c.sandbox.id) for c in claimed))
            await ours.wait_ready("bench", 16)
        r["warm_acquire_p50_ms"] = _median(warm)
        r["warm_acquire_p99_ms"] = _pct(warm, 99)
        r["warm_acquire_mean_ms"] = round(statistics.fmean(warm), 2) if warm else None
        r["warm_first_call_p50_ms"] = _median(warm_first)
        r["warm_cpu_ms_per_call"] = {name: round(ms / max(len(warm), 1), 3)
                                     for name, ms in claim_cpu.items()}
        r["warm_acquire_cpu_ms_per_call"] = r["warm_cpu_ms_per_call"].get("total")
        log(f"[ours] warm acquire, sequential: p50 {r['warm_acquire_p50_ms']} ms, p99 "
            f"{r['warm_acquire_p99_ms']} ms ({len(warm)} hits, {misses} misses); first call on a claimed "
            f"sandbox {r['warm_first_call_p50_ms']} ms")
        c16 = []
        for _ in range(args.c16_rounds):
            claimed = await asyncio.gather(*(claim(c16) for _ in range(16)))
            await asyncio.gather(*(ours.delete(c.sandbox.id) for c in claimed))
            await ours.wait_ready("bench", 16)
        # One claim at a time once the pool is full and has settled (as the
        # engines' quiet claim): what a user's first claim after a pause costs.
        quiet, quiet_server = [], []
        for _ in range(args.quiet_claims):
            await ours.wait_ready("bench", 16)
            await asyncio.sleep(ENGINE_QUIET_SETTLE_S)
            response = await claim(quiet)
            if response.sandbox.status.launch == pb.SandboxStatus.WARM:
                status = response.sandbox.status
                quiet_server.append((harness.ts_seconds(status.ready_time)
                                     - harness.ts_seconds(status.create_time)) * 1000)
            await ours.delete(response.sandbox.id)
        r["warm_acquire_quiet_p50_ms"] = _median(quiet)
        r["warm_acquire_quiet_server_p50_ms"] = _median(quiet_server)
        log(f"[ours] warm acquire, one at a time after {ENGINE_QUIET_SETTLE_S} s quiet: p50 "
            f"{r['warm_acquire_quiet_p50_ms']} ms (in providerd {r['warm_acquire_quiet_server_p50_ms']} ms)")
        r["warm_acquire_c16_p50_ms"] = _median(c16)
        r["warm_acquire_c16_p99_ms"] = _pct(c16, 99)
        r["warm_misses"] = misses
        log(f"[ours] warm acquire, 16 concurrent: p50 {r['warm_acquire_c16_p50_ms']} ms, p99 "
            f"{r['warm_acquire_c16_p99_ms']} ms ({len(c16)} hits)")
        await ours.stub.DeleteWarmPool(pb.DeleteWarmPoolRequest(name="bench"), metadata=ours.md, timeout=60)

        # 3. watch latency (from every cold and warm sandbox above).
        r["watch_event_p50_ms"] = _median(watch.latencies_ms)
        r["watch_event_p99_ms"] = _pct(watch.latencies_ms, 99)
        r["watch_events"] = len(watch.latencies_ms)
        log(f"[ours] watch event latency: p50 {r['watch_event_p50_ms']} ms, p99 {r['watch_event_p99_ms']} ms "
            f"({len(watch.latencies_ms)} events)")

        # 4. density: N idle sandboxes, no call (not in the busy pass: --density 0).
        if args.density:
            r.update(await density_ours(args, ours, harness))
    finally:
        await watch.stop()
        try:
            r["_sandbox_names"] = sorted(await asyncio.wait_for(ours.delete_all(), 300))
        finally:
            await ours.close()
    return r


class _ProviderCpu:
    """CPU of this process and providerd (schedstat)."""

    def __init__(self, providerd_pid: int):
        self.pid = providerd_pid

    def snapshot(self) -> dict:
        return {"host": floors.process_cpu_s(os.getpid()), "providerd": floors.process_cpu_s(self.pid)}


def _cgroup_cpu_s(harness, sandbox) -> float | None:
    """CPU seconds the live processes of a sandbox have used since they started:
    the processes listed by its cgroup (found by its id or uid; this VM has cgroup
    v1 without a per-sandbox cpuacct group), each on-CPU time from schedstat.
    A process of the sandbox that already exited is not counted."""
    for directory in sorted(harness.cgroup_dirs([sandbox.id, sandbox.uid]), key=len):
        try:
            with open(os.path.join(directory, "cgroup.procs")) as f:
                pids = [int(line) for line in f if line.strip()]
        except (OSError, ValueError):
            continue
        if pids:
            return sum(floors.process_cpu_s(pid) or 0 for pid in pids)
    return None


async def _settle_memory():
    await asyncio.sleep(2.0)


async def density_ours(args, ours: Ours, harness) -> dict:
    n = args.density
    await _settle_memory()
    fds_before = _fd_count(ours.pd.pid)
    before = _meminfo("MemAvailable")
    semaphore = asyncio.Semaphore(8)
    made = []

    async def one():
        async with semaphore:
            made.append(await ours.create(ours.spec()))

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - t0
    await _settle_memory()
    after = _meminfo("MemAvailable")
    pids = harness.processes_with([ours.mark.encode(), str(ours.bundle).encode()])
    pss = _pss_bytes(pids)
    fds_after = _fd_count(ours.pd.pid)
    r = _density(n, before, after, pss, len(pids))
    r["providerd_fds_per_sandbox"] = round((fds_after - fds_before) / n, 2)
    r["density_create_s"] = round(elapsed, 1)
    log(f"[ours] density at N={n}: MemAvailable fell {r['memavailable_delta_mib']} MiB; {r['idle_mib_per_sandbox']} MiB each "
        f"-> {r['idle_sandboxes_per_gib']} per GiB by {r['density_method']} (PSS {r['idle_pss_mib_per_sandbox']} MiB each, "
        f"{r['idle_processes_per_sandbox']} processes each, providerd +{r['providerd_fds_per_sandbox']} fds each)")
    semaphore = asyncio.Semaphore(16)

    async def gone(response):
        async with semaphore:
            await ours.delete(response.sandbox.id)

    await asyncio.gather(*(gone(m) for m in made))
    return r


# --------------------------------------------------------------------------- baseline


def _inprocess_provider_class():
    try:
        from agentix.provider._local_inprocess import InProcessLocalProvider, LocalProviderConfig

        return InProcessLocalProvider, LocalProviderConfig, "agentix.provider._local_inprocess.InProcessLocalProvider"
    except ImportError:  # before LocalProvider became providerd's client
        from agentix.provider.local import LocalProvider, LocalProviderConfig

        return LocalProvider, LocalProviderConfig, "agentix.provider.local.LocalProvider"


async def measure_baseline(args, harness, bundle: Path, mark: str, work: Path) -> dict:
    from agentix.provider import SandboxConfig
    import bench_targets

    provider_cls, config_cls, name = _inprocess_provider_class()
    provider = provider_cls(config_cls(runtime_dir=str(work / "b-run"), cache_dir=str(work / "b-cache"),
                                       ready_timeout=CREATE_TIMEOUT_S,
                                       extra_bwrap_args=harness.sandbox_binds()))
    config = SandboxConfig(image="host", bundle=str(bundle))
    r: dict = {"implementation": name}
    try:
        create, total, deletes = [], [], []
        for i in range(args.cold_runs + 1):
            t0 = time.perf_counter()
            sandbox = await asyncio.wait_for(provider.create(config), CREATE_TIMEOUT_S)
            t1 = time.perf_counter()
            await asyncio.wait_for(sandbox.remote(bench_targets.noop), CALL_TIMEOUT_S)
            t2 = time.perf_counter()
            await asyncio.wait_for(sandbox.aclose(), DELETE_TIMEOUT_S)
            t3 = time.perf_counter()
            await asyncio.wait_for(provider.delete(sandbox.sandbox_id), DELETE_TIMEOUT_S)
            t4 = time.perf_counter()
            if i == 0:
                log(f"[baseline] warm-up run (not counted): {(t2 - t0) * 1000:.0f} ms to the first call")
                continue
            create.append((t1 - t0) * 1000)
            total.append((t2 - t0) * 1000)
            deletes.append((t4 - t3) * 1000)
        r["cold_create_p50_ms"] = _median(create)
        r["cold_create_p99_ms"] = _pct(create, 99)
        r["cold_create_to_first_call_p50_ms"] = _median(total)
        r["cold_create_to_first_call_p99_ms"] = _pct(total, 99)
        r["delete_p50_ms"] = _median(deletes)
        r["delete_p99_ms"] = _pct(deletes, 99)
        log(f"[baseline] cold: create {r['cold_create_p50_ms']} ms, create -> first call "
            f"{r['cold_create_to_first_call_p50_ms']} ms (p50, {args.cold_runs} runs); delete {r['delete_p50_ms']} ms")
        # The in-process path has no pools and no watch.
        r["warm_acquire_p50_ms"] = r["warm_acquire_p99_ms"] = r["warm_acquire_c16_p50_ms"] = None
        r["watch_event_p50_ms"] = None
        if args.baseline_density:
            await _settle_memory()
            n = args.density
            before = _meminfo("MemAvailable")
            semaphore = asyncio.Semaphore(8)
            made = []

            async def one():
                async with semaphore:
                    made.append(await asyncio.wait_for(provider.create(config), CREATE_TIMEOUT_S))

            await asyncio.gather(*(one() for _ in range(n)))
            await _settle_memory()
            after = _meminfo("MemAvailable")
            pids = harness.processes_with([mark.encode(), str(bundle).encode()])
            r.update(_density(n, before, after, _pss_bytes(pids), len(pids)))
            log(f"[baseline] density at N={n}: {r['idle_mib_per_sandbox']} MiB each -> "
                f"{r['idle_sandboxes_per_gib']} per GiB ({r['density_method']}; PSS {r['idle_pss_mib_per_sandbox']} "
                f"MiB each, {r['idle_processes_per_sandbox']} processes each)")
            for sandbox in made:
                await asyncio.wait_for(provider.delete(sandbox.sandbox_id), DELETE_TIMEOUT_S)
        else:
            r["idle_sandboxes_per_gib"] = None
    finally:
        await asyncio.shield(provider.aclose())
    return r


# --------------------------------------------------------------------------- driver

HEADLINE = ("warm_acquire_p50_ms", "warm_acquire_p99_ms", "warm_acquire_c16_p50_ms",
            "cold_create_to_first_call_p50_ms", "delete_p50_ms", "watch_event_p50_ms", "idle_sandboxes_per_gib")


# The Kubernetes backend's warm claims (issue 20): providerd's controller and the
# kubernetes backend against testing/k8s/fake_apiserver.py with 2 ms injected per
# request; arming goes to a fake agent (the fake Pods run no daemon).
K8S_KEYS = ("k8s_api_writes_per_warm_claim", "k8s_claim_p50_ms")


async def measure_k8s(args) -> dict:
    tool = _find("providers/backends/kubernetes/k8s_claim_bench")
    script = procs.runfile("testing/k8s/fake_apiserver.py") or _repo_root() / "testing/k8s/fake_apiserver.py"
    if tool is None:
        raise RuntimeError("k8s_claim_bench is not built (bazel build //testing/bench:provider)")
    proc = await asyncio.create_subprocess_exec(
        str(tool), f"--fake_apiserver={script}", f"--claims={args.k8s_claims}", "--latency_ms=2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"k8s_claim_bench failed ({proc.returncode}): {err.decode()[-500:]}")
    measured = json.loads(lines[-1])
    log(f"kubernetes: {measured['k8s_claims']} warm claims, p50 {measured['k8s_claim_p50_ms']:.2f} ms, "
        f"{measured['k8s_api_writes_per_warm_claim']} API writes per claim (2 ms injected per request)")
    return measured


def _merge_rounds(rounds: list[dict]) -> dict:
    """Each number is the median of its rounds; text is the first round's."""
    if len(rounds) == 1:
        return rounds[0]
    merged = {}
    for key in rounds[0]:
        values = [r.get(key) for r in rounds]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            merged[key] = _median(values)
        else:
            merged[key] = values[0]
    merged["per_round"] = rounds
    return merged


ENGINE_KEYS = tuple(f"{engine}_{key}" for key in ("warm_acquire_p50_ms", "cold_create_p50_ms", "run_true_p50_ms")
                    for engine in ("docker", "podman"))
ENGINE_WARM_TARGET_MS = 10.0
# details.<engine>.<engine>_warm_acquire_quiet_p50_ms: claims made one at a
# time once the pool is full and has settled this long.
ENGINE_QUIET_CLAIMS = 10
ENGINE_QUIET_SETTLE_S = 1.0
ENGINE_COLD_OVER_BARE_MS = 150.0


def _engines_wanted(args) -> list[str]:
    """The engines to measure: --engines / --no-engines, else all installed in
    a full run and none with --quick."""
    if args.engines is False or (args.engines is None and args.quick and args.only != "engines"):
        return []
    installed = [kind for kind, binary in (("docker", "dockerd"), ("podman", "podman")) if shutil.which(binary)]
    if args.engine:
        installed = [kind for kind in installed if kind in args.engine]
    if args.only in ("ours", "baseline") and not args.engines:
        return []
    if args.engines and len(installed) < 2:
        log(f"--engines: only {installed or 'none'} of dockerd/podman installed (run tools/setup)")
    return installed


def _build_bundle(tools: dict, out: Path) -> Path:
    """The real bundler's bundle of testing/fixtures/bundle_project (the
    container runs its Python, not the image's)."""
    import subprocess

    # The source tree's (it has a ../bundle_helper path dependency): the
    # workspace under `bazel run`, else this file's checkout.
    root = Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY") or _repo_root())
    project = root / "testing" / "fixtures" / "bundle_project"
    done = subprocess.run([str(tools["bundler"]), "build", str(project), "--output", str(out)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"bundler failed: {done.stderr[-2000:]}")
    return out


async def measure_engine(args, harness, kind: str, tools: dict, bundle: Path, work: Path) -> dict:
    """docker_* / podman_* keys (see the module docstring): a fresh engine and
    providerd, stopped and removed at the end whatever happens."""
    import subprocess

    import engines

    r: dict = {}
    tar = await asyncio.to_thread(engines._busybox_tar, Path(tempfile.mkdtemp(prefix="img-", dir=work)))
    engine = await asyncio.to_thread(engines.start, kind, tar)
    pd_dir = Path(tempfile.mkdtemp(prefix="pe-", dir="/tmp"))
    pd = harness.Providerd(pd_dir, binary=tools["providerd"], extra_args=[f"--{kind}-socket", str(engine.socket)])
    ours = None
    try:
        await asyncio.to_thread(pd.start)
        ours = Ours(harness, pd, bundle, "")
        pb = ours.pb

        def spec(**fields):
            return pb.SandboxSpec(image=engines.IMAGE, backend=kind, bundle=pb.BundleRef(path=str(bundle)),
                                  ttl=harness.duration(900), **fields)

        # Bare runs first (the engine's own floor, same machine, same moment).
        bare = []
        for i in range(args.engine_runs + 1):
            t0 = time.perf_counter()
            await asyncio.to_thread(subprocess.run, [*engine.cli, "run", "--rm", "--network", "none",
                                                     engines.IMAGE, "true"],
                                    env=engine.env, capture_output=True, timeout=120, check=True)
            if i:
                bare.append((time.perf_counter() - t0) * 1000)
        cold = []
        for i in range(args.engine_runs + 1):
            t0 = time.perf_counter()
            response = await ours.create(spec())
            if i:
                cold.append((time.perf_counter() - t0) * 1000)
            await ours.delete(response.sandbox.id)
        await ours.stub.CreateWarmPool(pb.CreateWarmPoolRequest(pool=pb.WarmPool(
            name="engine", template=spec(), min_ready=4, max_total=8)), metadata=ours.md, timeout=10)
        await ours.wait_ready("engine", 4)
        warm, misses = [], 0
        while len(warm) < args.engine_warm:
            claimed = []
            for _ in range(min(4, args.engine_warm - len(warm))):
                claim = spec(warm_pool="engine")
                claim.env["BENCH_CLAIM"] = "1"
                t0 = time.perf_counter()
                response = await ours.create(claim)
                elapsed = (time.perf_counter() - t0) * 1000
                if response.sandbox.status.launch == pb.SandboxStatus.WARM:
                    warm.append(elapsed)
                else:
                    misses += 1
                claimed.append(response)
            await asyncio.gather(*(ours.delete(c.sandbox.id) for c in claimed))
            await ours.wait_ready("engine", 4)
        # The same claim with nothing else in flight (pool full, its members'
        # workers booted): what the engine path itself costs, without the
        # refills' container creates competing for the cores.
        quiet, quiet_server = [], []
        for _ in range(args.quiet_claims):
            await ours.wait_ready("engine", 4)
            await asyncio.sleep(ENGINE_QUIET_SETTLE_S)
            claim = spec(warm_pool="engine")
            claim.env["BENCH_CLAIM"] = "1"
            t0 = time.perf_counter()
            response = await ours.create(claim)
            if response.sandbox.status.launch == pb.SandboxStatus.WARM:
                quiet.append((time.perf_counter() - t0) * 1000)
                status = response.sandbox.status
                quiet_server.append((harness.ts_seconds(status.ready_time)
                                     - harness.ts_seconds(status.create_time)) * 1000)
            await ours.delete(response.sandbox.id)
        await ours.stub.DeleteWarmPool(pb.DeleteWarmPoolRequest(name="engine"), metadata=ours.md, timeout=120)
        r[f"{kind}_warm_acquire_quiet_p50_ms"] = _median(quiet)
        # Of it, providerd's own part: the record's create_time -> ready_time.
        r[f"{kind}_warm_acquire_quiet_server_p50_ms"] = _median(quiet_server)
        r[f"{kind}_run_true_p50_ms"] = _median(bare)
        r[f"{kind}_cold_create_p50_ms"] = _median(cold)
        r[f"{kind}_cold_create_p99_ms"] = _pct(cold, 99)
        r[f"{kind}_warm_acquire_p50_ms"] = _median(warm)
        r[f"{kind}_warm_acquire_p99_ms"] = _pct(warm, 99)
        r[f"{kind}_warm_misses"] = misses
        log(f"[{kind}] bare run --rm true {r[f'{kind}_run_true_p50_ms']} ms; cold create -> READY "
            f"{r[f'{kind}_cold_create_p50_ms']} ms; warm acquire p50 {r[f'{kind}_warm_acquire_p50_ms']} ms, "
            f"p99 {r[f'{kind}_warm_acquire_p99_ms']} ms ({len(warm)} hits, {misses} misses); quiet claim p50 "
            f"{r[f'{kind}_warm_acquire_quiet_p50_ms']} ms (in providerd "
            f"{r[f'{kind}_warm_acquire_quiet_server_p50_ms']} ms)")
    finally:
        if ours is not None:
            try:
                await asyncio.wait_for(ours.delete_all(), 180)
            except Exception as error:
                log(f"[{kind}] cleanup: {error}")
            await ours.close()
        pd.stop()
        left = await asyncio.to_thread(engines.cleanup, engine)
        engines._unmount_all_under(pd_dir)
        shutil.rmtree(pd_dir, ignore_errors=True)
        r[f"{kind}_leftovers"] = len(left)
        if left:
            log(f"[{kind}] containers left behind: {[c.get('Names') for c in left]}")
    return r


async def _ours_round(args, harness, tools: dict, bundle: Path, mark: str, label: str) -> dict:
    """One providerd, measure_ours, then the check that nothing of it is left."""
    pd_dir = Path(tempfile.mkdtemp(prefix="pb-", dir="/tmp"))  # short: see Providerd.state_dir
    pd = harness.Providerd(pd_dir, binary=tools["providerd"])
    await asyncio.to_thread(pd.start)
    log(f"{label}: agentix-providerd pid {pd.pid} on {pd.target}")
    try:
        measured = await measure_ours(args, harness, pd, bundle, mark)
    finally:
        pd.stop()
    # Nothing of any sandbox made in the round may be left: cgroups named by
    # their ids (pool members' included) or processes of the bundle.
    names = measured.pop("_sandbox_names", [])
    await asyncio.to_thread(harness.wait_until, lambda: not harness.cgroup_dirs(names), 5.0)
    leftover = harness.cgroup_dirs(names) + [
        f"pid {pid}: {cmd}" for pid, cmd in harness.processes_with([mark.encode()]).items()]
    measured["sandboxes_made"] = len([n for n in names if n.startswith(("sbx-", "wp-"))])
    measured["leftovers"] = len(leftover)
    # providerd's warnings and errors (a cgroup it could not remove says why here).
    complaints = [line for line in pd.log().splitlines()
                  if " agentix-providerd W " in line or " agentix-providerd E " in line]
    measured["providerd_warnings"] = len(complaints)
    for line in complaints[:5]:
        log(f"{label}: providerd said: {line}")
    log(f"{label}: {measured['sandboxes_made']} sandboxes and pool members made; "
        f"left behind after providerd stopped: {leftover or 'nothing'}")
    shutil.rmtree(pd_dir, ignore_errors=True)
    return measured


# The floors (module docstring): figures of ours they stand for, lower is better.
FLOOR_RATIO_KEYS = {"warm_acquire_p50_ms": True, "warm_acquire_p99_ms": True,
                    "cold_create_to_first_call_p50_ms": True}
CPU_KEYS = ("warm_acquire_cpu_ms_per_call", "cold_create_to_first_call_cpu_ms_per_call")
BUSY_KEYS = HEADLINE[:-1] + CPU_KEYS  # no density in the busy pass


def _floors(args, message_bytes: int) -> dict:
    """{"floor": ..., "floor_grpc": ...} in ours' keys (ms), each program's own line
    in its `details`."""
    flags = [f"--small-bytes={message_bytes}", "--big-mib=", "--concurrency="]
    raw = floors.run_floor("unix_pingpong", flags, quick=args.quick, log=log)
    grpc = floors.run_floor("grpc_pingpong", flags + ["--unary"], quick=args.quick, log=log)
    spawn = floors.run_floor("spawn_true", [], quick=args.quick, log=log)
    ms = lambda us: round(us / 1e3, 4)  # noqa: E731
    return {
        "floor": {"warm_acquire_p50_ms": ms(raw["noop_p50_us"]),
                  "warm_acquire_p99_ms": ms(raw["noop_p99_us"]),
                  "warm_acquire_cpu_ms_per_call": ms(raw["noop_cpu_us_per_call"]),
                  "cold_create_to_first_call_p50_ms": spawn["spawn_p50_ms"],
                  "cold_create_to_first_call_cpu_ms_per_call": spawn["spawn_cpu_ms"],
                  "details": {"ping_pong": raw, "spawn_true": spawn}},
        "floor_grpc": {"warm_acquire_p50_ms": ms(grpc["unary_p50_us"]),
                       "warm_acquire_p99_ms": ms(grpc["unary_p99_us"]),
                       "warm_acquire_cpu_ms_per_call": ms(grpc["unary_cpu_us_per_call"]),
                       "details": grpc},
    }


async def _busy_pass(args, harness, tools: dict, bundle: Path, mark: str, size: int) -> dict:
    """Ours again (a short round: 3 cold runs, 16 warm claims, one round of 16 at
    once, no density) and the floors, with one busy core (floors.BusyCore)."""
    busy_args = copy.copy(args)
    busy_args.cold_runs, busy_args.warm, busy_args.c16_rounds, busy_args.density = 3, 16, 1, 0
    start = time.monotonic()
    with floors.BusyCore() as spinner:
        measured = await _ours_round(busy_args, harness, tools, bundle, mark, "busy")
        busy_floors = await asyncio.to_thread(_floors, args, size)
    busy = {key: measured.get(key) for key in BUSY_KEYS}
    busy.update(busy_floors)
    busy["spinner"] = spinner.report()
    busy["pass_s"] = round(time.monotonic() - start, 1)
    busy["details"] = measured
    log(f"busy: warm p50 {busy['warm_acquire_p50_ms']} ms (floor {busy['floor']['warm_acquire_p50_ms']}, "
        f"floor_grpc {busy['floor_grpc']['warm_acquire_p50_ms']}), cold -> first call "
        f"{busy['cold_create_to_first_call_p50_ms']} ms; spinner {busy['spinner']}")
    return busy


async def run_all(args, tools: dict, work: Path, report: dict) -> None:
    import providerd_harness as harness

    mark = f"bench-{uuid.uuid4().hex[:10]}"
    bundle = harness.write_dev_bundle(work / "bundle", sandboxd=tools["sandboxd"], worker=tools["worker"],
                                      python_path=str(procs.bench_dir()), mark=mark,
                                      prestart_worker=args.prestart_worker)
    ours_rounds, baseline_rounds = [], []
    for round_index in range(args.rounds):
        order = ("ours", "baseline") if round_index % 2 == 0 else ("baseline", "ours")
        for side in order:
            if side == "ours" and args.only in (None, "ours"):
                ours_rounds.append(await _ours_round(args, harness, tools, bundle, mark,
                                                     f"round {round_index + 1}"))
            elif side == "baseline" and args.only in (None, "baseline"):
                baseline_rounds.append(await measure_baseline(args, harness, bundle, mark, work))
            log(f"load average now {procs.loadavg()}")
    measured_floors = busy = None
    if args.only in (None, "ours") and ours_rounds:
        size = int(ours_rounds[-1].get("create_response_bytes") or 1024)
        measured_floors = await asyncio.to_thread(_floors, args, size)
        if args.busy:
            busy = await _busy_pass(args, harness, tools, bundle, mark, size)
    wanted = _engines_wanted(args)
    if wanted:
        bundle_dir = await asyncio.to_thread(_build_bundle, tools, work / "engine-bundle")
        for kind in wanted:
            measured = await measure_engine(args, harness, kind, tools, bundle_dir, work)
            report.update({k: v for k, v in measured.items() if k in ENGINE_KEYS})
            report["details"][kind] = measured
    if args.only in (None, "ours"):
        k8s = await measure_k8s(args)
        for key in K8S_KEYS:
            report[key] = k8s[key]
        report["details"]["k8s"] = k8s
    ours = _merge_rounds(ours_rounds) if ours_rounds else {}
    for key in HEADLINE:
        report[key] = ours.get(key)
    report["baseline"] = ({k: v for k, v in _merge_rounds(baseline_rounds).items() if k != "per_round"}
                          if baseline_rounds else None)
    for key in CPU_KEYS:
        report[key] = ours.get(key)
    report["details"]["ours"] = ours
    if measured_floors:
        report.update(measured_floors)
        report["ratios"] = floors.floor_ratios(report, measured_floors, FLOOR_RATIO_KEYS)
    if busy:
        report["busy"] = busy
        report["ratios"].update(floors.floor_ratios(
            busy, {name: busy.get(name) for name in floors.FLOOR_PROGRAMS}, FLOOR_RATIO_KEYS,
            prefix="busy_"))
    if baseline_rounds and len(baseline_rounds) > 1:
        report["details"]["baseline_per_round"] = baseline_rounds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke-sized: few runs, N=10 density")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds; numbers are medians")
    parser.add_argument("--cold-runs", type=int, default=None, help="cold creates per side (default 20; quick 3)")
    parser.add_argument("--warm", type=int, default=None, help="sequential warm claims (default 200; quick 16)")
    parser.add_argument("--c16-rounds", type=int, default=None, help="rounds of 16 concurrent claims (default 10; quick 1)")
    parser.add_argument("--density", type=int, default=None, help="idle sandboxes for density (default 100; quick 10)")
    parser.add_argument("--no-baseline-density", dest="baseline_density", action="store_false",
                        help="skip the in-process density measurement")
    parser.add_argument("--only", choices=("ours", "baseline", "engines"),
                        help="measure one side only (engines: only the docker/podman keys)")
    parser.add_argument("--no-prestart-worker", dest="prestart_worker", action="store_false",
                        help="the dev bundle's daemon starts its worker on the first call "
                             "(default: --prestart-worker, as a built bundle's bootstrap.sh)")
    parser.add_argument("--providerd", help="use this agentix-providerd instead of the runfiles'")
    parser.add_argument("--no-busy", dest="busy", action="store_false",
                        help="skip the short second round of ours and the floors with one busy core")
    parser.add_argument("--engines", dest="engines", action="store_true", default=None,
                        help="measure the docker and podman backends (starts dockerd and a podman service; "
                             "default in a full run, off with --quick)")
    parser.add_argument("--no-engines", dest="engines", action="store_false", help="skip the engines")
    parser.add_argument("--quiet-claims", type=int, default=None,
                        help="claims after the pool settled, per side and engine (default 10; quick 3)")
    parser.add_argument("--engine", action="append", choices=("docker", "podman"),
                        help="measure only this engine (repeatable; default: both)")
    parser.add_argument("--engine-runs", type=int, default=None,
                        help="cold creates and bare runs per engine (default 10; quick 3)")
    parser.add_argument("--engine-warm", type=int, default=None, help="warm claims per engine (default 40; quick 8)")
    parser.add_argument("--k8s-claims", type=int, default=None,
                        help="warm claims on the Kubernetes backend (default 200; quick 20)")
    args = parser.parse_args(argv)
    q = args.quick
    args.cold_runs = args.cold_runs or (3 if q else 20)
    args.warm = args.warm or (16 if q else 200)
    args.c16_rounds = args.c16_rounds or (1 if q else 10)
    args.density = args.density or (10 if q else 100)
    args.engine_runs = args.engine_runs or (3 if q else 10)
    args.engine_warm = args.engine_warm or (8 if q else 40)
    args.quiet_claims = args.quiet_claims or (3 if q else ENGINE_QUIET_CLAIMS)
    args.k8s_claims = args.k8s_claims or (20 if q else 200)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")

    tools = {"providerd": Path(args.providerd) if args.providerd else _find("providers/agentix-providerd"),
             "sandboxd": _find("sandbox/agentix-sandboxd"), "worker": _find("worker/agentix-worker"),
             "bundler": _find("bundler/bundler")}
    missing = [k for k, v in tools.items() if not v and (k != "bundler" or _engines_wanted(args))]
    if missing:
        log(f"not found: {', '.join(missing)} (run through `bazel run //testing/bench:provider`)")
        return 2
    if shutil.which("bwrap") is None:
        log("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
        return 2
    harness_dir = procs.runfile("testing/providerd")
    sys.path.insert(0, str(harness_dir or _repo_root() / "testing" / "providerd"))
    sys.path.insert(0, str(procs.runfile("testing/engines") or _repo_root() / "testing" / "engines"))

    report = {key: None for key in HEADLINE + ENGINE_KEYS + K8S_KEYS}
    report["baseline"] = None
    report["details"] = {"quick": q, "rounds": args.rounds, "cold_runs": args.cold_runs, "warm_claims": args.warm,
                         "c16_rounds": args.c16_rounds, "density_n": args.density, "targets": TARGETS,
                         "loadavg_start": procs.loadavg(), "machine": _machine(),
                         "started_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    log(f"load average at start: {report['details']['loadavg_start']}; machine {report['details']['machine']}")
    work = Path(tempfile.mkdtemp(prefix="agx-pbench-", dir="/tmp"))
    try:
        code = procs.run_reported(lambda: run_all(args, tools, work, report), report, log,
                                  RUN_DEADLINE_S["quick" if q else "full"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["details"]["loadavg_end"] = procs.loadavg()
    report["targets_met"] = {k: (report[k] <= v if report.get(k) is not None else None) for k, v in TARGETS.items()}
    for kind in ("docker", "podman"):
        warm, cold, bare = (report.get(f"{kind}_{k}") for k in ("warm_acquire_p50_ms", "cold_create_p50_ms",
                                                                "run_true_p50_ms"))
        report["targets_met"][f"{kind}_warm_acquire_p50_ms"] = None if warm is None else warm <= ENGINE_WARM_TARGET_MS
        report["targets_met"][f"{kind}_cold_create_p50_ms"] = (
            None if cold is None or bare is None else cold <= bare + ENGINE_COLD_OVER_BARE_MS)
    base = report["baseline"] or {}
    log("metric                               ours      baseline")
    for key in HEADLINE + K8S_KEYS:
        log(f"  {key:34s} {report[key]!s:>9} {base.get(key)!s:>9}")
    for key in ENGINE_KEYS:
        if report.get(key) is not None:
            log(f"  {key:34s} {report[key]!s:>9}")
    for name in ("floor", "floor_grpc"):
        log(f"{name}: {({k: v for k, v in (report.get(name) or {}).items() if k != 'details'})}")
    log(f"ratios to the floors: {report.get('ratios')}")
    log(f"targets met: {report['targets_met']}; load average {report['details']['loadavg_start']} -> "
        f"{report['details']['loadavg_end']}")
    print(json.dumps(report), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
