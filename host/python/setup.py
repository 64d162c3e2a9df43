"""Tags the agentix wheel (metadata is in pyproject.toml).

Two wheels are built from the same tree (host/python/BUILD.bazel, build_wheel.sh
sets ``AGENTIX_WHEEL_KIND``):

- ``platform`` carries ``_native_calls``, a CPython 3.11 extension built by Bazel,
  as package data. setuptools tags a distribution without ext_modules
  ``py3-none-any``, which would let pip install it on any interpreter and
  platform; claiming extension modules makes bdist_wheel tag it with the
  building interpreter and platform (cp311-cp311-linux_x86_64) and install it
  as platlib.
- ``pure`` carries no extension: ``py3-none-any``; the client uses grpc.aio.
"""

import os

from setuptools import setup
from setuptools.dist import Distribution

_KIND = os.environ.get("AGENTIX_WHEEL_KIND", "platform")
if _KIND not in ("platform", "pure"):
    raise SystemExit(f"AGENTIX_WHEEL_KIND must be platform or pure, not {_KIND!r}")


class _BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        return True


setup(distclass=_BinaryDistribution if _KIND == "platform" else Distribution)
