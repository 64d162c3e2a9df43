"""End to end: the real `agentix-providerd` with real bubblewrap sandboxes.

Every test talks to the service over its gRPC contract
(proto/agentix/provider/v1/provider.proto) with plain grpcio stubs, never the
Python client, and checks what a user of the service sees: the records, the
watch stream, the error codes and reasons, and the machine (processes,
cgroups, mounts) behind them. Sandboxes run a development bundle whose
bootstrap.sh execs the Bazel-built daemon; the first remote call goes through
the endpoint and token the service hands out (agentix.RuntimeClient).

These are issue 19's acceptance items (docs/PROVIDERS.md, PROVIDER-SERVICE.md
§8.3 and §8.10 T6, T7, T8, T10): idempotent creates across dropped responses
and a `kill -9` + restart, a watch resumed 100 times without a gap, TTL expiry
within 1 s, orphans destroyed within 5 s of a restart, the warm-pool bound
under a 200-claim burst, and definite errors for bad input.

Run: bazel build //... && tools/make_venv $PWD/.venv-test &&
     .venv-test/bin/python -m pytest -q -p no:cacheprovider -o asyncio_mode=auto \
         --timeout=300 testing/e2e/test_providerd.py
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import pytest

from conftest import DIRECT_CALLS_ARGS, REPO, SANDBOXD, TARGETS_DIR, WORKER, _venv

sys.path.insert(0, str(REPO / "testing" / "providerd"))

import e2e_targets  # noqa: E402
import providerd_harness as harness  # noqa: E402

pb, pb_grpc = harness.stubs()
Phase = pb.SandboxStatus
Reason = pb.Exit

# Every wait below is bounded by one of these.
CREATE_TIMEOUT_S = 90.0      # one CreateSandbox RPC, cold, on a loaded 2-core VM
DELETE_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0        # the first remote call starts the sandbox's worker


@pytest.fixture(autouse=True)
def _needs_bubblewrap_and_providerd():
    # Failures, not skips: tools/setup installs bubblewrap, //... builds providerd.
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required: apt-get install bubblewrap")
    if not harness.find_providerd().exists():
        pytest.fail(f"{harness.find_providerd()} is missing: bazel build //providers:agentix-providerd")


Bundle = collections.namedtuple("Bundle", "path mark")


def _dev_bundle():
    directory = Path(tempfile.mkdtemp(prefix="agx-pdb-"))
    mark = f"pdtest-{secrets.token_hex(6)}"
    harness.write_dev_bundle(directory, sandboxd=SANDBOXD, worker=WORKER,
                             python_path=str(TARGETS_DIR), venv=_venv(), mark=mark,
                             daemon_args=DIRECT_CALLS_ARGS)
    return Bundle(directory, mark)


@pytest.fixture(scope="module")
def bundle():
    """A development bundle; its daemons carry a mark in their environment,
    so a test finds its sandboxes' processes (and only those)."""
    made = _dev_bundle()
    yield made
    shutil.rmtree(made.path, ignore_errors=True)


@pytest.fixture(scope="module")
def bad_bundle():
    """The bad-input cases' own bundle (their providerd lives across tests)."""
    made = _dev_bundle()
    yield made
    shutil.rmtree(made.path, ignore_errors=True)


def sandbox_processes(bundle) -> dict[int, str]:
    """Live processes of this module's sandboxes: bwrap (its command line names
    the bundle) and everything under it that inherited the daemon's mark."""
    return harness.processes_with([bundle.mark.encode(), str(bundle.path).encode()])


def make_spec(bundle, *, ttl: float = 600.0, env=None, **fields):
    return pb.SandboxSpec(image="host", bundle=pb.BundleRef(path=str(bundle.path)),
                          ttl=harness.duration(ttl), env=env or {}, **fields)


class Api:
    """A grpc.aio channel to one providerd, with its token."""

    def __init__(self, pd: harness.Providerd):
        self.pd = pd
        self.channel = grpc.aio.insecure_channel(pd.target)
        self.stub = pb_grpc.ProviderServiceStub(self.channel)
        self.md = pd.metadata

    async def create(self, spec, *, request_id=None, labels=None, timeout=CREATE_TIMEOUT_S, **fields):
        request = pb.CreateSandboxRequest(request_id=request_id or str(uuid.uuid4()), spec=spec,
                                          labels=labels or {}, **fields)
        return await self.stub.CreateSandbox(request, metadata=self.md, timeout=timeout)

    async def get(self, sandbox_id):
        return await self.stub.GetSandbox(pb.GetSandboxRequest(id=sandbox_id), metadata=self.md, timeout=10)

    async def delete(self, sandbox_id, *, wait=True, timeout=DELETE_TIMEOUT_S):
        request = pb.DeleteSandboxRequest(id=sandbox_id, request_id=str(uuid.uuid4()), wait=wait)
        return (await self.stub.DeleteSandbox(request, metadata=self.md, timeout=timeout)).sandbox

    async def list_all(self, selector="", *, include_terminated=False, page_size=0):
        """Every page; returns (sandboxes, the first page's response)."""
        found, token, first = [], "", None
        for _ in range(1000):
            response = await self.stub.ListSandboxes(
                pb.ListSandboxesRequest(label_selector=selector, include_terminated=include_terminated,
                                        page_size=page_size, page_token=token),
                metadata=self.md, timeout=10)
            first = first or response
            found.extend(response.sandboxes)
            token = response.next_page_token
            if not token:
                return found, first
        raise AssertionError("ListSandboxes never ended its pages")

    async def close(self):
        await self.channel.close()


async def delete_everything(api: Api) -> list:
    """Deletes every pool and sandbox (bounded); returns every record ever listed."""
    try:
        pools = await api.stub.ListWarmPools(pb.ListWarmPoolsRequest(), metadata=api.md, timeout=10)
        for pool in pools.pools:
            await api.stub.DeleteWarmPool(pb.DeleteWarmPoolRequest(name=pool.name, allow_missing=True),
                                          metadata=api.md, timeout=30)
    except grpc.aio.AioRpcError:
        pass
    sandboxes, _ = await api.list_all(include_terminated=True)
    live = [s.id for s in sandboxes if s.status.phase != Phase.TERMINATED]
    semaphore = asyncio.Semaphore(16)

    async def one(sandbox_id):
        async with semaphore:
            try:
                await api.delete(sandbox_id, timeout=60)
            except grpc.aio.AioRpcError:
                pass

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in live)), 180)
    return sandboxes


