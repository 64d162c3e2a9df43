"""``agentix doctor``: can this machine bundle and run sandboxes?

Each check has a status: ``ok``, ``warn`` (works, with less: e.g. no engine
socket, so no docker backend) or ``fail`` (a local sandbox cannot run), a
detail, and for anything but ``ok`` the fix. Exit status 1 when a check
fails. Checks: Python, grpcio / protobuf / msgpack (against the requirements
the installed agentix declares, so doctor and pip agree), the native
transport, the binaries (the bundler, ``agentix-sandboxd``, ``agentix-worker``,
``agentix-providerd``), bubblewrap, user namespaces (a real ``bwrap`` run),
cgroups (v1 controllers or v2), the docker and podman engine sockets, and the
provider service's socket.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["Check", "declared_requirements", "run_checks", "run_doctor"]

# The dependencies checked, as (import name, distribution, Debian package). Their
# floors are not written here: they are the ones the installed agentix declares
# (Requires-Dist, from pyproject.toml), so doctor and pip cannot disagree.
_DEPENDENCIES = (
    ("grpc", "grpcio", "python3-grpcio"),
    ("google.protobuf", "protobuf", "python3-protobuf"),
    ("msgpack", "msgpack", "python3-msgpack"),
)
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*\(?\s*([^;()]*)\)?\s*(;.*)?$")
_CLAUSE = re.compile(r"^(~=|==|!=|<=|>=|<|>)\s*([0-9][0-9A-Za-z.*+!-]*)$")


@dataclass
class Check:
    name: str
    status: str  # "ok", "warn" or "fail"
    detail: str
    fix: str = ""


def _release(text: str) -> tuple[int, ...]:
    """The release numbers of a version ("4.21.12" -> (4, 21, 12); "1.0rc1" -> (1, 0))."""
    parts = []
    for piece in text.split("+")[0].split("."):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
        if match.end() < len(piece):
            break
    return tuple(parts)


def _satisfies(version: str, clause: str) -> bool:
    """Whether `version` meets one PEP 440 clause (``>=4.21.12``, ``==3.11.*``),
    compared on release numbers; a clause this does not read is taken as met."""
    match = _CLAUSE.match(clause.strip())
    if match is None:
        return True
    op, wanted = match.groups()
    have = _release(version)
    if wanted.endswith(".*"):
        prefix = _release(wanted[:-2])
        return (have[: len(prefix)] == prefix) == (op == "==")
    want = _release(wanted)
    if op == "~=":  # ~=X.Y.Z: >=X.Y.Z and ==X.Y.*
        return _satisfies(version, f">={wanted}") and have[: len(want) - 1] == want[:-1]
    width = max(len(have), len(want))
    have, want = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {"==": have == want, "!=": have != want, "<=": have <= want, ">=": have >= want,
            "<": have < want, ">": have > want}[op]


def declared_requirements() -> dict[str, str] | None:
    """The installed agentix's own dependencies (``Requires-Dist`` without
    extras) as {distribution: specifier}, e.g. ``{"protobuf": ">=4.21.12"}``;
    None when agentix has no installed metadata (a source tree on PYTHONPATH)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        lines = requires("agentix")
    except PackageNotFoundError:
        return None
    declared = {}
    for line in lines or []:
        match = _REQUIREMENT.match(line)
        if match is None or "extra" in (match.group(3) or ""):
            continue
        declared[match.group(1).lower().replace("_", "-")] = match.group(2).replace(" ", "")
    return declared


def _python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info < (3, 11):
        return Check("python", "fail", f"{sys.executable} is Python {version}", "use Python 3.11 or newer")
    return Check("python", "ok", f"{sys.executable} is Python {version}")


def _module(name: str, dist: str, debian: str, declared: dict[str, str] | None) -> Check:
    try:
        module = importlib.import_module(name)
    except Exception as error:  # ImportError, or a broken install
        return Check(dist, "fail", f"cannot import {name}: {error}",
                     f"apt-get install {debian} (or pip install {dist} in this environment)")
    # The distribution's version is what the requirement (and pip) speaks of;
    # the module's __version__ only when there is no metadata.
    try:
        from importlib.metadata import version as dist_version

        version = dist_version(dist)
    except Exception:
        version = getattr(module, "__version__", "") or "?"
    if declared is None:
        return Check(dist, "ok", f"{dist} {version} (agentix has no installed metadata: its floor is not checked)")
    wanted = declared.get(dist, "")
    if version == "?" or not wanted:
        return Check(dist, "ok", f"{dist} {version}")
    unmet = [clause for clause in wanted.split(",") if clause and not _satisfies(version, clause)]
    if unmet:
        return Check(dist, "fail", f"{dist} {version} does not satisfy {dist}{wanted}, which agentix requires",
                     f"upgrade {dist} (apt-get install {debian}, or pip install -U '{dist}{wanted}')")
    return Check(dist, "ok", f"{dist} {version} (agentix requires {wanted})")


