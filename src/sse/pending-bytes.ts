import { FREE_BYTES, type BudgetShare } from './byte-budget.js';
import { EventEdges } from './event-edges.js';

/**
 * The bytes of one event (an NDJSON line, a JSON-array element) that spans
 * reads, copied because the caller may reuse its buffer after a push, up to
 * a cap. Over the cap, or when the buffer cannot grow within the request's
 * `share` of `limits.maxBufferedBytes`, the event is dropped: its bytes are let
 * go at once and `over` stays set (the framing skips to the event's end) until
 * `clear()`; with `keepEdges` its first and last bytes are kept as they pass (`edges`).
 *
 * One buffer that doubles as it fills, not a copy per piece: an upstream that
 * sends an event as 1-byte HTTP chunks hands over one piece per byte, and a
 * Buffer per piece cost ~150 bytes each (a 900 KB line: +140 MB, 1 s of CPU).
 */
export class PendingBytes {
  private store: Buffer | undefined;
  length = 0;
  over = false;
  /** With `keepEdges`: the first and last bytes of the event that went over the cap, until `clear()`. */
  edges: EventEdges | undefined;

  /**
   * @param keepEdges past the cap, keep the event's edges (see EventEdges) instead of nothing.
   * @param share the request's part of `limits.maxBufferedBytes` the buffer is counted in (none: not counted).
   */
  constructor(
    private readonly cap: number,
    private readonly keepEdges = false,
    private readonly share?: BudgetShare,
  ) {}

  /** Keeps `buf[from, to)`; true when this went over the cap or the budget (once per event). */
  add(buf: Buffer, from: number, to: number): boolean {
    if (this.over) {
      this.edges?.add(buf, from, to);
      return false;
    }
    if (to === from) return false;
    const need = this.length + (to - from);
    if (need > this.cap) return this.drop(buf, from, to);
    let store = this.store;
    if (store === undefined || store.length < need) {
      let size = Math.min(this.cap, Math.max(need, 2 * (store?.length ?? 0), 256));
      if (this.share !== undefined) {
        // Doubling must not take an event that fits the free part past it (40 KB + 10 KB: 80 KB).
        if (need <= FREE_BYTES && size > FREE_BYTES) size = FREE_BYTES;
        if (!this.share.take(size - (store?.length ?? 0), size)) return this.drop(buf, from, to);
      }
      const grown = Buffer.allocUnsafe(size);
      if (store !== undefined) store.copy(grown, 0, 0, this.length);
      this.store = store = grown;
    }
    buf.copy(store, this.length, from, to);
    this.length = need;
    return false;
  }

  /** The event goes over: what is held is let go, its edges kept with `keepEdges`. */
  private drop(buf: Buffer, from: number, to: number): true {
    if (this.keepEdges) {
      const edges = (this.edges = new EventEdges());
      if (this.store !== undefined) edges.add(this.store, 0, this.length);
      edges.add(buf, from, to);
    }
    this.letGo();
    this.over = true;
    return true;
  }

  private letGo(): void {
    if (this.store !== undefined) this.share?.give(this.store.length);
    this.store = undefined;
    this.length = 0;
  }

  /** The event's bytes so far, as one buffer (valid until `clear()` or the next `add`). */
  bytes(): Buffer {
    return this.store === undefined ? Buffer.alloc(0) : this.store.subarray(0, this.length);
  }

  /** Next event. */
  clear(): void {
    this.letGo();
    this.over = false;
    this.edges = undefined;
  }
}