@pytest.fixture
def pd_dir():
    directory = Path(tempfile.mkdtemp(prefix="pd-", dir="/tmp"))  # short: see Providerd.state_dir
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def pd(pd_dir, bundle):
    """A providerd of this test's own (state dir, instance, token). At the end
    every sandbox and pool is deleted through the API, providerd is stopped,
    and nothing of this module's sandboxes may be left on the machine."""
    service = harness.Providerd(pd_dir).start()
    yield service
    records = []
    if service.proc.poll() is None:
        api = Api(service)
        try:
            records = await delete_everything(api)
        finally:
            await api.close()
    # The local backend's sandbox directories (<state-dir>/sb/<id>, pool
    # members' included) name every sandbox it still holds.
    sandbox_dirs = service.state_dir / "sb"
    held = sorted(os.listdir(sandbox_dirs)) if sandbox_dirs.is_dir() else []
    service.stop()
    names = [s.id for s in records] + [s.uid for s in records] + held
    names += [s.status.backend_ref.split(":")[0] for s in records if s.status.backend_ref]

    def remaining():
        return (sandbox_processes(bundle) or harness.cgroup_dirs(names)
                or (sandbox_dirs.is_dir() and os.listdir(sandbox_dirs)))

    left = await asyncio.to_thread(harness.wait_until, lambda: not remaining(), 10.0)
    if not left:
        cgroups = harness.cgroup_dirs(names)
        owners = [f"{s.id} {_phase(s)}/{_reason(s)} ready={s.status.ready_time.seconds > 0}" for s in records
                  if any(s.id in c or (s.uid and s.uid in c) for c in cgroups)]
        raise AssertionError(f"left behind after the test: processes {sandbox_processes(bundle)}, "
                             f"cgroups {cgroups} of {owners}, sandbox dirs "
                             f"{os.listdir(sandbox_dirs) if sandbox_dirs.is_dir() else []}\n{service.log()}")


@pytest.fixture
async def api(pd):
    client = Api(pd)
    yield client
    await client.close()


def _phase(sandbox) -> str:
    return Phase.Phase.Name(sandbox.status.phase)


def _reason(sandbox) -> str:
    return Reason.Reason.Name(sandbox.status.exit.reason)


# --------------------------------------------------------------------------- the basics


async def _first_call(sandbox, token) -> None:
    from agentix import RuntimeClient

    async with RuntimeClient(sandbox.status.endpoint.target, token=token) as client:
        assert await asyncio.wait_for(client.remote(e2e_targets.add, 2, 3), CALL_TIMEOUT_S) == 5


async def test_create_get_list_watch_delete_with_a_real_remote_call(api, bundle):
    from agentix import RuntimeClient, Unauthenticated

    empty, first = await api.list_all()
    assert empty == [] and first.epoch
    events = []

    async def watch():
        call = api.stub.WatchSandboxes(
            pb.WatchSandboxesRequest(resource_version=first.resource_version, epoch=first.epoch),
            metadata=api.md)
        async for event in call:
            events.append(event)

    watcher = asyncio.create_task(watch())
    created = {}
    for index, team in enumerate(("red", "red", "blue")):
        request_id = str(uuid.uuid4())
        before = time.time()
        response = await api.create(make_spec(bundle, ttl=600, env={"AGENTIX_E2E_CONFIG_ENV": team}),
                                    request_id=request_id, labels={"team": team, "idx": str(index)},
                                    annotations={"note": f"sandbox {index}"})
        sandbox = response.sandbox
        assert not response.replayed
        assert _phase(sandbox) == "READY" and sandbox.status.launch == Phase.COLD
        assert sandbox.request_id == request_id and sandbox.id and sandbox.uid
        assert sandbox.labels["team"] == team and sandbox.annotations["note"] == f"sandbox {index}"
        assert sandbox.status.endpoint.target.startswith("unix://")
        assert len(response.credentials.access_token) >= 32
        create_time = harness.ts_seconds(sandbox.status.create_time)
        assert before - 1 <= create_time <= harness.ts_seconds(sandbox.status.ready_time) <= time.time() + 1
        assert abs(harness.ts_seconds(sandbox.status.expire_time) - create_time - 600) < 2
        created[sandbox.id] = (sandbox, response.credentials.access_token)

    # The first remote call through the returned endpoint and token; the spec's env reached user code.
    for sandbox, token in created.values():
        async with RuntimeClient(sandbox.status.endpoint.target, token=token) as client:
            assert await asyncio.wait_for(client.remote(e2e_targets.add, 2, 3), CALL_TIMEOUT_S) == 5
            assert await client.remote(os.getenv, "AGENTIX_E2E_CONFIG_ENV") == sandbox.labels["team"]
            assert await client.remote(os.getenv, "AGENTIX_TOKEN") is None
        for wrong in ("", "not-the-token"):
            with pytest.raises(Unauthenticated, match="UNAUTHENTICATED"):
                async with RuntimeClient(sandbox.status.endpoint.target, token=wrong or None, timeout=5):
                    pass
    # Another token holder of the service gets the same credentials; Get has none.
    some_id, (some, some_token) = next(iter(created.items()))
    credentials = await api.stub.GetSandboxCredentials(pb.GetSandboxRequest(id=some_id), metadata=api.md,
                                                       timeout=10)
    assert credentials.access_token == some_token
    got = await api.get(some_id)
    assert got.id == some_id and got.uid == some.uid and _phase(got) == "READY"
    waited = await api.stub.WaitSandbox(pb.WaitSandboxRequest(id=some_id, until=Phase.READY,
                                                              timeout=harness.duration(5)),
                                        metadata=api.md, timeout=10)
    assert waited.reached and waited.sandbox.id == some_id

    # Label selectors.
    async def ids(selector):
        found, _ = await api.list_all(selector)
        return sorted(s.id for s in found)

    red = sorted(i for i, (s, _) in created.items() if s.labels["team"] == "red")
    blue = sorted(i for i, (s, _) in created.items() if s.labels["team"] == "blue")
    everyone = sorted(created)
    assert await ids("") == everyone
    assert await ids("team=red") == red == await ids("team==red")
    assert await ids("team!=red") == blue
    assert await ids("team in (red,blue)") == everyone
    assert await ids("team notin (red)") == blue
    assert await ids("idx") == everyone
    assert await ids("!idx") == []
    assert await ids("team=red,idx=0") == [i for i in red if created[i][0].labels["idx"] == "0"]
    assert await ids("team=green") == []
    # Pages: one sandbox per page, each exactly once.
    paged, _ = await api.list_all(page_size=1)
    assert sorted(s.id for s in paged) == everyone and len(paged) == 3
    page = await api.stub.ListSandboxes(pb.ListSandboxesRequest(page_size=2), metadata=api.md, timeout=10)
    assert len(page.sandboxes) == 2 and page.next_page_token

    # Delete: TERMINATED/DELETED, idempotent, no longer reachable.
    victim, victim_token = created[blue[0]]
    deleted = await api.delete(victim.id)
    assert _phase(deleted) == "TERMINATED" and _reason(deleted) == "DELETED"
    assert harness.ts_seconds(deleted.status.end_time) > 0
    again = await api.delete(victim.id)
    assert _phase(again) == "TERMINATED" and again.uid == victim.uid
    assert _phase(await api.get(victim.id)) == "TERMINATED"
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await api.stub.GetSandboxCredentials(pb.GetSandboxRequest(id=victim.id), metadata=api.md, timeout=10)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert harness.error_reason(error.value) == "SANDBOX_TERMINATED"
    assert await ids("") == red
    listed, _ = await api.list_all(include_terminated=True)
    assert sorted(s.id for s in listed) == everyone
    with pytest.raises(Exception):
        async with RuntimeClient(victim.status.endpoint.target, token=victim_token, timeout=5) as client:
            await asyncio.wait_for(client.remote(e2e_targets.add, 1, 1), 10)
    # Its processes and cgroups are gone.
    gone = await asyncio.to_thread(harness.wait_until, lambda: not harness.cgroup_dirs([victim.id, victim.uid]), 5)
    assert gone, harness.cgroup_dirs([victim.id, victim.uid])

    # The watch saw every sandbox arrive, become READY, and the victim end, in rv order.
    async def settled():
        while not any(e.sandbox.id == victim.id and _phase(e.sandbox) == "TERMINATED" for e in events):
            await asyncio.sleep(0.02)

    await asyncio.wait_for(settled(), 5)
    watcher.cancel()
    versions = [e.resource_version for e in events if e.type != pb.SandboxEvent.BOOKMARK]
    assert versions == sorted(set(versions)), versions
    for sandbox_id in created:
        mine = [e for e in events if e.sandbox.id == sandbox_id]
        assert mine[0].type == pb.SandboxEvent.ADDED, ([(e.resource_version, e.sandbox.id, e.type) for e in events], first.resource_version)
        assert "READY" in [_phase(e.sandbox) for e in mine]
        assert all(e.sandbox.resource_version == e.resource_version for e in mine)
    ended = [e for e in events if e.sandbox.id == victim.id and _phase(e.sandbox) == "TERMINATED"]
    assert _reason(ended[-1].sandbox) == "DELETED"


