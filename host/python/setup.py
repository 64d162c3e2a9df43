"""Marks the agentix wheel as platform-specific (metadata is in pyproject.toml).

The wheel carries `_native_calls`, a CPython 3.11 extension built by Bazel
(//host/python:wheel), as package data. setuptools tags a distribution without
ext_modules ``py3-none-any``, which would let pip install it on any interpreter
and platform; claiming extension modules makes bdist_wheel tag it with the
building interpreter and platform (cp311-cp311-linux_x86_64) and install it
as platlib.
"""

from setuptools import setup
from setuptools.dist import Distribution


class _BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        return True


setup(distclass=_BinaryDistribution)
