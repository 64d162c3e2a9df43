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

__all__ = ["ResponseDecoder", "SeqCursor", "SubscriptionStream", "lost_counts", "native_decoder"]

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


class ResponseDecoder:
    """Reads one serialized ``LogsResponse`` / ``TracesResponse``: the
    instance id and the items. The items are the native decoder's fields
    objects (``_native_calls.<native_name>``: attributes named and valued
    as the protobuf item's fields) when the package has its native module
    and the decoder reads the bytes, else protobuf's messages (the
    response's repeated field `items_field`); replay takes either. Bytes
    that are not such a response raise protobuf's DecodeError.

    `native` is the native decoder, looked up at first use (the native
    module loads grpc++); tests set it to ``lambda message: None`` to force
    protobuf's path."""

    __slots__ = ("_native_name", "_response_type", "_items_field", "native")

    def __init__(self, native_name: str, response_type: Any, items_field: str) -> None:
        self._native_name = native_name
        self._response_type = response_type
        self._items_field = items_field
        self.native: Callable[[bytes], tuple[str, list[Any]] | None] | None = None

    def __call__(self, message: bytes) -> tuple[str, Sequence[Any]]:
        native = self.native
        if native is None:
            native = self.native = native_decoder(self._native_name)
        decoded = native(message)
        if decoded is not None:
            return decoded
        response = self._response_type.FromString(message)
        return response.instance_id, getattr(response, self._items_field)


# Sandbox items this process could not hand over, by RPC ("Logs", "Traces")
# and reason (see lost_counts).
_lost: dict[str, dict[str, int]] = {}
_lost_lock = threading.Lock()


def lost_counts() -> dict[str, dict[str, int]]:
    """This process's count of what its subscriptions could not replay, by
    RPC (``"Logs"``, ``"Traces"``): ``undecodable_responses`` (responses
    that were no response of the RPC: their items are lost; the stream
    goes on with the next one) and ``failed_items`` (items whose replay
    raised, or whose batch could not be replayed at all). Each is also
    logged (see `SubscriptionStream`)."""
    with _lost_lock:
        return {rpc: dict(counts) for rpc, counts in _lost.items()}