# --------------------------------------------------------------------------- idempotency (T7)


async def test_1000_creates_over_100_request_ids_with_drops_and_a_kill9_make_exactly_100(api, pd, bundle):
    """1,000 concurrent creates over 100 request ids, many of them dropped by
    the client (short deadlines, cancellation), and a `kill -9` of providerd +
    restart while they are in flight: exactly 100 sandboxes, one per request
    id; every answer for an id names the same sandbox, and every retry after
    the first answer is a replay (replayed=true).

    The kill takes the sandboxes of that moment with it (bubblewrap
    --die-with-parent). After the restart, one that had been READY is
    TERMINATED/BACKEND_LOST and a replay returns it (replayed=true); a create
    that had not reached READY goes on (launched again, same id and token),
    so its replays get it READY (replayed=true). Neither makes a second
    sandbox, and no retry is answered with an error."""
    rng = random.Random(19)
    request_ids = [str(uuid.uuid4()) for _ in range(100)]
    spec = make_spec(bundle, ttl=600)
    labels = {rid: {"suite": "idem", "n": str(n)} for n, rid in enumerate(request_ids)}
    answers = collections.defaultdict(list)  # rid -> [(stage, sandbox id, replayed, phase)]
    definite = collections.defaultdict(list)  # rid -> [(stage, reason, details)]: the did-not-start answer
    failures = collections.Counter()          # (stage, code)
    unexpected = []

    async def attempt(stage, rid, *, timeout, cancel_after=None):
        """The response, or the error's code."""
        before_kill = not kill["done"]
        call = api.stub.CreateSandbox(pb.CreateSandboxRequest(request_id=rid, spec=spec, labels=labels[rid]),
                                      metadata=api.md, timeout=timeout)
        if cancel_after is not None:
            asyncio.get_running_loop().call_later(cancel_after, call.cancel)
        try:
            response = await call
        except asyncio.CancelledError:
            failures[(stage, "CANCELLED")] += 1
            return grpc.StatusCode.CANCELLED
        except grpc.aio.AioRpcError as error:
            failures[(stage, error.code().name)] += 1
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION \
                    and harness.error_reason(error) == "SANDBOX_TERMINATED":
                definite[rid].append((stage, harness.error_reason(error), error.details()))
            elif error.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                                      grpc.StatusCode.UNAVAILABLE):
                unexpected.append((stage, rid, error.code().name, harness.error_reason(error), error.details()))
            return error.code()
        answers[rid].append((stage, response.sandbox.id, response.replayed, _phase(response.sandbox)))
        if before_kill and kill["done"]:
            # Sent before the kill, answered by the restarted providerd (a
            # call gRPC had queued, not yet on the wire, is retried on the
            # new connection instead of failing UNAVAILABLE).
            kill["answered_across"] += 1
        if not kill["done"] and sum(len(v) for v in answers.values()) >= 10:
            # kill -9 right here, from the tenth answer's own completion: a
            # poll from another task could first see a loaded loop deliver
            # every completion, and then find nothing in flight.
            kill["done"] = True
            kill["in_flight"] = sum(1 for t in stage_a1 if not t.done()) - 1  # not this one
            pd.kill9()
            kill["event"].set()
        return response

    def plan(ids, per_id):
        """`per_id` attempts per id: 30% with a short deadline, 30% cancelled, 40% patient."""
        attempts = []
        for rid in ids:
            for k in range(per_id):
                if k % 10 < 3:
                    attempts.append(dict(rid=rid, timeout=rng.uniform(0.005, 0.4)))
                elif k % 10 < 6:
                    attempts.append(dict(rid=rid, timeout=CREATE_TIMEOUT_S, cancel_after=rng.uniform(0.0, 0.6)))
                else:
                    attempts.append(dict(rid=rid, timeout=CREATE_TIMEOUT_S))
        rng.shuffle(attempts)
        return attempts

    # Stage A1: 500 attempts over the first 50 ids, all at once; kill -9 once
    # some have been answered and many are still in flight.
    kill = {"done": False, "in_flight": 0, "answered_across": 0, "event": asyncio.Event()}
    stage_a1 = [asyncio.create_task(attempt("A", **p)) for p in plan(request_ids[:50], 10)]
    try:
        await asyncio.wait_for(kill["event"].wait(), 60)
    except asyncio.TimeoutError:
        # Then the kill lands with everything in flight, which is a valid drop too.
        kill["done"] = True
        kill["in_flight"] = sum(1 for t in stage_a1 if not t.done())
        pd.kill9()
    in_flight = kill["in_flight"]
    await asyncio.to_thread(pd.start)
    # Stage A2: 500 more over all 100 ids, right after the restart, with the same drops.
    stage_a2 = [asyncio.create_task(attempt("A", **p)) for p in plan(request_ids, 5)]
    await asyncio.wait_for(asyncio.gather(*stage_a1, *stage_a2), 150)
    assert len(stage_a1) + len(stage_a2) == 1000
    assert in_flight > 0, "the kill must hit creates in flight"
    # The kill reached the client: calls failed UNAVAILABLE, or were answered
    # only by the restarted providerd.
    assert failures[("A", "UNAVAILABLE")] + kill["answered_across"] > 0, (failures, kill)
    assert failures[("A", "DEADLINE_EXCEEDED")] + failures[("A", "CANCELLED")] > 0, failures

    # Stage B: every id retried (same request id, same payload) until it gets an answer.
    async def until_answered(rid):
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            outcome = await attempt("B", rid, timeout=CREATE_TIMEOUT_S)
            if not isinstance(outcome, grpc.StatusCode) or outcome == grpc.StatusCode.FAILED_PRECONDITION:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{rid} never answered")

    await asyncio.wait_for(asyncio.gather(*(until_answered(rid) for rid in request_ids)), 200)
    # Stage C: one more retry each.
    await asyncio.wait_for(asyncio.gather(*(attempt("C", rid, timeout=CREATE_TIMEOUT_S) for rid in request_ids)),
                           120)
    assert not unexpected, unexpected[:10]

    print(f"idempotency: {in_flight} in flight at the kill, {kill['answered_across']} answered across it; "
          f"failures {dict(failures)}; "
          f"definite answers {sum(map(len, definite.values()))}")
    listed, _ = await api.list_all("suite=idem", include_terminated=True, page_size=37)
    by_request = collections.Counter(s.request_id for s in listed)
    assert len(listed) == 100, (len(listed), failures)
    assert set(by_request) == set(request_ids) and set(by_request.values()) == {1}
    record = {s.request_id: s for s in listed}
    fresh_after_restart = 0
    for rid in request_ids:
        seen, mine = answers[rid], record[rid]
        assert {sandbox_id for _, sandbox_id, _, _ in seen} <= {mine.id}, (rid, seen, mine.id)
        assert sum(1 for _, _, replayed, _ in seen if not replayed) <= 1, (rid, seen)
        # A create the kill interrupted is resumed, never answered "terminated".
        assert not definite[rid], (rid, definite[rid])
        stage_c = [a for a in seen if a[0] == "C"]
        assert stage_c and stage_c[0][2] is True, (rid, seen)
        if _phase(mine) == "READY":
            fresh_after_restart += 1
            assert stage_c and stage_c[0][3] == "READY"
        else:
            assert _reason(mine) == "BACKEND_LOST", mine
    # Once an id has been answered, every later answer is a replay.
    for rid in request_ids:
        if any(stage == "A" for stage, *_ in answers[rid]) or definite[rid]:
            assert all(replayed for stage, _, replayed, _ in answers[rid] if stage != "A"), answers[rid]
    assert fresh_after_restart > 0, "no id was created after the restart: the kill came too late to test it"
    assert pd.starts == 2


