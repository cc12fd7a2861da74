import { crc32 } from 'node:zlib';
import type { BudgetShare } from './byte-budget.js';
import type { SseEvent } from './parser.js';

/**
 * Incremental decoder for `application/vnd.amazon.eventstream` (AWS Bedrock
 * streaming responses). Frames:
 *
 *   [total_len u32][headers_len u32][prelude_crc u32][headers][payload][message_crc u32]
 *
 * big-endian, CRC-32 (IEEE) over the first 8 bytes and over all bytes but the
 * last 4. Feed it chunks as they arrive, split anywhere. Each complete frame
 * becomes one event: `type` is the `:event-type` header (or `:exception-type`
 * for exceptions, `:error-code` for error messages), `data` the payload as
 * UTF-8, `messageType` the `:message-type` header (`event`, `exception`, `error`).
 *
 * A frame that is malformed (bad lengths or CRC) throws `EventStreamError`
 * once and leaves the decoder failed: the stream cannot be re-synchronised, so
 * the caller stops measuring it. A well-formed frame larger than
 * `maxFrameBytes` is skipped unread (its prelude CRC vouches for its length;
 * counted in `oversizeFrames`), as an oversize SSE event is, and so is one
 * that spans reads and does not fit the request's `share` of
 * `limits.maxBufferedBytes`. Neither ever
 * affects forwarding.
 */
export interface EventStreamEvent extends SseEvent {
  readonly messageType: string;
}

export interface EventStreamOptions {
  /** Largest frame decoded, larger ones are skipped (default 1 MiB; AWS's own limit is 16 MiB). */
  maxFrameBytes?: number;
  /** Check both CRCs (default true). */
  verifyCrc?: boolean;
  /** The request's part of `limits.maxBufferedBytes`, which a frame kept across reads counts in. */
  share?: BudgetShare;
}

export class EventStreamError extends Error {
  override name = 'EventStreamError';
}

const PRELUDE = 12;
const MIN_FRAME = 16;

export class EventStreamDecoder {
  private readonly maxFrameBytes: number;
  private readonly verifyCrc: boolean;
  /** The frame being assembled across chunks (allocated once its length is known). */
  private frame: Buffer | undefined;
  private frameHave = 0;
  /** Prelude bytes seen while the frame length is not yet known. */
  private readonly prelude = Buffer.alloc(PRELUDE);
  private preludeHave = 0;
  /** Bytes of an oversize frame still to pass unread. */
  private skipping = 0;
  private readonly share: BudgetShare | undefined;
  failed = false;
  frames = 0;
  oversizeFrames = 0;

  constructor(
    private readonly onEvent: (ev: EventStreamEvent) => void,
    opts: EventStreamOptions = {},
  ) {
    this.maxFrameBytes = opts.maxFrameBytes ?? 1024 * 1024;
    this.verifyCrc = opts.verifyCrc ?? true;
    this.share = opts.share;
  }

  /** Room for a frame of `total` bytes kept across reads, within the budget. */
  private room(total: number): boolean {
    return this.share === undefined || this.share.take(total, total);
  }

  push(chunk: Uint8Array): void {
    if (this.failed) return;
    const buf = chunk instanceof Buffer ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    let i = 0;
    const len = buf.length;
    while (i < len) {
      if (this.skipping > 0) {
        const n = Math.min(this.skipping, len - i);
        this.skipping -= n;
        i += n;
        continue;
      }
      if (this.frame !== undefined) {
        // Continue a frame started in an earlier chunk.
        const n = Math.min(this.frame.length - this.frameHave, len - i);
        buf.copy(this.frame, this.frameHave, i, i + n);
        this.frameHave += n;
        i += n;
        if (this.frameHave === this.frame.length) {
          const f = this.frame;
          this.frame = undefined;
          this.frameHave = 0;
          this.share?.give(f.length);
          this.decode(f, 0, f.length);
        }
        continue;
      }
      if (this.preludeHave > 0 || len - i < PRELUDE) {
        // Gather the prelude across chunks.
        const n = Math.min(PRELUDE - this.preludeHave, len - i);
        buf.copy(this.prelude, this.preludeHave, i, i + n);
        this.preludeHave += n;
        i += n;
        if (this.preludeHave < PRELUDE) return;
        const total = this.checkPrelude(this.prelude, 0);
        this.preludeHave = 0;
        if (total > this.maxFrameBytes || !this.room(total)) {
          this.skipping = total - PRELUDE;
          this.oversizeFrames++;
          continue;
        }
        this.frame = Buffer.allocUnsafe(total);
        this.prelude.copy(this.frame, 0, 0, PRELUDE);
        this.frameHave = PRELUDE;
        continue;
      }
      // Fast path: the prelude is in this chunk.
      const total = this.checkPrelude(buf, i);
      if (total > this.maxFrameBytes) {
        this.skipping = total;
        this.oversizeFrames++;
        continue;
      }
      if (len - i >= total) {
        this.decode(buf, i, total);
        i += total;
      } else if (!this.room(total)) {
        this.skipping = total;
        this.oversizeFrames++;
      } else {
        this.frame = Buffer.allocUnsafe(total);
        buf.copy(this.frame, 0, i, len);
        this.frameHave = len - i;
        i = len;
      }
    }
  }

