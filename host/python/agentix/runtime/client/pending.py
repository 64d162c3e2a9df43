"""The host's record of one call in flight (`PendingCall`), the future a
`remote()` call is awaited through (`CallFuture`), what a call's future
receives (`Outcome`; a sandbox error read by `remote_error_outcome`), the
side-channel barrier a result carries, and the StartCall kept for re-sending
after a reconnect. The client owns the table of pending calls; the Calls
streams fill and settle its entries."""

from __future__ import annotations

import asyncio
import sys
from typing import Union

from agentix.runtime.client import wire
from agentix.runtime.shared.models import RemoteError
from agentix.runtime.v1 import runtime_pb2 as pb

__all__ = [
    "CallFuture",
    "MAX_RESULT_BYTES",
    "Outcome",
    "PendingCall",
    "STREAM_END",
    "SideBarrier",
    "StartRequest",
    "remote_error_outcome",
    "wake_all",
]

# asyncio.current_task(loop) without its Python frame: on 3.11 it is this dict's lookup.
_current_tasks: dict | None = getattr(asyncio.tasks, "_current_tasks", None) if sys.version_info < (3, 12) else None

# A call's outcome: the encoded result value (bytes, or the list of pieces it
# arrived in), or the sandbox's error report.
Outcome = Union[bytes, list, RemoteError]

# Default cap on one call's encoded result (and on one streamed item): the
# daemon's default --max-payload-bytes for arguments.
MAX_RESULT_BYTES = 1 << 30


def remote_error_outcome(error: pb.RemoteError) -> RemoteError:
    """The `Outcome` of a call that failed in the sandbox: the wire
    `RemoteError` converted (empty tracebacks become None)."""
    return RemoteError(
        type=error.type,
        message=error.message,
        traceback=error.traceback or None,
        cancelled=error.cancelled,
        returncode=error.returncode if error.HasField("returncode") else None,
        type_module=error.type_module or None,
        type_qualname=error.type_qualname or None,
        state=error.state or None,
    )


# Put into a streaming call's item queue once its future is done.
STREAM_END = object()


class SideBarrier:
    """The seqs of the last log record and trace event a call emitted before
    one of its events (``CallResult.log_seq`` / ``trace_seq``): the host
    replays up to them before it hands that event to the caller. In a
    streaming call's item queue it precedes the item it guards."""

    __slots__ = ("log_seq", "trace_seq")

    def __init__(self, log_seq: int, trace_seq: int) -> None:
        self.log_seq = log_seq
        self.trace_seq = trace_seq


class CallFuture(asyncio.Future):
    """A call's future, whose awaiting task the stream can resume in the
    event-loop callback that read the call's result (`PendingCall.settle`
    with a `woken` list, then `wake`) instead of one loop iteration later.

    An `asyncio.Future` runs its done callbacks (the awaiting task's wake-up
    among them) with ``loop.call_soon``: one more loop iteration per call (a
    ``select``, a Handle, ``_run_once``) between reading a sequential call's
    result and returning it. This future keeps its done callbacks itself, so
    that `wake` can run them at once; everything else (`set_result`,
    `set_exception`, `cancel`, callbacks added once done) schedules them as
    `asyncio.Future` does. A task awaiting it finds its callbacks through
    ``add_done_callback`` (asyncio's protocol for Future subclasses).
    """

    # (callback, context) pairs until done. A class default, not __init__:
    # set in the instance (asyncio.Future's own __dict__) only when a task
    # awaits, which keeps creating one as cheap as a plain Future.
    _wakeups: list | None = None

    def add_done_callback(self, fn, *, context=None) -> None:  # noqa: ANN001 - asyncio's signature
        if self.done():
            self.get_loop().call_soon(fn, self, context=context)
        elif self._wakeups is None:
            self._wakeups = [(fn, context)]
        else:
            self._wakeups.append((fn, context))

    def remove_done_callback(self, fn) -> int:  # noqa: ANN001
        wakeups = self._wakeups
        if not wakeups:
            return 0
        kept = [entry for entry in wakeups if entry[0] != fn]
        self._wakeups = kept
        return len(wakeups) - len(kept)

    def set_result(self, result) -> None:  # noqa: ANN001
        super().set_result(result)
        self._schedule()

    def set_exception(self, exception) -> None:  # noqa: ANN001
        super().set_exception(exception)
        self._schedule()

    def cancel(self, msg=None) -> bool:  # noqa: ANN001
        if not super().cancel(msg):
            return False
        self._schedule()
        return True

    def wake(self) -> None:
        """Runs the done callbacks of a future settled without them
        (`PendingCall.settle` with `woken`) now, in their
        contexts, when called outside any task (an event-loop callback:
        where asyncio's Handle would run them one iteration later); inside
        a task (which cannot run another task's step) they are scheduled."""
        wakeups = self._wakeups
        if not wakeups:
            return
        loop = self.get_loop()
        if (asyncio.current_task(loop) if _current_tasks is None else _current_tasks.get(loop)) is not None:
            self._schedule()
            return
        self._wakeups = None
        for index, (fn, context) in enumerate(wakeups):
            try:
                if context is None:
                    fn(self)
                else:
                    context.run(fn, self)
            except (SystemExit, KeyboardInterrupt):
                for later, later_context in wakeups[index + 1 :]:
                    loop.call_soon(later, self, context=later_context)
                raise
            except BaseException as exc:  # as asyncio's Handle reports a failed callback
                loop.call_exception_handler(
                    {"message": f"Exception in callback {fn!r}", "exception": exc, "future": self}
                )

    def _schedule(self) -> None:
        wakeups = self._wakeups
        if wakeups:
            self._wakeups = None
            loop = self.get_loop()
            for fn, context in wakeups:
                loop.call_soon(fn, self, context=context)


