"""LocalProvider as a client of agentix-providerd (a fake ProviderService here):
which providerd it uses ($AGENTIX_PROVIDER_URL, the per-user default socket,
started when none answers, or a private one for server-level settings), how
its settings reach the requests, and starting a providerd binary."""

import asyncio
import os
import stat
import textwrap
from pathlib import Path

import pytest

from agentix.provider import SandboxConfig, SandboxResource
from agentix.provider import local as local_module
from agentix.provider.local import LocalProvider, LocalProviderConfig, default_socket, find_providerd, spawn_providerd
from agentix.provider.v1 import provider_pb2 as pb
from fake_provider import FakeProviderService, FakeSpawn, serve_provider


@pytest.fixture
def no_spawn(monkeypatch):
    """Fails the test if LocalProvider tries to start a providerd."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"spawn_providerd called: {args} {kwargs}")

    monkeypatch.setattr(local_module, "spawn_providerd", refuse)


def _stale_socket(path):
    """A socket file nobody listens on (left by a providerd that died)."""
    import socket as socket_module

    leftover = socket_module.socket(socket_module.AF_UNIX)
    leftover.bind(str(path))
    leftover.close()


def test_it_is_still_the_local_entry_point():
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert 'local = "agentix.provider.local:LocalProvider"' in pyproject
    assert LocalProviderConfig(pids_max=7).to_provider().config.pids_max == 7


def test_default_socket(monkeypatch, short_dir):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    assert default_socket() == short_dir / "agentix" / "providerd.sock"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir / "missing"))
    assert default_socket() == Path(f"/tmp/agentix-{os.getuid()}/providerd.sock")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_socket() == Path(f"/tmp/agentix-{os.getuid()}/providerd.sock")


@pytest.mark.asyncio
async def test_uses_the_provider_url_and_maps_its_settings(environment, fake, bundle, monkeypatch, no_spawn):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    provider = LocalProvider(memory="256m", tmp_size="64m", share_net=True, ready_timeout=7, stop_grace=1.5, ttl=60)
    config = SandboxConfig(image="host", bundle=str(bundle), env={"K": "v"}, resource=SandboxResource(cpu=0.5))
    sandbox = await provider.create(config)
    assert provider.url == fake.url
    (request,) = fake.creates()
    spec = request.spec
    assert spec.image == "host" and spec.bundle.path == str(bundle.resolve())
    assert dict(spec.env) == {"K": "v"}
    assert (spec.resources.cpu_millis, spec.resources.memory_bytes, spec.resources.scratch_bytes) == (
        500, 256 << 20, 64 << 20,
    )
    assert spec.resources.pids == 0  # the default cap is providerd's own
    assert spec.network.mode == pb.Network.HOST
    assert spec.ttl.seconds == 60 and request.ready_timeout.seconds == 7
    assert sandbox.token == fake.tokens[sandbox.sandbox_id]
    assert sandbox.runtime_url == fake.records[sandbox.sandbox_id].status.endpoint.target
    await provider.aclose()
    fake.assert_deleted_once(sandbox.sandbox_id, grace_s=1.5)


@pytest.mark.asyncio
async def test_default_settings_send_only_what_the_sandbox_needs(environment, fake, bundle, monkeypatch, no_spawn):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    async with LocalProvider() as provider:
        async with provider.session(SandboxConfig(image="/", bundle=str(bundle / "nix"))) as sandbox:
            assert (await provider.get(sandbox.sandbox_id)).status == "running"
    (request,) = fake.creates()
    assert not request.spec.HasField("resources") and not request.spec.HasField("network")
    assert request.spec.image == "host" and request.spec.ttl.seconds == 300
    assert request.spec.bundle.path == str(bundle.resolve())  # given as its nix/ directory: one spelling
    assert request.ready_timeout.seconds == 30


@pytest.mark.asyncio
async def test_pids_cap_goes_where_the_service_can_enforce_it(environment, fake, bundle, monkeypatch, caplog):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    provider = LocalProvider(pids_max=64)
    await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
    assert fake.creates()[-1].spec.resources.pids == 0
    assert "pids limit not enforced" in caplog.text
    await provider.aclose()

    fake.pids_limit = True
    provider = LocalProvider(pids_max=64)
    await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
    assert fake.creates()[-1].spec.resources.pids == 64
    await provider.aclose()


@pytest.mark.asyncio
async def test_uses_the_default_socket_when_one_answers(environment, bundle, no_spawn):
    socket = default_socket()
    socket.parent.mkdir(mode=0o700)
    service = FakeProviderService()
    server = await serve_provider(service, socket)
    try:
        async with LocalProvider() as provider:
            await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
            assert provider.url == f"unix://{socket}"
        assert len(service.creates()) == 1
    finally:
        await server.stop(None)


@pytest.mark.asyncio
async def test_starts_the_default_providerd_once_when_none_answers(environment, bundle, monkeypatch):
    # A real start takes a while: the other provider finds nobody meanwhile.
    spawn = FakeSpawn(asyncio.get_running_loop(), delay=0.5, unlink=True)
    monkeypatch.setattr(local_module, "spawn_providerd", spawn)
    stale = default_socket()
    stale.parent.mkdir(mode=0o700)
    _stale_socket(stale)
    first, second = LocalProvider(), LocalProvider()
    await asyncio.gather(
        first.create(SandboxConfig(image="host", bundle=str(bundle))),
        second.create(SandboxConfig(image="host", bundle=str(bundle))),
    )
    assert spawn.calls == [(stale, environment / "agentix" / "providerd.log", [], True)]
    assert stat.S_IMODE(os.stat(stale.parent).st_mode) == 0o700
    assert len(spawn.services[0].creates()) == 2
    await first.aclose()
    await second.aclose()
    await spawn.stop()


@pytest.mark.asyncio
async def test_a_per_user_providerd_that_died_is_started_again(environment, bundle, monkeypatch):
    spawn = FakeSpawn(asyncio.get_running_loop(), unlink=True)
    monkeypatch.setattr(local_module, "spawn_providerd", spawn)
    async with LocalProvider() as provider:
        first = await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
        await spawn.servers[0].stop(None)  # providerd died: nothing listens on the socket
        second = await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
        assert len(spawn.servers) == 2 and len(spawn.services[1].creates()) == 1
        assert provider.url == f"unix://{default_socket()}"
        assert first.sandbox_id in spawn.services[0].records and second.sandbox_id in spawn.services[1].records
        assert (await provider.get(second.sandbox_id)).status == "running"
    assert spawn.services[1].records[second.sandbox_id].status.phase == pb.SandboxStatus.TERMINATED
    await spawn.stop()


@pytest.mark.asyncio
async def test_a_named_service_that_died_is_not_restarted_and_aclose_does_not_raise(
    environment, fake, bundle, monkeypatch, no_spawn
):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    provider = LocalProvider()
    sandbox = await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
    await fake.server.stop(None)
    with pytest.raises(ConnectionError, match="is agentix-providerd running"):
        await provider.get(sandbox.sandbox_id)
    await provider.aclose()  # logged, not raised


@pytest.mark.asyncio
async def test_a_providerd_started_while_waiting_for_the_lock_is_used(environment, monkeypatch):
    """Both callers find nobody before the lock; the second, once it has the
    lock, must find the first one's providerd and not start another (without
    the lock, or without the check under it, both would start one)."""
    spawn = FakeSpawn(asyncio.get_running_loop(), delay=0.3)

    async def answers(url):
        await asyncio.sleep(0.05)
        return bool(spawn.servers)  # someone answers once a providerd was started

    monkeypatch.setattr(local_module, "spawn_providerd", spawn)
    monkeypatch.setattr(local_module, "_answers", answers)
    socket = default_socket()
    socket.parent.mkdir(mode=0o700)
    _stale_socket(socket)  # something there, so that the checks before the lock run
    urls = await asyncio.gather(local_module.ensure_default_providerd(), local_module.ensure_default_providerd())
    assert urls == [f"unix://{socket}"] * 2 and [call[0] for call in spawn.calls] == [socket]
    await spawn.stop()


@pytest.mark.asyncio
async def test_server_level_settings_start_a_private_providerd(environment, bundle, monkeypatch, short_dir):
    import subprocess

    spawn = FakeSpawn(asyncio.get_running_loop(), returns=lambda: subprocess.Popen(["sleep", "60"]))
    monkeypatch.setattr(local_module, "spawn_providerd", spawn)
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", "unix:///nowhere.sock")  # server-level settings win over it
    provider = LocalProvider(
        run_size="32m", shm_size=1 << 20, log_max_bytes=1 << 20, seccomp=False, require_limits=False,
        cgroup_root="/cg", cgroup_parent="mine", extra_bwrap_args=["--setenv", "A", "b"], pids_max=None,
        runtime_dir=str(short_dir / "state"),
    )
    sandbox = await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
    ((socket, _log, flags, detach),) = spawn.calls
    assert detach is False and socket.name == "providerd.sock" and socket.parent.name.startswith("agx-")
    assert flags == [
        f"--state-dir={short_dir / 'state'}", f"--local-run-size={32 << 20}", f"--local-shm-size={1 << 20}",
        f"--local-log-max-bytes={1 << 20}", "--local-seccomp=false", "--local-require-limits=false",
        "--local-cgroup-root=/cg", "--local-cgroup-parent=mine", "--local-pids-max=0",
        "--local-extra-bwrap-arg=--setenv", "--local-extra-bwrap-arg=A", "--local-extra-bwrap-arg=b",
    ]
    assert provider.url == f"unix://{socket}"
    process = provider._providerd.process
    await provider.aclose()
    assert process.poll() is not None  # stopped with the provider
    assert not socket.parent.exists()
    assert spawn.services[0].records[sandbox.sandbox_id].status.phase == pb.SandboxStatus.TERMINATED
    await spawn.stop()


@pytest.mark.asyncio
async def test_a_private_providerd_gets_a_short_state_dir_of_its_own(environment, bundle, monkeypatch):
    spawn = FakeSpawn(asyncio.get_running_loop())
    monkeypatch.setattr(local_module, "spawn_providerd", spawn)
    async with LocalProvider(seccomp=False) as provider:
        await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
        ((socket, log, flags, _detach),) = spawn.calls
        state = socket.parent / "s"
        assert flags == ["--local-seccomp=false", f"--state-dir={state}"] and log == socket.parent / "providerd.log"
        assert len(str(state)) <= 22  # providerd's limit: the sandboxes' sockets live under it
        assert stat.S_IMODE(os.stat(socket.parent).st_mode) == 0o700
    assert not socket.parent.exists()
    await spawn.stop()


@pytest.mark.asyncio
async def test_bad_configs_fail_before_any_providerd_is_used(environment, short_dir, bundle, no_spawn):
    provider = LocalProvider(cache_dir=str(short_dir / "cache"))
    (short_dir / "plain.txt").write_text("not a tar")
    cases = [
        (SandboxConfig(image="host", bundle=str(short_dir / "missing")), "does not exist"),
        (SandboxConfig(image="host", bundle=str(short_dir / "plain.txt")), "neither a bundle directory nor a tarball"),
        (SandboxConfig(image="host", bundle=str(short_dir), platform="linux/arm64"), "platform"),
        (SandboxConfig(image="host", bundle=str(short_dir), resource=SandboxResource(gpu=2)), "GPU"),
        (SandboxConfig(image=str(short_dir / "no-root"), bundle=str(bundle)), "not usable"),
    ]
    for config, message in cases:
        with pytest.raises(ValueError, match=message):
            await provider.create(config)
    assert provider.url is None
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        await LocalProvider(bwrap=str(short_dir / "no-bwrap")).create(SandboxConfig(image="host", bundle=str(bundle)))


@pytest.mark.asyncio
async def test_unknown_ids_are_key_errors_and_prune_is_a_no_op(environment, fake, monkeypatch):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    async with LocalProvider() as provider:
        assert provider.prune() == []
        for call in (provider.get, provider.delete):
            with pytest.raises(KeyError, match="no sandbox 'local-nope'"):
                await call("local-nope")


@pytest.mark.asyncio
async def test_sandboxes_of_another_process_can_be_reached_and_deleted(environment, fake, bundle, monkeypatch):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    async with LocalProvider() as mine, LocalProvider() as theirs:
        sandbox = await theirs.create(SandboxConfig(image="host", bundle=str(bundle)))
        assert (await mine.get(sandbox.sandbox_id)).runtime_url == sandbox.runtime_url
        await mine.delete(sandbox.sandbox_id)
        assert fake.records[sandbox.sandbox_id].status.phase == pb.SandboxStatus.TERMINATED


@pytest.mark.asyncio
async def test_a_deleted_sandbox_is_unknown_as_before(environment, fake, bundle, monkeypatch):
    # The service keeps a deleted sandbox's record for a while; LocalProvider
    # answers as the in-process provider did: KeyError for get and delete.
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    async with LocalProvider() as provider:
        sandbox = await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
        await provider.delete(sandbox.sandbox_id)
        for call in (provider.get, provider.delete):
            with pytest.raises(KeyError, match=f"no sandbox '{sandbox.sandbox_id}'.*it was deleted"):
                await call(sandbox.sandbox_id)
        assert [m for m, _ in fake.calls].count("DeleteSandbox") == 1  # the second delete asked nothing to go
        # A sandbox that ended otherwise is still reported, and deleted without error.
        other = await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
        fake.records[other.sandbox_id].status.phase = pb.SandboxStatus.TERMINATED
        fake.records[other.sandbox_id].status.exit.reason = pb.Exit.TTL_EXPIRED
        assert (await provider.get(other.sandbox_id)).status == "terminated (ttl_expired)"
        await provider.delete(other.sandbox_id)


@pytest.mark.asyncio
async def test_ttl_is_renewed_while_the_provider_is_open(environment, fake, bundle, monkeypatch):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    provider = LocalProvider(ttl=3)
    sandbox = await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
    await asyncio.sleep(1.3)
    extends = [r for m, r in fake.calls if m == "ExtendSandbox"]
    assert [(r.id, r.ttl.seconds) for r in extends] == [(sandbox.sandbox_id, 3)]
    await provider.aclose()
    await asyncio.sleep(1.2)
    assert len([r for m, r in fake.calls if m == "ExtendSandbox"]) == 1  # stopped with the provider


# ------------------------------------------------------- starting the binary

def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


READY_SCRIPT = """\
    fd=""; while [ $# -gt 0 ]; do [ "$1" = --ready-fd ] && fd=$2; shift; done
    echo "pid $$ ppid $PPID sid $(cut -d' ' -f6 /proc/$$/stat)" > "$(dirname "$0")/who"
    echo "started" >&2
    echo ready > "/dev/fd/$fd"
    exec sleep 30
"""


def test_find_providerd(monkeypatch, short_dir):
    binary = _script(short_dir / "agentix-providerd", "exit 0\n")
    monkeypatch.setenv("AGENTIX_PROVIDERD", str(binary))
    assert find_providerd() == str(binary)
    monkeypatch.setenv("AGENTIX_PROVIDERD", str(short_dir / "nothing"))
    with pytest.raises(FileNotFoundError, match="not an executable"):
        find_providerd()
    monkeypatch.delenv("AGENTIX_PROVIDERD")
    monkeypatch.setenv("PATH", str(short_dir))
    assert find_providerd() == str(binary)


def test_spawn_a_private_providerd_and_stop_it(monkeypatch, short_dir):
    binary = _script(short_dir / "agentix-providerd", READY_SCRIPT)
    process = spawn_providerd(short_dir / "p.sock", short_dir / "log", ["--x=1"], detach=False, binary=str(binary))
    try:
        assert process.poll() is None
        assert "started" in (short_dir / "log").read_text()
        pid, ppid, sid = (int(v) for v in (short_dir / "who").read_text().split()[1::2])
        assert pid == process.pid and sid == pid  # its own session
    finally:
        asyncio.run(local_module._Providerd(process, short_dir / "p.sock", short_dir / "log", None).stop())
    assert process.poll() is not None


def test_spawn_a_detached_providerd_that_outlives_its_starter(short_dir):
    binary = _script(short_dir / "agentix-providerd", READY_SCRIPT)
    assert spawn_providerd(short_dir / "p.sock", short_dir / "log", [], detach=True, binary=str(binary)) is None
    pid, ppid, sid = (int(v) for v in (short_dir / "who").read_text().split()[1::2])
    try:
        assert ppid != os.getpid()  # not this process's child: nothing to reap, nothing that dies with it
        os.kill(pid, 0)
    finally:
        os.kill(pid, 15)


def test_a_providerd_that_fails_to_start_reports_its_log(short_dir):
    binary = _script(short_dir / "agentix-providerd", "echo 'unknown flag --local-bogus' >&2\nexit 2\n")
    with pytest.raises(RuntimeError, match="unknown flag --local-bogus"):
        spawn_providerd(short_dir / "p.sock", short_dir / "log", [], detach=False, binary=str(binary), timeout=5)
    with pytest.raises(RuntimeError, match="did not report ready"):
        spawn_providerd(short_dir / "p.sock", short_dir / "log", [], detach=True, binary=str(binary), timeout=5)
