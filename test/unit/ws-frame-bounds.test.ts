import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { CLOSE_GOING_AWAY, closeFrame, FrameBounds } from '../../src/ws/frame-bounds.js';
import { Receiver, Sender } from '../helpers/ws-frames.js';

// The frames are encoded by the `ws` library (its Sender), not by code of ours, and the proxy's
// Close frames are decoded by its Receiver: both sides of the check are a real implementation.

interface Spec {
  opcode: number;
  fin: boolean;
  length: number;
}

function encode(f: Spec, masked: boolean): Buffer {
  const data = Buffer.alloc(f.length, 0x61);
  return Buffer.concat(Sender.frame(data, { fin: f.fin, opcode: f.opcode, mask: masked, readOnly: false, rsv1: false }));
}

/** Payload lengths around each of the three length encodings' edges, and some in between. */
const length = fc.oneof(fc.constantFrom(0, 1, 125, 126, 127, 65_535, 65_536, 70_000), fc.integer({ min: 0, max: 400 }));
const frame: fc.Arbitrary<Spec> = fc.oneof(
  fc.record({ opcode: fc.constantFrom(0, 1, 2), fin: fc.boolean(), length }),
  fc.record({ opcode: fc.constantFrom(8, 9, 10), fin: fc.constant(true), length: fc.integer({ min: 0, max: 125 }) }),
);

