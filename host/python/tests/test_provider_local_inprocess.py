"""InProcessLocalProvider (the pre-service LocalProvider, kept as the benchmark
baseline): pieces that need no bubblewrap run: sizes, settings, the bwrap
command line, the sandbox environment, limits the machine cannot enforce. The
sandboxes themselves are tested in testing/e2e/test_local_provider.py."""

import logging
import os
import struct
import subprocess
import sys

import pytest

from agentix.provider import SandboxConfig, SandboxId, SandboxResource, _local_inprocess
from agentix.provider._local_inprocess import InProcessLocalProvider as LocalProvider
from agentix.provider._local_inprocess import LocalProviderConfig, _Cgroups, parse_memory
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
    provider = LocalProvider(tmp_size="100m", run_size=4096, shm_size="1m")
    argv = provider._argv("/usr/bin/bwrap", "local-0123456789ab", root, tmp_path / "b" / "nix", seccomp_fd=7)
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                 "--die-with-parent", "--new-session"):
        assert flag in argv
    assert _pairs(argv, "--hostname") == ["local-0123456789ab"]
    assert _pairs(argv, "--cap-drop") == ["ALL"]
    assert _pairs(argv, "--seccomp") == ["7"]
    assert _pairs(argv, "--ro-bind") == [
        (str(root / "etc"), "/etc"), (str(root / "marker"), "/marker"), (str(root / "usr"), "/usr"),
        (str(tmp_path / "b" / "nix"), "/nix"),
    ]
    assert _pairs(argv, "--symlink") == [("usr/bin", "/bin")]
    # No host directory is writable from inside: every writable mount is a capped tmpfs.
    assert _pairs(argv, "--bind") == []
    assert _pairs(argv, "--tmpfs") == ["/", "/dev/shm", "/tmp", "/run", "/run/agentix"]
    sizes = {argv[i + 3]: int(argv[i + 1]) for i, arg in enumerate(argv) if arg == "--size"}
    assert sizes == {"/dev/shm": 1 << 20, "/tmp": 100 << 20, "/run": 4096, "/run/agentix": 1 << 20}
    assert _pairs(argv, "--remount-ro") == ["/dev", "/proc", "/"]
    assert argv.index("--proc") < argv.index("--remount-ro", argv.index("--proc"))
    assert argv[argv.index("--proc") + 1] == "/proc" and argv[argv.index("--dev") + 1] == "/dev"
    assert argv[-1] == "/nix/runtime/bootstrap.sh"
    assert "--unshare-net" not in LocalProvider(share_net=True)._argv("bwrap", "s", root, root)
    assert "--seccomp" not in LocalProvider()._argv("bwrap", "s", root, root)


def test_tmpfs_sizes_and_log_cap_are_validated():
    with pytest.raises(ValueError, match="memory size"):
        LocalProvider(tmp_size="lots")
    with pytest.raises(ValueError, match="log_max_bytes"):
        LocalProvider(log_max_bytes=100)


def test_seccomp_program_shape():
    from agentix.provider import _seccomp

    program = _seccomp.deny_filter("x86_64")
    assert len(program) % 8 == 0 and len(program) // 8 < 4096  # BPF_MAXINSNS
    insns = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    # Starts by checking the audit arch (x86_64), killing anything else; ends allowing.
    assert insns[0] == (0x20, 0, 0, 4) and insns[1] == (0x15, 1, 0, 0xC000003E) and insns[2] == (0x06, 0, 0, 0x80000000)
    assert insns[-1] == (0x06, 0, 0, 0x7FFF0000)
    denied = {k for code, jt, jf, k in insns if code == 0x15 and (jt, jf) == (0, 1)}
    assert {165, 166, 155, 250, 101, 175, 313, 246, 321, 298, 323, 304, 308} <= denied  # mount ... setns
    assert _seccomp.deny_filter("aarch64") != program
    with pytest.raises(ValueError, match="no seccomp syscall table"):
        _seccomp.deny_filter("mips")


def test_log_drain_caps_what_reaches_the_host(tmp_path):
    from agentix.provider._local_inprocess import _LogDrain

    read_fd, write_fd = os.pipe()
    drain = _LogDrain(read_fd, tmp_path / "sandbox.log", max_bytes=64 << 10)
    chunk = b"x" * 4095 + b"\n"
    for _ in range(1024):  # 4 MiB through a 64 KiB cap
        os.write(write_fd, chunk)
    os.write(write_fd, b"the last line\n")
    os.close(write_fd)
    drain.join(10.0)
    sizes = [path.stat().st_size for path in tmp_path.iterdir()]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["sandbox.log", "sandbox.log.1"]
    assert sum(sizes) <= 64 << 10 and max(sizes) <= 32 << 10
    assert (tmp_path / "sandbox.log").read_bytes().endswith(b"the last line\n")


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


@pytest.mark.asyncio
async def test_unknown_sandbox_ids(tmp_path):
    provider = LocalProvider(runtime_dir=str(tmp_path))
    with pytest.raises(KeyError, match="no sandbox 'local-nope'"):
        await provider.get(SandboxId("local-nope"))
    with pytest.raises(KeyError, match="no sandbox 'local-nope'"):
        await provider.delete(SandboxId("local-nope"))


@pytest.mark.asyncio
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


@pytest.mark.asyncio
async def test_missing_bwrap_says_how_to_install_it(tmp_path):
    provider = LocalProvider(bwrap=str(tmp_path / "no-bwrap"))
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        await provider.create(SandboxConfig(image="host", bundle=str(tmp_path)))


def test_unsafe_runtime_dir_is_refused(tmp_path):
    from agentix.provider._local_inprocess import _private_dir

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(RuntimeError, match="mode 0700"):
        _private_dir(shared)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(RuntimeError, match="mode 0700"):
        _private_dir(link)


def _child(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


@pytest.fixture(params=["pidfd", "polled"])
def exited(request, monkeypatch):
    """`_exited` as it runs with a pidfd, and as it runs without one (polled)."""
    if request.param == "polled":
        monkeypatch.setattr(_local_inprocess, "_pidfd", lambda pid: None)
    return _local_inprocess._exited


@pytest.mark.asyncio
async def test_exited_is_woken_by_the_exit_and_reaps(exited):
    child = _child(0.2)
    assert await exited(child, 30.0)
    assert child.returncode == 0  # reaped
    assert await exited(child, 0.0)  # already reaped: at once


@pytest.mark.asyncio
async def test_exited_gives_up_after_its_timeout_and_leaves_the_child(exited):
    child = _child(60)
    try:
        assert not await exited(child, 0.1)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
    assert await exited(child, 1.0)


@pytest.mark.asyncio
async def test_exited_uses_a_pidfd_where_there_is_one(monkeypatch):
    opened = []
    real = _local_inprocess._pidfd
    monkeypatch.setattr(_local_inprocess, "_pidfd", lambda pid: opened.append(pid) or real(pid))
    child = _child(0.05)
    assert await _local_inprocess._exited(child, 30.0)
    assert opened == [child.pid]