def wake_all(futures: list[CallFuture]) -> None:
    """`CallFuture.wake` of each of `futures`, in order. Should one raise (a
    task's SystemExit or KeyboardInterrupt), the later ones' callbacks are
    scheduled before it propagates: no settled call's task is left unwoken."""
    woken = 0
    try:
        for future in futures:
            woken += 1
            future.wake()
    except BaseException:
        for later in futures[woken:]:
            later._schedule()
        raise


# asyncio.Future's own set_result: sets the result, runs no done callback
# of a CallFuture (it keeps them itself).
_set_result = asyncio.Future.set_result


class PendingCall:
    """A call started on a stream and not yet settled.

    ``future`` receives the `Outcome`, or an exception chosen by the client when
    the call cannot finish (connection lost, client closed). A streaming call
    also has ``items``: the encoded `StreamItem` values in order, followed by
    `STREAM_END` once the future is done.
    """

    __slots__ = (
        "call_id",
        "display_name",
        "future",
        "result_chunks",
        "items",
        "start",
        "received",
        "consumed",
        "max_result_bytes",
        "result_bytes",
        "barrier",
    )

    def __init__(
        self,
        call_id: str,
        display_name: str,
        future: asyncio.Future,
        *,
        streaming: bool = False,
        start: StartRequest | None = None,
        max_result_bytes: int = MAX_RESULT_BYTES,
    ) -> None:
        self.call_id = call_id
        self.display_name = display_name
        self.future = future
        self.result_chunks: list[bytes] = []
        self.items: asyncio.Queue | None = asyncio.Queue() if streaming else None
        # What re-sends the call after a reconnect; None (resume only) once the
        # daemon sent a result chunk or item of it: it had all the arguments.
        self.start = start
        # StreamItems received (index of the next one expected) and consumed
        # by the caller (what the last StreamAck said).
        self.received = 0
        self.consumed = 0
        # Encoded result bytes received so far, refused beyond the cap.
        self.max_result_bytes = max_result_bytes
        self.result_bytes = 0
        # What its terminal event says to replay before returning (None: nothing).
        self.barrier: SideBarrier | None = None

    def settle(self, outcome: Outcome, woken: list[CallFuture] | None = None) -> None:
        """Delivers `outcome` unless the future is already done (e.g.
        cancelled). With `woken`, a `CallFuture` is only resolved and added
        to it: the caller wakes its task (`CallFuture.wake`)."""
        future = self.future
        if not future.done():
            if woken is not None and type(future) is CallFuture:
                # The result without the done callbacks: `woken`'s owner
                # runs them (CallFuture.wake; in a `finally`: a task left
                # unwoken would never resume).
                _set_result(future, outcome)
                woken.append(future)
            else:
                future.set_result(outcome)
            if self.items is not None:
                self.items.put_nowait(STREAM_END)

    def fail(self, error: BaseException) -> None:
        """Fails the call with `error` unless the future is already done."""
        if not self.future.done():
            self.future.set_exception(error)
            self._end_items()

    def _end_items(self) -> None:
        if self.items is not None:
            self.items.put_nowait(STREAM_END)


class StartRequest:
    """The StartCall of a call, kept so it can be sent again on a new stream
    after a reconnect (the daemon never runs a call_id twice)."""

    __slots__ = ("callable_ref", "arguments", "context", "stream_window")

    def __init__(self, callable_ref: str, arguments: bytes | wire.Pieces, context: bytes, stream_window: int) -> None:
        self.callable_ref = callable_ref
        self.arguments = arguments
        self.context = context
        self.stream_window = stream_window
