// RuntimeClient: runs Python callables in a sandbox over agentix-sandboxd's
// gRPC wire (proto/agentix/runtime/v1/runtime.proto), with msgpack values.
//
// Every call of one client shares one `Calls` stream. When that stream breaks
// the client reconnects (ReconnectPolicy), sends again the StartCall of every
// call it still awaits — the daemon runs a known call_id at most once — and
// then ResumeCalls, so each call runs once and its result arrives once.
import { randomBytes } from "crypto";
import * as grpc from "@grpc/grpc-js";
import { decodeValue, encodeArguments } from "./codec";
import { ConnectionError, DeadlineExceeded, RemoteError } from "./errors";
import { LogRecord, TraceEvent, toLogRecord, toTraceEvent } from "./records";
import { Backoff, DEFAULT_RECONNECT, ReconnectPolicy } from "./retry";
import { StreamKind, SubscribeOptions, Subscription } from "./subscription";
import { RuntimeStub, isPermanent, makeStub } from "./wire";

/** Arguments travel in pieces of this size (the wire's recommended chunk). */
const CHUNK_BYTES = 1 << 20;
const ENCODING_MSGPACK = "ENCODING_MSGPACK";

export interface ConnectOptions {
  /** Bearer token the daemon was started with (--token-file / $AGENTIX_TOKEN). */
  token?: string;
  /** TLS: PEM root certificates to trust (and optional client key/cert). */
  tls?: { rootCerts?: Buffer; privateKey?: Buffer; certChain?: Buffer };
  /** Names this client to the daemon (agentix-client-id); a random id by default. */
  clientId?: string;
  reconnect?: Partial<ReconnectPolicy>;
  /** Extra gRPC channel options. The receive limit is left at gRPC's default (4 MiB). */
  channelOptions?: grpc.ChannelOptions;
}

export interface CallOptions {
  /** Abort to cancel the call in the sandbox; it then rejects with RemoteError type "Cancelled". */
  signal?: AbortSignal;
  /** Cancel the call in the sandbox and reject with DeadlineExceeded after this long. */
  timeoutMs?: number;
  /** Keyword arguments. */
  kwargs?: Record<string, unknown>;
  /** W3C trace parent ("00-<32 hex>-<16 hex>-<2 hex>"): spans the call opens join that
   * trace under that span. A malformed one rejects with RemoteError type "BadRequest". */
  traceparent?: string;
  /** W3C tracestate sent with `traceparent`; only an "agentix=<24 hex>" entry is read. */
  tracestate?: string;
  /** String baggage: `agentix.context.get(key)` in the sandbox. */
  baggage?: Record<string, string>;
}

export interface StreamOptions extends CallOptions {
  /** Items the sandbox may produce ahead of the consumer (back-pressure). Default 16. */
  window?: number;
}

export interface Info {
  status: string;
  version: string;
  workerPid: number;
  workersStarted: number;
  callsInFlight: number;
  callsQueued: number;
  namespaceStreams: number;
}

interface PendingCall {
  callId: string;
  callable: string;
  arguments: Uint8Array;
  streamWindow: number;
  traceparent: string;
  tracestate: string;
  baggage: Record<string, string>;
  resultChunks: Buffer[];
  onResult(value: unknown): void;
  onError(error: Error): void;
  onItem?(index: number, value: unknown): void;
  cleanup(): void;
}

export class RuntimeClient {
  private readonly stub: RuntimeStub;
  private readonly metadata: grpc.Metadata;
  private readonly policy: ReconnectPolicy;
  private readonly pending = new Map<string, PendingCall>();
  private calls: grpc.ClientDuplexStream<any, any> | null = null;
  private outbox: object[] = [];
  private flushScheduled = false;
  private backoff: Backoff | null = null;
  private reconnectTimer: NodeJS.Timeout | null = null;
  private closed = false;
  private readonly subscriptions = new Set<Subscription<any>>();

  /** Connects lazily: "unix:///path/to/sandboxd.sock" or "host:port". */
  constructor(readonly address: string, options: ConnectOptions = {}) {
    const target = address.startsWith("unix://") || address.includes(":") ? address : `unix://${address}`;
    const credentials = options.tls
      ? grpc.credentials.createSsl(options.tls.rootCerts ?? null, options.tls.privateKey ?? null,
                                   options.tls.certChain ?? null)
      : grpc.credentials.createInsecure();
    this.stub = makeStub(target, credentials, options.channelOptions ?? {});
    this.metadata = new grpc.Metadata();
    this.metadata.set("agentix-client-id", options.clientId ?? randomBytes(16).toString("hex"));
    if (options.token) this.metadata.set("authorization", `Bearer ${options.token}`);
    this.policy = { ...DEFAULT_RECONNECT, ...options.reconnect };
  }

