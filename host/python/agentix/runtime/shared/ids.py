"""Ids unique across processes, cheaper than uuid4: `UniqueIds`."""

from __future__ import annotations

import itertools
import os

__all__ = ["UniqueIds"]


class UniqueIds:
    """Ids of 32 hex digits, as uuid4().hex: a random 64-bit prefix per
    process and a 64-bit counter, as unique among a daemon's clients (or a
    host's sandboxes) as uuid4 ids were, for ~0.2 µs instead of ~3 µs per id
    (uuid4 reads the kernel's random source every time). A forked child
    draws a new prefix, so parent and child never share ids."""

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"
