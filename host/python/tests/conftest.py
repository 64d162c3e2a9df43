"""Makes `agentix` and its generated gRPC stubs importable for a direct pytest run.

Under ``bazel test //host/python:unit_tests`` the runfiles already provide both and
this does nothing. For ``/usr/bin/python3 -m pytest host/python/tests`` it puts
``host/python`` on ``sys.path`` and, since the stubs are generated rather than
checked in, takes them from ``bazel-bin`` (``bazel build //host/python:runtime_stubs
//host/python:provider_stubs``).
"""

import importlib
import importlib.util
import os
import pathlib
import shutil
import sys
import tempfile

import pytest

_PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent.parent
_GENERATED_STUBS = _PACKAGE_ROOT.parent.parent / "bazel-bin" / "host" / "python" / "agentix" / "runtime" / "v1"

if importlib.util.find_spec("agentix") is None:
    sys.path.insert(0, str(_PACKAGE_ROOT))

import agentix.runtime.v1  # noqa: E402

if importlib.util.find_spec("agentix.runtime.v1.runtime_pb2") is None:
    if not (_GENERATED_STUBS / "runtime_pb2.py").is_file():
        pytest.exit(
            f"generated stubs not found in {_GENERATED_STUBS}: run `bazel build //host/python:runtime_stubs` first",
            returncode=4,
        )
    agentix.runtime.v1.__path__.append(str(_GENERATED_STUBS))

import agentix.provider.v1  # noqa: E402

_GENERATED_PROVIDER_STUBS = _GENERATED_STUBS.parent.parent / "provider" / "v1"
if importlib.util.find_spec("agentix.provider.v1.provider_pb2") is None:
    if not (_GENERATED_PROVIDER_STUBS / "provider_pb2.py").is_file():
        pytest.exit(
            f"generated stubs not found in {_GENERATED_PROVIDER_STUBS}: "
            "run `bazel build //host/python:provider_stubs` first",
            returncode=4,
        )
    agentix.provider.v1.__path__.append(str(_GENERATED_PROVIDER_STUBS))

import agentix.runtime.client  # noqa: E402

# The native Calls transport (built by `bazel build //host/python:agentix`),
# when built; without it the client uses grpc.aio.
_GENERATED_CLIENT = _GENERATED_STUBS.parent / "client"
if importlib.util.find_spec("agentix.runtime.client._native_calls") is None and _GENERATED_CLIENT.is_dir():
    agentix.runtime.client.__path__.append(str(_GENERATED_CLIENT))


import pytest_asyncio  # noqa: E402

from fake_frames import FrameServer  # noqa: E402
from fake_provider import serve_fake  # noqa: E402
from fake_runtime import FakeRuntime, serve  # noqa: E402


def _select_transport(name: str, monkeypatch) -> str:
    monkeypatch.setenv("AGENTIX_CALLS_WIRE", "auto" if name == "frames" else "grpc")
    if name == "aio":
        monkeypatch.setenv("AGENTIX_NATIVE_TRANSPORT", "0")
    else:
        # Fails (does not skip) when the extension is not built: run
        # `bazel build //host/python:agentix` (found in bazel-bin above).
        importlib.import_module("agentix.runtime.client._native_calls")
        monkeypatch.delenv("AGENTIX_NATIVE_TRANSPORT", raising=False)
    return name


@pytest.fixture(params=["native", "aio"])
def transport(request, monkeypatch):
    """Runs a test with the host's streams on the native transport, then on
    grpc.aio; modules opt in with ``pytest.mark.usefixtures("transport")``."""
    return _select_transport(request.param, monkeypatch)


@pytest.fixture(params=["native", "aio", "frames"])
def calls_transport(request, monkeypatch):
    """Like `transport`, and a third time with the Calls stream on the frame
    wire: the `runtime` fixture then serves on a Unix socket with the fake's
    Calls also on ``PATH.calls`` (fake_frames.py), and the client picks it
    (AGENTIX_CALLS_WIRE=auto)."""
    return _select_transport(request.param, monkeypatch)


