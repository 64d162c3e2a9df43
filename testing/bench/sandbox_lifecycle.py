"""Sandbox lifecycle benchmark: bundle build, create -> first call, delete.

    bazel run //testing/bench:sandbox_lifecycle                   # 20 runs, busybox root
    bazel run //testing/bench:sandbox_lifecycle -- --quick        # 3 runs, no repeated build
    bazel run //testing/bench:sandbox_lifecycle -- --image host   # the host's root, read-only
    bazel run //testing/bench:sandbox_lifecycle -- --bundle DIR   # skip building

What it does (see README.md, "Sandbox lifecycle"):

1. Builds examples/hello with the bundler (//bundler:bundler from the runfiles) into an
   empty output directory ("fresh"), then again into the same directory ("repeated"),
   and compares the tarballs' sha256.
2. N times: `LocalProvider.create(SandboxConfig(image, bundle))`, then the first
   `remote(hello_agentix.tools.add, 1, 2)` (which waits for the rest of the sandbox's
   worker boot: bootstrap.sh's --prestart-worker starts it with the daemon), then
   `aclose()` + `delete()`. Every sandbox is fresh. One unmeasured warm-up run comes first.
3. Splits the time with timestamps: the provider's own steps (hooked, not copied),
   the daemon's log lines (`--log-level debug`: listening, worker started, worker
   ready; wall clock, ms) and a few single-purpose probes run under the same bwrap
   command line (`true`, `agentix-sandboxd --version`, the bundle's python).

Output: human-readable lines, then, LAST, one JSON object (keys in README.md).
Bounded: every step has a timeout and the whole run a deadline; every sandbox is
deleted on the way out (error, timeout, SIGTERM or Ctrl-C included).
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

# As in remote_calls.py: import the siblings from the runfiles tree, not the source tree.
sys.path[0] = os.path.dirname(os.path.abspath(__file__))

import procs  # noqa: E402

TARGET_MS = 300.0
ISSUE25_TARGET_MS = 80.0          # issue 25: cold create -> first call, median
BUNDLE_TIMEOUT_S = 900.0          # one bundler run
READY_TIMEOUT_S = 30.0            # LocalProviderConfig.ready_timeout
CALL_TIMEOUT_S = 60.0             # the first call (includes the worker's start)
DELETE_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 20.0
RUN_DEADLINE_S = {"full": 900.0, "quick": 300.0}  # all sandbox runs together
PROBE_RUNS = 5


def log(message: str) -> None:
    print(f"[lifecycle] {message}", flush=True)


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 1) if values else None


def _p90(values):
    """Nearest-rank 90th percentile."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    rank = max(1, -(-9 * len(values) // 10))  # ceil(0.9 n)
    return round(values[rank - 1], 1)


# --------------------------------------------------------------------------- inputs


def _repo_root() -> Path:
    """The source tree, when run as `python3 testing/bench/sandbox_lifecycle.py`."""
    return Path(os.path.abspath(__file__)).parents[2]


def _find(relpath: str, bazel_bin: bool = True) -> Path | None:
    """`relpath` in the runfiles, else in the source tree / bazel-bin (direct runs)."""
    found = procs.runfile(relpath)
    if found:
        return found
    for base in ([_repo_root() / "bazel-bin"] if bazel_bin else []) + [_repo_root()]:
        if (base / relpath).exists():
            return base / relpath
    return None


def _example() -> Path | None:
    """examples/hello in the source tree. It has no BUILD file, so it is not in the
    runfiles: under `bazel run` the workspace is $BUILD_WORKSPACE_DIRECTORY; under
    `bazel test` (processwrapper sandbox) this file's runfiles symlink resolves into it."""
    candidates = []
    if os.environ.get("BUILD_WORKSPACE_DIRECTORY"):
        candidates.append(Path(os.environ["BUILD_WORKSPACE_DIRECTORY"]))
    candidates += [Path(os.path.realpath(__file__)).parents[2], _repo_root()]
    for root in candidates:
        if (root / "examples" / "hello" / "pyproject.toml").is_file():
            return root / "examples" / "hello"
    return None


