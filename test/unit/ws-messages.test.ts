import fc from 'fast-check';
import zlib from 'node:zlib';
import { describe, expect, it, vi } from 'vitest';
import * as wsModule from 'ws';
import { deflateAccepted, MessageReader } from '../../src/ws/messages.js';

// Frames come from the `ws` package's own encoder (RFC 6455), compressed payloads from zlib as
// RFC 7692 describes (raw deflate, sync flush, the trailing 00 00 ff ff removed), and every
// split of the bytes into reads must give the same messages.

// `ws` exports its frame encoder at run time; its types leave it out.
const Sender = (wsModule as unknown as { Sender: { frame(data: Buffer, o: Record<string, unknown>): Buffer[] } }).Sender;

interface FrameOpts {
  opcode: number;
  fin?: boolean;
  mask?: boolean;
  rsv1?: boolean;
}

function frame(payload: Buffer | string, o: FrameOpts): Buffer {
  const data = typeof payload === 'string' ? Buffer.from(payload) : payload;
  const parts = Sender.frame(Buffer.from(data), { fin: o.fin ?? true, mask: o.mask ?? false, opcode: o.opcode, readOnly: false, rsv1: o.rsv1 ?? false });
  return Buffer.concat(parts);
}

/** A message in `n` fragments, with a ping and a pong between fragments. */
function fragmented(text: string, n: number, mask: boolean): Buffer {
  const b = Buffer.from(text);
  const size = Math.ceil(b.length / n);
  const out: Buffer[] = [];
  for (let i = 0; i < n; i++) {
    out.push(frame(b.subarray(i * size, (i + 1) * size), { opcode: i === 0 ? 1 : 0, fin: i === n - 1, mask }));
    if (i < n - 1) out.push(frame('ping', { opcode: 9, mask }), frame('', { opcode: 10, mask }));
  }
  return Buffer.concat(out);
}

interface Got {
  data: string | undefined;
  at: number;
}

function reader(max = 1 << 20, deflate = false): { r: MessageReader; got: Got[] } {
  const got: Got[] = [];
  const r = new MessageReader((d, at) => got.push({ data: d?.toString('latin1'), at }), { maxMessageBytes: max, deflate });
  return { r, got };
}

/** Feeds `bytes` cut at `cuts`; each read's arrival is the index of its last byte. */
function feed(r: MessageReader, bytes: Buffer, cuts: number[]): void {
  const points = [...new Set(cuts.filter((c) => c > 0 && c < bytes.length))].sort((a, b) => a - b);
  let from = 0;
  for (const c of [...points, bytes.length]) {
    r.push(bytes.subarray(from, c), c - 1);
    from = c;
  }
}

const SIZES = [0, 1, 125, 126, 127, 65535, 65536, 70000];
const payloadOf = (n: number, seed: number) => Buffer.from(Array.from({ length: n }, (_, i) => 32 + ((i * 7 + seed) % 90))).toString('latin1');

function stream(mask: boolean): { bytes: Buffer; messages: string[]; ends: number[] } {
  const chunks: Buffer[] = [];
  const messages: string[] = [];
  const ends: number[] = [];
  let len = 0;
  const add = (b: Buffer, message?: string) => {
    chunks.push(b);
    len += b.length;
    if (message !== undefined) {
      messages.push(message);
      ends.push(len - 1);
    }
  };
  SIZES.forEach((n, i) => add(frame(Buffer.from(payloadOf(n, i), 'latin1'), { opcode: i % 2 === 0 ? 1 : 2, mask }), payloadOf(n, i)));
  const text = '{"type":"response.output_text.delta","delta":"fragmented"}';
  add(fragmented(text, 3, mask), text);
  add(frame(Buffer.from([0x03, 0xe8]), { opcode: 8, mask })); // close
  return { bytes: Buffer.concat(chunks), messages, ends };
}

