"""KubernetesProvider as a client of agentix-providerd (a fake
ProviderService here): its config, entry point, which providerd it uses (the
URL, else a per-user one started with --kubernetes-kubeconfig /
--kubernetes-in-cluster) and what reaches the request. The Pods themselves
are tested end to end in testing/e2e/test_k8s_provider.py."""

import asyncio
import os
from pathlib import Path

import pytest

from agentix.provider import SandboxConfig, SandboxResource, _plugin
from agentix.provider import local as local_module
from agentix.provider.kubernetes import (
    KubernetesProvider,
    KubernetesProviderConfig,
    bundle_reference,
    default_instance,
    default_kubeconfig,
)
from fake_provider import FakeSpawn

BUNDLE = "registry.example/agentix-bundle@sha256:" + "ab" * 32


@pytest.fixture
def environment(environment, monkeypatch, short_dir):
    """conftest's, and a HOME without a ~/.kube/config."""
    monkeypatch.setenv("HOME", str(short_dir / "home"))
    return environment


def test_registry_resolves_the_declared_kubernetes_entry_point(monkeypatch):
    import tomllib
    from importlib import metadata

    from agentix.provider import providers

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    group = pyproject["project"]["entry-points"]["agentix.provider"]
    assert group["kubernetes"] == "agentix.provider.kubernetes:KubernetesProvider"
    declared = [metadata.EntryPoint(name, value, "agentix.provider") for name, value in group.items()]
    monkeypatch.setattr(_plugin.metadata, "entry_points", lambda *, group: [e for e in declared if e.group == group])
    providers().reset()
    try:
        assert providers().get("kubernetes") is KubernetesProvider
        assert providers().errors() == {}
    finally:
        providers().reset()


def test_config_defaults_and_refusals():
    config = KubernetesProviderConfig()
    assert (config.kubeconfig, config.context, config.namespace, config.in_cluster) == (None, None, None, False)
    assert (config.runtime_port, config.ttl, config.stop_grace, config.warm_pool) == (50051, 300.0, 3.0, None)
    assert isinstance(config.to_provider(), KubernetesProvider)
    with pytest.raises(ValueError, match="exclude each other"):
        KubernetesProviderConfig(kubeconfig="/k", in_cluster=True)
    with pytest.raises(ValueError, match="runtime_port"):
        KubernetesProviderConfig(runtime_port=0)
    with pytest.raises(ValueError, match="label value"):
        KubernetesProviderConfig(instance="bad instance!")
    with pytest.raises(ValueError, match="only None/'none' and 'host'"):
        KubernetesProviderConfig(network="bridge")
    with pytest.raises(ValueError, match="positive"):
        KubernetesProviderConfig(ttl=0)
    with pytest.raises(TypeError, match="either"):
        KubernetesProvider(KubernetesProviderConfig(), ttl=5)


def test_bundle_must_be_an_image_reference(short_dir):
    assert bundle_reference(BUNDLE) == BUNDLE
    assert bundle_reference("oci-ref:" + BUNDLE) == BUNDLE
    for local in (str(short_dir), "./b", "bundle.tar.gz", "~/x"):
        with pytest.raises(ValueError, match="a path on this machine"):
            bundle_reference(local)
    with pytest.raises(ValueError, match="must name the bundle image"):
        bundle_reference("oci-ref:")


def test_default_kubeconfig_and_instance(environment, monkeypatch, short_dir):
    assert default_kubeconfig() is None
    home_config = short_dir / "home" / ".kube" / "config"
    home_config.parent.mkdir(parents=True)
    home_config.write_text("{}")
    assert default_kubeconfig() == str(home_config)
    named = short_dir / "named"
    named.write_text("{}")
    monkeypatch.setenv("KUBECONFIG", f"{short_dir / 'missing'}{os.pathsep}{named}")
    assert default_kubeconfig() == str(named)
    monkeypatch.setattr("agentix.provider.kubernetes._socket.gethostname", lambda: "Host_Ünï.example" + "x" * 80)
    instance = default_instance()
    assert instance.startswith("agx-") and len(instance) <= 63
    KubernetesProviderConfig(instance=instance)  # a valid label value


