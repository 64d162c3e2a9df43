"""The docker and podman backends of agentix-providerd against real engines.

Each engine is started by this module and stopped at its end, with its own
roots and socket under /tmp (ENVIRONMENT.md §2-§3):

- ``dockerd --iptables=false --ip6tables=false --bridge=none
  --storage-driver=vfs --data-root D --exec-root E -H unix://S --pidfile P``
- ``podman --runtime runc system service --time=0 unix://S`` with a
  CONTAINERS_CONF (runc, cgroupfs, default ulimits, file events and locks).

Images are made here: a busybox-only root (``/bin/busybox`` and its applet
links) imported into each engine. Bundles are the real bundler's output for
testing/fixtures/bundle_project (self-contained: the daemon, the worker and
Python all come from /nix, the image has none) and small shell bundles whose
``bootstrap.sh`` reports what the container allows.

The backend object is driven through ``engine_tool`` (JSON lines on
stdin/stdout), one process per backend object, so "restart of the backend" is
a new process. Needs ``bazel build //...`` and tools/setup (docker.io,
podman, runc, catatonit, busybox-static).
"""

import asyncio
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import BAZEL_BIN, REPO

sys.path.insert(0, str(REPO / "testing" / "engines"))
from engines import IMAGE, _mounts_under, _unmount_all_under  # noqa: E402

TOOL = BAZEL_BIN / "providers" / "backends" / "engine" / "engine_tool"
BUNDLER = BAZEL_BIN / "bundler" / "bundler"
PROJECT = REPO / "testing" / "fixtures" / "bundle_project"
DEBIAN_IMAGE = "localhost/agx-debianish:1"

sys.path.insert(0, str(PROJECT))
import bundle_app  # noqa: E402  (the host needs the functions' names only)


# ---------------------------------------------------------------- engines --

def _debian_like_tar(directory):
    """A glibc root in Debian's merged-/usr layout, made from this machine's
    own files: bash, dash as sh, coreutils, and a python3 binary (without
    its stdlib) that a bundle must not pick up."""
    root = directory / "debroot"
    for sub in ("usr/bin", "usr/lib/x86_64-linux-gnu", "usr/lib64", "etc", "tmp", "root"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/bin"), ("lib", "usr/lib"),
                         ("lib64", "usr/lib64")):
        (root / link).symlink_to(target)
    programs = ["bash", "dash", "ls", "cat", "id", "env", "sleep", "uname", "python3.11"]
    libraries = {"/lib64/ld-linux-x86-64.so.2"}
    for program in programs:
        shutil.copy(f"/usr/bin/{program}", root / "usr" / "bin" / program)
        ldd = subprocess.run(["ldd", f"/usr/bin/{program}"], capture_output=True, text=True,
                             check=True).stdout
        libraries.update(part for line in ldd.splitlines() for part in line.split()
                         if part.startswith("/"))
    for library in libraries:
        shutil.copy(library, root / library.lstrip("/"))  # through bin/lib symlinks
    (root / "usr" / "bin" / "sh").symlink_to("dash")
    (root / "usr" / "bin" / "python3").symlink_to("python3.11")
    for name in ("debian_version", "os-release"):
        shutil.copy(f"/etc/{name}", root / "etc" / name)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    tar = directory / "deb.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True, timeout=60)
    return tar


@pytest.fixture(scope="module")
def engine(engine_service, tmp_path_factory):
    """The session's engine (conftest.py) with the Debian-like image too; none
    of this module's containers may be left at its end."""
    engine = engine_service
    if engine.proc.poll() is not None:  # a test stopped it and failed before starting it again
        engine.start()
    engine.run_cli("import", str(_debian_like_tar(tmp_path_factory.mktemp("image"))), DEBIAN_IMAGE)
    yield engine
    if engine.proc.poll() is not None:
        engine.start()
    leftovers = engine.containers()
    for container in leftovers:
        subprocess.run([*engine.cli, "rm", "-f", container["Id"]], capture_output=True,
                       env=engine.env, timeout=60)
    assert leftovers == [], f"{engine.kind}: containers left behind: {leftovers}"