  /** Validates a prelude at `off`; returns the frame length. */
  private checkPrelude(buf: Buffer, off: number): number {
    const total = buf.readUInt32BE(off);
    const headersLen = buf.readUInt32BE(off + 4);
    if (total < MIN_FRAME || headersLen > total - MIN_FRAME) this.fail(`bad frame lengths (total ${total}, headers ${headersLen})`);
    if (this.verifyCrc && crc32(buf.subarray(off, off + 8)) !== buf.readUInt32BE(off + 8)) this.fail('prelude CRC mismatch');
    return total;
  }

  private decode(buf: Buffer, off: number, total: number): void {
    const end = off + total;
    if (this.verifyCrc && crc32(buf.subarray(off, end - 4)) !== buf.readUInt32BE(end - 4)) this.fail('message CRC mismatch');
    const headersEnd = off + PRELUDE + buf.readUInt32BE(off + 4);
    let eventType = '';
    let messageType = 'event';
    let exceptionType = '';
    let errorCode = '';
    let p = off + PRELUDE;
    while (p < headersEnd) {
      const nameLen = buf[p]!;
      const nameStart = p + 1;
      p = nameStart + nameLen;
      if (p >= headersEnd) this.fail('truncated header');
      const type = buf[p++]!;
      let valueLen: number;
      switch (type) {
        case 0: // bool true
        case 1: // bool false
          valueLen = 0;
          break;
        case 2: // byte
          valueLen = 1;
          break;
        case 3: // short
          valueLen = 2;
          break;
        case 4: // int
          valueLen = 4;
          break;
        case 5: // long
        case 8: // timestamp
          valueLen = 8;
          break;
        case 9: // uuid
          valueLen = 16;
          break;
        case 6: // bytes
        case 7: // string
          if (p + 2 > headersEnd) this.fail('truncated header');
          valueLen = buf.readUInt16BE(p);
          p += 2;
          break;
        default:
          this.fail(`unknown header type ${type}`);
      }
      if (p + valueLen! > headersEnd) this.fail('truncated header');
      if (type === 7 && (nameLen === 11 || nameLen === 13 || nameLen === 15)) {
        const name = buf.toString('latin1', nameStart, nameStart + nameLen);
        if (name === ':event-type') eventType = buf.toString('utf8', p, p + valueLen!);
        else if (name === ':message-type') messageType = buf.toString('utf8', p, p + valueLen!);
        else if (name === ':exception-type') exceptionType = buf.toString('utf8', p, p + valueLen!);
        else if (name === ':error-code') errorCode = buf.toString('utf8', p, p + valueLen!);
      }
      p += valueLen!;
    }
    this.frames++;
    const type = messageType === 'exception' ? exceptionType : messageType === 'error' ? errorCode : eventType;
    this.onEvent({ type, data: buf.toString('utf8', headersEnd, end - 4), id: undefined, messageType });
  }

  private fail(why: string): never {
    this.failed = true;
    this.frame = undefined;
    throw new EventStreamError(why);
  }
}

/** Encodes one frame with string headers (the simulator and tests use it). */
export function encodeEventStreamFrame(headers: Readonly<Record<string, string>>, payload: string | Buffer): Buffer {
  const body = typeof payload === 'string' ? Buffer.from(payload, 'utf8') : payload;
  const hparts: Buffer[] = [];
  for (const [name, value] of Object.entries(headers)) {
    const n = Buffer.from(name, 'utf8');
    const v = Buffer.from(value, 'utf8');
    const h = Buffer.allocUnsafe(1 + n.length + 1 + 2 + v.length);
    h[0] = n.length;
    n.copy(h, 1);
    h[1 + n.length] = 7;
    h.writeUInt16BE(v.length, 2 + n.length);
    v.copy(h, 4 + n.length);
    hparts.push(h);
  }
  const hbuf = Buffer.concat(hparts);
  const total = PRELUDE + hbuf.length + body.length + 4;
  const out = Buffer.allocUnsafe(total);
  out.writeUInt32BE(total, 0);
  out.writeUInt32BE(hbuf.length, 4);
  out.writeUInt32BE(crc32(out.subarray(0, 8)), 8);
  hbuf.copy(out, PRELUDE);
  body.copy(out, PRELUDE + hbuf.length);
  out.writeUInt32BE(crc32(out.subarray(0, total - 4)), total - 4);
  return out;
}
