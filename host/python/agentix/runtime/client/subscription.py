"""What the host halves of ``RuntimeService.Logs`` and ``RuntimeService.Traces``
share: a seq cursor and a stream that subscribes, replays and acknowledges.

Both RPCs follow one contract (runtime.proto): the host sends one subscribe
message carrying the last seq it has seen and the daemon instance that seq
counts in, then the daemon sends batches of items in seq order, and the host
acknowledges what it has handled. A `SubscriptionStream` subclass says how to
build those messages and how to replay one item; everything else (ordering,
dedup by seq, one ack per response, replay off the event loop, failure and
UNIMPLEMENTED handling, closing) lives here.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc

__all__ = ["SeqCursor", "SubscriptionStream", "native_decoder"]

_log = logging.getLogger("agentix.runtime.client")


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


def native_decoder(name: str) -> Callable[[bytes], Any]:
    """``_native_calls.<name>`` (``log_records`` / ``trace_events``: a
    serialized response read without protobuf, or None for bytes it leaves
    to protobuf), or, without the native module (the pure wheel), a function
    that leaves every message to protobuf."""
    try:
        from agentix.runtime.client import _native_calls
    except ImportError:
        return _leave_to_protobuf
    return getattr(_native_calls, name)


def _leave_to_protobuf(message: bytes) -> None:
    return None


class ReplayedOnce:
    """Which items of no call this process has replayed, by daemon instance
    and seq (the newest `capacity` of them). The daemon sends such an item to
    every client subscribed; several clients of one process replay it once."""

    def __init__(self, capacity: int = 65536) -> None:
        self._capacity = capacity
        self._seen: set[tuple[str, int]] = set()
        self._order: collections.deque[tuple[str, int]] = collections.deque()
        self._lock = threading.Lock()
        # Held from claiming an item to the end of its replay: two clients'
        # replay threads then hand items of no call over in the daemon's order
        # (one could otherwise claim seq n, be preempted, and let the other
        # replay n+1 first).
        self.replay_lock = threading.Lock()

    def first_time(self, instance_id: str, seq: int) -> bool:
        """True the first time (`instance_id`, `seq`) is asked for."""
        key = (instance_id, seq)
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            self._order.append(key)
            if len(self._order) > self._capacity:
                self._seen.discard(self._order.popleft())
            return True


class SeqCursor:
    """The seq of the last item a client has replayed (0: none yet) and the
    daemon instance that seq counts in. Shared by the client's successive
    streams of one kind, so a new one resumes where the last one stopped; a
    daemon that restarted (new instance id) numbers from 1 again, and the
    cursor follows."""

    __slots__ = ("last_seq", "instance_id")

    def __init__(self) -> None:
        self.last_seq = 0
        self.instance_id = ""

    def adopt(self, instance_id: str) -> None:
        """Switches to the numbering of `instance_id` if it is a new one; an
        empty id (a daemon that sends none) changes nothing."""
        if instance_id and instance_id != self.instance_id:
            if self.instance_id:
                self.last_seq = 0
            self.instance_id = instance_id


class SubscriptionStream:
    """Drives one open subscription RPC (``Logs`` or ``Traces``).

    It subscribes with ``cursor.last_seq`` and ``cursor.instance_id``, then
    for every response: adopts its instance id, replays (in a worker thread,
    in order) the items whose seq is above ``cursor.last_seq``, advancing the
    cursor past each, and writes one ack for the last seq replayed (none when
    the response held nothing new). An item whose replay raises is reported
    (the first one of a stream as a WARNING, later ones at DEBUG) and skipped.

    It runs as its own task and never raises into the client: UNIMPLEMENTED
    calls `on_unimplemented` once; any other end or failure just marks the
    stream not `alive` (the client re-opens it).

    Args:
      rpc: the stream-stream call object (`open_rpc`: responses arrive as
        bytes, which `_decode` reads).
      cursor: the client's cursor for this kind of item.
      on_unimplemented: called when the daemon answers UNIMPLEMENTED.
      previous: the stream this one replaces; this one subscribes only after
        `previous` has stopped, so items are never replayed concurrently or
        out of order.

    Subclasses set `rpc_name`, `noun` and implement `_subscribe_request`,
    `_ack_request`, `_decode`, `_batch_replayer` and `_describe`.
    """

    rpc_name = ""  # the RPC, for messages: "Logs"
    noun = ""  # one item, for messages: "sandbox log record"
    # Items of no call replayed by any stream of this kind in the process
    # (each subclass has its own).
    _replayed_once = ReplayedOnce()

    def __init__(
        self,
        rpc: grpc.aio.StreamStreamCall,
        cursor: SeqCursor,
        on_unimplemented: Callable[[], None],
        previous: SubscriptionStream | None = None,
    ) -> None:
        self._rpc = rpc
        self._cursor = cursor
        self._on_unimplemented = on_unimplemented
        self._previous = previous
        self._replaying: asyncio.Future | None = None
        # Futures of `wait_replayed` callers, woken after each replayed batch.
        self._waiters: list[asyncio.Future] = []
        # Loop time of the last response (see settle).
        self._last_activity = asyncio.get_running_loop().time()
        self._handler_failures = 0
        self._done = False
        self._task = asyncio.create_task(self._run(), name=f"agentix-{self.rpc_name.lower()}")

    # ── subclass hooks ──────────────────────────────────────────────

    def _subscribe_request(self, after_seq: int, instance_id: str) -> Any:
        raise NotImplementedError

    def _ack_request(self, seq: int) -> Any:
        raise NotImplementedError

    def _decode(self, message: bytes) -> tuple[str, Sequence[Any]]:
        """The instance id and the items (each with a ``seq`` and a
        ``call_id``) of one serialized response; raises (protobuf's
        DecodeError) for bytes that are not one, which ends the stream."""
        raise NotImplementedError

    def _describe(self, item: Any) -> str:
        """A short description of `item` for the failure report."""
        return ""

    def _batch_replayer(self) -> Callable[[Any], None]:
        """What replays the items of one response on the host, one call per
        item; asked for once per response, on the replay thread (a worker
        thread), so it may hold per-batch state."""
        raise NotImplementedError

    @classmethod
    def open_rpc(cls, channel: grpc.aio.Channel, metadata: tuple | None) -> grpc.aio.StreamStreamCall:
        """Opens `rpc_name` on `channel`. Its responses are not parsed by
        gRPC: `_decode` reads the bytes (natively when it can, which
        costs the host much less than protobuf's Python objects)."""
        method = f"/agentix.runtime.v1.RuntimeService/{cls.rpc_name}"
        return channel.stream_stream(method, request_serializer=_serialize, response_deserializer=None)(
            metadata=metadata)

    # ── driving the stream ──────────────────────────────────────────

    @property
    def alive(self) -> bool:
        """True until the stream has ended, failed or been closed."""
        return not self._done

    async def wait_replayed(self, seq: int, idle_timeout: float) -> bool:
        """Waits until every item up to `seq` has been replayed (the
        side-channel barrier of a call's result). Gives up when the stream
        ends or nothing is replayed for `idle_timeout` seconds; returns
        whether the cursor reached `seq`."""
        cursor = self._cursor
        loop = asyncio.get_running_loop()
        while cursor.last_seq < seq and not self._done:
            before = cursor.last_seq
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, idle_timeout)
            except TimeoutError:
                if cursor.last_seq == before:
                    break
        return cursor.last_seq >= seq

    async def settle(self, quiet: float, bound: float) -> None:
        """Waits until nothing has arrived for `quiet` seconds (what the
        sandbox emitted before has then been replayed: the daemon holds a
        record back at most a few milliseconds), at most `bound` seconds.
        Returns at once when the stream has ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound
        while not self._done:
            now = loop.time()
            idle = now - self._last_activity
            if self._replaying is None and idle >= quiet:
                return
            if now >= deadline:
                return
            await asyncio.sleep(min(max(quiet - idle, 0.005), deadline - now))

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def aclose(self) -> None:
        """Stops the stream and waits until no item of it is being replayed.
        Idempotent; never raises (except when the caller is cancelled)."""
        self._done = True
        self._rpc.cancel()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if self._previous is not None:  # closed before the previous stream had stopped
            await self._previous.aclose()
        if self._replaying is not None:
            await asyncio.gather(self._replaying, return_exceptions=True)

    async def _run(self) -> None:
        feed = self.noun.rsplit(" ", 1)[0]  # "sandbox log record" -> "sandbox log"
        try:
            if self._previous is not None:
                await self._previous.aclose()
                self._previous = None
            cursor = self._cursor
            await self._rpc.write(self._subscribe_request(cursor.last_seq, cursor.instance_id))
            acked = None
            read = self._rpc.read  # cheaper than the call's async iterator
            loop = asyncio.get_running_loop()
            while (response := await read()) is not grpc.aio.EOF:
                self._last_activity = loop.time()
                instance_id, items = self._decode(response)
                cursor.adopt(instance_id)
                if not items:
                    continue
                # The batch is replayed off the event loop; shielded so that a
                # close() in the middle still lets it finish (aclose waits).
                self._replaying = asyncio.ensure_future(asyncio.to_thread(self._replay_batch, items))
                await asyncio.shield(self._replaying)
                self._replaying = None
                if self._waiters:
                    self._wake_waiters()
                last = cursor.last_seq
                if last and last != acked:
                    await self._rpc.write(self._ack_request(last))
                    acked = last
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                _log.debug("the runtime does not implement %s; %ss are not replayed", self.rpc_name, self.noun)
                self._on_unimplemented()
            elif not self._done:
                _log.debug("%s stream lost (re-opened by the next call): %s", feed, error.code().name)
        except Exception as error:  # never let this stream disturb the client
            if not self._done:
                _log.debug("%s stream failed (re-opened by the next call): %r", feed, error)
        else:
            _log.debug("the runtime ended the %s stream (re-opened by the next call)", feed)
        finally:
            self._done = True
            self._wake_waiters()

    def _replay_batch(self, items: Sequence[Any]) -> None:
        """Replays, in order, the items not seen yet, advancing the cursor.
        An item whose replay raises is reported and skipped."""
        cursor = self._cursor
        replay = self._batch_replayer()
        once = self._replayed_once
        # Only this thread moves the cursor while a batch is replayed (the
        # loop awaits it), so its seq and instance are read once.
        instance_id = cursor.instance_id
        last = cursor.last_seq
        for item in items:
            seq = item.seq
            if seq <= last:
                continue
            if not item.call_id and instance_id:
                with once.replay_lock:
                    if once.first_time(instance_id, seq):
                        self._replay_one(replay, item)
            else:
                try:  # (_replay_one, inlined: the per-item path)
                    replay(item)
                except Exception:
                    self._report_failure(item)
            cursor.last_seq = last = seq  # replayed here or by another client

    def _replay_one(self, replay: Callable[[Any], None], item: Any) -> None:
        try:
            replay(item)
        except Exception:
            self._report_failure(item)

    def _report_failure(self, item: Any) -> None:
        # The first failure of a stream as a warning, later ones at debug: a
        # handler that always raises would otherwise double every item.
        self._handler_failures += 1
        try:
            _log.log(
                logging.WARNING if self._handler_failures == 1 else logging.DEBUG,
                "replaying %s %d (%s) failed; continuing with the next",
                self.noun,
                item.seq,
                self._describe(item),
                exc_info=True,
            )
        except Exception:  # the failing handler may be the one this goes to
            pass
