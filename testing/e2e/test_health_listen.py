"""agentix-sandboxd's --health-listen (a plaintext, token-free server that
serves grpc.health.v1 alone: what a Kubernetes gRPC probe dials) and
--install-bundle (the copier the Kubernetes init-copy Pod runs from the
bundle image). Real daemons and a real worker."""

import os
import socket
import stat
import subprocess

import grpc
import pytest

from admin_client import ADMIN, RUNTIME, SERVING, Admin, bearer, pb, token_pipe
from conftest import SANDBOXD
from agentix import RuntimeClient

NOT_SERVING_NAME = "agentix.runtime.v1.NoSuchService"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health_request(service=""):
    # HealthCheckRequest{service}: field 1, length-delimited.
    data = service.encode()
    return b"\x0a" + bytes([len(data)]) + data if data else b""


async def code_of(awaitable):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable
    return info.value.code()


@pytest.mark.asyncio
async def test_health_port_answers_without_token_and_serves_nothing_else(start_daemon):
    port = free_port()
    with token_pipe() as fd:
        daemon = start_daemon(
            tcp=True,
            extra_args=["--admin-token-file", f"/proc/self/fd/{fd}",
                        "--health-listen", f"127.0.0.1:{port}"],
            popen_kwargs={"pass_fds": (fd,)})
    assert f"serving grpc.health.v1 (plaintext, no token) on 127.0.0.1:{port}" in daemon.log()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = Admin(channel)
        # No token, unarmed daemon: what the kubelet sees.
        assert await health.health(health_request(), timeout=10) == SERVING
        assert await health.health(health_request("agentix.runtime.v1.RuntimeService"),
                                   timeout=10) == SERVING
        assert await code_of(health.health(health_request(NOT_SERVING_NAME),
                                           timeout=10)) == grpc.StatusCode.NOT_FOUND
        # Nothing else is served there, with or without a token: not the
        # runtime, not the admin service.
        for md in ((), bearer(ADMIN)):
            assert await code_of(health.get_info(b"", timeout=10, metadata=md)) == \
                grpc.StatusCode.UNIMPLEMENTED
            assert await code_of(health.activate(pb.ActivateRequest(token=RUNTIME), timeout=10,
                                                 metadata=md)) == grpc.StatusCode.UNIMPLEMENTED
        reflection = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        # grpc++ adds reflection to every server (a static initializer); it
        # lists only what this server serves.
        call = reflection(iter([b"\x3a\x00"]), timeout=10)  # list_services
        listing = b"".join([reply async for reply in call])
        assert b"grpc.health.v1.Health" in listing
        assert b"agentix" not in listing
    # The runtime port still needs its tokens.
    async with grpc.aio.insecure_channel(daemon.url) as channel:
        admin = Admin(channel)
        assert await code_of(admin.health(b"", timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        await admin.activate(pb.ActivateRequest(token=RUNTIME), timeout=10, metadata=bearer(ADMIN))
        assert await code_of(admin.health(b"", timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        assert await code_of(admin.get_info(b"", timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    async with RuntimeClient(daemon.url, token=RUNTIME) as client:
        assert await client.remote(pow, 2, 10) == 1024


@pytest.mark.asyncio
async def test_health_port_on_a_unix_socket_with_a_token_file(start_daemon, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(RUNTIME)
    token_file.chmod(0o600)
    health_sock = tmp_path / "health.sock"
    daemon = start_daemon(extra_args=["--token-file", str(token_file),
                                      "--health-listen", f"unix://{health_sock}"])
    async with grpc.aio.insecure_channel(f"unix://{health_sock}") as channel:
        health = Admin(channel)
        assert await health.health(b"", timeout=10) == SERVING
        assert await code_of(health.get_info(b"", timeout=10, metadata=bearer(RUNTIME))) == \
            grpc.StatusCode.UNIMPLEMENTED
    async with grpc.aio.insecure_channel(daemon.url) as channel:
        assert await code_of(Admin(channel).get_info(b"", timeout=10)) == \
            grpc.StatusCode.UNAUTHENTICATED
    assert daemon.stop() == 0
    assert not health_sock.exists()  # removed at shutdown like --listen sockets


def test_health_listen_that_cannot_bind_is_a_startup_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        sock = tmp_path / "d.sock"
        proc = subprocess.run(
            [str(SANDBOXD), "--listen", f"unix://{sock}", "--health-listen", f"127.0.0.1:{port}",
             "--worker", "/bin/true"],
            capture_output=True, timeout=30)
    assert proc.returncode == 1
    assert b"could not bind --health-listen" in proc.stderr + proc.stdout
    relative = subprocess.run(
        [str(SANDBOXD), "--listen", f"unix://{sock}", "--health-listen", "unix://rel.sock",
         "--worker", "/bin/true"], capture_output=True, timeout=30)
    assert relative.returncode == 2
    assert b"must be absolute" in relative.stderr + relative.stdout


def test_install_bundle_copies_a_tree_with_modes_and_symlinks(tmp_path):
    src = tmp_path / "nix"
    (src / "runtime" / "bin").mkdir(parents=True)
    script = src / "runtime" / "bootstrap.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    (src / "runtime" / "bin" / "data").write_bytes(os.urandom(100_000))
    (src / "runtime" / "bin" / "data").chmod(0o640)
    (src / "runtime" / "link").symlink_to("bootstrap.sh")
    (src / "runtime" / "abs-link").symlink_to("/nix/runtime/bootstrap.sh")  # not followed
    dst = tmp_path / "dst"
    dst.mkdir()
    proc = subprocess.run([str(SANDBOXD), "--install-bundle", str(src), str(dst)],
                          capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    copied = dst / "runtime" / "bootstrap.sh"
    assert copied.read_text() == "#!/bin/sh\necho hi\n"
    assert stat.S_IMODE(copied.stat().st_mode) == 0o755
    assert stat.S_IMODE((dst / "runtime" / "bin" / "data").stat().st_mode) == 0o640
    assert (dst / "runtime" / "bin" / "data").read_bytes() == \
        (src / "runtime" / "bin" / "data").read_bytes()
    assert os.readlink(dst / "runtime" / "link") == "bootstrap.sh"
    assert os.readlink(dst / "runtime" / "abs-link") == "/nix/runtime/bootstrap.sh"
    assert subprocess.run([str(dst / "runtime" / "link")], capture_output=True).stdout == b"hi\n"


def test_install_bundle_refuses_bad_arguments(tmp_path):
    (tmp_path / "dst").mkdir()
    for argv, code, message in (
            ([str(tmp_path / "missing"), str(tmp_path / "dst")], 2, b"is not a directory"),
            ([str(tmp_path / "dst"), str(tmp_path / "missing")], 2, b"is not a directory"),
            ([str(tmp_path / "dst")], 2, b"usage: agentix-sandboxd --install-bundle SRC DST")):
        proc = subprocess.run([str(SANDBOXD), "--install-bundle", *argv],
                              capture_output=True, timeout=30)
        assert proc.returncode == code
        assert message in proc.stderr
    assert list((tmp_path / "dst").iterdir()) == []
