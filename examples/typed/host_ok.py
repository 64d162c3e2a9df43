"""Type-checks: argument and result types flow through the remote calls.

`mypy examples/typed` passes on this file (tools/test runs it: test_typing.py).
"""

import asyncio

from agentix import Failed, Ok, RuntimeClient
from typed_tasks import tasks


async def main(url: str) -> None:
    async with RuntimeClient(url) as sandbox:
        total: int = await sandbox.remote(tasks.add, 2, 3)
        greeting: str = await sandbox.remote(tasks.greet, "you", punctuation="?")
        numbers: list[int] = [n async for n in sandbox.remote_stream(tasks.countdown, 3)]
        pieces: list[bytes] = [p async for p in sandbox.remote_stream(tasks.chunks, "abcdef", 4)]
        result = await sandbox.try_remote(tasks.add, 1, 1)
        if isinstance(result, Ok):
            doubled: int = result.value * 2
            print(doubled)
        elif isinstance(result, Failed):
            print(result.error)
        print(total + 1, greeting.upper(), sum(numbers), b"".join(pieces))


if __name__ == "__main__":
    asyncio.run(main("unix:///tmp/agentix.sock"))
