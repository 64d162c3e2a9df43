"""`agentix-sio-gateway` / ``python -m agentix.gateway``: serves the original wire.

Listens on ``--host``/``--port`` (default ``$AGENTIX_BIND_HOST`` /
``$AGENTIX_BIND_PORT``, else 127.0.0.1:8000) at once and connects to the daemon
at ``--daemon`` in the background; ``GET /health`` answers 503 until that
connection is up, then the original's 200 ``{"status":"ok","version":"0.2.7"}``.
With ``--parent-pid`` it exits when that process (the daemon ``bootstrap.sh``
execs into) exits. Exit codes: 0 on SIGTERM/SIGINT, 1 when the daemon could not
be reached within ``--connect-timeout``, 2 for bad arguments or a port in use.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


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


async def _main(args: argparse.Namespace) -> int:
    from agentix.gateway.server import Gateway

    gateway = Gateway(args.daemon, env=dict(os.environ))
    try:
        runner = await gateway.serve(args.host, args.port)
    except OSError as error:
        print(f"agentix-sio-gateway: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 2
    print(f"agentix-sio-gateway serving http://{args.host}:{args.port} for {args.daemon}", file=sys.stderr,
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    try:
        connecting = asyncio.ensure_future(gateway.connect(timeout=args.connect_timeout))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if connecting.done() and connecting.exception() is not None:
            print(f"agentix-sio-gateway: daemon at {args.daemon} unreachable: {connecting.exception()}",
                  file=sys.stderr)
            code = 1
        elif not stop.is_set():
            await stop.wait()
        connecting.cancel()
        stopping.cancel()
    finally:
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
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