# --------------------------------------------------------------- backend --

class Tool:
    """One backend object (an engine_tool process)."""

    def __init__(self, engine, run_root, instance, socket=None):
        self.instance = instance
        self.proc = subprocess.Popen(
            [str(TOOL), "--name", engine.kind, "--socket", str(socket or engine.socket),
             "--run_root", str(run_root), "--instance", instance],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.answers = queue.Queue()
        self.events = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            message = json.loads(line)
            (self.events if "event" in message else self.answers).put(message)

    def call(self, op, timeout=120, **fields):
        if op in ("launch", "validate"):
            fields.setdefault("instance", self.instance)
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self.answers.get(timeout=timeout)

    def event_for(self, ref, states, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))["event"]
            if event["ref"] == ref and event["state"] in states:
                return event

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def bundle(engine_bundle):
    if not TOOL.exists():
        pytest.fail("run `bazel build //...` first")
    return engine_bundle


def shell_bundle(directory, script):
    """A bundle whose bootstrap.sh is a busybox shell script."""
    runtime = directory / "nix" / "runtime"
    runtime.mkdir(parents=True)
    entry = runtime / "bootstrap.sh"
    entry.write_text("#!/bin/sh\n" + script)
    entry.chmod(0o755)
    return directory


@pytest.fixture
def run_root():
    # Short: the daemon's socket path must fit sun_path.
    root = Path(tempfile.mkdtemp(prefix="agx-r-", dir="/tmp"))
    yield root
    _unmount_all_under(root)  # run-dir tmpfs a failed test did not destroy
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tool(engine, run_root):
    # Its own instance per test: one test's leftovers are not another's.
    t = Tool(engine, run_root, f"e2e-{uuid.uuid4().hex[:8]}")
    yield t
    t.close()


def launch_request(bundle_dir, *, sandbox_id=None, image=IMAGE, resources=None,
                   network=None, token="", uid=None, instance=None, **spec):
    sandbox_spec = {"image": image, "bundle": {"path": str(bundle_dir)}, **spec}
    if resources:
        sandbox_spec["resources"] = {k: str(v) if k != "gpus" else v
                                     for k, v in resources.items()}
    if network:
        sandbox_spec["network"] = network
    return {"sandbox_id": sandbox_id or f"s{uuid.uuid4().hex[:10]}",
            "uid": uid or uuid.uuid4().hex, "admin_token": token,
            **({"instance": instance} if instance else {}),
            "labels": {"team": "e2e"}, "spec": sandbox_spec}


def launch(tool, bundle_dir, **kwargs):
    request = launch_request(bundle_dir, **kwargs)
    answer = tool.call("launch", **request)
    assert answer["ok"], answer
    return answer["ref"]


