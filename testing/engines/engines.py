"""Real container engines for the tests and benchmarks: a dockerd or a podman
service with its own roots and socket under a directory of the caller's
(ENVIRONMENT.md §2-§3), and the busybox-only image they import.

- ``dockerd --iptables=false --ip6tables=false --bridge=none
  --storage-driver=vfs --data-root D --exec-root E -H unix://S --pidfile P``
- ``podman --runtime runc system service --time=0 unix://S`` with a
  CONTAINERS_CONF (runc, cgroupfs, default ulimits, file events and locks).

Used by testing/e2e/test_engine_backend.py, test_engine_providerd.py and
//testing/bench:provider. `Engine.stop` and `cleanup` leave nothing behind
(containers, the exec root's netns mount, the roots).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

IMAGE = "localhost/agx-busybox:1"
ENGINE_START_TIMEOUT_S = 60


def podman_setup(root: Path) -> tuple[dict[str, str], list[str]]:
    """podman on storage of its own under `root` (ENVIRONMENT.md §2): the
    environment, with a CONTAINERS_CONF written there (runc, cgroupfs,
    default ulimits, no network namespace, file events and locks), and the
    global options naming its roots (vfs) and runc. Its network definitions
    are under `root` too: the machine's own (/etc/cni/net.d as root) are
    shared by every podman, and `podman kube play` adds one there."""
    conf = root / "containers.conf"
    networks = root / "networks"
    networks.mkdir(mode=0o700, exist_ok=True)
    conf.write_text(
        '[containers]\n'
        'default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n'
        'netns = "none"\n'
        '[engine]\n'
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        'lock_type = "file"\n'
        '[network]\n'
        f'network_config_dir = "{networks}"\n')
    # podman refuses a runroot longer than 50 characters: keep them short.
    options = ["--root", str(root / "r"), "--runroot", str(root / "rr"), "--tmpdir", str(root / "t"),
               "--storage-driver", "vfs", "--runtime", "runc"]
    return {**os.environ, "CONTAINERS_CONF": str(conf)}, options


def _mounts_under(prefix):
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(prefix))]


def _unmount_all_under(prefix):
    for mount in sorted(_mounts_under(prefix), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)


def _busybox_tar(directory):
    root = directory / "bbroot"
    (root / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    tar = directory / "bb.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True, timeout=60)
    return tar


class Engine:
    """A running dockerd or podman service, stopped by `stop()`."""

    def __init__(self, kind, root):
        self.kind = kind
        self.root = root
        self.socket = root / f"{kind}.sock"
        self.log = open(root / f"{kind}.log", "wb")
        if kind == "docker":
            env = dict(os.environ)
            cmd = ["dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none",
                   "--storage-driver=vfs", "--data-root", str(root / "d"),
                   "--exec-root", str(root / "e"), "-H", f"unix://{self.socket}",
                   "--pidfile", str(root / "docker.pid")]
            self.cli = ["docker", "-H", f"unix://{self.socket}"]
        else:
            env, options = podman_setup(root)
            cmd = ["podman", *options, "system", "service", "--time=0", f"unix://{self.socket}"]
            self.cli = ["podman", "--remote", "--url", f"unix://{self.socket}"]
        self.env = env
        self.cmd = cmd
        self.start()

    def start(self):
        # cwd: conmon 2.1.6 writes its OOM marker as a relative "oom" file
        # into the service's working directory (hence no State.OOMKilled).
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=self.root, start_new_session=True)
        deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"{self.kind} did not start:\n"
                                     + (self.root / f"{self.kind}.log").read_text()[-3000:])
            time.sleep(0.1)

    def _get(self, path, timeout):
        """GET on the engine's API socket (the test's own view, not the backend's)."""
        connection = http.client.HTTPConnection("localhost", timeout=timeout)
        connection.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.sock.settimeout(timeout)
        try:
            connection.sock.connect(str(self.socket))
            connection.request("GET", f"/v1.41{path}")
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def ping(self):
        try:
            return self._get("/_ping", 2) == (200, b"OK")
        except OSError:
            return False

    def api(self, path):
        status, body = self._get(path, 10)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def run_cli(self, *args):
        return subprocess.run([*self.cli, *args], capture_output=True, text=True,
                              env=self.env, timeout=120, check=True).stdout

    def containers(self, instance=None):
        """All containers, or those labelled managed-by=`instance`."""
        query = "/containers/json?all=1"
        if instance:
            query += "&filters=" + urllib.parse.quote(
                json.dumps({"label": [f"agentix.dev/managed-by={instance}"]}))
        return self.api(query)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if not self.log.closed:
            self.log.close()


def start(kind: str, image_tar: Path | None = None) -> Engine:
    """A running `kind` engine in a fresh root under /tmp, with `image_tar`
    imported as IMAGE; `cleanup` undoes it all."""
    if shutil.which("dockerd" if kind == "docker" else "podman") is None:
        raise RuntimeError(f"{kind} is not installed: run tools/setup")
    root = Path(tempfile.mkdtemp(prefix=f"agx-{kind[:2]}-", dir="/tmp"))
    try:
        engine = Engine(kind, root)
    except BaseException:
        _unmount_all_under(root)
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        if image_tar is not None:
            engine.run_cli("import", str(image_tar), IMAGE)
    except BaseException:
        cleanup(engine)
        raise
    return engine


def cleanup(engine: Engine) -> list:
    """Removes every container left, stops the engine, unmounts and removes
    its root; returns the containers that were left (for the caller to fail on)."""
    left = []
    try:
        if engine.proc.poll() is None:
            left = engine.containers()
            for container in left:
                subprocess.run([*engine.cli, "rm", "-f", container["Id"]], capture_output=True,
                               env=engine.env, timeout=60)
    finally:
        engine.stop()
        # conmon runs `podman --root ... container cleanup` after a container
        # exits, which would make the roots again after they are removed:
        # wait (bounded) for every process naming the root to end first.
        _wait_for_processes_naming(engine.root, timeout=15.0)
        # dockerd leaves its exec root's default netns mounted (ENVIRONMENT.md §3).
        _unmount_all_under(engine.root)
        shutil.rmtree(engine.root, ignore_errors=True)
    return left


def _processes_naming(text: str) -> list[int]:
    found = []
    needle = text.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def _wait_for_processes_naming(root: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _processes_naming(str(root)) and time.monotonic() < deadline:
        time.sleep(0.1)
