"""A client's TLS settings: whether to use TLS (an ``https://`` URL or any
file given) and the channel credentials made from the files."""

from __future__ import annotations

import grpc

from agentix.runtime.client.target import wants_tls

__all__ = ["TlsFiles"]


class TlsFiles:
    """The TLS settings of a client: whether to use TLS and its credentials."""

    def __init__(
        self, url: str, ca_file: str | None, cert_file: str | None, key_file: str | None, server_name: str | None
    ) -> None:
        if (cert_file is None) != (key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together (mutual TLS needs both)")
        self.enabled = wants_tls(url) or any(f is not None for f in (ca_file, cert_file, key_file))
        self.files = (ca_file, cert_file, key_file)
        self.server_name = server_name

    def pem(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """The CA bundle, certificate chain and key (None where not given)."""

        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        ca, cert, key = (read(path) for path in self.files)
        return ca, cert, key

    def credentials(self) -> grpc.ChannelCredentials:
        ca, cert, key = self.pem()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