class RecordingBridge:
    """Stands in for the worker's link to the host for agentix.sio: `sent`
    holds each emit as (namespace, event, unpacked payload, request_id, error)."""

    def __init__(self):
        self.sent = []

    def emit(self, namespace, event, payload, request_id, error):
        from agentix.runtime.shared.codec import unpack

        self.sent.append((namespace, event, unpack(payload), request_id, error))


@pytest.fixture
def bridge():
    """A RecordingBridge installed as agentix.sio's bridge for the test (then
    removed, with every registered namespace)."""
    import agentix.sio as sio

    recording = RecordingBridge()
    sio._install(recording)
    yield recording
    sio._install(None)
    sio._registry.clear()


@pytest_asyncio.fixture
async def framed():
    """A FakeRuntime on gRPC over a Unix socket (``.url``, ``.path``) with its
    Calls also on the frame wire at ``PATH.calls`` (``.frames``)."""
    with tempfile.TemporaryDirectory(prefix="agx-framed-", dir="/tmp") as directory:
        fake = FakeRuntime()
        fake.path = os.path.join(directory, "runtime.sock")
        fake.url = f"unix://{fake.path}"
        server, _ = await serve(fake, fake.url)
        fake.frames = await FrameServer(fake, fake.path + ".calls").start()
        try:
            yield fake
        finally:
            await fake.frames.stop()
            await server.stop(None)


@pytest_asyncio.fixture
async def runtime(request):
    """A FakeRuntime served on a loopback port (``.url``, ``.server``), or,
    under ``calls_transport`` "frames", on a Unix socket with its frame wire
    (``.frames``: the fake_frames.FrameServer)."""
    fake = FakeRuntime()
    fake.frames = None
    directory = None
    if "calls_transport" in request.fixturenames and request.getfixturevalue("calls_transport") == "frames":
        directory = tempfile.mkdtemp(prefix="agx-frames-", dir="/tmp")
        path = os.path.join(directory, "runtime.sock")
        server, _ = await serve(fake, f"unix://{path}")
        fake.url = f"unix://{path}"
        fake.frames = await FrameServer(fake, path + ".calls").start()
    else:
        server, port = await serve(fake, "127.0.0.1:0")
        fake.url = f"127.0.0.1:{port}"
    fake.server = server
    yield fake
    await server.stop(None)
    if fake.frames is not None:
        await fake.frames.stop()
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_replay_dedup():
    """Each test's fake runtime numbers from 1 under the same instance id; the
    process-wide record of items replayed once (subscription.ReplayedOnce)
    must not carry over from one test to the next."""
    from agentix.runtime.client.logs import LogsStream
    from agentix.runtime.client.subscription import ReplayedOnce
    from agentix.runtime.client.traces import TracesStream

    LogsStream._replayed_once = ReplayedOnce()
    TracesStream._replayed_once = ReplayedOnce()
    yield


@pytest.fixture
def short_dir():
    """A fresh directory under /tmp, short enough for Unix socket paths
    (sun_path is 108 bytes); removed after the test."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="agx-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def bundle(short_dir):
    """A minimal local bundle directory (its nix/runtime/bootstrap.sh only)."""
    nix = short_dir / "bundle" / "nix" / "runtime"
    nix.mkdir(parents=True)
    (nix / "bootstrap.sh").write_text("#!/bin/sh\n")
    return short_dir / "bundle"


@pytest.fixture
def environment(monkeypatch, short_dir):
    """No provider settings from the caller's environment (providerd URL and
    token, the engines' and Kubernetes' own variables), and a fresh private
    XDG_RUNTIME_DIR (``short_dir/xdg``, returned), where per-user providerd
    sockets are looked for."""
    for name in ("AGENTIX_PROVIDER_URL", "AGENTIX_PROVIDER_TOKEN", "DOCKER_HOST", "CONTAINER_HOST", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    runtime = short_dir / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime


@pytest_asyncio.fixture
async def fake(short_dir):
    """A FakeProviderService (tests/fake_provider.py) served on
    ``short_dir/p.sock``, with `socket`, `url` and `server` set."""
    service = await serve_fake(short_dir)
    yield service
    await service.server.stop(None)
