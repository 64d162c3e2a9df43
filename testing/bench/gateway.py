"""Gateway benchmark: agentix-sio-gateway + agentix-sandboxd vs. the original-wire model.

    bazel run //testing/bench:gateway                 # full run
    bazel run //testing/bench:gateway -- --quick      # smoke-sized

Both sides speak the SAME wire (the original's Socket.IO `/rpc`, `/log`), so the
same legacy client measures both: `baseline.client.BaselineClient` (the original
RuntimeClient's call path over websocket, with the original's host log bridge).

- baseline: `baseline.server` (python-socketio server + Python worker on a pipe);
- gateway:  `python -m agentix.gateway` in front of `agentix-sandboxd` + worker
            (the gateway reaches the daemon over a Unix socket).

Each side is measured `--rounds` times (default 3) in alternating order; every
figure is the median of its rounds. Metrics (per side): `noop_p50_us` (sequential `remote(noop)`), `calls_per_s_c64`
(64 concurrent callers, completions over a window), `log_records_per_s` (records
of `side_targets.log_burst(n)` replayed into the host's logging per second, from
the call's start to the last record's arrival), and for the gateway
`ready_ms` (start to `GET /health` 200, daemon and gateway started together) next
to `daemon_ready_ms` (start of the daemon alone to its gRPC GetInfo answering).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import procs  # noqa: E402
import workloads  # noqa: E402

START_TIMEOUT_S = 30


def _host_python_dir() -> str:
    import agentix

    return os.path.dirname(os.path.dirname(os.path.abspath(agentix.__file__)))


def _gateway_main() -> str:
    """The gateway's entry file, run by path as bootstrap.sh does (with -S but
    not -I here: under `bazel run` the host package comes from PYTHONPATH)."""
    return os.path.join(_host_python_dir(), "agentix", "gateway", "__main__.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Counter(logging.Handler):
    def __init__(self, target: int, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self.count = 0
        self.target = target
        self.loop = loop
        self.done = asyncio.Event()

    def createLock(self):  # noqa: N802 (logging's name)
        self.lock = None

    def acquire(self):
        pass

    def release(self):
        pass

    def emit(self, record):
        self.count += 1
        if self.count >= self.target:
            self.loop.call_soon_threadsafe(self.done.set)


async def _measure(url: str, plan: dict) -> dict:
    import bench_targets
    import side_targets
    from baseline.client import BaselineClient

    out = {}
    async with BaselineClient(url, side_channels=True) as client:
        await client.remote(bench_targets.noop)  # starts the worker
        for _ in range(plan["warmup"]):
            await client.remote(bench_targets.noop)
        times = []
        for _ in range(plan["calls"]):
            t = time.perf_counter()
            await client.remote(bench_targets.noop)
            times.append(time.perf_counter() - t)
        out["noop_p50_us"] = round(statistics.median(times) * 1e6, 1)

        async with workloads.Callers(client.remote, bench_targets.noop, 64) as load:
            await asyncio.sleep(plan["warm_s"])
            start_count, start = load.completed, time.perf_counter()
            await asyncio.sleep(plan["window_s"])
            out["calls_per_s_c64"] = round((load.completed - start_count) / (time.perf_counter() - start))

        logger = logging.getLogger(side_targets.LOGGER)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        n = plan["logs"]
        await client.remote(side_targets.log_burst, 10)  # warm-up
        await asyncio.sleep(0.5)
        counter = _Counter(n, asyncio.get_running_loop())
        logger.addHandler(counter)
        try:
            start = time.perf_counter()
            await client.remote(side_targets.log_burst, n)
            await asyncio.wait_for(counter.done.wait(), 120)
            out["log_records_per_s"] = round(n / (time.perf_counter() - start))
        finally:
            logger.removeHandler(counter)
    return out


def _run_baseline(plan: dict, tmp: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(HERE), _host_python_dir(), env.get("PYTHONPATH", "")] if p)
    env["AGENTIX_LOG_DIR"] = tmp
    server = procs.start_process([sys.executable, "-m", "baseline.server", "--bench-dir", str(HERE)],
                                 env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(HERE))
    try:
        line = procs.read_line(server, START_TIMEOUT_S)
        if not line or not line.startswith("LISTENING "):
            raise RuntimeError(f"baseline server did not start (got {line!r})")
        return asyncio.run(_measure(f"http://127.0.0.1:{int(line.split()[1])}", plan))
    finally:
        procs.stop_process(server)


def _daemon_argv(args, sock: str) -> list[str]:
    return [str(args.sandboxd), "--listen", f"unix://{sock}", f"--worker={args.worker}",
            f"--python_path={HERE}:{_host_python_dir()}", "--log_level=warning", "--prestart-worker"]


def _wait_health(url: str, proc: subprocess.Popen, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("gateway exited")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic()
        except OSError:
            pass
        time.sleep(0.002)
    raise RuntimeError("gateway not healthy")


def _daemon_ready_ms(args, tmp: str) -> float:
    """Start of the daemon alone to its first GetInfo answer."""
    import grpc

    from agentix.runtime.v1 import runtime_pb2 as pb
    from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc

    sock = os.path.join(tmp, "ready.sock")
    started = time.monotonic()
    daemon = procs.start_process(_daemon_argv(args, sock), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = started + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if os.path.exists(sock):
                try:
                    with grpc.insecure_channel(f"unix://{sock}") as channel:
                        pb_grpc.RuntimeServiceStub(channel).GetInfo(pb.GetInfoRequest(), timeout=1)
                    return (time.monotonic() - started) * 1e3
                except grpc.RpcError:
                    pass
            time.sleep(0.002)
        raise RuntimeError("daemon not ready")
    finally:
        procs.stop_process(daemon)
        if os.path.exists(sock):
            os.unlink(sock)


def _run_gateway(args, plan: dict, tmp: str) -> dict:
    sock = os.path.join(tmp, "sandboxd.sock")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    # As bootstrap.sh: the gateway first (its imports overlap the daemon's start).
    gateway = procs.start_process([sys.executable, "-S", _gateway_main(), "--daemon", f"unix://{sock}",
                                   "--port", str(port), "--log-level", "warning"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    daemon = procs.start_process(_daemon_argv(args, sock), env=dict(os.environ, AGENTIX_LOG_DIR=tmp),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ready_ms = (_wait_health(url, gateway, START_TIMEOUT_S) - started) * 1e3
        out = asyncio.run(_measure(url, plan))
        out["ready_ms"] = round(ready_ms, 1)
        return out
    finally:
        procs.stop_process(gateway)
        procs.stop_process(daemon)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sandboxd", default=None)
    parser.add_argument("--worker", default=None)
    parser.add_argument("--ready-rounds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per side (medians)")
    args = parser.parse_args()
    args.sandboxd = args.sandboxd or procs.runfile("sandbox/agentix-sandboxd")
    args.worker = args.worker or procs.runfile("worker/agentix-worker")
    if not args.sandboxd or not args.worker:
        print("agentix-sandboxd / agentix-worker not found: pass --sandboxd and --worker", file=sys.stderr)
        return 2
    plan = ({"warmup": 50, "calls": 200, "warm_s": 0.2, "window_s": 0.5, "logs": 2000} if args.quick else
            {"warmup": 300, "calls": 2000, "warm_s": 0.5, "window_s": 3.0, "logs": 20000})
    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="gwbench-") as tmp:
        # Alternating rounds, medians: this VM's load swings between runs.
        rounds = {"baseline": [], "gateway": []}
        for i in range(args.rounds):
            order = ("baseline", "gateway") if i % 2 == 0 else ("gateway", "baseline")
            for side in order:
                measured = _run_baseline(plan, tmp) if side == "baseline" else _run_gateway(args, plan, tmp)
                rounds[side].append(measured)
                print(f"[{side}] round {i + 1}: {measured}", flush=True)
        for side, measured in rounds.items():
            result[side] = {key: round(statistics.median(m[key] for m in measured), 1) for key in measured[0]}
        result["rounds"] = args.rounds
        daemon_ready = sorted(_daemon_ready_ms(args, tmp) for _ in range(args.ready_rounds))
        gateway_ready = [result["gateway"]["ready_ms"]]
        for _ in range(args.ready_rounds - 1):
            port = _free_port()
            sock = os.path.join(tmp, "r.sock")
            started = time.monotonic()
            gw = procs.start_process([sys.executable, "-S", _gateway_main(), "--daemon", f"unix://{sock}",
                                      "--port", str(port), "--log-level", "warning"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            d = procs.start_process(_daemon_argv(args, sock), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                gateway_ready.append((_wait_health(f"http://127.0.0.1:{port}", gw, START_TIMEOUT_S) - started) * 1e3)
            finally:
                procs.stop_process(gw)
                procs.stop_process(d)
        result["daemon_ready_ms_median"] = round(statistics.median(daemon_ready), 1)
        result["gateway_ready_ms_median"] = round(statistics.median(gateway_ready), 1)
        result["ready_added_ms"] = round(result["gateway_ready_ms_median"] - result["daemon_ready_ms_median"], 1)
    b, g = result["baseline"], result["gateway"]
    result["no_slower_than_baseline"] = {
        "noop_p50": g["noop_p50_us"] <= b["noop_p50_us"],
        "calls_per_s_c64": g["calls_per_s_c64"] >= b["calls_per_s_c64"],
        "log_records_per_s": g["log_records_per_s"] >= b["log_records_per_s"],
    }
    result["load_avg"] = os.getloadavg()[0]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
