"""The cycle collector's automatic runs paused while the worker boots.

What the worker imports before its first pause (the driver's stdlib modules,
then a cold start's first call importing its tool module: asyncio and the
rest) is tens of thousands of containers that all live on: every 700 of them
started a young collection, every tenth of those a middle one, now and then
a full one, each walking objects that survive anyway (issue 25, cold start).
So automatic collection is off (threshold 0; explicit gc.collect() works)
from the driver's first import until the worker's main thread, looking every
0.1 s after ready (serve.py), finds it idle or a call started by its previous
look; or at once when something needs the event loop, or at shutdown. A cold
create's first call runs in that window even if it was slow to start (a
loaded machine); user code runs at most ~0.2 s without automatic
collection, and what it left then is collected at the next allocation after.

User code that sets its own thresholds, or gc.disable(), meanwhile keeps
its setting: the thresholds are put back only if they are still the paused
ones. A child forked meanwhile (multiprocessing's fork) has no main thread
of ours to wake: it resumes collection as it starts.
"""

import gc
import os

# The thresholds to put back, while paused; None otherwise.
_saved = None
# Whether resume() is registered to run in forked children.
_fork_hook = [False]


def pause():
    """Stops automatic collection (already stopped: nothing to undo)."""
    global _saved
    current = gc.get_threshold()
    if _saved is not None or current[0] == 0:
        return
    _saved = current
    gc.set_threshold(0, *current[1:])
    if not _fork_hook[0]:
        _fork_hook[0] = True
        os.register_at_fork(after_in_child=resume)


def resume():
    """Puts the thresholds back, unless they changed since pause(). Returns
    True if it did."""
    global _saved
    saved, _saved = _saved, None
    if saved is None or gc.get_threshold() != (0,) + saved[1:]:
        return False
    gc.set_threshold(*saved)
    return True
