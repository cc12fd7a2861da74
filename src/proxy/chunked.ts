/**
 * Incremental decoder of the HTTP/1.1 chunked transfer coding (RFC 9112 §7.1)
 * for a proxy that forwards the upstream's chunk framing verbatim.
 *
 * `push(buf)` returns the bytes that may be forwarded now, byte-identical to
 * the input: everything except (a) a chunk-size line that is not finished yet
 * (held back, because only its end says whether it is the last chunk) and
 * (b) the last chunk and trailer section, which the proxy's own HTTP server
 * writes when it ends the response. The decoded payload of the same call is in
 * `ranges` (offsets into `buf`: no views, no copies), for the measurement that
 * runs after the bytes were forwarded.
 */
export class ChunkedError extends Error {}

const enum S {
  Size,
  Ext,
  SizeLf,
  Data,
  DataCr,
  DataLf,
  TrailerLineStart,
  TrailerLine,
  TrailerLf,
  Done,
}

const CR = 13;
const LF = 10;
const MAX_SIZE_DIGITS = 12; // 2^48 bytes: more than any stream carries
const MAX_LINE_BYTES = 4096; // a chunk-size line with its extensions
const MAX_TRAILER_BYTES = 64 * 1024;

function hexValue(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  if (c >= 65 && c <= 70) return c - 55;
  return -1;
}

export class ChunkedDecoder {
  private state = S.Size;
  private size = 0;
  private digits = 0;
  private lineBytes = 0;
  private trailerBytes = 0;
  private remaining = 0;
  /** Bytes of an unfinished chunk-size line from earlier buffers. */
  private pending: Buffer | undefined;
  /** The last chunk was seen: nothing more is forwarded. */
  private last = false;
  /**
   * Decoded payload of the latest push, as offsets into its buffer: start and
   * end of each piece, flat ([s0, e0, s1, e1, ...]). Offsets, not views: a read
   * holds one piece per event, and a view each was most of the decoder's garbage.
   */
  readonly ranges: number[] = [];
  /** Offset just past the end of the message in the latest buffer, or -1. */
  messageEnd = -1;
  /**
   * The framing broke: set by the push that found it, whose return value and
   * `ranges` still hold what came before the fault. Nothing is decoded after it.
   */
  error: ChunkedError | undefined;

  get done(): boolean {
    return this.state === S.Done;
  }

  push(buf: Buffer): Buffer {
    this.ranges.length = 0;
    this.messageEnd = -1;
    if (this.state === S.Done || this.error !== undefined) return buf.subarray(0, 0);
    let len = buf.length;
    // A size line that began in an earlier buffer continues at offset 0.
    this.lineFromPending = this.inSizeLine();
    this.lineStart = 0;
    this.stopAt = -1;
    this.releasedPending = false;
    try {
      this.decode(buf, len);
    } catch (e) {
      if (!(e instanceof ChunkedError)) throw e;
      this.error = e;
      // Forward what came before the fault: the data decoded so far, and
      // nothing of a size line (the faulty one, or one left unfinished).
      len = this.inSizeLine() ? this.lineStart : this.faultAt;
    }
    // What may go out now, verbatim.
    let end = len;
    if (this.stopAt >= 0) end = this.stopAt;
    else if (this.last) end = 0;
    else if (this.error === undefined && this.inSizeLine()) end = this.lineStart;
    const before = this.pending;
    let out: Buffer;
    if (before !== undefined && this.releasedPending) {
      out = end > 0 ? Buffer.concat([before, buf.subarray(0, end)]) : before;
      this.pending = undefined;
    } else {
      if (this.last) this.pending = undefined; // the held line was the last chunk
      out = end === buf.length ? buf : buf.subarray(0, end); // most reads go out whole: no view
    }
    if (!this.last && this.error === undefined && end < len) {
      // Copy: the caller's buffer may be reused once push() returns.
      const tail = buf.subarray(end, len);
      this.pending = this.pending === undefined ? Buffer.from(tail) : Buffer.concat([this.pending, tail]);
    }
    return out;
  }

  /** The offending byte of a fault, in the latest buffer. */
  private faultAt = 0;

