import type { BudgetShare } from './byte-budget.js';
import { EventEdges } from './event-edges.js';
import { PendingBytes } from './pending-bytes.js';

/**
 * Incremental, byte-level parser for the WHATWG `text/event-stream` format.
 *
 * Feed it the chunks exactly as they arrive; it calls `onEvent` for every
 * dispatched event. Line ends may be LF, CR or CRLF (also split across reads),
 * a leading UTF-8 BOM is skipped, `data:` lines are joined with "\n", a space
 * after the colon is optional, comments (`:` lines) are reported separately.
 * One departure, for measurement only: an event with no `data:` but an
 * `error:` field (llama.cpp's server wrote its errors so before 2025-09) is
 * reported as an event of type `error` with that field's value as its data;
 * the spec ignores the field, so a client never sees the error.
 *
 * Bytes are only decoded to text when an event is dispatched, so a multi-byte
 * UTF-8 character split across reads is reassembled before decoding.
 * Each byte is looked at a constant number of times: linear in stream length
 * (for ranges of one buffer too: see `clamp`).
 *
 * An event whose data (its lines joined) or any one line (of any field, the
 * field name included) is longer than `maxEventBytes` is dropped (counted in
 * `oversizeEvents`), however the reads split it: measurement skips it;
 * forwarding is not this module's business. When the cause was one `data:`
 * line, an event with empty data and that line's first and last bytes
 * (`oversize`, see EventEdges) is dispatched in its place. So is an event whose
 * bytes, kept while it arrives, do not fit the request's `share` of
 * `limits.maxBufferedBytes`.
 */

export interface SseEvent {
  /** `event:` field, or "" when the event had none (the spec's default is "message"). */
  readonly type: string;
  /** `data:` lines joined with "\n". */
  readonly data: string;
  readonly id: string | undefined;
  /**
   * Set on an event too large to keep (data empty): the first and last bytes of its data, where
   * a finished response's status and totals are. Adapters that read nothing there ignore it.
   */
  readonly oversize?: { readonly head: string; readonly tail: string };
}

export interface SseParserOptions {
  maxEventBytes?: number;
  /** The request's part of `limits.maxBufferedBytes`, which the bytes kept while an event arrives count in. */
  share?: BudgetShare;
  onComment?: () => void;
  /**
   * Offered each event's data as bytes `buf[start, end)` (valid during the
   * call only) before it is decoded; returning true consumes the event:
   * no string and no SseEvent are made. `type` is the event's `event:` field.
   */
  onData?: (buf: Buffer, start: number, end: number, type: string) => boolean;
  /**
   * The fast lane for streams of one-line events. `find` is offered the value
   * of a `data:` line that starts a new event (no other field before it) as
   * `buf[start, limit)`, before the line's end is searched for, and returns
   * the index just past the value if it recognises the value as a whole
   * event, else -1; it must not change what is measured. When the value is
   * followed by LF LF or CRLF CRLF within the chunk (the end of the line and
   * of the event), the parser calls `taken()` instead of making the event
   * and moves past it; otherwise the line takes the normal path.
   */
  lane?: SseLane;
}

export interface SseLane {
  find(buf: Buffer, start: number, limit: number): number;
  taken(): void;
}

const LF = 0x0a;
const CR = 0x0d;
const COLON = 0x3a;
const SPACE = 0x20;
/** Values the lane recognised that were not followed by an event end, before it closes for the stream. */
const MAX_LANE_MISSES = 4;
/** Bytes a line-end search may run past its range's end before the parser clamps its searches. */
const CLAMP_SLACK = 4096;

export class SseParser {
  private readonly maxEventBytes: number;
  private readonly onComment: (() => void) | undefined;
  private readonly onData: SseParserOptions['onData'];
  private lane: SseLane | undefined;
  /** Values the lane recognised that were not followed by an event end: it closes after a few. */
  private laneMisses = 0;

  /**
   * The line being read went over the cap in an earlier chunk and was dropped:
   * its end, when it comes, ends nothing else (it is not a blank line).
   */
  private dropLine = false;
  /** The line not yet terminated (copied: the caller reuses its buffers). */
  private readonly pending: PendingBytes;
  /** The previous chunk ended with CR: a leading LF in the next one is part of that line end. */
  private afterCR = false;
  private atStart = true;
  /** BOM bytes seen so far at the very start (it may itself be split). */
  private bomSeen = 0;
  /**
   * Line ends are searched in a view that ends with the range. Set once a search ran far past a
   * range's end: a chunked body whose framing has bare LF line ends around a body without CR
   * gives one range per chunk of one read, and each CR search would run to the read's end
   * (quadratic in the read's size). The view is one allocation per push, so only such streams
   * pay for it.
   */
  private clamp = false;

