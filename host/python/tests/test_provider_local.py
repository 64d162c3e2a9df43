"""LocalProvider pieces that need no bubblewrap run: sizes, settings, the
bwrap command line, the sandbox environment, limits the machine cannot
enforce. The sandboxes themselves are tested in testing/e2e/test_local_provider.py."""

import logging
import os

import pytest

from agentix.provider import SandboxConfig, SandboxId, SandboxResource
from agentix.provider.local import LocalProvider, LocalProviderConfig, _Cgroups, parse_memory
from agentix.runtime import (
    BIND_HOST_ENV,
    BIND_PORT_ENV,
    BUNDLE_NIX_ROOT,
    BUNDLE_RUNTIME_ENTRYPOINT,
    LISTEN_ENV,
)


@pytest.mark.parametrize(
    "value, expected",
    [(4096, 4096), ("100000", 100000), ("512m", 512 << 20), ("16g", 16 << 30), ("1GiB", 1 << 30),
     ("2048k", 2 << 20), ("1.5g", 3 << 29), (" 64M ", 64 << 20), ("10b", 10)],
)
def test_parse_memory(value, expected):
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["", "lots", "12x", "-1m", "0", 0, "m"])
def test_parse_memory_refuses_what_it_cannot_read(value):
    with pytest.raises(ValueError, match="memory"):
        parse_memory(value)


@pytest.mark.parametrize(
    "settings",
    [{"ready_timeout": 0}, {"stop_grace": -1}, {"pids_max": 0}, {"memory": "lots"}, {"cgroup_parent": "../x"}],
)
def test_config_validation(settings):
    with pytest.raises(ValueError):
        LocalProviderConfig(**settings)


def test_settings_as_keywords_or_config_not_both():
    assert LocalProvider(pids_max=5).config.pids_max == 5
    assert LocalProviderConfig(pids_max=7).to_provider().config.pids_max == 7
    with pytest.raises(TypeError, match="either"):
        LocalProvider(LocalProviderConfig(), pids_max=5)


def test_bootstrap_constants():
    assert (BIND_HOST_ENV, BIND_PORT_ENV, LISTEN_ENV) == ("AGENTIX_BIND_HOST", "AGENTIX_BIND_PORT", "AGENTIX_LISTEN")
    assert (BUNDLE_NIX_ROOT, BUNDLE_RUNTIME_ENTRYPOINT) == ("/nix", "/nix/runtime/bootstrap.sh")


def _pairs(argv, flag):
    return [tuple(argv[i + 1:i + 3]) if flag in ("--ro-bind", "--bind", "--symlink") else argv[i + 1]
            for i, arg in enumerate(argv) if arg == flag]


def test_bwrap_command_line(tmp_path):
    root = tmp_path / "root"
    for name in ("usr", "etc", "proc", "tmp", "nix", "run", "dev", "sys"):
        (root / name).mkdir(parents=True)
    os.symlink("usr/bin", root / "bin")
    (root / "marker").write_text("")
    argv = LocalProvider()._argv("/usr/bin/bwrap", "local-0123456789ab", root, tmp_path / "b" / "nix", tmp_path / "run")
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert _pairs(argv, "--hostname") == ["local-0123456789ab"]
    assert _pairs(argv, "--cap-drop") == ["ALL"]
    assert _pairs(argv, "--ro-bind") == [
        (str(root / "etc"), "/etc"), (str(root / "marker"), "/marker"), (str(root / "usr"), "/usr"),
        (str(tmp_path / "b" / "nix"), "/nix"),
    ]
    assert _pairs(argv, "--symlink") == [("usr/bin", "/bin")]
    assert _pairs(argv, "--bind") == [(str(tmp_path / "run"), "/run/agentix")]
    assert _pairs(argv, "--tmpfs") == ["/", "/tmp", "/run"]
    assert _pairs(argv, "--remount-ro") == ["/proc", "/"]
    assert argv.index("--proc") < argv.index("--remount-ro")
    assert argv[argv.index("--proc") + 1] == "/proc" and argv[argv.index("--dev") + 1] == "/dev"
    assert argv[-1] == "/nix/runtime/bootstrap.sh"
    assert "--unshare-net" not in LocalProvider(share_net=True)._argv("bwrap", "s", root, root, root)