# --------------------------------------------------------------------------- watch (T6)


async def test_watch_killed_100_times_during_1000_transitions_has_no_gap(api, bundle):
    """A watcher whose stream is cancelled 100+ times while 1,000+ changes
    happen, resuming each time from (epoch, last resource_version) and
    deduplicating by resource_version, ends with exactly the events of a
    watcher never interrupted, and with every sandbox's final state."""
    rng = random.Random(6)
    selector = "suite=watch"
    _, first = await api.list_all(selector)
    start = pb.WatchSandboxesRequest(label_selector=selector, resource_version=first.resource_version,
                                     epoch=first.epoch)
    reference = []
    done_mutating = asyncio.Event()

    async def reference_watch():
        async for event in api.stub.WatchSandboxes(start, metadata=api.md):
            if event.type != pb.SandboxEvent.BOOKMARK:
                reference.append(event)

    resumed = {}          # rv -> event, deduplicated
    duplicates = 0
    kills = 0
    last_rv = first.resource_version

    async def killed_watch():
        nonlocal duplicates, kills, last_rv
        while True:
            request = pb.WatchSandboxesRequest(label_selector=selector, resource_version=last_rv,
                                               epoch=first.epoch)
            call = api.stub.WatchSandboxes(request, metadata=api.md)
            budget = rng.randint(1, 8)
            try:
                while budget > 0:
                    try:
                        event = await asyncio.wait_for(call.read(), 0.3)
                    except asyncio.TimeoutError:
                        break  # quiet: kill it anyway
                    if event is grpc.aio.EOF:
                        raise AssertionError("the watch ended by itself")
                    if event.type == pb.SandboxEvent.BOOKMARK:
                        continue
                    assert event.epoch in ("", first.epoch)
                    if event.resource_version in resumed:
                        duplicates += 1
                    else:
                        assert event.resource_version > last_rv, (event.resource_version, last_rv)
                        resumed[event.resource_version] = event
                        last_rv = event.resource_version
                    budget -= 1
            finally:
                call.cancel()
                kills += 1
            if done_mutating.is_set() and reference and last_rv >= reference[-1].resource_version \
                    and kills >= 100:
                return

    ref_task = asyncio.create_task(reference_watch())
    killed_task = asyncio.create_task(killed_watch())

    extend_versions = {}  # rv -> expire_time seconds from the Extend responses
    created = await asyncio.gather(*(api.create(make_spec(bundle, ttl=600), labels={"suite": "watch", "n": str(n)})
                                     for n in range(10)))
    ids = [r.sandbox.id for r in created]
    semaphore = asyncio.Semaphore(4)

    async def extend(n):
        async with semaphore:
            sandbox = await api.stub.ExtendSandbox(
                pb.ExtendSandboxRequest(id=ids[n % len(ids)], ttl=harness.duration(600 + n)),
                metadata=api.md, timeout=10)
            extend_versions[sandbox.resource_version] = harness.ts_seconds(sandbox.status.expire_time)
            await asyncio.sleep(rng.uniform(0, 0.004))

    await asyncio.wait_for(asyncio.gather(*(extend(n) for n in range(1000))), 120)
    finals = {s.id: s for s in await asyncio.gather(*(api.delete(i) for i in ids))}

    async def reference_has_finals():
        while sum(1 for e in reference if _phase(e.sandbox) == "TERMINATED") < len(ids):
            await asyncio.sleep(0.02)

    await asyncio.wait_for(reference_has_finals(), 20)
    done_mutating.set()
    await asyncio.wait_for(killed_task, 60)
    ref_task.cancel()

    print(f"watch: {len(reference)} events, {kills} stream kills, {duplicates} duplicates dropped")
    assert kills >= 100, kills
    assert len(reference) >= 1000, len(reference)
    versions = [e.resource_version for e in reference]
    assert versions == sorted(set(versions)), "the uninterrupted watch is out of order or repeats"
    # No gap: the resumed watcher has exactly the reference's events.
    def key(e):
        return (e.resource_version, e.type, e.sandbox.id, e.sandbox.status.phase,
                e.sandbox.status.expire_time.seconds, e.sandbox.status.expire_time.nanos)

    assert [key(resumed[rv]) for rv in sorted(resumed)] == [key(e) for e in reference]
    for rv, expire in extend_versions.items():
        assert rv in resumed, f"the Extend at rv {rv} is missing from the resumed watch"
        assert abs(harness.ts_seconds(resumed[rv].sandbox.status.expire_time) - expire) < 1e-6
    # No lost final state: each sandbox's last event is its TERMINATED record.
    last = {}
    for rv in sorted(resumed):
        last[resumed[rv].sandbox.id] = resumed[rv].sandbox
    for sandbox_id in ids:
        current = await api.get(sandbox_id)
        assert _phase(last[sandbox_id]) == "TERMINATED" and _reason(last[sandbox_id]) == "DELETED"
        assert last[sandbox_id].resource_version == current.resource_version == finals[sandbox_id].resource_version


