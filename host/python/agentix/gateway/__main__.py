"""`agentix-sio-gateway` / ``python -m agentix.gateway``: serves the original wire.

Listens on ``--host``/``--port`` (default ``$AGENTIX_BIND_HOST`` /
``$AGENTIX_BIND_PORT``, else 127.0.0.1:8000) at once and connects to the daemon
at ``--daemon``; ``GET /health`` answers 503 ``{"status":"starting",…}`` until
the daemon accepts connections, then the original's 200
``{"status":"ok","version":"0.2.7"}``. With ``--parent-pid`` it exits when that
process (the daemon ``bootstrap.sh`` execs into) exits. Exit codes: 0 on
SIGTERM/SIGINT, 1 when the daemon could not be reached within
``--connect-timeout`` or the server failed to load, 2 for bad arguments or an
address in use.

Start-up is in two stages so that the gateway adds almost nothing to a
sandbox's readiness. Stage one imports nothing beyond ``_socket`` and
``select``: it binds the port and, on a thread, answers ``GET /health`` itself
(from whether the daemon's socket accepts connections). Then the main thread
loads the real server (asyncio, aiohttp, python-socketio, grpc: hundreds of
milliseconds on a busy machine). Any other request that arrives in between
is held, unread, and handed to the real server once that is connected to the
daemon. bootstrap.sh runs this file by path with ``python -I -S`` (no site, no
``agentix`` package import: those are stage two's).

Stage one uses only modules the interpreter has loaded at start-up (``sys``,
``time``, ``posix``, ``_thread``, ``_signal``: a SIGTERM in stage one is
noted and ends the gateway with 0 before stage two loads) plus the C modules
``_socket`` and ``select``:
``socket``, ``threading`` and ``os`` pull in ``enum``, ``selectors`` and
``collections``, ~100 ms of a loaded 2-core machine's time before the port is
bound. Stage two waits until a ``/health`` 200 has been answered (or a short
while after the daemon came up) before it loads, so that its imports take
neither CPU from the daemon's start nor the GIL from the early thread while
the provider is polling.
"""

import _signal  # type: ignore[import]  # CPython's C module behind `signal`; no stub
import _socket
import _thread
import posix
import select
import sys
import time

_PR_SET_PDEATHSIG = 1
# SIGTERM/SIGINT that arrived before the event loop took the signals over
# (stage one, or stage two's imports): the gateway then exits 0 at once
# rather than dying by the signal's default action.
_early_stop: list[int] = []


def _note_stop(signum, _frame):
    _early_stop.append(signum)
# Keep in step with agentix.gateway.server.HEALTH_VERSION (not imported: heavy).
HEALTH_VERSION = "0.2.7"
_HEALTH = b"GET /health"
_EARLY_TIMEOUT_S = 10.0
_MAX_EARLY_HANDLERS = 64
# Longest wait for the daemon before stage two loads anyway.
_DAEMON_FIRST_S = 2.0
# After the daemon came up, stage two waits for the first /health 200 at most this long.
_FIRST_OK_S = 0.3
_FLAGS = {"--daemon": str, "--host": str, "--port": int, "--parent-pid": int, "--connect-timeout": float,
          "--log-level": str}


def _parser():
    import argparse

    parser = argparse.ArgumentParser(prog="agentix-sio-gateway", description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemon", help="the daemon's gRPC address: unix:///path or host:port "
                                         "(env AGENTIX_GATEWAY_DAEMON)")
    parser.add_argument("--host", help="address to listen on (env AGENTIX_BIND_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (env AGENTIX_BIND_PORT, default 8000)")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process (our parent) exits")
    parser.add_argument("--connect-timeout", type=float, default=30.0,
                        help="seconds to wait for the daemon to come up (default 30)")
    parser.add_argument("--log-level", help="logging level (env AGENTIX_LOG_LEVEL, default info)")
    return parser


