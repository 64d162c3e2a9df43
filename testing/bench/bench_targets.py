"""Functions the remote-call benchmark runs inside the sandbox.

Both stacks import this module in their worker by the same top-level name
(`bench_targets`): the agentix worker through `--python-path <this directory>`,
the baseline worker through `sys.path`. The host imports it by that name too,
so `fn.__module__` resolves to the same "bench_targets::<name>" reference on
both sides.

The targets are plain (sync) functions, as most user code is: both workers run
them on a thread pool, so the benchmark exercises the ordinary sync path.
"""

import os


def noop():
    """Does nothing; measures pure round-trip overhead."""
    return None


def echo(data):
    """Returns its argument unchanged; measures payload transfer both ways."""
    return data


def glibc_tunables():
    """Reports the worker's GLIBC_TUNABLES, to confirm the malloc settings reached it."""
    return os.environ.get("GLIBC_TUNABLES")