def _native() -> Check:
    try:
        from agentix.runtime.client import _native_calls  # noqa: F401
    except Exception as error:
        return Check("native transport", "warn", f"not loaded ({error}); calls use grpc.aio (slower)",
                     "install the wheel built for this interpreter, or ignore: grpc.aio does the same job")
    return Check("native transport", "ok", "agentix.runtime.client._native_calls loaded")


def _binaries() -> list[Check]:
    from agentix.cli.build import BundleError, find_bundler
    from agentix.provider.local import find_providerd

    checks = []
    try:
        checks.append(Check("bundler", "ok", find_bundler()))
    except BundleError as error:
        checks.append(Check("bundler", "fail", "not found", str(error).split(": ", 1)[-1]))
    try:
        providerd = find_providerd()
        checks.append(Check("agentix-providerd", "ok", providerd))
    except FileNotFoundError as error:
        providerd = None
        checks.append(Check("agentix-providerd", "fail", "not found", str(error)))
    for name, rel in (("agentix-sandboxd", "sandbox/agentix-sandboxd"), ("agentix-worker", "worker/agentix-worker")):
        places = [Path(providerd).parent / name] if providerd else []
        on_path = shutil.which(name)
        if on_path:
            places.append(Path(on_path))
        if providerd and "bazel-bin" in providerd:
            tree = Path(providerd[: providerd.index("bazel-bin") + len("bazel-bin")])
            places.append(tree / rel)
        found = next((p for p in places if p.is_file() and os.access(p, os.X_OK)), None)
        if found is not None:
            checks.append(Check(name, "ok", str(found)))
        else:
            checks.append(Check(name, "warn", "not found beside agentix-providerd or on PATH",
                                "only needed to bundle (a bundle carries its own copy): install the agentix "
                                "package or `bazel build //sandbox:agentix-sandboxd //worker:agentix-worker`"))
    return checks


def _bubblewrap() -> list[Check]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return [Check("bubblewrap", "fail", "bwrap is not on PATH", "apt-get install bubblewrap")]
    checks = [Check("bubblewrap", "ok", bwrap)]
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all",
            "--die-with-parent", "true"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return checks + [Check("user namespaces", "fail", "a bwrap test run did not finish in 20 s",
                               "check that the machine is not overloaded and bwrap works: bwrap --ro-bind / / true")]
    if result.returncode != 0:
        reason = (result.stderr.strip() or f"exit {result.returncode}").splitlines()[-1]
        fix = ("allow unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1 "
               "(Debian), sysctl user.max_user_namespaces=15000, and on Ubuntu 24.04+ "
               "sysctl kernel.apparmor_restrict_unprivileged_userns=0; or run as root; in a container, "
               "run it with --privileged or a seccomp profile that allows clone(CLONE_NEWUSER)")
        return checks + [Check("user namespaces", "fail", f"bwrap --unshare-all failed: {reason}", fix)]
    detail = "bwrap --unshare-all ran (pid, net, ipc, uts, mount, user namespaces)"
    return checks + [Check("user namespaces", "ok", detail)]


def _cgroups() -> Check:
    root = Path("/sys/fs/cgroup")
    v1 = [name for name in ("memory", "pids", "cpu") if (root / name).is_dir()]
    if v1:
        writable = [name for name in v1 if os.access(root / name, os.W_OK)]
        if len(writable) < len(v1):
            return Check("cgroups", "warn", f"cgroup v1 ({', '.join(v1)}); writable: {', '.join(writable) or 'none'}",
                         "memory, cpu and pids limits of local sandboxes need writable v1 controllers: run "
                         "agentix-providerd as root (limits not enforced are logged per sandbox)")
        return Check("cgroups", "ok", f"cgroup v1, writable controllers: {', '.join(v1)}")
    if (root / "cgroup.controllers").is_file():
        return Check("cgroups", "warn", "cgroup v2 only",
                     "the local backend sets limits through cgroup v1; on this machine sandboxes run without "
                     "memory/cpu/pids limits (logged per sandbox): boot with systemd.unified_cgroup_hierarchy=0 "
                     "or use the docker/podman backend")
    return Check("cgroups", "warn", "no cgroup controllers under /sys/fs/cgroup",
                 "mount cgroup controllers (e.g. mount -t cgroup -o memory none /sys/fs/cgroup/memory) for limits")