@pytest.mark.asyncio
async def test_session_through_the_provider_url_sends_the_kubernetes_backend(environment, fake, monkeypatch):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    monkeypatch.setattr(local_module, "spawn_providerd", lambda *a, **k: pytest.fail("spawned a providerd"))
    provider = KubernetesProvider(ttl=60, ready_timeout=9, stop_grace=1.5, warm_pool="wp")
    config = SandboxConfig(image="registry.example/task:1", bundle=BUNDLE, env={"K": "v"},
                           resource=SandboxResource(cpu=0.5, memory="256m"))
    async with provider.session(config) as sandbox:
        assert (await provider.get(sandbox.sandbox_id)).status == "running"
    (request,) = fake.creates()
    spec = request.spec
    assert spec.backend == "kubernetes" and spec.image == "registry.example/task:1"
    assert spec.bundle.oci_reference == BUNDLE and spec.bundle.path == ""
    assert dict(spec.env) == {"K": "v"}
    assert (spec.resources.cpu_millis, spec.resources.memory_bytes) == (500, 256 << 20)
    assert spec.warm_pool == "wp" and spec.ttl.seconds == 60 and request.ready_timeout.seconds == 9
    fake.assert_deleted_once(sandbox.sandbox_id, grace_s=1.5)
    await provider.aclose()


@pytest.mark.asyncio
async def test_a_local_bundle_or_no_image_is_refused_before_any_request(environment, fake, monkeypatch, short_dir):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    async with KubernetesProvider() as provider:
        with pytest.raises(ValueError, match="a path on this machine"):
            await provider.create(SandboxConfig(image="registry.example/task:1", bundle=str(short_dir)))
        with pytest.raises(ValueError, match="task image"):
            await provider.create(SandboxConfig(image="host", bundle=BUNDLE))
        with pytest.raises(NotImplementedError, match="image reference"):
            await provider.deploy_bundle(short_dir / "b.tar")
    assert fake.creates() == []


@pytest.mark.asyncio
@pytest.mark.parametrize("settings,expected", [
    ({"kubeconfig": "KC", "context": "ctx", "namespace": "ns", "runtime_port": 6000, "instance": "me"},
     ["--kubernetes-kubeconfig=KC", "--kubernetes-context=ctx", "--kubernetes-namespace=ns",
      "--kubernetes-runtime-port=6000", "--instance=me"]),
    ({"in_cluster": True, "instance": "me"},
     ["--kubernetes-in-cluster", "--kubernetes-runtime-port=50051", "--instance=me"]),
])
async def test_starts_a_per_user_kubernetes_providerd_once(environment, monkeypatch, short_dir, settings, expected):
    loop = asyncio.get_running_loop()
    kubeconfig = short_dir / "kc.yaml"
    kubeconfig.write_text("{}")
    if "kubeconfig" in settings:
        settings = {**settings, "kubeconfig": str(kubeconfig)}
        expected = [f.replace("KC", str(kubeconfig)) for f in expected]
    spawn = FakeSpawn(loop, delay=0.3)
    monkeypatch.setattr(local_module, "spawn_providerd", spawn)
    first, second = KubernetesProvider(**settings), KubernetesProvider(**settings)
    await asyncio.gather(*(p.create(SandboxConfig(image="i:1", bundle=BUNDLE)) for p in (first, second)))
    assert len(spawn.calls) == 1
    socket, log, flags, detach = spawn.calls[0]
    assert socket == environment / "agentix" / "providerd-kubernetes.sock"
    assert log == environment / "agentix" / "providerd-kubernetes.log"
    state = f"--state-dir=/var/tmp/agx-{os.getuid()}-k8"
    assert flags == [*expected[:-1], state, expected[-1]]
    assert detach
    assert [r.spec.backend for r in spawn.services[0].creates()] == ["kubernetes", "kubernetes"]
    await first.aclose()
    await second.aclose()
    await spawn.stop()


@pytest.mark.asyncio
async def test_no_kubeconfig_says_what_to_do(environment):
    async with KubernetesProvider() as provider:
        with pytest.raises(FileNotFoundError, match="no kubeconfig found"):
            await provider.create(SandboxConfig(image="i:1", bundle=BUNDLE))
