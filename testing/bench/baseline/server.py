"""Baseline server: the original's in-sandbox Socket.IO runtime, modelled on aiohttp.

    python -m baseline.server --bench-dir DIR

Listens on 127.0.0.1 (ephemeral port), prints `LISTENING <port>` on stdout once its
worker is ready, and runs until stdin reaches EOF (its parent went away) or SIGTERM.

What it models (SPEC §2.1-2.7):
- `socketio.AsyncServer(cors_allowed_origins="*", namespaces="*", ping_interval=25,
  ping_timeout=300, max_http_buffer_size=256 MiB)`; every event carries one binary
  msgpack payload.
- `/rpc` `call {call_id, callable, arguments, context?}`: decoded with
  `unpack(bytes(data))`; execution at most once per call_id; one task per call that
  sends a `call` frame to the worker and awaits its `result`/`error` frame.
- On completion the terminal event is stored in `pending_results` (cap 4096, oldest
  evicted) and broadcast on `/rpc` as `call:result {call_id, value}` or
  `call:error {call_id, error}`; the host's `ack {call_id}` frees it.
- One worker subprocess on a u32-LE msgpack pipe (stdin/stdout), one writer task.

- Side channels (SPEC §6.3): `/log` and `/trace` forwarders registered at startup, one
  more per worker `sio_open {namespace}` (not `/`, `/rpc` or an open one); a forwarder
  is a catch-all `socketio.AsyncNamespace` that sends every non-lifecycle event to the
  worker as `sio_inbound {namespace, event, data(unpacked)}`. A worker
  `sio_emit {namespace, event, data}` is re-packed and broadcast on that namespace
  (no `to=`), awaited in the worker read loop, so events leave in pipe order.

Differences from the original: aiohttp instead of uvicorn (the ASGI server is not
installed here; see README), no `POST /call` HTTP fast path, no cancel/resume handling
beyond what the benchmark needs.
"""

import argparse
import asyncio
import os
import signal
import socket
import sys
from collections import OrderedDict

import socketio
from aiohttp import web
from aiohttp.web import WebSocketResponse
from engineio.async_drivers import aiohttp as eio_aiohttp

from baseline.codec import MAX_MESSAGE_BYTES, pack, read_frame, unpack, write_frame

NAMESPACE = "/rpc"
MAX_PENDING_RESULTS = 4096
WORKER_START_TIMEOUT_S = 15.0


class _LargeMessageWebSocket(eio_aiohttp.WebSocket):
    """engineio's aiohttp websocket wrapper with the 256 MiB message cap.

    engineio 4.3.4 creates `WebSocketResponse()` with aiohttp's 4 MiB default, which
    would refuse the 16/64 MiB payloads; the original runs uvicorn with
    `ws_max_size=256 MiB`. Identical to the base class otherwise.
    """

    async def __call__(self, environ):
        request = environ["aiohttp.request"]
        self._sock = WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES)
        await self._sock.prepare(request)
        self.environ = environ
        await self.handler(self)
        return self._sock