  private decode(buf: Buffer, len: number): void {
    let i = 0;
    while (i < len) {
      switch (this.state) {
        case S.Data: {
          const take = Math.min(this.remaining, len - i);
          this.ranges.push(i, i + take);
          this.remaining -= take;
          i += take;
          if (this.remaining === 0) this.state = S.DataCr;
          continue;
        }
        case S.DataCr: {
          this.faultAt = i;
          const c = buf[i++]!;
          if (c === CR) this.state = S.DataLf;
          else if (c === LF) this.beginSize(i);
          else throw new ChunkedError('missing CRLF after chunk data');
          continue;
        }
        case S.DataLf:
          this.faultAt = i;
          if (buf[i++] !== LF) throw new ChunkedError('missing LF after chunk data');
          this.beginSize(i);
          continue;
        case S.Size: {
          this.faultAt = i;
          const c = buf[i++]!;
          if (++this.lineBytes > MAX_LINE_BYTES) throw new ChunkedError('chunk-size line too long');
          const h = hexValue(c);
          if (h >= 0 && this.sizeOpen) {
            if (++this.digits > MAX_SIZE_DIGITS) throw new ChunkedError('chunk size too large');
            this.size = this.size * 16 + h;
          } else if (this.digits === 0) {
            throw new ChunkedError('invalid chunk size');
          } else if (c === 59 /* ; */) {
            this.state = S.Ext;
          } else if (c === 32 || c === 9) {
            this.sizeOpen = false; // BWS before the extensions or the line end
          } else if (c === CR) {
            this.state = S.SizeLf;
          } else if (c === LF) {
            this.endSizeLine();
          } else {
            throw new ChunkedError('invalid chunk size');
          }
          continue;
        }
        case S.Ext: {
          this.faultAt = i;
          const c = buf[i++]!;
          if (++this.lineBytes > MAX_LINE_BYTES) throw new ChunkedError('chunk-size line too long');
          if (c === CR) this.state = S.SizeLf;
          else if (c === LF) this.endSizeLine();
          continue;
        }
        case S.SizeLf:
          this.faultAt = i;
          if (buf[i++] !== LF) throw new ChunkedError('missing LF after chunk size');
          this.endSizeLine();
          continue;
        case S.TrailerLineStart: {
          this.faultAt = i;
          const c = buf[i++]!;
          if (++this.trailerBytes > MAX_TRAILER_BYTES) throw new ChunkedError('trailer section too large');
          if (c === CR) this.state = S.TrailerLf;
          else if (c === LF) this.finish(i);
          else this.state = S.TrailerLine;
          continue;
        }
        case S.TrailerLine: {
          this.faultAt = i;
          const c = buf[i++]!;
          if (++this.trailerBytes > MAX_TRAILER_BYTES) throw new ChunkedError('trailer section too large');
          if (c === LF) this.state = S.TrailerLineStart;
          continue;
        }
        case S.TrailerLf:
          this.faultAt = i;
          if (buf[i++] !== LF) throw new ChunkedError('missing LF after trailer section');
          this.finish(i);
          continue;
        default: // Done
          i = len; // bytes after the message: the caller sees messageEnd
          continue;
      }
    }

  }

  private lineFromPending = false;
  private lineStart = 0;
  private stopAt = -1;
  private releasedPending = false;
  /** Still reading hex digits (no whitespace seen yet) on the size line. */
  private sizeOpen = true;

  private inSizeLine(): boolean {
    return this.state === S.Size || this.state === S.Ext || this.state === S.SizeLf;
  }

  private beginSize(at: number): void {
    this.state = S.Size;
    this.size = 0;
    this.digits = 0;
    this.lineBytes = 0;
    this.sizeOpen = true;
    this.lineStart = at;
    this.lineFromPending = false;
  }

  private endSizeLine(): void {
    if (this.size === 0) {
      this.last = true;
      this.stopAt = this.lineStart; // 0 when the line began in an earlier buffer
      this.state = S.TrailerLineStart;
    } else {
      if (this.lineFromPending) this.releasedPending = true;
      this.lineFromPending = false;
      this.remaining = this.size;
      this.state = S.Data;
    }
  }

  private finish(i: number): void {
    this.state = S.Done;
    this.messageEnd = i;
  }
}
