"""What the original's own plugins (runtime-basic's `agentix.bash`, abridge's
host `Proxy`, sandbox plugins and their tests) rely on, each with a small
plugin shaped like the original's (SPEC §3.7, §6, §9.1, §15): the
`run_stream` event types pass the host allowlist, `_detached_tasks` is a set
plugins add to, `Namespace.request` goes through `emit`, `image_env` merges
`extra` first and the `BUNDLE_RUNTIME_*` constants exist, and `Sandbox` has
`health()` and is an async context manager. The daemon-backed versions are in
testing/e2e/test_original_plugins.py."""

import asyncio
import dataclasses
import logging
import pickle
import sys
import types
from typing import Literal

import pytest

import agentix.runtime
import agentix.sio as sio
from agentix import AsyncClientNamespace, Namespace, RemoteSioError, register_namespace
from agentix.provider import Sandbox, SandboxId
from agentix.runtime.shared import env as env_module
from agentix.runtime.shared.codec import pack
from agentix.runtime.shared.models import HealthResponse
from agentix.runtime.shared.safepickle import RestrictedUnpickleError, restricted_loads


# ── agentix.bash.run_stream's event types ──────────────────────────────────


def _bash_module():
    """A module named agentix.bash with the original's four event dataclasses
    (and one class the allowlist does not name)."""
    module = types.ModuleType("agentix.bash")

    @dataclasses.dataclass
    class BashStdout:
        data: str
        type: Literal["stdout"] = "stdout"

    @dataclasses.dataclass
    class BashStderr:
        data: str
        type: Literal["stderr"] = "stderr"

    @dataclasses.dataclass
    class BashExit:
        exit_code: int
        type: Literal["exit"] = "exit"

    @dataclasses.dataclass
    class BashError:
        message: str
        type: Literal["error"] = "error"

    @dataclasses.dataclass
    class NotAnEvent:
        data: str

    for cls in (BashStdout, BashStderr, BashExit, BashError, NotAnEvent):
        cls.__module__ = "agentix.bash"
        cls.__qualname__ = cls.__name__
        setattr(module, cls.__name__, cls)
    return module


@pytest.fixture
def bash(monkeypatch):
    module = _bash_module()
    monkeypatch.setitem(sys.modules, "agentix.bash", module)
    return module


@pytest.mark.parametrize("protocol", [4, 5])
def test_run_stream_event_types_are_admitted_without_allow_type(bash, protocol):
    events = [bash.BashStdout("out\n"), bash.BashStderr("err\n"), bash.BashExit(3), bash.BashError("timed out")]
    for event in events:
        decoded = restricted_loads(pickle.dumps(event, protocol=protocol))
        assert type(decoded) is type(event) and decoded == event
    # Only those four: another class of the same module is still refused.
    with pytest.raises(RestrictedUnpickleError, match="agentix.bash.NotAnEvent"):
        restricted_loads(pickle.dumps(bash.NotAnEvent("x"), protocol=protocol))


# ── AsyncClientNamespace._detached_tasks is a set ──────────────────────────


class AbridgeLikeProxy(AsyncClientNamespace):
    """abridge's Proxy in small: `trigger_event` overridden, each data event
    answered by a task it holds in ``self._detached_tasks`` itself."""

    def __init__(self):
        super().__init__("/abridge")
        self.handled = []
        self.release = asyncio.Event()

    async def trigger_event(self, event, *args):
        if event in ("connect", "disconnect", "connect_error"):
            return await super().trigger_event(event, *args)
        task = asyncio.get_running_loop().create_task(self._handle(event, args[0]))
        self._detached_tasks.add(task)
        task.add_done_callback(self._detached_tasks.discard)
        return None

    async def _handle(self, event, payload):
        await self.release.wait()
        if payload == pack("fail"):
            raise ValueError("upstream said no")
        self.handled.append(event)


@pytest.mark.asyncio
async def test_host_plugin_holds_its_tasks_in_detached_tasks(caplog):
    proxy = AbridgeLikeProxy()
    assert isinstance(proxy._detached_tasks, set) and not proxy._detached_tasks
    await proxy.trigger_event("/v1/messages", pack({"body": b"{}"}))
    await proxy.trigger_event("/v1/messages", pack("fail"))
    assert len(proxy._detached_tasks) == 2  # held strongly while they run
    assert all(isinstance(task, asyncio.Task) for task in proxy._detached_tasks)
    caplog.set_level(logging.ERROR, logger="agentix.sio")
    proxy.release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert proxy.handled == ["/v1/messages"]
    assert not proxy._detached_tasks  # removed once done
    failures = [r for r in caplog.records if "detached task" in r.getMessage()]
    assert len(failures) == 1 and "/abridge" in failures[0].getMessage()
    assert "upstream said no" in str(failures[0].exc_info[1])


