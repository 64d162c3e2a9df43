"""End to end: the Python client of the provider service against the real
`agentix-providerd` with real bubblewrap sandboxes.

`LocalProvider` starts the per-user providerd when none answers (through a
stand-in `$AGENTIX_PROVIDERD` that only adds a private `--state-dir`, so the
test never touches the machine's default one), reuses it from another
process, and starts a private providerd for a server-level setting;
`ServiceProvider` lists, watches, waits, reads logs and maps errors; the
`agentix` command lists and deletes. The unit tests against a fake service
(host/python/tests/test_provider_{service,local}.py, test_cli.py) cover the
retry, resume and start-race paths that need injected faults.

Run: bazel build //... && tools/make_venv $PWD/.venv-test &&
     .venv-test/bin/python -m pytest -q -p no:cacheprovider -o asyncio_mode=auto \
         --timeout=300 testing/e2e/test_provider_client.py
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, BAZEL_BIN, DIRECT_CALLS_ARGS, SANDBOXD, TARGETS_DIR, WORKER, _venv

sys.path.insert(0, str(REPO / "testing" / "providerd"))
import providerd_harness as harness  # noqa: E402

import e2e_targets
from agentix.provider import SandboxConfig
from agentix.provider.local import LocalProvider, default_socket
from agentix.provider.service import ServiceProvider
from agentix.provider.v1 import provider_pb2 as pb

PROVIDERD = BAZEL_BIN / "providers" / "agentix-providerd"

PROBE = '''
"""Probes run inside a sandbox by testing/e2e/test_provider_client.py."""
import os


def env(name):
    return os.environ.get(name)


def shm_bytes():
    stat = os.statvfs("/dev/shm")
    return stat.f_blocks * stat.f_frsize
'''


@pytest.fixture(autouse=True)
def _needs_bubblewrap_and_providerd():
    # Failures, not skips: tools/setup installs bubblewrap, //... builds providerd.
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required: apt-get install bubblewrap")
    if not PROVIDERD.is_file():
        pytest.fail(f"{PROVIDERD} is missing: bazel build //providers:agentix-providerd")


@pytest.fixture(scope="module")
def bundle():
    """A development bundle: bootstrap.sh execs the Bazel-built daemon (the
    sandbox's root is the host's, read-only), plus a probe module."""
    directory = Path(tempfile.mkdtemp(prefix="agx-pcb-"))
    runtime = directory / "nix" / "runtime"
    (runtime / "probe").mkdir(parents=True)
    (runtime / "probe" / "provider_client_probe.py").write_text(PROBE)
    (runtime / "bootstrap.sh").write_text(
        "#!/bin/sh\n"
        f'exec {os.path.realpath(SANDBOXD)} --listen "$AGENTIX_LISTEN" --worker {os.path.realpath(WORKER)} '
        f'--venv {_venv()} --python-path {TARGETS_DIR}:/nix/runtime/probe {" ".join(DIRECT_CALLS_ARGS)} "$@"\n'
    )
    (runtime / "bootstrap.sh").chmod(0o755)
    sys.path.insert(0, str(runtime / "probe"))
    yield directory
    sys.path.remove(str(runtime / "probe"))
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def user_env(monkeypatch):
    """A fresh per-user runtime directory and a providerd stand-in that adds a
    short private state directory; stops every providerd started on it."""
    base = Path(tempfile.mkdtemp(prefix="agx-pc-"))
    runtime = base / "xdg"
    runtime.mkdir(mode=0o700)
    state = base / "s"  # providerd's limit: 22 bytes
    wrapper = base / "agentix-providerd"
    # A checkout under /tmp (as CI may use) is bound into the sandboxes.
    binds = "".join(f" {arg}" for arg in harness.sandbox_bind_args())
    wrapper.write_text(f'#!/bin/sh\nexec {PROVIDERD} "$@" --state-dir={state}{binds}\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("AGENTIX_PROVIDERD", str(wrapper))
    monkeypatch.delenv("AGENTIX_PROVIDER_URL", raising=False)
    monkeypatch.delenv("AGENTIX_PROVIDER_TOKEN", raising=False)
    yield base
    for pid in _providerds(str(base)):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while _providerds(str(base)) and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(base, ignore_errors=True)


def _providerds(marker: str) -> list[int]:
    """Pids of agentix-providerd processes whose command line mentions `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if status.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        if argv and argv[0].endswith(b"agentix-providerd") and marker.encode() in b" ".join(argv):
            found.append(int(entry))
    return found


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


_OTHER_PROCESS = """
import asyncio, sys
sys.path.insert(0, {probe!r}); sys.path.insert(0, {targets!r})
import e2e_targets
from agentix.provider import SandboxConfig
from agentix.provider.local import LocalProvider

async def main():
    async with LocalProvider() as provider:
        async with provider.session(SandboxConfig(image="host", bundle={bundle!r})) as sandbox:
            print(await sandbox.remote(e2e_targets.add, 40, 2), provider.url, flush=True)

asyncio.run(main())
"""


async def test_local_provider_starts_the_per_user_providerd_which_outlives_it(user_env, bundle):
    import provider_client_probe

    async with LocalProvider() as provider:
        config = SandboxConfig(image="host", bundle=str(bundle), env={"GREETING": "hi"}, resource={"memory": "256m"})
        async with provider.session(config) as sandbox:
            assert provider.url == f"unix://{default_socket()}"
            assert await sandbox.remote(e2e_targets.add, 2, 3) == 5
            assert await sandbox.remote(provider_client_probe.env, "GREETING") == "hi"
            record = await ServiceProvider(provider.url).describe(sandbox.sandbox_id)
            assert record.spec.resources.memory_bytes == 256 << 20
            assert record.spec.bundle.path == str(bundle.resolve())
        # The service keeps the record; LocalProvider, as before, knows no deleted sandbox.
        assert (await ServiceProvider(provider.url).get(sandbox.sandbox_id)).status == "terminated (deleted)"
        with pytest.raises(KeyError, match="it was deleted"):
            await provider.get(sandbox.sandbox_id)
    (pid,) = _providerds(str(user_env))
    assert _ppid(pid) != os.getpid()  # detached: not this process's child
    assert (user_env / "xdg" / "agentix" / "providerd.log").is_file()

    # Another process finds it and starts none.
    probe_dir = str(bundle / "nix" / "runtime" / "probe")
    code = _OTHER_PROCESS.format(probe=probe_dir, targets=str(TARGETS_DIR), bundle=str(bundle))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["42", f"unix://{default_socket()}"]
    assert _providerds(str(user_env)) == [pid]


async def test_a_server_level_setting_gets_a_private_providerd_stopped_on_aclose(user_env, bundle):
    import provider_client_probe

    provider = LocalProvider(shm_size="8m")
    sandbox = await provider.create(SandboxConfig(image="host", bundle=str(bundle)))
    try:
        assert provider.url != f"unix://{default_socket()}"
        (pid,) = _providerds("--local-shm-size=8388608")
        assert await sandbox.remote(provider_client_probe.shm_bytes) == 8 << 20
        await sandbox.aclose()
    finally:
        await provider.aclose()
    deadline = time.monotonic() + 15
    while _providerds("--local-shm-size=8388608") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _providerds("--local-shm-size=8388608") == []
    assert not default_socket().exists()  # the per-user one was never needed


async def test_service_provider_list_watch_wait_logs_and_errors(user_env, bundle):
    async with LocalProvider() as local:
        # Starts the per-user providerd; then talk to it as any client would.
        first = await local.create(SandboxConfig(image="host", bundle=str(bundle)))
        client = ServiceProvider(local.url)
        events = client.watch("agentix.dev/sandbox-id")
        initial = await asyncio.wait_for(events.__anext__(), 30)
        assert (initial.type, initial.sandbox.id) == (pb.SandboxEvent.ADDED, first.sandbox_id)

        second = await client.create(SandboxConfig(image="host", bundle=str(bundle)), labels={"team": "e2e"})
        assert [s.id for s in await client.list("team=e2e")] == [second.sandbox_id]
        assert (await client.wait(second.sandbox_id, "READY", timeout=30)).status.phase == pb.SandboxStatus.READY
        await client.delete(second.sandbox_id)
        seen = []
        while not seen or seen[-1] != (second.sandbox_id, pb.SandboxStatus.TERMINATED):
            event = await asyncio.wait_for(events.__anext__(), 30)
            seen.append((event.sandbox.id, event.sandbox.status.phase))
        assert seen[0][0] == second.sandbox_id
        await events.aclose()

        logs = b"".join([chunk async for chunk in client.logs(first.sandbox_id)])
        assert logs  # the daemon's own start-up output
        with pytest.raises(KeyError, match="no sandbox 'sbx-missing'") as raised:
            await client.get("sbx-missing")
        assert raised.value.reason == "SANDBOX_NOT_FOUND"
        with pytest.raises(ValueError) as raised:
            await client.create(SandboxConfig(image="host", bundle=str(user_env)))
        assert (raised.value.code, raised.value.reason) == ("INVALID_ARGUMENT", "NOT_A_BUNDLE")
        with pytest.raises(ValueError) as raised:
            await client.list("a in (")
        assert raised.value.reason == "INVALID_LABEL_SELECTOR"
        await client.aclose()


async def test_the_cli_lists_and_deletes(user_env, bundle):
    async with LocalProvider() as local:
        sandbox = await local.create(SandboxConfig(image="host", bundle=str(bundle)))
        env = {**os.environ, "AGENTIX_PROVIDER_URL": local.url}
        cli = [sys.executable, "-m", "agentix"]
        listed = subprocess.run([*cli, "sandbox", "ls", "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        (record,) = json.loads(listed.stdout)["sandboxes"]
        assert (record["id"], record["status"]["phase"]) == (sandbox.sandbox_id, "READY")
        table = subprocess.run([*cli, "sandbox", "ls"], env=env, capture_output=True, text=True, timeout=60)
        assert table.stdout.splitlines()[1].split()[:3] == [sandbox.sandbox_id, "READY", "COLD"]
        removed = subprocess.run([*cli, "sandbox", "rm", sandbox.sandbox_id], env=env, capture_output=True,
                                 text=True, timeout=60)
        assert (removed.returncode, removed.stdout) == (0, f"deleted {sandbox.sandbox_id}\n")
        assert (await ServiceProvider(local.url).get(sandbox.sandbox_id)).status == "terminated (deleted)"
        with pytest.raises(KeyError, match="it was deleted"):
            await local.delete(sandbox.sandbox_id)
        missing = subprocess.run([*cli, "sandbox", "get", "sbx-nope"], env=env, capture_output=True, text=True,
                                 timeout=60)
        assert missing.returncode == 1 and "SANDBOX_NOT_FOUND (NOT_FOUND)" in missing.stderr


@pytest.fixture
def slow_bundle(bundle, tmp_path):
    """`bundle` whose daemon starts 2 s late, so a create is surely still under way when
    a test cancels it (a cold create takes ~30 ms since the daemon links statically)."""
    slow = tmp_path / "slow"
    shutil.copytree(bundle, slow)
    script = slow / "nix" / "runtime" / "bootstrap.sh"
    script.write_text(script.read_text().replace("#!/bin/sh\n", "#!/bin/sh\nsleep 2\n", 1))
    return slow


async def test_a_cancelled_create_leaves_no_sandbox_running(user_env, slow_bundle):
    local = LocalProvider()
    creating = asyncio.ensure_future(local.create(SandboxConfig(image="host", bundle=str(slow_bundle))))
    url = None
    while url is None:  # the per-user providerd is up once the provider has a URL
        await asyncio.sleep(0.005)
        url = local.url
    await asyncio.sleep(0.03)  # the create is under way on the service
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    await local.aclose()  # waits for the background delete
    client = ServiceProvider(url)
    records = await client.list(include_terminated=True)
    assert len(records) == 1
    assert (records[0].status.phase, records[0].status.exit.reason) == (pb.SandboxStatus.TERMINATED, pb.Exit.DELETED)
    await client.aclose()
