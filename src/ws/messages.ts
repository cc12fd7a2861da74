import zlib from 'node:zlib';

/**
 * Reads the WebSocket messages (RFC 6455) of one direction of a tunnel from the bytes as they
 * were forwarded, with the arrival time of each message's last byte. Only for measurement: the
 * tunnel forwards the bytes itself, before they come here. Fragments are joined, client frames
 * unmasked, control frames skipped, and permessage-deflate (RFC 7692) messages inflated, in
 * order, on zlib's thread pool. A frame that breaks the protocol stops the reader for good;
 * the bytes still flow.
 */
export interface MessageSink {
  /** A text or binary message; `data` undefined when it was larger than the cap (not kept). */
  (data: Buffer | undefined, arrival: number): void;
}

export interface MessageReaderOptions {
  /** Messages larger than this (after inflation) are reported without their bytes. */
  readonly maxMessageBytes: number;
  /** permessage-deflate was negotiated for the connection. */
  readonly deflate: boolean;
}

const enum State {
  Head,
  Payload,
  Broken,
}

/** Ends every permessage-deflate message (RFC 7692 §7.2.2). */
const TRAILER = Buffer.from([0x00, 0x00, 0xff, 0xff]);

export class MessageReader {
  private state = State.Head;
  /** Bytes of a frame head not complete yet (at most 14). */
  private head: Buffer | undefined;
  private remaining = 0;
  private mask: Buffer | undefined;
  /** Offset into the mask of the next payload byte. */
  private maskAt = 0;
  private control = false;
  private fin = false;
  /** A data message is being read (its first frame came). */
  private inMessage = false;
  private compressed = false;
  private parts: Buffer[] = [];
  private bytes = 0;
  private oversize = false;
  private inflater: Inflater | undefined;
  /** Messages in arrival order while an earlier one is still being inflated. */
  private readonly order: Slot[] = [];

  constructor(
    private readonly sink: MessageSink,
    private readonly opts: MessageReaderOptions,
  ) {}

  get broken(): boolean {
    return this.state === State.Broken;
  }

  /** Bytes of this direction, in order, with the time they arrived. */
  push(buf: Buffer, arrival: number): void {
    let i = 0;
    while (i < buf.length && this.state !== State.Broken) {
      if (this.state === State.Head) {
        i = this.readHead(buf, i);
        if ((this.state as State) === State.Payload && this.remaining === 0) this.frameDone(arrival);
      } else {
        const n = Math.min(this.remaining, buf.length - i);
        if (!this.control) this.payload(buf, i, n);
        this.remaining -= n;
        i += n;
        if (this.remaining === 0) this.frameDone(arrival);
      }
    }
  }

  /** Reads a frame head from `buf[i..]`; returns the offset after what it consumed. */
  private readHead(buf: Buffer, i: number): number {
    let h: Buffer;
    let from: number;
    if (this.head === undefined) {
      h = buf;
      from = i;
    } else {
      h = Buffer.concat([this.head, buf.subarray(i, i + 14)]);
      from = 0;
    }
    const avail = h.length - from;
    if (avail < 2) return this.keepHead(h, from, buf);
    const b0 = h[from]!;
    const b1 = h[from + 1]!;
    const masked = (b1 & 0x80) !== 0;
    let len = b1 & 0x7f;
    let size = 2 + (masked ? 4 : 0) + (len === 126 ? 2 : len === 127 ? 8 : 0);
    if (avail < size) return this.keepHead(h, from, buf);
    let at = from + 2;
    if (len === 126) {
      len = h.readUInt16BE(at);
      at += 2;
    } else if (len === 127) {
      const hi = h.readUInt32BE(at);
      if (hi > 0x1fffff) return this.fail(); // beyond 2^53: not a length anyone sends
      len = hi * 0x100000000 + h.readUInt32BE(at + 4);
      at += 8;
    }
    const opcode = b0 & 0x0f;
    const rsv1 = (b0 & 0x40) !== 0;
    if ((b0 & 0x30) !== 0) return this.fail(); // RSV2/RSV3: an extension we do not know
    this.fin = (b0 & 0x80) !== 0;
    this.control = opcode >= 8;
    if (this.control) {
      if (!this.fin || len > 125 || rsv1 || opcode > 10) return this.fail();
    } else if (opcode === 0) {
      if (!this.inMessage || rsv1) return this.fail();
    } else if (opcode === 1 || opcode === 2) {
      if (this.inMessage || (rsv1 && !this.opts.deflate)) return this.fail();
      this.inMessage = true;
      this.compressed = rsv1;
      this.parts = [];
      this.bytes = 0;
      this.oversize = false;
    } else {
      return this.fail();
    }
    this.mask = masked ? Buffer.from(h.subarray(at, at + 4)) : undefined;
    this.maskAt = 0;
    this.remaining = len;
    this.state = State.Payload;
    size = at + (masked ? 4 : 0) - from;
    // Consumed from `buf`: the head's bytes beyond those kept from earlier reads.
    const kept = this.head?.length ?? 0;
    this.head = undefined;
    return i + size - kept;
  }