@pytest.mark.asyncio
async def test_detached_tasks_set_drops_a_task_the_plugin_forgets_to_discard():
    ns = AsyncClientNamespace("/h")
    task = asyncio.ensure_future(asyncio.sleep(0))
    ns._detached_tasks.add(task)
    ns._detached_tasks.add(task)  # twice: held once
    assert ns._detached_tasks == {task}
    await task
    await asyncio.sleep(0)
    assert ns._detached_tasks == set()
    ns._detached_tasks.discard(task)  # a plugin's own discard afterwards is harmless


@pytest.mark.asyncio
async def test_sandbox_namespace_detached_tasks_is_a_set_too(bridge):
    class Plugin(Namespace):
        namespace = "/p"

        async def on_work(self, data):
            await asyncio.sleep(0.01)

    ns = register_namespace(Plugin())
    assert isinstance(ns._detached_tasks, set)
    sio._deliver("/p", "work", pack(1))
    assert len(ns._detached_tasks) == 1
    extra = asyncio.ensure_future(asyncio.sleep(0))
    ns._detached_tasks.add(extra)
    extra.add_done_callback(ns._detached_tasks.discard)
    assert len(ns._detached_tasks) == 2
    await asyncio.sleep(0.05)
    assert not ns._detached_tasks


# ── Namespace.request goes through emit ────────────────────────────────────


@pytest.mark.asyncio
async def test_a_test_that_hooks_emit_sees_the_request_outside_a_worker():
    """The original's tests replace `emit` on the instance and answer the
    request themselves; no worker (no bridge) is needed."""
    ns = Namespace("/p")
    emitted = []

    async def fake_emit(event, data=None):
        emitted.append((event, data))

    ns.emit = fake_emit
    task = asyncio.ensure_future(ns.request("ask", {"q": 1}, timeout=5))
    await asyncio.sleep(0)
    assert len(emitted) == 1
    event, envelope = emitted[0]
    assert event == "ask" and envelope["data"] == {"q": 1} and len(envelope["request_id"]) == 32
    ns._dispatch("ask:error", {"request_id": envelope["request_id"],
                               "error": {"type": "KeyError", "message": "m", "status_code": 404}})
    with pytest.raises(RemoteSioError) as info:
        await task
    assert (info.value.type, info.value.status_code) == ("KeyError", 404)

    task = asyncio.ensure_future(ns.request("ask", None, timeout=5))
    await asyncio.sleep(0)
    ns._dispatch("ask:result", {"request_id": emitted[-1][1]["request_id"], "value": 42})
    assert await task == 42
    assert ns._pending == {}


@pytest.mark.asyncio
async def test_a_plugin_overriding_emit_sees_requests_and_their_resends(bridge):
    class Audited(Namespace):
        namespace = "/audited"

        def __init__(self):
            super().__init__()
            self.audit = []

        async def emit(self, event, data=None):
            self.audit.append(event)
            await super().emit(event, data)

    ns = register_namespace(Audited())
    task = asyncio.ensure_future(ns.request("complete", {"prompt": "hi"}, timeout=5))
    await asyncio.sleep(0)
    assert ns.audit == ["complete"]
    (namespace, event, _payload, request_id, _error), = bridge.sent
    assert (namespace, event) == ("/audited", "complete") and len(request_id) == 32
    # A host reconnects: the pending request is sent again, through emit too.
    sio._deliver("/audited", "agentix:host_connected", pack(None))
    for _ in range(3):
        await asyncio.sleep(0)
    assert ns.audit == ["complete", "complete"]
    assert bridge.sent[1] == bridge.sent[0]
    sio._deliver("/audited", "complete:result", pack({"request_id": request_id, "value": "ok"}))
    assert await task == "ok"


@pytest.mark.asyncio
async def test_emit_patched_on_the_class_sees_requests(bridge, monkeypatch):
    seen = []
    original = Namespace.emit

    async def spy(self, event, data=None):
        seen.append(event)
        await original(self, event, data)

    monkeypatch.setattr(Namespace, "emit", spy)
    ns = register_namespace(Namespace("/spied"))
    with pytest.raises(TimeoutError):
        await ns.request("ask", 1, timeout=0.01)
    assert seen == ["ask"] and bridge.sent[0][1] == "ask"


@pytest.mark.asyncio
async def test_the_default_emit_still_needs_a_worker():
    with pytest.raises(RuntimeError, match="only callable from inside a sandbox runtime worker"):
        await Namespace("/p").request("e", 1)


# ── image_env and the bundle constants ─────────────────────────────────────


