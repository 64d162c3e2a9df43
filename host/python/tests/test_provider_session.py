"""The provider interface: the session() contract and the Sandbox handle."""

import pytest

from agentix.provider import Sandbox, SandboxConfig, SandboxId, SandboxInfo, SandboxProvider
from agentix.provider.base import BundleDeployer, DeployedBundle

CONFIG = SandboxConfig(image="host", bundle="/bundle")


class FakeClient:
    def __init__(self, events, *, fail_close=False):
        self.events = events
        self.fail_close = fail_close
        self.call_deadline = None

    async def remote(self, fn, *args, **kwargs):
        self.events.append(("remote", fn, args, kwargs, self.call_deadline))
        return "value"

    async def try_remote(self, fn, *args, **kwargs):
        return ("ok", fn(*args, **kwargs))

    def remote_stream(self, fn, *args, **kwargs):
        async def items():
            for item in fn(*args, **kwargs):
                yield item

        return items()

    async def close(self):
        self.events.append("aclose")
        if self.fail_close:
            raise OSError("close failed")


class FakeProvider(SandboxProvider):
    def __init__(self, *, fail_close=False, deadline_from_create=None):
        self.events = []
        self.fail_close = fail_close
        self.deadline_from_create = deadline_from_create
        self.created = []

    async def create(self, config):
        self.events.append("create")
        sandbox = Sandbox(sandbox_id=SandboxId("fake-1"), runtime_url="unix:///nowhere.sock", status="running")
        sandbox.call_deadline = self.deadline_from_create
        self.created.append(sandbox)
        return sandbox

    async def delete(self, sandbox_id):
        self.events.append(("delete", sandbox_id))

    async def get(self, sandbox_id):
        return SandboxInfo(sandbox_id=sandbox_id, runtime_url="unix:///nowhere.sock")


def _use_fake_client(sandbox, provider):
    sandbox._client = FakeClient(provider.events, fail_close=provider.fail_close)


@pytest.mark.asyncio
async def test_session_creates_stamps_yields_then_closes_and_deletes():
    provider = FakeProvider()
    async with provider.session(CONFIG, call_deadline=12.5) as sandbox:
        assert provider.events == ["create"]
        assert sandbox._client is None  # create() must not instantiate the client
        assert sandbox.call_deadline == 12.5
        _use_fake_client(sandbox, provider)
        assert await sandbox.remote(len, "abc") == "value"
    assert provider.events == ["create", ("remote", len, ("abc",), {}, 12.5), "aclose", ("delete", "fake-1")]
    assert sandbox._client is None


@pytest.mark.asyncio
async def test_session_without_deadline_keeps_the_providers_value():
    provider = FakeProvider(deadline_from_create=3.0)
    async with provider.session(CONFIG) as sandbox:
        assert sandbox.call_deadline == 3.0


@pytest.mark.asyncio
async def test_delete_runs_even_if_aclose_raises():
    provider = FakeProvider(fail_close=True)
    with pytest.raises(OSError, match="close failed"):
        async with provider.session(CONFIG) as sandbox:
            _use_fake_client(sandbox, provider)
    assert provider.events[-2:] == ["aclose", ("delete", "fake-1")]


@pytest.mark.asyncio
async def test_body_exception_propagates_after_cleanup():
    provider = FakeProvider()
    with pytest.raises(ZeroDivisionError):
        async with provider.session(CONFIG) as sandbox:
            _use_fake_client(sandbox, provider)
            1 / 0
    assert provider.events[-2:] == ["aclose", ("delete", "fake-1")]


@pytest.mark.asyncio
async def test_failed_create_deletes_nothing():
    class Failing(FakeProvider):
        async def create(self, config):
            raise RuntimeError("no capacity")

    provider = Failing()
    with pytest.raises(RuntimeError, match="no capacity"):
        async with provider.session(CONFIG):
            pass
    assert provider.events == []


def test_providers_and_deployers_are_runtime_checkable():
    assert isinstance(FakeProvider(), SandboxProvider)
    assert not isinstance(object(), SandboxProvider)

    class Deployer:
        async def deploy_bundle(self, bundle, *, name=None, platform=None):
            return DeployedBundle(bundle=str(bundle))

    assert isinstance(Deployer(), BundleDeployer)


@pytest.mark.asyncio
async def test_lazy_client_is_a_runtime_client_with_the_sandbox_deadline():
    from agentix.runtime.client.client import RuntimeClient

    sandbox = Sandbox(sandbox_id=SandboxId("s"), runtime_url="unix:///tmp/none.sock", call_deadline=4.0)
    client = sandbox.client
    assert isinstance(client, RuntimeClient)
    assert client.base_url == "unix:///tmp/none.sock" and client.call_deadline == 4.0
    assert sandbox.client is client
    sandbox.call_deadline = 9.0
    assert sandbox.client.call_deadline == 9.0  # later changes reach later calls
    await sandbox.aclose()
    assert sandbox._client is None
    await sandbox.aclose()  # idempotent


@pytest.mark.asyncio
async def test_sandbox_delegates_try_remote_and_remote_stream():
    events = []
    sandbox = Sandbox(sandbox_id=SandboxId("s"), runtime_url="unix:///x.sock")
    sandbox._client = FakeClient(events)
    assert await sandbox.try_remote(len, "ab") == ("ok", 2)
    assert [item async for item in sandbox.remote_stream(range, 3)] == [0, 1, 2]


def test_register_namespace_delegates_or_says_what_is_missing():
    sandbox = Sandbox(sandbox_id=SandboxId("s"), runtime_url="unix:///x.sock")
    sandbox._client = FakeClient([])
    with pytest.raises(NotImplementedError, match="register_namespace"):
        sandbox.register_namespace(object())

    class WithNamespaces(FakeClient):
        def register_namespace(self, namespace):
            self.events.append(("ns", namespace))
            return "registered"

    sandbox._client = WithNamespaces([])
    assert sandbox.register_namespace("plugin") == "registered"
    assert sandbox._client.events == [("ns", "plugin")]


def test_sandbox_and_info_defaults():
    sandbox = Sandbox(sandbox_id=SandboxId("s"), runtime_url="u")
    assert (sandbox.status, sandbox.call_deadline) == ("running", None)
    assert SandboxInfo(sandbox_id=SandboxId("s"), runtime_url="u").status == "running"
    deployed = DeployedBundle(bundle="/b")
    assert (deployed.platform, deployed.metadata, deployed.hints) == (None, {}, {})
