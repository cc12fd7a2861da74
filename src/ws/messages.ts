import zlib from 'node:zlib';

/**
 * Reads the WebSocket messages (RFC 6455) of one direction of a tunnel from the bytes as they
 * were forwarded, with the arrival time of each message's last byte. Only for measurement: the
 * tunnel forwards the bytes itself, before they come here. Fragments are joined, client frames
 * unmasked, control frames skipped, and permessage-deflate (RFC 7692) messages inflated one
 * after another on zlib's thread pool and delivered in arrival order. The reader stops for
 * good (`broken`), while the bytes still flow, at a frame that breaks the protocol, at a
 * compressed message over the cap (compressed or inflated: with the compressor's context
 * shared across messages, none can be skipped), or when compressed bytes waiting for zlib
 * pass a bound. Memory stays within a few times the cap.
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
  /** Control frames (close 8, ping 9, pong 10) with their payload; the simulator answers them. */
  readonly onControl?: (opcode: number, payload: Buffer) => void;
  /** The reader stopped (see `broken`), also later, from zlib. */
  readonly onBroken?: () => void;
  /** Every frame must be masked (a server reading its clients: RFC 6455 §5.1). */
  readonly requireMask?: boolean;
}

/** What a queued compressed message costs beyond its bytes, counted against the queue's bound. */
const PART_OVERHEAD = 96;
const EMPTY = Buffer.alloc(0);

const enum State {
  Head,
  Payload,
  Broken,
}

/** Payloads this long or longer are unmasked by 32-bit words; shorter ones byte by byte. */
const WORDS_FROM = 256;
const MASK_BYTES = new Uint8Array(4);
const MASK_WORD = new Uint32Array(MASK_BYTES.buffer);

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
  private opcode = 0;
  private controlParts: Buffer[] = [];
  private fin = false;
  /** A data message is being read (its first frame came). */
  private inMessage = false;
  private compressed = false;
  /** The message so far, unmasked: one buffer grown by doubling (reads and fragments append to it). */
  private acc: Buffer = EMPTY;
  private bytes = 0;
  private oversize = false;
  private inflater: Inflater | undefined;
  /** Messages in arrival order while an earlier one is still being inflated. */
  private readonly order: Slot[] = [];
  /** Bytes of the ready messages in `order`: bounded like zlib's queue. */
  private orderBytes = 0;

  /** Arrival of the oldest message not yet delivered (one in zlib, or behind one), if any. */
  get oldestPending(): number | undefined {
    return this.state === State.Broken ? undefined : this.order[0]?.arrival;
  }

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
        else if (this.opts.onControl !== undefined) this.controlParts.push(this.unmask(buf, i, n));
        if ((this.state as State) === State.Broken) return; // the payload was over a bound
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
    if (!masked && this.opts.requireMask === true) return this.fail();
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
    this.opcode = opcode;
    if (this.control) {
      this.controlParts = [];
      if (!this.fin || len > 125 || rsv1 || opcode > 10) return this.fail();
    } else if (opcode === 0) {
      if (!this.inMessage || rsv1) return this.fail();
    } else if (opcode === 1 || opcode === 2) {
      if (this.inMessage || (rsv1 && !this.opts.deflate)) return this.fail();
      this.inMessage = true;
      this.compressed = rsv1;
      this.acc = EMPTY;
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
    if (this.state !== State.Broken) {
      this.state = State.Broken;
      this.acc = EMPTY;
      this.head = undefined;
      this.inflater?.close();
      this.order.length = 0;
      this.orderBytes = 0;
      this.opts.onBroken?.();
    }
    return Number.MAX_SAFE_INTEGER;
  }

  /** `buf[i, i+n)`, unmasked, into `out` at `at`. */
  private copyUnmasked(buf: Buffer, i: number, n: number, out: Buffer, at: number): void {
    const m = this.mask;
    if (m === undefined) {
      buf.copy(out, at, i, i + n);
      return;
    }
    let k = this.maskAt;
    if (n < WORDS_FROM) {
      for (let j = 0; j < n; j++, k = (k + 1) & 3) out[at + j] = buf[i + j]! ^ m[k]!;
      this.maskAt = k;
      return;
    }
    // Client audio comes as KiBs per message: a copy, then XOR by 32-bit words from the first
    // aligned byte (64 KiB: 199 µs byte by byte, 35 this way; bench/micro/ws-unmask.mjs).
    buf.copy(out, at, i, i + n);
    const base = out.byteOffset + at;
    let j = 0;
    for (const lead = (4 - (base & 3)) & 3; j < lead; j++, k = (k + 1) & 3) out[at + j]! ^= m[k]!;
    const words = (n - j) >>> 2;
    // The mask as it lines up from here, read in the platform's byte order.
    MASK_BYTES[0] = m[k]!;
    MASK_BYTES[1] = m[(k + 1) & 3]!;
    MASK_BYTES[2] = m[(k + 2) & 3]!;
    MASK_BYTES[3] = m[(k + 3) & 3]!;
    const word = MASK_WORD[0]!;
    const view = new Uint32Array(out.buffer, base + j, words);
    for (let w = 0; w < words; w++) view[w]! ^= word;
    for (j += words * 4; j < n; j++, k = (k + 1) & 3) out[at + j]! ^= m[k]!;
    this.maskAt = k;
  }

  /** A copy of `buf[i, i+n)`, unmasked (a control frame's payload). */
  private unmask(buf: Buffer, i: number, n: number): Buffer {
    const out = Buffer.allocUnsafe(n);
    this.copyUnmasked(buf, i, n, out, 0);
    return out;
  }

  private payload(buf: Buffer, i: number, n: number): void {
    if (n === 0) return;
    const size = this.bytes + n;
    if (size > this.opts.maxMessageBytes) {
      // Compressed: the rest of the stream depends on this message, so the reader stops.
      if (this.compressed) this.fail();
      else if (!this.oversize) {
        this.oversize = true;
        this.acc = EMPTY;
      }
      this.bytes = size;
      return;
    }
    if (size > this.acc.length) {
      const grown = Buffer.allocUnsafe(Math.min(this.opts.maxMessageBytes, Math.max(size, 2 * this.acc.length, 256)));
      this.acc.copy(grown, 0, 0, this.bytes);
      this.acc = grown;
    }
    this.copyUnmasked(buf, i, n, this.acc, this.bytes);
    this.bytes = size;
  }

  private frameDone(arrival: number): void {
    this.state = State.Head;
    if (this.control) {
      this.opts.onControl?.(this.opcode, this.controlParts.length === 1 ? this.controlParts[0]! : Buffer.concat(this.controlParts));
      this.controlParts = [];
      return;
    }
    if (!this.fin) return;
    this.inMessage = false;
    const message = this.oversize ? undefined : this.acc.subarray(0, this.bytes);
    this.acc = EMPTY;
    if (this.compressed) {
      const slot: Slot = { ready: false, data: undefined, arrival, counted: 0 };
      this.order.push(slot);
      const inflater = (this.inflater ??= new Inflater(this.opts.maxMessageBytes, () => this.fail()));
      inflater.add(message!, (data) => {
        slot.ready = true;
        slot.data = data;
        this.deliver();
      });
      return;
    }
    const data = message;
    // Behind a message still in zlib: it waits its turn.
    if (this.order.length > 0) {
      const counted = (data?.length ?? 0) + PART_OVERHEAD;
      this.orderBytes += counted;
      if (this.orderBytes > 4 * this.opts.maxMessageBytes) {
        this.fail();
        return;
      }
      this.order.push({ ready: true, data, arrival, counted });
    } else this.sink(data, arrival);
  }

  private deliver(): void {
    const q = this.order;
    while (q.length > 0 && q[0]!.ready && this.state !== State.Broken) {
      const s = q.shift()!;
      this.orderBytes -= s.counted;
      this.sink(s.data, s.arrival);
    }
  }

  close(): void {
    this.inflater?.close();
    this.acc = EMPTY;
    this.order.length = 0;
    this.orderBytes = 0;
  }
}

