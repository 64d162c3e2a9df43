"""The stdlib's bytecode from the bundle's one mapped file.

A bundle carries, beside the stdlib's .pyc files, one file holding the
bytecode of the modules a worker's boot and a typical first call import
(`asyncio` and its closure among them): `<stdlib>/__pycache__/PACK_NAME`,
written by the bundler (bundler/bytecode_pack.cc; format: docs/BUNDLE.md).
The worker maps it (`_agentix_worker.map_file`) and a finder ahead of the
path finder serves those modules from it: no directory lookups, no
open/read/close per module (about a quarter of `import asyncio`'s CPU in a
cold worker: the first call's critical path, issue 25).

What user code sees is the path finder's answer for the same file: the
module's spec, `__file__`, `__cached__`, `__path__`, its source
(`get_source`), tracebacks' file names. The loader is a `SourceFileLoader`
subclass (`type(module.__loader__) is not SourceFileLoader`, `isinstance` is).
The pack only answers where the path finder would find the bundle's own file:
a top-level module only while the stdlib is `sys.path[0]` (an import root
before it, e.g. `--python-path`, or a user's `sys.path.insert(0, ...)` could
shadow a stdlib module), a submodule only under its package's stdlib
directory. The bundler packs a .pyc only if it is the unchecked-hash bytecode
of the bundle's source beside it, as the path finder would load it (the bundle
is read-only at run time). AGENTIX_WORKER_BYTECODE_PACK=0 turns it off.
"""

import _imp
import marshal
import os
import sys

import _agentix_worker as _w
from _frozen_importlib_external import (
    MAGIC_NUMBER,
    PathFinder,
    SourceFileLoader,
    spec_from_file_location,
)

PACK_NAME = "agentix-stdlib.pack"
# The pack's first 8 bytes; then the index's length (8 bytes, little-endian)
# and the index: marshal of (MAGIC_NUMBER, {name: (offset, size, path
# relative to the stdlib, is_package)}). Offsets count from the file's start.
_PACK_MAGIC = b"AGXPYC1\n"

# Why the pack is not in use ("" when it is): diagnostics and tests.
status = "not installed"
# Module names served from the pack so far (diagnostics and tests).
served = set()

_stdlib = None
_index = {}
_data = None


class _PackLoader(SourceFileLoader):
    """The path finder's loader for a stdlib source file, whose code comes
    from the pack."""

    def get_code(self, fullname):
        entry = _index.get(fullname)
        if entry is None or fullname != self.name:
            return super().get_code(fullname)
        offset, size = entry[0], entry[1]
        code = marshal.loads(_data[offset:offset + size])
        _imp._fix_co_filename(code, self.path)
        served.add(fullname)
        return code


class _PackFinder:
    """Ahead of the path finder: the pack's modules, where the path finder
    would find the same files."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        entry = _index.get(fullname)
        if entry is None:
            return None
        if path is None:
            sys_path = sys.path
            if not sys_path or sys_path[0] != _stdlib:
                return None
        else:
            parent = _stdlib + "/" + fullname.rpartition(".")[0].replace(".", "/")
            try:
                if len(path) != 1 or next(iter(path)) != parent:
                    return None
            except TypeError:
                return None
        source = _stdlib + "/" + entry[2]
        loader = _PackLoader(fullname, source)
        if entry[3]:
            return spec_from_file_location(
                fullname, source, loader=loader,
                submodule_search_locations=[source.rpartition("/")[0]])
        return spec_from_file_location(fullname, source, loader=loader)


def _read_index(data):
    if len(data) < 16 or data[:8] != _PACK_MAGIC:
        return "not a bytecode pack"
    size = int.from_bytes(data[8:16], "little")
    if 16 + size > len(data):
        return "truncated index"
    magic, index = marshal.loads(data[16:16 + size])
    if magic != MAGIC_NUMBER:
        return "another Python's bytecode"
    for offset, length, _, _ in index.values():
        if offset < 16 + size or offset + length > len(data):
            return "an entry outside the file"
    return index


def install():
    """Maps the bundle's pack, if any, and puts its finder ahead of the path
    finder. Never raises: without the pack imports work as before."""
    global status, _stdlib, _index, _data
    if os.environ.get("AGENTIX_WORKER_BYTECODE_PACK", "1") == "0":
        status = "off (AGENTIX_WORKER_BYTECODE_PACK=0)"
        return
    stdlib = getattr(sys, "_stdlib_dir", None)
    if not stdlib:
        status = "no sys._stdlib_dir"
        return
    try:
        data = _w.map_file(f"{stdlib}/__pycache__/{PACK_NAME}")
        if data is None:
            status = "no pack"
            return
        index = _read_index(data)
    except (OSError, ValueError, TypeError, EOFError) as e:
        status = f"unreadable: {type(e).__name__}: {e}"
        return
    if isinstance(index, str):
        status = index
        return
    _stdlib, _index, _data = stdlib, index, data
    # A new list, not an insert in place (lazy.py: add_finder).
    meta = list(sys.meta_path)
    at = meta.index(PathFinder) if PathFinder in meta else len(meta)
    sys.meta_path = meta[:at] + [_PackFinder] + meta[at:]
    status = ""
