"""Must NOT type-check: each call below is wrong, and mypy says so.

tools/test runs mypy on this file and expects exactly these errors
(testing/e2e/test_typing.py); without typed `remote` they all pass silently.
"""

from agentix import RuntimeClient
from typed_tasks import tasks


async def main(sandbox: RuntimeClient) -> None:
    await sandbox.remote(tasks.add, "wrong", "types", "extra")  # error: three, and str for int
    await sandbox.remote(tasks.greet, "you", punctuation=1)  # error: int for str
    text: str = await sandbox.remote(tasks.add, 1, 2)  # error: the result is an int
    async for item in sandbox.remote_stream(tasks.countdown, 3):
        item.upper()  # error: int has no upper()
