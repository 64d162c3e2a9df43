"""agentix-providerd with its docker and podman backends, end to end.

A real dockerd and a real podman service are started by this module (as
test_engine_backend.py does: own roots under /tmp, a busybox-only image
imported, the real bundler's bundle) and stopped at its end. Per engine, one
providerd started with ``--docker-socket`` / ``--podman-socket`` is driven over
its gRPC contract (plain stubs, `providerd_harness`), and a user's view is
checked: create → a remote call with the returned token → logs → delete;
a memory limit ending in TERMINATED OOM_KILLED (137); a pids limit; the
bundle as the only Python in the container; a warm pool whose claims are
WARM and armed with their env; definite errors for bad input; and a
``kill -9`` + restart of providerd that adopts its live containers again
(same token, still answering) and destroys an orphan. At the end no
container, mount or run dir is left.

Run: bazel build //... && tools/make_venv $PWD/.venv-test &&
     .venv-test/bin/python -m pytest -q -p no:cacheprovider -o asyncio_mode=auto \
         --timeout=300 testing/e2e/test_engine_providerd.py
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import grpc
import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "testing" / "providerd"))
sys.path.insert(0, str(REPO / "testing" / "engines"))
sys.path.insert(0, str(Path(__file__).parent))

import providerd_harness as harness  # noqa: E402
from test_engine_backend import bundle_app  # noqa: E402
from engines import IMAGE, _mounts_under, _unmount_all_under  # noqa: E402

pb, pb_grpc = harness.stubs()
Phase = pb.SandboxStatus
CREATE_TIMEOUT_S = 90.0
CALL_TIMEOUT_S = 60.0


# ------------------------------------------------------------------ fixtures --

@pytest.fixture(scope="module")
def engine(engine_service):
    """The session's engine (conftest.py); none of this module's containers
    may be left at its end."""
    if engine_service.proc.poll() is not None:
        engine_service.start()
    yield engine_service
    leftovers = engine_service.containers()
    for container in leftovers:
        subprocess.run([*engine_service.cli, "rm", "-f", container["Id"]], capture_output=True,
                       env=engine_service.env, timeout=60)
    assert leftovers == [], f"{engine_service.kind}: containers left behind: {leftovers}"


@pytest.fixture(scope="module")
def bundle(engine_bundle):
    if not harness.find_providerd().exists():
        pytest.fail("run `bazel build //...` first")
    return engine_bundle


@pytest.fixture(scope="module")
def hog_bundle(bundle, tmp_path_factory):
    """The real bundle (hard links) whose entry point also becomes a memory
    hog once /tmp/oom exists: the container's main process is then what the
    OOM killer ends, so the container exits 137."""
    out = tmp_path_factory.mktemp("hog") / "b"
    subprocess.run(["cp", "-al", str(bundle), str(out)], check=True, timeout=120)
    runtime = out / "nix" / "runtime"
    (runtime / "bootstrap.sh").rename(runtime / "bootstrap-real.sh")
    (runtime / "bootstrap.sh").write_text(
        "#!/bin/sh\n"
        "/nix/runtime/bootstrap-real.sh \"$@\" &\n"
        "while [ ! -d /tmp/oom ]; do sleep 0.1; done\n"
        "exec tail /dev/zero\n")
    (runtime / "bootstrap.sh").chmod(0o755)
    return out


class Api:
    def __init__(self, pd):
        self.pd = pd
        self.channel = grpc.aio.insecure_channel(pd.target)
        self.stub = pb_grpc.ProviderServiceStub(self.channel)
        self.md = pd.metadata

    async def create(self, spec, *, timeout=CREATE_TIMEOUT_S, **fields):
        request = pb.CreateSandboxRequest(request_id=str(uuid.uuid4()), spec=spec, **fields)
        return await self.stub.CreateSandbox(request, metadata=self.md, timeout=timeout)

    async def get(self, sandbox_id):
        return await self.stub.GetSandbox(pb.GetSandboxRequest(id=sandbox_id), metadata=self.md,
                                          timeout=10)

    async def delete(self, sandbox_id):
        request = pb.DeleteSandboxRequest(id=sandbox_id, wait=True, grace=harness.duration(1))
        return (await self.stub.DeleteSandbox(request, metadata=self.md, timeout=60)).sandbox

    async def wait_terminated(self, sandbox_id, timeout=60):
        request = pb.WaitSandboxRequest(id=sandbox_id, until=Phase.TERMINATED,
                                        timeout=harness.duration(min(timeout, 50)))
        return (await self.stub.WaitSandbox(request, metadata=self.md, timeout=timeout + 5)).sandbox

    async def close(self):
        await self.channel.close()


@pytest.fixture
async def pd(engine, bundle):
    """A providerd of this test's own serving `engine`; at the end every
    sandbox and pool is deleted, providerd stopped, and nothing of it may be
    left: no container of its instance, no run dir, no mount."""
    workdir = Path(tempfile.mkdtemp(prefix="pe-", dir="/tmp"))
    service = harness.Providerd(workdir, extra_args=[f"--{engine.kind}-socket", str(engine.socket)])
    service.start()
    yield service
    try:
        if service.proc.poll() is None:
            api = Api(service)
            try:
                pools = await api.stub.ListWarmPools(pb.ListWarmPoolsRequest(), metadata=api.md,
                                                     timeout=10)
                for pool in pools.pools:
                    await api.stub.DeleteWarmPool(pb.DeleteWarmPoolRequest(name=pool.name),
                                                  metadata=api.md, timeout=60)
                listed = await api.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=api.md,
                                                      timeout=10)
                await asyncio.gather(*(api.delete(s.id) for s in listed.sandboxes))
            finally:
                await api.close()
        service.stop()
        assert engine.containers(service.instance) == [], service.log()
        run_root = service.state_dir / ("dk" if engine.kind == "docker" else "pm")
        assert not _mounts_under(service.state_dir)
        assert not run_root.exists() or os.listdir(run_root) == []
    finally:
        for container in engine.containers(service.instance):
            subprocess.run([*engine.cli, "rm", "-f", container["Id"]], capture_output=True,
                           env=engine.env, timeout=60)
        _unmount_all_under(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
async def api(pd):
    client = Api(pd)
    yield client
    await client.close()


def spec(engine, bundle, **fields):
    fields.setdefault("image", IMAGE)
    return pb.SandboxSpec(backend=engine.kind, bundle=pb.BundleRef(path=str(bundle)),
                          ttl=harness.duration(600), **fields)


async def remote(sandbox, token, fn, *args, **kwargs):
    from agentix import RuntimeClient

    async with RuntimeClient(sandbox.status.endpoint.target, token=token) as client:
        return await asyncio.wait_for(client.remote(fn, *args, **kwargs), CALL_TIMEOUT_S)


async def read_logs(api, sandbox_id):
    stream = api.stub.StreamSandboxLogs(pb.StreamSandboxLogsRequest(id=sandbox_id),
                                        metadata=api.md, timeout=30)
    return b"".join([chunk.data async for chunk in stream]).decode(errors="replace")


# --------------------------------------------------------------------- tests --

async def test_capabilities_list_the_engine(api, engine):
    caps = await api.stub.GetCapabilities(pb.GetCapabilitiesRequest(), metadata=api.md, timeout=10)
    names = {b.name: b for b in caps.backends}
    assert set(names) == {"local", engine.kind}
    assert caps.default_backend == "local"
    assert names[engine.kind].memory_limit and names[engine.kind].pids_limit
    assert engine.kind in names[engine.kind].version


async def test_create_call_logs_delete_and_the_bundle_is_the_only_python(api, engine, bundle):
    created = await api.create(spec(engine, bundle, resources=pb.Resources(memory_bytes=512 << 20)))
    sandbox = created.sandbox
    assert sandbox.status.phase == Phase.READY, sandbox
    assert sandbox.spec.backend == engine.kind
    container = engine.api(f"/containers/{sandbox.status.backend_ref}/json")
    assert container["State"]["Running"]
    assert container["Config"]["Labels"]["agentix.dev/managed-by"] == api.pd.instance
    assert container["HostConfig"]["Memory"] == 512 << 20
    assert await remote(sandbox, created.credentials.access_token, bundle_app.add, 2, 3) == 5
    info = await remote(sandbox, created.credentials.access_token, bundle_app.runtime_info)
    assert info["base_prefix"] == "/nix/runtime/python"
    # The image is busybox only: no python anywhere but the bundle's /nix.
    assert info["prefix"].startswith("/nix/")
    system_path = "/bin:/sbin:/usr/bin:/usr/sbin:/usr/local/bin"
    for name in ("python3", "python"):
        assert await remote(sandbox, created.credentials.access_token, shutil.which, name,
                            path=system_path) is None
    # Without the token the daemon refuses.
    from agentix import RuntimeClient

    with pytest.raises(Exception):
        async with RuntimeClient(sandbox.status.endpoint.target) as anonymous:
            await asyncio.wait_for(anonymous.remote(bundle_app.add, 1, 1), 30)
    logs = await read_logs(api, sandbox.id)
    assert "serving agentix.runtime.v1 on unix:///run/agentix/agentix.sock" in logs, logs
    deleted = await api.delete(sandbox.id)
    assert deleted.status.phase == Phase.TERMINATED
    assert deleted.status.exit.reason == pb.Exit.DELETED
    assert engine.containers(api.pd.instance) == []


async def test_memory_limit_ends_in_oom_killed_137(api, engine, hog_bundle):
    created = await api.create(spec(engine, hog_bundle,
                                    resources=pb.Resources(memory_bytes=64 << 20)))
    assert created.sandbox.status.phase == Phase.READY
    await remote(created.sandbox, created.credentials.access_token, os.mkdir, "/tmp/oom")
    ended = await api.wait_terminated(created.sandbox.id)
    assert ended.status.phase == Phase.TERMINATED, ended
    assert ended.status.exit.reason == pb.Exit.OOM_KILLED, ended.status.exit
    assert ended.status.exit.exit_code == 137


async def test_pids_limit_stops_forks(api, engine, bundle):
    created = await api.create(spec(engine, bundle, resources=pb.Resources(pids=96)))
    container = engine.api(f"/containers/{created.sandbox.status.backend_ref}/json")
    assert container["HostConfig"]["PidsLimit"] == 96
    status, output = await remote(created.sandbox, created.credentials.access_token,
                                  subprocess.getstatusoutput,
                                  "for i in $(seq 150); do sleep 3 & done; wait")
    assert "fork" in output.lower() or "resource temporarily unavailable" in output.lower(), \
        (status, output)
    # The sandbox itself still serves.
    assert await remote(created.sandbox, created.credentials.access_token, bundle_app.add, 1, 2) == 3


async def test_warm_pool_claims_are_warm_and_armed_with_their_env(api, engine, bundle):
    template = spec(engine, bundle)
    pool = pb.WarmPool(name="p", template=template, min_ready=2, max_total=3)
    await api.stub.CreateWarmPool(pb.CreateWarmPoolRequest(pool=pool), metadata=api.md, timeout=10)
    for _ in range(600):
        got = await api.stub.GetWarmPool(pb.GetWarmPoolRequest(name="p"), metadata=api.md, timeout=10)
        if got.status.ready >= 2:
            break
        await asyncio.sleep(0.1)
    assert got.status.ready >= 2, got
    for mode in ("a", "b"):
        claim = spec(engine, bundle, warm_pool="p", env={"MODE": mode})
        created = await api.create(claim)
        assert created.sandbox.status.launch == Phase.WARM, created.sandbox.status
        assert await remote(created.sandbox, created.credentials.access_token, os.getenv, "MODE") == mode
        await api.delete(created.sandbox.id)


def _code_and_reason(error):
    return error.code().name, harness.error_reason(error)


async def test_bad_input_gets_a_definite_error_and_changes_nothing(api, engine, bundle):
    before = engine.containers()
    cases = [
        (spec(engine, bundle, image="localhost/not-loaded:1"), "FAILED_PRECONDITION",
         "IMAGE_NOT_PRESENT", f"{engine.kind} load"),
        (spec(engine, bundle, resources=pb.Resources(gpus=1)), "FAILED_PRECONDITION",
         "LIMIT_NOT_ENFORCEABLE", "GPU"),
        (spec(engine, bundle, resources=pb.Resources(nofile=1 << 30)), "FAILED_PRECONDITION",
         "LIMIT_NOT_ENFORCEABLE", "nofile"),
        (spec(engine, bundle, network=pb.Network(mode=pb.Network.BRIDGE)), "FAILED_PRECONDITION",
         "LIMIT_NOT_ENFORCEABLE", "BRIDGE"),
    ]
    for bad, code, reason, says in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await api.create(bad)
        assert _code_and_reason(caught.value) == (code, reason), caught.value
        assert says.lower() in caught.value.details().lower(), caught.value.details()
    assert engine.containers() == before
    listed = await api.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=api.md, timeout=10)
    assert list(listed.sandboxes) == []
    # Still serving.
    created = await api.create(spec(engine, bundle))
    assert created.sandbox.status.phase == Phase.READY
    await api.delete(created.sandbox.id)


async def test_engine_socket_missing_is_unavailable_and_retryable(engine, bundle, tmp_path):
    workdir = Path(tempfile.mkdtemp(prefix="pm-", dir="/tmp"))
    service = harness.Providerd(workdir, extra_args=[f"--{engine.kind}-socket",
                                                     str(workdir / "nothing.sock")])
    try:
        service.start()  # an engine that is down does not keep providerd from serving
        api = Api(service)
        try:
            caps = await api.stub.GetCapabilities(pb.GetCapabilitiesRequest(), metadata=api.md,
                                                  timeout=10)
            mine = [b for b in caps.backends if b.name == engine.kind]
            assert mine and "unreachable" in mine[0].detail, caps
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await api.create(spec(engine, bundle))
            assert _code_and_reason(caught.value) == ("UNAVAILABLE", "ENGINE_UNAVAILABLE")
            assert harness.retry_after_ms(caught.value), caught.value.trailing_metadata()
            listed = await api.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=api.md,
                                                  timeout=10)
            assert list(listed.sandboxes) == []
        finally:
            await api.close()
    finally:
        service.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def test_kill9_and_restart_adopts_live_containers_and_destroys_orphans(api, engine, bundle):
    pd = api.pd
    first = await api.create(spec(engine, bundle))
    second = await api.create(spec(engine, bundle))
    # An orphan: a container of this instance the journal does not know.
    orphan_id = engine.run_cli(
        "create", "--label", f"agentix.dev/managed-by={pd.instance}",
        "--label", "agentix.dev/sandbox-id=orphan-1", "--network", "none", IMAGE,
        "sleep", "600").strip()
    pd.kill9()
    # One of them dies while providerd is down.
    engine.run_cli("rm", "-f", second.sandbox.status.backend_ref)
    pd.start()
    await api.close()
    fresh = Api(pd)
    try:
        kept = await fresh.get(first.sandbox.id)
        assert kept.status.phase == Phase.READY, kept
        assert kept.status.backend_ref == first.sandbox.status.backend_ref
        # Same token, same endpoint: it still answers.
        assert await remote(kept, first.credentials.access_token, bundle_app.add, 20, 22) == 42
        lost = await fresh.get(second.sandbox.id)
        assert lost.status.phase == Phase.TERMINATED
        assert lost.status.exit.reason == pb.Exit.BACKEND_LOST
        ids = [c["Id"] for c in engine.containers(pd.instance)]
        assert ids == [first.sandbox.status.backend_ref], (ids, orphan_id)
        # Its events still reach providerd: deleted through the API, it goes.
        deleted = await fresh.delete(first.sandbox.id)
        assert deleted.status.exit.reason == pb.Exit.DELETED
        assert engine.containers(pd.instance) == []
    finally:
        await fresh.close()
        api.channel = grpc.aio.insecure_channel(pd.target)  # for the fixture's close


async def test_python_provider_session_on_the_engine(api, engine, bundle, monkeypatch):
    """`agentix.provider.docker.DockerProvider` / `PodmanProvider`, as the
    entry-point registry hands them out, through this providerd."""
    from agentix.provider import SandboxConfig, SandboxResource, providers

    monkeypatch.setenv("AGENTIX_PROVIDER_URL", api.pd.target)
    monkeypatch.setenv("AGENTIX_PROVIDER_TOKEN", api.pd.token)
    provider_class = providers().get(engine.kind)
    assert provider_class.__name__ == ("DockerProvider" if engine.kind == "docker" else "PodmanProvider")
    async with provider_class() as provider:
        config = SandboxConfig(image=IMAGE, bundle=str(bundle), env={"WHO": engine.kind},
                               resource=SandboxResource(memory="256m"))
        async with provider.session(config) as sandbox:
            assert await asyncio.wait_for(sandbox.remote(bundle_app.add, 4, 5), CALL_TIMEOUT_S) == 9
            assert await sandbox.remote(os.getenv, "WHO") == engine.kind
            assert (await provider.get(sandbox.sandbox_id)).status == "running"
            container = engine.api(f"/containers/{ContainerName(sandbox.sandbox_id)}/json")
            assert container["HostConfig"]["Memory"] == 256 << 20
        assert engine.containers(api.pd.instance) == []


def ContainerName(sandbox_id):  # noqa: N802  (as the backend names it)
    return f"agentix-{sandbox_id}"
