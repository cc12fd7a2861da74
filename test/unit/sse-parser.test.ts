import fc from 'fast-check';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SseParser, type SseEvent, type SseLane } from '../../src/sse/parser.js';
import { referenceParse } from '../helpers/reference-sse.js';

const FIXTURES = join(__dirname, '../fixtures/sse');
const sseFiles = readdirSync(FIXTURES).filter((f) => f.endsWith('.sse'));

const plain = (evs: { type: string; data: string; id: string | undefined }[]) => evs.map((e) => ({ type: e.type, data: e.data, id: e.id }));

/**
 * `expect(actual).toEqual(expected)` for arrays of strings or of flat objects of strings, with
 * vitest's deep comparison run only when a cheap field-by-field one finds a difference: the splits
 * below make ~10^5 such comparisons, and deep-comparing (or serialising) whole event arrays each
 * time was most of this file's time. A missing field and an undefined one count as equal, as in toEqual.
 */
function expectSame(actual: readonly unknown[], expected: readonly unknown[], message?: string): void {
  if (!shallowEqualRows(actual, expected)) expect(actual, message).toEqual(expected);
}

function shallowEqualRows(a: readonly unknown[], b: readonly unknown[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    const y = b[i];
    if (x === y) continue;
    if (typeof x !== 'object' || typeof y !== 'object' || x === null || y === null) return false;
    const keys = new Set([...Object.keys(x), ...Object.keys(y)]);
    for (const k of keys) if ((x as Record<string, unknown>)[k] !== (y as Record<string, unknown>)[k]) return false;
  }
  return true;
}

/**
 * Parses the chunks twice: plainly, and with an `onData` hook that sees every
 * event's bytes and consumes every other one. The hook must see exactly the
 * events of the plain parse, and the parser must deliver exactly the ones it
 * declined, so every test below checks the byte path too.
 */
function parseChunks(chunks: Uint8Array[], maxEventBytes?: number): { events: SseEvent[]; parser: SseParser } {
  const events: SseEvent[] = [];
  const parser = new SseParser((e) => events.push(e), maxEventBytes ? { maxEventBytes } : {});
  for (const c of chunks) parser.push(c);
  parser.end();

  const offered: { type: string; data: string }[] = [];
  const declined: SseEvent[] = [];
  const hooked = new SseParser((e) => declined.push(e), {
    ...(maxEventBytes ? { maxEventBytes } : {}),
    onData: (buf, start, end, type) => offered.push({ type, data: buf.toString('utf8', start, end) }) % 2 === 1,
  });
  for (const c of chunks) hooked.push(c);
  hooked.end();
  // An event over the cap is never offered as bytes: it comes to onEvent, with its edges.
  const normal = events.filter((e) => e.oversize === undefined);
  expectSame(offered, normal.map((e) => ({ type: e.type, data: e.data })));
  expectSame(plain(declined.filter((e) => e.oversize === undefined)), plain(normal.filter((_, i) => i % 2 === 1)));
  expect(declined.filter((e) => e.oversize !== undefined)).toEqual(events.filter((e) => e.oversize !== undefined));

  // And with a lane that recognises a value as the bytes up to the line's end,
  // or not at all when its length is odd: lane and normal path together must
  // deliver the plain parse's events, in order.
  const mixed: { type: string; data: string }[] = [];
  const laned = new SseParser((e) => mixed.push({ type: e.type, data: e.data }), {
    ...(maxEventBytes ? { maxEventBytes } : {}),
    lane: lineLane((data) => {
      mixed.push({ type: '', data });
      lanes.taken++;
    }, true),
  });
  for (const c of chunks) laned.push(c);
  laned.end();
  expectSame(mixed, events.map((e) => ({ type: e.type, data: e.data })));

  // And offered as ranges of larger buffers (as a chunked read holds its events
  // between framing bytes), with line ends and events before the range and an
  // event that does not start with a line end after it: the same events, plainly,
  // with the byte hook and with the lane.
  const ranged: SseEvent[] = [];
  const rangedParser = new SseParser((e) => ranged.push(e), maxEventBytes ? { maxEventBytes } : {});
  const rangedOffered: string[] = [];
  const rangedHooked = new SseParser(() => {}, {
    ...(maxEventBytes ? { maxEventBytes } : {}),
    onData: (buf, start, end) => rangedOffered.push(buf.toString('utf8', start, end)) > 0,
  });
  const rangedMixed: string[] = [];
  const rangedLaned = new SseParser((e) => rangedMixed.push(e.data), {
    ...(maxEventBytes ? { maxEventBytes } : {}),
    lane: lineLane((data) => void rangedMixed.push(data), false),
  });
  for (const c of chunks) {
    const big = Buffer.concat([BEFORE, c, AFTER]);
    for (const p of [rangedParser, rangedHooked, rangedLaned]) p.push(big, BEFORE.length, BEFORE.length + c.byteLength);
    big.fill(0x0a); // the caller may reuse its buffer once push() returns
  }
  for (const p of [rangedParser, rangedHooked, rangedLaned]) p.end();
  expectSame(plain(ranged), plain(events));
  expectSame(ranged.map((e) => e.oversize), events.map((e) => e.oversize));
  expectSame(rangedOffered, normal.map((e) => e.data));
  expectSame(rangedMixed, events.map((e) => e.data));
  return { events, parser };
}