def wait_exit(tool, ref, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        observed = tool.call("inspect", ref=ref)
        assert observed["ok"], observed
        if observed["state"] == "EXITED":
            return observed
        assert time.monotonic() < deadline, observed
        time.sleep(0.1)


def tail_with(tool, ref, *wanted, timeout=10):
    """The log tail of an exited container once it holds one of `wanted`
    (or the last tail read, after `timeout`): the exit and the log's last
    lines reach the engine's API by different paths (conmon's exit file and
    its log writer for podman), so a tail read the moment the exit is seen
    may not have them yet on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        tail = tool.call("log_tail", ref=ref)["text"]
        if any(text in tail for text in wanted) or time.monotonic() > deadline:
            return tail
        time.sleep(0.1)


def assert_gone(engine, tool, ref, run_root):
    assert tool.call("inspect", ref=ref)["state"] == "MISSING"
    assert all(c["Id"] != ref for c in engine.containers(tool.instance))
    assert list(run_root.iterdir()) == []
    assert not _mounts_under(run_root)
    assert not [m for m in _mounts_under("/") if ref in m]


# ------------------------------------------------------------------ tests --

def test_probe_reports_the_engine_and_what_it_enforces(engine, tool):
    answer = tool.call("probe")
    assert answer["ok"], answer
    caps = answer["capabilities"]
    assert caps["name"] == engine.kind
    assert caps["version"].startswith(f"{engine.kind} ") and "(API 1.41)" in caps["version"]
    for key in ("memoryLimit", "cpuLimit", "pidsLimit", "networkNone", "networkHost",
                "scratchLimit", "nofileLimit"):
        assert caps[key] is True, key
    assert not caps.get("gpu") and not caps.get("networkBridge")


async def serve_calls_then_destroy(engine, tool, bundle, run_root, image):
    """Launch the real bundle over `image`, wait for its socket, call it,
    read its logs, destroy it; returns what runtime_info said."""
    from agentix import RuntimeClient

    ref = launch(tool, bundle, image=image,
                 resources={"memoryBytes": 512 << 20, "pids": 256, "cpuMillis": 1000})
    deadline = time.monotonic() + 30
    while True:
        resolved = tool.call("resolve", ref=ref)
        if resolved["ok"]:
            break
        assert resolved["code"] == "UNAVAILABLE", resolved
        assert time.monotonic() < deadline, tool.call("log_tail", ref=ref)
        await asyncio.sleep(0.05)
    target = resolved["target"]
    assert target == f"unix://{run_root}/{next(run_root.iterdir()).name}/agentix.sock"
    async with RuntimeClient(target) as sandbox:
        assert await asyncio.wait_for(sandbox.remote(bundle_app.add, 2, 3), 30) == 5
        assert await sandbox.remote(bundle_app.greet, engine.kind) == \
            f"hello, {engine.kind}, from bundle_helper"
        info = await sandbox.remote(bundle_app.runtime_info)
        info["debian_version"] = await sandbox.remote(os.path.exists, "/etc/debian_version")
        assert (await sandbox.health()).status == "ok"
    assert info["prefix"] == "/nix/runtime/venv"
    assert info["base_prefix"] == "/nix/runtime/python"
    logs = tool.call("logs", ref=ref)
    assert logs["ok"] and "serving agentix.runtime.v1 on unix:///run/agentix/agentix.sock" \
        in logs["text"], logs
    destroyed = tool.call("destroy", ref=ref, grace_ms=2000)
    assert destroyed["ok"], destroyed
    assert_gone(engine, tool, ref, run_root)
    # Destroy is idempotent.
    assert tool.call("destroy", ref=ref)["ok"]
    return info


async def test_bundle_in_a_busybox_image_serves_calls_then_destroy_leaves_nothing(
        engine, tool, bundle, run_root):
    """The bundle is the only Python in the container; its daemon answers."""
    info = await serve_calls_then_destroy(engine, tool, bundle, run_root, IMAGE)
    assert info["python_exists"] is False and info["debian_version"] is False


async def test_bundle_in_a_debian_like_image_keeps_to_its_own_python_and_libraries(
        engine, tool, bundle, run_root):
    """A glibc image with its own /usr/bin/python3: the bundle's loader,
    libraries and interpreter are used, the image's are not."""
    info = await serve_calls_then_destroy(engine, tool, bundle, run_root, DEBIAN_IMAGE)
    assert info["python_exists"] is True and info["debian_version"] is True
    assert info["stdlib"] == "/nix/runtime/python/lib/python3.11"
    assert info["sqlite"] and info["openssl"].startswith("OpenSSL")


REPORT = r"""
echo "args: $*"
echo "uid: $(id -u)"
grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status
touch /rootfile 2>/dev/null && echo "root: writable" || echo "root: read-only"
touch /nix/x 2>/dev/null && echo "nix: writable" || echo "nix: read-only"
touch /tmp/x && echo "tmp: writable"
echo "tmp-size: $(df -k /tmp | tail -1 | awk '{print $2}')"
echo "nofile: $(ulimit -n)"
echo "net: $(ls /sys/class/net | tr '\n' ' ')"
echo "hostname: $(hostname)"
echo "token-mode: $(stat -c %a /run/agentix/admin-token)"
echo "token: $(cat /run/agentix/admin-token)"
tr '\0' '\n' < /proc/1/environ | grep -c 'TOP[S]ECRET' | sed 's/^/init-env-hits: /'
tr '\0' '\n' < /proc/self/environ | grep -c 'TOP[S]ECRET' | sed 's/^/env-hits: /'
cat /proc/*/cmdline 2>/dev/null | tr '\0' '\n' | grep -c 'TOP[S]ECRET' | sed 's/^/cmdline-hits: /'
echo "pid1: $(tr '\0' ' ' < /proc/1/cmdline)"
dd if=/dev/zero of=/run/agentix/fill bs=65536 count=160 2>/dev/null
echo "fill: $(stat -c %s /run/agentix/fill)"
echo "stderr line" >&2
exit 7
"""


def report(text):
    """`key: value` lines (and /proc/self/status's `Key:\tvalue`) as a dict."""
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in text.splitlines()
            if ":" in line}


