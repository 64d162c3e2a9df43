"""Entry point of //host/python:unit_tests: runs pytest over this directory."""

import pathlib
import sys

import pytest

if __name__ == "__main__":
    sys.dont_write_bytecode = True
    here = pathlib.Path(__file__).parent
    # An async test without the asyncio marker is skipped with a warning by
    # default: here it fails, so a case cannot silently stop running.
    strict = ["-W", "error::pytest.PytestUnhandledCoroutineWarning"]
    # The slowest case takes ~5 s on a loaded 2-core machine. A case that
    # hangs fails alone after 120 s with every thread's stack (pytest-timeout)
    # instead of the whole target at Bazel's 900 s with no stack; the stacks
    # are written at 100 s as well (faulthandler's watchdog thread), which
    # works even when the main thread is stuck in C and SIGALRM cannot act.
    bounded = ["--timeout=120", "-o", "faulthandler_timeout=100"]
    sys.exit(pytest.main([str(here), "-p", "no:cacheprovider", *strict, *bounded, *sys.argv[1:]]))
