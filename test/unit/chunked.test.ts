import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ChunkedDecoder, ChunkedError } from '../../src/proxy/chunked.js';
import { splitAt, views } from '../helpers/ranges.js';

interface Encoded {
  wire: Buffer;
  body: Buffer;
  /** Offset of the last-chunk line: everything before it is forwarded verbatim. */
  lastChunkAt: number;
  /** For every data byte of the body, the wire offset just past it. */
  dataEnds: number[];
}

const chunkArb = fc.record({
  // size 'max': fast-check's default size kept arrays to ~12 bytes, so no size had a hex d, e or f.
  data: fc.uint8Array({ minLength: 1, maxLength: 300, size: 'max' }),
  upper: fc.boolean(),
  zeros: fc.integer({ min: 0, max: 2 }),
  ext: fc.constantFrom('', ';a=b', ' ;x', ';name="quoted"', '\t;q'),
  lf: fc.constantFrom('\r\n', '\n'),
});

type Chunk = typeof chunkArb extends fc.Arbitrary<infer T> ? T : never;

function encode(chunks: Chunk[], trailer: string, lastExt: string): Encoded {
  const parts: Buffer[] = [];
  const dataEnds: number[] = [];
  let off = 0;
  const add = (b: Buffer) => {
    parts.push(b);
    off += b.length;
  };
  for (const c of chunks) {
    let hex = c.data.length.toString(16);
    hex = '0'.repeat(c.zeros) + (c.upper ? hex.toUpperCase() : hex);
    add(Buffer.from(`${hex}${c.ext}${c.lf}`, 'latin1'));
    for (let i = 0; i < c.data.length; i++) dataEnds.push(off + i + 1);
    add(Buffer.from(c.data));
    add(Buffer.from(c.lf, 'latin1'));
  }
  const lastChunkAt = off;
  add(Buffer.from(`0${lastExt}\r\n${trailer}\r\n`, 'latin1'));
  return {
    wire: Buffer.concat(parts),
    body: Buffer.concat(chunks.map((c) => Buffer.from(c.data))),
    lastChunkAt,
    dataEnds,
  };
}

describe('ChunkedDecoder', () => {
  it('decodes a simple body and holds back the last chunk', () => {
    const d = new ChunkedDecoder();
    const wire = Buffer.from('5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n');
    const out = d.push(wire);
    expect(out.toString()).toBe('5\r\nhello\r\n6\r\n world\r\n');
    expect(d.ranges).toEqual([3, 8, 13, 19]);
    expect(Buffer.concat(views(wire, d.ranges)).toString()).toBe('hello world');
    expect(d.done).toBe(true);
    expect(d.messageEnd).toBe(wire.length);
  });

  it('for every split of every framing: payload exact, forwarded bytes verbatim up to the last chunk, no data byte held back', () => {
    fc.assert(
      fc.property(
        fc.array(chunkArb, { minLength: 0, maxLength: 8 }),
        fc.constantFrom('', 'x-trailer: 1\r\n', 'a: b\r\nc: d\r\n'),
        fc.constantFrom('', ';done'),
        fc.array(fc.nat(), { maxLength: 12 }),
        fc.boolean(),
        (chunks, trailer, lastExt, cuts, extra) => {
          const enc = encode(chunks, trailer, lastExt);
          const tail = extra ? Buffer.from('HTTP/1.1 200 OK\r\n') : Buffer.alloc(0);
          const wire = Buffer.concat([enc.wire, tail]);
          const d = new ChunkedDecoder();
          const forwarded: Buffer[] = [];
          const data: Buffer[] = [];
          let fwdLen = 0;
          let dataLen = 0;
          let consumed = 0;
          let endAt = -1;
          for (const piece of splitAt(wire, cuts)) {
            const out = d.push(piece);
            // Slices must survive the caller reusing its buffer: copy like the proxy does.
            forwarded.push(Buffer.from(out));
            fwdLen += out.length;
            for (const s of views(piece, d.ranges)) {
              data.push(Buffer.from(s));
              dataLen += s.length;
            }
            if (d.messageEnd >= 0) endAt = consumed + d.messageEnd;
            consumed += piece.length;
            // Every payload byte decoded so far has been forwarded.
            if (dataLen > 0) expect(fwdLen).toBeGreaterThanOrEqual(enc.dataEnds[dataLen - 1]!);
          }
          expect(Buffer.concat(data).equals(enc.body)).toBe(true);
          expect(Buffer.concat(forwarded).equals(enc.wire.subarray(0, enc.lastChunkAt))).toBe(true);
          expect(d.done).toBe(true);
          expect(endAt).toBe(enc.wire.length);
        },
      ),
      { numRuns: 2000 },
    );
  });

  it('holds back a size line split across reads, then releases it with its data', () => {
    const d = new ChunkedDecoder();
    expect(d.push(Buffer.from('1')).length).toBe(0);
    expect(d.push(Buffer.from('0')).length).toBe(0);
    const read = Buffer.from('\r\n0123456789abcdef');
    const out = d.push(read);
    expect(out.toString()).toBe('10\r\n0123456789abcdef');
    expect(Buffer.concat(views(read, d.ranges)).toString()).toBe('0123456789abcdef');
  });

  it('never forwards a last chunk that arrives one byte at a time', () => {
    const d = new ChunkedDecoder();
    const out: string[] = [];
    for (const ch of '3\r\nabc\r\n0\r\n\r\n') out.push(d.push(Buffer.from(ch)).toString());
    expect(out.join('')).toBe('3\r\nabc\r\n');
    expect(d.done).toBe(true);
  });

  it.each([
    ['a non-hex size', 'zz\r\n', '', ''],
    ['an empty size', '\r\n', '', ''],
    ['a bare CR after chunk data', '2\r\nab\rX', '2\r\nab\r', 'ab'],
    ['data longer than its size', '2\r\nabc\r\n', '2\r\nab', 'ab'],
    ['a size beyond 2^48', '1000000000000\r\n', '', ''],
    ['whitespace inside the size', '1 2\r\n', '', ''],
    ['a CR without LF after the size', '2\rab', '', ''],
  ])('rejects %s, after returning the bytes before the fault', (_name, wire, moreOut, moreData) => {
    const d = new ChunkedDecoder();
    const read = Buffer.from(`3;e\r\nabc\r\n${wire}`);
    const out = d.push(read);
    expect(d.error).toBeInstanceOf(ChunkedError);
    expect(out.toString()).toBe(`3;e\r\nabc\r\n${moreOut}`);
    expect(Buffer.concat(views(read, d.ranges)).toString()).toBe(`abc${moreData}`);
    expect(d.push(Buffer.from('3\r\nabc\r\n')).length).toBe(0); // nothing after a fault
  });

  it('keeps a released split size line when a fault follows in the same read', () => {
    const d = new ChunkedDecoder();
    expect(d.push(Buffer.from('2')).length).toBe(0);
    const out = d.push(Buffer.from('\r\nhi\r\nq'));
    expect(d.error).toBeInstanceOf(ChunkedError);
    expect(out.toString()).toBe('2\r\nhi\r\n');
  });

  it('rejects an endless size line and an endless trailer section', () => {
    const a = new ChunkedDecoder();
    a.push(Buffer.from(`1;${'x'.repeat(5000)}`));
    expect(a.error).toBeInstanceOf(ChunkedError);
    const d = new ChunkedDecoder();
    d.push(Buffer.from('0\r\n'));
    expect(d.error).toBeUndefined();
    d.push(Buffer.from(`x: ${'y'.repeat(70_000)}`));
    expect(d.error).toBeInstanceOf(ChunkedError);
  });
});
