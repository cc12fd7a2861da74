/**
 * The bytes every stream together may hold of events still arriving (and of non-streamed
 * bodies read whole): `limits.maxBufferedBytes`. Each event is bounded by `limits.maxEventBytes`
 * alone, so without this, N streams of large events (generated images, audio) held N times that
 * and a few hundred of them could exhaust the heap. An event past the budget is read as one past
 * `maxEventBytes` is: forwarded whole, measured from its edges at most.
 *
 * An event's first `FREE_BYTES` are always granted (and counted): a token stream's event split
 * across reads is never left unread because other streams hold large ones.
 */
export class ByteBudget {
  /** Bytes held now, by all shares. */
  used = 0;

  /** @param onRefused called for each growth refused (a throttled log line). */
  constructor(
    readonly limit: number,
    private readonly onRefused?: () => void,
  ) {}

  /** One request's account: what it holds is given back at once by `close()`. */
  share(): BudgetShare {
    return new BudgetShare(this);
  }

  /** Whether `add` more bytes fit, for a buffer that would then be `size` bytes. */
  grant(add: number, size: number): boolean {
    if (size > FREE_BYTES && this.used + add > this.limit) {
      this.onRefused?.();
      return false;
    }
    this.used += add;
    return true;
  }
}

/** What one event may always hold, whatever the other streams hold. */
export const FREE_BYTES = 64 * 1024;

/**
 * One request's part of the budget. Its buffers give back what they let go of; `close()` gives
 * back the rest when the request ends, also for buffers never cleared (a stream cut mid-event),
 * and refuses anything after.
 */
export class BudgetShare {
  private held = 0;
  private closed = false;

  constructor(private readonly budget: ByteBudget) {}

  /** A buffer grows by `add` bytes to `size`: false when that does not fit (nothing is taken). */
  take(add: number, size: number): boolean {
    if (this.closed || !this.budget.grant(add, size)) return false;
    this.held += add;
    return true;
  }

  /** A buffer of `n` bytes was let go of. */
  give(n: number): void {
    const back = Math.min(n, this.held);
    this.held -= back;
    this.budget.used -= back;
  }

  close(): void {
    this.give(this.held);
    this.closed = true;
  }
}
