"""`agentix.provider.kubernetes.KubernetesProvider` end to end: a real
agentix-providerd with its Kubernetes backend (``--kubernetes-kubeconfig``)
against testing/k8s/fake_apiserver.py on loopback, whose fake kubelet runs
each Pod for real (the Pod's command under bubblewrap, the real bundler's
bundle at /nix, a Pod IP of its own on 127.0.0.0/8).

A user's view: ``provider.session(SandboxConfig(image=..., bundle=<bundle
image>))`` from the entry-point registry answers remote calls with the env
it was given, the Pod carries the spec's limits and its expire-time
annotation (the TTL) but never the env or a token, and the session's end
leaves no Pod, Secret, NetworkPolicy or process; a Pod the API server
rejects is an error carrying the server's message and leaves nothing.

Run: bazel build //... && tools/make_venv $PWD/.venv-test &&
     .venv-test/bin/python -m pytest -q -p no:cacheprovider -o asyncio_mode=auto \
         --timeout=300 testing/e2e/test_k8s_provider.py
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "testing" / "providerd"))
sys.path.insert(0, str(Path(__file__).parent))

import providerd_harness as harness  # noqa: E402
from test_engine_backend import bundle_app  # noqa: E402

BUNDLE_REF = "registry.example/agentix-bundle@sha256:" + "5e" * 32
TASK_IMAGE = "registry.example/task:1"
NAMESPACE = "agx"
CALL_TIMEOUT_S = 60.0


class FakeCluster:
    """fake_apiserver.py on 127.0.0.1 (ends with this process: its stdin)."""

    def __init__(self, workdir: Path) -> None:
        self.token = secrets.token_hex(16)
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", str(REPO / "testing" / "k8s" / "fake_apiserver.py"), "--token", self.token],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(workdir / "apiserver.log", "wb"))
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fake API server did not start: {(workdir / 'apiserver.log').read_text()}")
        self.url = f"http://127.0.0.1:{json.loads(line)['port']}"
        self.kubeconfig = workdir / "kubeconfig.json"
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "pd", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "pd", "namespace": NAMESPACE}}],
        }))

    def fake(self, op: str, body: dict | None = None, method: str | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}/_fake/{op}", data=data, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def leftovers(self) -> dict:
        return {kind: self.fake(kind) for kind in ("pods", "secrets", "netpols")} | \
            {"processes": self.fake("kubelet")["running"]}

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def bundle(engine_bundle):
    if not harness.find_providerd().exists():
        pytest.fail("run `bazel build //...` first")
    return engine_bundle


@pytest.fixture
def cluster(bundle):
    workdir = Path(tempfile.mkdtemp(prefix="k8-", dir="/tmp"))
    fake = FakeCluster(workdir)
    try:
        fake.fake("config", {"kubelet": {"bundles": {BUNDLE_REF: str(bundle)}}})
        yield fake
    finally:
        fake.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def pd(cluster):
    workdir = Path(tempfile.mkdtemp(prefix="pk-", dir="/tmp"))
    service = harness.Providerd(workdir, extra_args=["--kubernetes-kubeconfig", str(cluster.kubeconfig)])
    service.start()
    try:
        yield service
    finally:
        service.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_for(predicate, timeout: float = 20.0):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > end:
            return value
        time.sleep(0.05)


async def test_kubernetes_provider_session_runs_a_pod(pd, cluster, monkeypatch):
    from agentix.provider import SandboxConfig, SandboxResource, providers

    monkeypatch.setenv("AGENTIX_PROVIDER_URL", pd.target)
    monkeypatch.setenv("AGENTIX_PROVIDER_TOKEN", pd.token)
    provider_class = providers().get("kubernetes")
    assert provider_class.__name__ == "KubernetesProvider"
    async with provider_class(ttl=120) as provider:
        config = SandboxConfig(image=TASK_IMAGE, bundle=BUNDLE_REF, env={"WHO": "k8s-user-env"},
                               resource=SandboxResource(cpu=0.5, memory="256m"))
        before = time.time()
        async with provider.session(config) as sandbox:
            assert await asyncio.wait_for(sandbox.remote(bundle_app.add, 4, 5), CALL_TIMEOUT_S) == 9
            assert await sandbox.remote(os.getenv, "WHO") == "k8s-user-env"
            # The bundle's Python, not this machine's.
            assert (await sandbox.remote(os.readlink, "/proc/self/exe")).startswith("/nix/")
            assert (await provider.get(sandbox.sandbox_id)).status == "running"
            (pod,) = cluster.fake("pods")
            assert pod["metadata"]["name"] == sandbox.sandbox_id  # already "sbx-..."
            assert pod["metadata"]["labels"]["agentix.dev/sandbox-id"] == sandbox.sandbox_id
            task = pod["spec"]["containers"][0]
            assert task["image"] == TASK_IMAGE
            assert task["resources"]["limits"]["cpu"] == "500m"
            assert task["resources"]["limits"]["memory"] == str(256 << 20)
            assert pod["spec"]["initContainers"][0]["image"] == BUNDLE_REF
            # The env arrived with Activate, and no token is in the Pod object.
            text = json.dumps(pod)
            assert "k8s-user-env" not in text and sandbox.token not in text
            annotations = pod["metadata"]["annotations"]
            expire = time.mktime(time.strptime(annotations["agentix.dev/expire-time"], "%Y-%m-%dT%H:%M:%SZ"))
            expire -= time.timezone
            assert before + 100 < expire < time.time() + 130, annotations
            assert len(cluster.fake("netpols")) == 1  # network NONE by default
        gone = _wait_for(lambda: cluster.leftovers() == {"pods": [], "secrets": [], "netpols": [], "processes": 0})
        assert gone, cluster.leftovers()


async def test_a_pod_the_api_server_rejects_is_an_error_with_its_message(pd, cluster, monkeypatch):
    from agentix.provider import SandboxConfig
    from agentix.provider.errors import ProviderError
    from agentix.provider.kubernetes import KubernetesProvider

    monkeypatch.setenv("AGENTIX_PROVIDER_URL", pd.target)
    monkeypatch.setenv("AGENTIX_PROVIDER_TOKEN", pd.token)
    cluster.fake("config", {"reject_create": "spec.containers[0].image: Invalid value: quota says no"})
    async with KubernetesProvider(ready_timeout=30) as provider:
        with pytest.raises(ProviderError, match="quota says no") as raised:
            await provider.create(SandboxConfig(image=TASK_IMAGE, bundle=BUNDLE_REF))
        assert "is invalid" in str(raised.value)
    gone = _wait_for(lambda: cluster.leftovers() == {"pods": [], "secrets": [], "netpols": [], "processes": 0})
    assert gone, cluster.leftovers()
