"""main(): boots logging, tracing and namespaces, then serves the channel.

Cold start: the ready frame goes out before asyncio is imported (`import
asyncio` was about half of the worker's boot). From then on a pool thread
reads the channel (leader/follower intake, intake.py) and runs sync calls
that come one at a time, while the main thread waits. It imports asyncio and
starts the event loop as soon as anything needs the loop (a coroutine or
streaming call, overlapping calls, a cancel, a namespace event, shutdown,
end of stream: whatever the intake leader hands to the loop; a set_env
before any call is applied by the leader), or
once the worker has been idle for _WARM_UP_IDLE_S; until then `_BootLoop`
stands in for the loop and keeps what is handed to it, in order. A call's
own `import asyncio` (most tool modules have one) is deferred until then
too (lazy.py): a first sync call does not wait for asyncio's body.
"""

import gc
import os
import sys
import threading

import _agentix_worker as _w

from . import gcpause as _gcpause
from . import lazy as _lazy

from .common import (
    EXIT_CHANNEL,
    EXIT_OK,
    _DEBUG,
    _ERROR,
    _WARNING,
    _format,
    _log,
    _text,
)
from .deferred import _AgentixSetUp
from .logs import _Logs
from .worker import _Worker

# The modules imported when the ready frame was sent (what the boot cost is
# made of; tests check what stays out of it).
boot_modules = frozenset()


def _on_loop_error(loop, context):
    message = context.get("message") or "event loop error"
    exc = context.get("exception")
    if exc is not None:
        message = (f"{message}: {type(exc).__name__}: {_text(exc)}\n"
                   f"{_format(exc)}")
    _log(_WARNING, message)


def main(channel_fd, worker_id, payload_fd=-1):
    """Serves calls until shutdown or end of stream. Returns (exit_code,
    clean) for worker.cc. `payload_fd`: the daemon's shared payload area, or
    -1."""
    channel = _w.Channel(channel_fd, payload_fd)
    logs = _Logs(channel, worker_id)
    logs.start()
    # The trace forwarder and the namespace bridge are installed when agentix
    # is imported (by sandbox code, or by the warm-up after ready).
    agentix_setup = _AgentixSetUp(channel)
    try:
        return _serve(channel, channel_fd, worker_id, agentix_setup)
    finally:
        # Spans closed during interpreter teardown have nowhere to go.
        agentix_setup.disable()
        logs.stop()


# How long the worker must be idle (no call running, none received) after
# ready before it starts the event loop, and then again before agentix is
# imported in the background: a first call that arrives with the ready frame
# (cold start) does not share the GIL with that work; an idle prestarted
# worker has agentix loaded ~0.2 s after ready. Idle means for the whole
# period, not at the instant of a look: a client calling in a row leaves the
# worker without a call most of the time, and the ~50 ms of imports under
# its first calls held each of them up to a GIL switch interval (5 ms).
# AGENTIX_WORKER_WARM_UP_IDLE_S changes it (tests that need a first call to
# run inside the period on a loaded machine; a deployment whose first calls
# come later than 0.1 s after the worker starts).
_WARM_UP_IDLE_DEFAULT_S = 0.1


def _warm_up_idle_s():
    text = os.environ.get("AGENTIX_WORKER_WARM_UP_IDLE_S")
    if text is None:
        return _WARM_UP_IDLE_DEFAULT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 60:
        _log(_WARNING, f"AGENTIX_WORKER_WARM_UP_IDLE_S={text!r} is not a "
             "number of seconds in (0, 60]: using "
             f"{_WARM_UP_IDLE_DEFAULT_S}")
        return _WARM_UP_IDLE_DEFAULT_S
    return value


_WARM_UP_IDLE_S = _warm_up_idle_s()


def _warm_up_when_idle(loop, worker, agentix_setup, started):
    if worker.exit_code is not None:
        return
    if not worker.idle_since(started):
        loop.call_later(_WARM_UP_IDLE_S, _warm_up_when_idle, loop, worker,
                        agentix_setup, worker.calls_started)
        return
    agentix_setup.warm_up()


def _wait_for_need_or_idle(boot_loop, worker):
    """Main thread, while sync calls run on the intake leader: returns once
    something needs the loop, or no call ran or came for _WARM_UP_IDLE_S."""
    started = worker.calls_started
    while not boot_loop.needed.wait(_WARM_UP_IDLE_S):
        idle = worker.idle_since(started)
        # The boot's pause of the cycle collector ends at the first look that
        # finds the worker idle, or a call started by the previous look: a
        # cold start's first call runs in it even when its reader or the
        # call itself was slow to start (a loaded machine), and keeps it for
        # 0.1-0.2 s at most.
        if idle or started:
            _gcpause.resume()
        if idle:
            return
        started = worker.calls_started


