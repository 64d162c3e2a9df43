"""A tool module as most are: it imports asyncio at its top for its
coroutine functions. The worker's cold-start tests call its sync function
first."""

import asyncio
import sys


def add(a, b):
    """a + b, and what the call saw of asyncio: its module's type and
    whether its body had run (asyncio.events imported)."""
    return [a + b, type(asyncio).__name__, "asyncio.events" in sys.modules]


async def add_later(a, b):
    await asyncio.sleep(0)
    return a + b
