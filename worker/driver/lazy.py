"""Stdlib modules the driver's imports pull in but no call needs at boot.

`import asyncio` imports `ssl` (base_events, selector_events, sslproto),
which loads libssl and libcrypto and reads openssl.cnf: about a third of the
worker's import time before its ready frame (the worker's cold start, issue
25). asyncio only *calls* ssl for TLS transports; likewise `inspect`. So
from the worker's boot until asyncio is imported (serve.py: `deferring()`;
asyncio itself now comes after the ready frame, by the driver or by a
call), `ssl`, `asyncio.sslproto` (whose body reads `ssl.SSLWantReadError`),
`inspect` and `locale` are imported as deferred modules, whoever imports them: found,
registered in sys.modules and bound as usual, but their body runs at the
first attribute access, from whichever thread, or on the warm-up thread
after ready (`load_deferred()`, deferred.py), whichever comes first.

`asyncio` itself is deferred too, but only until the event loop starts
(serve.py: `BOOT_DEFERRED`; the loop's start reads it, so the warm-up never
has it to load): most tool modules `import asyncio` at their top, and its
~30 modules (~15 ms on a quiet VM) were the largest part of a cold start's
first sync call, which never uses them. A package needs two more rules
(below, `_load`): a submodule import that makes the package's body run gets
the module that body imported, not a second copy; and the import system's
own reads of a package another thread is running the body of answer at once,
as for any package under initialisation (a thread that holds a submodule's
import lock must not wait for a body that will need that lock).

What user code can tell: until then `type(ssl)` is `_DeferredModule` (a
`types.ModuleType` subclass; `types.ModuleType` once loaded) and `ssl` is
in sys.modules but `_ssl` is not. Any attribute read, write or delete loads
the module first (`__spec__`, `__name__`, `__loader__` and `__package__`
excepted: the import system reads them), under a per-module lock, so a
second thread waits for the first one's load instead of seeing a half
module (3.11's importlib.util.LazyLoader has no lock). A module that cannot
be found, or an `ssl` whose `_ssl` extension is missing, is not deferred:
its import fails at boot as before, so asyncio's `try: import ssl` still
sees the ImportError.
"""

import sys
import threading
import types

from _frozen_importlib import ModuleSpec

# The modules deferred, in load order for load_deferred(). `inspect` (with
# ast, dis, tokenize: about a third of `import asyncio` on this VM): asyncio's
# modules import it but only call it (debug reprs, a few checks), and the
# driver's own checks do without it (calls.py). `locale` (its alias tables,
# ~1.2 ms of a first call's `import asyncio` on the stop-30 VM): subprocess
# imports it for text-mode pipes' encoding only.
DEFERRED = ("ssl", "asyncio.sslproto", "inspect", "locale")
# What the boot defers (serve.py): the above, and asyncio until the event
# loop starts (not the warm-up's: starting the loop loads it).
BOOT_DEFERRED = DEFERRED + ("asyncio",)
# What a module's body needs to be loadable later: a missing one means the
# module is imported (and fails) now, as without deferral.
_NEEDS = {"ssl": "_ssl"}
# Read by the import system on an already imported module; answered without
# loading.
_PASS_THROUGH = frozenset(("__spec__", "__name__", "__loader__", "__package__"))

_module_getattribute = types.ModuleType.__getattribute__
_module_setattr = types.ModuleType.__setattr__
_module_delattr = types.ModuleType.__delattr__

# name -> (real loader, lock); removed once the module is loaded.
_pending = {}
# name -> ident of the thread running its body (its own attribute reads
# during the load must not wait for themselves).
_loading = {}
# name -> the name of the thread that ran its body (diagnostics and tests).
loaded_by = {}
# A submodule whose import ran its deferred package's body (the import
# system read the package's __path__), and the module that body imported
# for it: the import, which goes on to find and load the name, gets this one
# (_DeferFinder) instead of a second copy.
_imported_by_package = {}

_IMPORT_SYSTEM = "<frozen importlib._bootstrap>"


class _DeferredModule(types.ModuleType):
    """A module whose body has not run yet; becomes a plain module once it
    has."""

    def __getattribute__(self, name):
        if name not in _PASS_THROUGH:
            _load(self, sys._getframe(1))
        return _module_getattribute(self, name)

    def __setattr__(self, name, value):
        _load(self, sys._getframe(1))
        _module_setattr(self, name, value)

    def __delattr__(self, name):
        _load(self, sys._getframe(1))
        _module_delattr(self, name)


