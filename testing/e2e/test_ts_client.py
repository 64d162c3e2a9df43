"""The conformance cases (testing/conformance/cases.json) for the TypeScript
client (host/ts, @grpc/grpc-js with its default 4 MiB receive limit) against
the real agentix-sandboxd + agentix-worker.

Its npm dependencies are installed from the npm registry at test time into a
cache directory ($AGENTIX_NPM_CACHE_TS, default ~/.cache/agentix/ts-client-<hash
of package.json>), once; the client is compiled with the TypeScript compiler and
its node:test suite (host/ts/test/conformance.test.js) runs once per module.
Every case of cases.json (but those whose `not_for` names "ts") and every
"ts_*" test of the suite is one pytest test here, so each is counted by
tools/test, and a case the suite forgot fails."""

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, Daemon

TS = REPO / "host" / "ts"
SUITE = TS / "test" / "conformance.test.js"
_SPEC = json.loads((REPO / "testing" / "conformance" / "cases.json").read_text())
CASES = [c["id"] for c in _SPEC["values"] + _SPEC["behaviours"] if "ts" not in c.get("not_for", ())]
CASES += re.findall(r'^test\("(ts_[a-z0-9_]+)",', SUITE.read_text(), re.M)
INSTALL_TIMEOUT_S = 300
SUITE_TIMEOUT_S = 600
TOKEN = "ts-client-test-token-0123456789"


def _node_modules():
    lock = (TS / "package.json").read_bytes()
    cache = Path(os.environ.get(
        "AGENTIX_NPM_CACHE_TS",
        Path.home() / ".cache" / "agentix" / f"ts-client-{hashlib.sha256(lock).hexdigest()[:12]}"))
    marker = cache / "node_modules" / "@grpc" / "grpc-js" / "package.json"
    if not marker.exists():
        for tool in ("node", "npm"):
            if shutil.which(tool) is None:
                pytest.fail(f"{tool} is not installed (tools/setup installs nodejs and npm)")
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copy(TS / "package.json", cache / "package.json")
        try:
            proc = subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(cache)],
                capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"npm install took over {INSTALL_TIMEOUT_S} s: is the npm registry reachable?")
        if proc.returncode != 0 or not marker.exists():
            pytest.fail(f"npm install into {cache} failed (is the npm registry reachable?):\n"
                        f"{proc.stderr[-2000:]}")
    return cache / "node_modules"


def _build(node_modules):
    """A copy of host/ts with the cached node_modules, compiled."""
    link = TS / "node_modules"
    if link.is_symlink() and link.resolve() != node_modules.resolve():
        link.unlink()
    if not link.exists():
        link.symlink_to(node_modules)
    proc = subprocess.run(["node", "scripts/copy-proto.js"], cwd=TS, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([str(link / ".bin" / "tsc"), "-p", "tsconfig.json"], cwd=TS,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"tsc failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def suite_results(tmp_path_factory):
    _build(_node_modules())
    plain = Daemon(tmp_path_factory.mktemp("ts-plain"))
    secured = Daemon(tmp_path_factory.mktemp("ts-token"), env={"AGENTIX_TOKEN": TOKEN})
    try:
        env = {
            **os.environ,
            "AGENTIX_TEST_DAEMON": plain.url,
            "AGENTIX_TEST_SOCKET": str(plain.socket_path),
            "AGENTIX_TEST_TOKEN_DAEMON": secured.url,
            "AGENTIX_TEST_TOKEN": TOKEN,
        }
        env.pop("AGENTIX_TOKEN", None)
        proc = subprocess.run(
            ["node", "--test", "--test-reporter=tap", "--test-concurrency=1", str(SUITE)],
            cwd=TS, env=env, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S)
    finally:
        plain.stop()
        secured.stop()
    results = {}
    for m in re.finditer(r"^(not ok|ok) \d+ - (.+?)(?: # .*)?$", proc.stdout, re.M):
        results[m.group(2)] = m.group(1) == "ok"
    return results, proc.stdout + proc.stderr


def test_every_case_is_in_the_suite(suite_results):
    results, output = suite_results
    missing = [c for c in CASES if c not in results]
    assert not missing, f"conformance.test.js does not run {missing}:\n{output[-3000:]}"


@pytest.mark.parametrize("case", CASES)
def test_ts_client(suite_results, case):
    results, output = suite_results
    assert case in results, f"the node suite did not report {case!r}:\n{output[-4000:]}"
    if not results[case]:
        start = output.find(f"- {case}")
        pytest.fail(f"{case} failed:\n{output[max(0, start - 200):start + 3000]}")
