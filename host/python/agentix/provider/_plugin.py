"""Plugin registry: named classes from an entry-point group, plus in-process extras.

`providers()` is the registry of the ``agentix.provider`` group. The group's
entry points are walked once, lazily, on the first `get` / `all` / `sources` /
`errors`; each is loaded then. A loader that raises is logged and its exception
kept: `get(name)` re-raises it, the other plugins are unaffected. Two entry
points with one name are a `PluginConflictError` (found even when the first
one's loader fails). `register()` adds a class in-process; it wins over an
entry point of the same name. Nothing is instantiated here: values are classes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata
from typing import Any

__all__ = ["PluginConflictError", "PluginRegistry", "PluginSource", "providers", "PROVIDER_GROUP"]

PROVIDER_GROUP = "agentix.provider"

_log = logging.getLogger(__name__)


class PluginConflictError(RuntimeError):
    """Two installed distributions declare the same plugin name in one group."""


@dataclass(frozen=True)
class PluginSource:
    """Where a plugin came from: a distribution (name, version) or this process."""

    dist: str | None = None
    version: str | None = None

    def label(self) -> str:
        if self.dist is None:
            return "(in-process)"
        return f"{self.dist}@{self.version}"


def _source_of(entry_point: metadata.EntryPoint) -> PluginSource:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return PluginSource(dist="unknown", version="unknown")
    return PluginSource(dist=dist.metadata["Name"] or "unknown", version=dist.version or "unknown")


class PluginRegistry:
    """The plugins of one entry-point group (see the module docstring)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._extras: dict[str, tuple[Any, PluginSource]] = {}
        self._loaded: dict[str, tuple[Any, PluginSource]] | None = None
        self._errors: dict[str, BaseException] = {}
        self._error_sources: dict[str, PluginSource] = {}

    def _walk(self) -> None:
        if self._loaded is not None:
            return
        loaded: dict[str, tuple[Any, PluginSource]] = {}
        errors: dict[str, BaseException] = {}
        error_sources: dict[str, PluginSource] = {}
        seen: dict[str, tuple[PluginSource, str]] = {}
        for entry_point in metadata.entry_points(group=self.group):
            source = _source_of(entry_point)
            previous = seen.get(entry_point.name)
            if previous is not None:
                if previous == (source, entry_point.value):
                    continue  # the same distribution found twice on sys.path
                raise PluginConflictError(
                    f"duplicate plugin {entry_point.name!r} in group {self.group!r}: "
                    f"{previous[0].label()} vs {source.label()}"
                )
            seen[entry_point.name] = (source, entry_point.value)
            try:
                loaded[entry_point.name] = (entry_point.load(), source)
            except Exception as error:  # a broken plugin must not break its siblings
                _log.warning(
                    "plugin %r in group %r (%s) failed to load: %s: %s",
                    entry_point.name, self.group, source.label(), type(error).__name__, error,
                )
                errors[entry_point.name] = error
                error_sources[entry_point.name] = source
        self._loaded, self._errors, self._error_sources = loaded, errors, error_sources

    def _merged(self) -> dict[str, tuple[Any, PluginSource]]:
        self._walk()
        assert self._loaded is not None
        return {**self._loaded, **self._extras}

    def get(self, name: str) -> Any:
        """The class registered as `name`; re-raises its loader's exception, or
        `KeyError` naming the available plugins."""
        merged = self._merged()
        if name in merged:
            return merged[name][0]
        if name in self._errors:
            raise self._errors[name]
        available = sorted({*merged, *self._errors})
        raise KeyError(f"no plugin {name!r} in group {self.group!r}; available: {available}")

    def all(self) -> dict[str, Any]:
        """Every successfully loaded plugin, name -> class."""
        return {name: value for name, (value, _) in sorted(self._merged().items())}

    def sources(self) -> dict[str, PluginSource]:
        """Where each plugin (loaded or failed) came from."""
        merged = self._merged()
        result = {name: source for name, (_, source) in merged.items()}
        for name, source in self._error_sources.items():
            result.setdefault(name, source)
        return dict(sorted(result.items()))

    def errors(self) -> dict[str, BaseException]:
        """The exception of each plugin whose loader failed (and was not overridden in-process)."""
        self._walk()
        return {name: error for name, error in sorted(self._errors.items()) if name not in self._extras}

    def register(self, name: str, factory: Any) -> None:
        """Adds `factory` (a class) under `name`, overriding an entry point."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"plugin name must be a non-empty string (got {name!r})")
        self._extras[name] = (factory, PluginSource())
        self._loaded = None  # re-walk: the overridden entry point's error no longer counts

    def reset(self) -> None:
        """Drops the in-process registrations and the cached walk."""
        self._extras.clear()
        self._loaded = None
        self._errors = {}
        self._error_sources = {}


_registries: dict[str, PluginRegistry] = {}


def registry(group: str) -> PluginRegistry:
    """The process-wide registry of `group`."""
    found = _registries.get(group)
    if found is None:
        found = _registries[group] = PluginRegistry(group)
    return found


def providers() -> PluginRegistry:
    """The registry of sandbox providers (entry-point group ``agentix.provider``)."""
    return registry(PROVIDER_GROUP)
