"""Ordinary typed functions. A type checker sees their parameters and results
through `remote`, `try_remote` and `remote_stream`."""

from collections.abc import AsyncIterator, Iterator


def add(a: int, b: int) -> int:
    return a + b


async def greet(name: str, *, punctuation: str = "!") -> str:
    return f"hello {name}{punctuation}"


def countdown(n: int) -> Iterator[int]:
    yield from range(n, 0, -1)


async def chunks(text: str, size: int) -> AsyncIterator[bytes]:
    data = text.encode()
    for start in range(0, len(data), size):
        yield data[start : start + size]