async def test_watch_from_a_fresh_lists_version_misses_nothing(api, bundle):
    """List on a providerd where nothing has happened yet, then changes, then
    Watch from the List's (epoch, resource_version): the changes in between
    arrive (the List+Watch pattern has no window)."""
    _, first = await api.list_all()
    made = await api.create(make_spec(bundle), labels={"suite": "fresh"},
                            wait=pb.CreateSandboxRequest.RETURN_PENDING)
    events = []

    async def watch():
        request = pb.WatchSandboxesRequest(resource_version=first.resource_version, epoch=first.epoch)
        async for event in api.stub.WatchSandboxes(request, metadata=api.md):
            events.append(event)
            if event.sandbox.id == made.sandbox.id and _phase(event.sandbox) == "READY":
                return

    await asyncio.wait_for(watch(), 60)
    mine = [e for e in events if e.sandbox.id == made.sandbox.id]
    assert mine and mine[0].resource_version == made.sandbox.resource_version, \
        [(e.resource_version, _phase(e.sandbox)) for e in events]
    assert mine[0].resource_version == first.resource_version + 1


# --------------------------------------------------------------------------- TTL (T10)


async def test_ttl_expiry_terminates_within_one_second(api, bundle):
    _, first = await api.list_all("suite=ttl")
    arrivals = {}

    async def watch():
        request = pb.WatchSandboxesRequest(label_selector="suite=ttl", resource_version=first.resource_version,
                                           epoch=first.epoch)
        async for event in api.stub.WatchSandboxes(request, metadata=api.md):
            if _phase(event.sandbox) == "TERMINATED":
                arrivals.setdefault(event.sandbox.id, (time.time(), event.sandbox))

    watcher = asyncio.create_task(watch())
    responses = await asyncio.gather(*(api.create(make_spec(bundle, ttl=5), labels={"suite": "ttl"})
                                       for _ in range(3)))
    ids = [r.sandbox.id for r in responses]
    # ExtendSandbox overwrites the expiry: this one ends later.
    extended = await api.stub.ExtendSandbox(pb.ExtendSandboxRequest(id=ids[0], ttl=harness.duration(7)),
                                            metadata=api.md, timeout=10)
    assert harness.ts_seconds(extended.status.expire_time) > harness.ts_seconds(responses[0].sandbox.status.expire_time)

    async def all_ended():
        while len(arrivals) < len(ids):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(all_ended(), 30)
    watcher.cancel()
    print("ttl: TERMINATED event after expire_time, ms: " + ", ".join(
        f"{(arrivals[i][0] - harness.ts_seconds(arrivals[i][1].status.expire_time)) * 1000:.0f}" for i in ids))
    for sandbox_id in ids:
        arrived, sandbox = arrivals[sandbox_id]
        expire = harness.ts_seconds(sandbox.status.expire_time)
        assert _reason(sandbox) == "TTL_EXPIRED", sandbox
        assert expire - 0.05 <= harness.ts_seconds(sandbox.status.end_time) <= expire + 1.0, sandbox.status
        assert arrived <= expire + 1.0, (sandbox_id, arrived - expire)
        assert arrived >= expire - 0.05, (sandbox_id, arrived - expire)
    assert harness.ts_seconds(arrivals[ids[0]][1].status.expire_time) == harness.ts_seconds(extended.status.expire_time)
    names = ids + [r.sandbox.uid for r in responses]
    assert await asyncio.to_thread(harness.wait_until, lambda: not harness.cgroup_dirs(names), 5), \
        harness.cgroup_dirs(names)


# --------------------------------------------------------------------------- restart (T10)


