"""The plugin registry of the agentix.provider group (SPEC §9.2)."""

import logging
from types import SimpleNamespace

import pytest

import agentix.provider
from agentix.provider import _plugin, providers, register_provider
from agentix.provider._plugin import PluginConflictError, PluginRegistry, PluginSource


class Docker:
    pass


class Podman:
    pass


class FakeEntryPoint:
    def __init__(self, name, loaded, dist="dist", version="1.0", value=None):
        self.name = name
        self.value = value or f"{dist}.module:{name}"
        self.dist = SimpleNamespace(metadata={"Name": dist}, version=version)
        self._loaded = loaded

    def load(self):
        if isinstance(self._loaded, BaseException):
            raise self._loaded
        return self._loaded


@pytest.fixture
def entry_points(monkeypatch):
    """Replaces the installed entry points with a list the test fills."""
    points = []
    walks = []

    def fake(*, group):
        walks.append(group)
        return [point for point in points if point.group == group]

    monkeypatch.setattr(_plugin.metadata, "entry_points", fake)

    def add(name, loaded, **kwargs):
        point = FakeEntryPoint(name, loaded, **kwargs)
        point.group = "agentix.provider"
        points.append(point)

    add.walks = walks
    yield add
    providers().reset()


def test_walk_is_lazy_and_happens_once(entry_points):
    registry = PluginRegistry("agentix.provider")
    entry_points("docker", Docker)
    assert entry_points.walks == []
    assert registry.get("docker") is Docker
    assert registry.all() == {"docker": Docker}
    assert registry.sources() == {"docker": PluginSource("dist", "1.0")}
    assert registry.errors() == {}
    assert entry_points.walks == ["agentix.provider"]


def test_duplicate_names_conflict(entry_points):
    entry_points("docker", Docker, dist="d1", version="1")
    entry_points("docker", Podman, dist="d2", version="2")
    with pytest.raises(PluginConflictError) as raised:
        PluginRegistry("agentix.provider").get("docker")
    assert str(raised.value) == "duplicate plugin 'docker' in group 'agentix.provider': d1@1 vs d2@2"


def test_duplicate_is_found_even_when_the_first_loader_fails(entry_points):
    entry_points("docker", ImportError("no docker sdk"), dist="d1", version="1")
    entry_points("docker", Docker, dist="d2", version="2")
    with pytest.raises(PluginConflictError, match="d1@1 vs d2@2"):
        PluginRegistry("agentix.provider").all()


def test_broken_loader_is_logged_kept_and_reraised_siblings_unaffected(entry_points, caplog):
    error = ImportError("needs the docker extra")
    entry_points("docker", error)
    entry_points("podman", Podman)
    registry = PluginRegistry("agentix.provider")
    with caplog.at_level(logging.WARNING, logger="agentix.provider._plugin"):
        assert registry.get("podman") is Podman
    assert "docker" in caplog.text and "needs the docker extra" in caplog.text
    assert registry.errors() == {"docker": error}
    with pytest.raises(ImportError, match="needs the docker extra"):
        registry.get("docker")
    assert registry.all() == {"podman": Podman}
    assert set(registry.sources()) == {"docker", "podman"}


def test_unknown_name_lists_what_is_available(entry_points):
    entry_points("podman", Podman)
    entry_points("docker", Docker)
    with pytest.raises(KeyError) as raised:
        PluginRegistry("agentix.provider").get("k8s")
    assert raised.value.args[0] == "no plugin 'k8s' in group 'agentix.provider'; available: ['docker', 'podman']"


def test_in_process_registration_overrides_and_reset_drops_it(entry_points):
    entry_points("docker", Docker)
    registry = PluginRegistry("agentix.provider")
    assert registry.get("docker") is Docker
    registry.register("docker", Podman)
    assert registry.get("docker") is Podman
    assert registry.sources()["docker"].label() == "(in-process)"
    registry.reset()
    assert registry.get("docker") is Docker


def test_registration_clears_an_overridden_loader_error(entry_points):
    entry_points("docker", ImportError("broken"))
    registry = PluginRegistry("agentix.provider")
    assert "docker" in registry.errors()
    registry.register("docker", Docker)
    assert registry.errors() == {}
    assert registry.get("docker") is Docker


def test_register_provider_uses_the_provider_registry(entry_points):
    register_provider("mine", Docker)
    assert providers().get("mine") is Docker
    assert agentix.provider.providers() is providers()
    with pytest.raises(TypeError, match="needs a class"):
        register_provider("instance", Docker())


def test_labels():
    assert PluginSource("agentix-docker", "0.2.7").label() == "agentix-docker@0.2.7"
    assert PluginSource().label() == "(in-process)"


def test_provider_package_exports_and_namespace():
    assert set(agentix.provider.__all__) == {
        "BundleDeployer", "DeployedBundle", "Sandbox", "SandboxConfig", "SandboxId", "SandboxInfo",
        "SandboxProvider", "SandboxResource", "providers", "register_provider",
    }
    # pkgutil.extend_path: plugin distributions can add agentix.provider.<name>.
    assert isinstance(agentix.provider.__path__, list)
