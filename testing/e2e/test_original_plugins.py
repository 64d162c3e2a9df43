"""The original's plugins, unmodified, against the real daemon and worker
(issue 18 item 5; SPEC §3.7, §6, §15). Each plugin here is small but shaped
like the original's:

- `agentix.bash` (testing/fixtures/original_plugins, a namespace-package
  sibling like the runtime-basic wheel): `run_stream` through `remote_stream`
  yields `BashStdout` / `BashStderr` / `BashExit` / `BashError`, admitted by
  the host's allowlist with no `allow_type`;
- abridge's host `Proxy`: overrides `trigger_event` and holds each request's
  task in ``self._detached_tasks`` (a set);
- a sandbox plugin overriding `emit`: `Namespace.request` goes through it;
- `image_env(extra)` merges `extra` before deriving ``BASH_ENV``.

`Sandbox.health()` and ``async with sandbox`` on a LocalProvider sandbox are in
test_local_provider.py (they need bubblewrap).
"""

import asyncio
import logging
import pkgutil
import sys

import pytest

import agentix
import original_plugin_targets as targets
from agentix import AsyncClientNamespace, RuntimeClient, request_handler
from agentix.runtime.shared.codec import unpack
from agentix.runtime.shared.env import image_env
from conftest import REPO, TARGETS_DIR, wait_for

PLUGINS_DIR = REPO / "testing" / "fixtures" / "original_plugins"

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def bash():
    """`agentix.bash` importable on the host as a plugin wheel would make it:
    its directory on sys.path, picked up by agentix's pkgutil.extend_path."""
    sys.path.append(str(PLUGINS_DIR))
    saved_path = list(agentix.__path__)
    agentix.__path__ = pkgutil.extend_path(agentix.__path__, "agentix")
    import agentix.bash as module

    yield module
    sys.modules.pop("agentix.bash", None)
    if hasattr(agentix, "bash"):
        del agentix.bash
    agentix.__path__ = saved_path
    sys.path.remove(str(PLUGINS_DIR))


@pytest.fixture
def plugin_daemon(start_daemon):
    """A daemon whose worker imports the e2e targets and the plugin directory."""
    return start_daemon(extra_args=("--python-path", f"{TARGETS_DIR}:{PLUGINS_DIR}"))


async def test_bash_run_stream_events_pass_the_allowlist_by_default(plugin_daemon, bash):
    async with RuntimeClient(plugin_daemon.url) as client:
        command = "printf 'one\\n'; printf 'oops\\n' >&2; sleep 0.05; printf 'two\\n'; exit 3"
        events = [event async for event in client.remote_stream(bash.run_stream, command)]
        assert all(type(event).__module__ == "agentix.bash" for event in events)
        stdout = "".join(event.data for event in events if isinstance(event, bash.BashStdout))
        stderr = "".join(event.data for event in events if isinstance(event, bash.BashStderr))
        assert (stdout, stderr) == ("one\ntwo\n", "oops\n")
        assert events[-1] == bash.BashExit(exit_code=3)
        assert [type(event) for event in events].count(bash.BashExit) == 1

        timed_out = [event async for event in client.remote_stream(bash.run_stream, "sleep 5", timeout=0.2)]
        assert timed_out == [bash.BashError(message="Command timed out after 0.2s")]

        # The first-party result type too, through remote().
        result = await client.remote(bash.run, "echo hi")
        assert result == bash.BashResult(exit_code=0, stdout="hi\n", stderr="")
        # The daemon keeps serving.
        assert (await client.health()).status == "ok"


class AbridgeProxy(AsyncClientNamespace):
    """abridge's host Proxy in small: `trigger_event` overridden, each
    path-named request answered by a task held in ``self._detached_tasks``."""

    def __init__(self):
        super().__init__("/abridge")
        self.release = asyncio.Event()

    async def trigger_event(self, event, *args):
        if event in ("connect", "disconnect", "connect_error"):
            return await super().trigger_event(event, *args)
        payload = unpack(args[0])
        task = asyncio.get_running_loop().create_task(self._forward(event, payload))
        self._detached_tasks.add(task)
        task.add_done_callback(self._detached_tasks.discard)
        return None

    async def _forward(self, path, payload):
        await self.release.wait()
        body = payload["data"]
        if body == b"fail":
            await self.emit(f"{path}:error", {"request_id": payload["request_id"],
                                              "error": {"type": "HTTPStatusError", "message": "bad gateway",
                                                        "status_code": 502}})
            return
        await self.emit(f"{path}:result", {"request_id": payload["request_id"],
                                           "value": {"body": body.upper(), "media_type": "application/json",
                                                     "status_code": 200}})


async def test_abridge_style_proxy_holds_its_tasks_in_detached_tasks(daemon, collected):
    proxy = AbridgeProxy()
    client = RuntimeClient(daemon.url)
    client.register_namespace(proxy)
    async with client:
        calls = [asyncio.ensure_future(client.remote(targets.tunnel, "/v1/messages", body))
                 for body in (b'{"a": 1}', b"fail")]
        await wait_for(lambda: len(proxy._detached_tasks) == 2)  # held while they run
        assert all(isinstance(task, asyncio.Task) and not task.done() for task in proxy._detached_tasks)
        proxy.release.set()
        ok, failed = await asyncio.gather(*calls, return_exceptions=True)
        assert ok == {"body": b'{"A": 1}', "media_type": "application/json", "status_code": 200}
        assert isinstance(failed, agentix.RemoteCallError) and "bad gateway" in str(failed)
        await wait_for(lambda: not proxy._detached_tasks)
    problems = [r for r in collected.records if r.levelno >= logging.ERROR or "AttributeError" in r.getMessage()]
    assert [r for r in problems if r.name.startswith("agentix.sio")] == []


class AuditedHost(AsyncClientNamespace):
    def __init__(self):
        super().__init__("/audited")

    @request_handler("ask")
    async def on_ask(self, body):
        return {"a": body["q"] * 2}


async def test_sandbox_request_goes_through_an_overridden_emit(daemon):
    client = RuntimeClient(daemon.url)
    client.register_namespace(AuditedHost())
    async with client:
        answer, sent = await client.remote(targets.audited_ask, "ab")
        assert answer == {"a": "abab"}
        assert sent == [["ask", ["data", "request_id"]]]
        answer, sent = await client.remote(targets.audited_ask, "c")
        assert answer == {"a": "cc"} and len(sent) == 2


async def test_image_env_in_the_sandbox_merges_extra_before_bash_env(plugin_daemon, bash, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export FROM_BASHRC=sourced\n")
    async with RuntimeClient(plugin_daemon.url) as client:
        env = await client.remote(image_env, {"HOME": str(home), "EXTRA": "1"})
        assert env["BASH_ENV"] == str(home / ".bashrc") and env["EXTRA"] == "1"
        assert (await client.remote(image_env, {"HOME": str(home), "BASH_ENV": ""}))["BASH_ENV"] == ""
        # The bash plugin's clean environment: non-interactive bash sources the image's .bashrc.
        result = await client.remote(bash.run, 'echo "$FROM_BASHRC"', env={"HOME": str(home)}, clean_env=True)
        assert result.stdout == "sourced\n"