/** A test lane: a value is the bytes up to its line's end (not found: -1), declined when `skipOdd` and its length is odd. */
function lineLane(taken: (data: string) => void, skipOdd: boolean): SseLane {
  let found = '';
  return {
    find(buf, start, limit) {
      let e = start;
      while (e < limit && buf[e] !== 0x0a && buf[e] !== 0x0d) e++;
      if (e === limit || (skipOdd && (e - start) % 2 === 1)) return -1;
      found = buf.toString('utf8', start, e);
      return e;
    },
    taken: () => taken(found),
  };
}

/** Bytes around a range that must not be read as part of it (after it: no line end first). */
const BEFORE = Buffer.from('\r\n\ndata: {"x":1}\n\n\r');
const AFTER = Buffer.from('x\n\ndata: {"x":1}\n\n\r');

/** Events the test lane took, over the whole file (checked at its end). */
const lanes = { taken: 0 };

function splitAt(buf: Buffer, offsets: number[]): Buffer[] {
  const out: Buffer[] = [];
  let prev = 0;
  for (const o of [...offsets].sort((a, b) => a - b)) {
    out.push(buf.subarray(prev, o));
    prev = o;
  }
  out.push(buf.subarray(prev));
  return out;
}

/** Rewrites the line ends of a fixture so every framing variant is exercised. */
function withLineEnds(buf: Buffer, eol: '\n' | '\r\n' | '\r'): Buffer {
  return Buffer.from(buf.toString('utf8').replace(/\r\n|\r|\n/g, eol), 'utf8');
}