  /**
   * An event's only data line so far, as a range of the chunk being pushed:
   * most events have one line and start and end in one chunk, so they are
   * handed on without a copy or a view (see `own()` for the others).
   */
  private oneBuf: Buffer | undefined = undefined;
  private oneStart = 0;
  private oneEnd = 0;
  /**
   * The open event's data when it is not one line in the chunk being pushed: its lines joined
   * by LF, copied into one buffer (a buffer or view per line cost ~200 bytes of heap each:
   * a million empty `data:` lines, 6 MB, took 200 MB).
   */
  private readonly data: PendingBytes;
  private dataBytes = 0;
  private hasData = false;
  private eventType = '';
  private lastId: string | undefined = undefined;
  /** An `error:` field's value, reported only if the event has no data. */
  private errorField: string | undefined = undefined;
  /** Current event exceeded the cap: ignore its fields until the blank line. */
  private skipping = false;
  /** The edges of the line that took the current event over the cap, while it passes or when it has. */
  private edges: EventEdges | undefined;
  /** The line being dropped (`dropLine`) is the one `edges` are of: its further bytes go there. */
  private edgesOpen = false;

  oversizeEvents = 0;

  constructor(private readonly onEvent: (ev: SseEvent) => void, opts: SseParserOptions = {}) {
    this.maxEventBytes = opts.maxEventBytes ?? 1024 * 1024;
    // With edges: a line over the cap or the budget is dropped keeping them (`pendingRefused`).
    this.pending = new PendingBytes(this.maxEventBytes, true, opts.share);
    this.data = new PendingBytes(this.maxEventBytes, false, opts.share);
    this.onComment = opts.onComment;
    this.onData = opts.onData;
    this.lane = opts.lane;
  }

  /** Parses `chunk[start, end)` (default: all of it). */
  push(chunk: Uint8Array, start = 0, end = chunk.byteLength): void {
    // An empty read must not consume pending state (a CR waiting for its LF).
    if (end <= start) return;
    let buf = chunk instanceof Buffer ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    if (this.atStart && (start !== 0 || end !== buf.length)) {
      // The BOM check at the very start works on whole buffers: a view, once per stream.
      buf = buf.subarray(start, end);
      start = 0;
      end = buf.length;
    }
    this.scan(buf, start, end);
    // The caller may reuse its buffer after push() returns: own the open event's bytes.
    if (this.oneBuf !== undefined && !this.own()) this.markOversize(this.oneEdges());
  }

  private scan(buf: Buffer, start: number, len: number): void {
    if (this.atStart) {
      // Skip a UTF-8 BOM (EF BB BF), even if split across chunks.
      const bom = [0xef, 0xbb, 0xbf];
      while (start < buf.length && this.bomSeen < 3 && buf[start] === bom[this.bomSeen]) {
        this.bomSeen++;
        start++;
      }
      if (start === buf.length && this.bomSeen < 3 && this.bomSeen > 0) return; // maybe more BOM next
      if (this.bomSeen > 0 && this.bomSeen < 3) {
        // Partial BOM followed by other bytes: those bytes were content after all.
        const partial = Buffer.from(bom.slice(0, this.bomSeen));
        buf = Buffer.concat([partial, buf.subarray(start)]);
        start = 0;
        len = buf.length;
      }
      this.atStart = false;
    }
    if (this.afterCR) {
      this.afterCR = false;
      if (start < len && buf[start] === LF) start++;
    }
    let i = start;
    const hay = this.clamp && len < buf.length ? buf.subarray(0, len) : buf;
    // Native memchr for both line-end bytes; most streams have no CR at all, so
    // its position is searched once per chunk and only re-searched once passed.
    let nextLF = -2;
    let nextCR = -2;
    while (i < len) {
      const lane = this.lane;
      if (lane !== undefined && buf[i] === 0x64 /* d */ && this.pending.length === 0 && !this.hasData && !this.skipping && this.eventType === '' && this.errorField === undefined) {
        const next = this.fastLane(lane, buf, i, len);
        if (next >= 0) {
          i = next;
          continue;
        }
      }
      if (nextLF !== -1 && nextLF < i) nextLF = this.search(hay, LF, i, len);
      if (nextCR !== -1 && nextCR < i) nextCR = this.search(hay, CR, i, len);
      const j = nextLF === -1 ? (nextCR === -1 ? len : nextCR) : nextCR === -1 ? nextLF : Math.min(nextLF, nextCR);
      if (j === len) {
        this.stash(buf.subarray(i, len));
        return;
      }
      if (this.dropLine) {
        this.dropLine = false;
        if (this.edgesOpen) {
          this.edgesOpen = false;
          this.edges!.add(buf, i, j);
        }
      } else this.line(buf, i, j);
      if (buf[j] === CR) {
        if (j + 1 < len) {
          i = buf[j + 1] === LF ? j + 2 : j + 1;
        } else {
          this.afterCR = true;
          i = len;
        }
      } else {
        i = j + 1;
      }
    }
  }