interface Slot {
  ready: boolean;
  data: Buffer | undefined;
  arrival: number;
  /** What it adds to `orderBytes` (uncompressed messages waiting behind one in zlib). */
  readonly counted: number;
}

/**
 * One direction's permessage-deflate decompressor: one raw inflate stream for the whole
 * connection, fed one message at a time (its payload and the trailer in one write, flushed),
 * so that what zlib holds is one message (measured: ~45 µs of CPU per small message, ~150 with
 * a write, a trailer and a flush apiece; bench/micro/ws-meter.mjs). A sender that resets its compressor per message
 * (`*_no_context_takeover`) needs no reset here: its messages never refer to earlier ones, and
 * the senders in use (zlib's sync flush: `ws`, browsers) end no block as final. After a final
 * block (which RFC 7692 allows, and no known sender writes) later messages inflate to nothing,
 * which no tracker reads as content.
 */
class Inflater {
  /** Every write ends with a sync flush: one thread-pool round trip per message, not three. */
  private readonly z = zlib.createInflateRaw({ windowBits: 15, flush: zlib.constants.Z_SYNC_FLUSH });
  private out: Buffer[] = [];
  private outBytes = 0;
  private closed = false;
  private busy = false;
  private readonly queue: { payload: Buffer; done: (data: Buffer) => void }[] = [];
  /** Compressed bytes queued behind the message in zlib: bounded. */
  private queued = 0;

  constructor(
    private readonly max: number,
    private readonly onError: () => void,
  ) {
    this.z.on('data', (c: Buffer) => {
      this.outBytes += c.length;
      // Past the cap the message cannot be kept, and the ones after it need its context: stop
      // (this also ends a compression bomb: zlib is destroyed mid-message).
      if (this.outBytes > this.max) this.fail();
      else this.out.push(c);
    });
    this.z.on('error', () => this.fail());
  }

  /** A whole compressed message (without its trailer); `done` gets its bytes, in order. */
  add(payload: Buffer, done: (data: Buffer) => void): void {
    if (this.closed) return;
    this.queued += payload.length + PART_OVERHEAD;
    if (this.queued > 4 * this.max) return this.fail();
    this.queue.push({ payload, done });
    this.pump();
  }

  private pump(): void {
    if (this.busy || this.closed || this.queue.length === 0) return;
    const job = this.queue.shift()!;
    this.queued -= job.payload.length + PART_OVERHEAD;
    this.busy = true;
    // Its output comes as 'data' before the write's callback.
    this.z.write(Buffer.concat([job.payload, TRAILER]), () => {
      this.busy = false;
      if (this.closed) return;
      const data = this.out.length === 1 ? this.out[0]! : Buffer.concat(this.out, this.outBytes);
      this.out = [];
      this.outBytes = 0;
      job.done(data);
      this.pump();
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
    this.queue.length = 0;
    this.out = [];
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
