"""A real bundle started the way the ORIGINAL docker provider starts one
(SPEC §9.3): only `AGENTIX_BIND_PORT` set, `/nix/runtime/bootstrap.sh` as the
entry point, then `GET /health` polled every 0.5 s (up to 120 times) until it
answers 200; then an unmodified legacy host talks Socket.IO to it.

The bundle is built from testing/fixtures/gateway_project with
`--wire socketio`, in a root holding nothing but a static busybox (no Python,
no libraries of the build machine), under bubblewrap."""

import asyncio
import contextlib
import pickle
import shutil
import socket
import subprocess
import time
import uuid

import aiohttp
import msgpack
import pytest
import socketio

from conftest import disconnect_sio
from test_bundle import BUNDLER, REPO, RUNTIME, build, busybox_root, stop, summary

pytestmark = pytest.mark.asyncio

PROJECT = REPO / "testing" / "fixtures" / "gateway_project"


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gateway_bundle(tmp_path_factory):
    if not BUNDLER.exists():
        pytest.fail(f"{BUNDLER} missing: run `bazel build //...` first")
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap missing: run tools/setup")
    out = tmp_path_factory.mktemp("gwbundle") / "out"
    done = build(PROJECT, out, "--wire", "socketio")
    return summary(done.stdout), out


def start_like_docker_provider(bundle_out, root, port, log, extra_env=()):
    """`docker run -e AGENTIX_BIND_PORT=<port> --mount <bundle>/nix:/nix
    --entrypoint /nix/runtime/bootstrap.sh` (the host's network: the port is
    reachable on loopback as with `-p 127.0.0.1:P:P`)."""
    env = ["--setenv", "AGENTIX_BIND_PORT", str(port)]
    for name, value in extra_env:
        env += ["--setenv", name, value]
    return subprocess.Popen(
        ["bwrap", "--bind", str(root), "/", "--ro-bind", str(bundle_out / "nix"), "/nix",
         "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
         "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--clearenv", *env,
         f"{RUNTIME}/bootstrap.sh"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


async def poll_health(url, proc, log_path, tries=120, interval=0.5):
    """The docker provider's loop: GET /health up to 120 x 0.5 s."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        for _ in range(tries):
            assert proc.poll() is None, log_path.read_text()
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/health") as r:
                    if r.status == 200:
                        return await r.json()
            await asyncio.sleep(interval)
    raise AssertionError(f"Runtime server not alive at {url}:\n{log_path.read_text()}")


async def test_original_provider_starts_the_bundle_and_a_legacy_host_calls_it(gateway_bundle, tmp_path):
    _, out = gateway_bundle
    root = busybox_root(tmp_path / "root")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "bootstrap.log"
    with open(log_path, "wb") as log:
        proc = start_like_docker_provider(out, root, port, log)
    try:
        assert await poll_health(url, proc, log_path) == {"status": "ok", "version": "0.2.7"}
        sio = socketio.AsyncClient()
        results = {}
        records = []
        got = asyncio.Event()

        async def on_result(data):
            payload = msgpack.unpackb(data)
            results[payload["call_id"]] = payload
            await sio.emit("ack", pack({"call_id": payload["call_id"]}), namespace="/rpc")
            got.set()

        async def on_record(data):
            envelope = msgpack.unpackb(data)
            records.append(envelope["data"])
            await sio.emit("_ack", pack({"seq": envelope["_seq"]}), namespace="/log")

        sio.on("call:result", on_result, namespace="/rpc")
        sio.on("call:error", on_result, namespace="/rpc")
        sio.on("record", on_record, namespace="/log")
        await sio.connect(url, namespaces=["/rpc", "/trace", "/log"], wait_timeout=10)
        try:
            for fn, args, expected in (("gateway_app::add", (2, 40), 42),
                                       ("gateway_app::whoami", (), None)):
                call_id = uuid.uuid4().hex
                got.clear()
                await sio.emit("call", pack({"call_id": call_id, "callable": fn,
                                             "arguments": pickle.dumps((args, {}))}), namespace="/rpc")
                deadline = time.monotonic() + 60
                while call_id not in results and time.monotonic() < deadline:
                    await asyncio.wait_for(got.wait(), 60)
                    got.clear()
                value = pickle.loads(results[call_id]["value"])
                if expected is not None:
                    assert value == expected
                else:
                    assert value["runtime"] == RUNTIME
            deadline = time.monotonic() + 10
            while not any("called in pid" in r["message"] for r in records) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert any("called in pid" in r["message"] and r["name"] == "gateway_app" for r in records)
        finally:
            await disconnect_sio(sio)
        # POST /call fast path against the bundle too.
        async with aiohttp.ClientSession() as http:
            body = pack({"call_id": uuid.uuid4().hex, "callable": "gateway_app::add",
                         "arguments": pickle.dumps(((1, 2), {}))})
            async with http.post(f"{url}/call", data=body, headers={"prefer": "respond-async, wait=5"}) as r:
                assert r.status == 200 and pickle.loads(msgpack.unpackb(await r.read())["value"]) == 3
    finally:
        stop(proc)
    # The gateway went with the daemon: nothing listens on the port any more.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the gateway outlived the daemon")


async def _ready_ms(out, root, log_path, wire):
    """Start to readiness as its providers see it: for the gRPC wire the
    daemon's TCP port accepting, for the Socket.IO wire GET /health 200."""
    port = free_port()
    started = time.monotonic()
    with open(log_path, "ab") as log:
        proc = start_like_docker_provider(out, root, port, log, extra_env=[("AGENTIX_WIRE", wire)])
    try:
        async with aiohttp.ClientSession() as http:
            while time.monotonic() - started < 30:
                assert proc.poll() is None, log_path.read_text()
                if wire == "grpc":
                    with socket.socket() as probe:
                        if probe.connect_ex(("127.0.0.1", port)) == 0:
                            return (time.monotonic() - started) * 1e3
                else:
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.get(f"http://127.0.0.1:{port}/health") as r:
                            if r.status == 200:
                                return (time.monotonic() - started) * 1e3
                await asyncio.sleep(0.002)
        raise AssertionError(f"not ready:\n{log_path.read_text()}")
    finally:
        stop(proc)


async def test_the_gateway_adds_little_to_readiness(gateway_bundle, tmp_path):
    """The two-stage start (stage one answers /health from the daemon's
    socket while the server loads) keeps the gateway off the readiness path.
    Figures are printed; the bound is loose because this VM is shared (see
    docs/GATEWAY.md for the measured median); a gateway that imported
    everything before answering added ~1.5 s here."""
    import statistics

    _, out = gateway_bundle
    root = busybox_root(tmp_path / "root")
    log_path = tmp_path / "ready.log"
    grpc_ms, sio_ms = [], []
    for _ in range(3):
        grpc_ms.append(await _ready_ms(out, root, log_path, "grpc"))
        sio_ms.append(await _ready_ms(out, root, log_path, "socketio"))
    added = statistics.median(sio_ms) - statistics.median(grpc_ms)
    print(f"readiness ms: grpc {[round(x) for x in grpc_ms]}, socketio {[round(x) for x in sio_ms]}, "
          f"median added {added:.0f}")
    assert added < 600, (grpc_ms, sio_ms)
