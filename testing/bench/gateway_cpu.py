"""Gateway CPU per call and per log record, optionally under cProfile.

Starts agentix-sandboxd and the gateway (by path, as bootstrap.sh does), drives
`--calls` sequential noops and one `log_burst(--records)` through
`baseline.client.BaselineClient`, and prints the noop p50, the log rate and
the gateway process's utime+stime per call / per record (from /proc). With
`--profile OUT` the gateway runs under cProfile and writes OUT on exit.

    .venv-test/bin/python testing/bench/gateway_cpu.py [--profile /tmp/gw.prof]

Run from the repository root after `bazel build //...` and tools/make_venv
.venv-test. The gateway used is the one of the venv running this script.
"""
import argparse
import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drive(url: str, pid: int, calls: int, records: int) -> None:
    import bench_targets
    import side_targets
    from baseline.client import BaselineClient

    async with BaselineClient(url, side_channels=True) as client:
        for _ in range(200):
            await client.remote(bench_targets.noop)
        times = []
        cpu0 = _cpu_s(pid)
        for _ in range(calls):
            t = time.perf_counter()
            await client.remote(bench_targets.noop)
            times.append(time.perf_counter() - t)
        cpu1 = _cpu_s(pid)
        times.sort()
        print(f"noop p50 {times[len(times) // 2] * 1e6:.0f} us, gateway cpu {(cpu1 - cpu0) / calls * 1e6:.0f} us/call")
        logger = logging.getLogger(side_targets.LOGGER)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        got = []

        class Count(logging.Handler):
            def emit(self, record):
                got.append(1)

        logger.addHandler(Count())
        await client.remote(side_targets.log_burst, 10)
        await asyncio.sleep(0.5)
        got.clear()
        cpu0, t = _cpu_s(pid), time.perf_counter()
        await client.remote(side_targets.log_burst, records)
        deadline = time.monotonic() + 120
        while len(got) < records and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        cpu1 = _cpu_s(pid)
        print(f"logs {len(got) / (time.perf_counter() - t):.0f}/s, gateway cpu {(cpu1 - cpu0) / records * 1e6:.0f} us/record")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandboxd", default="bazel-bin/sandbox/agentix-sandboxd")
    parser.add_argument("--worker", default="bazel-bin/worker/agentix-worker")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--profile", help="write the gateway's cProfile stats here")
    args = parser.parse_args()
    import agentix

    host_dir = os.path.dirname(os.path.dirname(os.path.abspath(agentix.__file__)))
    with tempfile.TemporaryDirectory(prefix="gwcpu-") as tmp:
        sock = os.path.join(tmp, "d.sock")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        daemon = subprocess.Popen(
            [args.sandboxd, "--listen", f"unix://{sock}", f"--worker={args.worker}",
             f"--python_path={HERE}:{host_dir}", "--log_level=warning", "--prestart-worker"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, AGENTIX_LOG_DIR=tmp))
        profile = ["-m", "cProfile", "-o", args.profile] if args.profile else []
        gateway = subprocess.Popen(
            [sys.executable, *profile, os.path.join(host_dir, "agentix", "gateway", "__main__.py"),
             "--daemon", f"unix://{sock}", "--port", str(port), "--log-level", "warning"])
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline or gateway.poll() is not None:
                    raise RuntimeError("gateway not healthy")
                time.sleep(0.01)
            asyncio.run(_drive(url, gateway.pid, args.calls, args.records))
        finally:
            gateway.send_signal(signal.SIGTERM)
            gateway.wait(30)
            daemon.terminate()
            daemon.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
