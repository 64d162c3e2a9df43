"""The Pod pod_render makes for the init-copy bundle mode, run for real with
``podman kube play`` (PROVIDER-SERVICE.md, top; docs/PROVIDERS.md,
"Kubernetes backend: Pods"): the bundle image (the real bundler's OCI
output, /nix plus agentix-sandboxd as the copier) fills an emptyDir in an
init container, a busybox-only task image runs /nix/runtime/bootstrap.sh,
the host probes the plaintext health port without a token (as the kubelet
does), arms the daemon with the admin token from the rendered Secret, and
makes remote calls. Then ``podman kube down`` and nothing is left.

How it differs from a cluster, and why:
- The Pod is rendered with network HOST (hostNetwork): podman here has no
  bridge or slirp networking, so the host reaches the daemon on the host's
  loopback at the rendered ports (both picked free for the test).
- podman 4.3 writes a Secret volume's file still base64-encoded and 0644,
  whatever defaultMode says (--admin-token-file refuses 0644), so the test
  plays the Pod with --start=false, writes the decoded token with the
  rendered mode 0400 (what a kubelet writes), then starts the Pod.
Needs podman, runc, catatonit (tools/setup)."""

import asyncio
import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from admin_client import RUNTIME, SERVING, Admin, bearer, pb
from conftest import BAZEL_BIN, REPO

RENDER_TOOL = BAZEL_BIN / "providers" / "backends" / "kubernetes" / "pod_render_tool"
BUNDLER = BAZEL_BIN / "bundler" / "bundler"
PROJECT = REPO / "testing" / "fixtures" / "bundle_project"
BUNDLE_IMAGE = "localhost/agx-bundle:1"
TASK_IMAGE = "localhost/agx-busybox:1"
ADMIN_TOKEN = "admin-kubeplay-" + "7" * 32
SANDBOX_ID = "kp1"

sys.path.insert(0, str(PROJECT))
import bundle_app  # noqa: E402  (the host needs the functions' names only)

sys.path.insert(0, str(REPO / "testing" / "engines"))
from engines import podman_setup  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mounts_under(prefix):
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(prefix))]


