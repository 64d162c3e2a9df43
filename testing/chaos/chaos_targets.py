"""Sandbox side of the chaos run: every function records its execution in an
append-only file (so duplicates are visible across worker restarts), logs one
record and opens one span tagged with its operation id."""

import asyncio
import logging
import os

from agentix import Namespace, register_namespace, trace

_log = logging.getLogger("chaos")
_ns = None


def _executed(op):
    path = os.environ.get("AGENTIX_CHAOS_LEDGER")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{op}\n".encode())
        finally:
            os.close(fd)


def small(op, x):
    _executed(op)
    with trace.span("chaos", op=op):
        _log.info("op %s", op)
    return x * 2


def echo(op, data):
    _executed(op)
    with trace.span("chaos", op=op):
        _log.info("op %s", op)
    return data


def stream(op, n):
    _executed(op)
    with trace.span("chaos", op=op):
        _log.info("op %s", op)
    for i in range(n):
        yield i


def pressure(op, mib):
    """Memory pressure: touches `mib` MiB, then frees it."""
    _executed(op)
    with trace.span("chaos", op=op):
        _log.info("op %s", op)
        block = bytearray(mib << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        size = len(block)
        del block
    return size


class _Chaos(Namespace):
    namespace = "/chaos"


async def ask(op, value):
    """Asks the host (namespace request) while the call runs."""
    global _ns
    _executed(op)
    if _ns is None:
        _ns = register_namespace(_Chaos())
    with trace.span("chaos", op=op):
        _log.info("op %s", op)
        answer = await _ns.request("double", value, timeout=60)
    await asyncio.sleep(0)
    return answer


def worker_pid():
    return os.getpid()
