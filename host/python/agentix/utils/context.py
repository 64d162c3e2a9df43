"""Context that travels with every remote call, host -> sandbox.

Any `contextvars.ContextVar` created through `var` is *propagated*: when the host
starts a call, the vars that hold a non-default value are pickled into the call's
context carrier, and the sandbox sets them around the function for that call.
Values must be picklable.

The built-in slice is *baggage*, a flat ``str -> value`` mapping::

    context.set(run_id="r42")           # sticky for this task and its children
    with context.scope(step=3):         # overlay, undone on exit
        await sandbox.remote(fn)        # fn sees get("run_id") == "r42", get("step") == 3

`capture` / `encode` (host) and `decode` / `attach` (sandbox) are the runtime's
side of the carrier. When the baggage holds only strings and the only other
propagated vars are the trace scope, the host sends them instead as the
language-neutral StartCall fields ``baggage`` / ``traceparent`` /
``tracestate`` (then the sandbox's current span and trace carry the host's ids
only, with empty names); see "Call context" in proto/agentix/runtime/v1/README.md.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from typing import Any, TypeVar

__all__ = ["clear", "get", "scope", "set", "snapshot", "var"]

T = TypeVar("T")

_registry: dict[str, tuple[ContextVar[Any], Any]] = {}
_registry_lock = threading.Lock()
# The registry's (name, (var, default)) items, replaced whole under the lock
# on every registration: capture() (once per remote call) reads it without
# the lock or a copy.
_entries: tuple[tuple[str, tuple[ContextVar[Any], Any]], ...] = ()
# The same vars (a tuple) and their defaults (a list: capture() compares a
# list with it), one object replaced with `_entries`: capture()'s check that
# every var holds its default, in C calls.
_all_vars: tuple[tuple[ContextVar[Any], ...], list[Any]] = ((), [])
_var_get = ContextVar.get


def var(name: str, *, default: T) -> ContextVar[T]:
    """Returns the propagated `ContextVar` called `name`, creating it on first use.

    Idempotent: the same name always yields the same var (and keeps the default
    it was first created with), so modules may declare it at import in any order.
    """
    with _registry_lock:
        entry = _registry.get(name)
        if entry is None:
            global _entries, _all_vars
            entry = (ContextVar(name, default=default), default)
            _registry[name] = entry
            _entries = tuple(_registry.items())
            pairs = tuple(_registry.values())
            _all_vars = (tuple(pair[0] for pair in pairs), [pair[1] for pair in pairs])
        return entry[0]


_baggage: ContextVar[Mapping[str, Any]] = var("agentix_context_baggage", default={})


def get(key: str, default: Any = None) -> Any:
    """Returns the baggage value for `key`, or `default`."""
    return _baggage.get().get(key, default)


def snapshot() -> dict[str, Any]:
    """Returns a copy of the current baggage."""
    return dict(_baggage.get())


def set(**values: Any) -> None:  # noqa: A001 - public name kept from the original API
    """Merges `values` into the baggage of the current context (sticky)."""
    _baggage.set({**_baggage.get(), **values})


@contextlib.contextmanager
def scope(**values: Any) -> Iterator[None]:
    """Overlays `values` on the baggage for the duration of the ``with`` block."""
    token = _baggage.set({**_baggage.get(), **values})
    try:
        yield
    finally:
        _baggage.reset(token)


def clear() -> None:
    """Empties the baggage of the current context."""
    _baggage.set({})


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    try:
        return bool(value == default)
    except Exception:  # values whose == is not a plain bool (arrays, ...) count as set
        return False


def capture() -> dict[str, Any]:
    """Returns ``{name: value}`` for every propagated var holding a non-default value."""
    variables, defaults = _all_vars
    try:
        # A list, not tuple(map(...)): a tuple built from an iterator is made
        # at 10 slots and shrunk, then freed to the free list of its final
        # size, which so grew by one tuple a call (up to 2,000 after every
        # full collection): a fresh page of the object allocator every ~64
        # calls, faulted in on the call path.
        if [*map(_var_get, variables)] == defaults:  # each value is (or equals) its default: the common case
            return {}
    except Exception:  # a value whose == is not a plain bool: the loop below decides
        pass
    captured = {}
    for name, (context_var, default) in _entries:
        value = context_var.get()
        if value is not default and not _is_default(value, default):  # `is`: no call per var and call
            captured[name] = value
    return captured


def encode() -> bytes | None:
    """Returns the pickled carrier of the current context, or None when there is
    nothing to propagate."""
    captured = capture()
    return pickle.dumps(captured, protocol=5) if captured else None


def decode(carrier: bytes | None) -> dict[str, Any]:
    """Unpickles a carrier made by `encode`; empty or non-dict carriers give ``{}``.

    Uses plain pickle: carriers only travel host -> sandbox, the trusted direction.
    """
    if not carrier:
        return {}
    values = pickle.loads(carrier)
    return values if isinstance(values, dict) else {}


@contextlib.contextmanager
def attach(values: Mapping[str, Any]) -> Iterator[None]:
    """Sets the propagated vars named in `values` for the ``with`` block.

    Names this process has not registered through `var` are skipped; every var
    set is reset on exit, in reverse order.
    """
    tokens: list[tuple[ContextVar[Any], Token[Any]]] = []
    try:
        for name, value in values.items():
            entry = _registry.get(name)
            if entry is not None:
                tokens.append((entry[0], entry[0].set(value)))
        yield
    finally:
        for context_var, token in reversed(tokens):
            context_var.reset(token)