  /** The first `byte` in `hay[i, len)`, or -1: a line end past `len` is outside the range. */
  private search(hay: Buffer, byte: number, i: number, len: number): number {
    const at = hay.indexOf(byte, i);
    if (at !== -1 && at < len) return at;
    if ((at === -1 ? hay.length : at) - len > CLAMP_SLACK) this.clamp = true;
    return -1;
  }

  /**
   * A one-line event at `buf[i]` offered to the lane: the index after its
   * blank line when it was taken whole, else -1 (nothing consumed).
   */
  private fastLane(lane: SseLane, buf: Buffer, i: number, len: number): number {
    if (i + 5 >= len || buf[i + 1] !== 0x61 || buf[i + 2] !== 0x74 || buf[i + 3] !== 0x61 || buf[i + 4] !== COLON) return -1;
    const vs = buf[i + 5] === SPACE ? i + 6 : i + 5;
    const e = lane.find(buf, vs, len);
    if (e < 0) return -1;
    let next = -1;
    const c = buf[e];
    if (c === LF) {
      if (e + 1 >= len) return -1; // the event's end is in the next chunk: not a miss
      if (buf[e + 1] === LF) next = e + 2;
    } else if (c === CR) {
      if (e + 3 >= len) return -1;
      if (buf[e + 1] === LF && buf[e + 2] === CR && buf[e + 3] === LF) next = e + 4;
    } else if (e >= len) {
      return -1;
    }
    if (next < 0 || e - i > this.maxEventBytes) {
      // The value was not the whole event after all: the normal path reads it again.
      if (++this.laneMisses >= MAX_LANE_MISSES) this.lane = undefined;
      return -1;
    }
    lane.taken();
    return next;
  }

  /** End of stream: per the spec an unterminated event is discarded. */
  end(): void {
    this.dropLine = false;
    this.pending.clear();
    this.resetEvent();
  }

  private stash(part: Buffer): void {
    if (part.length === 0) return;
    if (this.dropLine) {
      if (this.edgesOpen) this.edges!.add(part, 0, part.length);
      return;
    }
    // A single line beyond the cap (or the budget): the rest of the line is dropped too.
    if (this.pending.add(part, 0, part.length)) this.pendingRefused(true);
  }

  /**
   * The line being kept went over the cap or the budget (PendingBytes let it go, keeping its
   * edges): the event is skipped, with the edges only as `lineEdges` would keep them. `open`: the
   * line has not ended.
   */
  private pendingRefused(open: boolean): void {
    const edges = this.skipping || this.hasData ? undefined : this.pending.edges;
    this.pending.clear();
    this.dropLine = open;
    this.edgesOpen = open && edges !== undefined;
    this.markOversize(edges);
  }

  /**
   * Edges for a line over the cap that came in one read: kept only for the event's first line
   * over the cap before any data (a later data line's edges are not the data's).
   */
  private lineEdges(line: Buffer): EventEdges | undefined {
    if (this.skipping || this.hasData) return undefined;
    const edges = new EventEdges();
    edges.add(line, 0, line.length);
    return edges;
  }

