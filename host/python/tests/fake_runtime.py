"""An in-process stand-in for agentix-sandboxd's RuntimeService, for client tests.

It follows the contract in runtime.proto: reassembles chunked arguments, runs the
named function in-process, sends large results as ResultChunks plus a final
CallResult, answers CancelCall with a Cancelled error, and records every request
so tests can assert on what the client put on the wire. `scripts` replaces the
execution of a callable with canned events, for answers a real function cannot
provoke (worker death, malformed events).

`Logs` serves `log_records` (the daemon's buffer; `add_logs` appends and wakes
the open streams): on SubscribeLogs it sends the records with seq > after_seq
in responses of `log_batch` records, then live ones as they are added. Each
subscription's after_seq goes to `log_subscriptions` and each AckLogs seq to
`log_acks`. `logs_honour_after_seq = False` makes it replay the whole buffer on
every subscription (to test the host's dedup); `logs_implemented = False`
answers UNIMPLEMENTED like an older daemon.

`Traces` works the same way on `trace_events` (`add_traces`, `drop_traces`,
`trace_batch`, `trace_subscriptions` as (after_seq, instance_id) pairs,
`trace_acks`, `traces_opened`, `traces_honour_after_seq`,
`traces_implemented`). Every TracesResponse carries `instance_id`.
"""

import asyncio
import inspect
import pickle
import time
import traceback
from collections.abc import Callable

import grpc

from agentix.runtime.shared.callables import RemoteCallable
from agentix.runtime.v1 import runtime_pb2 as pb
from agentix.runtime.v1 import runtime_pb2_grpc as pb_grpc
from agentix.utils import context

CHUNK = 1 << 20


def error_event(call_id, type_, message, **fields):
    return pb.SandboxEvent(error=pb.CallError(call_id=call_id, error=pb.RemoteError(type=type_, message=message, **fields)))


def log_record(seq: int, message: str = "", **fields) -> pb.LogRecord:
    """A LogRecord with sensible defaults (logger "sandbox.test", INFO, origin LOGGING)."""
    fields.setdefault("logger", "sandbox.test")
    fields.setdefault("level", 20)
    fields.setdefault("level_name", "INFO")
    fields.setdefault("origin", pb.LOG_ORIGIN_LOGGING)
    return pb.LogRecord(seq=seq, message=message or f"record {seq}", **fields)


def trace_event(seq: int, kind: int, **fields) -> pb.TraceEvent:
    """A TraceEvent; ``attributes`` / ``error_data`` may be given as dicts."""
    for name in ("attributes", "error_data"):
        if isinstance(fields.get(name), dict):
            fields[name] = attributes(fields[name])
    return pb.TraceEvent(seq=seq, kind=kind, **fields)


def attributes(values: dict) -> list[pb.Attribute]:
    """Typed wire attributes for a dict of str/bool/int/float/bytes values."""
    out = []
    for key, value in values.items():
        if isinstance(value, bool):
            typed = pb.AttributeValue(bool_value=value)
        elif isinstance(value, int):
            typed = pb.AttributeValue(int_value=value)
        elif isinstance(value, float):
            typed = pb.AttributeValue(double_value=value)
        elif isinstance(value, bytes):
            typed = pb.AttributeValue(bytes_value=value)
        else:
            typed = pb.AttributeValue(string_value=str(value))
        out.append(pb.Attribute(key=key, value=typed))
    return out


def result_events(call_id, data: bytes) -> list[pb.SandboxEvent]:
    pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
    events = [pb.SandboxEvent(result_chunk=pb.ResultChunk(call_id=call_id, data=piece)) for piece in pieces[:-1]]
    events.append(
        pb.SandboxEvent(
            result=pb.CallResult(call_id=call_id, encoding=pb.ENCODING_PICKLE, value=pieces[-1], value_size=len(data))
        )
    )
    return events