def _tools() -> dict:
    tools = {
        "bundler": _find("bundler/bundler"),
        "sandboxd": _find("sandbox/agentix-sandboxd"),
        "worker": _find("worker/agentix-worker"),
        "example": _example(),
    }
    wheel_dir = _find("host/python")
    wheels = sorted(wheel_dir.glob("agentix-*.whl")) if wheel_dir else []
    tools["wheel"] = wheels[0] if wheels else None
    return tools


def _copy_example(example: Path, dest: Path) -> Path:
    """A plain copy of examples/hello (runfiles are symlinks; no caches, no dist/)."""
    shutil.copytree(example, dest, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "dist", "*.egg-info", "build"))
    return dest


def _busybox_root(dest: Path) -> Path:
    """What tools/quickstart uses as the task image: bin/busybox and bin/sh, nothing else."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(busybox, dest / "bin" / "busybox")
    os.symlink("busybox", dest / "bin" / "sh")
    return dest


# --------------------------------------------------------------------------- bundle build

_STAGE = re.compile(r"^\[bundler\] (\w+): .*?([\d.]+) s$")


def build_bundle(tools: dict, project: Path, output: Path) -> dict:
    """One bundler run; returns wall time, the summary (sha256...) and per-stage times."""
    argv = [str(tools["bundler"]), "build", str(project), "--output", str(output),
            f"--sandboxd={tools['sandboxd']}", f"--worker={tools['worker']}",
            f"--wheel={tools['wheel']}"]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        out, err = proc.communicate(timeout=BUNDLE_TIMEOUT_S)
    except BaseException:
        procs.stop_process(proc, grace_s=2.0, group=True)
        raise
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"bundler exited with {proc.returncode}:\n{err[-4000:]}")
    summary = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    stages = {}
    for line in err.splitlines():
        match = _STAGE.match(line.strip())
        if match and match.group(1) != "done":
            stages[match.group(1)] = float(match.group(2))
    return {"seconds": round(elapsed, 2), "sha256": summary.get("sha256"),
            "digest": summary.get("digest"), "stages_s": stages}


# --------------------------------------------------------------------------- sandbox runs

_LOG_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) agentix-sandboxd (\w) (.*)$")


def _log_times(text: str, near: float) -> dict:
    """Wall-clock times (epoch s) of the daemon's milestones in its log."""
    day = datetime.fromtimestamp(near, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    found = {}
    for line in text.splitlines():
        match = _LOG_LINE.match(line.strip())
        if not match:
            continue
        h, m, s, ms = (int(match.group(i)) for i in range(1, 5))
        t = day.timestamp() + h * 3600 + m * 60 + s + ms / 1000
        if t - near > 43200:   # the run crossed midnight
            t -= 86400
        elif near - t > 43200:
            t += 86400
        message = match.group(6)
        if message.startswith("serving agentix.runtime.v1"):
            found.setdefault("listening", t)
        elif re.match(r"worker \S+ \(generation \d+\) started as pid", message):
            found.setdefault("worker_started", t)
        elif re.match(r"worker \S+ ready", message):
            found.setdefault("worker_ready", t)
    return found


def _ms(a, b):
    return None if a is None or b is None else round((b - a) * 1000, 1)


class Timeline:
    """Timestamps of the current run, filled by the hooks below."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.marks = {}
        self.probes = 0

    def mark(self, name):
        self.marks.setdefault(name, time.time())


TIMELINE = Timeline()


def _install_hooks(local_mod, timeline: Timeline):
    """Hooks into LocalProvider (wrapping, not copying, its steps): when the sandbox
    process was started, when the first health probe went out (the socket exists),
    when the SIGTERM path saw bwrap exit. Returns the provider class to use."""

    if getattr(local_mod, "_lifecycle_bench_provider", None) is not None:
        return local_mod._lifecycle_bench_provider  # installed once per process
    health_ok = getattr(local_mod, "_health_ok", None)
    if health_ok is not None:
        async def timed_health_ok(socket_path, timeout, **kwargs):
            timeline.mark("first_probe")
            timeline.marks["last_probe"] = time.time()
            timeline.probes += 1
            ok = await health_ok(socket_path, timeout, **kwargs)
            if ok:
                timeline.mark("healthy")
            return ok
        local_mod._health_ok = timed_health_ok

    exited = getattr(local_mod, "_exited", None)
    if exited is not None:
        async def timed_exited(process, timeout):
            done = await exited(process, timeout)
            timeline.mark("bwrap_exited")
            return done
        local_mod._exited = timed_exited

    class TimedLocalProvider(local_mod.InProcessLocalProvider):
        async def _wait_ready(self, running):
            # Called right after subprocess.Popen of the sandbox tree.
            timeline.mark("spawned")
            timeline.marks["log_path"] = running.log_path
            return await super()._wait_ready(running)

    local_mod._lifecycle_bench_provider = TimedLocalProvider
    return TimedLocalProvider


async def one_run(provider, config, tools_module, timeline: Timeline) -> dict:
    """create -> first add() -> aclose -> delete, with timestamps."""
    timeline.reset()
    sandbox = None
    r = {}
    t0w, t0 = time.time(), time.perf_counter()
    try:
        sandbox = await provider.create(config)
        t1w, t1 = time.time(), time.perf_counter()
        value = await asyncio.wait_for(sandbox.remote(tools_module.add, 1, 2), CALL_TIMEOUT_S)
        t2w, t2 = time.time(), time.perf_counter()
        if value != 3:
            raise RuntimeError(f"add(1, 2) returned {value!r}")
        log_path = timeline.marks.get("log_path")
        try:
            daemon = _log_times(Path(log_path).read_text(errors="replace"), t0w) if log_path else {}
        except OSError:
            daemon = {}
    finally:
        if sandbox is not None:
            t3 = time.perf_counter()
            try:
                await asyncio.wait_for(sandbox.aclose(), DELETE_TIMEOUT_S)
            finally:
                t4w, t4 = time.time(), time.perf_counter()
                await asyncio.wait_for(provider.delete(sandbox.sandbox_id), DELETE_TIMEOUT_S)
                t5 = time.perf_counter()
    m = timeline.marks
    r["create_ms"] = round((t1 - t0) * 1000, 1)
    r["first_call_ms"] = round((t2 - t1) * 1000, 1)
    r["create_to_first_call_ms"] = round((t2 - t0) * 1000, 1)
    r["aclose_ms"] = round((t4 - t3) * 1000, 1)
    r["delete_ms"] = round((t5 - t4) * 1000, 1)
    r["health_probes"] = timeline.probes
    # create(): host prep (bundle/root checks, prune, cgroups, owner.json, argv) -> Popen
    r["create.prepare_ms"] = _ms(t0w, m.get("spawned"))
    # Popen -> daemon logs "serving": bwrap + namespaces + mounts, bootstrap.sh, the
    # daemon's exec (bundle loader, ~90 libraries), gRPC server start
    r["create.spawn_to_listening_ms"] = _ms(m.get("spawned"), daemon.get("listening"))
    # "serving" -> health SERVING seen by the host (woken by that log line; a fresh channel,
    # which the first call then takes)
    r["create.listening_to_healthy_ms"] = _ms(daemon.get("listening"), m.get("healthy"))
    # of which: the last health probe itself (a fresh grpc.aio channel + Check)
    r["create.health_probe_ms"] = _ms(m.get("last_probe"), m.get("healthy"))
    r["create.healthy_to_return_ms"] = _ms(m.get("healthy"), t1w)
    # create() returned -> the daemon started the worker: negative, since the daemon starts
    # it ahead of the first connection (README.md's table; the key keeps its old name)
    r["call.connect_to_daemon_ms"] = _ms(t1w, daemon.get("worker_started"))
    # the worker: embedded CPython init, venv, driver imports, then the ready frame
    r["call.worker_boot_ms"] = _ms(daemon.get("worker_started"), daemon.get("worker_ready"))
    # ready -> result on the host: import hello_agentix.tools, run add, reply
    r["call.ready_to_result_ms"] = _ms(daemon.get("worker_ready"), t2w)
    # delete: SIGTERM -> bwrap exited (daemon drains, worker finalises), then cleanup
    r["delete.sigterm_to_exit_ms"] = _ms(t4w, m.get("bwrap_exited"))
    return r


async def probe_bwrap(provider, local_mod, nix_dir: Path, root: Path, command: list[str],
                      runs: int, importtime: bool = False) -> dict:
    """Runs `command` under the provider's own bwrap command line (without the cgroup
    step), to time pieces of create in isolation. Returns medians in ms, or an error."""
    bwrap = shutil.which(provider.config.bwrap)
    times = []
    with tempfile.TemporaryDirectory(prefix="agx-probe-", dir="/tmp"):
        argv = provider._argv(bwrap, "local-probe", root, nix_dir)
        argv = argv[:-1] + command  # replace the entry point (bootstrap.sh)
        env = provider._sandbox_env("local-probe", None)
        for _ in range(runs):
            start = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env=env)
            try:
                _, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
            except BaseException:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                raise
            times.append((time.perf_counter() - start) * 1000)
            if proc.returncode != 0:
                return {"error": f"exit {proc.returncode}: {err.decode(errors='replace')[-300:]}"}
    result = {"median_ms": _median(times), "runs": runs}
    if importtime:  # -X importtime of the last run
        result["slowest_imports_ms"] = _slowest_imports(err.decode(errors="replace"))
    return result


async def probe_worker(provider, nix_dir: Path, root: Path, runs: int) -> dict:
    """Starts the bundle's agentix-worker directly under the provider's bwrap command line,
    the way the daemon does (a socketpair end as --channel-fd, --venv, --python-home),
    and times spawn -> the first bytes on the channel (its ready frame). (Its interpreter
    is isolated from the environment, so PYTHONPROFILEIMPORTTIME cannot be used here.)"""
    import socket

    bwrap = shutil.which(provider.config.bwrap)
    times = []
    with tempfile.TemporaryDirectory(prefix="agx-probe-", dir="/tmp"):
        base_argv = provider._argv(bwrap, "local-probe", root, nix_dir)[:-1]
        for _ in range(runs):
            parent, child = socket.socketpair()
            env = provider._sandbox_env("local-probe", None)
            argv = base_argv + ["/nix/runtime/bin/agentix-worker", f"--channel-fd={child.fileno()}",
                                "--worker-id=probe", "--venv=/nix/runtime/venv",
                                "--python-home=/nix/runtime/python"]
            start = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env=env, pass_fds=(child.fileno(),))
            child.close()
            try:
                loop = asyncio.get_running_loop()
                parent.setblocking(False)
                first = await asyncio.wait_for(loop.sock_recv(parent, 1), PROBE_TIMEOUT_S)
                elapsed = (time.perf_counter() - start) * 1000
                parent.close()  # EOF: the worker exits
                _, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
            except BaseException:
                parent.close()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                raise
            if not first:
                return {"error": f"channel closed before ready: {err.decode(errors='replace')[-300:]}"}
            times.append(elapsed)
    return {"median_ms": _median(times), "runs": runs}


def _slowest_imports(text: str, top: int = 15) -> dict:
    """The slowest imports (cumulative ms, up to 4 levels deep, nesting shown by
    leading dots) from `-X importtime` output."""
    found = []
    for line in text.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)", line)
        if match and len(match.group(3)) <= 6:
            found.append((int(match.group(2)) / 1000, "." * (len(match.group(3)) // 2) + match.group(4)))
    return {name: round(ms, 1) for ms, name in sorted(found, reverse=True)[:top]}


# The machine's floor for a cold sandbox, timed beside every measured run: `busybox true`
# (bwrap alone: namespaces, mounts) and the bundle's `python -c pass` (the least a
# sandboxed Python takes). A cold create -> first call holds both (bwrap, then the
# daemon and an embedded CPython), so its ratio to them says how far above the
# machine's own cost it is in that minute, whatever this VM's speed then.
BWRAP_TRUE = ["/nix/runtime/bin/busybox", "true"]
PYTHON_PASS = ["/nix/runtime/venv/bin/python", "-c", "pass"]
# name -> command; a run's sample gets `floor.<name>_ms` and
# `ratio.create_to_first_call_over_<name>`.
FLOOR_COMMANDS = (("bwrap_true", BWRAP_TRUE), ("bwrap_python", PYTHON_PASS))


def _ratio_name(name: str) -> str:
    return f"create_to_first_call_over_{name}"


async def paired_floor(provider, local_mod, nix_dir: Path, root: Path, total_ms: float) -> dict:
    """The floor's commands once each, right after one measured run, and that run's
    create -> first call over each (`floor.*` and `ratio.*` keys of its sample). A floor
    that fails raises: without it the run's ratios would be missing, not smaller."""
    out = {}
    for name, command in FLOOR_COMMANDS:
        probe = await probe_bwrap(provider, local_mod, nix_dir, root, command, 1)
        if "error" in probe:
            raise RuntimeError(f"the floor's {' '.join(command)} under bwrap failed: {probe['error']}")
        floor_ms = round(probe["median_ms"], 1)
        out[f"floor.{name}_ms"] = floor_ms
        out[f"ratio.{_ratio_name(name)}"] = round(total_ms / floor_ms, 2)
    return out


