"""Plugin-namespace events between the hosts and sandbox code."""

import logging
import os
import threading

from .common import _DEBUG, _WARNING, _log, _text

# agentix.sio once imported (set by _install_namespaces), else None.
_sio = None
_sio_missing_reported = False


def _no_cpu():
    return -1


class _NamespaceBridge:
    """What agentix.sio sends plugin-namespace events through: the channel's
    side-channel queue (thread-safe, in order with log records)."""

    def __init__(self, channel):
        self._channel = channel
        self.enabled = True
        # The thread whose event loop the hosts' events are delivered on
        # (serve.py runs the loop on the main thread).
        self._loop_thread = threading.main_thread().ident
        # The reply waits are pinned only with AGENTIX_CALLS_CPU named in
        # the sandbox (to the call path's CPU; agentix.sio itself honours
        # "off"). Unset, they are not: the request's other end is a host's
        # event loop, whose work after each hand-off then runs beside this
        # loop's instead of after it on one CPU (a namespace request 0.74x
        # with the sandbox's waits unpinned; docs/DECISIONS.md, "stop-63:
        # namespace traffic is not pinned").
        named = os.environ.get("AGENTIX_CALLS_CPU", "").strip()
        self._cpu_of = channel.wait_cpu if named else _no_cpu

    def wait_cpu(self):
        """For agentix.sio's pinned reply waits: with AGENTIX_CALLS_CPU
        named in the sandbox, the CPU the daemon placed its call path on
        (--calls_cpu; -1: none), on the loop's thread only (a request from
        another thread's loop gets its reply from this loop, not from the
        daemon: -1); unset, -1 (no pinned reply waits)."""
        if threading.get_ident() != self._loop_thread:
            return -1
        return self._cpu_of()

    def emit(self, namespace, event, payload, request_id, error):
        if not self.enabled:
            raise RuntimeError("agentix.sio: events can only be emitted by "
                               "the running sandbox worker (not during its "
                               "shutdown, not from a forked child)")
        if error is None:
            self._channel.send_ns_event(namespace, event, payload, request_id,
                                        None, "", 0)
            return
        status = error.get("status_code")
        self._channel.send_ns_event(
            namespace, event, payload, request_id,
            str(error.get("type", "Error")), str(error.get("message", "")),
            status if type(status) is int and -2**31 <= status < 2**31 else 0)


def _install_namespaces(channel, sio_module):
    """Installs the bridge into `sio_module` (the venv's agentix.sio, just
    imported: deferred.py); returns it."""
    global _sio
    bridge = _NamespaceBridge(channel)
    sio_module._install(bridge)

    def after_fork_in_child():
        bridge.enabled = False

    os.register_at_fork(after_in_child=after_fork_in_child)
    _sio = sio_module
    return bridge


def _deliver_namespace_event(namespace, event, payload):
    """Hands one host event to agentix.sio (on the loop); never raises."""
    global _sio_missing_reported
    if _sio is None and not _sio_missing_reported:
        # Not imported by sandbox code nor by the warm-up yet: importing it
        # installs the bridge (deferred.py), as at boot before.
        try:
            import agentix.sio  # noqa: F401
        except Exception:
            pass
    if _sio is None:
        if not _sio_missing_reported:
            _sio_missing_reported = True
            logging.getLogger("agentix.sio").warning(
                "event %r for namespace %s dropped: the sandbox's venv has no "
                "agentix package, so no agentix.Namespace can receive it",
                event, namespace)
        return
    try:
        _sio._deliver(namespace, event, payload)
    except Exception:
        logging.getLogger("agentix.sio").exception(
            "delivering event %r of namespace %s failed", event, namespace)
