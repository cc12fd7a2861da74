import type { SseEvent } from './parser.js';
import type { BudgetShare } from './byte-budget.js';
import { PendingBytes } from './pending-bytes.js';

/**
 * Incremental framing for a body that streams one JSON array, element by
 * element: Gemini's `:streamGenerateContent` without `alt=sse` (or with
 * `alt=json`) sends `[{…}\r\n,\r\n{…}\r\n]`, each object as the model produces it.
 * Every object or array element of the top-level array becomes
 * `{type: '', data: elementText, id: undefined}` as soon as its closing
 * bracket arrives, the same callback shape as the SSE parser. Scalar elements
 * are skipped (no LLM API streams them). Bytes are decoded only per complete
 * element, so a UTF-8 character split across reads is reassembled.
 *
 * A body whose first non-whitespace byte is not `[` is not a stream: `kind`
 * becomes `'other'` and the parser ignores the rest (the caller reads such a
 * body whole). Elements over `maxEventBytes` are dropped (counted in
 * `oversizeElements`); in the place of each, an event with empty data and the
 * element's first and last bytes (`oversize`, see EventEdges) is dispatched.
 * Bytes after the closing `]` are ignored.
 */
export interface JsonArrayParserOptions {
  maxEventBytes?: number;
  /** The request's part of `limits.maxBufferedBytes`: an element past it is read as one over the cap. */
  share?: BudgetShare;
}

export type JsonArrayKind = 'unknown' | 'array' | 'other' | 'done';

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const BOM = [0xef, 0xbb, 0xbf];

const isSpace = (c: number): boolean => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

export class JsonArrayParser {
  private readonly maxEventBytes: number;
  kind: JsonArrayKind = 'unknown';
  /** Nesting depth inside the top-level array: 0 between elements. */
  private depth = 0;
  private inString = false;
  private escaped = false;
  /** Bytes of the current element from earlier reads; `over`: it went over the cap, scan it to its end, emit nothing. */
  private readonly pending: PendingBytes;
  /** A UTF-8 byte order mark may precede the array; bytes of it seen so far. */
  private bomSeen = 0;
  oversizeElements = 0;

  constructor(
    private readonly onEvent: (ev: SseEvent) => void,
    opts: JsonArrayParserOptions = {},
  ) {
    this.maxEventBytes = opts.maxEventBytes ?? 1024 * 1024;
    this.pending = new PendingBytes(this.maxEventBytes, true, opts.share);
  }

  push(chunk: Uint8Array): void {
    const buf = chunk instanceof Buffer ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    const len = buf.length;
    let i = 0;
    if (this.kind === 'unknown') {
      i = this.opening(buf);
      if (i < 0) return;
    } else if (this.kind !== 'array') {
      return;
    }
    // Where the current element starts in this read: 0 if it began in an earlier one.
    let start = this.depth > 0 ? 0 : -1;
    let depth = this.depth;
    let inString = this.inString;
    let escaped = this.escaped;
    for (; i < len; i++) {
      const c = buf[i]!;
      if (inString) {
        if (escaped) escaped = false;
        else if (c === BACKSLASH) escaped = true;
        else if (c === QUOTE) inString = false;
        continue;
      }
      if (c === QUOTE) {
        inString = true;
      } else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
        if (depth === 0) start = i;
        depth++;
      } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
        if (depth === 0) {
          // `]` between elements closes the array (a stray `}` there is ignored).
          if (c === CLOSE_BRACKET) {
            this.kind = 'done';
            break;
          }
        } else if (--depth === 0) {
          this.element(buf, start, i + 1);
          start = -1;
        }
      }
    }
    this.depth = depth;
    this.inString = inString;
    this.escaped = escaped;
    if (depth > 0 && start !== -1 && this.pending.add(buf, start, len)) this.oversizeElements++;
  }

  /** Skips a BOM and whitespace, then decides from the first byte: the index after `[`, or -1 (not decided, or not an array). */
  private opening(buf: Buffer): number {
    let i = 0;
    const len = buf.length;
    while (i < len && this.bomSeen < 3 && buf[i] === BOM[this.bomSeen]) {
      this.bomSeen++;
      i++;
    }
    if (i < len) this.bomSeen = 3; // a BOM can only be the first bytes of the body
    while (i < len && isSpace(buf[i]!)) i++;
    if (i === len) return -1;
    if (buf[i] !== OPEN_BRACKET) {
      this.kind = 'other';
      return -1;
    }
    this.kind = 'array';
    return i + 1;
  }

  /** The element ends at `to` (exclusive); it began at `from` in this read, or in earlier ones (then `from` is 0 and bytes are pending). */
  private element(buf: Buffer, from: number, to: number): void {
    const pending = this.pending;
    if (pending.length > 0 || pending.over || to - from > this.maxEventBytes) {
      // an element that spans reads, or over the cap: its edges once it is
      if (pending.add(buf, from, to)) this.oversizeElements++;
      if (pending.over) {
        const edges = pending.edges!;
        this.onEvent({ type: '', data: '', id: undefined, oversize: { head: edges.head(), tail: edges.tail() } });
      } else this.onEvent({ type: '', data: pending.bytes().toString('utf8'), id: undefined });
      pending.clear();
      return;
    }
    this.onEvent({ type: '', data: buf.toString('utf8', from, to), id: undefined });
  }
}
