/**
 * The bytes of one event (an NDJSON line, a JSON-array element) that spans
 * reads, copied because the caller may reuse its buffer after a push, up to
 * a cap. Over the cap the event is dropped: its bytes are let go at once and
 * `over` stays set (the framing skips to the event's end) until `clear()`.
 */
export class PendingBytes {
  private parts: Buffer[] = [];
  length = 0;
  over = false;

  constructor(private readonly cap: number) {}

  /** Keeps `buf[from, to)`; true when this went over the cap (once per event). */
  add(buf: Buffer, from: number, to: number): boolean {
    if (this.over || to === from) return false;
    if (this.length + (to - from) > this.cap) {
      this.parts = [];
      this.length = 0;
      this.over = true;
      return true;
    }
    this.parts.push(Buffer.from(buf.subarray(from, to)));
    this.length += to - from;
    return false;
  }

  /** The event's bytes so far, as one buffer. */
  bytes(): Buffer {
    return Buffer.concat(this.parts, this.length);
  }

  /** Next event. */
  clear(): void {
    this.parts = [];
    this.length = 0;
    this.over = false;
  }
}