async def test_orphans_are_destroyed_within_5s_of_a_restart_after_kill9(api, pd, bundle):
    """Sandboxes READY and starting when providerd gets `kill -9`: within 5 s of
    the restart each is either re-adopted (READY, and it serves calls) or
    TERMINATED/BACKEND_LOST with no process, cgroup or mount left."""
    ready = await asyncio.gather(*(api.create(make_spec(bundle), labels={"suite": "orphan"}) for _ in range(3)))
    tokens = {r.sandbox.id: r.credentials.access_token for r in ready}
    assert harness.cgroup_dirs([r.sandbox.id for r in ready]), "the local backend made no cgroup: nothing to check"
    assert sandbox_processes(bundle)
    # Then 10 more, answered PENDING, and the kill right away: it lands in
    # the middle of their launches (directories, cgroups, bwrap half made).
    starting = await asyncio.gather(*(api.create(make_spec(bundle), labels={"suite": "orphan"},
                                                 wait=pb.CreateSandboxRequest.RETURN_PENDING)
                                      for _ in range(10)))
    records = [r.sandbox for r in ready + starting]
    names = [s.id for s in records] + [s.uid for s in records]
    pd.kill9()
    await asyncio.to_thread(pd.start)
    restarted = pd.started_at

    def paths_named(names):
        """Files or directories under providerd's state dir named by a sandbox."""
        return [os.path.join(d, n) for d, dirs, files in os.walk(pd.state_dir)
                for n in dirs + files if n in names]

    def settled():
        """Done when every sandbox is READY or TERMINATED and the terminated
        ones have left nothing behind."""
        import grpc as sync_grpc

        with sync_grpc.insecure_channel(pd.target) as channel:
            stub = pb_grpc.ProviderServiceStub(channel)
            current = [stub.GetSandbox(pb.GetSandboxRequest(id=s.id), metadata=pd.metadata, timeout=5)
                       for s in records]
        if any(s.status.phase not in (Phase.READY, Phase.TERMINATED) for s in current):
            return None
        dead = [s for s in current if s.status.phase == Phase.TERMINATED]
        dead_names = [s.id for s in dead] + [s.uid for s in dead]
        if harness.cgroup_dirs(dead_names) or harness.mounts_with(dead_names) or paths_named(dead_names):
            return None
        if len(dead) == len(current) and sandbox_processes(bundle):
            return None
        return current

    current = await asyncio.to_thread(harness.wait_until, settled, 5.0 - (time.monotonic() - restarted), 0.05)
    elapsed = time.monotonic() - restarted
    assert current, (f"not settled {elapsed:.1f} s after the restart: cgroups {harness.cgroup_dirs(names)}, "
                     f"paths {paths_named(names)}, processes {sandbox_processes(bundle)}\n{pd.log()}")
    print(f"orphans: settled {elapsed:.2f} s after the restart: "
          f"{sum(1 for s in current if s.status.phase == Phase.TERMINATED)} lost and cleaned, "
          f"{sum(1 for s in current if s.status.phase == Phase.READY)} re-adopted")
    assert elapsed <= 5.0
    for sandbox in current:
        if sandbox.status.phase == Phase.TERMINATED:
            assert _reason(sandbox) == "BACKEND_LOST", sandbox
        else:  # re-adopted: it still serves its creator
            token = tokens.get(sandbox.id) or (await api.stub.GetSandboxCredentials(
                pb.GetSandboxRequest(id=sandbox.id), metadata=api.md, timeout=10)).access_token
            await _first_call(sandbox, token)
    # Nothing under an `agentix` cgroup names a terminated sandbox, and no mount names any.
    assert not harness.mounts_with([str(pd.state_dir)] + [s.id for s in current if s.status.phase == Phase.TERMINATED])


# --------------------------------------------------------------------------- warm pool (T8)


async def test_200_claim_burst_on_a_pool_min20_max30_stays_bounded_and_refills(api, bundle):
    template = make_spec(bundle)
    pool = await api.stub.CreateWarmPool(pb.CreateWarmPoolRequest(pool=pb.WarmPool(
        name="burst", template=template, min_ready=20, max_total=30)), metadata=api.md, timeout=10)
    assert pool.name == "burst" and pool.min_ready == 20 and pool.max_total == 30
    samples = []  # (monotonic, ready, creating, total)
    stop = asyncio.Event()

    async def sample():
        while not stop.is_set():
            status = (await api.stub.GetWarmPool(pb.GetWarmPoolRequest(name="burst"), metadata=api.md,
                                                 timeout=10)).status
            samples.append((time.monotonic(), status.ready, status.creating, status.total))
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    # Independently of the pool's own status: live daemons of this bundle
    # minus the claimed sandboxes not yet TERMINATED (listed before and after
    # the count, the larger taken) are the pool's members.
    member_counts = []  # (daemons, claimed live)

    def daemons():
        return sum(1 for cmdline in sandbox_processes(bundle).values() if "agentix-sandboxd" in cmdline)

    async def count_members():
        while not stop.is_set():
            before, _ = await api.list_all("suite=burst")
            running = await asyncio.to_thread(daemons)
            after, _ = await api.list_all("suite=burst")
            member_counts.append((running, max(len(before), len(after))))
            await asyncio.sleep(0.02)

    counter = asyncio.create_task(count_members())

    async def ready_at_least(n):
        while not samples or samples[-1][1] < n:
            await asyncio.sleep(0.01)
        return samples[-1][0]

    await asyncio.wait_for(ready_at_least(20), 90)
    await asyncio.sleep(1.0)  # still sampling: the initial fill must stop within the bound
    claims = []
    deletes = []

    async def claim(n):
        spec = pb.SandboxSpec()
        spec.CopyFrom(template)
        spec.warm_pool = "burst"
        spec.env["AGENTIX_E2E_CONFIG_ENV"] = f"claim-{n}"
        response = await api.create(spec, labels={"suite": "burst"}, timeout=180,
                                    on_pool_miss=pb.CreateSandboxRequest.WAIT_FOR_MEMBER,
                                    ready_timeout=harness.duration(170))
        claims.append((time.monotonic(), response))
        if n % 50 == 0:  # the claim is armed with its own env and token
            from agentix import RuntimeClient

            async with RuntimeClient(response.sandbox.status.endpoint.target,
                                     token=response.credentials.access_token) as client:
                assert await client.remote(os.getenv, "AGENTIX_E2E_CONFIG_ENV") == f"claim-{n}"
        deletes.append(asyncio.create_task(api.delete(response.sandbox.id, wait=False)))

    await asyncio.wait_for(asyncio.gather(*(claim(n) for n in range(200))), 240)
    last_claim = max(t for t, _ in claims)
    refilled = await asyncio.wait_for(ready_at_least(20), 60)
    await asyncio.sleep(2.0)  # still sampling: refilling must stop within the bound too
    stop.set()
    await sampler
    await counter
    await asyncio.wait_for(asyncio.gather(*deletes), 60)

    most_members = max(running - claimed for running, claimed in member_counts)
    print(f"burst: 200 claims in {last_claim - min(t for t, _ in claims):.1f} s, max total "
          f"{max(s[3] for s in samples)} (status) / {most_members} (daemons - claimed), refilled "
          f"{refilled - last_claim:.2f} s after the last claim, {len(samples)} + {len(member_counts)} samples")
    assert most_members <= 30, f"{most_members} live pool daemons (> max_total 30)"
    assert len(member_counts) > 20, "the daemons were not counted continuously"
    assert len(claims) == 200
    assert len({r.sandbox.id for _, r in claims}) == 200
    for _, response in claims:
        assert _phase(response.sandbox) == "READY" and response.sandbox.pool == "burst", response.sandbox
        assert response.sandbox.status.launch == Phase.WARM
    worst = max(samples, key=lambda s: s[3])
    assert worst[3] <= 30, f"pool total reached {worst[3]} (> max_total 30)"
    assert max(s[1] + s[2] for s in samples) <= 30
    assert refilled - last_claim <= 5.0, f"refilled to 20 {refilled - last_claim:.1f} s after the last claim"
    status = (await api.stub.GetWarmPool(pb.GetWarmPoolRequest(name="burst"), metadata=api.md, timeout=10)).status
    assert status.claimed >= 200 and status.ready >= 20 and status.total <= 30
    assert len(samples) > 100, "the pool was not sampled continuously"


