"""Same-run A/B of the worker's cold start inside built bundles.

    .venv-test/bin/python testing/bench/worker_boot_ab.py --a BUNDLE_A --b BUNDLE_B \
        [--rounds 20] [--call os::getpid] [--call hello_agentix.tools::add:1,2] \
        [--a-worker-arg ARG]... [--b-worker-arg ARG]...
    PYTHONPATH=examples/hello .venv-test/bin/python testing/bench/worker_boot_ab.py \
        --a BUNDLE_A --b BUNDLE_B --lifecycle [--rounds 4] [--runs 5]

With --lifecycle, each round runs sandbox_lifecycle.py's measured sandboxes
instead (LocalProvider.create -> the first hello_agentix.tools.add -> delete,
busybox root, no probes), `--runs` per side and round, and reports the
medians of its timeline keys per side and the medians of per-round ratios.

Each round starts, for A then B (the order alternates by round), the bundle's
own `agentix-worker` under the local provider's bubblewrap command line, the
way agentix-sandboxd spawns it (a socketpair end as the channel, --venv,
--python-home), with a first call already waiting on the channel (as a cold
create's first call waits at the daemon for the worker), and notes:

  ready_ms   spawn -> the ready frame
  result_ms  spawn -> the first call's result frame
  cpu_ms     the worker's CPU (its live threads, /proc/PID/task/*/schedstat) when
             the result arrived
  cpu_all_ms the worker's CPU with its exited threads' (e.g. the prefault thread's),
             /proc/PID/stat's utime + stime: clock ticks, 10 ms steps
  faults     the worker's minor page faults (/proc/PID/stat) when the result arrived

Printed: the medians per side and the median of the per-round ratios B / A
(the only figures worth reading on a shared machine). Last line: JSON.
Bounded: every wait has a timeout; every worker is killed at the end of its run.
"""

import argparse
import asyncio
import json
import os
import pickle
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack

TIMEOUT_S = 30.0


def _frame(body: dict) -> bytes:
    data = msgpack.packb(body, use_bin_type=True)
    return struct.pack("<I", len(data)) + data


def _call_frame(call_id: str, reference: str, args: tuple) -> bytes:
    data = pickle.dumps((args, {}))
    return _frame({"t": "call", "call_id": call_id, "callable": reference, "encoding": 1,
                   "data": data, "total_size": len(data), "context": b"", "stream_window": 0})


def _worker_pid(root_pid: int) -> int | None:
    """The agentix-worker process under `root_pid` (bwrap's tree)."""
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("agentix-worker"):
            return pid
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return None


def _usage(pid: int) -> tuple[float, float, int]:
    """(CPU ms of its live threads, CPU ms of all its threads in clock ticks, minor faults)
    of a live process."""
    cpu_ns = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            cpu_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    # minflt is field 10 of stat
    return cpu_ns / 1e6, ticks * 1000 / os.sysconf("SC_CLK_TCK"), int(fields[7])


class Reader:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    async def frame(self) -> dict:
        loop = asyncio.get_running_loop()
        while True:
            if len(self.buf) >= 4:
                (size,) = struct.unpack("<I", self.buf[:4])
                if len(self.buf) >= 4 + size:
                    body, self.buf = self.buf[4:4 + size], self.buf[4 + size:]
                    return msgpack.unpackb(body, raw=False)
            chunk = await loop.sock_recv(self.sock, 65536)
            if not chunk:
                raise EOFError("channel closed")
            self.buf += chunk


async def one_run(provider, bundle: Path, root: Path, reference: str, args: tuple,
                  worker_args: tuple = ()) -> dict:
    bwrap = provider.config.bwrap
    nix_dir = provider._bundle_nix_dir(str(bundle))
    base_argv = provider._argv(bwrap, "boot-ab", root, nix_dir)[:-1]
    parent, child = socket.socketpair()
    parent.setblocking(False)
    env = provider._sandbox_env("boot-ab", None)
    argv = base_argv + ["/nix/runtime/bin/agentix-worker", f"--channel-fd={child.fileno()}",
                        "--worker-id=boot-ab", "--venv=/nix/runtime/venv",
                        "--python-home=/nix/runtime/python", *worker_args]
    parent.sendall(_call_frame("first", reference, args))
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env=env, pass_fds=(child.fileno(),), start_new_session=True)
    child.close()
    reader = Reader(parent)
    r = {}
    try:
        while True:
            frame = await asyncio.wait_for(reader.frame(), TIMEOUT_S)
            kind = frame.get("t")
            if kind == "ready":
                r["ready_ms"] = (time.perf_counter() - start) * 1000
            elif kind in ("result", "error") and frame.get("call_id") == "first":
                r["result_ms"] = (time.perf_counter() - start) * 1000
                pid = _worker_pid(proc.pid)
                if pid is not None:
                    r["cpu_ms"], r["cpu_all_ms"], r["faults"] = _usage(pid)
                if kind == "error":
                    r["error"] = str(frame.get("error"))[:300]
                break
            elif kind == "boot_error":
                r["error"] = str(frame)[:300]
                break
    finally:
        parent.close()
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        await proc.wait()
    return r


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