  /** Calls `callable` ("module::qualname" or "module.qualname") and resolves with its return value. */
  remote<R = unknown>(callable: string, args: readonly unknown[] = [], options: CallOptions = {}): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      this.start(callable, args, options, 0, {
        onResult: (value) => resolve(value as R),
        onError: reject,
      });
    });
  }

  /** A typed handle: `const add = client.fn<[number, number], number>("tasks::add")`. */
  fn<A extends readonly unknown[], R>(callable: string): (...args: A) => Promise<R> {
    return (...args: A) => this.remote<R>(callable, args);
  }

  /**
   * Calls a generator (or a callable returning an iterator) and yields its
   * items in order. At most `window` items are produced ahead of the loop
   * body; leaving the loop early cancels the call in the sandbox.
   */
  remoteStream<T = unknown>(callable: string, args: readonly unknown[] = [],
                            options: StreamOptions = {}): AsyncIterableIterator<T> {
    const window = options.window ?? 16;
    const items: T[] = [];
    let next = 0;           // index of the next item expected from the daemon
    let consumed = 0;       // items handed to the loop body
    let finished = false;
    let failure: Error | null = null;
    let wake: (() => void) | null = null;
    const notify = () => { const w = wake; wake = null; w?.(); };
    const callId = this.start(callable, args, options, window, {
      onResult: () => { finished = true; notify(); },
      onError: (e) => { failure = e; finished = true; notify(); },
      onItem: (index, value) => {
        if (index < next) return;  // re-sent after a reconnect
        next = index + 1;
        items.push(value as T);
        notify();
      },
    });
    const client = this;
    const iterator: AsyncIterableIterator<T> = {
      async next(): Promise<IteratorResult<T>> {
        for (;;) {
          if (items.length > 0) {
            const value = items.shift() as T;
            consumed++;
            client.queue({ stream_ack: { call_id: callId, next_index: consumed } });
            return { value, done: false };
          }
          if (failure) throw failure;
          if (finished) return { value: undefined, done: true };
          await new Promise<void>((resolve) => { wake = resolve; });
        }
      },
      async return(): Promise<IteratorResult<T>> {
        if (!finished) client.cancel(callId);
        finished = true;
        return { value: undefined, done: true };
      },
      [Symbol.asyncIterator]() { return iterator; },
    };
    return iterator;
  }

  /** The sandbox's log records, resumable; `break` ends the subscription. */
  logs(options: SubscribeOptions = {}): Subscription<LogRecord> {
    const kind: StreamKind<LogRecord> = {
      open: () => this.stub.Logs(this.metadata),
      subscribe: (after_seq, instance_id) => ({ subscribe: { after_seq, instance_id } }),
      ack: (seq) => ({ ack: { seq } }),
      items: (response) => response.records ?? [],
      convert: toLogRecord,
    };
    return this.track(new Subscription(kind, this.policy, options));
  }

  /** The sandbox's trace and span lifecycle events, resumable. */
  traces(options: SubscribeOptions = {}): Subscription<TraceEvent> {
    const kind: StreamKind<TraceEvent> = {
      open: () => this.stub.Traces(this.metadata),
      subscribe: (after_seq, instance_id) => ({ subscribe: { after_seq, instance_id } }),
      ack: (seq) => ({ ack: { seq } }),
      items: (response) => response.events ?? [],
      convert: toTraceEvent,
    };
    return this.track(new Subscription(kind, this.policy, options));
  }

  private track<T extends { seq: number }>(subscription: Subscription<T>): Subscription<T> {
    this.subscriptions.add(subscription);
    subscription.onClose(() => this.subscriptions.delete(subscription));
    return subscription;
  }

  /** The daemon's version and worker state. */
  info(timeoutMs = 10_000): Promise<Info> {
    return new Promise((resolve, reject) => {
      this.stub.GetInfo({}, this.metadata, { deadline: Date.now() + timeoutMs }, (err, r) => {
        if (err) { reject(new ConnectionError(err.details || err.message, err.code)); return; }
        resolve({
          status: r.status, version: r.version, workerPid: Number(r.worker_pid),
          workersStarted: Number(r.workers_started), callsInFlight: Number(r.calls_in_flight),
          callsQueued: Number(r.calls_queued), namespaceStreams: Number(r.namespace_streams),
        });
      });
    });
  }

  /** Fails what still waits with ConnectionError, ends subscriptions and closes the channel. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    this.failAll(new ConnectionError("client closed", grpc.status.CANCELLED));
    for (const subscription of [...this.subscriptions]) subscription.close();
    this.calls?.cancel();
    this.calls = null;
    this.stub.close();
  }

  // ---- calls ----------------------------------------------------------------

  private start(callable: string, args: readonly unknown[], options: CallOptions, streamWindow: number,
                handlers: Pick<PendingCall, "onResult" | "onError" | "onItem">): string {
    const callId = randomBytes(16).toString("hex");
    if (this.closed) {
      handlers.onError(new ConnectionError("client closed", grpc.status.CANCELLED));
      return callId;
    }
    let encoded: Uint8Array;
    try {
      encoded = encodeArguments(args, options.kwargs ?? {});
    } catch (e) {
      handlers.onError(new TypeError(`arguments of ${callable} have no msgpack form: ${(e as Error).message}`));
      return callId;
    }
    let timer: NodeJS.Timeout | null = null;
    let abort: (() => void) | null = null;
    const call: PendingCall = {
      callId, callable: callable.includes("::") ? callable : splitCallable(callable),
      arguments: encoded, streamWindow, resultChunks: [],
      traceparent: options.traceparent ?? "", tracestate: options.tracestate ?? "",
      baggage: options.baggage ?? {},
      onResult: handlers.onResult, onError: handlers.onError, onItem: handlers.onItem,
      cleanup: () => {
        if (timer) clearTimeout(timer);
        if (abort) options.signal?.removeEventListener("abort", abort);
      },
    };
    if (options.signal) {
      if (options.signal.aborted) {
        handlers.onError(new RemoteError({ type: "Cancelled", message: "aborted before it started",
          traceback: "", cancelled: true, code: grpc.status.CANCELLED, typeModule: "", typeQualname: "" }));
        return callId;
      }
      abort = () => this.cancel(callId);
      options.signal.addEventListener("abort", abort, { once: true });
    }
    if (options.timeoutMs !== undefined) {
      timer = setTimeout(() => {
        if (!this.pending.has(callId)) return;
        this.cancel(callId);
        this.settle(callId)?.onError(new DeadlineExceeded(call.callable, options.timeoutMs as number));
      }, options.timeoutMs);
    }
    this.pending.set(callId, call);
    if (this.calls || !this.backoff) this.send(call);  // else: sent on reconnect
    return callId;
  }

  /** Asks the sandbox to cancel; the call then ends with CallError "Cancelled". */
  private cancel(callId: string): void {
    if (this.pending.has(callId)) this.queue({ cancel: { call_id: callId } });
  }

  /** Sends a call's StartCall and the rest of its arguments in 1 MiB pieces. */
  private send(call: PendingCall): void {
    const stream = this.ensureCalls();
    const size = call.arguments.length;
    const first = call.arguments.subarray(0, Math.min(size, CHUNK_BYTES));
    this.flush();  // keep queued acks/cancels ahead of this call
    stream.write({ events: [{ start: {
      call_id: call.callId, callable: call.callable, encoding: ENCODING_MSGPACK,
      arguments: Buffer.from(first.buffer, first.byteOffset, first.byteLength),
      arguments_size: size, stream_window: call.streamWindow,
      traceparent: call.traceparent, tracestate: call.tracestate, baggage: call.baggage,
    } }] });
    if (size > CHUNK_BYTES) void this.upload(stream, call);
  }

  private async upload(stream: grpc.ClientDuplexStream<any, any>, call: PendingCall): Promise<void> {
    for (let offset = CHUNK_BYTES; offset < call.arguments.length; offset += CHUNK_BYTES) {
      if (stream !== this.calls || !this.pending.has(call.callId)) return;  // resent on reconnect
      const piece = call.arguments.subarray(offset, offset + CHUNK_BYTES);
      const ok = stream.write({ events: [{ argument_chunk: {
        call_id: call.callId, data: Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength), offset,
      } }] });
      if (!ok) await new Promise<void>((resolve) => {
        const done = () => { stream.off("drain", done); stream.off("close", done); resolve(); };
        stream.on("drain", done); stream.on("close", done);
      });
    }
  }

  private ensureCalls(): grpc.ClientDuplexStream<any, any> {
    if (this.calls) return this.calls;
    const stream = this.stub.Calls(this.metadata);
    this.calls = stream;
    stream.on("data", (response: any) => {
      this.backoff = null;
      for (const event of response.events ?? []) this.onEvent(event);
    });
    stream.on("error", (err: grpc.ServiceError) => this.onBroken(stream, err));
    stream.on("end", () => this.onBroken(stream, null));
    return stream;
  }

  private onEvent(event: any): void {
    switch (event.kind) {
      case "result_chunk": {
        const call = this.pending.get(event.result_chunk.call_id);
        call?.resultChunks.push(event.result_chunk.data);
        return;
      }
      case "stream_item": {
        const item = event.stream_item;
        const call = this.pending.get(item.call_id);
        if (!call?.onItem) return;
        let value: unknown;
        try {
          value = decodeValue(item.value);
        } catch (e) {
          this.cancel(call.callId);
          this.settle(call.callId)?.onError(decodeError(call.callable, e));
          return;
        }
        call.onItem(Number(item.index), value);
        return;
      }
      case "result": {
        const r = event.result;
        this.queue({ ack: { call_id: r.call_id } });
        const call = this.settle(r.call_id);
        if (!call) return;  // a re-sent result of a call already settled
        const bytes = call.resultChunks.length === 0 ? r.value : Buffer.concat([...call.resultChunks, r.value]);
        let value: unknown;
        try {
          value = bytes.length === 0 ? null : decodeValue(bytes);
        } catch (e) {
          call.onError(decodeError(call.callable, e));
          return;
        }
        call.onResult(value);
        return;
      }
      case "error": {
        const { call_id, error } = event.error;
        if (call_id === "") return;  // a malformed message of ours; its call ends on its own
        this.queue({ ack: { call_id } });
        this.settle(call_id)?.onError(new RemoteError({
          type: error.type, message: error.message, traceback: error.traceback,
          cancelled: error.cancelled, returncode: error.returncode ?? undefined, code: error.code,
          typeModule: error.type_module, typeQualname: error.type_qualname,
        }));
        return;
      }
    }
  }

  private settle(callId: string): PendingCall | undefined {
    const call = this.pending.get(callId);
    if (!call) return undefined;
    this.pending.delete(callId);
    call.cleanup();
    return call;
  }

  private failAll(error: Error): void {
    for (const id of [...this.pending.keys()]) this.settle(id)?.onError(error);
  }

  private onBroken(stream: grpc.ClientDuplexStream<any, any>, err: grpc.ServiceError | null): void {
    if (stream !== this.calls) return;
    this.calls = null;
    this.outbox = [];  // acks and cancels die with the stream; resume re-sends what matters
    if (this.closed) return;
    if (err && isPermanent(err.code)) {
      this.failAll(new ConnectionError(err.details || err.message, err.code));
      return;
    }
    if (this.pending.size === 0) return;  // nothing waits: reopen on the next call
    this.backoff ??= new Backoff(this.policy);
    const delay = this.backoff.nextDelay();
    if (delay === null) {
      this.backoff = null;
      this.failAll(new ConnectionError(
        `lost the connection to ${this.address}: ${err?.details ?? "stream ended"}`,
        err?.code ?? grpc.status.UNAVAILABLE));
      return;
    }
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      if (this.closed || this.pending.size === 0) { this.backoff = null; return; }
      this.resume();
    }, delay);
  }

  /** Re-sends every awaited call (run at most once by the daemon), then resumes them. */
  private resume(): void {
    const ids: string[] = [];
    for (const call of this.pending.values()) {
      call.resultChunks = [];
      this.send(call);
      ids.push(call.callId);
    }
    this.calls?.write({ events: [{ resume: { call_ids: ids } }] });
  }

  /** Queues a small event; queued events leave together on the next turn. */
  private queue(event: object): void {
    this.outbox.push(event);
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    setImmediate(() => { this.flushScheduled = false; this.flush(); });
  }

  private flush(): void {
    if (this.outbox.length === 0 || !this.calls) return;
    const events = this.outbox;
    this.outbox = [];
    this.calls.write({ events });
  }
}

function splitCallable(dotted: string): string {
  // "pkg.mod.func" -> "pkg.mod::func"; the daemon wants module::qualname.
  const at = dotted.lastIndexOf(".");
  return at < 0 ? dotted : `${dotted.slice(0, at)}::${dotted.slice(at + 1)}`;
}

function decodeError(callable: string, e: unknown): RemoteError {
  return new RemoteError({
    type: "ResultDecodeError", message: `the result of ${callable} is not valid msgpack: ${(e as Error).message}`,
    traceback: "", cancelled: false, code: grpc.status.DATA_LOSS, typeModule: "", typeQualname: "",
  });
}