  private line(buf: Buffer, from: number, to: number): void {
    let lineBuf: Buffer;
    let s: number;
    let e: number;
    if (this.pending.length > 0) {
      if (this.pending.add(buf, from, to)) {
        this.pendingRefused(false);
        return; // a line over the cap or the budget, which cannot be blank
      }
      // A view of the pending copy, which clear() lets go of (it is never reused).
      lineBuf = this.pending.bytes();
      this.pending.clear();
      s = 0;
      e = lineBuf.length;
    } else {
      lineBuf = buf;
      s = from;
      e = to;
    }
    if (s === e) {
      this.dispatch();
      return;
    }
    if (this.skipping) return;
    if (e - s > this.maxEventBytes) {
      // As a line that spans reads is judged (`stash`, above), so that the split does not matter.
      this.markOversize(this.lineEdges(lineBuf.subarray(s, e)));
      return;
    }
    if (lineBuf[s] === COLON) {
      this.onComment?.();
      return;
    }
    // field name up to the first colon
    let c = s;
    while (c < e && lineBuf[c] !== COLON) c++;
    const nameLen = c - s;
    let vs = c < e ? c + 1 : e;
    if (vs < e && lineBuf[vs] === SPACE) vs++;
    if (nameLen === 4 && lineBuf[s] === 0x64 && lineBuf[s + 1] === 0x61 && lineBuf[s + 2] === 0x74 && lineBuf[s + 3] === 0x61) {
      const add = e - vs + (this.hasData ? 1 : 0);
      if (this.dataBytes + add > this.maxEventBytes) {
        this.markOversize();
        return;
      }
      if (!this.hasData) {
        this.oneBuf = lineBuf;
        this.oneStart = vs;
        this.oneEnd = e;
      } else if ((this.oneBuf !== undefined && !this.own()) || this.data.add(NEWLINE, 0, 1) || this.data.add(lineBuf, vs, e)) {
        this.markOversize(); // the budget refused the lines' bytes: as data over the cap across lines
        return;
      }
      this.dataBytes += add;
      this.hasData = true;
    } else if (nameLen === 5) {
      const name = lineBuf.toString('latin1', s, c);
      if (name === 'event') this.eventType = lineBuf.toString('utf8', vs, e);
      else if (name === 'error') this.errorField = lineBuf.toString('utf8', vs, e);
    } else if (nameLen === 2 && lineBuf.toString('latin1', s, c) === 'id') {
      const v = lineBuf.subarray(vs, e);
      if (v.indexOf(0) === -1) this.lastId = v.toString('utf8');
    }
    // `retry` and unknown fields are ignored, as the spec says.
  }

  /** `edges`: the line's that took the event over the cap (none when its data's lines together did). */
  private markOversize(edges?: EventEdges): void {
    if (!this.skipping) {
      this.skipping = true;
      this.oversizeEvents++;
      this.edges = edges;
    }
    this.oneBuf = undefined;
    this.data.clear();
    this.dataBytes = 0;
  }

  /**
   * The open event's single data line, still in the caller's chunk, is copied into `data`: false
   * when the budget refused it (the line is still in `oneBuf` then, for `oneEdges()`).
   */
  private own(): boolean {
    if (this.data.add(this.oneBuf!, this.oneStart, this.oneEnd)) return false;
    this.oneBuf = undefined;
    return true;
  }

  /** Edges of the open event's single data line, as `lineEdges` would have kept them, when `own()` was refused. */
  private oneEdges(): EventEdges {
    const one = this.oneBuf!;
    const field = one[this.oneStart - 1] === SPACE ? DATA_FIELD_SPACE : DATA_FIELD; // the line as it came
    const edges = new EventEdges();
    edges.add(field, 0, field.length);
    edges.add(one, this.oneStart, this.oneEnd);
    return edges;
  }

  private dispatch(): void {
    if (this.skipping) {
      const edges = this.edges;
      if (edges !== undefined) this.dispatchOversize(edges);
      this.resetEvent();
      return;
    }
    if (this.hasData) {
      let buf = this.oneBuf;
      let from = this.oneStart;
      let to = this.oneEnd;
      if (buf === undefined) {
        // Valid after clear(): that drops the store, it never writes over it.
        buf = this.data.bytes();
        from = 0;
        to = buf.length;
      }
      if (this.onData?.(buf, from, to, this.eventType) !== true) {
        // Buffer#toString replaces invalid UTF-8 with U+FFFD like the spec's decoder, and keeps a BOM.
        this.onEvent({ type: this.eventType, data: buf.toString('utf8', from, to), id: this.lastId });
      }
    } else if (this.errorField !== undefined) {
      const b = Buffer.from(this.errorField, 'utf8');
      if (this.onData?.(b, 0, b.length, 'error') !== true) this.onEvent({ type: 'error', data: this.errorField, id: this.lastId });
    }
    this.resetEvent();
  }

  /**
   * An event dropped for a `data:` line over the cap: dispatched with empty data and the line's
   * edges, its field name left out (and a line of another field: nothing dispatched).
   */
  private dispatchOversize(edges: EventEdges): void {
    let head = edges.head();
    if (!head.startsWith('data:')) return;
    const field = head.charCodeAt(5) === SPACE ? 6 : 5;
    head = head.slice(field);
    let tail = edges.tail();
    if (edges.total <= EventEdges.TAIL) tail = tail.slice(field); // the tail begins with the line
    this.onEvent({ type: this.eventType, data: '', id: this.lastId, oversize: { head, tail } });
  }

  private resetEvent(): void {
    this.edges = undefined;
    this.edgesOpen = false;
    this.oneBuf = undefined;
    this.data.clear();
    this.dataBytes = 0;
    this.hasData = false;
    this.eventType = '';
    this.errorField = undefined;
    this.skipping = false;
  }
}

const NEWLINE = Buffer.from('\n');
const DATA_FIELD = Buffer.from('data:');
const DATA_FIELD_SPACE = Buffer.from('data: ');
