import type { SseEvent } from './parser.js';
import type { BudgetShare } from './byte-budget.js';
import { PendingBytes } from './pending-bytes.js';

/**
 * Incremental line framing for NDJSON bodies (`application/x-ndjson`, Ollama).
 * Each non-empty line (LF-terminated, a trailing CR removed) becomes
 * `{type: '', data: line, id: undefined}`, the same callback shape as the SSE
 * parser; a UTF-8 BOM that starts the body is left out. Bytes are decoded only
 * per complete line, so a UTF-8 character split across reads is reassembled.
 * Lines longer than `maxEventBytes` are dropped (counted in `oversizeLines`);
 * in the place of each, an event with empty data and the line's first and last
 * bytes (`oversize`, see EventEdges) is dispatched.
 * `end()` dispatches a final line that has no newline.
 */
export interface NdjsonParserOptions {
  maxEventBytes?: number;
  /** The request's part of `limits.maxBufferedBytes`: a line past it is read as one over the cap. */
  share?: BudgetShare;
}

const LF = 0x0a;
const CR = 0x0d;

export class NdjsonParser {
  private readonly maxEventBytes: number;
  /** A line that spans reads; `over`: it went over the cap, ignore bytes up to the next LF. */
  private readonly pending: PendingBytes;
  /** No line has ended yet: the first may start with a UTF-8 BOM, which JSON.parse would refuse. */
  private first = true;
  oversizeLines = 0;

  constructor(
    private readonly onEvent: (ev: SseEvent) => void,
    opts: NdjsonParserOptions = {},
  ) {
    this.maxEventBytes = opts.maxEventBytes ?? 1024 * 1024;
    this.pending = new PendingBytes(this.maxEventBytes, true, opts.share);
  }

  push(chunk: Uint8Array): void {
    const buf = chunk instanceof Buffer ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    const pending = this.pending;
    let i = 0;
    const len = buf.length;
    while (i < len) {
      const j = buf.indexOf(LF, i);
      if (j === -1) {
        if (pending.add(buf, i, len)) this.oversizeLines++;
        return;
      }
      if (pending.length > 0 || pending.over || j - i > this.maxEventBytes) {
        // a line that spans reads, or over the cap: its edges once it is
        if (pending.add(buf, i, j)) this.oversizeLines++;
        if (pending.over) this.emitOversize();
        else {
          const line = pending.bytes();
          this.emit(line, 0, line.length);
        }
      } else this.emit(buf, i, j);
      pending.clear();
      i = j + 1;
    }
  }

  /** End of the body: a last line without a newline is still a line. */
  end(): void {
    const pending = this.pending;
    if (pending.over) this.emitOversize();
    else if (pending.length > 0) {
      const line = pending.bytes();
      this.emit(line, 0, line.length);
    }
    pending.clear();
  }

  /** A line over the cap ended: dispatched with empty data and its edges. */
  private emitOversize(): void {
    const edges = this.pending.edges!;
    this.first = false;
    this.onEvent({ type: '', data: '', id: undefined, oversize: { head: edges.head(), tail: edges.tail() } });
  }

  private emit(buf: Buffer, from: number, to: number): void {
    if (this.first) {
      this.first = false;
      if (to - from >= 3 && buf[from] === 0xef && buf[from + 1] === 0xbb && buf[from + 2] === 0xbf) from += 3;
    }
    if (to > from && buf[to - 1] === CR) to--;
    // Skip blank (whitespace-only) lines cheaply.
    let s = from;
    while (s < to && (buf[s] === 0x20 || buf[s] === 0x09)) s++;
    if (s === to) return;
    this.onEvent({ type: '', data: buf.toString('utf8', from, to), id: undefined });
  }
}
