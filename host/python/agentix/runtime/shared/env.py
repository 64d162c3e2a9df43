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
    "AGENTIX_ADDED_PATH",
    "BUNDLE_RUNTIME_BASH",
    "BUNDLE_RUNTIME_ROOT",
    "SAVED_PREFIX",
    "get_env_without_agentix",
    "image_env",
]

BUNDLE_RUNTIME_ROOT = "/nix/runtime"
# The bash shipped in the bundle: a shell that exists even on an image without one.
BUNDLE_RUNTIME_BASH = "/nix/runtime/bin/bash"
ADDED_PREFIX = "AGENTIX_ADDED_"
SAVED_PREFIX = "AGENTIX_SAVED_"
# Name of the variable listing the PATH entries the bundle prepended.
AGENTIX_ADDED_PATH = ADDED_PREFIX + "PATH"


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
    """`get_env_without_agentix` plus ``BASH_ENV=$HOME/.bashrc`` when that file
    exists and ``BASH_ENV`` is unset, so non-interactive bash in the sandbox
    sees the image's shell setup. Meaningful inside the sandbox only."""
    env = get_env_without_agentix()
    home = env.get("HOME")
    if "BASH_ENV" not in env and home and os.path.isfile(os.path.join(home, ".bashrc")):
        env["BASH_ENV"] = os.path.join(home, ".bashrc")
    if extra:
        env.update(extra)
    return env
