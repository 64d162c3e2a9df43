"""Stale bundles: the host's copy of a callable's module against the bundle's.

The bundler records a hash of each of the project's modules in the bundle's
``manifest.json`` (``"modules": {"pkg.mod": "sha256:<hex>"}``). A client given
that manifest (``RuntimeClient(url, bundle_manifest=...)``, else
``$AGENTIX_BUNDLE_MANIFEST``; a `Sandbox` from `LocalProvider` sets it from
its bundle) hashes its own copy of a callable's module at the module's first
call and compares:

- equal, or a module the manifest does not know (the stdlib, a dependency):
  nothing happens;
- different, or missing from the bundle while a sibling of its package is
  there: in mode ``"warn"`` (the default) one warning per module on the
  ``agentix.bundle`` logger, naming the module, both copies and the command
  that rebuilds the bundle; in mode ``"strict"`` every call of the module
  raises `StaleModuleError` before anything is sent; ``"off"`` skips the check.

The mode is ``RuntimeClient(stale_modules=...)``, else ``$AGENTIX_STALE_MODULES``.
The cost is one dict lookup per call once a module has been checked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST_ENV", "MODE_ENV", "BundleCheck", "StaleModuleError"]

MANIFEST_ENV = "AGENTIX_BUNDLE_MANIFEST"
MODE_ENV = "AGENTIX_STALE_MODULES"
_MODES = ("warn", "strict", "off")

_log = logging.getLogger("agentix.bundle")


class StaleModuleError(RuntimeError):
    """Strict mode: the host's copy of the callable's module differs from the
    bundle's (or the bundle lacks it); nothing was sent. ``module`` names it."""

    def __init__(self, message: str, module: str) -> None:
        super().__init__(message)
        self.module = module


def _manifest_path(where: str | os.PathLike[str]) -> Path:
    path = Path(where)
    if path.is_dir():
        if path.name == "nix" and not (path / "manifest.json").exists():
            path = path.parent
        path = path / "manifest.json"
    return path


class BundleCheck:
    """What one client knows of its bundle's modules; see the module docstring."""

    def __init__(self, modules: Mapping[str, str], *, mode: str, bundle: str, label: str) -> None:
        self._modules = dict(modules)
        self._packages = {name.partition(".")[0] for name in self._modules}
        self.mode = mode
        self._bundle = bundle
        self._label = label
        # module -> None (fine) or the message (stale); filled at first call.
        self._verdicts: dict[str, str | None] = {}

    @classmethod
    def create(cls, manifest: str | os.PathLike[str] | None, mode: str | None) -> BundleCheck | None:
        """The check for a client, or None when there is nothing to check
        (no manifest, or mode ``"off"``). Raises `ValueError` for an unknown
        mode or a manifest that cannot be read."""
        mode = (mode if mode is not None else os.environ.get(MODE_ENV) or "warn").strip().lower()
        if mode not in _MODES:
            raise ValueError(f"stale_modules must be one of {', '.join(_MODES)} (got {mode!r})")
        if manifest is None:
            manifest = os.environ.get(MANIFEST_ENV) or None
        if manifest is None or mode == "off":
            return None
        path = _manifest_path(manifest)
        try:
            document: Any = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read the bundle manifest {path}: {error}") from None
        modules = document.get("modules") if isinstance(document, dict) else None
        if not isinstance(modules, dict):
            # A bundle built before module hashes: nothing to compare with.
            _log.debug("bundle manifest %s has no module hashes; not checking for stale modules", path)
            return None
        label = f"{document.get('name', '?')}:{document.get('tag', '?')}"
        return cls(
            {str(k): str(v) for k, v in modules.items()}, mode=mode, bundle=str(path.parent), label=label
        )

    def check(self, callable_ref: str) -> None:
        """Called before a call of ``"module::qualname"`` is sent."""
        module = callable_ref.partition("::")[0]
        try:
            verdict = self._verdicts[module]
        except KeyError:
            verdict = self._verdicts[module] = self._judge(module)
            if verdict is not None and self.mode == "warn":
                _log.warning("%s", verdict)
        if verdict is not None and self.mode == "strict":
            raise StaleModuleError(verdict + f" ({MODE_ENV}=strict refuses the call)", module)

    def _judge(self, module: str) -> str | None:
        expected = self._modules.get(module)
        if expected is None and module.partition(".")[0] not in self._packages:
            return None  # not the project's
        host_file = getattr(sys.modules.get(module), "__file__", None)
        if not isinstance(host_file, str) or not host_file.endswith(".py"):
            return None
        try:
            actual = "sha256:" + hashlib.sha256(Path(host_file).read_bytes()).hexdigest()
        except OSError:
            return None
        if actual == expected:
            return None
        state = "is not in" if expected is None else "differs from the copy in"
        return (
            f"module {module} ({host_file}) {state} bundle {self._label} at {self._bundle}: the sandbox "
            f"runs the bundle's, not yours. Rebuild the bundle: {self._rebuild_command(host_file)}"
        )

    def _rebuild_command(self, host_file: str) -> str:
        project = next(
            (parent for parent in Path(host_file).resolve().parents if (parent / "pyproject.toml").is_file()), None
        )
        if project is None:
            return f"agentix build PROJECT --output {self._bundle}"
        default_output = project / "dist" / "agentix-bundle"
        if Path(self._bundle).resolve() == default_output.resolve():
            return f"agentix build {project}"
        return f"agentix build {project} --output {self._bundle}"
