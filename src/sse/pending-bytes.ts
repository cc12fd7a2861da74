import { EventEdges } from './event-edges.js';

/**
 * The bytes of one event (an NDJSON line, a JSON-array element) that spans
 * reads, copied because the caller may reuse its buffer after a push, up to
 * a cap. Over the cap the event is dropped: its bytes are let go at once and
 * `over` stays set (the framing skips to the event's end) until `clear()`;
 * with `keepEdges` its first and last bytes are kept as they pass (`edges`).
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

  /** @param keepEdges past the cap, keep the event's edges (see EventEdges) instead of nothing. */
  constructor(
    private readonly cap: number,
    private readonly keepEdges = false,
  ) {}

  /** Keeps `buf[from, to)`; true when this went over the cap (once per event). */
  add(buf: Buffer, from: number, to: number): boolean {
    if (this.over) {
      this.edges?.add(buf, from, to);
      return false;
    }
    if (to === from) return false;
    const need = this.length + (to - from);
    if (need > this.cap) {
      if (this.keepEdges) {
        const edges = (this.edges = new EventEdges());
        if (this.store !== undefined) edges.add(this.store, 0, this.length);
        edges.add(buf, from, to);
      }
      this.store = undefined;
      this.length = 0;
      this.over = true;
      return true;
    }
    let store = this.store;
    if (store === undefined || store.length < need) {
      const grown = Buffer.allocUnsafe(Math.min(this.cap, Math.max(need, 2 * (store?.length ?? 0), 256)));
      if (store !== undefined) store.copy(grown, 0, 0, this.length);
      this.store = store = grown;
    }
    buf.copy(store, this.length, from, to);
    this.length = need;
    return false;
  }

  /** The event's bytes so far, as one buffer (valid until `clear()` or the next `add`). */
  bytes(): Buffer {
    return this.store === undefined ? Buffer.alloc(0) : this.store.subarray(0, this.length);
  }

  /** Next event. */
  clear(): void {
    this.store = undefined;
    this.length = 0;
    this.over = false;
    this.edges = undefined;
  }
}
