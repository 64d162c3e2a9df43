"""agentix.provider.service.ServiceProvider against a fake ProviderService
(tests/fake_provider.py) on a Unix socket: the config -> spec mapping, create
retries with one request_id, error mapping, watch resume / relist / dedup,
waits, logs and pools."""

import asyncio
import uuid

import grpc
import pytest
import pytest_asyncio

from agentix.provider import SandboxConfig, SandboxResource
from agentix.provider import errors
from agentix.provider.service import ServiceProvider, runtime_url, spec_from_config
from agentix.provider.v1 import provider_pb2 as pb
from fake_provider import Fault


@pytest.fixture
def service(fake):
    """conftest's `fake` (a FakeProviderService on short_dir/p.sock)."""
    return fake


@pytest_asyncio.fixture
async def provider(service):
    client = ServiceProvider(service.url, max_retry_delay=0.01)
    yield client
    await client.aclose()


CONFIG = SandboxConfig(image="host", bundle="/bundles/demo")


# ------------------------------------------------------------------ mapping

def test_config_maps_onto_the_spec():
    config = SandboxConfig(
        image="ubuntu:22.04", bundle="/b", platform="linux/amd64", env={"A": "1"},
        resource=SandboxResource(cpu=1.5, memory="512m", gpu=2),
    )
    spec = spec_from_config(config, backend="docker", ttl=90.5, network="host", pids=64, scratch_bytes="1g")
    assert spec.image == "ubuntu:22.04" and spec.bundle.path == "/b" and spec.platform == "linux/amd64"
    assert dict(spec.env) == {"A": "1"} and spec.backend == "docker"
    assert (spec.resources.cpu_millis, spec.resources.memory_bytes, spec.resources.gpus) == (1500, 512 << 20, 2)
    assert (spec.resources.pids, spec.resources.scratch_bytes) == (64, 1 << 30)
    assert spec.network.mode == pb.Network.HOST
    assert (spec.ttl.seconds, spec.ttl.nanos) == (90, 500_000_000)


def test_unset_fields_stay_zero_and_bundle_forms(tmp_path, monkeypatch):
    spec = spec_from_config(SandboxConfig(image="host", bundle="/b"))
    assert not spec.HasField("resources") and not spec.HasField("ttl") and spec.platform == ""
    assert spec_from_config(SandboxConfig(image="host", bundle="oci-ref:reg/b:1")).bundle.oci_reference == "reg/b:1"
    (tmp_path / "rel").mkdir()
    monkeypatch.chdir(tmp_path)
    assert spec_from_config(SandboxConfig(image="host", bundle="rel")).bundle.path == str(tmp_path / "rel")
    assert spec_from_config(SandboxConfig(image="host", bundle="x", resource={"cpu": 0.0001})).resources.cpu_millis == 1


def test_bad_memory_and_network_are_value_errors():
    with pytest.raises(ValueError, match="SandboxResource.memory"):
        spec_from_config(SandboxConfig(image="host", bundle="/b", resource={"memory": "lots"}))
    with pytest.raises(ValueError, match="network"):
        spec_from_config(CONFIG, network="wifi")


def test_runtime_urls_from_endpoints():
    assert runtime_url(pb.Endpoint(target="unix:///s/a.sock")) == "unix:///s/a.sock"
    assert runtime_url(pb.Endpoint(target="ipv4:10.0.0.7:50051")) == "10.0.0.7:50051"
    assert runtime_url(pb.Endpoint(target="ipv6:[::1]:5", tls=True)) == "https://[::1]:5"
    assert runtime_url(pb.Endpoint(target="dns:///h:1")) == "h:1"


def test_bad_addresses_are_refused():
    with pytest.raises(ValueError):
        ServiceProvider("ftp://x")


# ------------------------------------------------------------------- create

@pytest.mark.asyncio
async def test_create_returns_a_sandbox_wired_to_its_endpoint_and_token(service, provider):
    provider.labels = {"team": "a"}
    sandbox = await provider.create(CONFIG, labels={"job": "7"}, ttl=600, ready_timeout=5)
    record = service.records[sandbox.sandbox_id]
    assert sandbox.runtime_url == record.status.endpoint.target
    assert sandbox.token == service.tokens[sandbox.sandbox_id] and sandbox.status == "running"
    assert sandbox._client is None  # made lazily, as the SandboxProvider contract says
    assert ("authorization", f"Bearer {sandbox.token}") in sandbox.client._metadata
    (_, request), = [c for c in service.calls if c[0] == "CreateSandbox"]
    uuid.UUID(request.request_id)
    assert dict(request.labels) == {"team": "a", "job": "7"}
    assert request.spec.ttl.seconds == 600 and request.ready_timeout.seconds == 5
    assert request.wait == pb.CreateSandboxRequest.WAIT_READY
    await sandbox.aclose()


