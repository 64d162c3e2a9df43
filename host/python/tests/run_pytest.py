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
    sys.exit(pytest.main([str(here), "-p", "no:cacheprovider", *strict, *sys.argv[1:]]))