# --------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def bad_input_pd(bad_bundle):
    """One providerd for every bad-input case, holding one READY sandbox made
    with a known request id (for the reused-id case)."""
    directory = Path(tempfile.mkdtemp(prefix="pd-", dir="/tmp"))
    service = harness.Providerd(directory).start()
    existing = {"request_id": str(uuid.uuid4())}
    try:
        with grpc.insecure_channel(service.target) as channel:
            stub = pb_grpc.ProviderServiceStub(channel)
            response = stub.CreateSandbox(pb.CreateSandboxRequest(
                request_id=existing["request_id"], spec=make_spec(bad_bundle), labels={"team": "red"}),
                metadata=service.metadata, timeout=CREATE_TIMEOUT_S)
            existing["id"] = response.sandbox.id
            capabilities = stub.GetCapabilities(pb.GetCapabilitiesRequest(), metadata=service.metadata, timeout=10)
        yield service, existing, capabilities
    finally:
        try:
            with grpc.insecure_channel(service.target) as channel:
                stub = pb_grpc.ProviderServiceStub(channel)
                if "id" in existing:
                    stub.DeleteSandbox(pb.DeleteSandboxRequest(id=existing["id"], wait=True),
                                       metadata=service.metadata, timeout=DELETE_TIMEOUT_S)
        finally:
            service.stop()
            shutil.rmtree(directory, ignore_errors=True)


def _local(capabilities):
    return next(b for b in capabilities.backends
                if b.name == (capabilities.default_backend or "local"))


def _bad_cases(bundle, existing, capabilities, scratch: Path):
    """name -> (rpc name, request, metadata override or None, code, reason or "" for any non-empty)."""
    not_a_bundle = scratch / "empty-dir"
    not_a_bundle.mkdir(exist_ok=True)
    a_file = scratch / "a-file"
    a_file.write_text("not a bundle")
    max_lifetime = capabilities.max_lifetime.seconds + capabilities.max_lifetime.nanos / 1e9
    I, N, F, U, O = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                     grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAUTHENTICATED,
                     grpc.StatusCode.OUT_OF_RANGE)

    def create(spec=None, **fields):
        fields.setdefault("request_id", str(uuid.uuid4()))
        return pb.CreateSandboxRequest(spec=spec if spec is not None else make_spec(bundle), **fields)

    def spec_with(**fields):
        spec = make_spec(bundle)
        for name, value in fields.items():
            if hasattr(value, "CopyFrom"):
                getattr(spec, name).CopyFrom(value)
            else:
                setattr(spec, name, value)
        return spec

    missing = "sbx-does-not-exist-0"
    no_token = ()
    wrong_token = (("authorization", "Bearer " + "0" * 48),)
    return {
        "get unknown sandbox": ("GetSandbox", pb.GetSandboxRequest(id=missing), None, N, "SANDBOX_NOT_FOUND"),
        "delete unknown sandbox": ("DeleteSandbox", pb.DeleteSandboxRequest(id=missing), None, N,
                                   "SANDBOX_NOT_FOUND"),
        "extend unknown sandbox": ("ExtendSandbox", pb.ExtendSandboxRequest(id=missing, ttl=harness.duration(60)),
                                   None, N, "SANDBOX_NOT_FOUND"),
        "wait unknown sandbox": ("WaitSandbox", pb.WaitSandboxRequest(id=missing, timeout=harness.duration(1)),
                                 None, N, "SANDBOX_NOT_FOUND"),
        "credentials of unknown sandbox": ("GetSandboxCredentials", pb.GetSandboxRequest(id=missing), None, N,
                                           "SANDBOX_NOT_FOUND"),
        "get unknown pool": ("GetWarmPool", pb.GetWarmPoolRequest(name="no-such-pool"), None, N, "POOL_NOT_FOUND"),
        "delete unknown pool": ("DeleteWarmPool", pb.DeleteWarmPoolRequest(name="no-such-pool"), None, N,
                                "POOL_NOT_FOUND"),
        "update unknown pool": ("UpdateWarmPool", pb.UpdateWarmPoolRequest(pool=pb.WarmPool(
            name="no-such-pool", template=make_spec(bundle), min_ready=1, max_total=2)), None, N, "POOL_NOT_FOUND"),
        "create from unknown pool": ("CreateSandbox", create(spec_with(warm_pool="no-such-pool")), None, N,
                                     "POOL_NOT_FOUND"),
        "bundle is an empty directory": ("CreateSandbox", create(spec_with(
            bundle=pb.BundleRef(path=str(not_a_bundle)))), None, I, "NOT_A_BUNDLE"),
        "bundle is a file": ("CreateSandbox", create(spec_with(bundle=pb.BundleRef(path=str(a_file)))), None, I,
                             "NOT_A_BUNDLE"),
        "bundle does not exist": ("CreateSandbox", create(spec_with(
            bundle=pb.BundleRef(path=str(scratch / "missing")))), None, I, "NOT_A_BUNDLE"),
        "a gpu on a machine without": ("CreateSandbox", create(spec_with(resources=pb.Resources(gpus=1))), None, F,
                                       "LIMIT_NOT_ENFORCEABLE"),
        "an egress list locally": ("CreateSandbox", create(spec_with(network=pb.Network(
            mode=pb.Network.NONE, allow_egress_cidrs=["10.0.0.0/8"]))), None, F, "LIMIT_NOT_ENFORCEABLE"),
        "invalid selector (list)": ("ListSandboxes", pb.ListSandboxesRequest(label_selector="team in (red"), None, I,
                                    "INVALID_LABEL_SELECTOR"),
        "invalid selector (operator)": ("ListSandboxes", pb.ListSandboxesRequest(label_selector="team=~red"), None,
                                        I, "INVALID_LABEL_SELECTOR"),
        "invalid selector (watch)": ("WatchSandboxes", pb.WatchSandboxesRequest(label_selector="=red"), None, I,
                                     "INVALID_LABEL_SELECTOR"),
        "watch from another epoch": ("WatchSandboxes", pb.WatchSandboxesRequest(resource_version=1,
                                                                                epoch="not-this-epoch"), None, O,
                                     "RESOURCE_VERSION_TOO_OLD"),
        "request id reused with another payload": ("CreateSandbox", pb.CreateSandboxRequest(
            request_id=existing["request_id"], spec=make_spec(bundle), labels={"team": "blue"}), None, I,
            "REQUEST_ID_REUSED"),
        "ttl above the maximum": ("CreateSandbox", create(make_spec(bundle, ttl=max_lifetime + 3600)), None, I,
                                  "TTL_ABOVE_MAX_LIFETIME"),
        "no request id": ("CreateSandbox", create(request_id=""), None, I, ""),
        "a malformed sandbox id": ("CreateSandbox", create(sandbox_id="Not_A_Valid_Id!"), None, I, ""),
        "no token (create)": ("CreateSandbox", create(), no_token, U, "UNAUTHENTICATED"),
        "wrong token (create)": ("CreateSandbox", create(), wrong_token, U, "UNAUTHENTICATED"),
        "no token (list)": ("ListSandboxes", pb.ListSandboxesRequest(), no_token, U, "UNAUTHENTICATED"),
        "wrong token (delete)": ("DeleteSandbox", pb.DeleteSandboxRequest(id=existing["id"]), wrong_token, U,
                                 "UNAUTHENTICATED"),
        "no token (credentials)": ("GetSandboxCredentials", pb.GetSandboxRequest(id=existing["id"]), no_token, U,
                                   "UNAUTHENTICATED"),
        "no token (watch)": ("WatchSandboxes", pb.WatchSandboxesRequest(), no_token, U, "UNAUTHENTICATED"),
        "wrong token (capabilities)": ("GetCapabilities", pb.GetCapabilitiesRequest(), wrong_token, U,
                                       "UNAUTHENTICATED"),
    }