@pytest.mark.asyncio
async def test_every_create_has_a_fresh_request_id(service, provider):
    await provider.create(CONFIG)
    await provider.create(CONFIG)
    ids = [request.request_id for method, request in service.calls if method == "CreateSandbox"]
    assert len(set(ids)) == 2 and len(service.records) == 2


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "code, reason, retry_after_ms",
    [
        (grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN", None),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "", None),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED", 30),
        (grpc.StatusCode.ABORTED, "", None),
    ],
)
async def test_retryable_errors_are_retried_with_the_same_request_id(service, provider, code, reason, retry_after_ms):
    service.faults = [Fault("CreateSandbox", code, reason, retry_after_ms)] * 2
    sandbox = await provider.create(CONFIG)
    ids = [request.request_id for method, request in service.calls if method == "CreateSandbox"]
    assert len(ids) == 3 and len(set(ids)) == 1
    assert list(service.records) == [sandbox.sandbox_id]


@pytest.mark.asyncio
async def test_retry_after_is_honoured(service, provider):
    service.faults = [Fault("CreateSandbox", grpc.StatusCode.RESOURCE_EXHAUSTED, "POOL_EMPTY", 300)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    await provider.create(CONFIG)
    assert loop.time() - start >= 0.29


@pytest.mark.asyncio
async def test_a_dropped_response_is_collected_by_the_retry_not_made_twice(service, provider):
    service.drop_response_after_create = 2
    sandbox = await provider.create(CONFIG)
    assert list(service.records) == [sandbox.sandbox_id]
    assert sandbox.token == service.tokens[sandbox.sandbox_id]


@pytest.mark.asyncio
async def test_a_cancelled_create_deletes_what_the_service_made(service, provider):
    service.ready_delay = 0.5
    creating = asyncio.ensure_future(provider.create(CONFIG))
    await asyncio.sleep(0.2)
    assert list(service.records) == ["sbx-1"]
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    await provider.aclose()  # waits for the background delete
    assert service.records["sbx-1"].status.phase == pb.SandboxStatus.TERMINATED
    creates = [r.request_id for m, r in service.calls if m == "CreateSandbox"]
    assert len(creates) == 2 and len(set(creates)) == 1  # collected by a replay, not a new sandbox


@pytest.mark.asyncio
async def test_retries_are_bounded(service):
    provider = ServiceProvider(service.url, create_attempts=3, max_retry_delay=0.01)
    service.faults = [Fault("CreateSandbox", grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN", message="going away")] * 5
    with pytest.raises(errors.ProviderUnavailable, match="going away") as raised:
        await provider.create(CONFIG)
    assert isinstance(raised.value, ConnectionError) and raised.value.reason == "SHUTTING_DOWN"
    assert len([c for c in service.calls if c[0] == "CreateSandbox"]) == 3
    await provider.aclose()


@pytest.mark.asyncio
async def test_non_retryable_errors_are_not_retried(service, provider):
    service.faults = [Fault("CreateSandbox", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SPEC", message="bad image")]
    with pytest.raises(ValueError, match="bad image") as raised:
        await provider.create(CONFIG)
    assert (raised.value.code, raised.value.reason) == ("INVALID_ARGUMENT", "INVALID_SPEC")
    assert len([c for c in service.calls if c[0] == "CreateSandbox"]) == 1


# ------------------------------------------------------------------- errors

@pytest.mark.asyncio
async def test_errors_keep_the_in_process_providers_types(service, provider):
    with pytest.raises(ValueError, match="not a bundle") as raised:
        await provider.create(SandboxConfig(image="host", bundle="/x/not-a-bundle"))
    assert isinstance(raised.value, errors.InvalidRequest) and raised.value.reason == "NOT_A_BUNDLE"

    gpu = SandboxConfig(image="host", bundle="/b", resource=SandboxResource(gpu=1))
    with pytest.raises(ValueError, match="GPU") as raised:
        await provider.create(gpu)
    assert isinstance(raised.value, RuntimeError) and raised.value.reason == "LIMIT_NOT_ENFORCEABLE"

    with pytest.raises(RuntimeError, match="boom") as raised:
        await provider.create(SandboxConfig(image="fail-start", bundle="/b"))
    assert isinstance(raised.value, errors.SandboxStartFailed) and raised.value.code == "FAILED_PRECONDITION"

    with pytest.raises(TimeoutError, match="still starting") as raised:
        await provider.create(SandboxConfig(image="too-slow", bundle="/b"))
    assert raised.value.reason == "READY_TIMEOUT"
    # A sandbox's own ready timeout is final: not retried.
    assert len([r for m, r in service.calls if m == "CreateSandbox" and r.spec.image == "too-slow"]) == 1


@pytest.mark.asyncio
async def test_unknown_sandbox_ids_are_key_errors(service, provider):
    for call in (provider.get, provider.delete):
        with pytest.raises(KeyError, match="no sandbox 'sbx-nope'") as raised:
            await call("sbx-nope")
        assert (raised.value.code, raised.value.reason) == ("NOT_FOUND", "SANDBOX_NOT_FOUND")
    await provider.delete("sbx-nope", allow_missing=True)


@pytest.mark.asyncio
async def test_reused_request_id_with_another_payload(service, provider):
    await provider.create(CONFIG, request_id="r-1")
    again = await provider.create_sandbox(CONFIG, request_id="r-1")
    assert again.replayed
    with pytest.raises(ValueError) as raised:
        await provider.create(SandboxConfig(image="other", bundle="/b"), request_id="r-1")
    assert raised.value.reason == "REQUEST_ID_REUSED"


@pytest.mark.asyncio
async def test_token_is_sent_and_a_wrong_one_is_a_permission_error(service):
    service.token = "s3cret"
    good = ServiceProvider(service.url, token="s3cret")
    await good.create(CONFIG)
    assert service.metadata_seen[-1]["authorization"] == "Bearer s3cret"
    bad = ServiceProvider(service.url, token="wrong")
    with pytest.raises(PermissionError) as raised:
        await bad.list()
    assert raised.value.code == "UNAUTHENTICATED"
    await good.aclose()
    await bad.aclose()


@pytest.mark.asyncio
async def test_token_from_the_environment(service, monkeypatch):
    monkeypatch.setenv("AGENTIX_PROVIDER_TOKEN", "from-env")
    assert ServiceProvider(service.url).token == "from-env"


@pytest.mark.asyncio
async def test_unreachable_service_says_where_it_looked(short_dir):
    provider = ServiceProvider(f"unix://{short_dir}/nobody.sock", rpc_timeout=2)
    with pytest.raises(ConnectionError, match="is agentix-providerd running at unix://"):
        await provider.list()
    await provider.aclose()


# -------------------------------------------------------- get / list / delete

@pytest.mark.asyncio
async def test_get_and_delete_and_session(service, provider):
    async with provider.session(CONFIG, call_deadline=3.0) as sandbox:
        info = await provider.get(sandbox.sandbox_id)
        assert (info.sandbox_id, info.runtime_url, info.status) == (sandbox.sandbox_id, sandbox.runtime_url, "running")
        assert sandbox.call_deadline == 3.0
    record = service.records[sandbox.sandbox_id]
    assert record.status.phase == pb.SandboxStatus.TERMINATED
    assert (await provider.get(sandbox.sandbox_id)).status == "terminated (deleted)"
    await provider.delete(sandbox.sandbox_id)  # idempotent


@pytest.mark.asyncio
async def test_connect_from_another_client(service, provider):
    made = await provider.create(CONFIG)
    other = ServiceProvider(service.url)
    found = await other.connect(made.sandbox_id)
    assert (found.runtime_url, found.token) == (made.runtime_url, made.token)
    await other.aclose()


@pytest.mark.asyncio
async def test_list_follows_pages_and_filters(service, provider):
    for index in range(7):
        await provider.create(CONFIG, labels={"n": str(index % 2)})
    assert len(await provider.list(page_size=2)) == 7
    assert {s.labels["n"] for s in await provider.list("n=1", page_size=3)} == {"1"}
    list_calls = [r for m, r in service.calls if m == "ListSandboxes"]
    assert len(list_calls) == 4 + 1  # ceil(7/2) pages, then one of three
    await provider.delete("sbx-1")
    assert len(await provider.list()) == 6
    assert len(await provider.list(include_terminated=True)) == 7
    with pytest.raises(ValueError) as raised:
        await provider.list("a b")
    assert raised.value.reason == "INVALID_LABEL_SELECTOR"


@pytest.mark.asyncio
async def test_reads_retry_unavailable(service, provider):
    await provider.create(CONFIG)
    service.faults = [Fault("GetSandbox", grpc.StatusCode.UNAVAILABLE)]
    assert (await provider.get("sbx-1")).status == "running"


# -------------------------------------------------------------------- watch

async def _next(events, timeout=5.0):
    return await asyncio.wait_for(events.__anext__(), timeout)


@pytest.mark.asyncio
async def test_watch_sends_the_current_state_then_changes(service, provider):
    await provider.create(CONFIG)
    events = provider.watch()
    first = await _next(events)
    assert (first.type, first.sandbox.id) == (pb.SandboxEvent.ADDED, "sbx-1")
    await provider.create(CONFIG)
    second = await _next(events)
    assert (second.type, second.sandbox.id) == (pb.SandboxEvent.ADDED, "sbx-2")
    await events.aclose()


@pytest.mark.asyncio
async def test_watch_resumes_after_a_dropped_stream_without_gap_or_duplicate(service, provider):
    service.redeliver = 3  # the server re-sends on reconnect: the client must drop them
    await provider.create(CONFIG)
    events = provider.watch()
    assert (await _next(events)).sandbox.id == "sbx-1"
    seen = []
    for round_ in range(5):
        await provider.create(CONFIG)
        seen.append(await _next(events))
        service.drop_watches()
        await asyncio.sleep(0.02)
    await provider.create(CONFIG)
    seen.append(await _next(events))
    versions = [event.resource_version for event in seen]
    assert versions == sorted(set(versions))
    assert [event.sandbox.id for event in seen] == [f"sbx-{n}" for n in range(2, 8)]
    watch_calls = [r for m, r in service.calls if m == "WatchSandboxes"]
    assert len(watch_calls) >= 6 and all(r.epoch == service.epoch for r in watch_calls)
    assert watch_calls[-1].resource_version > 0
    await events.aclose()


@pytest.mark.asyncio
async def test_watch_relists_on_out_of_range_and_reports_what_changed(service, provider):
    service.history_size = 2
    for _ in range(3):
        await provider.create(CONFIG)
    events = provider.watch()
    assert {(await _next(events)).sandbox.id for _ in range(3)} == {"sbx-1", "sbx-2", "sbx-3"}
    # While the stream is down, more happens than the history keeps, and sbx-1 leaves entirely.
    service.drop_watches()
    service.faults = [Fault("WatchSandboxes", grpc.StatusCode.UNAVAILABLE)]
    for _ in range(3):
        await provider.create(CONFIG)
    await provider.delete("sbx-2")
    del service.records["sbx-1"]
    got = [await _next(events) for _ in range(5)]
    kinds = {(event.type, event.sandbox.id) for event in got}
    assert kinds == {
        (pb.SandboxEvent.ADDED, "sbx-4"), (pb.SandboxEvent.ADDED, "sbx-5"), (pb.SandboxEvent.ADDED, "sbx-6"),
        (pb.SandboxEvent.MODIFIED, "sbx-2"), (pb.SandboxEvent.DELETED, "sbx-1"),
    }
    relist_reasons = [m for m, _ in service.calls if m == "ListSandboxes"]
    assert len(relist_reasons) == 2
    # And then it watches on from the relisted version.
    await provider.create(CONFIG)
    assert (await _next(events)).sandbox.id == "sbx-7"
    await events.aclose()


@pytest.mark.asyncio
async def test_watch_relists_after_a_service_restart(service, provider):
    await provider.create(CONFIG)
    events = provider.watch()
    await _next(events)
    service.restart()
    service.drop_watches()
    await provider.create(CONFIG)
    event = await _next(events)
    assert (event.type, event.sandbox.id) == (pb.SandboxEvent.ADDED, "sbx-2")
    await provider.create(CONFIG)
    assert (await _next(events)).sandbox.id == "sbx-3"
    assert [r.epoch for m, r in service.calls if m == "WatchSandboxes"][-1] == service.epoch
    await events.aclose()


@pytest.mark.asyncio
async def test_watch_gives_up_after_bounded_failures(service, provider):
    events = provider.watch(max_reconnects=2)
    service.faults = [Fault("WatchSandboxes", grpc.StatusCode.UNAVAILABLE)] * 5
    with pytest.raises(ConnectionError, match="3 reconnects in a row"):
        await _next(events)


# ------------------------------------------------------- wait / extend / logs

@pytest.mark.asyncio
async def test_wait_for_phases(service, provider):
    sandbox = await provider.create(CONFIG)
    assert (await provider.wait(sandbox.sandbox_id, "READY")).status.phase == pb.SandboxStatus.READY
    with pytest.raises(TimeoutError, match="not TERMINATED"):
        await provider.wait(sandbox.sandbox_id, "TERMINATED", timeout=0.2)
    service.set_phase(sandbox.sandbox_id, pb.SandboxStatus.TERMINATED, pb.Exit.OOM_KILLED, "killed")
    assert (await provider.wait(sandbox.sandbox_id, "terminated")).status.exit.reason == pb.Exit.OOM_KILLED


@pytest.mark.asyncio
async def test_wait_for_a_sandbox_that_ended_raises_with_its_log_tail(service, provider):
    sandbox = await provider.create(CONFIG)
    service.set_phase(sandbox.sandbox_id, pb.SandboxStatus.STARTING)

    async def end_it():
        await asyncio.sleep(0.05)
        service.set_phase(sandbox.sandbox_id, pb.SandboxStatus.TERMINATED, pb.Exit.START_FAILED, "bad bootstrap")

    ender = asyncio.ensure_future(end_it())
    with pytest.raises(RuntimeError, match="bad bootstrap") as raised:
        await provider.wait(sandbox.sandbox_id, "READY", timeout=5)
    assert raised.value.reason == "START_FAILED"
    await ender


@pytest.mark.asyncio
async def test_extend(service, provider):
    sandbox = await provider.create(CONFIG)
    record = await provider.extend(sandbox.sandbox_id, 3600)
    assert record.status.expire_time.seconds == 1_000_000 + 3600
    await provider.delete(sandbox.sandbox_id)
    with pytest.raises(RuntimeError) as raised:
        await provider.extend(sandbox.sandbox_id, 60)
    assert raised.value.reason == "SANDBOX_TERMINATED"


@pytest.mark.asyncio
async def test_logs_in_order_across_a_dropped_stream(service, provider):
    sandbox = await provider.create(CONFIG)
    service.logs[sandbox.sandbox_id] = b"0123456789abcdefghij"
    service.drop_logs_after = 8
    data = b"".join([chunk async for chunk in provider.logs(sandbox.sandbox_id)])
    assert data == b"0123456789abcdefghij"
    offsets = [r.offset for m, r in service.calls if m == "StreamSandboxLogs"]
    assert offsets == [0, 8]
    tail = b"".join([chunk async for chunk in provider.logs(sandbox.sandbox_id, offset=15)])
    assert tail == b"fghij"


# -------------------------------------------------------------------- pools

@pytest.mark.asyncio
async def test_pools(service, provider):
    pool = await provider.create_pool("small", CONFIG, min_ready=2, max_total=4, update_strategy="on_replenish")
    assert (pool.min_ready, pool.max_total, pool.template.bundle.path) == (2, 4, "/bundles/demo")
    assert pool.update_strategy == pb.WarmPool.ON_REPLENISH
    assert [p.name for p in await provider.list_pools()] == ["small"]
    with pytest.raises(ValueError) as raised:
        await provider.create_pool("small", CONFIG, min_ready=1)
    assert raised.value.reason == "POOL_EXISTS"
    updated = await provider.update_pool("small", CONFIG, min_ready=3)
    assert (updated.min_ready, updated.max_total) == (3, 3)
    assert (await provider.get_pool("small")).min_ready == 3
    await provider.delete_pool("small")
    with pytest.raises(KeyError) as raised:
        await provider.delete_pool("small")
    assert raised.value.reason == "POOL_NOT_FOUND"
    await provider.delete_pool("small", allow_missing=True)
    assert (await provider.capabilities()).default_backend == "local"