def cpu_idle(sys_root: Path = Path("/sys")) -> Check:
    """The idle policy of the CPUs: a VM whose vCPUs halt the moment they go
    idle (the cpuidle-haltpoll driver with ``guest_halt_poll_ns`` 0) makes every
    hand-off of a call on an otherwise idle machine wait for a vCPU to wake
    (docs/PERFORMANCE.md, "The idle regime is the VM's halt policy")."""
    cpuidle = sys_root / "devices/system/cpu/cpuidle"
    governor = ""
    for name in ("current_governor_ro", "current_governor"):
        try:
            governor = (cpuidle / name).read_text().strip()
            break
        except OSError:
            continue
    if not governor:
        return Check("cpu idle", "ok", "no cpuidle governor reported")
    if governor != "haltpoll":
        return Check("cpu idle", "ok", f"cpuidle governor {governor}")
    try:
        poll_ns = int((sys_root / "module/haltpoll/parameters/guest_halt_poll_ns").read_text())
    except (OSError, ValueError):
        return Check("cpu idle", "ok", "cpuidle governor haltpoll")
    if poll_ns > 0:
        return Check("cpu idle", "ok", f"cpuidle governor haltpoll, vCPUs poll {poll_ns} ns before halting")
    return Check("cpu idle", "warn",
                 "cpuidle governor haltpoll with guest_halt_poll_ns=0: idle vCPUs halt at once, so on an "
                 "otherwise idle machine a hand-off of a call to another CPU waits ~25 us for a vCPU to "
                 "wake; the daemon keeps a call on one CPU instead, at two system calls a wait (a noop "
                 "call ~55 us instead of ~27 us with polling)",
                 "as root: echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns (the driver's "
                 "default), or boot without haltpoll.guest_halt_poll_ns=0; costs some host CPU while idle")


def _engine(engine: str) -> Check:
    from agentix.provider.docker import default_engine_socket

    path = default_engine_socket(engine)
    if path is None:
        fix = ("apt-get install docker.io (socket /run/docker.sock)" if engine == "docker" else
               "apt-get install podman, then podman system service --time=0 unix://$XDG_RUNTIME_DIR/podman/podman.sock")
        return Check(engine, "warn", "no engine socket found (the local backend does not need one)",
                     f"for the {engine} backend: {fix}")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(3)
            conn.connect(path)
            conn.sendall(b"GET /_ping HTTP/1.0\r\nHost: engine\r\n\r\n")
            answer = conn.recv(256).decode(errors="replace")
    except OSError as error:
        return Check(engine, "warn", f"{path}: {error}",
                     f"start the {engine} service, and check this user may use {path}")
    if " 200 " not in answer.split("\r\n", 1)[0]:
        return Check(engine, "warn", f"{path} answered {answer.splitlines()[0] if answer else 'nothing'}",
                     f"check the {engine} service")
    return Check(engine, "ok", f"{path} answers /_ping")


def _providerd_socket() -> Check:
    from agentix.provider.local import default_socket

    path = default_socket()
    if not path.exists():
        return Check("provider service", "ok", f"none running at {path} (LocalProvider and `agentix run` start one)")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(2)
            conn.connect(str(path))
    except OSError as error:
        return Check("provider service", "warn", f"{path}: {error}",
                     "a stale socket: the next LocalProvider replaces it (or remove it)")
    return Check("provider service", "ok", f"agentix-providerd listens at {path}")


def run_checks() -> list[Check]:
    """Every check, in the order shown."""
    checks = [_python()]
    declared = declared_requirements()
    checks += [_module(name, dist, debian, declared) for name, dist, debian in _DEPENDENCIES]
    checks.append(_native())
    checks += _binaries()
    checks += _bubblewrap()
    checks.append(_cgroups())
    checks.append(cpu_idle())
    checks += [_engine("docker"), _engine("podman")]
    checks.append(_providerd_socket())
    return checks


def run_doctor(args: Any, out: IO[str]) -> int:
    """``agentix doctor``: exit 1 when any check fails."""
    import agentix

    checks = run_checks()
    failed = any(check.status == "fail" for check in checks)
    if args.json:
        document = {"version": agentix.__version__, "ok": not failed, "checks": [asdict(c) for c in checks]}
        print(json.dumps(document, indent=2), file=out)
        return 1 if failed else 0
    width = max(len(check.name) for check in checks)
    for check in checks:
        print(f"{check.status:<4}  {check.name:<{width}}  {check.detail}", file=out)
        if check.fix:
            print(f"{'':<4}  {'':<{width}}  -> {check.fix}", file=out)
    print("\nall required checks passed" if not failed else "\nsome checks failed (see -> for what to do)", file=out)
    return 1 if failed else 0