async def main_async(args) -> dict:
    import agentix.provider._local_inprocess as local_mod

    provider = local_mod.InProcessLocalProvider(local_mod.LocalProviderConfig())
    sides = {"a": Path(args.a), "b": Path(args.b)}
    extra = {"a": tuple(args.a_worker_arg or ()), "b": tuple(args.b_worker_arg or ())}
    calls = []
    for spec in args.call or ["os::getpid"]:
        # module::name, or module::name:1,2 (int arguments)
        reference, raw = (spec.rsplit(":", 1) if spec.count(":") == 3 else (spec, ""))
        calls.append((reference, tuple(int(x) for x in raw.split(",") if x)))
    report = {}
    with tempfile.TemporaryDirectory(prefix="agx-boot-ab-") as tmp:
        root = Path(tmp) / "root"
        (root / "bin").mkdir(parents=True)
        busybox = "/bin/busybox"
        (root / "bin" / "busybox").write_bytes(Path(busybox).read_bytes())
        os.chmod(root / "bin" / "busybox", 0o755)
        os.symlink("busybox", root / "bin" / "sh")
        for reference, values in calls:
            runs = {"a": [], "b": []}
            for side in ("a", "b"):  # warm-up (page cache), not counted
                await one_run(provider, sides[side], root, reference, values, extra[side])
            for i in range(args.rounds):
                order = ("a", "b") if i % 2 == 0 else ("b", "a")
                for side in order:
                    runs[side].append(
                        await one_run(provider, sides[side], root, reference, values, extra[side]))
            errors = [r["error"] for side in runs for r in runs[side] if "error" in r]
            out = {"rounds": args.rounds, "errors": errors[:3]}
            for key in ("ready_ms", "result_ms", "cpu_ms", "cpu_all_ms", "faults"):
                a = [r.get(key) for r in runs["a"]]
                b = [r.get(key) for r in runs["b"]]
                ratios = [y / x for x, y in zip(a, b) if x and y]
                out[key] = {"a": _median(a), "b": _median(b),
                            "ratio_b_over_a": round(statistics.median(ratios), 3) if ratios else None}
            report[reference] = out
            print(f"[boot-ab] {reference}: " + ", ".join(
                f"{k} {out[k]['a']} -> {out[k]['b']} (x{out[k]['ratio_b_over_a']})"
                for k in ("ready_ms", "result_ms", "cpu_ms", "cpu_all_ms", "faults")) + (f"; errors {errors[:1]}" if errors else ""),
                flush=True)
    report["loadavg"] = os.getloadavg()
    return report


async def lifecycle_async(args) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sandbox_lifecycle as lc

    keys = ("create_to_first_call_ms", "create_ms", "first_call_ms", "create.spawn_to_listening_ms",
            "create.listening_to_healthy_ms", "call.connect_to_daemon_ms", "call.worker_boot_ms",
            "call.ready_to_result_ms", "delete_ms")
    per_round = {"a": [], "b": []}
    ns = argparse.Namespace(log_level="debug")
    root = lc._busybox_root(Path(tempfile.mkdtemp(prefix="agx-boot-ab-root-")) / "root")
    for i in range(args.rounds):
        order = ("a", "b") if i % 2 == 0 else ("b", "a")
        for side in order:
            bundle = Path(getattr(args, side))
            result = await lc.measure_sandboxes(ns, bundle, str(root), "busybox", args.runs,
                                                warmup=(i == 0), probes=False)
            stats = result["stats"]
            per_round[side].append({k: stats.get(k, {}).get("median") for k in keys})
            print(f"[boot-ab] round {i + 1} {side}: " + ", ".join(
                f"{k} {per_round[side][-1][k]}" for k in keys[:3] + ("call.worker_boot_ms",)), flush=True)
    out = {"rounds": args.rounds, "runs": args.runs}
    for k in keys:
        a = [r[k] for r in per_round["a"]]
        b = [r[k] for r in per_round["b"]]
        ratios = [y / x for x, y in zip(a, b) if x and y and x > 0 and y > 0]
        out[k] = {"a": _median(a), "b": _median(b),
                  "ratio_b_over_a": round(statistics.median(ratios), 3) if ratios else None}
        print(f"[boot-ab] {k}: {out[k]['a']} -> {out[k]['b']} (x{out[k]['ratio_b_over_a']})", flush=True)
    out["loadavg"] = os.getloadavg()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="bundle directory A (the old build)")
    parser.add_argument("--b", required=True, help="bundle directory B (the new build)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--lifecycle", action="store_true",
                        help="whole sandboxes (sandbox_lifecycle.py) instead of the worker alone")
    parser.add_argument("--runs", type=int, default=5, help="--lifecycle: sandboxes per side and round")
    parser.add_argument("--call", action="append",
                        help="first call, module::name[:int,int...] (default os::getpid; repeatable)")
    parser.add_argument("--a-worker-arg", action="append", metavar="ARG",
                        help="an extra agentix-worker argument for side A's worker (repeatable; "
                             "not with --lifecycle), e.g. --prefault_arena_mib=0")
    parser.add_argument("--b-worker-arg", action="append", metavar="ARG",
                        help="the same for side B")
    args = parser.parse_args()
    if args.lifecycle and (args.a_worker_arg or args.b_worker_arg):
        parser.error("--a-worker-arg/--b-worker-arg apply to the worker alone, not --lifecycle")
    report = asyncio.run(lifecycle_async(args) if args.lifecycle else main_async(args))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