def test_container_is_locked_down_and_gets_its_token_by_file_only(engine, tool, run_root,
                                                                  tmp_path):
    bundle_dir = shell_bundle(tmp_path / "b", REPORT)
    token = "TOPSECRET-" + uuid.uuid4().hex
    ref = launch(tool, bundle_dir, token=token,
                 resources={"scratchBytes": 8 << 20, "nofile": 512})
    observed = wait_exit(tool, ref)
    assert observed["exit_code"] == 7 and not observed["oom_killed"]
    tail = tool.call("log_tail", ref=ref, max_bytes=65536)["text"]
    got = report(tail)
    assert got["args"] == "--admin-token-file /run/agentix/admin-token", tail
    assert got["uid"] == "0"
    assert got["CapEff"] == "0000000000000000", tail
    assert got["CapBnd"] == "0000000000000000", tail
    assert got["NoNewPrivs"] == "1", tail
    assert got["root"] == "read-only" and got["nix"] == "read-only"
    assert got["tmp"] == "writable" and got["tmp-size"] == str(8 << 10)
    assert got["nofile"] == "512"
    assert got["net"].split() == ["lo"]
    assert got["hostname"].startswith("sbx-s")
    assert got["token-mode"] == "600" and got["token"] == token
    assert got["init-env-hits"] == "0" and got["env-hits"] == "0"
    assert got["cmdline-hits"] == "0", tail
    assert got["pid1"].split()[0] != "/nix/runtime/bootstrap.sh"  # an init reaps zombies
    # The one writable bind is a 1 MiB tmpfs: 10 MiB do not reach the host's disk.
    assert int(got["fill"]) <= 1 << 20, tail
    assert "stderr line" in tail
    assert tool.call("destroy", ref=ref, grace_ms=0)["ok"]
    assert_gone(engine, tool, ref, run_root)


def test_memory_limit_kills_with_137_and_reports_oom(engine, tool, run_root, tmp_path):
    bundle_dir = shell_bundle(tmp_path / "b",
                              "echo allocating\nexec dd if=/dev/zero of=/dev/null bs=200M count=1\n")
    assert tool.call("watch")["ok"]
    ref = launch(tool, bundle_dir, resources={"memoryBytes": 64 << 20})
    observed = wait_exit(tool, ref)
    assert observed["exit_code"] == 137 and observed["oom_killed"], observed
    event = tool.event_for(ref, {"EXITED"})
    assert event["exit_code"] == 137 and event["oom_killed"], event
    assert tool.call("destroy", ref=ref, grace_ms=0)["ok"]
    assert_gone(engine, tool, ref, run_root)


