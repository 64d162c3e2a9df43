"""A Unix-socket proxy between a host and agentix-sandboxd that can cut every
connection through it at any moment, as a flaky network or a restarting
load balancer would. Used by the reconnect tests and the chaos run.

    proxy = CuttingProxy(listen_path, upstream_path)
    proxy.start()            # serves on its own thread and event loop
    proxy.cut()              # abruptly closes every open connection
    proxy.stop()

Connections are forwarded byte for byte; a cut closes both sides with a TCP
reset-like abort (no graceful shutdown), so HTTP/2 sees a broken transport.
"""

from __future__ import annotations

import asyncio
import os
import threading

__all__ = ["CuttingProxy", "start_pair"]


class CuttingProxy:
    def __init__(self, listen_path: str, upstream_path: str) -> None:
        self.listen_path = listen_path
        self.upstream_path = upstream_path
        self.url = f"unix://{listen_path}"
        self.cuts = 0
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task] = set()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cutting-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start")

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._loop = None

    def cut(self) -> int:
        """Aborts every open connection; returns how many were cut."""
        loop = self._loop
        if loop is None:
            return 0
        done = asyncio.run_coroutine_threadsafe(self._cut(), loop)
        return done.result(10)

    async def _cut(self) -> int:
        writers = list(self._writers)
        self._writers.clear()
        for writer in writers:
            writer.transport.abort()
        if writers:
            self.cuts += 1
        return len(writers) // 2

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            os.unlink(self.listen_path)
        except FileNotFoundError:
            pass
        self._server = loop.run_until_complete(asyncio.start_unix_server(self._handle, self.listen_path))
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            handlers = list(self._handlers)
            for task in handlers:
                task.cancel()
            if handlers:  # gather() of nothing would look for this thread's (unset) loop
                loop.run_until_complete(asyncio.gather(*handlers, return_exceptions=True))
            loop.close()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            await self._forward(client_reader, client_writer)
        finally:
            self._handlers.discard(task)

    async def _forward(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(self.upstream_path)
        except OSError:
            client_writer.transport.abort()
            return
        self.connections += 1
        self._writers.update((client_writer, upstream_writer))

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(1 << 16):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.transport.abort()

        await asyncio.gather(pump(client_reader, upstream_writer), pump(upstream_reader, client_writer))
        self._writers.discard(client_writer)
        self._writers.discard(upstream_writer)


def start_pair(listen_path: str, upstream_path: str) -> list[CuttingProxy]:
    """Started proxies for a daemon's socket and its frame-wire Calls socket
    (`<path>.calls`), the two a Python host connects to."""
    proxies = [CuttingProxy(listen_path, upstream_path),
               CuttingProxy(listen_path + ".calls", upstream_path + ".calls")]
    for p in proxies:
        p.start()
    return proxies