describe('FrameBounds', () => {
  it('is at a boundary exactly where a frame ends, however the bytes are split (both directions)', () => {
    fc.assert(
      fc.property(fc.array(frame, { minLength: 1, maxLength: 8 }), fc.boolean(), fc.array(fc.nat(), { maxLength: 12 }), (frames, masked, cutsRaw) => {
        const parts = frames.map((f) => encode(f, masked));
        const bytes = Buffer.concat(parts);
        const ends = new Set<number>([0]);
        let at = 0;
        for (const p of parts) ends.add((at += p.length));
        const closeAt = frames.findIndex((f) => f.opcode === 8);
        const closeEnd = closeAt === -1 ? Infinity : parts.slice(0, closeAt + 1).reduce((n, p) => n + p.length, 0);
        const cuts = [...new Set(cutsRaw.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
        const fb = new FrameBounds(masked);
        let from = 0;
        for (const to of [...cuts, bytes.length]) {
          fb.push(bytes.subarray(from, to));
          from = to;
          expect(fb.broken).toBe(false);
          expect(fb.atBoundary).toBe(ends.has(to));
          // A Close is seen once its head is in.
          if (to >= closeEnd) expect(fb.closeSeen).toBe(true);
          if (closeAt === -1) expect(fb.closeSeen).toBe(false);
        }
      }),
      { numRuns: 300 },
    );
  });

  it('untilBoundary: from a point mid-frame, takes exactly the rest of that frame, however it comes split', () => {
    fc.assert(
      fc.property(fc.array(frame, { minLength: 1, maxLength: 6 }), fc.boolean(), fc.nat(), fc.array(fc.nat(), { maxLength: 8 }), (frames, masked, stopRaw, cutsRaw) => {
        const parts = frames.map((f) => encode(f, masked));
        const bytes = Buffer.concat(parts);
        const ends: number[] = [];
        let at = 0;
        for (const p of parts) ends.push((at += p.length));
        // The deadline's point: anywhere but a boundary (there, no frame is under way).
        const stop = stopRaw % bytes.length;
        fc.pre(stop !== 0 && !ends.includes(stop));
        const frameEnd = ends.find((e) => e > stop)!;
        const fb = new FrameBounds(masked);
        fb.push(bytes.subarray(0, stop));
        expect(fb.atBoundary).toBe(false);
        const cuts = [...new Set(cutsRaw.map((c) => stop + (c % (bytes.length - stop + 1))))].sort((a, b) => a - b);
        let from = stop;
        let taken = 0;
        for (const to of [...cuts, bytes.length]) {
          const n = fb.untilBoundary(bytes.subarray(from, to));
          taken += n;
          if (fb.atBoundary) break;
          expect(n).toBe(to - from); // not ended in this piece: all of it is the frame's
          from = to;
        }
        expect(fb.broken).toBe(false);
        expect(fb.atBoundary).toBe(true);
        expect(stop + taken).toBe(frameEnd);
      }),
      { numRuns: 300 },
    );
  });

  it('byte by byte', () => {
    const parts = [encode({ opcode: 1, fin: false, length: 300 }, true), encode({ opcode: 9, fin: true, length: 4 }, true), encode({ opcode: 0, fin: true, length: 70_000 }, true)];
    const bytes = Buffer.concat(parts);
    const fb = new FrameBounds(true);
    let boundaries = 0;
    for (let i = 0; i < bytes.length; i++) {
      fb.push(bytes.subarray(i, i + 1));
      if (fb.atBoundary) boundaries++;
    }
    expect(boundaries).toBe(3);
    expect(fb.atBoundary).toBe(true);
  });

  it.each([
    ['a reserved opcode', Buffer.from([0x83, 0x00]), false],
    ['a reserved control opcode', Buffer.from([0x8b, 0x00]), false],
    ['a fragmented control frame', Buffer.from([0x09, 0x00]), false],
    ['a control frame over 125 bytes', Buffer.from([0x89, 0x7e, 0x00, 0x80]), false],
    ['an unmasked frame from a client', Buffer.from([0x81, 0x00]), true],
    ['a masked frame from a server', Buffer.from([0x81, 0x80, 1, 2, 3, 4]), false],
    ['a length past 2^53', Buffer.from([0x82, 0x7f, 0x00, 0x20, 0, 0, 0, 0, 0, 0]), false],
  ])('stops at %s (then never at a boundary)', (_what, head, masked) => {
    const fb = new FrameBounds(masked);
    fb.push(encode({ opcode: 1, fin: true, length: 3 }, masked));
    expect(fb.atBoundary).toBe(true);
    fb.push(head);
    expect(fb.broken).toBe(true);
    expect(fb.atBoundary).toBe(false);
    fb.push(encode({ opcode: 1, fin: true, length: 3 }, masked));
    expect(fb.atBoundary).toBe(false);
  });
});

describe('closeFrame', () => {
  /** What ws's Receiver reads from the bytes: the Close's code and reason, or its error. */
  function receive(bytes: Buffer, isServer: boolean): Promise<{ code: number; reason: string }> {
    return new Promise((resolve, reject) => {
      const r = new Receiver({ isServer });
      r.on('conclude', (code: number, reason: Buffer) => resolve({ code, reason: reason.toString() }));
      r.on('error', reject);
      r.write(bytes);
    });
  }

  it('is a Close that a WebSocket peer reads, masked for the upstream and plain for the client', async () => {
    expect(await receive(closeFrame(CLOSE_GOING_AWAY, 'proxy shutting down', false), false)).toEqual({ code: 1001, reason: 'proxy shutting down' });
    expect(await receive(closeFrame(CLOSE_GOING_AWAY, 'proxy shutting down', true), true)).toEqual({ code: 1001, reason: 'proxy shutting down' });
    // The mask is random per frame (RFC 6455 §5.3).
    expect(closeFrame(1001, 'x', true).subarray(2, 6).equals(closeFrame(1001, 'x', true).subarray(2, 6))).toBe(false);
    // A server rejects an unmasked frame, a client a masked one: each encoding is for its side only.
    await expect(receive(closeFrame(1001, 'x', false), true)).rejects.toThrow(/MASK/);
    await expect(receive(closeFrame(1001, 'x', true), false)).rejects.toThrow(/MASK/);
    // Followed as a Close by FrameBounds.
    const fb = new FrameBounds(true);
    fb.push(closeFrame(1001, 'é'.repeat(61), true));
    expect([fb.atBoundary, fb.closeSeen]).toEqual([true, true]);
    expect(() => closeFrame(1001, 'é'.repeat(62), false)).toThrow(RangeError);
  });
});