def test_pids_limit_stops_forks(engine, tool, run_root, tmp_path):
    # A failed fork ends the subshell; counting /proc needs no fork. The
    # subshell's stderr goes to stdout: podman 4.3 sometimes drops the
    # stderr of a container that exits at once from its log.
    script = ("(i=0; while [ $i -lt 40 ]; do sleep 30 & i=$((i+1)); done) 2>&1\n"
              "n=0; for p in /proc/[0-9]*; do n=$((n+1)); done\n"
              "echo \"running: $n\"\n"
              "exit 0\n")
    bundle_dir = shell_bundle(tmp_path / "b", script)
    ref = launch(tool, bundle_dir, resources={"pids": 12})
    wait_exit(tool, ref)
    tail = tail_with(tool, ref, "running: ")
    # 40 forks tried, at most 12 processes: the limit held. The shell's own
    # "can't fork" line is not required: with two busy cores beside it,
    # podman 4.3 logged an empty line in its place in 6 runs of 6 (the count
    # after it intact), so it says nothing about the limit.
    running = int(report(tail)["running"])
    assert running <= 12, tail
    assert tool.call("destroy", ref=ref, grace_ms=0)["ok"]
    assert_gone(engine, tool, ref, run_root)


def test_bad_input_is_refused_with_a_definite_error_and_changes_nothing(
        engine, tool, run_root, tmp_path):
    bundle_dir = shell_bundle(tmp_path / "b", "exit 0\n")

    def refused(code, reason, **kwargs):
        request = launch_request(bundle_dir, **kwargs)
        validated = tool.call("validate", **request)
        assert not validated["ok"] and validated["code"] == code, validated
        assert validated["reason"] == reason, validated
        launched = tool.call("launch", **request)
        assert not launched["ok"] and launched["code"] == code, launched
        return validated["message"]

    message = refused("FAILED_PRECONDITION", "IMAGE_NOT_PRESENT", image="localhost/absent:1")
    assert f"`{engine.kind} load" in message and "localhost/absent:1" in message
    refused("FAILED_PRECONDITION", "LIMIT_NOT_ENFORCEABLE", resources={"gpus": 1})
    refused("FAILED_PRECONDITION", "LIMIT_NOT_ENFORCEABLE", network={"mode": "BRIDGE"})
    refused("FAILED_PRECONDITION", "LIMIT_NOT_ENFORCEABLE",
            network={"allowEgressCidrs": ["10.0.0.0/8"]})
    refused("FAILED_PRECONDITION", "LIMIT_NOT_ENFORCEABLE", resources={"nofile": 10 ** 6})
    refused("INVALID_ARGUMENT", "INVALID_SPEC", image="Not An Image")
    request = launch_request(tmp_path / "nothing-here")
    answer = tool.call("validate", **request)
    assert answer["code"] == "INVALID_ARGUMENT" and answer["reason"] == "NOT_A_BUNDLE"
    answer = tool.call("validate", **launch_request(bundle_dir, platform="linux/s390x"))
    assert answer["code"] == "FAILED_PRECONDITION" and "linux/amd64" in answer["message"]
    assert tool.call("validate", **launch_request(bundle_dir, platform="linux/amd64"))["ok"]
    # What only the engine refuses comes back with the engine's own words.
    answer = tool.call("launch", **launch_request(bundle_dir, image="localhost/UPPER:1"))
    assert not answer["ok"] and answer["message"].startswith(f"{engine.kind}: "), answer
    assert "must be lowercase" in answer["message"], answer
    # An engine that is not there (no socket), or whose socket refuses
    # connections (bound, nobody listening): UNAVAILABLE, retryable.
    refusing_dir = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))
    refusing = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    refusing.bind(str(refusing_dir / "engine.sock"))
    try:
        for path in (run_root / "no-engine.sock", refusing_dir / "engine.sock"):
            gone = Tool(engine, run_root, tool.instance, socket=path)
            try:
                for op in ("probe", "validate", "launch"):
                    answer = gone.call(op, **launch_request(bundle_dir))
                    assert answer["code"] == "UNAVAILABLE", (path, op, answer)
                    assert answer["reason"] == "ENGINE_UNAVAILABLE", (path, op, answer)
                    assert answer["retry_after_ms"] > 0
            finally:
                gone.close()
    finally:
        refusing.close()
        shutil.rmtree(refusing_dir, ignore_errors=True)
    assert engine.containers(tool.instance) == []
    assert list(run_root.iterdir()) == []