def _summary(runs: list[dict]) -> dict:
    keys = list(runs[0].keys()) if runs else []
    return {k: {"median": _median([r[k] for r in runs]), "p90": _p90([r[k] for r in runs])}
            for k in keys}


async def measure_sandboxes(args, bundle_dir: Path, image: str, image_label: str,
                            runs: int, warmup: bool, probes: bool) -> dict:
    from agentix import SandboxConfig  # //host/python:agentix
    # The in-process provider: this benchmark times its steps (bwrap, health
    # polls); the provider service's figures are //testing/bench:provider's.
    import agentix.provider._local_inprocess as local_mod
    from hello_agentix import tools as hello_tools  # same module::qualname as in the sandbox

    timeline = TIMELINE
    provider_cls = _install_hooks(local_mod, timeline)
    provider = provider_cls(local_mod.LocalProviderConfig(ready_timeout=READY_TIMEOUT_S))
    config = SandboxConfig(image=image, bundle=str(bundle_dir),
                           env={"AGENTIX_LOG_LEVEL": args.log_level})
    results = []
    result = {"image": image_label, "runs": runs}
    try:
        if warmup:
            warm = await one_run(provider, config, hello_tools, timeline)
            result["warmup_create_to_first_call_ms"] = warm["create_to_first_call_ms"]
            log(f"[{image_label}] warm-up run (not counted): create {warm['create_ms']:.0f} ms, "
                f"first call {warm['first_call_ms']:.0f} ms, delete {warm['delete_ms']:.0f} ms")
        if probes:  # the floor's and the probes' bwrap command line
            nix_dir = provider._bundle_nix_dir(str(bundle_dir))
            root = provider._root_dir(image)
        for i in range(runs):
            r = await one_run(provider, config, hello_tools, timeline)
            floor_text = ""
            if probes:
                r.update(await paired_floor(provider, local_mod, nix_dir, root,
                                            r["create_to_first_call_ms"]))
                floor_text = (f"; floor: bwrap true {r['floor.bwrap_true_ms']:.0f} ms, "
                              f"python -c pass {r['floor.bwrap_python_ms']:.0f} ms")
            results.append(r)
            log(f"[{image_label}] run {i + 1}/{runs}: create {r['create_ms']:.0f} ms + first call "
                f"{r['first_call_ms']:.0f} ms = {r['create_to_first_call_ms']:.0f} ms; "
                f"delete {r['delete_ms']:.0f} ms{floor_text} "
                f"(load {procs.loadavg()[0] if procs.loadavg() else '?'})")
        if probes:
            result["probes"] = {}
            for name, command in (
                ("bwrap_true", BWRAP_TRUE),
                ("bwrap_sandboxd_version", ["/nix/runtime/bin/agentix-sandboxd", "--version"]),
                ("bwrap_python_empty", PYTHON_PASS),
                # what worker/driver/ imports before its ready frame: stdlib modules only
                # (-X importtime); the venv's agentix (.utils.trace, .sio) comes after
                # ready, on the worker's warm-up thread (worker/driver/deferred.py)
                ("bwrap_python_worker_imports", [
                    "/nix/runtime/venv/bin/python", "-X", "importtime", "-c",
                    "import asyncio, calendar, contextvars, importlib, inspect, io, logging.handlers, "
                    "os, pickle, socket, sys, threading, traceback, types, concurrent.futures, datetime"]),
                ("bwrap_python_agentix_imports", [
                    "/nix/runtime/venv/bin/python", "-X", "importtime", "-c",
                    "import asyncio, logging.handlers, pickle; "
                    "import agentix.utils.context, agentix.utils.trace, agentix.sio"]),
            ):
                try:
                    result["probes"][name] = await probe_bwrap(
                        provider, local_mod, nix_dir, root, command, PROBE_RUNS,
                        importtime="importtime" in command)
                except Exception as error:  # a probe is extra information, never fatal
                    result["probes"][name] = {"error": f"{type(error).__name__}: {error}"}
                log(f"[{image_label}] probe {name}: {result['probes'][name]}")
            try:
                result["probes"]["bwrap_worker_to_ready"] = await probe_worker(
                    provider, nix_dir, root, PROBE_RUNS)
            except Exception as error:
                result["probes"]["bwrap_worker_to_ready"] = {"error": f"{type(error).__name__}: {error}"}
            log(f"[{image_label}] probe bwrap_worker_to_ready: {result['probes']['bwrap_worker_to_ready']}")
    finally:
        await asyncio.shield(provider.aclose())  # deletes anything still running
    sampled = ["create_to_first_call_ms", "create_ms", "first_call_ms", "delete_ms"]
    if probes:
        sampled += [f"floor.{name}_ms" for name, _ in FLOOR_COMMANDS]
    result["samples"] = {k: [r[k] for r in results] for k in sampled}
    result["stats"] = _summary(results)
    return result


