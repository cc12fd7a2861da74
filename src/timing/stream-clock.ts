/**
 * Per-request timestamps and the arithmetic on them. Pure: every method takes
 * the time as an argument (milliseconds from a monotonic clock), so tests drive
 * it with a fake clock.
 *
 * Definitions (seconds in the results):
 *  - TTFT = first content event - request arrival
 *  - gap  = content event k - content event k-1 (one sample per gap)
 *  - TPOT = (last content event - first content event) / (output tokens - 1),
 *           only when output tokens >= 2 and there were >= 2 content events
 *  - duration = end (last byte, error or cancel) - request arrival
 *  - longest gap = the largest of the gaps (the request log's `maxGapMs`: a stall
 *    longer than the gap histogram's last bucket still has its length); for a
 *    stream that did not end well, also the open gap from its last content event
 *    to its end (the stall a client gave up in is the one that matters)
 */
export class StreamClock {
  private first = -1;
  private last = -1;
  private maxGap = -1;
  contentEvents = 0;

  constructor(readonly start: number) {}

  /**
   * A content event arrived at `t`. Returns the gap to the previous content
   * event in ms, or -1 for the first one (its TTFT is `ttftMs`).
   */
  content(t: number): number {
    this.contentEvents++;
    if (this.first < 0) {
      this.first = t;
      this.last = t;
      return -1;
    }
    const gap = t - this.last;
    this.last = t;
    if (gap > this.maxGap) this.maxGap = gap;
    return gap;
  }

  /** The longest gap between two content events in ms, or undefined before the second. */
  get maxGapMs(): number | undefined {
    return this.maxGap < 0 ? undefined : this.maxGap;
  }

  /** As `maxGapMs`, counting the gap still open at `end`; undefined before the first content event. */
  maxGapOpenMs(end: number): number | undefined {
    return this.last < 0 ? undefined : Math.max(this.maxGap, end - this.last);
  }

  /** When the last content event arrived (ms), or undefined before the first. */
  get lastContentAt(): number | undefined {
    return this.last < 0 ? undefined : this.last;
  }

  get ttftMs(): number | undefined {
    return this.first < 0 ? undefined : this.first - this.start;
  }

  /** Milliseconds per output token, or undefined when it is not defined. */
  tpotMs(outputTokens: number): number | undefined {
    if (this.contentEvents < 2 || outputTokens < 2) return undefined;
    return (this.last - this.first) / (outputTokens - 1);
  }

  durationMs(end: number): number {
    return end - this.start;
  }
}
