"""DockerProvider / PodmanProvider as clients of agentix-providerd (a fake
ProviderService here): their config, entry points, which providerd they use
(the URL, else a per-user one started with --docker-socket/--podman-socket)
and what reaches the request."""

import asyncio
import importlib
import os
from pathlib import Path

import pytest

from agentix.provider import SandboxConfig, SandboxResource, _plugin
from agentix.provider import local as local_module
from agentix.provider.docker import (
    DockerProvider,
    DockerProviderConfig,
    PodmanProvider,
    PodmanProviderConfig,
    default_engine_socket,
)
from agentix.provider.v1 import provider_pb2 as pb
from fake_provider import FakeSpawn


def test_entry_points_name_docker_and_podman():
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert 'docker = "agentix.provider.docker:DockerProvider"' in pyproject
    assert 'podman = "agentix.provider.podman:PodmanProvider"' in pyproject
    podman = importlib.import_module("agentix.provider.podman")
    assert podman.PodmanProvider is PodmanProvider and podman.PodmanProviderConfig is PodmanProviderConfig


def test_registry_resolves_the_declared_entry_points(monkeypatch):
    """The entry points exactly as pyproject.toml declares them, through the registry."""
    import tomllib
    from importlib import metadata

    from agentix.provider import providers

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    declared = [
        metadata.EntryPoint(name, value, "agentix.provider")
        for name, value in pyproject["project"]["entry-points"]["agentix.provider"].items()
    ]
    monkeypatch.setattr(_plugin.metadata, "entry_points",
                        lambda *, group: [e for e in declared if e.group == group])
    providers().reset()
    try:
        assert providers().get("docker") is DockerProvider
        assert providers().get("podman") is PodmanProvider
        assert providers().errors() == {}
    finally:
        providers().reset()


def test_config_defaults_and_checks():
    config = DockerProviderConfig()
    assert (config.container_engine, config.run_args, config.network, config.publish_host, config.gpu_args) == (
        "docker", [], None, "127.0.0.1", None,
    )
    assert PodmanProviderConfig().container_engine == "podman"
    assert isinstance(DockerProviderConfig().to_provider(), DockerProvider)
    assert isinstance(PodmanProviderConfig().to_provider(), PodmanProvider)
    assert PodmanProvider().engine == "podman" and DockerProvider().engine == "docker"
    assert DockerProvider(container_engine="podman").engine == "podman"
    assert DockerProviderConfig(run_args="").run_args == []
    with pytest.raises(ValueError, match="must not be empty"):
        DockerProviderConfig(container_engine="")
    with pytest.raises(ValueError, match="one of"):
        DockerProviderConfig(container_engine="lxc")
    with pytest.raises(ValueError, match="Engine API"):
        DockerProviderConfig(run_args="--privileged --cap-add ALL")
    with pytest.raises(ValueError, match="gpu"):
        DockerProviderConfig(gpu_args="--gpus {gpu}")
    with pytest.raises(ValueError, match="bridge"):
        DockerProviderConfig(network="bridge")
    with pytest.raises(TypeError):
        DockerProvider(DockerProviderConfig(), ttl=3)


def test_default_engine_socket(monkeypatch, environment, short_dir):
    monkeypatch.setenv("DOCKER_HOST", "unix:///x/docker.sock")
    assert default_engine_socket("docker") == "/x/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", "tcp://1.2.3.4:2375")  # not a unix socket: the usual places
    found = default_engine_socket("docker")
    assert found in (None, "/run/docker.sock", "/var/run/docker.sock")
    (environment / "podman").mkdir()
    (environment / "podman" / "podman.sock").touch()
    assert default_engine_socket("podman") == str(environment / "podman" / "podman.sock")
    monkeypatch.setenv("CONTAINER_HOST", "unix:///y/podman.sock")
    assert default_engine_socket("podman") == "/y/podman.sock"


@pytest.mark.asyncio
@pytest.mark.parametrize("provider_class,engine", [(DockerProvider, "docker"), (PodmanProvider, "podman")])
async def test_session_through_the_provider_url_sends_the_engine_backend(
    environment, fake, bundle, monkeypatch, provider_class, engine
):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    monkeypatch.setattr(local_module, "spawn_providerd", lambda *a, **k: pytest.fail("spawned a providerd"))
    provider = provider_class(ttl=60, ready_timeout=9, stop_grace=1.5, network="host", warm_pool="wp")
    config = SandboxConfig(
        image="localhost/img:1", bundle=str(bundle / "nix"), env={"K": "v"},
        resource=SandboxResource(cpu=0.5, memory="256m"),
    )
    async with provider.session(config) as sandbox:
        assert (await provider.get(sandbox.sandbox_id)).status == "running"
        assert sandbox.token == fake.tokens[sandbox.sandbox_id]
    (request,) = fake.creates()
    spec = request.spec
    assert spec.backend == engine and spec.image == "localhost/img:1"
    assert spec.bundle.path == str(bundle.resolve())
    assert dict(spec.env) == {"K": "v"}
    assert (spec.resources.cpu_millis, spec.resources.memory_bytes) == (500, 256 << 20)
    assert spec.network.mode == pb.Network.HOST and spec.warm_pool == "wp"
    assert spec.ttl.seconds == 60 and request.ready_timeout.seconds == 9
    fake.assert_deleted_once(sandbox.sandbox_id, grace_s=1.5)
    await provider.aclose()


@pytest.mark.asyncio
async def test_a_missing_bundle_is_refused_before_any_request(environment, fake, monkeypatch, short_dir):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    async with DockerProvider() as provider:
        with pytest.raises(ValueError, match="does not exist"):
            await provider.create(SandboxConfig(image="localhost/img:1", bundle=str(short_dir / "none")))
    assert fake.creates() == []


@pytest.mark.asyncio
@pytest.mark.parametrize("provider_class,engine,short", [(DockerProvider, "docker", "dk"), (PodmanProvider, "podman", "pm")])
async def test_starts_a_per_user_engine_providerd_once(environment, bundle, monkeypatch, provider_class, engine, short):
    spawn = FakeSpawn(asyncio.get_running_loop(), delay=0.3)
    monkeypatch.setattr(local_module, "spawn_providerd", spawn)
    first = provider_class(socket="/e/engine.sock")
    second = provider_class(socket="/e/engine.sock")
    await asyncio.gather(
        first.create(SandboxConfig(image="i", bundle=str(bundle))),
        second.create(SandboxConfig(image="i", bundle=str(bundle))),
    )
    assert len(spawn.calls) == 1
    socket, log, flags, detach = spawn.calls[0]
    assert socket == environment / "agentix" / f"providerd-{engine}.sock"
    assert log == environment / "agentix" / f"providerd-{engine}.log"
    assert flags == [f"--{engine}-socket=/e/engine.sock", f"--state-dir=/var/tmp/agx-{os.getuid()}-{short}",
                     f"--instance=providerd-{engine}"]
    assert detach
    assert [r.spec.backend for r in spawn.services[0].creates()] == [engine, engine]
    await first.aclose()
    await second.aclose()
    await spawn.stop()


@pytest.mark.asyncio
async def test_no_engine_socket_says_what_to_do(environment, bundle, monkeypatch):
    monkeypatch.setattr("agentix.provider.docker.default_engine_socket", lambda engine: None)
    async with PodmanProvider() as provider:
        with pytest.raises(FileNotFoundError, match="no podman API socket found"):
            await provider.create(SandboxConfig(image="i", bundle=str(bundle)))