describe('SseParser against the reference algorithm', () => {
  it('has SSE fixtures to check', () => {
    expect(sseFiles.length).toBeGreaterThanOrEqual(15);
  });

  for (const file of sseFiles) {
    const bytes = readFileSync(join(FIXTURES, file));
    it(`${file}: whole, and split at every byte offset`, () => {
      const expected = referenceParse(bytes);
      expect(expected.length).toBeGreaterThan(0);
      expect(plain(parseChunks([bytes]).events)).toEqual(expected);
      for (let i = 0; i <= bytes.length; i++) expectSame(plain(parseChunks(splitAt(bytes, [i])).events), expected, `split at byte ${i}`);
    });

    it(`${file}: one byte at a time, with LF, CRLF and CR line ends and a BOM`, () => {
      for (const eol of ['\n', '\r\n', '\r'] as const) {
        const variant = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), withLineEnds(bytes, eol)]);
        const expected = referenceParse(variant);
        const bytewise = Array.from(variant, (b) => Uint8Array.of(b));
        expect(plain(parseChunks(bytewise).events)).toEqual(expected);
      }
    });
  }

  it('random multi-way splits of every fixture match (property)', () => {
    const all = sseFiles.map((f) => readFileSync(join(FIXTURES, f)));
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: all.length - 1 }),
        fc.constantFrom<'\n' | '\r\n' | '\r'>('\n', '\r\n', '\r'),
        fc.array(fc.nat(), { maxLength: 40 }),
        (idx, eol, cuts) => {
          const buf = withLineEnds(all[idx]!, eol);
          const offsets = cuts.map((c) => c % (buf.length + 1));
          expect(plain(parseChunks(splitAt(buf, offsets)).events)).toEqual(referenceParse(buf));
        },
      ),
      { numRuns: 300 },
    );
  });

  it('arbitrary generated streams match the reference (property)', () => {
    // size 'max': fast-check's default size stops strings and arrays at ~10; 'binary': any code
    // point, NUL (an id with one is ignored) and non-ASCII included.
    const TEXT20 = { maxLength: 20, size: 'max', unit: 'binary' } as const;
    const TEXT10 = { maxLength: 10, size: 'max', unit: 'binary' } as const;
    const line = fc.oneof(
      fc.constant(''),
      fc.constant(':keep-alive'),
      fc.constant(':'),
      fc.string(TEXT20).map((s) => `data:${s.replace(/[\r\n]/g, '')}`),
      fc.string(TEXT20).map((s) => `data: ${s.replace(/[\r\n]/g, '')}`),
      fc.constant('data'),
      fc.constant('data: 22°C ✓ 𝄞'),
      fc.string(TEXT10).map((s) => `event: ${s.replace(/[\r\n]/g, '')}`),
      fc.string(TEXT10).map((s) => `id:${s.replace(/[\r\n]/g, '')}`),
      fc.constant('retry: 1000'),
      fc.constant('unknown: x'),
      fc.constant('error: {"code":500,"type":"server_error"}'),
      fc.string(TEXT10).map((s) => `error:${s.replace(/[\r\n]/g, '')}`),
    );
    fc.assert(
      fc.property(
        fc.array(fc.tuple(line, fc.constantFrom('\n', '\r\n', '\r')), { maxLength: 30, size: 'max' }),
        fc.array(fc.nat(), { maxLength: 10, size: 'max' }),
        (lines, cuts) => {
          const buf = Buffer.from(lines.map(([l, e]) => l + e).join(''), 'utf8');
          const offsets = cuts.map((c) => c % (buf.length + 1));
          expect(plain(parseChunks(splitAt(buf, offsets)).events)).toEqual(referenceParse(buf));
        },
      ),
      { numRuns: 500 },
    );
  });
});