BAD_CASES = [
    "get unknown sandbox", "delete unknown sandbox", "extend unknown sandbox", "wait unknown sandbox",
    "credentials of unknown sandbox", "get unknown pool", "delete unknown pool", "update unknown pool",
    "create from unknown pool", "bundle is an empty directory", "bundle is a file", "bundle does not exist",
    "a gpu on a machine without", "an egress list locally", "invalid selector (list)",
    "invalid selector (operator)", "invalid selector (watch)", "watch from another epoch",
    "request id reused with another payload", "ttl above the maximum", "no request id",
    "a malformed sandbox id", "no token (create)", "wrong token (create)", "no token (list)",
    "wrong token (delete)", "no token (credentials)", "no token (watch)", "wrong token (capabilities)",
]


async def _snapshot(stub, md):
    listed = await stub.ListSandboxes(pb.ListSandboxesRequest(include_terminated=True, page_size=1000),
                                      metadata=md, timeout=10)
    pools = await stub.ListWarmPools(pb.ListWarmPoolsRequest(), metadata=md, timeout=10)
    return (listed.resource_version, listed.epoch, sorted(s.SerializeToString(deterministic=True)
                                                          for s in listed.sandboxes),
            sorted(p.SerializeToString(deterministic=True) for p in pools.pools))


@pytest.mark.parametrize("case", BAD_CASES)
async def test_bad_input_gets_a_definite_error_and_changes_nothing(case, bad_input_pd, bad_bundle, tmp_path):
    bundle = bad_bundle
    service, existing, capabilities = bad_input_pd
    local = _local(capabilities)
    if case == "a gpu on a machine without":
        assert not local.gpu, "this machine reports a GPU: the case needs one that cannot be enforced"
    if case == "an egress list locally":
        assert not local.egress_policy
    rpc, request, metadata, code, reason = _bad_cases(bundle, existing, capabilities, tmp_path)[case]
    channel = grpc.aio.insecure_channel(service.target)
    try:
        stub = pb_grpc.ProviderServiceStub(channel)
        before = await _snapshot(stub, service.metadata)
        processes_before = set(sandbox_processes(bundle))
        call = getattr(stub, rpc)(request, metadata=service.metadata if metadata is None else metadata,
                                  timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            if rpc == "WatchSandboxes":
                await call.read()
            else:
                await call
        assert error.value.code() == code, (error.value.code(), error.value.details())
        got_reason = harness.error_reason(error.value)
        assert got_reason == reason if reason else got_reason, (got_reason, error.value.details())
        assert error.value.details(), "the error says nothing"
        # Nothing changed: the same records, pools and resource version; no new process.
        assert await _snapshot(stub, service.metadata) == before
        assert set(sandbox_processes(bundle)) <= processes_before
        # The service keeps serving, the existing sandbox included.
        existing_now = await stub.GetSandbox(pb.GetSandboxRequest(id=existing["id"]), metadata=service.metadata,
                                             timeout=10)
        assert _phase(existing_now) == "READY" and existing_now.labels["team"] == "red"
    finally:
        await channel.close()


async def test_delete_unknown_with_allow_missing_is_ok_and_makes_nothing(api):
    _, before = await api.list_all(include_terminated=True)
    response = await api.stub.DeleteSandbox(pb.DeleteSandboxRequest(id="sbx-never-made", allow_missing=True),
                                            metadata=api.md, timeout=10)
    assert not response.sandbox.uid and response.sandbox.status.phase in (Phase.PHASE_UNSPECIFIED, Phase.TERMINATED)
    await api.stub.DeleteWarmPool(pb.DeleteWarmPoolRequest(name="never-made", allow_missing=True),
                                  metadata=api.md, timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await api.get("sbx-never-made")
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    listed, after = await api.list_all(include_terminated=True)
    assert listed == [] and after.resource_version == before.resource_version
