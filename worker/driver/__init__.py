"""The agentix worker's driver: runs remote calls for the sandbox daemon.

Compiled into agentix-worker (BUILD.bazel: driver_source) as the package
`_agentix_driver` and started by worker.cc on the interpreter's main thread
as `main(channel_fd, worker_id)` (serve.py). The modules: common (constants),
worker (the event loop side: frames in, replies out), calls, streams, pool,
errors and env (one call's pieces), bytecode_pack (the bundle's stdlib
bytecode), logs, durable, traces and namespaces (the
side channels), serve (boot).

One asyncio event loop owns the frame channel through `loop.add_reader`, so
frames reach Python without a thread hop and every wake-up handles all frames
that arrived. Coroutine functions run as tasks on that loop; everything else
runs on a thread pool, so a blocking function never stalls the loop.

Cold start: the ready frame goes out before asyncio is imported; until the
loop starts (on the first frame that needs it, or once the worker is idle),
pool threads read the channel and run sync calls (serve.py, intake.py), and
a call's own `import asyncio` is deferred (lazy.py).

Streaming calls (stream_window > 0) send each item of a generator as a
stream_item frame, at most `window` items beyond the host's last stream_ack.
Async iterators are driven by a loop task, sync iterators by a pool thread
(each next() may block); either waits, without spinning, for credit.

Invariant: every call ends in exactly one `result` or `error` frame, whatever
the user code raises (BaseException included), unless the daemon cancelled it
first, in which case the `Cancelled` error is the one frame and the call's
later output is dropped. The protocol is docs/WORKER-PROTOCOL.md.

Logs: every call runs with `_call_id` (a contextvar) set to its id: loop
tasks inherit it from `_start`, pool functions run in a copy of that context.
One handler on the root logger turns each `logging` record into a `log`
frame carrying that id. fds 1 and 2 are pipes drained by C++ threads
(worker/channel/stdio_capture.cc) into stdout/stderr `log` frames; those cannot be
attributed. Python-level writes to sys.stdout/sys.stderr (print) are: the
wrappers turn each complete line into a `log` frame with the writer's call id
right away and never write it to the fd. The durable log file gets the
records and the captured lines.

Traces: if the venv has agentix, one `agentix.trace` Processor registered at
boot (`_TraceForwarder`) turns every trace/span start and end into a `trace`
frame with the opener's call id; it rides the log queue, so it is ordered
with the records around it.
"""

# Before anything else: the driver's imports run without the cycle
# collector (gcpause.py; serve.py resumes it).
from . import gcpause as _gcpause

_gcpause.pause()

# The stdlib modules below (and a first call's: asyncio) from the bundle's
# bytecode pack, when it has one (bytecode_pack.py).
from . import bytecode_pack as _bytecode_pack  # noqa: E402

_bytecode_pack.install()

# The stdlib's regexes the imports below (and a first call's) compile come
# from the build's table (re_table.py).
from . import re_table as _re_table  # noqa: E402

_re_table.install()

# asyncio (and, through lazy.py, its ssl) is imported after the ready frame:
# serve.py.
from .serve import main  # noqa: E402

__all__ = ["main"]
