"""Callable identity on the wire.

A remote target travels as its import path, ``"module::qualname"``; only its
arguments and return value are pickled. `RemoteCallable` is that wire form (a
``str`` subclass). The host encodes with `RemoteCallable._resolve` (or the public
`RemoteCallable.validate`) before anything is sent, so a target the sandbox could
never import fails locally with a `TypeError` that names the fix. The sandbox
decodes with `RemoteCallable.resolve`.

Accepted targets are plain functions (sync or async) and builtins that name
their module, reached by a top-level import path: module-level ``def``s,
``len``, ``math.factorial``, and functions in a class body reached through the
class (``Echo.echo`` -> ``"mod::Echo.echo"``; for an unbound method the caller
passes the instance as the first argument). A function defined in a script run
as ``python script.py`` (module ``__main__``) is refused with a `TypeError` that
says to move it into a module of the bundle: the sandbox could only import the
script by name, running its top level there. Under ``python -m pkg.mod`` the
function is encoded as ``pkg.mod::name``.

`display_name_for` is a local label for log lines and error messages; it is never
sent.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = ["RemoteCallable", "display_name_for", "named_target"]


def display_name_for(fn: Any) -> str:
    """Returns a best-effort ``"module::name"`` label for `fn`; never raises."""
    module = getattr(fn, "__module__", None)
    if isinstance(module, str) and module:
        for attr in ("__qualname__", "__name__"):
            name = getattr(fn, attr, None)
            if isinstance(name, str) and name:
                return f"{module}::{name}"
    cls = type(fn)
    cls_module = getattr(cls, "__module__", "")
    cls_name = getattr(cls, "__qualname__", cls.__name__)
    return f"{cls_module}::{cls_name}" if cls_module else cls_name


def _main_module_name() -> str | None:
    """The importable name of the ``__main__`` module when it was started with
    ``python -m pkg.mod`` (kept in ``__main__.__spec__.name``), else None: a
    script run by path has no module name the sandbox could import without
    running the script's top level there, so its functions are refused."""
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if isinstance(spec_name, str) and spec_name and spec_name != "__main__":
        return spec_name
    return None


def _wire_parts(fn: Any) -> tuple[str, str] | None:
    """Returns ``(module, qualname)`` for an encodable target, else None."""
    if not (inspect.isfunction(fn) or inspect.isbuiltin(fn)):
        return None
    name = getattr(fn, "__name__", "")
    qualname = getattr(fn, "__qualname__", "")
    if not name or name == "<lambda>" or not qualname or "<locals>" in qualname:
        return None
    module = getattr(fn, "__module__", None)
    if module == "__main__":
        module = _main_module_name()
    if not isinstance(module, str) or not module:
        return None
    return module, qualname


def _rejection(fn: Any) -> str:
    """Names `fn` and the rule it breaks, pointing at the fix."""
    name = display_name_for(fn)
    if inspect.ismethod(fn):
        return (
            f"cannot remote {name!r}: it is a bound method. Pass the unbound function "
            f"and send the instance as an argument, or move the logic into a "
            f"module-level def."
        )
    if getattr(fn, "__name__", "") == "<lambda>":
        return f"cannot remote {name!r}: lambdas have no importable name — use a module-level def."
    if "<locals>" in getattr(fn, "__qualname__", ""):
        return (
            f"cannot remote {name!r}: it is a local/nested function. Define it at module "
            f"top level so the worker can import it by name."
        )
    if not (inspect.isfunction(fn) or inspect.isbuiltin(fn)):
        return (
            f"cannot remote {name!r}: only importable top-level functions are remote targets "
            f"(got a {type(fn).__name__}). functools.partial, callable instances, and closures "
            f"aren't importable by name — wrap the call in a module-level def."
        )
    if getattr(fn, "__module__", None) == "__main__":
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        where = f" ({main_file})" if isinstance(main_file, str) and main_file else ""
        return (
            f"cannot remote {name!r}: it is defined in __main__, the script you ran{where}. "
            f"The sandbox cannot import a script by name without running its top level there. "
            f"Move {getattr(fn, '__qualname__', 'it')} into a module of your project (one the "
            f"bundle contains), import it from there, and rebuild the bundle (agentix build PATH)."
        )
    return (
        f"cannot remote {name!r}: it has no importable module path. Define it in an "
        f"importable module (not a REPL / exec context)."
    )


class RemoteCallable(str):
    """Wire form of a remote target: ``"module::qualname"``."""

    __slots__ = ()

    @classmethod
    def _resolve(cls, fn: Callable[..., Any]) -> RemoteCallable:
        """Encodes `fn`; raises `TypeError` naming the fix if it cannot be a target."""
        if not callable(fn):
            raise TypeError(f"remote target must be callable (got {type(fn).__name__})")
        parts = _wire_parts(fn)
        if parts is None:
            raise TypeError(_rejection(fn))
        module, qualname = parts
        return cls(f"{module}::{qualname}")

    @classmethod
    def validate(cls, fn: Callable[..., Any]) -> RemoteCallable:
        """Checks ahead of time that `fn` is a valid remote target; returns its wire form.

        Performs exactly the encoding `remote(fn, ...)` performs before sending, so
        it raises the same `TypeError` for lambdas, closures, bound methods,
        partials, callable instances and classes.
        """
        return cls._resolve(fn)

    def resolve(self) -> Callable[..., Any]:
        """Imports the referenced callable (sandbox side).

        Raises `ValueError` for a reference without ``::``, the import's own
        errors for a missing module or attribute, and `TypeError` when the
        reference names something that is not callable.
        """
        module, sep, qualname = self.partition("::")
        if not sep:
            raise ValueError(f"invalid remote callable reference {str(self)!r}")
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        if not callable(target):
            raise TypeError(f"resolved value is not callable (got {type(target).__name__})")
        return target


# Plain function -> ((__module__, __qualname__, __name__), display name, wire
# form) as last resolved: a target called again costs one lookup and one
# tuple comparison instead of resolving (~0.45 us). Holds the functions;
# bounded, cleared when full.
_named: dict[types.FunctionType, tuple[tuple[str, str, str], str, RemoteCallable]] = {}
_FunctionType = types.FunctionType
_MAX_NAMED = 4096


def named_target(fn: Callable[..., Any]) -> tuple[str, RemoteCallable]:
    """``(display_name_for(fn), RemoteCallable._resolve(fn))``, raising as
    `_resolve` does; remembered for plain functions while their module,
    qualname and name stay what they were (``__main__``'s are resolved each
    time: what they encode to depends on how the script was started)."""
    if type(fn) is not _FunctionType:
        return display_name_for(fn), RemoteCallable._resolve(fn)
    hit = _named.get(fn)
    if hit is not None and hit[0] == (fn.__module__, fn.__qualname__, fn.__name__):
        return hit[1], hit[2]
    display, ref = display_name_for(fn), RemoteCallable._resolve(fn)
    module = fn.__module__
    if module != "__main__":
        if len(_named) >= _MAX_NAMED:
            _named.clear()
        _named[fn] = ((module, fn.__qualname__, fn.__name__), display, ref)
    return display, ref
