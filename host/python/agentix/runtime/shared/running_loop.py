"""`running_loop()`: `asyncio.get_running_loop()` without a system call.

Python 3.11's `get_running_loop` calls `getpid()` every time (it must not
hand a forked child its parent's loop); a system call costs ~1 µs on this
project's machines, and both hot paths ask once per item: the host's
`RuntimeClient.remote` per call, the sandbox's `Namespace.request` per
request. The loop found last is still this thread's running loop while it
records this thread as the one running it: asyncio's own loops set
``_thread_id`` for the length of ``run_forever``, and only one loop runs on
a thread at a time. Otherwise, and for loops that do not record it (uvloop),
asyncio is asked. A forked child forgets the loop (it holds the forking
thread's id, and asyncio says no loop runs there).
"""

from __future__ import annotations

import asyncio
import os
import threading

__all__ = ["running_loop"]

_get_ident = threading.get_ident

# The loop `running_loop` last found. Hot paths may read it inline, with the
# same `_thread_id` check, to save the function call.
last_loop: asyncio.AbstractEventLoop | None = None


def running_loop() -> asyncio.AbstractEventLoop:
    """This thread's running loop; RuntimeError when none runs here."""
    global last_loop
    loop = last_loop
    if loop is None or getattr(loop, "_thread_id", None) != _get_ident():
        loop = last_loop = asyncio.get_running_loop()
    return loop


def _forget_loop() -> None:
    global last_loop
    last_loop = None


os.register_at_fork(after_in_child=_forget_loop)
