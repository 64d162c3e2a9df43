"""Targets for the worker's cold-start tests: unlike worker_fixture, this
module imports neither asyncio nor inspect, so a call can tell whether the
worker itself had imported them when the call ran."""

import sys
import threading
import time


def imported(names):
    """Which of `names` are in sys.modules now."""
    return sorted(name for name in names if name in sys.modules)


async def on_the_loop():
    """A first call that is a coroutine: where it runs."""
    import asyncio
    return [asyncio.get_running_loop().is_running(),
            threading.current_thread() is threading.main_thread()]


def sleep(seconds):
    time.sleep(seconds)
    return seconds


def imported_after_checks(names):
    """Which of `names` are in sys.modules after the driver's coroutine and
    awaitable checks ran on builtins, methods and partials (what a first
    call to, say, os::getpid goes through)."""
    import functools
    import os

    from _agentix_driver import calls

    for fn in (os.getpid, len, [].append, str.upper, functools.partial(os.getpid),
               imported, functools.partial(imported), sleep):
        calls._iscoroutinefunction(fn)
        calls._isawaitable(fn)
    return imported(names)


def env_and_imported(name, names):
    """$name as the call sees it, and which of `names` are in sys.modules."""
    import os

    return [os.environ.get(name), imported(names)]


def asyncio_first():
    """A first call that imports asyncio itself and runs a coroutine: what
    it sees of asyncio before using it (deferred: its body not run), then of
    `inspect` and `locale` (deferred while asyncio's body ran) before and
    after using them."""
    import asyncio

    deferred = [type(asyncio).__name__, "asyncio.events" in sys.modules]

    async def seven():
        return 7

    value = asyncio.run(seven())
    before = type(sys.modules["inspect"]).__name__
    locale_before = type(sys.modules["locale"]).__name__
    import inspect
    import locale
    return deferred + [type(asyncio).__name__, before, value,
                       str(inspect.signature(sleep)),
                       type(sys.modules["inspect"]).__name__, locale_before,
                       locale.normalize("en_US"),
                       type(sys.modules["locale"]).__name__]


def asyncio_submodule_first():
    """A first call whose `import asyncio.events` runs the deferred
    package's body (which imports asyncio.events itself): one module per
    name, each with its own spec."""
    import asyncio
    before = type(asyncio).__name__
    import asyncio.events
    from asyncio.subprocess import create_subprocess_exec
    events = sys.modules["asyncio.events"]
    return [before, asyncio.events is events,
            asyncio.AbstractEventLoop is events.AbstractEventLoop,
            create_subprocess_exec is asyncio.create_subprocess_exec,
            events.__spec__.name,
            type(events.__spec__.loader).__name__ != "_Imported"]


def note_modules_at_exit(path, names):
    """At interpreter exit, writes which of `names` were imported then."""
    import atexit

    def note():
        with open(path, "w") as f:
            f.write(repr(imported(names)))

    atexit.register(note)


def collector(thresholds=None, enabled=None):
    """The cycle collector as the call sees it, [thresholds, enabled], after
    setting its thresholds and on/off state where given."""
    import gc

    if thresholds is not None:
        gc.set_threshold(*thresholds)
    if enabled is True:
        gc.enable()
    elif enabled is False:
        gc.disable()
    return [list(gc.get_threshold()), gc.isenabled()]


def re_table():
    """re's cache as the boot left it: its type, whether the build's table
    is there (and answered what the boot compiled), the table's patterns
    that differ from what re compiles itself, and a purge and a fresh
    pattern working after."""
    import re
    from re import _compiler

    from _agentix_driver import re_table_data

    cache = re._cache
    answered = [key for key in cache if key in cache._table]
    differ = [entry[0] for entry in re_table_data.PATTERNS
              if re._compile(entry[0], entry[1]) !=
              _compiler.compile(entry[0], entry[1])]
    re.purge()
    fresh = re.compile(r"(?P<word>\w+)-(\d+)").match("cold-32").groups()
    return [type(re._cache).__name__, len(re_table_data.PATTERNS) > 20,
            len(answered) > 0, differ, fresh]


def collector_in_fork():
    """The collector's thresholds here and in a child forked now."""
    import gc
    import os

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_end, repr(list(gc.get_threshold())).encode())
        os._exit(0)
    os.close(write_end)
    child = os.read(read_end, 100).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    return [list(gc.get_threshold()), child]