describe('MessageReader: frames', () => {
  for (const mask of [false, true]) {
    it(`reads every length form, fragments and control frames in one read (${mask ? 'client, masked' : 'server'})`, () => {
      const s = stream(mask);
      const { r, got } = reader();
      r.push(s.bytes, 7);
      expect(got.map((g) => g.data)).toEqual(s.messages);
      expect(got.every((g) => g.at === 7)).toBe(true);
      expect(r.broken).toBe(false);
    });

    it(`gives the same messages, each at the read of its last byte, however the bytes are split (${mask ? 'masked' : 'server'})`, () => {
      const s = stream(mask);
      fc.assert(
        fc.property(fc.array(fc.integer({ min: 1, max: s.bytes.length - 1 }), { maxLength: 40 }), (cuts) => {
          const { r, got } = reader();
          feed(r, s.bytes, cuts);
          expect(got.map((g) => g.data)).toEqual(s.messages);
          // The read that completed a message is the one holding its last byte.
          const points = [...new Set(cuts)].sort((a, b) => a - b);
          expect(got.map((g) => g.at)).toEqual(s.ends.map((e) => (points.find((p) => p > e) ?? s.bytes.length) - 1));
        }),
        { numRuns: 200 },
      );
    });
  }

  it('reads small messages one byte per read', () => {
    const bytes = Buffer.concat([frame('a', { opcode: 1 }), fragmented('hello world', 4, true), frame('', { opcode: 2, mask: true }), frame('x'.repeat(300), { opcode: 1 })]);
    const { r, got } = reader();
    for (let i = 0; i < bytes.length; i++) r.push(bytes.subarray(i, i + 1), i);
    expect(got.map((g) => g.data)).toEqual(['a', 'hello world', '', 'x'.repeat(300)]);
    expect(got.at(-1)!.at).toBe(bytes.length - 1);
  });

  it('unmasks client payloads exactly for any length, fragments and split (by words from 256 bytes, at any alignment and mask offset)', () => {
    fc.assert(
      fc.property(fc.array(fc.uint8Array({ maxLength: 3000, size: 'max' }), { minLength: 1, maxLength: 4 }), fc.array(fc.nat(), { maxLength: 12 }), (parts, cuts) => {
        const frames = parts.map((p, i) => frame(Buffer.from(p), { opcode: i === 0 ? 2 : 0, fin: i === parts.length - 1, mask: true }));
        const bytes = Buffer.concat(frames);
        const { r, got } = reader();
        feed(r, bytes, cuts.map((c) => c % (bytes.length + 1)));
        expect(got.map((g) => g.data)).toEqual([Buffer.concat(parts).toString('latin1')]);
      }),
      { numRuns: 300 },
    );
  });

  it('unmasks into a buffer at any address: the words line up with the memory, not the message (review 119)', () => {
    // Node's buffers start 8-aligned today, so the reader's own never test this: it is given
    // buffers that start 1-3 bytes past a word.
    const alloc = Buffer.allocUnsafe.bind(Buffer);
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 3 }), fc.array(fc.uint8Array({ minLength: 256, maxLength: 3000 }), { minLength: 1, maxLength: 3 }), (shift, parts) => {
        const spy = vi.spyOn(Buffer, 'allocUnsafe').mockImplementation((n: number) => alloc(n + shift).subarray(shift));
        try {
          const frames = parts.map((p, i) => frame(Buffer.from(p), { opcode: i === 0 ? 2 : 0, fin: i === parts.length - 1, mask: true }));
          const { r, got } = reader();
          r.push(Buffer.concat(frames), 0);
          expect(spy).toHaveBeenCalled();
          expect(got.map((g) => g.data)).toEqual([Buffer.concat(parts).toString('latin1')]);
        } finally {
          spy.mockRestore();
        }
      }),
      { numRuns: 100 },
    );
  });

  it('reports a message over the cap without its bytes, and goes on', () => {
    const { r, got } = reader(1000);
    r.push(Buffer.concat([frame('y'.repeat(1001), { opcode: 1 }), fragmented('z'.repeat(1500), 3, false), frame('ok', { opcode: 1 })]), 1);
    expect(got.map((g) => g.data)).toEqual([undefined, undefined, 'ok']);
  });

  // [name, bytes, the reader has permessage-deflate]
  const broken: [string, Buffer, boolean?][] = [
    ['RSV2 set', Buffer.from([0xa1, 0x01, 0x61])],
    ['RSV3 set', Buffer.from([0x91, 0x01, 0x61])],
    ['RSV1 on a control frame, with permessage-deflate', frame('a', { opcode: 9, rsv1: true }), true],
    ['RSV1 on a continuation, with permessage-deflate', Buffer.concat([frame('a', { opcode: 1, fin: false }), frame('b', { opcode: 0, rsv1: true })]), true],
    ['RSV1 without permessage-deflate', frame('a', { opcode: 1, rsv1: true })],
    ['a continuation that continues nothing', frame('a', { opcode: 0 })],
    ['a new message inside a fragmented one', Buffer.concat([frame('a', { opcode: 1, fin: false }), frame('b', { opcode: 1 })])],
    ['a fragmented control frame', frame('a', { opcode: 9, fin: false })],
    ['a control frame over 125 bytes', frame('p'.repeat(126), { opcode: 9 })],
    ['a reserved opcode', frame('a', { opcode: 3 })],
    ['a 64-bit length beyond 2^53', Buffer.from([0x82, 0x7f, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0])],
  ];
  for (const [name, bad, deflate = false] of broken) {
    it(`stops at ${name}, without throwing`, () => {
      const { r, got } = reader(1 << 20, deflate);
      expect(() => r.push(Buffer.concat([frame('before', { opcode: 1 }), bad, frame('after', { opcode: 1 })]), 0)).not.toThrow();
      expect(got.map((g) => g.data)).toEqual(['before']);
      expect(r.broken).toBe(true);
      r.push(frame('later', { opcode: 1 }), 1);
      expect(got).toHaveLength(1);
    });
  }
});

