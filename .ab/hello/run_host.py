"""The host side of the quickstart: calls hello_agentix functions remotely.

Usage: python run_host.py URL   (URL = unix:///abs/path.sock or host:port)
"""

import asyncio
import sys
import time

from agentix import RemoteCallError, RuntimeClient, configure_logging
from hello_agentix import tools


async def main(url):
    # The sandbox's logging records and its stdout/stderr lines are replayed
    # into this process's logging, under their own logger names.
    configure_logging()
    async with RuntimeClient(url) as sandbox:
        t0 = time.perf_counter()
        print("add(2, 3)              =", await sandbox.remote(tools.add, 2, 3))
        first = time.perf_counter() - t0
        print("word_count(...)        =",
              await sandbox.remote(tools.word_count, "the cat saw the other cat"))
        print("fibonacci(90)          =", await sandbox.remote(tools.fibonacci, 90))
        print("describe_sandbox()     =", await sandbox.remote(tools.describe_sandbox))

        t1 = time.perf_counter()
        squares = await asyncio.gather(*(sandbox.remote(tools.slow_square, i) for i in range(10)))
        print(f"10 × slow_square (0.2 s each, concurrent) = {squares} "
              f"in {time.perf_counter() - t1:.2f} s")

        try:
            await sandbox.remote(tools.fail, "this error comes from the sandbox")
        except RemoteCallError as e:
            print("fail(...) raised       =", f"{e.error.type}: {e.error.message}")

        n = 2000
        t2 = time.perf_counter()
        for i in range(n):
            await sandbox.remote(tools.add, i, 1)
        per_call = (time.perf_counter() - t2) / n
        await asyncio.sleep(0.1)  # let the last sandbox log lines arrive before the summary
        print(f"timings: first call (starts the worker) {first * 1000:.1f} ms; "
              f"sequential round trip {per_call * 1e6:.0f} µs/call over {n} calls")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
