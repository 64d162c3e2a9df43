"""The task image's environment, without what the bundle added (sandbox side).

The bundle's bootstrap prepends its own directories to ``PATH`` and the other
search-path variables and records each addition in ``AGENTIX_ADDED_<VAR>``; it
moves variables that would confuse the bundle's Python (``PYTHONPATH``,
``LD_PRELOAD``, ``NIX_*``, ...) aside as ``AGENTIX_SAVED_<VAR>``. User
subprocesses that should see the task image as it was — a ``git`` or ``make``
of the image, not of the bundle — run with `image_env()`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = [
    "ADDED_PREFIX",
    "AGENTIX_ADDED_LD_LIBRARY_PATH",
    "AGENTIX_ADDED_PATH",
    "AGENTIX_SAVED_PREFIX",
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
    "SAVED_PREFIX",
    "get_env_without_agentix",
    "image_env",
]

# The bundle's layout inside the sandbox (docs/BUNDLE.md), under the original's
# names: a provider mounts the bundle's nix/ tree at BUNDLE_NIX_ROOT.
BUNDLE_NIX_ROOT = "/nix"
BUNDLE_RUNTIME_ROOT = f"{BUNDLE_NIX_ROOT}/runtime"
# Executables (the daemon, the worker, busybox, and whatever the project's
# closures add), shared libraries and headers of the bundle.
BUNDLE_RUNTIME_BIN = f"{BUNDLE_RUNTIME_ROOT}/bin"
BUNDLE_RUNTIME_LIB = f"{BUNDLE_RUNTIME_ROOT}/lib"
BUNDLE_RUNTIME_INCLUDE = f"{BUNDLE_RUNTIME_ROOT}/include"
# The project's venv and its bin/ (python and console scripts).
BUNDLE_RUNTIME_VENV = f"{BUNDLE_RUNTIME_ROOT}/venv"
BUNDLE_RUNTIME_VENV_BIN = f"{BUNDLE_RUNTIME_VENV}/bin"
# The bash shipped in the bundle: a shell that exists even on an image without one.
BUNDLE_RUNTIME_BASH = f"{BUNDLE_RUNTIME_BIN}/bash"
BUNDLE_RUNTIME_PKGCONFIG_DIRS: tuple[str, ...] = (
    f"{BUNDLE_RUNTIME_LIB}/pkgconfig",
    f"{BUNDLE_RUNTIME_ROOT}/share/pkgconfig",
)
# The entry point a provider runs (docs/BUNDLE.md, "bootstrap.sh").
BUNDLE_RUNTIME_ENTRYPOINT = f"{BUNDLE_RUNTIME_ROOT}/bootstrap.sh"
# The search-path variables the bundle may put its directories in front of,
# and those directories (in order).
BUNDLE_RUNTIME_PATH_ENTRIES: dict[str, tuple[str, ...]] = {
    "PATH": (BUNDLE_RUNTIME_VENV_BIN, BUNDLE_RUNTIME_BIN),
    "LD_LIBRARY_PATH": (BUNDLE_RUNTIME_LIB,),
    "LIBRARY_PATH": (BUNDLE_RUNTIME_LIB,),
    "CPATH": (BUNDLE_RUNTIME_INCLUDE,),
    "C_INCLUDE_PATH": (BUNDLE_RUNTIME_INCLUDE,),
    "CPLUS_INCLUDE_PATH": (BUNDLE_RUNTIME_INCLUDE,),
    "PKG_CONFIG_PATH": BUNDLE_RUNTIME_PKGCONFIG_DIRS,
    "CMAKE_PREFIX_PATH": (BUNDLE_RUNTIME_ROOT,),
}
# The same, each joined with ':' (the bundle targets Linux).
BUNDLE_RUNTIME_ENV: dict[str, str] = {name: ":".join(dirs) for name, dirs in BUNDLE_RUNTIME_PATH_ENTRIES.items()}

# Variables the entry point reads to decide where the daemon listens:
# LISTEN_ENV (any --listen address) or, when it is unset, BIND_HOST_ENV:BIND_PORT_ENV.
LISTEN_ENV = "AGENTIX_LISTEN"
BIND_HOST_ENV = "AGENTIX_BIND_HOST"
BIND_PORT_ENV = "AGENTIX_BIND_PORT"

ADDED_PREFIX = "AGENTIX_ADDED_"
SAVED_PREFIX = "AGENTIX_SAVED_"
AGENTIX_SAVED_PREFIX = SAVED_PREFIX  # the original's name
# Name of the variable listing the PATH entries the bundle prepended (and the same for LD_LIBRARY_PATH).
AGENTIX_ADDED_PATH = ADDED_PREFIX + "PATH"
AGENTIX_ADDED_LD_LIBRARY_PATH = ADDED_PREFIX + "LD_LIBRARY_PATH"


def get_env_without_agentix(
    extra: Mapping[str, str] | None = None, *, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """`base` (default ``os.environ``) with the bundle's additions undone.

    For each ``AGENTIX_ADDED_<X>``, exactly those ``:``-separated entries are
    removed from ``<X>`` (``<X>`` is dropped when nothing is left). Each
    ``AGENTIX_SAVED_<X>`` is restored only if ``<X>`` is absent (a live value
    wins). The tracking variables themselves are dropped; `extra` is applied
    last.
    """
    source = dict(os.environ if base is None else base)
    env = {key: value for key, value in source.items() if not key.startswith((ADDED_PREFIX, SAVED_PREFIX))}
    for key, added in source.items():
        if not key.startswith(ADDED_PREFIX):
            continue
        name = key[len(ADDED_PREFIX):]
        if name not in env:
            continue
        remove = {entry for entry in added.split(":") if entry}
        kept = [entry for entry in env[name].split(":") if entry not in remove]
        if any(kept):
            env[name] = ":".join(kept)
        else:
            del env[name]
    for key, saved in source.items():
        if key.startswith(SAVED_PREFIX):
            env.setdefault(key[len(SAVED_PREFIX):], saved)
    if extra:
        env.update(extra)
    return env


def image_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """`get_env_without_agentix(extra)` plus ``BASH_ENV=$HOME/.bashrc`` when
    that file exists and ``BASH_ENV`` is unset, so non-interactive bash in the
    sandbox sees the image's shell setup. `extra` is merged first, so its
    ``HOME`` or ``BASH_ENV`` decide (``HOME`` defaults to ``~``). Meaningful
    inside the sandbox only."""
    env = get_env_without_agentix(extra)
    home = env.get("HOME") or os.path.expanduser("~")
    bashrc = os.path.join(home, ".bashrc")
    if "BASH_ENV" not in env and os.path.isfile(bashrc):
        env["BASH_ENV"] = bashrc
    return env
