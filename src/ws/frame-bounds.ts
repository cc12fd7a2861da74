import { randomFillSync } from 'node:crypto';

/**
 * Follows where the frames (RFC 6455 §5.2) of one direction of a WebSocket tunnel begin and end,
 * from the bytes as they were forwarded: only each frame's head (2-14 bytes) is read, payloads are
 * skipped by their length. At the shutdown deadline it says whether the proxy may put a Close
 * frame of its own into that direction (between two frames, none sent yet), or, mid-frame, where
 * the frame under way ends (`untilBoundary`), so that the peer is told "going away" (1001) instead
 * of seeing its connection reset mid-session. Control frames may come between the fragments of a
 * message (§5.4), so a frame boundary is enough.
 *
 * It stops for good (`broken`) at a head that breaks the protocol as far as it can tell here: a
 * reserved opcode, a fragmented or over-long control frame, a length past 2^53, or the wrong
 * masking for the direction. A direction it cannot follow is cut, as before.
 */
export class FrameBounds {
  /** A frame head not complete yet. */
  private readonly head = new Uint8Array(14);
  private headLen = 0;
  /** Head bytes this frame's head has, once its first two are in. */
  private headNeed = 2;
  /** Payload bytes of the current frame still to come. */
  private remaining = 0;
  /** A Close frame went this way: the closing handshake has begun. */
  closeSeen = false;
  broken = false;

  /** @param masked frames in this direction are masked (a client's, RFC 6455 §5.1). */
  constructor(private readonly masked: boolean) {}

  /** Between two frames, with nothing broken. */
  get atBoundary(): boolean {
    return !this.broken && this.headLen === 0 && this.remaining === 0;
  }

  /** Bytes forwarded in this direction, in order. */
  push(b: Uint8Array): void {
    this.scan(b, false);
  }

  /**
   * Follows `b` only up to the end of the frame under way: how many of its bytes belong to that
   * frame (all of them when it does not end in `b`; `atBoundary` then says which), or up to the
   * end of a head that breaks the protocol (`broken` then says so). For a direction
   * mid-frame at the shutdown deadline, whose frame is let finish before the Close goes in.
   */
  untilBoundary(b: Uint8Array): number {
    return this.scan(b, true);
  }

  private scan(b: Uint8Array, toBoundary: boolean): number {
    let i = 0;
    const n = b.length;
    while (i < n && !this.broken) {
      if (this.remaining > 0) {
        const take = Math.min(this.remaining, n - i);
        this.remaining -= take;
        i += take;
        if (toBoundary && this.remaining === 0) return i;
        continue;
      }
      this.head[this.headLen++] = b[i++]!;
      if (this.headLen === 2) this.headNeed = 2 + (this.head[1]! & 0x80 ? 4 : 0) + lengthBytes(this.head[1]! & 0x7f);
      if (this.headLen === this.headNeed) {
        this.frameHead();
        if (toBoundary && this.atBoundary) return i; // a frame with no payload
      }
    }
    return i;
  }

  private frameHead(): void {
    const h = this.head;
    this.headLen = 0;
    const opcode = h[0]! & 0x0f;
    const fin = (h[0]! & 0x80) !== 0;
    const len7 = h[1]! & 0x7f;
    let length = len7;
    if (len7 === 126) length = (h[2]! << 8) | h[3]!;
    else if (len7 === 127) {
      const high = ((h[2]! << 24) | (h[3]! << 16) | (h[4]! << 8) | h[5]!) >>> 0;
      const low = ((h[6]! << 24) | (h[7]! << 16) | (h[8]! << 8) | h[9]!) >>> 0;
      if (high > 0x1fffff) return void (this.broken = true);
      length = high * 2 ** 32 + low;
    }
    const control = opcode >= 8;
    const known = opcode <= 2 || (opcode >= 8 && opcode <= 10);
    if (!known || ((h[1]! & 0x80) !== 0) !== this.masked || (control && (!fin || length > 125))) {
      this.broken = true;
      return;
    }
    if (opcode === 8) this.closeSeen = true;
    this.remaining = length;
  }
}

const lengthBytes = (len7: number): number => (len7 === 126 ? 2 : len7 === 127 ? 8 : 0);

/** Close codes (RFC 6455 §7.4.1). */
export const CLOSE_GOING_AWAY = 1001;

/**
 * A Close frame with `code` and `reason` (at most 123 bytes of UTF-8), masked with a random key
 * when the proxy sends it as the upstream's client.
 */
export function closeFrame(code: number, reason: string, masked: boolean): Buffer {
  const text = Buffer.from(reason, 'utf8');
  if (text.length > 123) throw new RangeError('a Close frame reason is at most 123 bytes');
  const payload = Buffer.alloc(2 + text.length);
  payload.writeUInt16BE(code, 0);
  text.copy(payload, 2);
  if (!masked) return Buffer.concat([Buffer.from([0x88, payload.length]), payload]);
  const key = randomFillSync(Buffer.alloc(4));
  for (let i = 0; i < payload.length; i++) payload[i] = payload[i]! ^ key[i & 3]!;
  return Buffer.concat([Buffer.from([0x88, 0x80 | payload.length]), key, payload]);
}
