import type { SseEvent } from './parser.js';

/**
 * Incremental line framing for NDJSON bodies (`application/x-ndjson`, Ollama).
 * Each non-empty line (LF-terminated, a trailing CR removed) becomes
 * `{type: '', data: line, id: undefined}`, the same callback shape as the SSE
 * parser. Bytes are decoded only per complete line, so a UTF-8 character
 * split across reads is reassembled. Lines longer than `maxEventBytes` are
 * dropped (counted in `oversizeLines`). `end()` dispatches a final line that
 * has no newline.
 */
export interface NdjsonParserOptions {
  maxEventBytes?: number;
}

const LF = 0x0a;
const CR = 0x0d;

export class NdjsonParser {
  private readonly maxEventBytes: number;
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  /** The current line went over the cap: ignore bytes up to the next LF. */
  private skipping = false;
  oversizeLines = 0;

  constructor(
    private readonly onEvent: (ev: SseEvent) => void,
    opts: NdjsonParserOptions = {},
  ) {
    this.maxEventBytes = opts.maxEventBytes ?? 1024 * 1024;
  }

  push(chunk: Uint8Array): void {
    const buf = chunk instanceof Buffer ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    let i = 0;
    const len = buf.length;
    while (i < len) {
      const j = buf.indexOf(LF, i);
      if (j === -1) {
        this.stash(buf, i, len);
        return;
      }
      if (this.skipping) {
        this.skipping = false;
      } else if (this.pendingBytes > 0) {
        this.stash(buf, i, j);
        if (!this.skipping) {
          const line = Buffer.concat(this.pending, this.pendingBytes);
          this.emit(line, 0, line.length);
        }
        this.skipping = false;
      } else {
        if (j - i > this.maxEventBytes) this.oversizeLines++;
        else this.emit(buf, i, j);
      }
      this.pending = [];
      this.pendingBytes = 0;
      i = j + 1;
    }
  }

  /** End of the body: a last line without a newline is still a line. */
  end(): void {
    if (!this.skipping && this.pendingBytes > 0) {
      const line = Buffer.concat(this.pending, this.pendingBytes);
      this.emit(line, 0, line.length);
    }
    this.pending = [];
    this.pendingBytes = 0;
    this.skipping = false;
  }

  private stash(buf: Buffer, from: number, to: number): void {
    if (this.skipping || to === from) return;
    if (this.pendingBytes + (to - from) > this.maxEventBytes) {
      this.pending = [];
      this.pendingBytes = 0;
      this.skipping = true;
      this.oversizeLines++;
      return;
    }
    // Copy: the caller's buffer may be reused after push() returns.
    this.pending.push(Buffer.from(buf.subarray(from, to)));
    this.pendingBytes += to - from;
  }

  private emit(buf: Buffer, from: number, to: number): void {
    if (to > from && buf[to - 1] === CR) to--;
    // Skip blank (whitespace-only) lines cheaply.
    let s = from;
    while (s < to && (buf[s] === 0x20 || buf[s] === 0x09)) s++;
    if (s === to) return;
    this.onEvent({ type: '', data: buf.toString('utf8', from, to), id: undefined });
  }
}
