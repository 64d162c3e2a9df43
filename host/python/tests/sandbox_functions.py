"""Functions the fake runtime runs for the client tests; referenced by import path
(``sandbox_functions::echo``) exactly as a real sandbox would."""

import asyncio

from agentix.utils import context


class Opaque:
    """A return type that is not on the host allowlist."""

    def __eq__(self, other):
        return isinstance(other, Opaque)


async def echo(value):
    return value


def add(a, b):
    return a + b


def length(data):
    return len(data)


async def sleep_forever():
    await asyncio.sleep(3600)


async def sleep_for(seconds):
    await asyncio.sleep(seconds)


def fail(message):
    raise ValueError(message)


def baggage(key):
    return context.get(key)


def opaque():
    return Opaque()


# Gates the tests open to release calls together (the fake runtime runs these in the test's loop).
GATES: dict[str, asyncio.Event] = {}


async def gated(name, value):
    await GATES.setdefault(name, asyncio.Event()).wait()
    return value