def _load(module, reader=None):
    """Runs the body of a deferred module, once. `reader`: the frame that
    read, set or deleted an attribute, if any."""
    name = _module_getattribute(module, "__name__")
    entry = _pending.get(name)
    if entry is None:
        return
    loader, lock = entry
    spec = _module_getattribute(module, "__spec__")
    package = spec is not None and spec.submodule_search_locations is not None
    by_import_system = (package and reader is not None
                        and reader.f_code.co_filename == _IMPORT_SYSTEM)
    # The import system reading (or binding a submodule on) a package whose
    # body another thread runs sees it as it stands (CPython's rule for a
    # package under initialisation): it may hold the import lock of a
    # submodule that body is about to import.
    if not lock.acquire(blocking=not by_import_system):
        return
    try:
        if type(module) is not _DeferredModule:
            return  # another thread loaded it while we waited
        if _loading.get(name) == threading.get_ident():
            return  # the module's own body (or the loader) reading it
        # A submodule's import reading the package's __path__ (the import
        # system's _find_and_load_unlocked: its `name` is the submodule).
        submodule = None
        if (by_import_system
                and reader.f_code.co_name == "_find_and_load_unlocked"):
            submodule = reader.f_locals.get("name")
        _loading[name] = threading.get_ident()
        try:
            loaded_by[name] = threading.current_thread().name
            loader.exec_module(module)
        except BaseException:
            # As a failed import: the module leaves sys.modules; the caller
            # gets the error, later reads see a plain (partial) module.
            if sys.modules.get(name) is module:
                del sys.modules[name]
            raise
        finally:
            del _loading[name]
            _pending.pop(name, None)
            _module_setattr(module, "__class__", types.ModuleType)
        if submodule is not None and submodule in sys.modules:
            _imported_by_package[submodule] = sys.modules[submodule]
    finally:
        lock.release()


class _Imported:
    """The loader of a spec for a module already imported (_DeferFinder):
    the import gets that module, its __spec__ kept."""

    def __init__(self, module):
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec):
        return self._module

    def exec_module(self, module):
        module.__spec__ = self._spec  # the import system set the new spec


class _DeferLoader:
    """Wraps the real loader: the module is created and registered as usual,
    its body runs later."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # User code sees the real loader (importlib.resources, pkgutil, ...).
        spec = _module_getattribute(module, "__spec__")
        _module_setattr(module, "__loader__", self._loader)
        if spec is not None:
            spec.loader = self._loader
        _pending[spec.name] = (self._loader, threading.RLock())
        _module_setattr(module, "__class__", _DeferredModule)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _DeferFinder:
    """Meta-path finder, installed only while the driver imports its modules
    (`deferring()`): the modules named get a _DeferLoader."""

    def __init__(self, names):
        self._names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        imported = _imported_by_package.pop(fullname, None)
        if imported is not None and sys.modules.get(fullname) is imported:
            return ModuleSpec(fullname, _Imported(imported))
        if fullname not in self._names:
            return None
        spec = _find_elsewhere(fullname, path, target)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        needed = _NEEDS.get(fullname)
        if needed is not None and needed not in sys.modules and \
                _find_elsewhere(needed, None, None) is None:
            return spec  # imports (and fails) now, as it would without us
        spec.loader = _DeferLoader(spec.loader)
        return spec


def _find_elsewhere(fullname, path, target):
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if isinstance(finder, _DeferFinder) or find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


class deferring:
    """Context manager: the modules `names` (default DEFERRED) imported
    inside it, by any thread, are deferred."""

    def __init__(self, names=DEFERRED):
        self._names = names

    def __enter__(self):
        self._finder = _DeferFinder(self._names)
        add_finder(self._finder)
        return self

    def __exit__(self, *exc):
        remove_finder(self._finder)
        return False


# sys.meta_path is changed by replacing the list, never in place: the import
# system iterates the list it read at the start of an import, and a call
# thread may be importing while the boot thread leaves `deferring()`. Removed
# in place, the finder before the import's position would shift the next
# finder (PathFinder) under the iteration, which would skip it: "No module
# named 'pkgutil'" for a stdlib module.
def add_finder(finder):
    """Puts `finder` first on sys.meta_path."""
    sys.meta_path = [finder] + [f for f in sys.meta_path if f is not finder]


def remove_finder(finder):
    """Takes `finder` off sys.meta_path, if it is there."""
    if any(f is finder for f in sys.meta_path):
        sys.meta_path = [f for f in sys.meta_path if f is not finder]


def pending():
    """True while a deferred module has not been loaded."""
    return bool(_pending)


def load_deferred(names=DEFERRED):
    """Runs the body of every module of `names` still deferred (the warm-up
    thread, after ready). Never raises; returns the errors as (name,
    exception)."""
    errors = []
    for name in names:
        module = sys.modules.get(name)
        if type(module) is _DeferredModule:
            try:
                _load(module)
            except Exception as exc:
                errors.append((name, exc))
    return errors
