"""The driver's agentix set-up, off the worker's boot path.

The trace forwarder (traces.py) and the plugin-namespace bridge
(namespaces.py) need `agentix.utils.trace` and `agentix.sio` from the
sandbox's venv. Importing them (the whole `agentix` package: ~20 ms on a quiet
machine, 100+ ms on a loaded one) used to come before the ready frame, so
every first call waited for it, including calls that never touch agentix.
Now:

- an import hook (`_AfterImport`) installs each one right after its module is
  executed, whoever imports it, before the import returns to anyone (the
  module's import lock is still held): no user code can see `agentix.sio` or
  `agentix.utils.trace` without the bridge / forwarder in place;
- once the worker has been idle for 0.1 s after its ready frame (serve.py:
  a first call that arrives with the ready frame is not slowed by sharing the
  GIL with it), a daemon thread ("agentix-warmup") imports both, so an idle
  worker (a prestarted or warm sandbox) has them before its first call, and
  a call that needs them meanwhile waits only for the rest of the import
  under way (the import lock), never for a second one.
"""

import gc
import os
import sys
import threading

from . import lazy
from .common import _DEBUG, _WARNING, _log, _text
from .namespaces import _install_namespaces
from .traces import _install_trace_forwarding

_TRACE = "agentix.utils.trace"
_SIO = "agentix.sio"
# os.fork() waits at most this long for a warm-up import under way.
_FORK_WAIT_S = 10.0


class _AfterImport:
    """Meta-path finder: runs `actions[name](module)` once, right after the
    module `name` is executed by the loader another finder provides. The
    action is taken when the module executes, not when it is found, so a
    find_spec() that never executes (importlib.util.find_spec) or an import
    that fails leaves it for the next import."""

    def __init__(self, actions):
        self._actions = actions
        self._lock = threading.Lock()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._actions:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if hasattr(spec.loader, "exec_module"):
            spec.loader = _RunAfter(spec.loader, self, fullname)
        return spec

    def take(self, fullname):
        """The action for `fullname`, once; None after that."""
        with self._lock:
            return self._actions.pop(fullname, None)

    def put_back(self, fullname, action):
        with self._lock:
            self._actions.setdefault(fullname, action)


class _RunAfter:
    """The real loader, plus the hook's action once the module body has run."""

    def __init__(self, loader, hook, fullname):
        self._loader = loader
        self._hook = hook
        self._fullname = fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # User code sees the real loader (importlib.resources, pkgutil, ...).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        action = self._hook.take(self._fullname)
        try:
            self._loader.exec_module(module)
        except BaseException:
            if action is not None:
                self._hook.put_back(self._fullname, action)  # a later import may work
            raise
        if action is not None:
            action(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _AgentixSetUp:
    """Installs the trace forwarder and the namespace bridge when agentix's
    modules are imported; `warm_up()` imports them in the background."""

    def __init__(self, channel):
        self._channel = channel
        self.forwarder = None
        self.namespaces = None
        self._closed = False
        actions = {_TRACE: self._on_trace, _SIO: self._on_sio}
        # Already imported (a .pth file of the venv, say): install now.
        for name in list(actions):
            module = sys.modules.get(name)
            if module is not None:
                actions.pop(name)(module)
        self._hook = _AfterImport(actions)
        if actions:
            lazy.add_finder(self._hook)
        self._warm_up_thread = None
        os.register_at_fork(before=self._before_fork,
                            after_in_child=self._after_fork_in_child)

    def _before_fork(self):
        # A child must not inherit an import half done by the warm-up
        # thread: the module locks it holds would never be released there.
        thread = self._warm_up_thread
        if (thread is not None and thread.is_alive()
                and thread is not threading.current_thread()):
            thread.join(_FORK_WAIT_S)

    def _after_fork_in_child(self):
        # The channel is the parent's: agentix imported by a forked child
        # gets neither forwarder nor bridge (as the installed ones, which
        # disable themselves in a child).
        self._closed = True

    # Called inside the module's import: must not raise into it.
    def _on_trace(self, module):
        try:
            self.forwarder = _install_trace_forwarding(self._channel, module)
        except Exception as exc:
            _log(_WARNING, "cannot register the trace forwarder "
                 f"({type(exc).__name__}: {_text(exc)})")
            return
        if self._closed and self.forwarder is not None:
            self.forwarder.enabled = False

    def _on_sio(self, module):
        try:
            self.namespaces = _install_namespaces(self._channel, module)
        except Exception as exc:
            _log(_WARNING, "cannot install the agentix.sio bridge "
                 f"({type(exc).__name__}: {_text(exc)}); plugin namespaces "
                 "are unavailable")
            return
        if self._closed and self.namespaces is not None:
            self.namespaces.enabled = False

    def warm_up(self):
        """Imports agentix's trace and sio modules, then loads the stdlib
        modules deferred at boot (lazy.py), on a daemon thread."""
        if (self.forwarder is not None and self.namespaces is not None
                and not lazy.pending()):
            return
        thread = threading.Thread(target=self._import_all,
                                  name="agentix-warmup", daemon=True)
        self._warm_up_thread = thread
        thread.start()

    def _import_all(self):
        try:
            self._import_agentix()
        finally:
            for name, exc in lazy.load_deferred():
                _log(_WARNING, f"loading the deferred module {name} failed "
                     f"({type(exc).__name__}: {_text(exc)})")
            # The modules just loaded live as long as the worker: frozen
            # (after a collection, so no garbage is kept), a full collection
            # while calls run walks only what they made (the worker idles).
            gc.collect()
            gc.freeze()

    def _import_agentix(self):
        if self.forwarder is not None and self.namespaces is not None:
            return
        # The package first: an import of it under way in another thread
        # (a call's `from agentix import trace`) is then waited for. Asked
        # for a submodule first, the import system would not wait for a
        # parent another thread is still executing, and the two threads
        # could each hold a module the other needs (_DeadlockError in the
        # call).
        for name in (_TRACE.partition(".")[0], _TRACE, _SIO):
            try:
                __import__(name)
            except ImportError:
                _log(_DEBUG, "agentix is not importable in the sandbox; traces "
                             "are not forwarded and plugin namespaces are "
                             "unavailable")
                return
            except Exception as exc:
                _log(_WARNING, f"importing {name} failed "
                     f"({type(exc).__name__}: {_text(exc)}); traces or plugin "
                     "namespaces are unavailable")
                return

    def disable(self):
        """At shutdown: spans and events closed from now on go nowhere."""
        self._closed = True
        lazy.remove_finder(self._hook)
        if self.namespaces is not None:
            self.namespaces.enabled = False
        if self.forwarder is not None:
            self.forwarder.enabled = False
