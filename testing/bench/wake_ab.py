"""Same-run A/B of the wake-up settings of the frame-wire call path (issue 25, issue 22).

    bazel run //testing/bench:wake_ab                       # 2-4 minutes, 10 rounds
    bazel run //testing/bench:wake_ab -- --rounds 2 --calls 300 --c64-seconds 0.5   # smoke

On a VM whose idle vCPUs halt, a sequential call pays an idle CPU's wake-up at each
cross-process hand-off (host -> daemon -> worker -> daemon -> host), which is why a quiet
machine measures slower than a busy one (shared/PERFORMANCE-NOTES.md item 6). This
compares, in alternating rounds (the order rotated every round; one fresh daemon per
run), each setting against `off`:

- `default`:    no flag, no AGENTIX_CALLS_CPU: what a user gets (since stop 32 the
                daemon's --calls_cpu=probe, whose choice both hosts follow; stops
                25-31 `auto`'s);
- `auto`:       --calls_cpu=auto with both hosts at their defaults (the default of
                stops 25-31: the daemon's call path and both hosts' pinned waits,
                `pinwait`'s parts without naming a CPU);
- `off`:        --calls_cpu=off and both hosts' AGENTIX_CALLS_CPU=off (nothing pinned;
                the default up to stop 24; every setting below but `pinwait` runs its
                hosts with AGENTIX_CALLS_CPU=off);
- `pin`:        the daemon's --calls_cpu=CPU (while calls come one at a time, its
                frame-wire connection thread and worker reader, and the worker's
                thread while it waits for a call, on one CPU; unpinned while they
                overlap: sandbox/calls_cpu.h), the Python host's AGENTIX_CALLS_CPU=CPU
                (its event loop's thread) and the C++ client's process on the same CPU
                (sched_setaffinity, as `taskset` would);
- `pinwait`:    the daemon's --calls_cpu=CPU and both hosts' AGENTIX_CALLS_CPU=wait:CPU
                (pinned waits: the host's calling thread is on the CPU only while one
                call waits, agentix/runtime/client/pinned_waits.py; no taskset);
- `probe`:      --calls_cpu=probe (the default, named), hosts at their defaults: the
                daemon's start-up probe chooses `auto`'s placement, `pin_daemon`'s or
                `off`'s and tells both hosts whether to pin their waits; the choice and
                the probe's figures are in each run's figures;
- `pin_daemon`: --calls_cpu=auto alone (the default of stops 25-31: the CPU the worker
                reader runs on, or the one a host names in HELLO), the host where the
                scheduler puts it;
- `pin_daemon_main`: the same flag with the binaries of --main-dir (agentix-sandboxd and
                agentix-worker built from an older tree, e.g. stop 24's, whose
                --calls_cpu pinned every thread of the worker process): only with
                --main-dir;
- `spin`:       bounded adaptive spinning on the receiving sides: --frames_spin_us,
                --worker_read_spin_us, --worker_intake_spin_us and the C++ client's
                AGENTIX_CALLS_SPIN_US (all --spin-us; the Python host does not spin);
- `spin_daemon`: the same without the C++ client's spinning.

Each run measures, against its own agentix-sandboxd: the Python host's sequential noop
(p50, p99, CPU per call of host, daemon and worker; a child process per run, so a
pinned loop thread does not carry over), its calls/s with 64 concurrent callers (and
the CPU per call), and the C++ client's sequential noop (cc_remote_calls --noops=N:
p50, p99, the client's CPU per call; the daemon's and the worker's over the whole C++
run, its warm-up included). Every round also runs the floors (floors.py: `floor`,
`floor_relay`, `floor_grpc`, small messages only) and the two Unix floors pinned to the
CPU (`floor_pinned`, `floor_relay_pinned`: what co-location can reach).

Output: a line per run, then per setting the medians of each figure and the median over
rounds of the per-round ratio setting / off, and each noop p50 over each floor of its
round (median over rounds); LAST, one JSON line: {"settings": {name: {...}}, "floors":
{...}, "ratios": {...}, "load": [...], "seconds": ...}. Judge a setting by its ratios
to `off` (latency and CPU per call: < 1 is better; c64 calls/s: > 1 is better) and by
`python_noop_p50_over_floor` (issue 25: <= 2.5) and `cc_noop_p50_over_floor_grpc`
(issue 22: <= 1.5), both in each setting's `targets`. The floors say whether the machine
was quiet: `floor` is ~55-70 us with idle CPUs and ~6 us when they are busy.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path[0] = os.path.dirname(os.path.abspath(__file__))

import floors  # noqa: E402
import procs  # noqa: E402

# The Python host of one run: sequential noops, then 64 concurrent callers, against the
# daemon at argv[1] (pid argv[2]); prints `RESULT {json}`.
_HOST = r"""
import asyncio, json, os, statistics, sys, time
import bench_targets, procs
from agentix import RuntimeClient
from wake_ab import ThreadCpuMeter, reader_run_queue_wait_ns

