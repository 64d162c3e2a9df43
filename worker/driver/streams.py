"""Streaming calls: sending a generator's items within the host's window."""

import threading

from .common import _DEBUG, _INVALID_ARGUMENT, _log, _text

def _close_quietly(iterator):
    """Closes a sync iterator that has a close() (generators do), on the
    calling thread, which must be the one iterating it. Errors the
    generator raises while closing are logged: the call has its answer."""
    close = getattr(iterator, "close", None)
    if close is None:
        return
    try:
        close()
    except BaseException as exc:
        _log(_DEBUG, f"closing a generator raised {type(exc).__name__}: "
             f"{_text(exc)}")


async def _aclose_quietly(iterator):
    """Awaits iterator.aclose() if it has one (async generators do); as
    _close_quietly. Swallows a CancelledError too: this ends the task."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except BaseException as exc:
        _log(_DEBUG, f"closing an async generator raised "
             f"{type(exc).__name__}: {_text(exc)}")


def _not_iterable(call, value):
    """The TypeError of a streaming call whose value cannot be streamed."""
    return ("TypeError",
            f"remote_stream target {call.reference!r} returned "
            f"{type(value).__name__}, not an iterator; use remote()", "",
            _INVALID_ARGUMENT)


def _item_too_large(index, exc):
    """The error for an item send_item refused (over the frame limit)."""
    return ("ResultEncodeError", f"cannot send stream item {index}: "
            f"{_text(exc)}", "", _INVALID_ARGUMENT)


class _Stream:
    """Flow control of one streaming call: item i may be sent while
    i < acked + window. The loop thread acks and closes; the producer (a loop
    task or one pool thread) waits for credit: a task on `credit`, a thread
    on `cond`. `acked` and `closed` change under `cond`."""

    __slots__ = ("window", "acked", "closed", "cond", "credit")

    def __init__(self, window):
        # Streaming calls start on the loop, so asyncio is imported by now
        # (the worker boots without it: serve.py).
        from asyncio import Event
        self.window = window
        self.acked = 0
        self.closed = False  # cancelled: a pool producer must stop
        self.cond = threading.Condition()
        self.credit = Event()

    def ack(self, index):
        with self.cond:
            if index <= self.acked:
                return  # stale or repeated
            self.acked = index
            self.cond.notify_all()
        self.credit.set()

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()
