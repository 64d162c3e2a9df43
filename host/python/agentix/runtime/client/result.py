"""`try_remote`'s return type: `Ok(value)` or `Failed(error)`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar, Union

__all__ = ["Failed", "Ok", "Result"]

T = TypeVar("T")


@dataclass(frozen=True)
class Ok(Generic[T]):
    """The call returned `value`."""

    value: T


@dataclass(frozen=True)
class Failed:
    """The call failed with `error` (a `RemoteCallError`, `CallTimeout` or
    `RuntimeUnreachable`)."""

    error: Exception


Result = Union[Ok[T], Failed]
