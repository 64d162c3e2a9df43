"""Baseline worker: runs callables for the baseline server, like the original's worker.

Run as `python -m baseline.worker` with the frame channel on stdin/stdout, as the
original spawns it (SPEC §3.1, §3.2, §2.7). Per `call` frame it starts one task that
resolves "module::qualname", `pickle.loads` the (args, kwargs), runs the function
(coroutine functions on the loop, anything else through `asyncio.to_thread`),
`pickle.dumps` the value and queues a `result` frame (or an `error` frame). One writer
task drains the unbounded outbound queue.

Side channels (baseline/sio.py): at boot the worker installs the original's `/log`
bridge (root handler), the durable log file (`$AGENTIX_LOG_DIR`, default /tmp/agentix,
empty disables) and, when `agentix.trace` is importable, the `/trace` forwarding
processor; `sio_inbound` frames are dispatched to the registered namespaces; every call
runs with `DISPATCH_CALL_ID` set. Events leave as `sio_open` / `sio_emit` frames through
the same outbound queue as results.

Not modelled: the original's fd-level stdout/stderr capture pipes, the worker's stderr
console handler and host→sandbox context propagation (the benchmark targets print
nothing and send no context).
"""

import asyncio
import importlib
import inspect
import os
import pickle
import sys
import threading
import traceback

from baseline import sio
from baseline.codec import read_frame, write_frame


def resolve(ref: str):
    """Imports "module::qualname" and returns the object it names."""
    module_name, sep, qualname = ref.partition("::")
    if not sep or not module_name or not qualname:
        raise ValueError(f"invalid callable reference {ref!r}")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{ref} is not callable")
    return obj


class Worker:
    """The worker's event loop side: reads frames, runs calls, writes replies."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer
        self._outbound: asyncio.Queue = asyncio.Queue()
        self._calls: dict[str, asyncio.Task] = {}
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def send(self, frame: dict) -> None:
        """Queues one frame for the server; callable from any thread."""
        if threading.get_ident() == self._loop_thread:
            self._outbound.put_nowait(frame)
        else:
            self._loop.call_soon_threadsafe(self._outbound.put_nowait, frame)

    async def run(self) -> None:
        writer_task = asyncio.create_task(self._write_loop())
        self._outbound.put_nowait({"type": "ready"})
        sio.install(self.send, str(os.getpid()),
                    os.environ.get("AGENTIX_LOG_DIR", "/tmp/agentix"))
        try:
            while True:
                frame = await read_frame(self._reader)
                if frame is None:
                    break  # server closed the pipe
                kind = frame.get("type")
                if kind == "call":
                    call_id = frame["call_id"]
                    task = asyncio.create_task(self._run_call(frame))
                    self._calls[call_id] = task
                    task.add_done_callback(lambda _t, c=call_id: self._calls.pop(c, None))
                elif kind == "cancel":
                    task = self._calls.get(frame.get("call_id"))
                    if task is not None:
                        task.cancel()
                elif kind == "sio_inbound":
                    sio.deliver(frame.get("namespace"), frame.get("event"), frame.get("data"))
                elif kind == "shutdown":
                    break
        except (asyncio.IncompleteReadError, ValueError) as exc:
            print(f"baseline worker: control stream desynced: {exc}", file=sys.stderr)
        finally:
            for task in list(self._calls.values()):
                task.cancel()
            writer_task.cancel()

    async def _run_call(self, frame: dict) -> None:
        call_id = frame["call_id"]
        sio.DISPATCH_CALL_ID.set(call_id)  # this task's context; copied into to_thread
        try:
            fn = resolve(frame["callable"])
            args, kwargs = pickle.loads(frame["arguments"])
            if inspect.iscoroutinefunction(fn):
                result = await fn(*args, **kwargs)
            else:
                result = await asyncio.to_thread(fn, *args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            value = pickle.dumps(result)
        except Exception as exc:  # the original catches Exception only (SPEC §3.2)
            self._outbound.put_nowait({
                "type": "error",
                "call_id": call_id,
                "error": {
                    "type": type(exc).__name__,
                    "message": str(exc),
                    "traceback": traceback.format_exc(),
                    "cancelled": False,
                    "returncode": None,
                },
            })
            return
        self._outbound.put_nowait({"type": "result", "call_id": call_id, "value": value})

    async def _write_loop(self) -> None:
        while True:
            frame = await self._outbound.get()
            write_frame(self._writer, frame)
            await self._writer.drain()


async def _main() -> None:
    # Keep the frame channel on private fds; stray prints to fd 1 go to stderr instead
    # of corrupting frames (the original redirects fd 1 into a capture pipe).
    rfd, wfd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(rfd, "rb", buffering=0))
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wfd, "wb", buffering=0))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    await Worker(reader, writer).run()


if __name__ == "__main__":
    try:
        asyncio.run(_main())
    except KeyboardInterrupt:
        pass