def test_entry_point_that_cannot_run_exits_and_says_why(engine, tool, run_root, tmp_path):
    """The init starts, the entry point does not: the container ends at once
    with a failure code (tini 126, catatonit 1) and its output says why
    (the controller turns that into START_FAILED with this tail)."""
    bundle_dir = shell_bundle(tmp_path / "b", "exit 0\n")
    (bundle_dir / "nix" / "runtime" / "bootstrap.sh").chmod(0o644)  # not executable
    ref = launch(tool, bundle_dir)
    observed = wait_exit(tool, ref)
    assert observed["exit_code"] != 0, observed
    tail = tail_with(tool, ref, "ermission denied")
    # docker's tini names the file; podman's catatonit says "failed to exec pid1".
    if engine.kind == "podman" and not tail.strip():
        # podman 4.3 now and then keeps a blank line in place of a quickly
        # exiting container's only line (podman's own CI tracks lost log
        # output as a flake: containers/podman#18501). Seen once in a full
        # e2e run here, never in 25 runs of this test alone with two busy
        # cores; the engine did not keep it, so no backend can report it.
        pass
    else:
        assert "ermission denied" in tail, tail
    assert tool.call("destroy", ref=ref, grace_ms=0)["ok"]
    assert_gone(engine, tool, ref, run_root)


def test_launch_is_idempotent_per_uid_and_a_taken_id_is_refused(engine, tool, run_root,
                                                                tmp_path):
    bundle_dir = shell_bundle(tmp_path / "b", "exec sleep 60\n")
    request = launch_request(bundle_dir)
    first = tool.call("launch", **request)
    again = tool.call("launch", **request)
    assert first["ok"] and again["ok"] and first["ref"] == again["ref"]
    other = tool.call("launch", **{**request, "uid": "another-attempt"})
    assert other["code"] == "ALREADY_EXISTS" and other["reason"] == "SANDBOX_ID_TAKEN", other
    assert tool.call("inspect", ref=first["ref"])["state"] == "RUNNING"
    assert tool.call("destroy", ref=first["ref"], grace_ms=1000)["ok"]
    assert_gone(engine, tool, first["ref"], run_root)
    # A container of that name that is not ours at all: refused, and the run
    # dir (and its tmpfs) this launch made is taken away again.
    foreign = launch_request(bundle_dir)
    engine.run_cli("create", "--name", f"agentix-{foreign['sandbox_id']}", IMAGE, "true")
    try:
        refused = tool.call("launch", **foreign)
        assert refused["code"] == "ALREADY_EXISTS", refused
        assert list(run_root.iterdir()) == [] and not _mounts_under(run_root)
    finally:
        engine.run_cli("rm", "-f", f"agentix-{foreign['sandbox_id']}")


def test_events_report_an_exit_and_logs_stream_from_an_offset(engine, tool, run_root,
                                                              tmp_path):
    script = ("i=0; while [ $i -lt 5 ]; do echo \"out $i\"; echo \"err $i\" >&2; "
              "i=$((i+1)); sleep 0.1; done\nexit 3\n")
    bundle_dir = shell_bundle(tmp_path / "b", script)
    assert tool.call("watch")["ok"]
    ref = launch(tool, bundle_dir)
    # follow: blocks until the container ends, and has everything.
    followed = tool.call("logs", ref=ref, follow=True, timeout=60)
    assert followed["ok"], followed
    event = tool.event_for(ref, {"EXITED"})
    assert event["exit_code"] == 3 and not event["oom_killed"]
    text = followed["text"]
    for i in range(5):
        assert f"out {i}\n" in text and f"err {i}\n" in text
    assert len(text) == len("".join(f"out {i}\nerr {i}\n" for i in range(5)))
    part = tool.call("logs", ref=ref, offset=17)
    assert part["first_offset"] == 17 and part["text"] == text[17:]
    assert tool.call("log_tail", ref=ref, max_bytes=20)["text"] == text[-20:]
    assert tool.call("destroy", ref=ref, grace_ms=0)["ok"]
    assert tool.event_for(ref, {"MISSING"})["state"] == "MISSING"
    assert_gone(engine, tool, ref, run_root)