describe('SseParser details', () => {
  it('joins multi-line data with \\n and keeps the event type and id', () => {
    const { events } = parseChunks([Buffer.from('event: delta\nid: 7\ndata: a\ndata:b\ndata\n\n')]);
    expect(events).toEqual([{ type: 'delta', data: 'a\nb\n', id: '7' }]);
  });

  it('reports comments and never dispatches them as events', () => {
    let comments = 0;
    const events: SseEvent[] = [];
    const p = new SseParser((e) => events.push(e), { onComment: () => comments++ });
    p.push(Buffer.from(': OPENROUTER PROCESSING\n\n:\n\ndata: x\n\n'));
    expect(comments).toBe(2);
    expect(events.map((e) => e.data)).toEqual(['x']);
  });

  it('keeps a pending CR across an empty read (found by the property test)', () => {
    const buf = Buffer.from('data:    \ndata: x\r\n', 'utf8');
    const cr = buf.length - 1;
    const { events } = parseChunks([buf.subarray(0, cr), Buffer.alloc(0), buf.subarray(cr)]);
    expect(events).toEqual([]);
  });

  it.each([false, true])('owns the bytes of an open event: a caller reusing its buffer does not corrupt it (onData hook: %s)', (hook) => {
    const events: SseEvent[] = [];
    const p = new SseParser((e) => events.push(e), hook ? { onData: () => false } : {});
    const scratch = Buffer.alloc(64);
    const feed = (s: string) => {
      const n = scratch.write(s);
      p.push(scratch.subarray(0, n));
      scratch.fill(0x58); // the caller reuses its buffer
    };
    feed('data: first half ');
    feed('°\ndata: line2\n');
    feed('\ndata: x');
    feed('yz\n\n');
    feed('data: whole line\n'); // a complete data line whose event ends in the next read
    feed('\n');
    expect(events.map((e) => e.data)).toEqual(['first half °\nline2', 'xyz', 'whole line']);
  });

  it('reassembles a multi-byte character split across reads', () => {
    const bytes = Buffer.from('data: 22°C\n\n', 'utf8');
    const deg = bytes.indexOf(0xc2);
    const { events } = parseChunks([bytes.subarray(0, deg + 1), bytes.subarray(deg + 1)]);
    expect(events[0]!.data).toBe('22°C');
  });

  it('discards an unterminated final event, as the spec says', () => {
    const { events } = parseChunks([Buffer.from('data: a\n\ndata: b\n')]);
    expect(events.map((e) => e.data)).toEqual(['a']);
  });

  it('skips an event over the size cap and goes on with the next one', () => {
    const big = 'x'.repeat(5000);
    const text = `data: small\n\ndata: ${big}\ndata: more\n\ndata: after\n\n`;
    const bytes = Buffer.from(text);
    for (const chunkSize of [1, 7, 1024, bytes.length]) {
      const chunks: Buffer[] = [];
      for (let i = 0; i < bytes.length; i += chunkSize) chunks.push(bytes.subarray(i, i + chunkSize));
      const { events, parser } = parseChunks(chunks, 2048);
      // In its place, an event with no data and the edges of its first data line (the line
      // after it is not read).
      expect(events.map((e) => e.data)).toEqual(['small', '', 'after']);
      expect(events[1]!.oversize).toEqual({ head: big.slice(0, 1024 - 'data: '.length), tail: big });
      expect(parser.oversizeEvents).toBe(1);
    }
  });

  it('ends an over-long line where it ends, wherever the reads split it', () => {
    const bytes = Buffer.from('data: 0123456789abcdef\ndata: b\n\ndata: c\n\n');
    const edges = { head: '0123456789abcdef', tail: '0123456789abcdef' };
    const show = (evs: SseEvent[]) => evs.map((e) => (e.oversize ? `${e.oversize.head}/${e.oversize.tail}` : e.data)).join('|');
    const want = `${edges.head}/${edges.tail}|c`;
    expect(show(parseChunks([bytes], 10).events)).toBe(want);
    for (let i = 0; i <= bytes.length; i++) {
      for (let j = i; j <= bytes.length; j++) {
        const got = show(parseChunks([bytes.subarray(0, i), bytes.subarray(i, j), bytes.subarray(j)], 10).events);
        if (got !== want) expect(got, `split at ${i}, ${j}`).toBe(want);
      }
    }
  });

  it('drops the event of any line over the cap (a comment, id or event line too, the field name counted), however the reads split it', () => {
    // Only a data line's event is dispatched in its place (with empty data), and only when it is
    // the event's first data line: `*` marks it below.
    const cases: [string, string[], number][] = [
      [`: ${'p'.repeat(20)}\ndata: hello\n\ndata: c\n\n`, ['c'], 1],
      [`id: ${'i'.repeat(20)}\ndata: hello\n\ndata: c\n\n`, ['c'], 1],
      [`data: hi\nevent: ${'e'.repeat(20)}\n\ndata: c\n\n`, ['c'], 1],
      [`data: hi\ndata: ${'y'.repeat(20)}\n\ndata: c\n\n`, ['c'], 1],
      [`data: hello\nevent: ${'e'.repeat(20)}\n\ndata: c\n\n`, ['*hello', 'c'], 1],
      // A value of exactly the cap: its line is 6 bytes longer.
      [`data: ${'x'.repeat(10)}\n\ndata: c\n\n`, ['*xxxxxxxxxx', 'c'], 1],
      [`event: big\ndata:${'z'.repeat(12)}\n\ndata: c\n\n`, ['*big:zzzzzzzzzzzz', 'c'], 1],
      // A line of exactly the cap is kept.
      [`data: xxxx\n\ndata: c\n\n`, ['xxxx', 'c'], 0],
    ];
    const show = (e: SseEvent) => (e.oversize ? `*${e.type ? `${e.type}:` : ''}${e.oversize.head}` : e.data);
    for (const [text, want, oversize] of cases) {
      const bytes = Buffer.from(text);
      for (let i = 0; i <= bytes.length; i++) {
        for (let j = i; j <= bytes.length; j++) {
          const { events, parser } = parseChunks([bytes.subarray(0, i), bytes.subarray(i, j), bytes.subarray(j)], 10);
          const got = events.map(show);
          if (got.join('|') !== want.join('|') || parser.oversizeEvents !== oversize) {
            expect({ got, oversize: parser.oversizeEvents }, `${JSON.stringify(text)} split at ${i}, ${j}`).toEqual({ got: want, oversize });
          }
        }
      }
    }
  });

  it('counts the LFs that join data lines toward the cap', () => {
    // Four lines of 7 bytes: 8 bytes of values, 11 joined.
    const text = 'data:ab\n'.repeat(4) + '\ndata:ok\n\n';
    expect(parseChunks([Buffer.from(text)], 11).events.map((e) => e.data)).toEqual(['ab\nab\nab\nab', 'ok']);
    const { events, parser } = parseChunks([Buffer.from(text)], 10);
    expect(events.map((e) => e.data)).toEqual(['ok']);
    expect(parser.oversizeEvents).toBe(1);
  });

  it('ignores an id with a NUL, as the spec says, and strips one BOM only', () => {
    const { events } = parseChunks([Buffer.from('id: 1\ndata: a\n\nid: 2\u00003\ndata: b\n\n')]);
    expect(events.map((e) => [e.data, e.id])).toEqual([['a', '1'], ['b', '1']]);
    // A second BOM is part of the first line's field name: an unknown field, no event.
    expect(parseChunks([Buffer.from('\ufeff\ufeffdata: a\n\ndata: b\n\n')]).events.map((e) => e.data)).toEqual(['b']);
  });

  it('searches for line ends only within the range it was given (each byte a bounded number of times)', () => {
    // One 64 KiB read of a chunked body with bare-LF framing around a body without CR: the parser
    // gets one range per 1-byte chunk. Every byte the line-end searches cover is counted.
    const read = Buffer.from('data: x\n\n'.repeat(7282)).subarray(0, 65536);
    let scanned = 0;
    const proto = Buffer.prototype as unknown as { indexOf: (this: Buffer, value: number, from?: number) => number };
    const indexOf = proto.indexOf;
    proto.indexOf = function (value, from = 0) {
      const at = indexOf.call(this, value, from);
      scanned += (at === -1 ? this.length : at + 1) - from;
      return at;
    };
    let events = 0;
    try {
      const p = new SseParser(() => events++);
      for (let i = 0; i < read.length; i++) p.push(read, i, i + 1);
    } finally {
      proto.indexOf = indexOf;
    }
    expect(events).toBe(Math.floor(read.length / 'data: x\n\n'.length));
    // Quadratic would be ~2^31 (each CR search ran to the read's end).
    expect(scanned).toBeLessThan(10 * read.length);
  });

  it('holds at most the cap for a huge unterminated line fed in small reads', () => {
    const p = new SseParser(() => undefined, { maxEventBytes: 1024 * 1024 });
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    p.push(Buffer.from('data: '));
    for (let i = 0; i < 160; i++) p.push(chunk); // 10 MiB in one line
    p.push(Buffer.from('\n\ndata: ok\n\n'));
    expect(p.oversizeEvents).toBe(1);
  });

  it('does not dispatch an event with no data field', () => {
    const { events } = parseChunks([Buffer.from('event: ping\n\nid: 3\n\n')]);
    expect(events).toEqual([]);
  });

  it('reports an `error:` field on an event without data as an error event (llama.cpp before 2025-09), and only then', () => {
    const { events } = parseChunks([
      Buffer.from('error: {"code":400,"type":"invalid_request_error"}\n\nevent: x\nerror: e\ndata: d\n\nerrors: no\n\n'),
    ]);
    expect(events).toEqual([
      { type: 'error', data: '{"code":400,"type":"invalid_request_error"}', id: undefined },
      { type: 'x', data: 'd', id: undefined },
    ]);
  });

  it('an `error:` field beside data is ignored, also when the lane takes the data line, at every split', () => {
    const bytes = Buffer.from('error: {"type":"server_error"}\ndata: {"x":1}\n\n: keep-alive\n\ndata: 2\n\n');
    for (let cut = 0; cut <= bytes.length; cut++) {
      // parseChunks also runs the hooked and the laned parser and checks they agree with the plain one.
      const { events } = parseChunks([bytes.subarray(0, cut), bytes.subarray(cut)]);
      expect(plain(events)).toEqual([
        { type: '', data: '{"x":1}', id: undefined },
        { type: '', data: '2', id: undefined },
      ]);
    }
  });
});