class FakeRuntime(pb_grpc.RuntimeServiceServicer):
    def __init__(self) -> None:
        self.requests: list[pb.CallsRequest] = []
        self.scripts: dict[str, Callable[[pb.StartCall], list[pb.SandboxEvent]]] = {}
        self.started: dict[str, pb.StartCall] = {}
        self.streams_opened = 0
        self._drop_streams = asyncio.Event()
        self.log_records: list[pb.LogRecord] = []
        self.log_batch = 100
        self.log_subscriptions: list[int] = []
        self.log_acks: list[int] = []
        self.logs_opened = 0
        self.logs_implemented = True
        self.logs_honour_after_seq = True
        self._logs_changed = asyncio.Event()
        self._log_drops = 0
        self.instance_id = "fake-instance-1"
        self.trace_events: list[pb.TraceEvent] = []
        self.trace_batch = 100
        self.trace_subscriptions: list[tuple[int, str]] = []
        self.trace_acks: list[int] = []
        self.traces_opened = 0
        self.traces_implemented = True
        self.traces_honour_after_seq = True
        self._trace_drops = 0
        # Namespace streams: the host events received per namespace, the
        # open streams' outboxes, refusals (path -> (StatusCode, details)),
        # namespaces never confirmed, and an optional answer to host events.
        self.namespace_events: dict[str, list[pb.NamespaceEvent]] = {}
        self._namespace_outboxes: dict[str, list[asyncio.Queue]] = {}
        self.namespace_refusals: dict[str, tuple[grpc.StatusCode, str]] = {}
        self.namespace_silent: set[str] = set()
        # When set, a Namespace stream opened from now on is confirmed only
        # once this event is (a slow confirmation, under the test's control).
        self.namespace_gate: asyncio.Event | None = None
        self.namespace_answer: Callable[[str, pb.NamespaceEvent], list[pb.NamespaceEvent]] | None = None
        self.namespaces_opened = 0
        # GetInfo probes to answer UNAVAILABLE (a connection cut mid-probe).
        self.failing_probes = 0
        # A callable whose next StartCall drops its stream on arrival (a cut
        # in the middle of its upload: nothing of the call is answered there).
        self.drop_at_start: str | None = None

    def events(self, kind: str) -> list:
        """Every host event of `kind` received so far, in order."""
        return [getattr(e, kind) for r in self.requests for e in r.events if e.WhichOneof("kind") == kind]

    def drop_streams(self) -> None:
        """Aborts every open Calls stream with UNAVAILABLE (as a crashed connection would)."""
        self._drop_streams.set()

    def add_logs(self, *records: pb.LogRecord) -> None:
        """Appends records to the buffer; open Logs streams send them at once."""
        self.log_records.extend(records)
        self._wake_logs()

    def drop_logs(self) -> None:
        """Aborts every open Logs stream with UNAVAILABLE (Calls streams stay up)."""
        self._log_drops += 1
        self._wake_logs()

    def add_traces(self, *events: pb.TraceEvent) -> None:
        """Appends trace events to the buffer; open Traces streams send them at once."""
        self.trace_events.extend(events)
        self._wake_logs()

    def drop_traces(self) -> None:
        """Aborts every open Traces stream with UNAVAILABLE (other streams stay up)."""
        self._trace_drops += 1
        self._wake_logs()

    async def Traces(self, request_iterator, context_):
        self.traces_opened += 1
        if not self.traces_implemented:
            await context_.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        requests = request_iterator.__aiter__()
        first = await anext(requests)
        assert first.WhichOneof("kind") == "subscribe", "Traces must start with SubscribeTraces"
        self.trace_subscriptions.append((first.subscribe.after_seq, first.subscribe.instance_id))
        sent = first.subscribe.after_seq if self.traces_honour_after_seq else 0
        await self._feed(
            context_, requests, "trace", "Traces", sent,
            lambda events: pb.TracesResponse(events=events, instance_id=self.instance_id),
        )

    def _wake_logs(self) -> None:
        changed, self._logs_changed = self._logs_changed, asyncio.Event()
        changed.set()

    async def Logs(self, request_iterator, context_):
        self.logs_opened += 1
        if not self.logs_implemented:
            await context_.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        requests = request_iterator.__aiter__()
        first = await anext(requests)
        assert first.WhichOneof("kind") == "subscribe", "Logs must start with SubscribeLogs"
        after_seq = first.subscribe.after_seq
        self.log_subscriptions.append(after_seq)
        sent = after_seq if self.logs_honour_after_seq else 0
        await self._feed(context_, requests, "log", "Logs", sent, lambda records: pb.LogsResponse(records=records))

    async def _feed(self, context_, requests, kind: str, method: str, sent: int, response) -> None:
        """Serves a Logs (`kind` "log") or Traces ("trace") stream after its
        subscribe: records each Ack<method> in `<kind>_acks`, writes the items
        of `log_records` / `trace_events` past `sent` as `response(items)`
        messages of at most `<kind>_batch` items, then new ones as they are
        added, and aborts UNAVAILABLE once drop_<kind>s() is called."""
        items_attr = "log_records" if kind == "log" else "trace_events"
        acks = getattr(self, f"{kind}_acks")
        drops = getattr(self, f"_{kind}_drops")

        async def read_acks() -> None:
            async for request in requests:
                assert request.WhichOneof("kind") == "ack", f"only Ack{method} may follow Subscribe{method}"
                acks.append(request.ack.seq)

        reader = asyncio.create_task(read_acks())
        try:
            while True:
                changed = self._logs_changed
                if getattr(self, f"_{kind}_drops") != drops:
                    await context_.abort(grpc.StatusCode.UNAVAILABLE, f"fake runtime dropped the {kind} stream")
                due = [item for item in getattr(self, items_attr) if item.seq > sent]
                batch = getattr(self, f"{kind}_batch")
                for i in range(0, len(due), batch):
                    await context_.write(response(due[i : i + batch]))
                if due:
                    sent = due[-1].seq
                    continue
                await changed.wait()
        finally:
            reader.cancel()

    def emit_namespace(self, path: str, *events: pb.NamespaceEvent) -> None:
        """Sends `events` in one NamespaceResponse on every open stream of `path`."""
        for outbox in self._namespace_outboxes.get(path, []):
            outbox.put_nowait(pb.NamespaceResponse(namespace=path, events=events))

    def drop_namespaces(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, details: str = "dropped") -> None:
        """Ends every open Namespace stream with `code`."""
        for outboxes in self._namespace_outboxes.values():
            for outbox in outboxes:
                outbox.put_nowait((code, details))

    async def Namespace(self, request_iterator, context_):
        first = await context_.read()
        if first is grpc.aio.EOF or first.WhichOneof("kind") != "open":
            await context_.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message must be OpenNamespace")
        path = first.open.namespace
        if not path.startswith("/") or path in ("/", "/rpc", "/log", "/trace"):
            await context_.abort(grpc.StatusCode.INVALID_ARGUMENT, f"namespace {path!r} cannot be opened")
        if path in self.namespace_refusals:
            await context_.abort(*self.namespace_refusals[path])
        self.namespaces_opened += 1
        if path in self.namespace_silent:
            await asyncio.Event().wait()
        outbox: asyncio.Queue = asyncio.Queue()
        self._namespace_outboxes.setdefault(path, []).append(outbox)
        received = self.namespace_events.setdefault(path, [])

        async def read() -> None:
            while (request := await context_.read()) is not grpc.aio.EOF:
                received.append(request.event)
                if self.namespace_answer is not None:
                    answer = self.namespace_answer(path, request.event)
                    if answer:
                        outbox.put_nowait(pb.NamespaceResponse(namespace=path, events=answer))
            outbox.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            if (gate := self.namespace_gate) is not None:
                await gate.wait()
            await context_.write(pb.NamespaceResponse(namespace=path, opened=True, instance_id=self.instance_id))
            while (item := await outbox.get()) is not None:
                if isinstance(item, tuple):
                    await context_.abort(*item)
                await context_.write(item)
        finally:
            reader.cancel()
            self._namespace_outboxes[path].remove(outbox)

    async def GetInfo(self, request, context_):
        if self.failing_probes > 0:
            self.failing_probes -= 1
            await context_.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
        return pb.GetInfoResponse(status="ok", version="fake-1.0")

    async def Calls(self, request_iterator, context_):
        self.streams_opened += 1
        self._drop_streams.clear()
        outbox: asyncio.Queue = asyncio.Queue()
        running: dict[str, asyncio.Task] = {}
        uploads: dict[str, tuple[pb.StartCall, bytearray]] = {}

        def begin(start: pb.StartCall, arguments: bytes) -> None:
            self.started[start.call_id] = start
            running[start.call_id] = asyncio.create_task(self._run(start, arguments, outbox))

        async def read() -> None:
            async for request in request_iterator:
                self.requests.append(request)
                for event in request.events:
                    kind = event.WhichOneof("kind")
                    if kind == "start":
                        start = event.start
                        if start.callable == self.drop_at_start:
                            self.drop_at_start = None
                            self.drop_streams()
                        if start.call_id in running or start.call_id in uploads:
                            continue
                        if start.arguments_size > len(start.arguments):
                            uploads[start.call_id] = (start, bytearray(start.arguments))
                        else:
                            begin(start, start.arguments)
                    elif kind == "argument_chunk":
                        chunk = event.argument_chunk
                        assert len(chunk.data) <= CHUNK, "argument chunk over 1 MiB"
                        start, buffer = uploads[chunk.call_id]
                        buffer += chunk.data
                        if len(buffer) == start.arguments_size:
                            del uploads[chunk.call_id]
                            begin(start, bytes(buffer))
                    elif kind == "cancel":
                        task = running.get(event.cancel.call_id)
                        if task is not None:
                            task.cancel()

        # One send on the call at a time. grpc.aio's abort() sends the initial
        # metadata too while the first write() that carries them has not
        # completed; core then refuses the whole batch (TOO_MANY_OPERATIONS),
        # abort() raises ExecuteBatchError, no status is sent and the client's
        # stream stays open. A client that sees the first result before this
        # loop has seen that write complete (the native transport does) would
        # otherwise be left waiting by drop_streams().
        send_lock = asyncio.Lock()

        async def write() -> None:
            # Like the daemon: whatever is ready goes out in one message (up to ~2 MiB).
            while True:
                events = await outbox.get()
                while not outbox.empty() and sum(e.ByteSize() for e in events) < 2 * CHUNK:
                    events += outbox.get_nowait()
                async with send_lock:
                    if self._drop_streams.is_set():
                        return
                    await context_.write(pb.CallsResponse(events=events))

        tasks = [asyncio.create_task(read()), asyncio.create_task(write())]
        dropped = asyncio.create_task(self._drop_streams.wait())
        try:
            await asyncio.wait([tasks[0], dropped], return_when=asyncio.FIRST_COMPLETED)
            if dropped.done():
                async with send_lock:
                    await context_.abort(grpc.StatusCode.UNAVAILABLE, "fake runtime dropped the stream")
            while any(not t.done() for t in running.values()) or not outbox.empty():
                await asyncio.sleep(0.01)
        finally:
            for task in [*tasks, dropped, *running.values()]:
                task.cancel()

    async def _run(self, start: pb.StartCall, arguments: bytes, outbox: asyncio.Queue) -> None:
        call_id = start.call_id
        script = self.scripts.get(start.callable)
        if script is not None:
            for event in script(start):
                outbox.put_nowait([event])
            return
        try:
            fn = RemoteCallable(start.callable).resolve()
            args, kwargs = pickle.loads(arguments)
            carried = context.decode(start.context)
            if start.baggage:  # the plain carrier (StartCall.baggage), as the worker applies it
                carried = {**carried, "agentix_context_baggage": dict(start.baggage)}
            with context.attach(carried):
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
            events = result_events(call_id, pickle.dumps(value, protocol=5))
        except asyncio.CancelledError:
            events = [error_event(call_id, "Cancelled", "remote call cancelled", cancelled=True, code=1)]
        except Exception as exc:
            events = [error_event(call_id, type(exc).__name__, str(exc), traceback=traceback.format_exc(), code=2)]
        for event in events:
            outbox.put_nowait([event])


async def serve(fake: FakeRuntime, address: str):
    """Starts a grpc.aio server for `fake` on `address`; returns (server, port)."""
    server = grpc.aio.server()
    pb_grpc.add_RuntimeServiceServicer_to_server(fake, server)
    port = server.add_insecure_port(address)
    await server.start()
    return server, port


async def eventually(predicate, timeout=20.0):
    """Waits until predicate() is true; AssertionError after `timeout` s (generous:
    a loaded 2-core machine delays the fake runtime's reads by seconds)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)
