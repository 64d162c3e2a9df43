// How long and how often the client reconnects after a broken stream.

export interface ReconnectPolicy {
  /** Give up (fail what waits with ConnectionError) after this long. Default 30 s. */
  maxElapsedMs: number;
  /** First delay; doubles up to maxDelayMs. Defaults 50 ms and 2 s. */
  initialDelayMs: number;
  maxDelayMs: number;
}

export const DEFAULT_RECONNECT: ReconnectPolicy = { maxElapsedMs: 30_000, initialDelayMs: 50, maxDelayMs: 2_000 };

/** One outage: the delays to wait between attempts, until the budget runs out. */
export class Backoff {
  private readonly started = Date.now();
  private next: number;
  constructor(private readonly policy: ReconnectPolicy) {
    this.next = policy.initialDelayMs;
  }
  /** The next delay in ms, or null when the budget is spent. */
  nextDelay(): number | null {
    const elapsed = Date.now() - this.started;
    if (elapsed >= this.policy.maxElapsedMs) return null;
    const delay = Math.min(this.next, this.policy.maxElapsedMs - elapsed);
    this.next = Math.min(this.next * 2, this.policy.maxDelayMs);
    return delay;
  }
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
