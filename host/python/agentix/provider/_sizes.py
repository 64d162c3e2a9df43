"""Memory and size strings (``"512m"``, ``"16g"``) as bytes, shared by the
local providers and the provider service's client."""

from __future__ import annotations

import re

__all__ = ["parse_memory"]

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)
_SIZE_FACTORS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_memory(value: int | str) -> int:
    """Bytes for a memory size: an int, or ``"512m"``, ``"16g"``, ``"1GiB"``,
    ``"2048k"``, ``"100000"`` (suffixes are powers of 1024, as Docker's)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"memory must be > 0 bytes (got {value})")
        return value
    match = _SIZE.fullmatch(str(value))
    if not match or (match.group(3) and not match.group(2) and match.group(3).lower() != "b"):
        raise ValueError(f"cannot read memory size {value!r}: use bytes or a number with k, m, g or t (e.g. '512m')")
    size = int(float(match.group(1)) * _SIZE_FACTORS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"memory must be > 0 bytes (got {value!r})")
    return size