def test_sandbox_env_is_not_the_hosts_and_listen_is_the_providers(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "host-only")
    env = LocalProvider()._sandbox_env("local-x", {"FOO": "bar", LISTEN_ENV: "0.0.0.0:1"})
    assert "SECRET_TOKEN" not in env
    assert env["FOO"] == "bar" and env["AGENTIX_SANDBOX_ID"] == "local-x"
    assert env[LISTEN_ENV] == "unix:///run/agentix/agentix.sock"


def _provider_without_cgroups(tmp_path, **settings):
    return LocalProvider(cgroup_root=str(tmp_path / "no-cgroups"), **settings)


def test_requested_limit_that_cannot_be_enforced_fails(tmp_path):
    provider = _provider_without_cgroups(tmp_path)
    with pytest.raises(RuntimeError, match="memory limit not enforced.*require_limits=False"):
        provider._apply_limits(_Cgroups(provider.config.cgroup_root, "agentix", "local-x"), SandboxResource(memory="1g"))
    with pytest.raises(RuntimeError, match="cpu limit not enforced"):
        provider._apply_limits(_Cgroups(provider.config.cgroup_root, "agentix", "local-x"), SandboxResource(cpu=1))


def test_unenforceable_limits_are_logged_when_allowed(tmp_path, caplog):
    provider = _provider_without_cgroups(tmp_path, require_limits=False)
    cgroups = _Cgroups(provider.config.cgroup_root, "agentix", "local-x")
    with caplog.at_level(logging.WARNING, logger="agentix.provider.local"):
        provider._apply_limits(cgroups, SandboxResource(memory="1g"))
    assert "memory limit not enforced" in caplog.text and "pids limit not enforced" in caplog.text
    assert cgroups.paths == {}


def test_default_pids_limit_is_only_logged(tmp_path, caplog):
    provider = _provider_without_cgroups(tmp_path)
    with caplog.at_level(logging.WARNING, logger="agentix.provider.local"):
        provider._apply_limits(_Cgroups(provider.config.cgroup_root, "agentix", "local-x"), None)
    assert "pids limit not enforced" in caplog.text


async def test_unknown_sandbox_ids(tmp_path):
    provider = LocalProvider(runtime_dir=str(tmp_path))
    with pytest.raises(KeyError, match="no sandbox 'local-nope'"):
        await provider.get(SandboxId("local-nope"))
    with pytest.raises(KeyError, match="no sandbox 'local-nope'"):
        await provider.delete(SandboxId("local-nope"))


async def test_bad_references_fail_before_anything_is_made(tmp_path):
    provider = LocalProvider(runtime_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"))
    (tmp_path / "plain.txt").write_text("not a tar")
    cases = [
        (SandboxConfig(image="host", bundle=str(tmp_path / "missing")), "does not exist"),
        (SandboxConfig(image="host", bundle=str(tmp_path / "plain.txt")), "neither a bundle directory nor a tarball"),
        (SandboxConfig(image="host", bundle=str(tmp_path), platform="linux/arm64"), "platform"),
        (SandboxConfig(image="host", bundle=str(tmp_path), resource=SandboxResource(gpu=2)), "GPU"),
    ]
    for config, message in cases:
        with pytest.raises(ValueError, match=message):
            await provider.create(config)
    assert not (tmp_path / "run").exists()


async def test_missing_bwrap_says_how_to_install_it(tmp_path):
    provider = LocalProvider(bwrap=str(tmp_path / "no-bwrap"))
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        await provider.create(SandboxConfig(image="host", bundle=str(tmp_path)))


def test_unsafe_runtime_dir_is_refused(tmp_path):
    from agentix.provider.local import _private_dir

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(RuntimeError, match="mode 0700"):
        _private_dir(shared)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(RuntimeError, match="mode 0700"):
        _private_dir(link)