class WorkerLink:
    """Parent side of the worker pipe: spawns the worker, multiplexes calls on it."""

    def __init__(self, bench_dir: str):
        self._bench_dir = bench_dir
        self._proc: asyncio.subprocess.Process | None = None
        self._outbound: asyncio.Queue = asyncio.Queue()
        self._waiters: dict[str, asyncio.Future] = {}
        self._tasks: list[asyncio.Task] = []
        self._ready = asyncio.Event()
        self.on_sio_frame = None  # async (frame) -> None, set by SideChannels

    def send_inbound(self, namespace: str, event: str, data) -> None:
        """Forwards one host event on a plugin/core namespace to the worker."""
        self._outbound.put_nowait({"type": "sio_inbound", "namespace": namespace,
                                   "event": event, "data": data})

    async def start(self) -> None:
        env = dict(os.environ)
        # The worker imports `baseline.worker` and the benchmark targets from here.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [self._bench_dir, env.get("PYTHONPATH", "")] if p)
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "baseline.worker",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)
        self._tasks = [asyncio.create_task(self._read_loop()),
                       asyncio.create_task(self._write_loop())]
        await asyncio.wait_for(self._ready.wait(), WORKER_START_TIMEOUT_S)

    async def call(self, call_id: str, callable_ref: str, arguments: bytes, context) -> dict:
        """Runs one call in the worker; returns its terminal `result` or `error` frame."""
        future = asyncio.get_running_loop().create_future()
        self._waiters[call_id] = future
        self._outbound.put_nowait({"type": "call", "call_id": call_id,
                                   "callable": callable_ref, "arguments": arguments,
                                   "context": context})
        try:
            return await future
        finally:
            self._waiters.pop(call_id, None)

    async def _read_loop(self) -> None:
        try:
            while True:
                frame = await read_frame(self._proc.stdout)
                if frame is None:
                    break
                kind = frame.get("type")
                if kind == "ready":
                    self._ready.set()
                elif kind in ("result", "error"):
                    future = self._waiters.get(frame.get("call_id"))
                    if future is not None and not future.done():
                        future.set_result(frame)
                elif kind in ("sio_open", "sio_emit") and self.on_sio_frame is not None:
                    try:
                        await self.on_sio_frame(frame)
                    except Exception as exc:  # SIO layer errors are swallowed
                        print(f"baseline server: {kind} failed: {exc!r}", file=sys.stderr)
        except Exception as exc:  # any failure closes the link, like the original
            print(f"baseline server: worker read loop failed: {exc!r}", file=sys.stderr)
        finally:
            for future in self._waiters.values():
                if not future.done():
                    future.set_exception(RuntimeError("worker exited"))

    async def _write_loop(self) -> None:
        writer = self._proc.stdin
        while True:
            frame = await self._outbound.get()
            write_frame(writer, frame)
            await writer.drain()

    async def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.returncode is None:
            try:
                write_frame(self._proc.stdin, {"type": "shutdown"})
                await asyncio.wait_for(self._proc.stdin.drain(), 2)
                self._proc.stdin.close()
                await asyncio.wait_for(self._proc.wait(), 5)
            except (Exception, asyncio.TimeoutError):
                pass
        if self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
        for task in self._tasks:
            task.cancel()


class RpcServer:
    """The `/rpc` namespace: call execution, result cache, broadcast, ack."""

    def __init__(self, sio: socketio.AsyncServer, worker: WorkerLink):
        self._sio = sio
        self._worker = worker
        self._calls: dict[str, asyncio.Task] = {}
        self._pending_results: OrderedDict[str, tuple[str, dict]] = OrderedDict()
        self._emits: set[asyncio.Task] = set()  # strong references to broadcast tasks
        sio.on("call", self.on_call, namespace=NAMESPACE)
        sio.on("ack", self.on_ack, namespace=NAMESPACE)

    async def on_call(self, sid, data) -> None:
        request = unpack(bytes(data))
        call_id = request.get("call_id") if isinstance(request, dict) else None
        if not isinstance(call_id, str):
            await self._sio.emit("call:error", pack({"call_id": "", "error": {
                "type": "BadRequest", "message": "missing call_id", "traceback": None,
                "cancelled": False, "returncode": None}}), to=sid, namespace=NAMESPACE)
            return
        if call_id in self._calls or call_id in self._pending_results:
            return  # execution at most once per call_id
        task = asyncio.create_task(self._execute(call_id, request))
        self._calls[call_id] = task
        task.add_done_callback(lambda t, c=call_id: self._on_done(c, t))

    async def _execute(self, call_id: str, request: dict) -> tuple[str, dict]:
        try:
            frame = await self._worker.call(call_id, request["callable"],
                                            request["arguments"], request.get("context"))
        except Exception as exc:
            return "call:error", {"call_id": call_id, "error": {
                "type": type(exc).__name__, "message": str(exc), "traceback": None,
                "cancelled": False, "returncode": None}}
        if frame["type"] == "result":
            return "call:result", {"call_id": call_id, "value": frame["value"]}
        return "call:error", {"call_id": call_id, "error": frame["error"]}

    def _on_done(self, call_id: str, task: asyncio.Task) -> None:
        # Same loop turn as the pop from `calls`: the id is never in neither map.
        self._calls.pop(call_id, None)
        if task.cancelled():
            return
        event, payload = task.result()
        self._pending_results[call_id] = (event, payload)
        while len(self._pending_results) > MAX_PENDING_RESULTS:
            self._pending_results.popitem(last=False)
        emit = asyncio.create_task(
            self._sio.emit(event, pack(payload), namespace=NAMESPACE))  # broadcast
        self._emits.add(emit)
        emit.add_done_callback(self._emits.discard)

    async def on_ack(self, sid, data) -> None:
        request = unpack(bytes(data))
        if isinstance(request, dict):
            self._pending_results.pop(request.get("call_id"), None)