sock, daemon_pid, calls, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def main():
    out = {}
    async with RuntimeClient(f"unix://{sock}") as client:
        for _ in range(max(100, calls // 5)):
            await client.remote(bench_targets.noop)
        (worker,) = procs.children(daemon_pid)
        meter = ThreadCpuMeter({"host": os.getpid(), "daemon": daemon_pid, "worker": worker})
        lat = []
        before = meter.snapshot()
        waited = reader_run_queue_wait_ns(daemon_pid)
        for _ in range(calls):
            t0 = time.perf_counter()
            await client.remote(bench_targets.noop)
            lat.append((time.perf_counter() - t0) * 1e6)
        cpu = meter.per_item(before, meter.snapshot(), calls)
        # What --calls_cpu's back-off reads (sandbox/calls_cpu.h, PinBackoff).
        out["noop_reader_rq_wait_us"] = round(
            (reader_run_queue_wait_ns(daemon_pid) - waited) / 1e3 / calls, 2)
        out["noop_p50_us"] = round(statistics.median(lat), 2)
        out["noop_p99_us"] = round(pct(lat, 0.99), 2)
        out["noop_cpu_us"] = cpu
        done, stop = 0, False

        async def caller():
            nonlocal done
            while not stop:
                await client.remote(bench_targets.noop)
                done += 1

        tasks = [asyncio.create_task(caller()) for _ in range(64)]
        await asyncio.sleep(0.2)
        before, n0, t0 = meter.snapshot(), done, time.perf_counter()
        await asyncio.sleep(seconds)
        after, n1, t1 = meter.snapshot(), done, time.perf_counter()
        stop = True
        await asyncio.gather(*tasks)
        out["c64_calls_per_s"] = round((n1 - n0) / (t1 - t0), 1)
        out["c64_cpu_us"] = meter.per_item(before, after, n1 - n0)
        out["calls_stream"] = type(client._stream).__name__  # FrameCallsStream: the frame wire
    print("RESULT " + json.dumps(out), flush=True)

asyncio.run(main())
"""


def reader_run_queue_wait_ns(daemon_pid: int) -> int:
    """The run-queue wait so far (schedstat's second field, ns) of the daemon's worker
    reader thread (agx-wrk-read), 0 if there is none."""
    for task in glob.glob(f"/proc/{daemon_pid}/task/*"):
        try:
            with open(f"{task}/comm") as f:
                if f.read().strip() != "agx-wrk-read":
                    continue
            with open(f"{task}/schedstat") as f:
                return int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return 0


class ThreadCpuMeter:
    """CPU of named processes over a phase, thread by thread (schedstat, ns): a thread
    that ends during the phase (the worker's pool retires idle threads) loses only its
    own part instead of taking its whole past off the process's sum (floors.CpuMeter
    sums the live threads, which can go negative here)."""

    def __init__(self, pids: dict[str, int | None]):
        self.pids = {name: pid for name, pid in pids.items() if pid}

    def snapshot(self) -> dict[str, dict[str, int]]:
        out = {}
        for name, pid in self.pids.items():
            threads = {}
            for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
                try:
                    with open(path) as f:
                        threads[path] = int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    continue  # ended meanwhile
            out[name] = threads
        return out

    @staticmethod
    def per_item(before: dict, after: dict, items: int) -> dict[str, float]:
        """{name: µs per item, "total": their sum}."""
        out = {}
        for name, threads in after.items():
            start = before.get(name, {})
            spent = sum(ns - start.get(tid, 0) for tid, ns in threads.items())
            out[name] = round(spent / 1e3 / items, 2) if items > 0 else None
        out["total"] = round(sum(v for v in out.values() if v is not None), 2)
        return out


def settings_table(cpu: int, spin_us: int) -> dict[str, dict]:
    """{name: {"daemon": extra flags, "host_cpu": CPU for both hosts or None,
    "cc_env": the C++ client's extra environment, "py_env" (optional): the Python host's,
    "main" (optional): run the binaries of --main-dir}}."""
    wait = {"AGENTIX_CALLS_CPU": f"wait:{cpu}"}
    spin = [f"--frames_spin_us={spin_us}", f"--worker_read_spin_us={spin_us}",
            f"--worker_intake_spin_us={spin_us}", "--calls_cpu=off"]
    return {
        "default": {"daemon": [], "host_cpu": None, "cc_env": {}, "default": True},
        "off": {"daemon": ["--calls_cpu=off"], "host_cpu": None, "cc_env": {}},
        "pin": {"daemon": [f"--calls_cpu={cpu}"], "host_cpu": cpu, "cc_env": {}},
        "pinwait": {"daemon": [f"--calls_cpu={cpu}"], "host_cpu": None, "cc_env": wait,
                    "py_env": wait},
        "pin_daemon": {"daemon": ["--calls_cpu=auto"], "host_cpu": None, "cc_env": {}},
        # The default up to stop 31: the daemon's auto and both hosts' pinned waits.
        "auto": {"daemon": ["--calls_cpu=auto"], "host_cpu": None, "cc_env": {}, "default": True},
        # The probe's choice (the daemon's default since stop 32, named: its
        # figures are logged and read); the hosts' default settings follow it.
        "probe": {"daemon": ["--calls_cpu=probe"], "host_cpu": None, "cc_env": {}, "default": True,
                  "probe": True},
        "pin_daemon_main": {"daemon": ["--calls_cpu=auto"], "host_cpu": None, "cc_env": {},
                            "main": True},
        "spin": {"daemon": spin, "host_cpu": None,
                 "cc_env": {"AGENTIX_CALLS_SPIN_US": str(spin_us)}},
        "spin_daemon": {"daemon": spin, "host_cpu": None, "cc_env": {}},
    }


def _binaries() -> dict[str, str]:
    found = {name: procs.runfile(path) for name, path in (
        ("sandboxd", "sandbox/agentix-sandboxd"), ("worker", "worker/agentix-worker"),
        ("cc", "testing/bench/cc_remote_calls"))}
    missing = [name for name, path in found.items() if not path]
    if missing:
        sys.exit(f"not in the runfiles: {missing} (run it with bazel run //testing/bench:wake_ab)")
    return {name: str(path) for name, path in found.items()}


def _pinned(cpu: int | None):
    """A preexec_fn pinning the child to `cpu` (None: nothing)."""
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def one_run(setting: dict, bins: dict, args, env: dict) -> dict:
    """One fresh daemon with the setting's flags: the Python host's figures, then the C++
    client's."""
    tmp = tempfile.mkdtemp(prefix="agx-wake-", dir="/tmp")
    sock = os.path.join(tmp, "sandboxd.sock")
    if setting.get("main"):
        bins = {**bins, "sandboxd": os.path.join(args.main_dir, "agentix-sandboxd"),
                "worker": os.path.join(args.main_dir, "agentix-worker")}
    # The probe's choice is logged at info level (no info logs per call).
    log_path = os.path.join(tmp, "sandboxd.log")
    log = open(log_path, "wb") if setting.get("probe") else None
    daemon = procs.start_process(
        [bins["sandboxd"], "--listen", f"unix://{sock}", f"--worker={bins['worker']}",
         f"--python_path={procs.bench_dir()}",
         "--log_level=info" if log else "--log_level=warning", *setting["daemon"]],
        env=env, stdout=log.fileno() if log else sys.stderr.fileno(),
        stderr=log.fileno() if log else None)
    try:
        procs.wait_listening(sock, daemon)
        # Both hosts pin their waits by default since stop 25: every setting but
        # `default` says what it wants (off unless it names another).
        base_env = dict(env)  # (main() removed the caller's AGENTIX_CALLS_CPU)
        if not setting.get("default"):
            base_env["AGENTIX_CALLS_CPU"] = "off"
        host_env = {**base_env, **setting.get("py_env", {})}
        if setting["host_cpu"] is not None:
            host_env["AGENTIX_CALLS_CPU"] = str(setting["host_cpu"])
        host = subprocess.run(
            [sys.executable, "-c", _HOST, sock, str(daemon.pid), str(args.calls),
             str(args.c64_seconds)],
            env=host_env, stdout=subprocess.PIPE, text=True, timeout=120, check=True)
        lines = [l for l in host.stdout.splitlines() if l.startswith("RESULT ")]
        if not lines:
            raise RuntimeError(f"no RESULT from the Python host: {host.stdout[-500:]!r}")
        out = {"python": json.loads(lines[-1][len("RESULT "):])}
        if out["python"].get("calls_stream") != "FrameCallsStream":
            raise RuntimeError(f"the Python host is not on the frame wire: {out['python']}")
        workers = procs.children(daemon.pid)
        meter = ThreadCpuMeter({"daemon": daemon.pid, "worker": workers[0] if workers else None})
        before = meter.snapshot()
        cc = subprocess.run([bins["cc"], f"--target=unix://{sock}", f"--noops={args.calls}"],
                            env={**base_env, **setting["cc_env"]}, stdout=subprocess.PIPE, text=True, timeout=120, check=True,
                            preexec_fn=_pinned(setting["host_cpu"]))
        figures = json.loads([l for l in cc.stdout.splitlines() if l.strip()][-1])
        if figures.get("calls_wire") != "frames":
            raise RuntimeError(f"the C++ client is not on the frame wire: {figures}")
        figures["cpu_us"] = meter.per_item(before, meter.snapshot(), figures["calls"])
        figures["cpu_us"]["client"] = figures.pop("noop_cpu_us_per_call")
        out["cc"] = figures
        if log:
            out["probe"] = probe_choice(log_path)
        return out
    finally:
        procs.stop_process(daemon)
        if log:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)


PROBE_CHOICES = ("pin", "pin_daemon", "off")


def probe_choice(log_path: str) -> dict:
    """--calls_cpu=probe's choice and figures from the daemon's log line:
    {"choice_<name>": 1, "same_cpu_us", "cross_cpu_us", "affinity_us", "probe_ms"}."""
    with open(log_path, errors="replace") as f:
        found = re.search(r"calls_cpu probe: (\w+) \(.*\); same-CPU round trip ([\d.]+) us, cross-CPU "
                          r"([\d.]+) us, sched_setaffinity ([\d.]+) us, \d+ CPUs \(-?\d+ idle\), ([\d.]+) ms",
                          f.read())
    if not found:
        return {}
    out = {f"choice_{name}": int(found.group(1) == name) for name in PROBE_CHOICES}
    for key, value in zip(("same_cpu_us", "cross_cpu_us", "affinity_us", "probe_ms"), found.groups()[1:]):
        out[key] = float(value)
    return out


def floor_round(cpu: int, env: dict) -> dict:
    """The floors of one round (small messages only), two of them also pinned to `cpu`."""
    flags = ["--small-bytes=64", "--big-mib=", "--concurrency="]
    pinned = {"floor_pinned": [], "floor_relay_pinned": ["--relay"]}  # to `cpu`, below
    out = {}
    for name, (program, own) in floors.FLOOR_PROGRAMS.items():
        if name not in pinned:
            out[name] = floors.run_floor(program, [*own, *flags], quick=True, env=env, log=_quiet)
    for name, own in pinned.items():
        binary = procs.runfile("testing/bench/floor/unix_pingpong")
        out[name] = floors.run_json(["taskset", "-c", str(cpu), binary, *own, *flags, "--quick"],
                                    env=env, log=_quiet)
    return {name: {k: v for k, v in figures.items()
                   if k in ("noop_p50_us", "noop_p99_us", "noop_cpu_us_per_call")}
            for name, figures in out.items()}


def _quiet(_message: str) -> None:
    pass


def flatten(run: dict) -> dict[str, float]:
    """One run's figures as {key: number}: python_noop_p50_us, cc_cpu_us_daemon, ..."""
    out = {}
    for client, figures in run.items():
        for key, value in figures.items():
            if isinstance(value, dict):
                for part, number in value.items():
                    out[f"{client}_{key}_{part}"] = number
            elif isinstance(value, (int, float)) and key != "calls":
                out[f"{client}_{key}"] = value
    return out


def median(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(values), 3) if values else None


def summarise(rounds: list[dict], names: list[str]) -> dict:
    """Per setting: medians, ratios to `off` and to the floors (both per round, then the
    median over rounds)."""
    report = {}
    for name in names:
        runs = [r["runs"].get(name) for r in rounds if r["runs"].get(name)]
        keys = sorted({k for run in runs for k in run})
        entry = {"medians": {k: median([run.get(k) for run in runs]) for k in keys}}
        if name != "off":
            entry["over_off"] = {k: median([
                r["runs"][name][k] / r["runs"]["off"][k] for r in rounds
                if r["runs"].get(name) and r["runs"].get("off")
                and r["runs"][name].get(k) and r["runs"]["off"].get(k)]) for k in keys}
        floors_of = {}
        for client, key in (("python", "python_noop_p50_us"), ("cc", "cc_noop_p50_us")):
            for floor_name in ("floor", "floor_relay", "floor_grpc", "floor_pinned",
                               "floor_relay_pinned"):
                floors_of[f"{client}_noop_p50_over_{floor_name}"] = median([
                    r["runs"][name][key] / r["floors"][floor_name]["noop_p50_us"]
                    for r in rounds if r["runs"].get(name) and r["runs"][name].get(key)
                    and (r.get("floors") or {}).get(floor_name)])
        entry["over_floors"] = floors_of
        python_p50 = entry["medians"].get("python_noop_p50_us")
        over_floor = floors_of.get("python_noop_p50_over_floor")
        over_grpc = floors_of.get("cc_noop_p50_over_floor_grpc")
        # Issue 25's noop targets and issue 22's C++ one, as this run measured them.
        entry["targets"] = {
            "python_noop_p50_at_most_100us": None if python_p50 is None else python_p50 <= 100,
            "python_noop_p50_at_most_2_5x_floor": None if over_floor is None else over_floor <= 2.5,
            "cc_noop_p50_at_most_1_5x_floor_grpc": None if over_grpc is None else over_grpc <= 1.5,
        }
        entry["runs"] = len(runs)
        report[name] = entry
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=1000,
                        help="sequential noops per client per run")
    parser.add_argument("--c64-seconds", type=float, default=1.0,
                        help="timed window of the 64-caller phase per run")
    parser.add_argument("--settings", default="off,pin,pin_daemon,spin,spin_daemon",
                        help="comma-separated, from: default, off, pin, pinwait, pin_daemon, probe, "
                             "pin_daemon_main, spin, spin_daemon")
    parser.add_argument("--main-dir", default="",
                        help="a directory with an older agentix-sandboxd and agentix-worker, "
                             "for the pin_daemon_main setting")
    parser.add_argument("--cpu", default="auto",
                        help="the CPU of the pin settings: a number or auto (the highest "
                             "allowed, as --calls_cpu=auto)")
    parser.add_argument("--spin-us", type=int, default=50, help="the spin setting's window")
    parser.add_argument("--budget-s", type=float, default=190.0,
                        help="no new round starts after this many seconds")
    args = parser.parse_args(argv)
    cpu = max(os.sched_getaffinity(0)) if args.cpu == "auto" else int(args.cpu)
    table = settings_table(cpu, args.spin_us)
    names = [n.strip() for n in args.settings.split(",") if n.strip()]
    unknown = [n for n in names if n not in table]
    if unknown or "off" not in names:
        parser.error(f"settings must include off and come from {sorted(table)} (got {unknown})")
    if "pin_daemon_main" in names and not args.main_dir:
        parser.error("pin_daemon_main needs --main-dir")
    bins = _binaries()
    env = dict(os.environ, GLIBC_TUNABLES=procs.MALLOC_TUNABLES,
               PYTHONPATH=os.pathsep.join([str(procs.bench_dir())] + sys.path[1:]))
    env.pop("AGENTIX_CALLS_CPU", None)
    env.pop("AGENTIX_CALLS_SPIN_US", None)
    env.pop("AGENTIX_CALLS_WIRE", None)  # the frame wire (auto): the path under test
    start = time.monotonic()
    load_start = procs.loadavg()
    rounds, errors = [], []
    for index in range(args.rounds):
        if index and time.monotonic() - start > args.budget_s:
            errors.append(f"stopped after {index} rounds (--budget-s {args.budget_s})")
            break
        shift = index % len(names)
        order = names[shift:] + names[:shift]
        this = {"runs": {}, "order": order}
        for name in order:
            try:
                this["runs"][name] = flatten(one_run(table[name], bins, args, env))
            except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as error:
                errors.append(f"round {index + 1} {name}: {error}")
                continue
            run = this["runs"][name]
            print(f"round {index + 1} {name:<10} python p50 {run.get('python_noop_p50_us')} "
                  f"p99 {run.get('python_noop_p99_us')} cpu {run.get('python_noop_cpu_us_total')} "
                  f"rq {run.get('python_noop_reader_rq_wait_us')} "
                  f"c64 {run.get('python_c64_calls_per_s')}/s | cc p50 {run.get('cc_noop_p50_us')} "
                  f"p99 {run.get('cc_noop_p99_us')} cpu {run.get('cc_cpu_us_total')}"
                  + "".join(f" | probe chose {c}" for c in PROBE_CHOICES if run.get(f"probe_choice_{c}")),
                  flush=True)
        try:
            this["floors"] = floor_round(cpu, env)
            print(f"round {index + 1} floors " + ", ".join(
                f"{k} {v['noop_p50_us']}" for k, v in this["floors"].items()), flush=True)
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as error:
            errors.append(f"round {index + 1} floors: {error}")
        rounds.append(this)
    report = {
        "settings": summarise(rounds, names),
        "floors": {name: {"noop_p50_us": median([(r.get("floors") or {}).get(name, {}).get(
            "noop_p50_us") for r in rounds])} for name in dict.fromkeys(
            (*floors.FLOOR_PROGRAMS, "floor_pinned", "floor_relay_pinned"))},
        "cpu": cpu,
        "spin_us": args.spin_us,
        "rounds": len(rounds),
        "calls": args.calls,
        "load": {"start": load_start, "end": procs.loadavg()},
        "seconds": round(time.monotonic() - start, 1),
        "machine": procs.machine(),
    }
    if errors:
        report["errors"] = errors
    for name, entry in report["settings"].items():
        med = entry["medians"]
        print(f"{name:<10} python p50 {med.get('python_noop_p50_us')} p99 "
              f"{med.get('python_noop_p99_us')} cpu/call {med.get('python_noop_cpu_us_total')} "
              f"c64 {med.get('python_c64_calls_per_s')}/s | cc p50 {med.get('cc_noop_p50_us')} "
              f"p99 {med.get('cc_noop_p99_us')} cpu/call {med.get('cc_cpu_us_total')}")
        over = entry.get("over_off") or {}
        if over:
            print(f"{'':<10} over off: python p50 {over.get('python_noop_p50_us')} cpu "
                  f"{over.get('python_noop_cpu_us_total')} c64 {over.get('python_c64_calls_per_s')}"
                  f" | cc p50 {over.get('cc_noop_p50_us')} cpu {over.get('cc_cpu_us_total')}")
        chose = {c: sum(int((r["runs"].get(name) or {}).get(f"probe_choice_{c}", 0)) for r in rounds)
                 for c in PROBE_CHOICES}
        if any(chose.values()):
            entry["probe_chose"] = chose
            print(f"{'':<10} the probe chose {chose}; same-CPU {med.get('probe_same_cpu_us')} us, "
                  f"cross-CPU {med.get('probe_cross_cpu_us')} us, sched_setaffinity "
                  f"{med.get('probe_affinity_us')} us, {med.get('probe_probe_ms')} ms (medians)")
        fl = entry["over_floors"]
        print(f"{'':<10} targets {entry['targets']}")
        print(f"{'':<10} python/floor {fl.get('python_noop_p50_over_floor')} "
              f"/floor_relay {fl.get('python_noop_p50_over_floor_relay')} | cc/floor_grpc "
              f"{fl.get('cc_noop_p50_over_floor_grpc')} /floor_relay "
              f"{fl.get('cc_noop_p50_over_floor_relay')}")
    print(json.dumps(report), flush=True)
    return 1 if errors and not rounds else 0


if __name__ == "__main__":
    sys.exit(main())
