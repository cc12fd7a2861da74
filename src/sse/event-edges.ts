/**
 * The first and last bytes of one event too large to keep whole (over `limits.maxEventBytes`),
 * gathered as its pieces pass: a finished response's status comes first and its totals come last
 * (a Responses `response.completed` that repeats a generated image, Ollama's last line with the
 * conversation's `context`), so an adapter can still read them without the event held whole.
 * At most HEAD + TAIL bytes, and only while such an event passes.
 */
export class EventEdges {
  static readonly HEAD = 1024;
  static readonly TAIL = 64 * 1024;

  private readonly headBuf = Buffer.allocUnsafe(EventEdges.HEAD);
  private headLen = 0;
  /** The last TAIL bytes, as a ring: `at` is where the next byte goes. */
  private readonly ring = Buffer.allocUnsafe(EventEdges.TAIL);
  private at = 0;
  /** Bytes added in all. */
  total = 0;

  add(buf: Buffer, from: number, to: number): void {
    const n = to - from;
    if (n <= 0) return;
    const HEAD = EventEdges.HEAD;
    const TAIL = EventEdges.TAIL;
    if (this.headLen < HEAD) {
      const k = Math.min(HEAD - this.headLen, n);
      buf.copy(this.headBuf, this.headLen, from, from + k);
      this.headLen += k;
    }
    this.total += n;
    if (n >= TAIL) {
      buf.copy(this.ring, 0, to - TAIL, to);
      this.at = 0;
      return;
    }
    const first = Math.min(n, TAIL - this.at);
    buf.copy(this.ring, this.at, from, from + first);
    if (first < n) buf.copy(this.ring, 0, from + first, to);
    this.at = (this.at + n) % TAIL;
  }

  /** The first bytes (up to HEAD), decoded; a character cut at the edge becomes U+FFFD. */
  head(): string {
    return this.headBuf.toString('utf8', 0, this.headLen);
  }

  /** The last bytes (up to TAIL), in order, decoded; a character cut at the edge becomes U+FFFD. */
  tail(): string {
    const TAIL = EventEdges.TAIL;
    if (this.total < TAIL) return this.ring.toString('utf8', 0, this.total);
    return Buffer.concat([this.ring.subarray(this.at), this.ring.subarray(0, this.at)]).toString('utf8');
  }
}