  private keepHead(h: Buffer, from: number, buf: Buffer): number {
    this.head = Buffer.from(h.subarray(from));
    return buf.length; // everything left in this read is head
  }

  private fail(): number {
    this.state = State.Broken;
    this.parts = [];
    this.head = undefined;
    this.inflater?.close();
    this.order.length = 0;
    return Number.MAX_SAFE_INTEGER;
  }

  private payload(buf: Buffer, i: number, n: number): void {
    let p = buf.subarray(i, i + n);
    if (this.mask !== undefined) {
      const out = Buffer.allocUnsafe(n);
      const m = this.mask;
      let k = this.maskAt;
      for (let j = 0; j < n; j++, k = (k + 1) & 3) out[j] = p[j]! ^ m[k]!;
      this.maskAt = k;
      p = out;
    } else {
      p = Buffer.from(p); // the read's buffer is the tunnel's; a view would keep all of it
    }
    if (this.compressed) {
      (this.inflater ??= new Inflater(this.opts.maxMessageBytes, () => this.fail())).write(p);
      return;
    }
    this.bytes += n;
    if (this.bytes > this.opts.maxMessageBytes) {
      this.oversize = true;
      this.parts = [];
    } else {
      this.parts.push(p);
    }
  }

  private frameDone(arrival: number): void {
    this.state = State.Head;
    if (this.control || !this.fin) return;
    this.inMessage = false;
    if (this.compressed) {
      const slot: Slot = { ready: false, data: undefined, arrival };
      this.order.push(slot);
      this.inflater!.end((data) => {
        slot.ready = true;
        slot.data = data;
        this.deliver();
      });
      return;
    }
    const parts = this.parts;
    this.parts = [];
    const data = this.oversize ? undefined : parts.length === 1 ? parts[0]! : Buffer.concat(parts, this.bytes);
    // Behind a message still in zlib: it waits its turn.
    if (this.order.length > 0) this.order.push({ ready: true, data, arrival });
    else this.sink(data, arrival);
  }

  private deliver(): void {
    const q = this.order;
    while (q.length > 0 && q[0]!.ready && this.state !== State.Broken) {
      const s = q.shift()!;
      this.sink(s.data, s.arrival);
    }
  }

  close(): void {
    this.inflater?.close();
    this.parts = [];
    this.order.length = 0;
  }
}

interface Slot {
  ready: boolean;
  data: Buffer | undefined;
  arrival: number;
}

/**
 * One direction's permessage-deflate decompressor: one raw inflate stream for the whole
 * connection, messages delivered in order, each after zlib's flush of its trailer. A sender
 * that resets its compressor per message (`*_no_context_takeover`) needs no reset here: its
 * messages never refer to earlier ones, and the senders in use (zlib's sync flush: `ws`,
 * browsers) end no block as final. One that does ends the stream, and measurement stops.
 */
class Inflater {
  private readonly z = zlib.createInflateRaw({ windowBits: 15 });
  private out: Buffer[] = [];
  private outBytes = 0;
  private oversize = false;
  private closed = false;
  /** Messages whose flush is still pending: bounded, so a stalled zlib cannot grow memory. */
  private pending = 0;

  constructor(
    private readonly max: number,
    private readonly onError: () => void,
  ) {
    this.z.on('data', (c: Buffer) => {
      this.outBytes += c.length;
      if (this.outBytes > this.max) {
        this.oversize = true;
        this.out = [];
      } else if (!this.oversize) {
        this.out.push(c);
      }
    });
    this.z.on('error', () => this.fail());
  }

  write(p: Buffer): void {
    if (!this.closed) this.z.write(p);
  }

  /** The message's last frame was written: `done` gets its bytes (undefined when over the cap). */
  end(done: (data: Buffer | undefined) => void): void {
    if (this.closed) return;
    if (++this.pending > 64) return this.fail();
    this.z.write(TRAILER);
    this.z.flush(zlib.constants.Z_SYNC_FLUSH, () => {
      this.pending--;
      if (this.closed) return;
      const data = this.oversize ? undefined : Buffer.concat(this.out, this.outBytes);
      this.out = [];
      this.outBytes = 0;
      this.oversize = false;
      done(data);
    });
  }

  private fail(): void {
    if (this.closed) return;
    this.close();
    this.onError();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.z.removeAllListeners('data');
    this.z.on('error', () => {});
    this.z.destroy();
  }
}

/**
 * Reads a 101's `Sec-WebSocket-Extensions`: true when permessage-deflate was accepted, false
 * when no extension was, `null` when some other extension was (its frames cannot be read).
 */
export function deflateAccepted(value: string | undefined): boolean | null {
  let found = false;
  for (const ext of (value ?? '').split(',')) {
    const name = ext.split(';')[0]!.trim().toLowerCase();
    if (name === '') continue;
    if (name !== 'permessage-deflate' || found) return null;
    found = true;
  }
  return found;
}
