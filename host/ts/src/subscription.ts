// A resumable subscription to the Logs or Traces stream as an async iterator.
// Records are acknowledged once the caller has pulled them; a broken stream is
// re-opened with the last seq seen, so nothing is delivered twice or lost
// (within the daemon's buffer).
import * as grpc from "@grpc/grpc-js";
import { ConnectionError } from "./errors";
import { Backoff, ReconnectPolicy, sleep } from "./retry";
import { isPermanent } from "./wire";

export interface SubscribeOptions {
  /** Resume after this seq (0: everything still buffered). */
  afterSeq?: number;
  /** The daemon instance afterSeq counts in (from a previous subscription). */
  instanceId?: string;
}

export interface StreamKind<T> {
  open(): grpc.ClientDuplexStream<any, any>;
  subscribe(afterSeq: number, instanceId: string): object;
  ack(seq: number): object;
  items(response: any): any[];
  convert(raw: any): T;
}

export class Subscription<T extends { seq: number }> implements AsyncIterableIterator<T> {
  private stream: grpc.ClientDuplexStream<any, any> | null = null;
  private readonly queue: T[] = [];
  private waiter: ((r: IteratorResult<T>) => void) | null = null;
  private failer: ((e: Error) => void) | null = null;
  private failure: Error | null = null;
  private closed = false;
  private lastSeq: number;
  private instanceId: string;
  private ackedSeq = 0;
  private ackScheduled = false;
  private backoff: Backoff | null = null;
  private highestSeen = 0;
  private readonly closeListeners: (() => void)[] = [];

  constructor(private readonly kind: StreamKind<T>, private readonly policy: ReconnectPolicy,
              options: SubscribeOptions) {
    this.lastSeq = options.afterSeq ?? 0;
    this.highestSeen = this.lastSeq;
    this.instanceId = options.instanceId ?? "";
    this.open();
  }

  /** The daemon instance the seqs count in (set once the first batch arrived). */
  get instance(): string { return this.instanceId; }
  /** The seq of the last record handed to the caller. */
  get seq(): number { return this.lastSeq; }

  private open(): void {
    const stream = this.kind.open();
    this.stream = stream;
    stream.on("data", (response: any) => {
      this.backoff = null;
      if (response.instance_id && response.instance_id !== this.instanceId) {
        // A restarted daemon counts from 1 again.
        if (this.instanceId !== "") this.highestSeen = 0;
        this.instanceId = response.instance_id;
      }
      for (const raw of this.kind.items(response)) {
        const item = this.kind.convert(raw);
        if (item.seq <= this.highestSeen) continue;  // already queued or handed out
        this.highestSeen = item.seq;
        this.push(item);
      }
    });
    stream.on("error", (err: grpc.ServiceError) => this.broken(stream, err));
    stream.on("end", () => this.broken(stream, null));
    stream.write(this.kind.subscribe(this.lastSeq, this.instanceId));
  }

  private push(item: T): void {
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null; this.failer = null;
      this.delivered(item);
      w({ value: item, done: false });
    } else {
      this.queue.push(item);
    }
  }

  private delivered(item: T): void {
    this.lastSeq = item.seq;
    if (!this.ackScheduled) {
      this.ackScheduled = true;
      setImmediate(() => {
        this.ackScheduled = false;
        if (this.lastSeq > this.ackedSeq && this.stream && !this.closed) {
          this.ackedSeq = this.lastSeq;
          this.stream.write(this.kind.ack(this.lastSeq));
        }
      });
    }
  }

  private broken(stream: grpc.ClientDuplexStream<any, any>, err: grpc.ServiceError | null): void {
    if (stream !== this.stream || this.closed) return;
    this.stream = null;
    if (err && isPermanent(err.code)) {
      this.fail(new ConnectionError(err.details || err.message, err.code));
      return;
    }
    // One budget per outage: it is reset by the first batch after a reopen.
    this.backoff ??= new Backoff(this.policy);
    const delay = this.backoff.nextDelay();
    if (delay === null) {
      this.fail(new ConnectionError(`subscription lost: ${err?.details ?? "stream ended"}`,
                                    err?.code ?? grpc.status.UNAVAILABLE));
      return;
    }
    void sleep(delay).then(() => {
      if (this.closed) return;
      // Records queued but not pulled are re-sent after lastSeq: drop them so
      // each arrives once.
      this.queue.length = 0;
      this.highestSeen = this.lastSeq;
      this.open();
    });
  }

  private fail(error: Error): void {
    this.failure = error;
    if (this.failer) {
      const f = this.failer;
      this.waiter = null; this.failer = null;
      f(error);
    }
  }

  next(): Promise<IteratorResult<T>> {
    const item = this.queue.shift();
    if (item !== undefined) {
      this.delivered(item);
      return Promise.resolve({ value: item, done: false });
    }
    if (this.failure) return Promise.reject(this.failure);
    if (this.closed) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => { this.waiter = resolve; this.failer = reject; });
  }

  /** Ends the subscription (also what `break` in a for-await loop does). */
  return(): Promise<IteratorResult<T>> {
    this.close();
    return Promise.resolve({ value: undefined, done: true });
  }

  /** Runs `listener` once the subscription is closed. */
  onClose(listener: () => void): void {
    this.closeListeners.push(listener);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const listener of this.closeListeners.splice(0)) listener();
    if (this.stream) {
      if (this.lastSeq > this.ackedSeq) this.stream.write(this.kind.ack(this.lastSeq));
      this.stream.cancel();
      this.stream = null;
    }
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null; this.failer = null;
      w({ value: undefined, done: true });
    }
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<T> { return this; }
}
