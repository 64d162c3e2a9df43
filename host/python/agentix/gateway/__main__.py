"""`agentix-sio-gateway` / ``python -m agentix.gateway``: serves the original wire.

Listens on ``--host``/``--port`` (default ``$AGENTIX_BIND_HOST`` /
``$AGENTIX_BIND_PORT``, else 127.0.0.1:8000) at once and connects to the daemon
at ``--daemon``; ``GET /health`` answers 503 ``{"status":"starting",…}`` until
the daemon accepts connections, then the original's 200
``{"status":"ok","version":"0.2.7"}``. With ``--parent-pid`` it exits when that
process (the daemon ``bootstrap.sh`` execs into) exits. Exit codes: 0 on
SIGTERM/SIGINT, 1 when the daemon could not be reached within
``--connect-timeout``, 2 for bad arguments or an address in use.

Start-up is in two stages so that the gateway adds almost nothing to a
sandbox's readiness: this file imports only the standard library, binds the
port and answers ``GET /health`` itself (from whether the daemon's socket
accepts connections) while a thread imports the real server (aiohttp,
python-socketio, grpc: hundreds of milliseconds). Any other request that
arrives meanwhile is held, unread, and handed to the real server once it is
connected to the daemon. bootstrap.sh runs this file by path
(``python -I …/agentix/gateway/__main__.py``), which skips importing the
``agentix`` package itself.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any

_PR_SET_PDEATHSIG = 1
# Keep in step with agentix.gateway.server.HEALTH_VERSION (not imported: heavy).
HEALTH_VERSION = "0.2.7"
_PEEK_BYTES = 16
_HEALTH = b"GET /health"
_EARLY_REQUEST_TIMEOUT_S = 10.0


def _die_with(parent_pid: int) -> None:
    """SIGTERM this process when `parent_pid` (our parent) exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass
    if os.getppid() != parent_pid:  # it exited before prctl
        sys.exit(0)


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="agentix-sio-gateway", description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemon", default=os.environ.get("AGENTIX_GATEWAY_DAEMON"),
                        help="the daemon's gRPC address: unix:///path or host:port (env AGENTIX_GATEWAY_DAEMON)")
    parser.add_argument("--host", default=os.environ.get("AGENTIX_BIND_HOST") or "127.0.0.1",
                        help="address to listen on (env AGENTIX_BIND_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("AGENTIX_BIND_PORT") or 8000),
                        help="port to listen on (env AGENTIX_BIND_PORT, default 8000)")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process (our parent) exits")
    parser.add_argument("--connect-timeout", type=float, default=30.0,
                        help="seconds to wait for the daemon to come up (default 30)")
    parser.add_argument("--log-level", default=os.environ.get("AGENTIX_LOG_LEVEL") or "info")
    args = parser.parse_args(argv)
    if not args.daemon:
        parser.error("--daemon (or AGENTIX_GATEWAY_DAEMON) is required")
    return args


def _health_response(ok: bool) -> bytes:
    # FastAPI's JSONResponse rendering (compact), as the original answered.
    body = json.dumps({"status": "ok" if ok else "starting", "version": HEALTH_VERSION},
                      separators=(",", ":")).encode()
    status = b"200 OK" if ok else b"503 Service Unavailable"
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