def test_a_new_backend_object_finds_its_sandboxes_by_label(engine, run_root, tmp_path):
    bundle_dir = shell_bundle(tmp_path / "b", "exec sleep 120\n")
    instance = f"e2e-{uuid.uuid4().hex[:8]}"
    first = Tool(engine, run_root, instance)
    mine = [launch(first, bundle_dir) for _ in range(2)]
    theirs = launch(first, bundle_dir, instance="someone-else")
    first.kill()  # providerd kill -9: the backend object is gone, containers stay
    stale = run_root / "sdead"  # a run dir whose launch died before its container
    stale.mkdir()
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    second = Tool(engine, run_root, instance)
    try:
        owned = second.call("list_owned", instance=instance)
        assert owned["ok"] and sorted(owned["refs"]) == sorted(mine), owned
        assert not stale.exists()
        assert second.call("watch")["ok"]
        for ref in mine:
            assert second.call("inspect", ref=ref)["state"] == "RUNNING"
            assert second.call("destroy", ref=ref, grace_ms=0)["ok"]
            assert second.event_for(ref, {"EXITED", "MISSING"})
        # Not ours: listed only under its own instance.
        assert second.call("list_owned", instance="someone-else")["refs"] == [theirs]
        assert second.call("destroy", ref=theirs, grace_ms=0)["ok"]
        assert second.call("list_owned", instance=instance)["refs"] == []
    finally:
        second.close()
    assert engine.containers(instance) == [] and engine.containers("someone-else") == []
    assert list(run_root.iterdir()) == []


def test_watch_reconnects_after_the_engine_restarts(engine, tool, run_root, tmp_path):
    """The events stream ends when the engine stops; the backend reconnects
    and still reports exits. Calls made while the engine is down are
    UNAVAILABLE and retryable."""
    bundle_dir = shell_bundle(tmp_path / "b", "sleep 1\nexit 5\n")
    assert tool.call("watch")["ok"]
    engine.proc.send_signal(signal.SIGTERM)
    engine.proc.wait(timeout=60)
    down = tool.call("launch", **launch_request(bundle_dir))
    assert down["code"] == "UNAVAILABLE" and down["reason"] == "ENGINE_UNAVAILABLE", down
    assert list(run_root.iterdir()) == []
    engine.start()
    ref = launch(tool, bundle_dir)
    event = tool.event_for(ref, {"EXITED"}, timeout=60)
    assert event["exit_code"] == 5
    assert tool.call("destroy", ref=ref, grace_ms=0)["ok"]
    assert_gone(engine, tool, ref, run_root)


def test_one_backend_object_launches_and_destroys_concurrently(engine, tool, run_root,
                                                              tmp_path):
    """Eight launches at once on one backend object (its handle pool and
    maps), then eight destroys at once: all distinct, all gone."""
    bundle_dir = shell_bundle(tmp_path / "b", "exec sleep 60\n")
    requests = [{"op": "launch", "instance": tool.instance, **launch_request(bundle_dir)}
                for _ in range(8)]
    launched = tool.call("parallel", requests=requests, timeout=180)
    refs = [answer["ref"] for answer in launched["answers"] if answer["ok"]]
    assert len(set(refs)) == 8, launched
    assert len(engine.containers(tool.instance)) == 8
    destroyed = tool.call("parallel", timeout=180,
                          requests=[{"op": "destroy", "ref": ref, "grace_ms": 0} for ref in refs])
    assert all(answer["ok"] for answer in destroyed["answers"]), destroyed
    for ref in refs:
        assert_gone(engine, tool, ref, run_root)