def _count_lost(rpc: str, reason: str, n: int) -> int:
    """Adds `n` to a count of `lost_counts`; returns the new total."""
    with _lost_lock:
        counts = _lost.setdefault(rpc, {"undecodable_responses": 0, "failed_items": 0})
        counts[reason] += n
        return counts[reason]


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
    cursor past each, and acknowledges the last seq replayed (none when the
    response held nothing new). Acks are written beside the reads, never
    awaited before the next read: one ack write at a time, the newest seq
    once the previous write completes (acks are cumulative). Reading must not
    wait for an ack: once the daemon has ended the stream (RESOURCE_EXHAUSTED
    for a host that fell too far behind) a grpc.aio write fails and waits for
    the call's status, which gRPC delivers only after every response still
    buffered has been read, so awaiting it before reading hung the stream for
    good (docs/RELIABILITY.md, "stop-26: the stalled Logs stream"). An item
    whose replay raises is reported (the first one of a stream as a WARNING,
    later ones at DEBUG) and skipped;
    a batch that cannot be replayed at all is reported (ERROR, with the
    traceback) and skipped; a response that cannot be decoded is reported
    (ERROR with the traceback for a stream's first, WARNING for later ones)
    and skipped, and the stream goes on: ending it would have the next
    stream resubscribe, be sent the same bytes and fail again. All of them
    are counted in `lost_counts`.

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

    Subclasses set `rpc_name`, `noun`, `decoder` (a `ResponseDecoder`) and
    implement `_subscribe_request`, `_ack_request`, `_batch_replayer` and
    `_describe`.
    """

    rpc_name = ""  # the RPC, for messages: "Logs"
    noun = ""  # one item, for messages: "sandbox log record"
    decoder: ResponseDecoder  # reads a serialized response
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
        # The newest seq to acknowledge, and the task writing acks (see _acknowledge).
        self._ack_seq = 0
        self._ack_writer: asyncio.Task | None = None
        # Futures of `wait_replayed` callers, woken after each replayed batch.
        self._waiters: list[asyncio.Future] = []
        # Loop time of the last response (see settle).
        self._last_activity = asyncio.get_running_loop().time()
        self._handler_failures = 0
        self._undecodable = 0
        self._done = False
        # Ended by the daemon with RESOURCE_EXHAUSTED after replaying items:
        # this host fell behind (see feeds.Feed.wait_replayed).
        self.fell_behind = False
        self._task = asyncio.create_task(self._run(), name=f"agentix-{self.rpc_name.lower()}")

    # ── subclass hooks ──────────────────────────────────────────────

    def _subscribe_request(self, after_seq: int, instance_id: str) -> Any:
        raise NotImplementedError

    def _ack_request(self, seq: int) -> Any:
        raise NotImplementedError

    def _decode(self, message: bytes) -> tuple[str, Sequence[Any]]:
        """The instance id and the items (each with a ``seq`` and a
        ``call_id``) of one serialized response (`decoder`); raises
        (protobuf's DecodeError) for bytes that are not one."""
        return self.decoder(message)

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
        if self._ack_writer is not None:
            self._ack_writer.cancel()
            await asyncio.gather(self._ack_writer, return_exceptions=True)
        if self._previous is not None:  # closed before the previous stream had stopped
            await self._previous.aclose()
        if self._replaying is not None:
            await asyncio.gather(self._replaying, return_exceptions=True)

    async def _run(self) -> None:
        feed = self.noun.rsplit(" ", 1)[0]  # "sandbox log record" -> "sandbox log"
        acked = None
        try:
            if self._previous is not None:
                await self._previous.aclose()
                self._previous = None
            cursor = self._cursor
            await self._rpc.write(self._subscribe_request(cursor.last_seq, cursor.instance_id))
            read = self._rpc.read  # cheaper than the call's async iterator
            loop = asyncio.get_running_loop()
            while (response := await read()) is not grpc.aio.EOF:
                self._last_activity = loop.time()
                try:
                    instance_id, items = self._decode(response)
                except Exception as error:  # its items are lost; the stream goes on
                    self._report_undecodable(response, error)
                    continue
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
                    self._acknowledge(last)
                    acked = last
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                _log.debug("the runtime does not implement %s; %ss are not replayed", self.rpc_name, self.noun)
                self._on_unimplemented()
            elif error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not self._done:
                # This host fell too far behind: a daemon before stop 27 ends
                # the stream at 8 MiB unread, a later one when it stays paused
                # there reading nothing for --paused-subscriber-timeout-s. What
                # the daemon could not keep meanwhile is lost; the re-opened
                # stream's drop report says how many.
                self.fell_behind = acked is not None
                _log.warning("%s stream lost (re-opened at once by a call waiting for its records, else by the "
                             "next call): RESOURCE_EXHAUSTED, the runtime ended it because this host fell behind: "
                             "%s", feed, error.details())
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

    def _acknowledge(self, seq: int) -> None:
        """Has `seq` acknowledged without waiting: by the ack writer task,
        started when none is running (it writes the newest seq each time its
        last write completes)."""
        self._ack_seq = seq
        if self._ack_writer is None or self._ack_writer.done():
            self._ack_writer = asyncio.create_task(self._write_acks(), name=f"agentix-{self.rpc_name.lower()}-acks")

    async def _write_acks(self) -> None:
        written = 0
        try:
            while self._ack_seq != written and not self._done:
                seq = self._ack_seq
                await self._rpc.write(self._ack_request(seq))
                written = seq
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the stream ended or failed: its reader (_run) reports that
            _log.debug("%s ack not written: %r", self.rpc_name, error)

    def _replay_batch(self, items: Sequence[Any]) -> None:
        """Replays, in order, the items not seen yet, advancing the cursor.
        An item whose replay raises is reported and skipped."""
        cursor = self._cursor
        try:
            replay = self._batch_replayer()
        except Exception as error:  # none can be replayed: report them, go on
            self._report_batch_failure(items, error)
            return
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

    def _report_undecodable(self, message: bytes, error: Exception) -> None:
        """A response `_decode` refused: counted and logged (a stream's
        first at ERROR with the traceback, later ones at WARNING)."""
        self._undecodable += 1
        total = _count_lost(self.rpc_name, "undecodable_responses", 1)
        first = self._undecodable == 1
        try:
            _log.log(
                logging.ERROR if first else logging.WARNING,
                "a %s response of %d bytes could not be decoded (%s: %s); its %ss are lost, the stream goes on "
                "(%d such responses in this process)",
                self.rpc_name, len(message), type(error).__name__, error, self.noun, total,
                exc_info=error if first else None,
            )
        except Exception:  # a failing handler of this logger
            pass

    def _report_batch_failure(self, items: Sequence[Any], error: Exception) -> None:
        """A batch none of whose items could be replayed (its replayer
        raised): the new ones are counted, logged at ERROR, and skipped
        (the cursor moves past them: re-reading them would fail again)."""
        cursor = self._cursor
        fresh = [item.seq for item in items if item.seq > cursor.last_seq]
        if not fresh:
            return
        _count_lost(self.rpc_name, "failed_items", len(fresh))
        cursor.last_seq = max(fresh)
        try:
            _log.error("replaying %d %ss (seq %d..%d) failed; continuing with the next", len(fresh), self.noun,
                       min(fresh), max(fresh), exc_info=error)
        except Exception:  # a failing handler of this logger
            pass

    def _report_failure(self, item: Any) -> None:
        # The first failure of a stream as a warning, later ones at debug: a
        # handler that always raises would otherwise double every item.
        self._handler_failures += 1
        _count_lost(self.rpc_name, "failed_items", 1)
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
