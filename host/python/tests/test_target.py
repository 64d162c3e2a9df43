"""Runtime URL -> gRPC target."""

import pytest

from agentix.runtime.client.target import grpc_target, wants_tls


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("unix:///run/agentix/sandbox.sock", "unix:///run/agentix/sandbox.sock"),
        ("unix:/run/agentix/sandbox.sock", "unix:/run/agentix/sandbox.sock"),
        ("localhost:8000", "localhost:8000"),
        ("10.0.0.7:50051", "10.0.0.7:50051"),
        ("[::1]:8000", "[::1]:8000"),
        ("http://127.0.0.1:8000", "127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "127.0.0.1:8000"),
        ("http://sandbox.internal", "sandbox.internal:80"),
        ("http://[::1]:9000", "[::1]:9000"),
        ("https://sandbox.internal", "sandbox.internal:443"),
        ("https://10.0.0.7:8443", "10.0.0.7:8443"),
    ],
)
def test_accepted_urls(url, target):
    assert grpc_target(url) == target


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("", "non-empty string"),
        ("localhost", "missing port"),
        ("ws://h:1", "scheme must be unix, http or https"),
        ("https://h:1/x", "path, query or fragment"),
        ("http://h:1/rpc", "path, query or fragment"),
        ("http://h:1?x=1", "path, query or fragment"),
        ("http://user@h:1", "expected host:port"),
        ("h:1/x", "expected host:port"),
        ("h:70000", "out of range"),
        ("unix://host/sock", "unix:///absolute/path"),
        ("unix:", "unix:///absolute/path"),
    ],
)
def test_rejected_urls(url, reason):
    with pytest.raises(ValueError, match=reason):
        grpc_target(url)


def test_only_https_urls_want_tls():
    assert wants_tls("https://h:1")
    for url in ("http://h:1", "h:1", "unix:///s.sock"):
        assert not wants_tls(url)
