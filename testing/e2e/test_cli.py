"""The `agentix` command and the binaries, run as a user runs them.

`agentix build` bundles a copy of examples/hello with the real bundler (found
outside `bazel run`); `agentix run` starts a real bubblewrap sandbox through
LocalProvider and a private agentix-providerd (a private $XDG_RUNTIME_DIR
and a short --state-dir, stopped at the end); the stale-module and
`__main__` messages come from host scripts run as subprocesses. Every binary
answers --help with its flags.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import BAZEL_BIN, REPO

sys.path.insert(0, str(REPO / "testing" / "providerd"))
import providerd_harness as harness  # noqa: E402

import agentix  # noqa: E402

VENV_BIN = Path(sys.prefix) / "bin"
AGENTIX = [str(VENV_BIN / "python"), "-m", "agentix"]
HELLO = REPO / "examples" / "hello"
BINARIES = {
    "agentix-sandboxd": (BAZEL_BIN / "sandbox" / "agentix-sandboxd", ["--max_connections", "--token_file"]),
    "agentix-worker": (BAZEL_BIN / "worker" / "agentix-worker", ["--channel_fd", "--python_path"]),
    "agentix-providerd": (BAZEL_BIN / "providers" / "agentix-providerd", ["--state_dir", "--token_file"]),
    "bundler": (BAZEL_BIN / "bundler" / "bundler", ["--output", "--wire", "--wheelhouse"]),
}


def run(argv, *, env=None, cwd=None, timeout=120):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def world():
    """A private runtime dir and providerd wrapper (LocalProvider starts it as
    it would the per-user one), a copy of examples/hello, and its bundle
    built once by `agentix build`."""
    base = Path(tempfile.mkdtemp(prefix="agx-"))
    (base / "x").mkdir(mode=0o700)
    wrapper = base / "agentix-providerd"
    binds = " ".join(harness.sandbox_bind_args())
    wrapper.write_text(
        f'#!/bin/sh\necho $$ > {base}/providerd.pid\n'
        f'exec {BINARIES["agentix-providerd"][0]} "$@" --state-dir={base}/s {binds}\n'
    )
    wrapper.chmod(0o755)
    project = base / "hello"
    shutil.copytree(HELLO, project, ignore=shutil.ignore_patterns("dist", "__pycache__"))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(base / "x"), "AGENTIX_PROVIDERD": str(wrapper)}
    for name in ("AGENTIX_PROVIDER_URL", "AGENTIX_PROVIDER_TOKEN", "AGENTIX_BUNDLER", "AGENTIX_STALE_MODULES",
                 "AGENTIX_BUNDLE_MANIFEST"):
        env.pop(name, None)
    started = time.monotonic()
    # From the project's directory, outside the checkout: the bundler is found
    # beside the installed package's checkout, not through `bazel run`.
    build = run([*AGENTIX, "build", "--json"], env=env, cwd=project, timeout=600)
    world = {"base": base, "project": project, "env": env, "build": build,
             "build_seconds": time.monotonic() - started}
    try:
        yield world
    finally:
        pid_file = base / "providerd.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text())
            try:
                os.kill(pid, signal.SIGTERM)
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.05)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ --help

@pytest.mark.parametrize("name", sorted(BINARIES))
def test_every_binary_lists_its_flags_on_help(name):
    binary, flags = BINARIES[name]
    done = run([str(binary), "--help"], timeout=30)
    text = done.stdout + done.stderr
    assert "No flags matched" not in text
    for flag in flags:
        assert flag in text, text
    assert "absl/flags" not in text  # only the binary's own flags
    version = run([str(binary), "--version"], timeout=30)
    assert version.returncode == 0 and version.stdout.strip().endswith(agentix.__version__), version


def test_the_gateway_and_the_command_answer_help():
    gateway = run([str(VENV_BIN / "agentix-sio-gateway"), "--help"], timeout=60)
    assert gateway.returncode == 0 and "--daemon" in gateway.stdout and "--connect-timeout" in gateway.stdout
    command = run([str(VENV_BIN / "agentix"), "--help"], timeout=60)
    assert command.returncode == 0
    for word in ("build", "run", "doctor", "sandbox", "pool", "--version"):
        assert word in command.stdout
    for sub, words in (("build", ["--output", "--name", "--bundler", "--dry-run"]),
                       ("run", ["module:function", "--kw", "--image", "--rebuild"])):
        done = run([*AGENTIX, sub, "--help"], timeout=60)
        assert done.returncode == 0 and all(w in done.stdout for w in words), done.stdout
    version = run([*AGENTIX, "--version"], timeout=60)
    assert version.stdout.strip() == f"agentix {agentix.__version__}"


# ------------------------------------------------------------------ build

def test_build_shows_the_bundlers_progress_and_records_module_hashes(world):
    build = world["build"]
    assert build.returncode == 0, build.stderr
    for stage in ("[bundler] pyproject:", "[bundler] venv:", "[bundler] manifest:", "[bundler] done in"):
        assert stage in build.stderr
    assert "bundle ready → " in build.stderr
    summary = json.loads(build.stdout)
    out = world["project"] / "dist" / "agentix-bundle"
    assert summary["output"] == str(out) and summary["digest"].startswith("sha256:")
    manifest = json.loads((out / "manifest.json").read_text())
    tools = (world["project"] / "hello_agentix" / "tools.py").read_bytes()
    assert manifest["modules"]["hello_agentix.tools"] == "sha256:" + hashlib.sha256(tools).hexdigest()
    assert set(manifest["modules"]) == {"hello_agentix", "hello_agentix.tools"}


def test_build_errors_say_what_to_do(world, tmp_path):
    not_project = run([*AGENTIX, "build", str(tmp_path)], env=world["env"])
    assert not_project.returncode == 1
    assert f"{tmp_path} is not a project: it has no pyproject.toml" in not_project.stderr
    env = {**world["env"], "AGENTIX_BUNDLER": str(tmp_path / "nope")}
    missing = run([*AGENTIX, "build", str(world["project"])], env=env)
    assert missing.returncode == 1 and "$AGENTIX_BUNDLER is" in missing.stderr
    assert "not an executable file" in missing.stderr
    platform = run([*AGENTIX, "build", str(world["project"]), "--platform", "linux/s390x"], env=world["env"])
    assert platform.returncode == 2 and "linux/amd64 only" in platform.stderr
    dry = run([*AGENTIX, "build", str(world["project"]), "--dry-run", "--json"], env=world["env"])
    assert dry.returncode == 0 and json.loads(dry.stdout)["bundler"].endswith("bundler")


# ------------------------------------------------------------------ run

def test_run_calls_a_function_in_a_sandbox_and_prints_its_logs(world):
    assert world["build"].returncode == 0
    done = run([*AGENTIX, "run", str(world["project"]), "hello_agentix.tools:word_count", '"the cat the"'],
               env=world["env"], timeout=180)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"the": 2, "cat": 1}
    assert "counting words in 11 characters" in done.stderr  # the sandbox's logging
    assert "bundling" not in done.stderr  # the bundle was current

    data = run([*AGENTIX, "run", str(world["project"]), "hello_agentix.tools:describe_sandbox", "--json"],
               env=world["env"], timeout=180)
    document = json.loads(data.stdout)
    assert document["result"]["sys.prefix"] == "/nix/runtime/venv"
    assert {"logger": "agentix.sandbox.stdout", "level": "INFO",
            "message": "describe_sandbox was called"} in document["logs"]

    failed = run([*AGENTIX, "run", str(world["project"]), "hello_agentix.tools:fail", '"boom"'],
                 env=world["env"], timeout=180)
    assert failed.returncode == 1
    assert "hello_agentix.tools:fail raised ValueError: boom" in failed.stderr
    assert "Traceback" in failed.stderr

    bad = run([*AGENTIX, "run", str(world["project"]), "no-colon"], env=world["env"])
    assert bad.returncode == 2 and "expected module:function" in bad.stderr


# ------------------------------------------------------------------ doctor

def test_doctor_reports_each_check_and_what_to_do(world, tmp_path):
    done = run([*AGENTIX, "doctor", "--json"], env=world["env"], timeout=120)
    assert done.returncode == 0, done.stdout
    document = json.loads(done.stdout)
    checks = {c["name"]: c for c in document["checks"]}
    for name in ("python", "grpcio", "protobuf", "bubblewrap", "user namespaces", "cgroups", "cpu idle", "docker",
                 "podman", "bundler", "agentix-providerd", "agentix-sandboxd", "agentix-worker"):
        assert name in checks, checks
    assert checks["bubblewrap"]["status"] == "ok" and checks["user namespaces"]["status"] == "ok"
    assert document["version"] == agentix.__version__
    # Without bubblewrap on PATH: a failing check that says how to fix it.
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {**world["env"], "PATH": str(bare)}
    without = run([*AGENTIX, "doctor"], env=env, timeout=120)
    assert without.returncode == 1
    assert "fail  bubblewrap" in without.stdout and "apt-get install bubblewrap" in without.stdout


def test_doctor_checks_the_dependencies_against_the_requirements_agentix_declares(world, tmp_path):
    """The floors are the installed agentix's Requires-Dist (what pip checks),
    not a copy in doctor: a protobuf distribution older than the declared
    floor fails, whatever the module's own __version__ says."""
    from importlib.metadata import requires

    declared = dict(line.split(">=", 1) for line in requires("agentix") if "extra ==" not in line)
    declared = {name.strip(" ("): ">=" + floor.strip(" )") for name, floor in declared.items()}
    assert set(declared) == {"grpcio", "protobuf", "msgpack"}
    done = run([*AGENTIX, "doctor", "--json"], env=world["env"], timeout=120)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    for dist, floor in declared.items():
        assert checks[dist]["status"] == "ok" and checks[dist]["detail"].endswith(f"(agentix requires {floor})")
    # Debian's protobuf 3.21.12 release, under the number its upstream Python
    # package had before 4.21 (the number an older doctor compared with).
    site = tmp_path / "site"
    (site / "protobuf-3.21.12.dist-info").mkdir(parents=True)
    (site / "protobuf-3.21.12.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: protobuf\nVersion: 3.21.12\n")
    env = {**world["env"], "PYTHONPATH": os.pathsep.join(filter(None, [str(site), world["env"].get("PYTHONPATH")]))}
    old = run([*AGENTIX, "doctor"], env=env, timeout=120)
    assert old.returncode == 1, old.stdout
    line = next(line for line in old.stdout.splitlines() if " protobuf " in line)
    assert line.startswith("fail") and f"protobuf 3.21.12 does not satisfy protobuf{declared['protobuf']}" in line
    assert f"pip install -U 'protobuf{declared['protobuf']}'" in old.stdout


