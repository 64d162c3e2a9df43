"""The conformance cases (testing/conformance/cases.json) for the C++ client
(//host/cc:client, gRPC's default channel settings: 4 MiB receive limit)
against the real agentix-sandboxd + agentix-worker.

//host/cc:conformance_runner (a Catch2 binary, one test case per case id; it
starts its own daemons with //host/cc:test_daemon) runs once per module from
its runfiles directory and writes a junit report. Every case of cases.json
(but those whose `not_for` names "cc") is one pytest test here, so each is
counted by tools/test, and a case the runner does not implement fails. The
runner runs twice, the Calls stream on the daemon's frame wire and on gRPC
(AGENTIX_CALLS_WIRE), so each case is a test per wire."""

import json
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest

from conftest import BAZEL_BIN, REPO

RUNNER = BAZEL_BIN / "host" / "cc" / "conformance_runner"
RUNFILES = BAZEL_BIN / "host" / "cc" / "conformance_runner.runfiles" / "agentix"
_SPEC = json.loads((REPO / "testing" / "conformance" / "cases.json").read_text())
CASES = [c["id"] for c in _SPEC["values"] + _SPEC["behaviours"] if "cc" not in c.get("not_for", ())]
RUN_TIMEOUT_S = 900


# The Calls stream's wires (docs/FRAME-WIRE.md): the runner runs once on each,
# required (AGENTIX_CALLS_WIRE=frames fails rather than fall back to gRPC).
WIRES = ("frames", "grpc")


@pytest.fixture(scope="module", params=WIRES)
def runner_results(request, tmp_path_factory):
    assert RUNNER.exists(), f"{RUNNER} is not built (bazel build //host/cc:conformance_runner)"
    report = tmp_path_factory.mktemp(f"cc-conformance-{request.param}") / "report.xml"
    proc = subprocess.run(
        [str(RUNNER), "--reporter", "junit", "--out", str(report)],
        cwd=RUNFILES, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        env={**os.environ, "AGENTIX_CALLS_WIRE": request.param})
    assert report.exists(), f"the runner wrote no report (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        problems = [c for c in case if c.tag in ("failure", "error")]
        results[case.get("name")] = "\n".join(
            f"{p.get('message', '')}\n{p.text or ''}" for p in problems) or None
    return results, proc.stderr


def test_every_case_is_run(runner_results):
    results, stderr = runner_results
    missing = [c for c in CASES if c not in results]
    assert not missing, f"conformance_runner did not run {missing}:\n{stderr[-3000:]}"


@pytest.mark.parametrize("case", CASES)
def test_cc_client(runner_results, case):
    results, stderr = runner_results
    assert case in results, f"conformance_runner did not report {case!r}:\n{stderr[-3000:]}"
    assert results[case] is None, f"{case} failed:\n{results[case][-4000:]}"
