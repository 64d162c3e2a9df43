"""A/B of the host's Calls transports in one process, against one daemon.

    bazel run //testing/bench:native_ab                  # frames vs native, 10 rounds
    bazel run //testing/bench:native_ab -- --ab native,aio --rounds 20 --calls 1000

Starts agentix-sandboxd (+ agentix-worker) on a Unix socket and opens one
`RuntimeClient` to it per transport of `--ab`: ``frames`` (the daemon's frame
wire, agentix.runtime.client.frames: AGENTIX_CALLS_WIRE=frames), ``native``
(agentix.runtime.client._native_calls, grpc++) and ``aio`` (grpc.aio:
AGENTIX_NATIVE_TRANSPORT=0), the variables set while each client is made
and connected. Each round runs, for each transport in turn (the order
alternates between rounds, so drifts in machine load hit both alike):

- `--calls` sequential `remote(noop)` after `--warmup` ones: p50/p99 latency
  and host CPU time (process_time: every thread of this process) per call;
- calls/s with 16 concurrent callers for `--conc-seconds`;
- one 16 MiB echo (MB/s both ways).

Prints per-round figures, the medians over rounds and first/second ratios
(e.g. frames/native); the last line is one JSON object with the same figures.
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path[0] = os.path.dirname(os.path.abspath(__file__))

import procs  # noqa: E402
import workloads  # noqa: E402

ALL_TRANSPORTS = ("frames", "native", "aio")
TRANSPORTS = ("frames", "native")
# The environment each transport's client is made and connected under, and
# the type of Calls stream it must end up with.
_ENV = {
    "frames": {"AGENTIX_CALLS_WIRE": "frames", "AGENTIX_NATIVE_TRANSPORT": "1"},
    "native": {"AGENTIX_CALLS_WIRE": "grpc", "AGENTIX_NATIVE_TRANSPORT": "1"},
    "aio": {"AGENTIX_CALLS_WIRE": "grpc", "AGENTIX_NATIVE_TRANSPORT": "0"},
}
_STREAM = {"frames": "FrameCallsStream", "native": "NativeCallsStream", "aio": "CallsStream"}


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _client(url: str, transport: str, feeds: bool):
    """A connected client on `transport` (the environment is read when the
    client is made and when it connects)."""
    from agentix import RuntimeClient

    saved = {key: os.environ.get(key) for key in _ENV[transport]}
    os.environ.update(_ENV[transport])
    try:
        client = RuntimeClient(url, logs=feeds, traces=feeds)
        await client.__aenter__()
        return client
    finally:
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value


async def _noop_block(client, targets, warmup: int, calls: int) -> dict:
    for _ in range(warmup):
        await client.remote(targets.noop)
    samples = []
    cpu0 = time.process_time()
    for _ in range(calls):
        t0 = time.perf_counter()
        await client.remote(targets.noop)
        samples.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0
    return {
        "p50_us": _percentile(samples, 0.5) * 1e6,
        "p99_us": _percentile(samples, 0.99) * 1e6,
        "cpu_us_per_call": cpu / calls * 1e6,
    }


async def _calls_per_second(client, targets, callers: int, seconds: float) -> float:
    async with workloads.Callers(client.remote, targets.noop, callers) as load:
        await asyncio.sleep(0.2)
        c0, t0 = load.completed, time.perf_counter()
        await asyncio.sleep(seconds)
        c1, t1 = load.completed, time.perf_counter()
    return (c1 - c0) / (t1 - t0)


async def _echo_mb_per_s(client, targets, size: int) -> float:
    data = os.urandom(size)
    t0 = time.perf_counter()
    result = await client.remote(targets.echo, data)
    elapsed = time.perf_counter() - t0
    if result != data:
        raise AssertionError("echo returned different bytes")
    return 2 * size / elapsed / 1e6


async def _run(url: str, args) -> dict:
    import bench_targets

    clients = {name: await _client(url, name, not args.no_feeds) for name in TRANSPORTS}
    for name, client in clients.items():
        kind = type(client._stream).__name__
        print(f"{name}: {kind}", flush=True)
        if kind != _STREAM[name]:
            raise RuntimeError(f"the {name} client runs a {kind}: is the native extension built?")
        await client.remote(bench_targets.noop)
    rounds: dict[str, list[dict]] = {name: [] for name in TRANSPORTS}
    try:
        for index in range(args.rounds):
            order = TRANSPORTS if index % 2 == 0 else TRANSPORTS[::-1]
            for name in order:
                client = clients[name]
                figures = await _noop_block(client, bench_targets, args.warmup, args.calls)
                figures["calls_per_s_c16"] = await _calls_per_second(client, bench_targets, 16, args.conc_seconds)
                figures["echo_16mib_mb_per_s"] = await _echo_mb_per_s(client, bench_targets, 16 << 20)
                rounds[name].append(figures)
                print(
                    f"round {index + 1} {name:6}: noop p50 {figures['p50_us']:6.1f} us  p99 {figures['p99_us']:7.1f} us  "
                    f"cpu/call {figures['cpu_us_per_call']:6.1f} us  c16 {figures['calls_per_s_c16']:8.0f}/s  "
                    f"echo16MiB {figures['echo_16mib_mb_per_s']:6.0f} MB/s",
                    flush=True,
                )
    finally:
        for client in clients.values():
            await client.close()
    keys = rounds[TRANSPORTS[0]][0].keys()
    medians = {name: {key: statistics.median(r[key] for r in rounds[name]) for key in keys} for name in TRANSPORTS}
    ratios = {}
    if len(TRANSPORTS) == 2:
        first, second = TRANSPORTS
        ratios = {key: medians[first][key] / medians[second][key] for key in keys}
    return {"rounds": args.rounds, "calls": args.calls, "transports": list(TRANSPORTS), "medians": medians, "ratios": ratios}


def main() -> int:
    global TRANSPORTS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--conc-seconds", type=float, default=1.0)
    parser.add_argument("--no-feeds", action="store_true", help="clients without the Logs and Traces streams")
    parser.add_argument(
        "--ab",
        default=",".join(TRANSPORTS),
        help=f"the two transports to compare, comma-separated, of {', '.join(ALL_TRANSPORTS)} (default: %(default)s)",
    )
    parser.add_argument("--only", choices=ALL_TRANSPORTS, help="run one transport only (its own process, no A/B)")
    parser.add_argument("--sandboxd", help="agentix-sandboxd binary (default: from runfiles)")
    parser.add_argument("--worker", help="agentix-worker binary (default: from runfiles)")
    args = parser.parse_args()
    if args.only:
        TRANSPORTS = (args.only,)
    else:
        TRANSPORTS = tuple(args.ab.split(","))
        if len(TRANSPORTS) != 2 or len(set(TRANSPORTS)) != 2 or not set(TRANSPORTS) <= set(ALL_TRANSPORTS):
            parser.error(f"--ab takes two different transports of {', '.join(ALL_TRANSPORTS)}")
    sandboxd = args.sandboxd or procs.runfile("sandbox/agentix-sandboxd")
    worker = args.worker or procs.runfile("worker/agentix-worker")
    if not sandboxd or not worker:
        print("agentix-sandboxd / agentix-worker not found (pass --sandboxd and --worker)", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="agx-ab-", dir="/tmp")
    sock = os.path.join(tmp, "sandboxd.sock")
    url = f"unix://{sock}"
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES)
    daemon = procs.start_process(
        [sandboxd, "--listen", url, f"--worker={worker}", f"--python_path={procs.bench_dir()}", "--log_level=warning"],
        env=env,
        stdout=sys.stderr.fileno(),
    )
    try:
        deadline = time.monotonic() + 30
        wanted = [sock, sock + ".calls"] if "frames" in TRANSPORTS else [sock]
        while not all(os.path.exists(path) for path in wanted):
            if daemon.poll() is not None or time.monotonic() > deadline:
                print("agentix-sandboxd did not come up", file=sys.stderr)
                return 1
            time.sleep(0.05)
        report = asyncio.run(_run(url, args))
    finally:
        procs.stop_process(daemon)
        shutil.rmtree(tmp, ignore_errors=True)
    for name in TRANSPORTS:
        m = report["medians"][name]
        print(
            f"median {name:6}: noop p50 {m['p50_us']:6.1f} us  p99 {m['p99_us']:7.1f} us  cpu/call {m['cpu_us_per_call']:6.1f} us  "
            f"c16 {m['calls_per_s_c16']:8.0f}/s  echo16MiB {m['echo_16mib_mb_per_s']:6.0f} MB/s"
        )
    r = report["ratios"]
    if r:
        print(
            f"{'/'.join(TRANSPORTS)}: noop p50 {r['p50_us']:.2f}  p99 {r['p99_us']:.2f}  cpu/call {r['cpu_us_per_call']:.2f}  "
            f"c16 {r['calls_per_s_c16']:.2f}  echo16MiB {r['echo_16mib_mb_per_s']:.2f}"
        )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