def _args(argv):
    """The flags, parsed without argparse (its imports cost start-up time);
    anything unusual (--help, a bad value, an unknown flag) goes to argparse,
    which explains and exits 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    values = {"--parent-pid": 0, "--connect-timeout": 30.0}
    try:
        i = 0
        while i < len(argv):
            name, eq, value = argv[i].partition("=")
            if name not in _FLAGS:
                raise ValueError(name)
            if not eq:
                i += 1
                value = argv[i]
            values[name] = _FLAGS[name](value)
            i += 1
    except (ValueError, IndexError):
        _parser().parse_args(argv)  # exits with argparse's message
        raise
    env = _Environ()
    args = {
        "daemon": values.get("--daemon") or env.get("AGENTIX_GATEWAY_DAEMON"),
        "host": values.get("--host") or env.get("AGENTIX_BIND_HOST") or "127.0.0.1",
        "port": values.get("--port") or int(env.get("AGENTIX_BIND_PORT") or 8000),
        "parent_pid": values["--parent-pid"],
        "connect_timeout": values["--connect-timeout"],
        "log_level": values.get("--log-level") or env.get("AGENTIX_LOG_LEVEL") or "info",
    }
    if not args["daemon"]:
        _parser().error("--daemon (or AGENTIX_GATEWAY_DAEMON) is required")
    return args


def _health_response(ok):
    # FastAPI's JSONResponse rendering (compact), as the original answered.
    body = ('{"status":"%s","version":"%s"}' % ("ok" if ok else "starting", HEALTH_VERSION)).encode()
    status = b"200 OK" if ok else b"503 Service Unavailable"
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


class _Environ:
    """``os.environ.get`` without importing ``os`` (stage one)."""

    @staticmethod
    def get(name, default=None):
        value = posix.environ.get(name.encode())
        return default if value is None else value.decode("utf-8", "surrogateescape")


class _Early:
    """Stage one: accepts, answers GET /health, holds every other connection
    until `hand_over` gives them to the real server. Connections are raw
    ``_socket.socket`` objects (stage two wraps them)."""

    def __init__(self, listener, daemon_address):
        self.listener = listener
        self.daemon_address = daemon_address
        self.daemon_up = False
        self.daemon_up_at = None  # time.monotonic() when first seen accepting
        self.served_ok = False  # a /health 200 went out
        self.lock = _thread.allocate_lock()
        self.held = []
        self.receiver = None  # set by hand_over
        self.stopped = False
        self.handlers = 0

    def start(self):
        _thread.start_new_thread(self.run, ())

    def run(self):
        while not self.stopped:
            readable, _, _ = select.select([self.listener], [], [], 0.05)
            if not readable or self.stopped:
                continue
            try:
                fd, _ = self.listener._accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return
            conn = _socket.socket(fileno=fd)
            with self.lock:
                busy = self.handlers >= _MAX_EARLY_HANDLERS
                if not busy:
                    self.handlers += 1
            if busy:
                self._hold(conn)
            else:
                _thread.start_new_thread(self._handle, (conn,))

    def daemon_accepts(self):
        if self.daemon_up:
            return True
        address = self.daemon_address
        try:
            if address.startswith("unix://"):
                probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
                target = address[len("unix://"):]
            else:
                host, _, port = address.rpartition(":")
                host = host.strip("[]")
                probe = _socket.socket(_socket.AF_INET6 if ":" in host else _socket.AF_INET, _socket.SOCK_STREAM)
                target = (host, int(port))
            try:
                probe.settimeout(1.0)
                probe.connect(target)
            finally:
                probe.close()
            if self.daemon_up_at is None:
                self.daemon_up_at = time.monotonic()
            self.daemon_up = True
        except (OSError, ValueError):
            pass
        return self.daemon_up

    def _handle(self, conn):
        try:
            conn.settimeout(_EARLY_TIMEOUT_S)
            deadline = time.monotonic() + _EARLY_TIMEOUT_S
            head = b""
            while self.receiver is None:
                head = conn.recv(16, _socket.MSG_PEEK)
                if not head:
                    conn.close()
                    return
                if len(head) >= 12 or not _HEALTH.startswith(head) or time.monotonic() > deadline:
                    break
                time.sleep(0.001)  # a partial "GET /heal": wait for more
            if self.receiver is None and head.startswith(_HEALTH) and head[11:12] in (b" ", b"?"):
                request = b""
                while b"\r\n\r\n" not in request and len(request) < 65536:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    request += chunk
                ok = self.daemon_accepts()
                conn.sendall(_health_response(ok))
                conn.close()
                if ok:
                    self.served_ok = True
                return
            self._hold(conn)
        except OSError:
            conn.close()
        finally:
            with self.lock:
                self.handlers -= 1

    def _hold(self, conn):
        with self.lock:
            receiver = self.receiver
            if receiver is None:
                self.held.append(conn)
                return
        receiver(conn)

    def hand_over(self, receiver):
        """From now on connections go to `receiver` (thread-safe); held ones first."""
        self.stopped = True
        with self.lock:
            self.receiver = receiver
            held, self.held = self.held, []
        for conn in held:
            receiver(conn)


async def _serve(args, raw_listener, early):
    import asyncio
    import os
    import signal
    import socket

    from aiohttp import web

    from agentix.gateway.server import Gateway

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if _early_stop:  # asked to stop while it was still loading
        return 0
    gateway = Gateway(args["daemon"], env=dict(os.environ))
    listener = socket.socket(fileno=raw_listener.detach())
    runner = web.AppRunner(gateway.app, handle_signals=False, access_log=None)
    await runner.setup()
    stopping = asyncio.ensure_future(stop.wait())
    try:
        connecting = asyncio.ensure_future(gateway.connect(timeout=args["connect_timeout"]))
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if connecting.done() and connecting.exception() is not None:
            print(f"agentix-sio-gateway: daemon at {args['daemon']} unreachable: {connecting.exception()}",
                  file=sys.stderr)
            return 1
        if stop.is_set():
            connecting.cancel()
            return 0
        # Hand over: aiohttp accepts from now on; held connections follow.
        await web.SockSite(runner, listener).start()
        factory = runner.server

        def receive(raw):
            conn = socket.socket(fileno=raw.detach())
            conn.setblocking(False)
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(loop.connect_accepted_socket(factory, conn)))

        early.hand_over(receive)
        sys.setswitchinterval(0.005)
        await stop.wait()
        return 0
    finally:
        stopping.cancel()
        await runner.cleanup()
        await gateway.aclose()


def _listen(host, port):
    """``socket.create_server((host, port), backlog=1024)`` with ``_socket``."""
    error = None
    try:  # an ASCII name as bytes: a str goes through the "idna" codec (imports re, enum)
        name = host.encode("ascii")
    except UnicodeEncodeError:
        name = host
    for family, type_, proto, _, address in _socket.getaddrinfo(
            name, port, _socket.AF_UNSPEC, _socket.SOCK_STREAM, 0, _socket.AI_PASSIVE):
        sock = _socket.socket(family, type_, proto)
        try:
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(1024)
            return sock
        except OSError as failure:
            sock.close()
            error = failure
    raise error or OSError(f"no address for {host}")


def main(argv=None):
    for sig in (_signal.SIGTERM, _signal.SIGINT):
        _signal.signal(sig, _note_stop)
    args = _args(argv)
    try:
        listener = _listen(args["host"], args["port"])
    except OSError as error:
        print(f"agentix-sio-gateway: cannot listen on {args['host']}:{args['port']}: {error}", file=sys.stderr)
        return 2
    listener.setblocking(False)
    early = _Early(listener, args["daemon"])
    early.start()
    # Stage two waits (briefly) for the daemon's socket and then for the
    # first /health 200 (what a provider waits for): its imports would
    # otherwise take CPU from the daemon's own start and the GIL from the
    # early thread. Requests are held meanwhile; the first call waits for
    # the imports either way.
    deadline = time.monotonic() + _DAEMON_FIRST_S
    while not early.daemon_accepts() and time.monotonic() < deadline and not _early_stop:
        time.sleep(0.002)
    if early.daemon_up_at is not None:
        deadline = min(deadline, early.daemon_up_at + _FIRST_OK_S)
        while not early.served_ok and time.monotonic() < deadline and not _early_stop:
            time.sleep(0.002)
    # A short switch interval while it imports lets the early thread answer
    # /health promptly (the default 5 ms per hand-off adds up).
    sys.setswitchinterval(0.0005)
    if sys.flags.no_site:  # run with -S (bootstrap.sh): site-packages now
        import site

        site.main()
    import os

    if args["parent_pid"]:
        import ctypes
        import signal

        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except OSError:
            pass
        if os.getppid() != args["parent_pid"]:  # it exited before prctl
            return 0
    if _early_stop:
        return 0
    import asyncio
    import logging

    logging.basicConfig(level=getattr(logging, str(args["log_level"]).upper(), logging.INFO),
                        format="%(asctime)s [agentix-sio-gateway] [%(name)s] %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    print(f"agentix-sio-gateway serving http://{args['host']}:{args['port']} for {args['daemon']}",
          file=sys.stderr, flush=True)
    try:
        return asyncio.run(_serve(args, listener, early))
    except ImportError as error:
        print(f"agentix-sio-gateway: cannot load the server ({error}); the bundle needs python-socketio, "
              "python-engineio, aiohttp, grpcio, protobuf and msgpack (docs/GATEWAY.md)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
