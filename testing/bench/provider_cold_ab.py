"""Same-run A/B of a cold sandbox's create -> first call through agentix-providerd.

    .venv-test/bin/python testing/bench/provider_cold_ab.py \
        --a-providerd P1 --a-sandboxd D1 --a-worker W1 \
        --b-providerd P2 --b-sandboxd D2 --b-worker W2 [--rounds 6] [--runs 3]

Two providerds (one per side, each with a development bundle whose
bootstrap.sh execs that side's daemon and worker, --prestart-worker, daemon
log level debug; image "host"), used alternately: each round runs `--runs`
cold sandboxes on A then B (B then A in odd rounds): CreateSandbox (no pool)
-> the first remote(bench_targets.noop) of a fresh RuntimeClient -> delete
(not waited for). Per sandbox, from the client's clock and the daemon's log
(wall clock, ms; relative to the CreateSandbox call):

  total / create / first_call   create -> first result, its two parts
  daemon_up                     the daemon's first log line (bwrap, bootstrap,
                                the daemon's exec and dynamic linking)
  worker_started / worker_ready the daemon's "started as pid" / "ready" lines
  activated                     SandboxAdmin.Activate done (the env sent)
  worker_boot                   worker_ready - worker_started
  ready_to_result               total - worker_ready

Printed: medians per side and the median of the per-round ratios B / A (the
only figures worth reading on a shared machine). Last line: JSON. Binaries
must be outside /tmp (a sandbox gets a fresh /tmp). Bounded: every RPC has a
timeout; both providerds are stopped (and their sandboxes with them) at the end.
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(os.path.abspath(__file__)).parent
sys.path[:0] = [str(HERE), str(HERE.parent / "providerd")]

import providerd_harness as harness  # noqa: E402

KEYS = ("total", "create", "first_call", "daemon_up", "worker_started", "activated",
        "worker_ready", "worker_boot", "ready_to_result")
LINES = (("daemon_up", ""), ("worker_started", "started as pid"), ("worker_ready", " ready: python"),
         ("activated", "activated:"))


def _log_times(text: str) -> dict:
    """Seconds since midnight (the daemon's wall clock) of the lines in LINES."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"(\d\d):(\d\d):(\d\d)\.(\d\d\d) agentix-sandboxd \w (.*)", line)
        if not m:
            continue
        hh, mm, ss, ms, message = m.groups()
        t = int(hh) * 3600 + int(mm) * 60 + int(ss) + int(ms) / 1000
        for key, pattern in LINES:
            if pattern in message and key not in out:
                out[key] = t
    return out


async def _first_call(target: str, token: str) -> float:
    from agentix import RuntimeClient
    import bench_targets

    start = time.perf_counter()
    async with RuntimeClient(target, token=token) as client:
        await asyncio.wait_for(client.remote(bench_targets.noop), 60)
        return time.perf_counter() - start


async def _one(side: dict, pb) -> dict:
    pd = side["pd"]
    spec = pb.SandboxSpec(image="host", bundle=pb.BundleRef(path=str(side["bundle"])),
                          ttl=harness.duration(900))
    t0_wall, t0 = time.time(), time.perf_counter()
    created = await side["stub"].CreateSandbox(
        pb.CreateSandboxRequest(request_id=str(uuid.uuid4()), spec=spec), metadata=pd.metadata, timeout=30)
    t1 = time.perf_counter()
    first = await _first_call(created.sandbox.status.endpoint.target, created.credentials.access_token)
    log = pd.state_dir / "sb" / created.sandbox.id / "sandbox.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    await side["stub"].DeleteSandbox(pb.DeleteSandboxRequest(id=created.sandbox.id, request_id=str(uuid.uuid4()),
                                                             wait=False), metadata=pd.metadata, timeout=30)
    midnight = t0_wall - (t0_wall % 86400)  # the daemon logs UTC wall-clock times of day
    row = {"total": (t1 - t0 + first) * 1000, "create": (t1 - t0) * 1000, "first_call": first * 1000}
    for key, t in _log_times(text).items():
        row[key] = (midnight + t - t0_wall) * 1000
    if "worker_ready" in row and "worker_started" in row:
        row["worker_boot"] = row["worker_ready"] - row["worker_started"]
        row["ready_to_result"] = row["total"] - row["worker_ready"]
    return row


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


async def main_async(args) -> dict:
    pb, pb_grpc = harness.stubs()
    import grpc

    sides, channels = {}, []
    work = Path(tempfile.mkdtemp(prefix="pcab", dir="/tmp"))  # short: providerd's state dir limit
    try:
        for name in ("a", "b"):
            bundle = harness.write_dev_bundle(
                work / f"bundle-{name}", sandboxd=Path(getattr(args, f"{name}_sandboxd")),
                worker=Path(getattr(args, f"{name}_worker")), python_path=str(HERE), prestart_worker=True)
            script = bundle / "nix" / "runtime" / "bootstrap.sh"
            script.write_text(script.read_text().replace(' "$@"', ' --log-level debug "$@"'))
            pd = harness.Providerd(work / name, binary=Path(getattr(args, f"{name}_providerd"))).start()
            channel = grpc.aio.insecure_channel(pd.target)
            channels.append(channel)
            sides[name] = {"pd": pd, "bundle": bundle, "stub": pb_grpc.ProviderServiceStub(channel)}
        for name in ("a", "b"):  # warm-up (page cache), not counted
            await _one(sides[name], pb)
        rows = {"a": [], "b": []}
        ratios: dict = {}
        for i in range(args.rounds):
            per = {}
            for name in (("a", "b") if i % 2 == 0 else ("b", "a")):
                runs = [await _one(sides[name], pb) for _ in range(args.runs)]
                rows[name] += runs
                per[name] = {k: _median([r.get(k) for r in runs]) for k in KEYS}
            for k in KEYS:
                a, b = per["a"][k], per["b"][k]
                if a and b and a > 0 and b > 0:
                    ratios.setdefault(k, []).append(b / a)
            print(f"[cold-ab] round {i + 1}: total a {per['a']['total']:.1f} ms, b {per['b']['total']:.1f} ms "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
        report = {"rounds": args.rounds, "runs": args.runs, "loadavg_end": os.getloadavg()}
        for k in KEYS:
            a, b = _median([r.get(k) for r in rows["a"]]), _median([r.get(k) for r in rows["b"]])
            report[k] = {"a": None if a is None else round(a, 1), "b": None if b is None else round(b, 1),
                         "ratio_b_over_a": round(statistics.median(ratios[k]), 3) if ratios.get(k) else None}
            print(f"[cold-ab] {k:16s} {report[k]}", flush=True)
        return report
    finally:
        for channel in channels:
            await channel.close()
        for side in sides.values():
            side["pd"].stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("a", "b"):
        parser.add_argument(f"--{name}-providerd", required=True)
        parser.add_argument(f"--{name}-sandboxd", required=True)
        parser.add_argument(f"--{name}-worker", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3, help="sandboxes per side and round")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