# --------------------------------------------------------------------------- driver


def _print_stats(label: str, stats: dict) -> None:
    log(f"{label}: median / p90 in ms")
    for key, value in stats.items():
        if key == "health_probes":
            continue
        log(f"  {key:36s} {value['median']!s:>8} / {value['p90']!s:>8}")


async def run_all(args, tools: dict, work: Path, report: dict) -> None:
    # 1. bundle
    project = _copy_example(tools["example"], work / "hello")
    sys.path.insert(0, str(project))  # hello_agentix.tools on the host, as in the sandbox
    if args.bundle:
        bundle_dir = Path(args.bundle).resolve()
        log(f"using the existing bundle {bundle_dir} (no build measured)")
    else:
        bundle_dir = work / "bundle"
        bundle_dir.mkdir()
        log(f"building examples/hello into an empty {bundle_dir} ...")
        fresh = await asyncio.to_thread(build_bundle, tools, project, bundle_dir)
        report["bundle_build_s"] = fresh["seconds"]
        report["details"]["bundle"] = {"fresh": fresh}
        log(f"bundle build (fresh): {fresh['seconds']:.1f} s, sha256 {fresh['sha256']}, stages {fresh['stages_s']}")
        if not args.quick:
            log("building again into the same directory ...")
            again = await asyncio.to_thread(build_bundle, tools, project, bundle_dir)
            report["bundle_build_repeat_s"] = again["seconds"]
            report["details"]["bundle"]["repeat"] = again
            report["details"]["bundle"]["sha256_identical"] = again["sha256"] == fresh["sha256"]
            log(f"bundle build (repeated): {again['seconds']:.1f} s, sha256 "
                f"{'identical' if again['sha256'] == fresh['sha256'] else 'DIFFERENT: ' + str(again['sha256'])}")

    # 2. sandboxes
    if args.image == "busybox":
        image = str(_busybox_root(work / "busybox-root"))
    else:
        image = args.image
    runs = 3 if args.quick else args.runs
    deadline = RUN_DEADLINE_S["quick" if args.quick else "full"]
    main = await asyncio.wait_for(
        measure_sandboxes(args, bundle_dir, image, args.image, runs, warmup=True, probes=True),
        deadline)
    report["details"]["main"] = main
    _print_stats(f"image {args.image}, {runs} runs", main["stats"])
    st = main["stats"]
    report["create_to_first_call_ms"] = st["create_to_first_call_ms"]["median"]
    report["delete_ms"] = st["delete_ms"]["median"]
    report["create_ms"] = st["create_ms"]["median"]
    report["first_call_ms"] = st["first_call_ms"]["median"]
    report["target_met"] = report["create_to_first_call_ms"] < TARGET_MS
    report["floor"] = {f"{name}_ms": st[f"floor.{name}_ms"]["median"] for name, _ in FLOOR_COMMANDS}
    # Medians of the per-run ratios (each run over the floor timed right after it).
    report["ratios"] = {_ratio_name(name): st[f"ratio.{_ratio_name(name)}"]["median"]
                        for name, _ in FLOOR_COMMANDS}
    report["targets_met"] = {
        "create_to_first_call_at_most_80ms": report["create_to_first_call_ms"] <= ISSUE25_TARGET_MS}
    report["details"]["p90"] = {k: st[k]["p90"] for k in
                                ("create_to_first_call_ms", "create_ms", "first_call_ms", "delete_ms")}

    # 3. the other root, fewer runs, for comparison
    other_runs = 0 if args.quick else min(args.compare_runs, runs)
    if other_runs and args.image != "host":
        other = await asyncio.wait_for(
            measure_sandboxes(args, bundle_dir, "host", "host", other_runs, warmup=False, probes=False),
            deadline)
        report["details"]["host_image"] = {k: other[k] for k in ("runs", "stats", "samples")}
        _print_stats(f"image host, {other_runs} runs", other["stats"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="measured sandboxes (default 20)")
    parser.add_argument("--quick", action="store_true",
                        help="3 runs, no repeated build, no host-image comparison")
    parser.add_argument("--image", default="busybox",
                        help="host | busybox (a root with only bin/busybox and bin/sh) | DIR")
    parser.add_argument("--bundle", help="use this existing bundle directory; skip building")
    parser.add_argument("--compare-runs", type=int, default=5,
                        help="runs with image=host for comparison (default 5; 0 = none)")
    parser.add_argument("--log-level", default="debug",
                        help="the daemon's log level (debug gives the worker timestamps)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (bundle)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")

    tools = _tools()
    needed = ["example"] + ([] if args.bundle else ["bundler", "sandboxd", "worker", "wheel"])
    missing = [k for k in needed if not tools[k]]
    if missing:
        log(f"not found: {', '.join(missing)} (run through `bazel run //testing/bench:sandbox_lifecycle`)")
        return 2
    if shutil.which("bwrap") is None:
        log("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
        return 2

    report = {"create_to_first_call_ms": None, "delete_ms": None, "bundle_build_s": None,
              "bundle_build_repeat_s": None, "create_ms": None, "first_call_ms": None,
              "target_met": None, "floor": None, "ratios": None, "targets_met": None,
              "details": {"target_ms": TARGET_MS, "image": args.image,
                          "runs": 3 if args.quick else args.runs, "quick": args.quick,
                          "daemon_log_level": args.log_level,
                          "loadavg_start": procs.loadavg(), "machine": procs.machine(),
                          "started_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}}
    log(f"load average at start: {report['details']['loadavg_start']}; machine {report['details']['machine']}")
    work = Path(tempfile.mkdtemp(prefix="agx-lifecycle-", dir="/tmp"))
    try:
        code = procs.run_reported(lambda: run_all(args, tools, work, report), report, log)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report["details"]["loadavg_end"] = procs.loadavg()
    if report["create_to_first_call_ms"] is not None:
        met = report["targets_met"]["create_to_first_call_at_most_80ms"]
        log(f"create -> first call {report['create_to_first_call_ms']} ms (median) vs target "
            f"{TARGET_MS:.0f} ms: {'MET' if report['target_met'] else 'NOT MET'}; issue 25's "
            f"{ISSUE25_TARGET_MS:.0f} ms: {'met' if met else 'not met'}; "
            f"delete {report['delete_ms']} ms; bundle build {report['bundle_build_s']} s "
            f"(repeated {report['bundle_build_repeat_s']} s)")
        floor, ratios = report["floor"], report["ratios"]
        log(f"the floor beside each run (medians): bwrap true {floor['bwrap_true_ms']} ms, "
            f"python -c pass under bwrap {floor['bwrap_python_ms']} ms; create -> first call "
            f"over them {ratios['create_to_first_call_over_bwrap_true']}x and "
            f"{ratios['create_to_first_call_over_bwrap_python']}x (medians of the runs' ratios)")
    print(json.dumps(report), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
