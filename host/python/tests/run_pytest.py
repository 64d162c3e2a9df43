"""Entry point of //host/python:unit_tests: runs pytest over this directory."""

import pathlib
import sys

import pytest

if __name__ == "__main__":
    sys.dont_write_bytecode = True
    here = pathlib.Path(__file__).parent
    sys.exit(pytest.main([str(here), "-p", "no:cacheprovider", *sys.argv[1:]]))