class Podman:
    """The podman CLI on storage of its own (vfs, runc, cgroupfs, no
    network), as ENVIRONMENT.md §2 found workable here."""

    def __init__(self, root):
        self.root = root
        self.env, options = podman_setup(root)
        self.cmd = ["podman", *options]

    def run(self, *args, check=True, timeout=120):
        proc = subprocess.run([*self.cmd, *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout, cwd=self.root)
        if check:
            assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
        return proc

    def names(self, *args):
        return [line for line in self.run(*args).stdout.splitlines() if line.strip()]

    def leftovers(self):
        return {
            "pods": self.names("pod", "ps", "--quiet"),
            "containers": self.names("ps", "--all", "--quiet"),
            "volumes": self.names("volume", "ls", "--quiet"),
            "secrets": self.names("secret", "ls", "--quiet"),
        }


@pytest.fixture(scope="module")
def podman():
    for tool in ("podman", "runc", "catatonit"):
        if shutil.which(tool) is None and not Path(f"/usr/libexec/podman/{tool}").exists():
            pytest.fail(f"{tool} is not installed: run tools/setup")
    if not BUNDLER.exists() or not RENDER_TOOL.exists():
        pytest.fail("run `bazel build //...` first")
    # podman names an image pulled from `oci:PATH` after PATH, and a reference
    # component may not end in "_" or hold "__" (mkdtemp's alphabet has "_"):
    # hex only, so the name is valid whatever the draw.
    root = Path("/tmp") / f"agx-kp-{secrets.token_hex(4)}"
    root.mkdir(mode=0o700)
    engine = Podman(root)
    try:
        yield engine
    finally:
        for args in (("pod", "rm", "--force", "--all"), ("volume", "prune", "--force"),
                     ("secret", "rm", "--all")):
            engine.run(*args, check=False)
        # Containers' conmon processes are gone with their pods; unmount what
        # the vfs driver and the pods' shm left.
        for mount in sorted(mounts_under(root), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
        shutil.rmtree(root, ignore_errors=True)
    assert not mounts_under(root)


@pytest.fixture(scope="module")
def images(podman):
    """The bundle image (the bundler's OCI layout: /nix with
    /nix/runtime/bin/agentix-sandboxd, the copier) and a busybox-only task
    image, in podman's storage."""
    out = podman.root / "bundle"
    done = subprocess.run([str(BUNDLER), "build", str(PROJECT), "--output", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    podman.run("pull", f"oci:{out / 'oci'}", timeout=240)
    pulled = podman.names("images", "--format", "{{.Repository}}:{{.Tag}}")
    assert len(pulled) == 1, pulled
    podman.run("tag", pulled[0], BUNDLE_IMAGE)
    podman.run("rmi", pulled[0])
    bb = podman.root / "bb"
    (bb / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", bb / "bin" / "busybox")
    for applet in subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True,
                                 check=True).stdout.split():
        if applet != "busybox":
            (bb / "bin" / applet).symlink_to("busybox")
    subprocess.run(["tar", "-C", str(bb), "-cf", str(podman.root / "bb.tar"), "."], check=True,
                   timeout=60)
    podman.run("import", str(podman.root / "bb.tar"), TASK_IMAGE)
    return {"bundle": BUNDLE_IMAGE, "task": TASK_IMAGE}


def render(runtime_port, health_port):
    request = {
        "sandbox_id": SANDBOX_ID, "uid": "u-kubeplay", "instance": "kubeplay-test",
        "admin_token": ADMIN_TOKEN, "request_id": "req-kubeplay",
        "spec": {"image": TASK_IMAGE, "bundle": BUNDLE_IMAGE, "network": "HOST",
                 "resources": {"cpu_millis": 1000, "memory_bytes": 512 << 20,
                               "scratch_bytes": 64 << 20}},
        "options": {"bundle_mode": "init-copy", "allow_host_network": True,
                    "runtime_port": runtime_port, "health_port": health_port,
                    "max_lifetime_s": 600},
    }
    proc = subprocess.run([str(RENDER_TOOL)], input=json.dumps(request), capture_output=True,
                          text=True, timeout=30, check=True)
    return json.loads(proc.stdout)


async def health_check(target, timeout):
    async with grpc.aio.insecure_channel(target) as channel:
        return await Admin(channel).health(b"", timeout=timeout)


async def wait_serving(target, podman, deadline_s=90):
    """Polls grpc.health.v1 without a token, as a kubelet gRPC probe does."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if await health_check(target, 2) == SERVING:
                return
        except grpc.aio.AioRpcError:
            pass
        if time.monotonic() > deadline:
            logs = podman.run("logs", f"sbx-{SANDBOX_ID}-task", check=False)
            raise AssertionError(f"not serving in {deadline_s}s:\n{logs.stdout}{logs.stderr}")
        await asyncio.sleep(0.2)


@pytest.mark.asyncio
async def test_init_copy_pod_runs_under_podman_kube_play_and_answers_a_remote_call(
        podman, images, tmp_path):
    from agentix import RuntimeClient

    runtime_port, health_port = free_port(), free_port()
    rendered = render(runtime_port, health_port)
    pod = rendered["pod"]
    assert pod["spec"]["initContainers"][0]["image"] == BUNDLE_IMAGE
    assert pod["spec"]["hostNetwork"] is True
    manifest = tmp_path / "sandbox.yaml"
    # JSON is YAML: the Secret, then the Pod that mounts it.
    manifest.write_text(json.dumps(rendered["admin_secret"]) + "\n---\n" + json.dumps(pod) + "\n")
    assert podman.leftovers() == {"pods": [], "containers": [], "volumes": [], "secrets": []}

    podman.run("kube", "play", "--start=false", str(manifest))
    try:
        # podman 4.3 writes a Secret's data still base64-encoded, and 0644
        # whatever defaultMode says: put right on the volume what a kubelet
        # would have written.
        token_file = podman.root / "r" / "volumes" / f"sbx-{SANDBOX_ID}-admin" / "_data" / \
            "admin-token"
        assert base64.b64decode(token_file.read_text()) == ADMIN_TOKEN.encode()
        token_file.write_text(ADMIN_TOKEN)
        token_file.chmod(0o400)
        started = time.monotonic()
        podman.run("pod", "start", f"sbx-{SANDBOX_ID}")
        health_target = f"127.0.0.1:{health_port}"
        await wait_serving(health_target, podman)
        ready_s = time.monotonic() - started
        runtime_target = f"127.0.0.1:{runtime_port}"

        async with grpc.aio.insecure_channel(runtime_target) as channel:
            admin = Admin(channel)
            # The runtime port wants the admin token before arming...
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await admin.health(b"", timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # ...which the Pod got from its Secret, as providerd would arm it.
            await admin.activate(pb.ActivateRequest(token=RUNTIME, sandbox_id=SANDBOX_ID,
                                                    env={"GREETING": "from the host"}),
                                 timeout=30, metadata=bearer(ADMIN_TOKEN))
        async with RuntimeClient(runtime_target, token=RUNTIME) as sandbox:
            assert await asyncio.wait_for(sandbox.remote(bundle_app.add, 2, 3), 60) == 5
            assert await sandbox.remote(os.getenv, "GREETING") == "from the host"
            info = await sandbox.remote(bundle_app.runtime_info)
            # The task image is busybox only: the bundle brought Python, and
            # /nix is the init container's copy (an emptyDir), read-only here.
            assert info["python_exists"] is False
            assert info["prefix"] == "/nix/runtime/venv"
            assert await sandbox.remote(os.path.exists, "/nix/runtime/bin/agentix-sandboxd")
            assert not await sandbox.remote(os.access, "/nix/runtime", os.W_OK)
            assert not await sandbox.remote(os.access, "/", os.W_OK)  # readOnlyRootFilesystem
            assert await sandbox.remote(os.access, "/tmp", os.W_OK)
            # shareProcessNamespace: the pause process is PID 1 (it reaps
            # orphans), not the daemon.
            assert await sandbox.remote(os.getppid) != 1
        # The health-only port still answers without a token once armed.
        assert await health_check(health_target, 10) == SERVING
        init = [c for c in json.loads(podman.run("pod", "inspect", f"sbx-{SANDBOX_ID}").stdout)
                .get("Containers", [])]
        assert all(not c["Name"].endswith("-bundle") for c in init)  # ran, then removed
        print(f"kube play: pod start -> health SERVING in {ready_s:.2f} s")
    finally:
        podman.run("kube", "down", str(manifest), check=False)
        # kube down keeps the secret and its volume (podman 4.3).
        podman.run("volume", "rm", "--force", f"sbx-{SANDBOX_ID}-admin", check=False)
        podman.run("secret", "rm", f"sbx-{SANDBOX_ID}-admin", check=False)
    assert podman.leftovers() == {"pods": [], "containers": [], "volumes": [], "secrets": []}
    # The daemon is gone with the Pod.
    with pytest.raises(grpc.aio.AioRpcError):
        await health_check(f"127.0.0.1:{health_port}", 2)