def test_image_env_merges_extra_before_deriving_bash_env(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export FROM_BASHRC=1\n")
    monkeypatch.setenv("HOME", str(tmp_path / "no-bashrc-here"))
    monkeypatch.delenv("BASH_ENV", raising=False)
    monkeypatch.setenv("PATH", "/nix/runtime/venv/bin:/nix/runtime/bin:/usr/bin")
    monkeypatch.setenv("AGENTIX_ADDED_PATH", "/nix/runtime/venv/bin:/nix/runtime/bin")
    assert "BASH_ENV" not in env_module.image_env()
    env = env_module.image_env({"HOME": str(home), "X": "1"})
    assert env["BASH_ENV"] == str(home / ".bashrc")  # the HOME extra names decides
    assert env["HOME"] == str(home) and env["X"] == "1" and env["PATH"] == "/usr/bin"
    assert "AGENTIX_ADDED_PATH" not in env
    # A BASH_ENV in extra wins.
    assert env_module.image_env({"HOME": str(home), "BASH_ENV": "/mine"})["BASH_ENV"] == "/mine"


def test_bundle_runtime_constants_under_the_original_names():
    assert env_module.BUNDLE_NIX_ROOT == "/nix"
    assert env_module.BUNDLE_RUNTIME_ROOT == "/nix/runtime"
    assert env_module.BUNDLE_RUNTIME_BIN == "/nix/runtime/bin"
    assert env_module.BUNDLE_RUNTIME_LIB == "/nix/runtime/lib"
    assert env_module.BUNDLE_RUNTIME_INCLUDE == "/nix/runtime/include"
    assert env_module.BUNDLE_RUNTIME_VENV == "/nix/runtime/venv"
    assert env_module.BUNDLE_RUNTIME_VENV_BIN == "/nix/runtime/venv/bin"
    assert env_module.BUNDLE_RUNTIME_BASH == "/nix/runtime/bin/bash"
    assert env_module.BUNDLE_RUNTIME_ENTRYPOINT == "/nix/runtime/bootstrap.sh"
    assert env_module.BUNDLE_RUNTIME_PKGCONFIG_DIRS == ("/nix/runtime/lib/pkgconfig", "/nix/runtime/share/pkgconfig")
    assert env_module.BUNDLE_RUNTIME_PATH_ENTRIES["PATH"] == ("/nix/runtime/venv/bin", "/nix/runtime/bin")
    assert env_module.BUNDLE_RUNTIME_ENV["PATH"] == "/nix/runtime/venv/bin:/nix/runtime/bin"
    assert env_module.BUNDLE_RUNTIME_ENV["CMAKE_PREFIX_PATH"] == "/nix/runtime"
    assert (env_module.BIND_HOST_ENV, env_module.BIND_PORT_ENV) == ("AGENTIX_BIND_HOST", "AGENTIX_BIND_PORT")
    assert env_module.AGENTIX_ADDED_LD_LIBRARY_PATH == "AGENTIX_ADDED_LD_LIBRARY_PATH"
    assert env_module.AGENTIX_SAVED_PREFIX == "AGENTIX_SAVED_"
    # agentix.runtime re-exports the original's 17 names (and keeps LISTEN_ENV).
    original = {
        "AGENTIX_ADDED_LD_LIBRARY_PATH", "AGENTIX_ADDED_PATH", "BIND_HOST_ENV", "BIND_PORT_ENV",
        "BUNDLE_NIX_ROOT", "BUNDLE_RUNTIME_BASH", "BUNDLE_RUNTIME_BIN", "BUNDLE_RUNTIME_ENTRYPOINT",
        "BUNDLE_RUNTIME_ENV", "BUNDLE_RUNTIME_INCLUDE", "BUNDLE_RUNTIME_LIB", "BUNDLE_RUNTIME_PATH_ENTRIES",
        "BUNDLE_RUNTIME_PKGCONFIG_DIRS", "BUNDLE_RUNTIME_ROOT", "BUNDLE_RUNTIME_VENV",
        "BUNDLE_RUNTIME_VENV_BIN", "get_env_without_agentix",
    }
    assert original <= set(agentix.runtime.__all__)
    for name in original:
        assert getattr(agentix.runtime, name) is getattr(env_module, name)


# ── Sandbox.health() and async with sandbox ────────────────────────────────


class FakeClient:
    def __init__(self):
        self.closed = 0

    async def health(self):
        return HealthResponse(status="ok", version="0.3.0")

    async def close(self):
        self.closed += 1


@pytest.mark.asyncio
async def test_sandbox_health_and_async_with():
    sandbox = Sandbox(sandbox_id=SandboxId("s-1"), runtime_url="unix:///nowhere.sock")
    client = sandbox._client = FakeClient()
    async with sandbox as entered:
        assert entered is sandbox
        assert await sandbox.health() == HealthResponse(status="ok", version="0.3.0")
    assert client.closed == 1 and sandbox._client is None
    # Leaving with an exception closes too, and lets it through.
    client = sandbox._client = FakeClient()
    with pytest.raises(KeyError):
        async with sandbox:
            raise KeyError("body failed")
    assert client.closed == 1
