"""The Kubernetes objects we emit, validated against the official schemas
(npm kubernetes-models@5, PROVIDER-SERVICE.md §6.3): the Pods pod_render
makes in both bundle modes, its NetworkPolicy and admin Secret, and the
deployment files under deploy/kubernetes. Misspelled fields pass these
schemas; pod_render_test's allow-list covers that.

kubernetes-models and yaml are installed from the npm registry at test time
into a cache directory ($AGENTIX_NPM_CACHE, default
~/.cache/agentix/k8s-schema-v5), once; the test fails with a clear message
when npm or the registry cannot be reached."""

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BAZEL_BIN, REPO

RENDER_TOOL = BAZEL_BIN / "providers" / "backends" / "kubernetes" / "pod_render_tool"
TESTDATA = REPO / "providers" / "backends" / "kubernetes" / "testdata"
DEPLOY = REPO / "deploy" / "kubernetes"
VALIDATOR = REPO / "testing" / "k8s_schema" / "validate.mjs"
PACKAGES = ("kubernetes-models@5", "yaml@2")
INSTALL_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def schema_dir():
    """A directory whose node_modules holds kubernetes-models@5 and yaml@2."""
    cache = Path(os.environ.get("AGENTIX_NPM_CACHE",
                                Path.home() / ".cache" / "agentix" / "k8s-schema-v5"))
    marker = cache / "node_modules" / "kubernetes-models" / "package.json"
    if not marker.exists() or not (cache / "node_modules" / "yaml").exists():
        for tool in ("node", "npm"):
            if shutil.which(tool) is None:
                pytest.fail(f"{tool} is not installed (tools/setup installs nodejs and npm)")
        cache.mkdir(parents=True, exist_ok=True)
        try:
            proc = subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error",
                 "--prefix", str(cache), *PACKAGES],
                capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"npm install {' '.join(PACKAGES)} took over {INSTALL_TIMEOUT_S} s: "
                        "is the npm registry reachable?")
        if proc.returncode != 0 or not marker.exists():
            pytest.fail(f"npm install {' '.join(PACKAGES)} into {cache} failed (is the npm "
                        f"registry reachable?):\n{proc.stderr[-2000:]}")
    version = json.loads(marker.read_text())["version"]
    assert version.startswith("5."), version
    shutil.copy(VALIDATOR, cache / "validate.mjs")
    return cache


def validate(schema_dir, tmp_path, inputs):
    """{name: result} of validate.mjs over `inputs`."""
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(inputs))
    proc = subprocess.run(["node", str(schema_dir / "validate.mjs"), str(path)],
                          capture_output=True, text=True, timeout=120, cwd=schema_dir)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return {r["name"]: r for r in results}


def rendered(name):
    proc = subprocess.run([str(RENDER_TOOL), str(TESTDATA / f"{name}.input.json")],
                          capture_output=True, text=True, timeout=30, check=True)
    out = json.loads(proc.stdout)
    assert "error" not in out, out
    return out


def test_rendered_pods_policy_and_secret_pass_the_official_schemas(schema_dir, tmp_path):
    inputs = []
    for mode in ("init_copy", "image_volume", "host_network"):
        for kind, obj in rendered(mode).items():
            inputs.append({"name": f"{mode}/{kind}", "object": obj})
    names = {i["name"] for i in inputs}
    # Both bundle modes, the network NONE policy and the admin Secret.
    assert {"init_copy/pod", "image_volume/pod", "init_copy/network_policy",
            "init_copy/admin_secret"} <= names
    results = validate(schema_dir, tmp_path, inputs)
    assert set(results) == names
    bad = {n: r["error"] for n, r in results.items() if not r["ok"]}
    assert bad == {}
    # The image volume is really there (the schema knows ImageVolumeSource).
    pod = rendered("image_volume")["pod"]
    assert pod["spec"]["volumes"][0]["image"]["reference"].count("@sha256:") == 1


def test_deployment_files_pass_the_official_schemas(schema_dir, tmp_path):
    files = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert {p.name for p in files} == {"deployment.yaml", "role.yaml", "rolebinding.yaml",
                                      "service.yaml", "serviceaccount.yaml"}
    results = validate(schema_dir, tmp_path,
                       [{"name": p.name, "yaml": p.read_text()} for p in files])
    assert {r["kind"] for r in results.values()} == {
        "apps/v1/Deployment", "rbac.authorization.k8s.io/v1/Role",
        "rbac.authorization.k8s.io/v1/RoleBinding", "v1/Service", "v1/ServiceAccount"}
    bad = {n: r.get("error") for n, r in results.items() if not r["ok"]}
    assert bad == {}
    # kubectl apply -k applies every file.
    kustomization = (DEPLOY / "kustomization.yaml").read_text()
    for p in files:
        assert f"- {p.name}" in kustomization


def test_role_grants_the_least_verbs(schema_dir, tmp_path):
    result = validate(schema_dir, tmp_path,
                      [{"name": "role", "yaml": (DEPLOY / "role.yaml").read_text()}])["role#0"]
    assert result["ok"], result
    role = {}
    for rule in result["object"]["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                role.setdefault((group, resource), set()).update(rule["verbs"])
    assert role == {
        ("", "pods"): {"create", "get", "list", "watch", "delete", "patch"},
        ("", "pods/log"): {"get"},
        ("networking.k8s.io", "networkpolicies"): {"create", "delete"},
        ("", "secrets"): {"create", "delete"},
    }


def test_malformed_objects_are_rejected(schema_dir, tmp_path):
    pod = rendered("init_copy")["pod"]
    volume_pod = rendered("image_volume")["pod"]
    cases = {}

    named_port = copy.deepcopy(pod)
    named_port["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = "health"
    cases["named probe port"] = (named_port, "grpc/port must be integer")

    gigs = copy.deepcopy(pod)
    gigs["spec"]["containers"][0]["resources"]["limits"]["memory"] = "2 gigs"
    cases["bad quantity"] = (gigs, 'must match format "quantity"')

    sometimes = copy.deepcopy(volume_pod)
    sometimes["spec"]["volumes"][0]["image"]["pullPolicy"] = "Sometimes"
    cases["bad pull policy"] = (sometimes, "must be equal to one of the allowed values")

    no_containers = copy.deepcopy(pod)
    del no_containers["spec"]["containers"]
    cases["no containers"] = (no_containers, "must have required property 'containers'")

    restart = copy.deepcopy(pod)
    restart["spec"]["restartPolicy"] = "Sometimes"
    cases["bad restart policy"] = (restart, "restartPolicy must be equal to one of the allowed")

    policy = rendered("init_copy")["network_policy"]
    policy["spec"]["ingress"][0]["ports"][0]["protocol"] = 6
    cases["bad policy protocol"] = (policy, "must be string")

    results = validate(schema_dir, tmp_path,
                       [{"name": n, "object": o} for n, (o, _) in cases.items()] +
                       [{"name": "bad deployment", "yaml": (DEPLOY / "deployment.yaml").read_text()
                         .replace("replicas: 1", "replicas: one")}])
    for name, (_, message) in cases.items():
        assert not results[name]["ok"], name
        assert message.replace("'", "") in results[name]["error"].replace("'", ""), \
            (name, results[name]["error"])
    assert not results["bad deployment#0"]["ok"]
    assert "replicas must be integer" in results["bad deployment#0"]["error"]