class _Forwarder(socketio.AsyncNamespace):
    """Catch-all server namespace: host events → `sio_inbound` frames to the worker."""

    def __init__(self, namespace: str, worker: WorkerLink):
        super().__init__(namespace)
        self._worker = worker

    async def trigger_event(self, event, *args):
        if event in ("connect", "disconnect"):
            return None  # accept every connection
        data = args[1] if len(args) > 1 else None
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = unpack(bytes(data))
        self._worker.send_inbound(self.namespace, event, data)
        return None


class SideChannels:
    """The original's plugin/side-channel forwarding (`sio.py:393-449`)."""

    def __init__(self, sio: socketio.AsyncServer, worker: WorkerLink):
        self._sio = sio
        self._worker = worker
        self._open: set[str] = set()
        for namespace in ("/trace", "/log"):  # pre-registered: hosts connect at once
            self._open_namespace(namespace)
        worker.on_sio_frame = self.on_frame

    def _open_namespace(self, namespace) -> None:
        if (not isinstance(namespace, str) or not namespace.startswith("/")
                or namespace in ("/", NAMESPACE) or namespace in self._open):
            return
        self._open.add(namespace)
        self._sio.register_namespace(_Forwarder(namespace, self._worker))

    async def on_frame(self, frame: dict) -> None:
        if frame["type"] == "sio_open":
            self._open_namespace(frame.get("namespace"))
        else:  # sio_emit: re-pack and broadcast
            await self._sio.emit(frame.get("event"), pack(frame.get("data")),
                                 namespace=frame.get("namespace"))


async def _wait_for_stop() -> None:
    """Returns on SIGTERM/SIGINT or when stdin reaches EOF (the parent went away)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def watch_stdin():
        while await reader.read(4096):
            pass
        stop.set()

    watcher = asyncio.create_task(watch_stdin())
    await stop.wait()
    watcher.cancel()


async def _main(bench_dir: str) -> None:
    sio = socketio.AsyncServer(
        async_mode="aiohttp", cors_allowed_origins="*", namespaces="*",
        ping_interval=25, ping_timeout=300, max_http_buffer_size=MAX_MESSAGE_BYTES)
    sio.eio._async = dict(sio.eio._async, websocket=_LargeMessageWebSocket)
    app = web.Application(client_max_size=MAX_MESSAGE_BYTES)
    sio.attach(app)

    worker = WorkerLink(bench_dir)
    RpcServer(sio, worker)
    SideChannels(sio, worker)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    try:
        await web.SockSite(runner, sock).start()
        await worker.start()
        sys.stdout.write(f"LISTENING {sock.getsockname()[1]}\n")
        sys.stdout.flush()
        await _wait_for_stop()
    finally:
        await worker.stop()
        await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-dir", required=True,
                        help="directory holding the baseline package and bench_targets.py")
    asyncio.run(_main(parser.parse_args().bench_dir))
