"""Authentication and transport security of agentix-sandboxd end to end:
the bearer token on every RPC (runtime services, health, reflection), the
owner-only Unix socket, TLS and mutual TLS with gRPC's own credentials."""

import asyncio
import logging
import os
import stat
import subprocess

import grpc
import pytest

import e2e_targets as t
from agentix import RuntimeClient, RuntimeUnreachable, Unauthenticated

pytestmark = pytest.mark.asyncio

TOKEN = "tok-" + "7" * 40


def token_file(tmp_path, mode=0o600, text=TOKEN + "\n"):
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


async def test_rpcs_need_the_token(start_daemon, tmp_path):
    daemon = start_daemon(extra_args=["--token-file", token_file(tmp_path)])
    for token in (None, "wrong"):
        with pytest.raises(Unauthenticated, match="refused the token") as info:
            async with RuntimeClient(daemon.url, token=token, timeout=10) as client:
                await client.remote(t.add, 1, 2)
        assert not isinstance(info.value, RuntimeUnreachable)
        assert isinstance(info.value, PermissionError) and info.value.code == "UNAUTHENTICATED"
        # try_remote does not hide a wrong token as a Failed result.
        with pytest.raises(Unauthenticated):
            async with RuntimeClient(daemon.url, token=token, timeout=10) as client:
                await client.try_remote(t.add, 1, 2)
    async with RuntimeClient(daemon.url, token=TOKEN) as client:
        assert await client.remote(t.add, 1, 2) == 3
        assert (await client.health()).status == "ok"


async def test_logs_traces_and_namespaces_streams_work_with_the_token(start_daemon, tmp_path):
    daemon = start_daemon(extra_args=["--token-file", token_file(tmp_path)])
    seen = []

    class Grab(logging.Handler):
        def emit(self, record):
            if record.name == "e2e.app":
                seen.append(record.getMessage())

    handler = Grab()
    logging.getLogger().addHandler(handler)
    try:
        async with RuntimeClient(daemon.url, token=TOKEN) as client:
            await client.remote(t.log_things, "auth")
            for _ in range(200):
                if seen:
                    break
                await asyncio.sleep(0.05)
    finally:
        logging.getLogger().removeHandler(handler)
    assert "warned auth" in seen


async def test_token_from_the_environment_and_not_leaked_to_the_worker(start_daemon, monkeypatch):
    daemon = start_daemon(env={"AGENTIX_TOKEN": TOKEN})
    monkeypatch.setenv("AGENTIX_TOKEN", TOKEN)  # the client's default too
    async with RuntimeClient(daemon.url) as client:
        assert await client.remote(os.getenv, "AGENTIX_TOKEN") is None
    monkeypatch.delenv("AGENTIX_TOKEN")
    with pytest.raises(Unauthenticated, match="UNAUTHENTICATED"):
        async with RuntimeClient(daemon.url, timeout=10) as client:
            pass


async def test_health_and_reflection_need_the_token_too(start_daemon, tmp_path):
    daemon = start_daemon(extra_args=["--token-file", token_file(tmp_path)])
    async with grpc.aio.insecure_channel(daemon.url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await check(b"", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # HealthCheckResponse{status: SERVING}
        assert await check(b"", timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)) == b"\x08\x01"
        reflect = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        call = reflect(iter([b"\x3a\x00"]), timeout=10)  # list_services
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_unix_socket_is_owner_only(daemon):
    mode = stat.S_IMODE(os.stat(daemon.socket_path).st_mode)
    assert mode == 0o600, oct(mode)


async def test_a_shared_token_file_is_refused_at_start(start_daemon, tmp_path):
    with pytest.raises(RuntimeError, match="chmod 600"):
        start_daemon(extra_args=["--token-file", token_file(tmp_path, mode=0o644)])


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for localhost/127.0.0.1 and a client
    certificate, made with the openssl CLI."""
    d = tmp_path_factory.mktemp("pki")

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=agentix-test-ca")
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext")
    return d


async def test_tls(start_daemon, pki):
    daemon = start_daemon(tcp=True, extra_args=["--tls-cert", str(pki / "server.pem"),
                                                "--tls-key", str(pki / "server.key")])
    async with RuntimeClient(f"https://{daemon.listen}", tls_ca_file=str(pki / "ca.pem")) as client:
        assert await client.remote(t.add, 2, 3) == 5
    with pytest.raises(RuntimeUnreachable):
        async with RuntimeClient(daemon.url, timeout=5) as client:  # plaintext to a TLS port
            pass
    with pytest.raises(RuntimeUnreachable):
        async with RuntimeClient(f"https://{daemon.listen}", timeout=5) as client:  # untrusted CA
            pass


async def test_mutual_tls_and_token_together(start_daemon, pki, tmp_path):
    daemon = start_daemon(tcp=True, extra_args=[
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.pem"), "--token-file", token_file(tmp_path)])
    url = f"https://{daemon.listen}"
    with pytest.raises(RuntimeUnreachable):  # no client certificate
        async with RuntimeClient(url, tls_ca_file=str(pki / "ca.pem"), token=TOKEN, timeout=5):
            pass
    client_cert = {"tls_ca_file": str(pki / "ca.pem"), "tls_cert_file": str(pki / "client.pem"),
                   "tls_key_file": str(pki / "client.key")}
    with pytest.raises(Unauthenticated, match="UNAUTHENTICATED"):  # certificate but no token
        async with RuntimeClient(url, timeout=5, **client_cert):
            pass
    async with RuntimeClient(url, token=TOKEN, **client_cert) as client:
        assert await client.remote(t.add, 20, 22) == 42