class _BootLoop:
    """The worker's loop until asyncio is imported: what threads hand to the
    loop (`call_soon_threadsafe`, the only loop method used off the loop
    thread) is kept in order and run on the real loop first, once it exists
    (`adopt`); after that, it is passed straight on."""

    booting = True  # worker.finish(): no asyncio tasks can exist

    def __init__(self):
        self._lock = threading.Lock()
        self._handed = []  # (fn, args, context), in order
        self._loop = None
        self.needed = threading.Event()

    # What _Worker.stop() calls on its loop: nothing to do without one.
    def remove_reader(self, fd):
        return False

    def stop(self):
        pass

    def close(self):
        pass

    def take_stop(self, worker):
        """Main thread: if all that was handed is the daemon's shutdown or
        the end of the stream (an intake leader's _to_loop), takes it and
        returns (code, notify) for worker.stop(): a sandbox deleted before
        its worker started the loop exits without importing asyncio.
        Otherwise None."""
        with self._lock:
            if len(self._handed) != 1:
                return None
            fn, args, _ = self._handed[0]
            if fn != worker.resume_loop_intake or not args:
                return None
            frames = args[0]
            if frames is None:
                what = (EXIT_OK, False)  # end of stream
            elif frames and all(f.kind == _w.SHUTDOWN for f in frames):
                what = (EXIT_OK, True)
            else:
                return None
            self._handed = []
            return what

    def call_soon_threadsafe(self, fn, *args, context=None):
        with self._lock:
            if self._loop is None:
                self._handed.append((fn, args, context))
                self.needed.set()
                return
            loop = self._loop
        loop.call_soon_threadsafe(fn, *args, context=context)

    def adopt(self, loop):
        """Main thread, before the loop runs: what was handed so far goes
        first (under the lock: a thread handing something now comes after)."""
        with self._lock:
            for fn, args, context in self._handed:
                loop.call_soon(fn, *args, context=context)
            self._handed = None
            self._loop = loop


def _new_loop():
    import asyncio
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.set_exception_handler(_on_loop_error)
    return loop


def _serve(channel, channel_fd, worker_id, agentix_setup):
    # asyncio is deferred (lazy.py) until the loop starts or a call reads
    # it, and its ssl, inspect and locale until the warm-up.
    deferring = _lazy.deferring(_lazy.BOOT_DEFERRED)
    deferring.__enter__()
    try:
        boot_loop = _BootLoop()
        worker = _Worker(boot_loop, channel)
        global boot_modules
        boot_modules = frozenset(sys.modules)
        # What boot made lives as long as the worker: out of the cycle
        # collector's generations, a full collection does not walk it again.
        gc.freeze()
        leading = worker.prepare_boot_intake()
        try:
            channel.send_ready(os.getpid(), "%d.%d.%d" % sys.version_info[:3])
            channel.flush()
        except _w.ChannelError as exc:
            _log(_ERROR, f"cannot send ready: {exc}")
            return EXIT_CHANNEL, True
        _log(_DEBUG, f"worker {worker_id} ready")
        leading = leading and worker.lead_from_boot()
        if leading:
            # Sync calls run meanwhile; wait for a need of the loop, or idle.
            _wait_for_need_or_idle(boot_loop, worker)
            stop = boot_loop.take_stop(worker)
            if stop is not None:
                code, notify = stop
                _log(_DEBUG, "shutdown requested" if notify else
                     "frame channel closed by the daemon; exiting")
                worker.stop(code, notify=notify)
                return worker.finish()
        loop = _new_loop()
    finally:
        deferring.__exit__(None, None, None)
        _gcpause.resume()
    boot_loop.adopt(loop)
    worker.adopt_loop(loop)
    if not leading:
        # fileno(): the link and the direct connections' poll set.
        loop.add_reader(channel.fileno(), worker.on_readable)
    loop.call_later(_WARM_UP_IDLE_S, _warm_up_when_idle, loop, worker,
                    agentix_setup, worker.calls_started)
    while worker.exit_code is None:
        try:
            loop.run_forever()
        except BaseException as exc:
            # Only code outside our wrappers gets here (e.g. a background task
            # the user started raised SystemExit); calls are unaffected.
            _log(_WARNING, "event loop interrupted by "
                 f"{type(exc).__name__}: {_text(exc)}; continuing")
    return worker.finish()
