"""main(): boots logging, tracing and namespaces, then serves the channel."""

import asyncio
import os
import sys

import _agentix_worker as _w

from .common import (
    EXIT_CHANNEL,
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


# How long the worker must be idle (no call running) after ready, and
# between checks, before agentix is imported in the background: a first call
# that arrives with the ready frame (cold start) does not share the GIL with
# that import; an idle prestarted worker has agentix loaded ~0.1 s after ready.
_WARM_UP_IDLE_S = 0.1


def _warm_up_when_idle(loop, worker, agentix_setup):
    if worker.exit_code is not None:
        return
    if worker.busy:
        loop.call_later(_WARM_UP_IDLE_S, _warm_up_when_idle, loop, worker,
                        agentix_setup)
        return
    agentix_setup.warm_up()


def _serve(channel, channel_fd, worker_id, agentix_setup):
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.set_exception_handler(_on_loop_error)
    worker = _Worker(loop, channel)
    loop.add_reader(channel_fd, worker.on_readable)
    global boot_modules
    boot_modules = frozenset(sys.modules)
    try:
        channel.send_ready(os.getpid(), "%d.%d.%d" % sys.version_info[:3])
        channel.flush()
    except _w.ChannelError as exc:
        _log(_ERROR, f"cannot send ready: {exc}")
        return EXIT_CHANNEL, True
    _log(_DEBUG, f"worker {worker_id} ready")
    loop.call_later(_WARM_UP_IDLE_S, _warm_up_when_idle, loop, worker,
                    agentix_setup)
    while worker.exit_code is None:
        try:
            loop.run_forever()
        except BaseException as exc:
            # Only code outside our wrappers gets here (e.g. a background task
            # the user started raised SystemExit); calls are unaffected.
            _log(_WARNING, "event loop interrupted by "
                 f"{type(exc).__name__}: {_text(exc)}; continuing")
    return worker.finish()