# ------------------------------------------------------------------ stale / __main__

HOST_SCRIPT = """
import asyncio, sys
from agentix import SandboxConfig, StaleModuleError
from agentix.provider.local import LocalProvider
from hello_agentix import tools

async def main():
    provider = LocalProvider()
    async with provider.session(SandboxConfig(image="host", bundle=sys.argv[1])) as sandbox:
        for _ in range(3):
            try:
                print("result", await sandbox.remote(tools.add, 2, 3), flush=True)
            except StaleModuleError as error:
                print("refused", error.module, flush=True)
    await provider.aclose()

asyncio.run(main())
"""


def test_a_stale_module_is_reported_once_and_strict_mode_refuses(world):
    assert world["build"].returncode == 0
    project = world["project"]
    bundle = project / "dist" / "agentix-bundle"
    # A copy of the project, edited after bundling (the original stays as built).
    edited = world["base"] / "edited"
    shutil.copytree(project, edited, ignore=shutil.ignore_patterns("dist", "__pycache__"))
    tools = edited / "hello_agentix" / "tools.py"
    tools.write_text(tools.read_text() + "\n\ndef added_after_the_build():\n    return 1\n")
    script = world["base"] / "host.py"
    script.write_text(HOST_SCRIPT)
    env = {**world["env"], "PYTHONPATH": str(edited)}
    done = run([str(VENV_BIN / "python"), str(script), str(bundle)], env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("result 5") == 3  # warned, not refused
    warnings = [line for line in done.stderr.splitlines() if "hello_agentix.tools" in line]
    assert len(warnings) == 1, done.stderr
    assert f"module hello_agentix.tools ({tools}) differs from the copy in bundle hello-agentix:0.1.0" in warnings[0]
    assert f"Rebuild the bundle: agentix build {edited} --output {bundle}" in warnings[0]

    strict = run([str(VENV_BIN / "python"), str(script), str(bundle)],
                 env={**env, "AGENTIX_STALE_MODULES": "strict"}, timeout=180)
    assert strict.returncode == 0, strict.stderr
    assert strict.stdout.count("refused hello_agentix.tools") == 3 and "result" not in strict.stdout

    # The unedited project matches its bundle: no warning.
    same = run([str(VENV_BIN / "python"), str(script), str(bundle)],
               env={**world["env"], "PYTHONPATH": str(project)}, timeout=180)
    assert same.stdout.count("result 5") == 3 and "differs" not in same.stderr, same.stderr


MAIN_SCRIPT = """
import asyncio
from agentix import RuntimeClient

def helper(x):
    return x + 1

async def main():
    try:
        await RuntimeClient("unix:///nonexistent/agentix.sock").remote(helper, 1)
    except TypeError as error:
        print(error)

asyncio.run(main())
"""


def test_a_main_callable_is_refused_with_the_fix(tmp_path):
    script = tmp_path / "my_script.py"
    script.write_text(MAIN_SCRIPT)
    done = run([str(VENV_BIN / "python"), str(script)], cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    assert message.startswith(f"cannot remote '__main__::helper': it is defined in __main__, the script you ran "
                              f"({script})"), message
    assert "Move helper into a module of your project (one the bundle contains)" in message
    assert "agentix build PATH" in message
