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

# The bundle's runtime contract lives in agentix.runtime.shared.env (the
# sandbox side imports it too); these are its re-exports under the original's
# names, e.g. ``from agentix.runtime import BUNDLE_RUNTIME_ENTRYPOINT``.
from agentix.runtime.shared.env import (
    AGENTIX_ADDED_LD_LIBRARY_PATH,
    AGENTIX_ADDED_PATH,
    BIND_HOST_ENV,
    BIND_PORT_ENV,
    BUNDLE_NIX_ROOT,
    BUNDLE_RUNTIME_BASH,
    BUNDLE_RUNTIME_BIN,
    BUNDLE_RUNTIME_ENTRYPOINT,
    BUNDLE_RUNTIME_ENV,
    BUNDLE_RUNTIME_INCLUDE,
    BUNDLE_RUNTIME_LIB,
    BUNDLE_RUNTIME_PATH_ENTRIES,
    BUNDLE_RUNTIME_PKGCONFIG_DIRS,
    BUNDLE_RUNTIME_ROOT,
    BUNDLE_RUNTIME_VENV,
    BUNDLE_RUNTIME_VENV_BIN,
    LISTEN_ENV,
    get_env_without_agentix,
)

__all__ = [
    "AGENTIX_ADDED_LD_LIBRARY_PATH",
    "AGENTIX_ADDED_PATH",
    "BIND_HOST_ENV",
    "BIND_PORT_ENV",
    "BUNDLE_NIX_ROOT",
    "BUNDLE_RUNTIME_BASH",
    "BUNDLE_RUNTIME_BIN",
    "BUNDLE_RUNTIME_ENTRYPOINT",
    "BUNDLE_RUNTIME_ENV",
    "BUNDLE_RUNTIME_INCLUDE",
    "BUNDLE_RUNTIME_LIB",
    "BUNDLE_RUNTIME_PATH_ENTRIES",
    "BUNDLE_RUNTIME_PKGCONFIG_DIRS",
    "BUNDLE_RUNTIME_ROOT",
    "BUNDLE_RUNTIME_VENV",
    "BUNDLE_RUNTIME_VENV_BIN",
    "LISTEN_ENV",
    "get_env_without_agentix",
]