describe('SseParser lane', () => {
  /** A lane that recognises a value as the bytes to its line's end (or as n bytes, n the digit it starts with). */
  function run(text: string | Buffer[], firstDigit = false, maxEventBytes?: number) {
    const got: string[] = [];
    let found = '';
    let finds = 0;
    const p = new SseParser((e) => got.push(`event ${e.type}:${e.data}`), {
      ...(maxEventBytes ? { maxEventBytes } : {}),
      lane: {
        find(buf, start, limit) {
          finds++;
          let e = start;
          if (firstDigit && buf[start]! >= 0x30 && buf[start]! <= 0x39) e = start + (buf[start]! - 0x30);
          else while (e < limit && buf[e] !== 0x0a && buf[e] !== 0x0d) e++;
          if (e >= limit) return -1;
          found = buf.toString('utf8', start, e);
          return e;
        },
        taken: () => got.push(`lane ${found}`),
      },
    });
    for (const c of typeof text === 'string' ? [Buffer.from(text)] : text) p.push(c);
    return { got, finds: () => finds, parser: p };
  }

  it('takes one-line events ended by LF LF or CRLF CRLF, and leaves everything else to the normal path', () => {
    const { got } = run('data: a\n\ndata:b\r\n\r\nevent: x\ndata: c\n\ndata: d\ndata: e\n\nid: 1\ndata: f\n\n: c\ndata: g\r\r');
    expect(got).toEqual(['lane a', 'lane b', 'event x:c', 'event :d\ne', 'lane f', 'event :g']); // an id line leaves the event unnamed
  });

  it('does not take a value that is only part of its line', () => {
    // The lane says the value is "2x": the line goes on, so the event is the whole line.
    const { got } = run('data: 2xyz\n\ndata: 1\n\n', true);
    expect(got).toEqual(['event :2xyz', 'lane 1']);
  });

  it('leaves an event whose end is in the next read to the normal path', () => {
    const { got } = run([Buffer.from('data: a\n'), Buffer.from('\ndata: b\n\n')]);
    expect(got).toEqual(['event :a', 'lane b']);
  });

  it('closes after a few values that were not followed by an event end', () => {
    const text = 'data: a\n\r\n'.repeat(10) + 'data: b\n\n';
    const { got, finds } = run(text);
    expect(got).toEqual([...Array(10).fill('event :a'), 'event :b']);
    expect(finds()).toBe(4); // closed after four misses: "b" was not offered
  });

  it('leaves an event over the size cap to the normal path, which skips it', () => {
    const { got, parser } = run('data: 0123456789\n\ndata: ok\n\n', false, 8);
    expect(got).toEqual(['event :', 'lane ok']);
    expect(parser.oversizeEvents).toBe(1);
  });

  it('does not take a line that continues a partial line from the read before', () => {
    // "xx" + "data: a" is one line, of a field named "xxdata".
    const { got } = run([Buffer.from('data: q\n\nxx'), Buffer.from('data: a\n\ndata: b\n\n')]);
    expect(got).toEqual(['lane q', 'lane b']);
  });

  it('does not read past its range for the end of the event (the bytes after it belong to the caller)', () => {
    // The bytes after each range are a blank line, but the next range continues the event.
    for (const [first, second] of [['data: a\n', '\n'], ['data: a\r\n', '\r\n']] as const) {
      const got: string[] = [];
      const p = new SseParser((e) => got.push(`event ${e.data}`), {
        lane: {
          find: (buf, start, limit) => (start + 1 < limit ? start + 1 : -1),
          taken: () => got.push('lane'),
        },
      });
      p.push(Buffer.from(':\n')); // past the start, where a range is made a view of its own
      const buf = Buffer.from(first + second);
      p.push(buf, 0, first.length);
      p.push(Buffer.from('data: b\n\n'));
      expect(got, JSON.stringify(first)).toEqual(['event a\nb']);
    }
  });

  it('takes a line of exactly the cap and leaves one byte longer to the normal path, as that path judges lines', () => {
    const { got, parser } = run('data: ab\n\ndata: abc\n\ndata: ok\n\n', false, 8);
    expect(got).toEqual(['lane ab', 'event :', 'lane ok']);
    expect(parser.oversizeEvents).toBe(1);
  });

  it('was used by the property tests above', () => {
    expect(lanes.taken).toBeGreaterThan(1000);
  });
});