class _Early:
    """Stage one: the listening socket, /health answers, held connections."""

    def __init__(self, args: argparse.Namespace, listener: socket.socket) -> None:
        self.args = args
        self.listener = listener
        self.loop = asyncio.get_running_loop()
        self.server_ready = asyncio.Event()  # the real server is connected: hand over
        self.handover: Any = None  # the aiohttp protocol factory once ready
        self.daemon_up = False
        self.tasks: set[asyncio.Task] = set()

    async def daemon_accepts(self) -> bool:
        if self.daemon_up:
            return True
        address = self.args.daemon
        if address.startswith("unix://"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = address[len("unix://"):]
        else:
            host, _, port = address.rpartition(":")
            sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET)
            target = (host.strip("[]"), int(port))
        sock.setblocking(False)
        try:
            await asyncio.wait_for(self.loop.sock_connect(sock, target), 1.0)
            self.daemon_up = True
        except (OSError, asyncio.TimeoutError, ValueError):
            pass
        finally:
            sock.close()
        return self.daemon_up

    async def accept_loop(self) -> None:
        while True:
            conn, _ = await self.loop.sock_accept(self.listener)
            conn.setblocking(False)
            task = asyncio.ensure_future(self.handle(conn))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _readable(self, conn: socket.socket, timeout: float) -> None:
        fut = self.loop.create_future()
        self.loop.add_reader(conn.fileno(), lambda: fut.done() or fut.set_result(None))
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            self.loop.remove_reader(conn.fileno())

    async def handle(self, conn: socket.socket) -> None:
        """Answers GET /health here; holds anything else for the real server."""
        try:
            head = b""
            while not self.server_ready.is_set():
                await self._readable(conn, _EARLY_REQUEST_TIMEOUT_S)
                head = conn.recv(_PEEK_BYTES, socket.MSG_PEEK)
                if not head:
                    conn.close()
                    return
                if len(head) >= 12 or not _HEALTH.startswith(head):
                    break
                await asyncio.sleep(0.001)  # a partial "GET /heal": wait for more
            if not self.server_ready.is_set() and head.startswith(_HEALTH) and head[11:12] in (b" ", b"?"):
                request = b""
                while b"\r\n\r\n" not in request and len(request) < 65536:
                    await self._readable(conn, _EARLY_REQUEST_TIMEOUT_S)
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    request += chunk
                await self.loop.sock_sendall(conn, _health_response(await self.daemon_accepts()))
                conn.close()
                return
        except (OSError, asyncio.TimeoutError):
            conn.close()
            return
        await self.server_ready.wait()
        await self.loop.connect_accepted_socket(self.handover, conn)


async def _main(args: argparse.Namespace, listener: socket.socket) -> int:
    loop = asyncio.get_running_loop()
    early = _Early(args, listener)
    accepting = asyncio.ensure_future(early.accept_loop())
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Stage two's imports run on a thread while the loop answers /health.
    imported = loop.create_future()

    def load() -> None:
        try:
            from agentix.gateway.server import Gateway

            loop.call_soon_threadsafe(lambda: imported.done() or imported.set_result(Gateway))
        except BaseException as error:  # reported on the loop
            loop.call_soon_threadsafe(lambda: imported.done() or imported.set_exception(error))

    threading.Thread(target=load, name="gateway-import", daemon=True).start()
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({imported, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        return 0
    from aiohttp import web

    gateway = imported.result()(args.daemon, env=dict(os.environ))
    runner = web.AppRunner(gateway.app, handle_signals=False, access_log=None)
    await runner.setup()
    code = 0
    try:
        connecting = asyncio.ensure_future(gateway.connect(timeout=args.connect_timeout))
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if connecting.done() and connecting.exception() is not None:
            print(f"agentix-sio-gateway: daemon at {args.daemon} unreachable: {connecting.exception()}",
                  file=sys.stderr)
            return 1
        if not stop.is_set():
            # Hand over: aiohttp accepts from now on; held connections follow.
            accepting.cancel()
            await asyncio.gather(accepting, return_exceptions=True)
            await web.SockSite(runner, listener).start()
            early.handover = runner.server
            early.server_ready.set()
            await stop.wait()
        connecting.cancel()
    finally:
        stopping.cancel()
        await runner.cleanup()
        await gateway.aclose()
    return code


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.parent_pid:
        _die_with(args.parent_pid)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s [agentix-sio-gateway] [%(name)s] %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        listener = socket.create_server((args.host, args.port), backlog=1024, reuse_port=False)
    except OSError as error:
        print(f"agentix-sio-gateway: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 2
    listener.setblocking(False)
    print(f"agentix-sio-gateway serving http://{args.host}:{args.port} for {args.daemon}", file=sys.stderr,
          flush=True)
    return asyncio.run(_main(args, listener))


if __name__ == "__main__":
    sys.exit(main())
