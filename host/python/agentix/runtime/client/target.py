"""Turning a runtime URL into a gRPC channel target."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["grpc_target", "wants_tls"]


def grpc_target(url: str) -> str:
    """Returns the gRPC target for the runtime at `url`.

    Accepted forms:
      - ``unix:///abs/path.sock`` (or ``unix:/abs/path.sock``): passed through;
      - ``host:port``, ``[v6addr]:port``: passed through;
      - ``http://host:port`` (or ``http://host``, port 80), the original's
        URL form: the scheme and an empty ``/`` path are dropped;
      - ``https://host:port`` (or ``https://host``, port 443): the same, and
        the client uses TLS (`wants_tls`).

    Raises `ValueError` for anything else: another scheme, a URL path, query
    or credentials, or a missing port.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"runtime URL must be a non-empty string (got {url!r})")
    if url.startswith("unix:"):
        return _unix_target(url)
    if "://" in url:
        return _http_target(url)
    return _host_port(url, url, default_port=None)


def _unix_target(url: str) -> str:
    parts = urlsplit(url)
    if parts.netloc or not parts.path or parts.query or parts.fragment:
        raise ValueError(f"unsupported runtime URL {url!r}: expected unix:///absolute/path")
    return url


def _http_target(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"unsupported runtime URL {url!r}: scheme must be unix, http or https")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"unsupported runtime URL {url!r}: a path, query or fragment cannot be honoured")
    return _host_port(url, parts.netloc, default_port=443 if parts.scheme == "https" else 80)


def wants_tls(url: str) -> bool:
    """True for ``https://`` runtime URLs."""
    return isinstance(url, str) and url.startswith("https://")


def _host_port(url: str, netloc: str, default_port: int | None) -> str:
    parts = urlsplit(f"//{netloc}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"unsupported runtime URL {url!r}: {exc}") from None
    if parts.username is not None or parts.path or not parts.hostname:
        raise ValueError(f"unsupported runtime URL {url!r}: expected host:port")
    if port is None:
        if default_port is None:
            raise ValueError(f"unsupported runtime URL {url!r}: missing port")
        port = default_port
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"
