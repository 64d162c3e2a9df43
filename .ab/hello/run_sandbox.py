"""The host side of the quickstart: starts a sandbox from a bundle with the
local provider (bubblewrap) and calls hello_agentix functions in it.

Usage: python run_sandbox.py BUNDLE_DIR [IMAGE]
  BUNDLE_DIR  output of `bazel run //bundler -- build examples/hello --output DIR`
  IMAGE       the sandbox's root: "host" (the host's root, read-only) or a
              root filesystem directory (the quickstart makes a busybox-only one)
"""

import asyncio
import sys
import time

from agentix import RemoteCallError, SandboxConfig, configure_logging, trace
from agentix.provider.local import LocalProvider
from hello_agentix import tools


class PrintSpans(trace.Processor):
    """Shows every span that ends, sandbox ones included, with its parent."""

    def on_span_end(self, span):
        print(f"  span {span.name!r} {dict(span.attrs)} parent={span.parent_id}")


async def main(bundle, image):
    configure_logging()  # the sandbox's logging and print() show up here
    trace.add_processor(PrintSpans())
    provider = LocalProvider()
    config = SandboxConfig(image=image, bundle=bundle)

    t0 = time.perf_counter()
    sandbox = await provider.create(config)
    created = time.perf_counter() - t0
    print(f"sandbox {sandbox.sandbox_id} at {sandbox.runtime_url} (image {image!r})")
    try:
        t1 = time.perf_counter()
        print("add(2, 3)          =", await sandbox.remote(tools.add, 2, 3))
        first_call = time.perf_counter() - t1
        print("describe_sandbox() =", await sandbox.remote(tools.describe_sandbox))
        print("word_count(...)    =", await sandbox.remote(tools.word_count, "the cat saw the other cat"))
        with trace.trace("quickstart"), trace.span("host-step"):
            print("summarize(...)     =", await sandbox.remote(tools.summarize, ["a b c", "d e", "f"]))
        squares = await asyncio.gather(*(sandbox.remote(tools.slow_square, i) for i in range(10)))
        print("10 × slow_square   =", squares)
        try:
            await sandbox.remote(tools.fail, "this error comes from the sandbox")
        except RemoteCallError as error:
            print("fail(...) raised   =", f"{error.error.type}: {error.error.message}")
        n = 1000
        t2 = time.perf_counter()
        for i in range(n):
            await sandbox.remote(tools.add, i, 1)
        per_call = (time.perf_counter() - t2) / n
        await asyncio.sleep(0.2)  # let the last sandbox log lines arrive
    finally:
        t3 = time.perf_counter()
        await sandbox.aclose()
        await provider.delete(sandbox.sandbox_id)
        deleted = time.perf_counter() - t3
    print(
        f"timings: create {created * 1000:.0f} ms (the first one also starts agentix-providerd; the "
        f"sandbox's worker boots with its daemon); first call {first_call * 1000:.0f} ms; sequential round trip {per_call * 1e6:.0f} µs/call over {n} calls; "
        f"delete {deleted * 1000:.0f} ms"
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "host"))
