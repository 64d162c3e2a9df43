"""The `agentix` command (agentix.cli.main) against a fake ProviderService:
human tables, --json documents, errors and exit codes, where it connects."""

import asyncio
import io
import json
import os
import subprocess
import sys

import pytest
import pytest_asyncio

from agentix.cli.main import main
from agentix.provider import SandboxConfig
from agentix.provider.service import ServiceProvider
from agentix.provider.v1 import provider_pb2 as pb
from child_paths import with_stub_paths


@pytest_asyncio.fixture
async def fake(fake, monkeypatch):
    """conftest's `fake` holding three sandboxes (teams a, b, a); no provider
    URL or token in the environment."""
    monkeypatch.delenv("AGENTIX_PROVIDER_URL", raising=False)
    monkeypatch.delenv("AGENTIX_PROVIDER_TOKEN", raising=False)
    client = ServiceProvider(fake.url)
    for team in ("a", "b", "a"):
        await client.create(SandboxConfig(image="host", bundle="/b"), labels={"team": team})
    await client.aclose()
    return fake


async def run(*argv):
    """Runs the command on a thread (it has its own event loop); returns (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()

    def call():
        real_err = sys.stderr
        sys.stderr = err
        try:
            return main(list(argv), out=out)
        finally:
            sys.stderr = real_err

    status = await asyncio.to_thread(call)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.asyncio
async def test_sandbox_ls_table_and_json(fake):
    status, out, _ = await run("sandbox", "ls", "--url", fake.url)
    lines = out.splitlines()
    assert status == 0 and lines[0].split() == ["ID", "PHASE", "LAUNCH", "AGE", "EXPIRES", "POOL", "LABELS"]
    assert [line.split()[:3] for line in lines[1:]] == [[f"sbx-{n}", "READY", "COLD"] for n in (1, 2, 3)]
    assert lines[1].split()[-1] == "team=a"
    status, out, _ = await run("--url", fake.url, "--json", "sandbox", "ls", "-l", "team=a")
    document = json.loads(out)
    assert status == 0 and [s["id"] for s in document["sandboxes"]] == ["sbx-1", "sbx-3"]
    assert document["sandboxes"][0]["status"]["phase"] == "READY"
    assert document["sandboxes"][0]["status"]["endpoint"]["target"].endswith("sbx-1.sock")


@pytest.mark.asyncio
async def test_url_from_the_environment_and_empty_lists(fake, monkeypatch):
    monkeypatch.setenv("AGENTIX_PROVIDER_URL", fake.url)
    assert (await run("sandbox", "ls", "-l", "team=z")) == (0, "no sandboxes\n", "")
    assert (await run("pool", "ls")) == (0, "no pools\n", "")


@pytest.mark.asyncio
async def test_sandbox_get(fake):
    fake.set_phase("sbx-2", pb.SandboxStatus.TERMINATED, pb.Exit.START_FAILED, "bootstrap: no such file")
    status, out, _ = await run("sandbox", "get", "sbx-2", "--url", fake.url)
    assert status == 0
    assert "phase:" in out and "TERMINATED" in out and "exit:             START_FAILED (code 0)" in out
    assert out.rstrip().endswith("bootstrap: no such file")
    status, out, _ = await run("sandbox", "get", "sbx-2", "--url", fake.url, "--json")
    assert json.loads(out)["status"]["exit"]["log_tail"] == "bootstrap: no such file"


@pytest.mark.asyncio
async def test_sandbox_rm(fake):
    status, out, _ = await run("sandbox", "rm", "sbx-1", "sbx-2", "--grace", "0.5", "--url", fake.url)
    assert (status, out) == (0, "deleted sbx-1\ndeleted sbx-2\n")
    assert [(r.id, r.wait, r.grace.nanos) for r in fake.deletes()] == [
        ("sbx-1", True, 500_000_000), ("sbx-2", True, 500_000_000),
    ]
    status, out, _ = await run("sandbox", "rm", "sbx-3", "--json", "--url", fake.url)
    assert json.loads(out)["deleted"][0]["status"]["exit"]["reason"] == "DELETED"


@pytest.mark.asyncio
async def test_errors_print_reason_and_message_and_exit_1(fake):
    status, out, err = await run("sandbox", "rm", "sbx-9", "--url", fake.url)
    assert (status, out) == (1, "")
    assert err.startswith("agentix: SANDBOX_NOT_FOUND (NOT_FOUND): no sandbox 'sbx-9'")
    assert (await run("sandbox", "rm", "sbx-9", "--missing-ok", "--url", fake.url))[0] == 0
    status, out, err = await run("sandbox", "get", "sbx-9", "--json", "--url", fake.url)
    assert status == 1 and json.loads(out)["error"]["reason"] == "SANDBOX_NOT_FOUND"
    status, _, err = await run("sandbox", "ls", "-l", "a b", "--url", fake.url)
    assert status == 1 and "INVALID_LABEL_SELECTOR (INVALID_ARGUMENT)" in err


@pytest.mark.asyncio
async def test_token(fake):
    fake.token = "t0k"
    status, _, err = await run("sandbox", "ls", "--url", fake.url)
    assert status == 1 and "UNAUTHENTICATED" in err
    assert (await run("sandbox", "ls", "--url", fake.url, "--token", "t0k"))[0] == 0
    os.environ["AGENTIX_PROVIDER_TOKEN"] = "t0k"
    try:
        assert (await run("sandbox", "ls", "--url", fake.url))[0] == 0
    finally:
        del os.environ["AGENTIX_PROVIDER_TOKEN"]


@pytest.mark.asyncio
async def test_unreachable_service_says_how_to_start_one(short_dir, monkeypatch):
    monkeypatch.delenv("AGENTIX_PROVIDER_URL", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    status, _, err = await run("sandbox", "ls")
    socket = short_dir / "agentix" / "providerd.sock"
    assert status == 1
    assert f"cannot reach agentix-providerd at unix://{socket}" in err
    assert f"agentix-providerd --listen unix://{socket}" in err


@pytest.mark.asyncio
async def test_logs(fake):
    fake.logs["sbx-1"] = b"line one\nline two\n"
    status, out, _ = await run("sandbox", "logs", "sbx-1", "--url", fake.url)
    assert (status, out) == (0, "line one\nline two\n")
    status, out, _ = await run("sandbox", "logs", "sbx-1", "--offset", "9", "--json", "--url", fake.url)
    assert json.loads(out) == {"id": "sbx-1", "offset": 9, "end": 18, "data": "line two\n"}


@pytest.mark.asyncio
async def test_wait(fake):
    status, out, _ = await run("sandbox", "wait", "sbx-1", "--url", fake.url)
    assert (status, out) == (0, "sbx-1 is READY\n")
    status, out, err = await run("sandbox", "wait", "sbx-1", "--until", "terminated", "--timeout", "0.2",
                                 "--json", "--url", fake.url)
    assert status == 1 and json.loads(out)["reached"] is False and "not TERMINATED" in err
    fake.set_phase("sbx-2", pb.SandboxStatus.TERMINATED, pb.Exit.OOM_KILLED)
    status, _, err = await run("sandbox", "wait", "sbx-2", "--url", fake.url)
    assert status == 1 and "OOM_KILLED" in err


@pytest.mark.asyncio
async def test_pools(fake):
    status, out, _ = await run(
        "pool", "create", "warm", "--bundle", "/b", "--min-ready", "2", "--max-total", "5", "--memory", "256m",
        "--label", "tier=fast", "--strategy", "on_replenish", "--url", fake.url,
    )
    assert (status, out) == (0, "created pool warm (min ready 2, max 5)\n")
    pool = fake.pools["warm"]
    assert pool.template.resources.memory_bytes == 256 << 20 and dict(pool.labels) == {"tier": "fast"}
    status, out, _ = await run("pool", "ls", "--url", fake.url)
    assert out.splitlines()[0].split() == ["NAME", "READY", "CREATING", "TOTAL", "MIN", "MAX", "CLAIMED", "STATE"]
    assert out.splitlines()[1].split() == ["warm", "2", "0", "2", "2", "5", "0", "ok"]
    status, out, _ = await run("pool", "ls", "--json", "--url", fake.url)
    assert json.loads(out)["pools"][0]["name"] == "warm"
    status, _, err = await run("pool", "create", "warm", "--bundle", "/b", "--min-ready", "1", "--url", fake.url)
    assert status == 1 and "POOL_EXISTS" in err
    assert (await run("pool", "rm", "warm", "--url", fake.url)) == (0, "deleted pool warm\n", "")
    assert (await run("pool", "rm", "warm", "--url", fake.url))[0] == 1


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["sandbox", "frobnicate"])
    assert raised.value.code == 2
    with pytest.raises(SystemExit):
        main(["pool", "create", "p", "--min-ready", "1"])  # --bundle is required
    assert "--bundle" in capsys.readouterr().err


def test_python_dash_m_agentix_runs_the_command(short_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "XDG_RUNTIME_DIR": str(short_dir)}
    env.pop("AGENTIX_PROVIDER_URL", None)
    code = "import runpy, sys; sys.argv = ['agentix', 'pool', 'ls']; runpy.run_module('agentix', run_name='__main__')"
    result = subprocess.run([sys.executable, "-c", with_stub_paths(code)], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and "cannot reach agentix-providerd" in result.stderr


@pytest.mark.asyncio
async def test_ls_shows_age_and_expiry_of_live_sandboxes_only(fake):
    import time

    now = int(time.time())
    fake.records["sbx-1"].status.create_time.FromSeconds(now - 125)
    fake.records["sbx-1"].status.expire_time.FromSeconds(now + 3600 + 330)
    fake.records["sbx-2"].status.expire_time.FromSeconds(now + 60)
    fake.set_phase("sbx-2", pb.SandboxStatus.TERMINATED, pb.Exit.TTL_EXPIRED)
    _, out, _ = await run("sandbox", "ls", "--all", "--url", fake.url)
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["sbx-1"][2] == "COLD" and rows["sbx-1"][3] in ("2m5s", "2m6s") and rows["sbx-1"][4:6] == ["in", "1h5m"]
    assert rows["sbx-2"][1:5] == ["TERMINATED", "(TTL_EXPIRED)", "COLD", "-"] and rows["sbx-2"][5] == "-"
