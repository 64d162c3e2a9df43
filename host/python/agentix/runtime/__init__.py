"""The remote-call runtime: the host client (`agentix.runtime.client`), pieces
shared with the sandbox (`agentix.runtime.shared`) and the generated gRPC
contract (`agentix.runtime.v1`).

The constants below are the provider-facing bootstrap contract: a provider
mounts the bundle's ``nix/`` tree at `BUNDLE_NIX_ROOT` and starts
`BUNDLE_RUNTIME_ENTRYPOINT`, which starts ``agentix-sandboxd`` listening on
``$AGENTIX_LISTEN`` (any ``--listen`` address, e.g.
``unix:///run/agentix/agentix.sock``) or, when that is unset, on
``$AGENTIX_BIND_HOST:$AGENTIX_BIND_PORT`` (default ``127.0.0.1:8000``; all
interfaces only with ``AGENTIX_BIND_HOST=0.0.0.0``).
"""

# Where a provider mounts the bundle's nix/ tree inside the sandbox.
BUNDLE_NIX_ROOT = "/nix"
# The sandbox's entry point inside the bundle.
BUNDLE_RUNTIME_ENTRYPOINT = "/nix/runtime/bootstrap.sh"
# Environment variables the entry point reads to decide where the daemon listens.
LISTEN_ENV = "AGENTIX_LISTEN"
BIND_HOST_ENV = "AGENTIX_BIND_HOST"
BIND_PORT_ENV = "AGENTIX_BIND_PORT"

from agentix.runtime.shared.env import get_env_without_agentix  # noqa: E402

__all__ = [
    "BIND_HOST_ENV",
    "BIND_PORT_ENV",
    "BUNDLE_NIX_ROOT",
    "BUNDLE_RUNTIME_ENTRYPOINT",
    "LISTEN_ENV",
    "get_env_without_agentix",
]