/** permessage-deflate as a sender with context takeover makes it: one raw deflate stream. */
async function compressor(): Promise<(text: string) => Promise<Buffer>> {
  const z = zlib.createDeflateRaw();
  const out: Buffer[] = [];
  z.on('data', (c: Buffer) => out.push(c));
  return (text) =>
    new Promise((resolve) => {
      z.write(Buffer.from(text));
      z.flush(zlib.constants.Z_SYNC_FLUSH, () => {
        const all = Buffer.concat(out.splice(0));
        expect(all.subarray(-4)).toEqual(Buffer.from([0, 0, 0xff, 0xff]));
        resolve(all.subarray(0, -4));
      });
    });
}

async function settle(got: Got[], n: number): Promise<void> {
  for (let i = 0; i < 200 && got.length < n; i++) await new Promise((r) => setTimeout(r, 5));
}

describe('MessageReader: permessage-deflate', () => {
  it('inflates compressed messages with context kept across them, in order with uncompressed ones, every split', async () => {
    const deflate = await compressor();
    const texts = Array.from({ length: 12 }, (_, i) => `{"type":"response.output_audio.delta","response_id":"resp_1","delta":"${'QUJD'.repeat(50 + i * 40)}"}`);
    const frames: Buffer[] = [];
    const expected: string[] = [];
    for (const [i, t] of texts.entries()) {
      const mask = i % 3 === 0;
      if (i % 4 === 1) {
        // Small messages go uncompressed (ws's threshold), between compressed ones.
        frames.push(frame(`small ${i}`, { opcode: 1, mask }));
        expected.push(`small ${i}`);
      }
      const c = await deflate(t);
      if (i % 5 === 2) {
        // A compressed message in fragments: RSV1 on the first frame only.
        const half = Math.floor(c.length / 2);
        frames.push(frame(c.subarray(0, half), { opcode: 1, fin: false, rsv1: true, mask }), frame('', { opcode: 9, mask }), frame(c.subarray(half), { opcode: 0, mask }));
      } else {
        frames.push(frame(c, { opcode: 1, rsv1: true, mask }));
      }
      expected.push(t);
    }
    const bytes = Buffer.concat(frames);
    await fc.assert(
      fc.asyncProperty(fc.array(fc.integer({ min: 1, max: bytes.length - 1 }), { maxLength: 30 }), async (cuts) => {
        const { r, got } = reader(1 << 20, true);
        feed(r, bytes, cuts);
        await settle(got, expected.length);
        expect(got.map((g) => g.data)).toEqual(expected);
        expect(r.broken).toBe(false);
        r.close();
      }),
      { numRuns: 25 },
    );
  });

  it('stops at a compressed message that inflates past the cap (the next ones need its context), a compression bomb too', async () => {
    const deflate = await compressor();
    const big = 'A'.repeat(5000);
    const bytes = Buffer.concat([frame(await deflate('first'), { opcode: 1, rsv1: true }), frame(await deflate(big), { opcode: 1, rsv1: true }), frame(await deflate('after'), { opcode: 1, rsv1: true })]);
    const { r, got } = reader(4000, true);
    r.push(bytes, 3);
    for (let i = 0; i < 200 && !r.broken; i++) await new Promise((res) => setTimeout(res, 5));
    expect(r.broken).toBe(true);
    expect(got.map((g) => g.data)).toEqual(['first']);
    const { r: r2, got: got2 } = reader(6000, true);
    r2.push(bytes, 3);
    await settle(got2, 3);
    expect(got2.map((g) => g.data)).toEqual(['first', big, 'after']);
    expect(got2.map((g) => g.at)).toEqual([3, 3, 3]);

    // 1 KiB on the wire that inflates to 64 MiB: stopped at the cap, long before the end.
    const bomb = zlib.deflateRawSync(Buffer.alloc(64 << 20), { level: 9, finishFlush: zlib.constants.Z_SYNC_FLUSH });
    const { r: r3 } = reader(1 << 20, true);
    const t0 = Date.now();
    r3.push(frame(bomb.subarray(0, -4), { opcode: 2, rsv1: true }), 0);
    for (let i = 0; i < 400 && !r3.broken; i++) await new Promise((res) => setTimeout(res, 5));
    expect(r3.broken).toBe(true);
    expect(Date.now() - t0).toBeLessThan(1500);
  });

  it('delivers a read holding hundreds of small compressed messages, in order with uncompressed ones', async () => {
    const deflate = await compressor();
    const frames: Buffer[] = [];
    const expected: string[] = [];
    for (let i = 0; i < 300; i++) {
      const t = `{"type":"response.output_audio.delta","delta":"d${i}"}`;
      frames.push(i % 7 === 0 ? frame(t, { opcode: 1 }) : frame(await deflate(t), { opcode: 1, rsv1: true }));
      expected.push(t);
    }
    // An empty compressed message (RSV1, no payload) is valid too.
    frames.push(frame(Buffer.alloc(0), { opcode: 1, rsv1: true }));
    expected.push('');
    const { r, got } = reader(1 << 20, true);
    r.push(Buffer.concat(frames), 9);
    await settle(got, expected.length);
    expect(r.broken).toBe(false);
    expect(got.map((g) => g.data)).toEqual(expected);
  });

  it('bounds what waits behind a message in zlib at 4x the cap, 96 bytes counted per message: at the bound it goes on, past it it stops (review 117, N5, N6)', async () => {
    const max = 1000;
    // Stored (level 0) deflate: the payload is the text plus a constant, so sizes are exact.
    const stored = (n: number) => zlib.deflateRawSync(Buffer.alloc(n, 0x61), { level: 0, finishFlush: zlib.constants.Z_SYNC_FLUSH }).subarray(0, -4);
    const extra = stored(10).length - 10;
    const compressedOf = (len: number) => frame(stored(len - extra), { opcode: 1, rsv1: true });
    const plainOf = (len: number) => frame(Buffer.alloc(len, 0x62), { opcode: 1 });
    // The first compressed message is in zlib while the rest of the read is taken; 4 x (904 + 96)
    // is the bound exactly: compressed ones queue for zlib, uncompressed ones wait for their turn.
    for (const [what, of] of [
      ['compressed', compressedOf],
      ['uncompressed', plainOf],
    ] as const) {
      for (const over of [false, true]) {
        const { r, got } = reader(max, true);
        const waiting = [904, 904, 904, over ? 905 : 904];
        r.push(Buffer.concat([compressedOf(500), ...waiting.map((n) => of(n))]), 1);
        expect([what, over, r.broken]).toEqual([what, over, over]);
        if (!over) {
          const lengths = [500 - extra, ...waiting.map((n) => (what === 'compressed' ? n - extra : n))];
          await settle(got, 5);
          expect(got.map((g) => g.data!.length)).toEqual(lengths);
          // Delivered, they count no more: the same again is within the bound.
          r.push(Buffer.concat([compressedOf(500), ...waiting.map((n) => of(n))]), 2);
          expect(r.broken).toBe(false);
          await settle(got, 10);
          expect(got.map((g) => g.data!.length)).toEqual([...lengths, ...lengths]);
        }
        r.close();
      }
    }
  });

  it('holds a message in tiny fragments in one buffer, bounded by the cap', async () => {
    const { r, got } = reader(64 * 1024, true);
    const { r: plain, got: gotPlain } = reader(64 * 1024, false);
    const more = frame(Buffer.from([0x4a]), { opcode: 0, fin: false });
    const over = Buffer.concat(Array.from({ length: 70_000 }, () => more)); // 70,000 one-byte fragments
    r.push(Buffer.concat([frame(Buffer.from([0x4a]), { opcode: 1, fin: false, rsv1: true }), over]), 0);
    expect(r.broken).toBe(true); // compressed: the stream cannot go on without it
    plain.push(Buffer.concat([frame('x', { opcode: 1, fin: false }), over, frame('y', { opcode: 0 }), frame('ok', { opcode: 1 })]), 0);
    expect(gotPlain.map((g) => g.data?.length)).toEqual([undefined, 2]); // plain: over the cap, skipped
    const under = Buffer.concat(Array.from({ length: 5000 }, () => more));
    plain.push(Buffer.concat([frame('x', { opcode: 1, fin: false }), under, frame('y', { opcode: 0 })]), 1);
    expect(gotPlain.at(-1)!.data).toBe(`x${'J'.repeat(5000)}y`);
    expect(got).toEqual([]);
  });

  it('stops at a payload that is not deflate data, without throwing', async () => {
    const { r, got } = reader(1 << 20, true);
    r.push(Buffer.concat([frame(Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff]), { opcode: 1, rsv1: true }), frame('after', { opcode: 1 })]), 0);
    for (let i = 0; i < 200 && !r.broken; i++) await new Promise((res) => setTimeout(res, 5));
    expect(r.broken).toBe(true);
    expect(got).toEqual([]);
  });
});

describe('deflateAccepted', () => {
  it('reads the 101 answer', () => {
    expect(deflateAccepted(undefined)).toBe(false);
    expect(deflateAccepted('')).toBe(false);
    expect(deflateAccepted('permessage-deflate')).toBe(true);
    expect(deflateAccepted('Permessage-Deflate; server_no_context_takeover; client_max_window_bits=10')).toBe(true);
    expect(deflateAccepted('x-webkit-deflate-frame')).toBeNull();
    expect(deflateAccepted('permessage-deflate, x-other')).toBeNull();
    // Accepted twice: RFC 7692 §5.1 lets a server accept one offer only (review 117, N11).
    expect(deflateAccepted('permessage-deflate, permessage-deflate; server_no_context_takeover')).toBeNull();
  });
});
