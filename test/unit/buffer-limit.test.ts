import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import { RequestMeter } from '../../src/measure/request-meter.js';
import { OllamaAdapter } from '../../src/providers/ollama.js';
import { OpenAIChatAdapter } from '../../src/providers/openai-chat.js';
import { BedrockAdapter } from '../../src/providers/bedrock.js';
import { ByteBudget, FREE_BYTES } from '../../src/sse/byte-budget.js';
import { EventEdges } from '../../src/sse/event-edges.js';
import { EventStreamDecoder } from '../../src/sse/eventstream.js';
import { JsonArrayParser } from '../../src/sse/json-array.js';
import { NdjsonParser } from '../../src/sse/ndjson.js';
import { SseParser, type SseEvent } from '../../src/sse/parser.js';
import { PendingBytes } from '../../src/sse/pending-bytes.js';
import { rawFrame, stringHeaders } from '../helpers/eventstream-frame.js';
import { testInstruments } from '../helpers/metrics.js';
import { splitAt } from '../helpers/ranges.js';

/**
 * `limits.maxBufferedBytes`: what all requests together keep of events still arriving. An event
 * past it is read as one past `limits.maxEventBytes` (its edges at most), an event's first
 * FREE_BYTES are never refused, and what a request holds comes back when it ends, however it ends.
 */

const MAX_EVENT = 1 << 20;
const { HEAD, TAIL } = EventEdges;

/** Letters and digits: safe in JSON strings, SSE data and NDJSON lines. */
const ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

/** ASCII text of `n` bytes that differs at nearby offsets and between seeds, so that edges are told apart. */
function text(n: number, seed: number): string {
  const out = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) out[i] = ALPHABET.charCodeAt((i * 7 + seed * 13 + (i >> 10)) % ALPHABET.length);
  return out.toString('latin1');
}

describe('ByteBudget and BudgetShare', () => {
  it('grants a buffer up to FREE_BYTES always, past it only within the limit, and takes nothing it refuses', () => {
    let refused = 0;
    const b = new ByteBudget(100_000, () => refused++);
    const s1 = b.share();
    const s2 = b.share();
    expect(s1.take(FREE_BYTES, FREE_BYTES)).toBe(true);
    expect(s2.take(FREE_BYTES, FREE_BYTES)).toBe(true); // over the limit, but free
    expect(b.used).toBe(2 * FREE_BYTES);
    expect(s1.take(1, FREE_BYTES + 1)).toBe(false);
    expect([b.used, refused]).toEqual([2 * FREE_BYTES, 1]);
    s2.give(FREE_BYTES);
    expect(s1.take(30_000, 2 * FREE_BYTES)).toBe(true); // 65,536 + 30,000 <= 100,000
    expect(s1.take(10_000, 3 * FREE_BYTES)).toBe(false);
    s2.give(5); // gives back no more than it holds
    expect(b.used).toBe(FREE_BYTES + 30_000);
    s1.close();
    expect(b.used).toBe(0);
    expect(s1.take(1, 1)).toBe(false); // a closed share takes nothing
    s1.give(100);
    expect(b.used).toBe(0);
  });

  it('PendingBytes counts its buffer in the share, past the budget drops the event keeping its edges, and gives back at clear()', () => {
    const b = new ByteBudget(3 * FREE_BYTES);
    const other = b.share();
    expect(other.take(2 * FREE_BYTES, 2 * FREE_BYTES)).toBe(true);
    const p = new PendingBytes(MAX_EVENT, true, b.share());
    const bytes = Buffer.from(text(200_000, 1));
    let went = false;
    for (let i = 0; i < bytes.length; i += 10_000) went = p.add(bytes, i, i + 10_000) || went;
    expect(went).toBe(true);
    expect(p.over).toBe(true);
    expect([p.edges!.head(), p.edges!.tail()]).toEqual([bytes.toString('latin1', 0, HEAD), bytes.toString('latin1', bytes.length - TAIL)]);
    expect(b.used).toBe(2 * FREE_BYTES); // its own buffer let go at once
    p.clear();
    expect(p.add(bytes, 0, 100_000)).toBe(true); // 128 KiB held elsewhere + 100,000 > 192 KiB
    p.clear();
    other.close();
    expect(p.add(bytes, 0, 100_000)).toBe(false);
    expect(b.used).toBe(100_000);
    p.clear();
    expect(b.used).toBe(0);
  });
});

interface Reader {
  push(b: Buffer): void;
  end?(): void;
}

interface Framing {
  name: string;
  make(onEvent: (ev: SseEvent) => void, share: ReturnType<ByteBudget['share']>): Reader;
  /** The event's data when read whole, for a payload. */
  unit(payload: string): string;
  /** The stream of those events. */
  stream(units: string[]): Buffer;
  /** The edges an event cut for its size is dispatched with (its `oversize`), or none: a cut event is skipped. */
  edges?(unit: string): { head: string; tail: string };
}

const edgesOf = (s: string) => ({ head: s.slice(0, HEAD), tail: s.slice(-TAIL) });
const FRAME_HEADERS = stringHeaders({ ':event-type': 'chunk', ':content-type': 'application/json', ':message-type': 'event' });

const framings: Framing[] = [
  {
    name: 'SSE',
    make: (f, share) => new SseParser(f, { maxEventBytes: MAX_EVENT, share }),
    unit: (p) => p,
    stream: (units) => Buffer.from(units.map((u) => `data: ${u}\n\n`).join(''), 'latin1'),
    // The line's edges, its field name left out.
    edges: (u) => ({ head: `data: ${u}`.slice(6, HEAD), tail: u.slice(-TAIL) }),
  },
  {
    name: 'NDJSON',
    make: (f, share) => new NdjsonParser(f, { maxEventBytes: MAX_EVENT, share }),
    unit: (p) => `{"t":"${p}"}`,
    stream: (units) => Buffer.from(units.map((u) => `${u}\n`).join(''), 'latin1'),
    edges: edgesOf,
  },
  {
    name: 'JSON array',
    make: (f, share) => new JsonArrayParser(f, { maxEventBytes: MAX_EVENT, share }),
    unit: (p) => `{"t":"${p}"}`,
    stream: (units) => Buffer.from(`[${units.join(',')}]`, 'latin1'),
    edges: edgesOf,
  },
  {
    name: 'AWS event stream',
    make: (f, share) => new EventStreamDecoder(f, { maxFrameBytes: MAX_EVENT, share }),
    unit: (p) => `{"t":"${p}"}`,
    stream: (units) => Buffer.concat(units.map((u) => rawFrame(FRAME_HEADERS, Buffer.from(u, 'latin1')))),
  },
];

/**
 * Small events (a token's), ones just under FREE_BYTES whose buffer would double past it (a
 * finished answer that repeats the output), and large ones (a generated image's), past FREE_BYTES and TAIL.
 */
const size = fc.oneof(fc.integer({ min: 1, max: 900 }), fc.integer({ min: 30_000, max: FREE_BYTES - 100 }), fc.integer({ min: 70_000, max: 200_000 }));

describe.each(framings)('$name: two streams of large events under one limit', (framing) => {
  it('reads each event whole or as one too large, never a small one cut, holds no more than the limit (and the free parts), and gives all back', () => {
    let wholeLarge = 0;
    let cutLarge = 0;
    fc.assert(
      fc.property(
        fc.array(fc.array(size, { minLength: 1, maxLength: 4 }), { minLength: 2, maxLength: 2 }),
        fc.oneof(fc.integer({ min: 0, max: 600_000 }), fc.constant(1 << 30)),
        fc.array(fc.array(fc.nat(), { maxLength: 24 }), { minLength: 2, maxLength: 2 }),
        fc.array(fc.boolean(), { minLength: 1, maxLength: 40 }),
        fc.nat(),
        (sizes, limit, cuts, order, seed) => {
          const budget = new ByteBudget(limit);
          const streams = sizes.map((ss, k) => {
            const units = ss.map((n, i) => framing.unit(text(n, seed + 10 * k + i)));
            const events: SseEvent[] = [];
            const reader = framing.make((e) => events.push(e), budget.share());
            return { units, events, reader, pieces: splitAt(framing.stream(units), cuts[k]!) };
          });
          // The pieces of the two streams interleaved as `order` says.
          for (let step = 0; streams.some((s) => s.pieces.length > 0); step++) {
            const k = order[step % order.length]! ? 1 : 0;
            const s = streams[k]!.pieces.length > 0 ? streams[k]! : streams[1 - k]!;
            s.reader.push(s.pieces.shift()!);
            expect(budget.used).toBeLessThanOrEqual(limit + 4 * FREE_BYTES);
          }
          for (const s of streams) s.reader.end?.();
          expect(budget.used).toBe(0); // every event ended: every buffer let go
          for (const s of streams) {
            const whole = s.events.filter((e) => e.oversize === undefined).map((e) => e.data);
            if (framing.edges === undefined) {
              // A cut frame is skipped: what is read is the units in order, with large ones left out.
              const expected = s.units.filter((u) => whole.includes(u));
              expect(whole).toEqual(expected);
              for (const u of s.units) if (u.length < FREE_BYTES || limit === 1 << 30) expect(whole).toContain(u);
              cutLarge += s.units.length - whole.length;
              wholeLarge += whole.filter((u) => u.length > FREE_BYTES).length;
              continue;
            }
            expect(s.events.length).toBe(s.units.length);
            s.units.forEach((u, i) => {
              const ev = s.events[i]!;
              if (ev.oversize === undefined) {
                expect(ev.data).toBe(u);
                if (u.length > FREE_BYTES) wholeLarge++;
              } else {
                expect(u.length > FREE_BYTES && limit < 1 << 30).toBe(true);
                expect(ev.data).toBe('');
                expect(ev.oversize).toEqual(framing.edges!(u));
                cutLarge++;
              }
            });
          }
        },
      ),
      { numRuns: 60 },
    );
    // Not vacuous: both outcomes came up.
    expect(wholeLarge).toBeGreaterThan(0);
    expect(cutLarge).toBeGreaterThan(0);
  });
});

describe('SSE: each place a kept line or data can be refused', () => {
  const u = text(80_000, 5);
  const parse = (budget: ByteBudget, pieces: string[]) => {
    const events: SseEvent[] = [];
    const p = new SseParser((e) => events.push(e), { maxEventBytes: MAX_EVENT, share: budget.share() });
    for (const piece of pieces) p.push(Buffer.from(piece, 'latin1'));
    return { events, p };
  };
  /** A budget with `held` bytes held by another request. */
  const budgetWith = (limit: number, held: number) => {
    const b = new ByteBudget(limit);
    const other = b.share();
    for (let left = held; left > 0; left -= FREE_BYTES) expect(other.take(Math.min(left, FREE_BYTES), FREE_BYTES)).toBe(true); // free parts
    return b;
  };
  const small = { type: '', data: 'small', id: undefined };

  it('a line whose blank line comes in the next read (its copy refused): its edges, with its field as it came', () => {
    for (const field of ['data: ', 'data:']) {
      const b = budgetWith(FREE_BYTES, FREE_BYTES);
      const { events, p } = parse(b, [`${field}${u}\n`, '\ndata: small\n\n']);
      expect(events).toEqual([{ type: '', data: '', id: undefined, oversize: { head: u.slice(0, HEAD - field.length), tail: u.slice(-TAIL) } }, small]);
      expect([p.oversizeEvents, b.used]).toEqual([1, FREE_BYTES]);
    }
  });

  it('a line kept across reads, refused as it grows (stash) and as it ends (line)', () => {
    const cases: [number, string[]][] = [
      // Refused while it arrives: 10,000-byte pieces, the buffer doubling past the free 64 KiB to 80,048.
      [50_000, Array.from({ length: 8 }, (_, i) => (i === 0 ? 'data: ' : '') + u.slice(i * 10_000, (i + 1) * 10_000)).concat(['\n\ndata: small\n\n'])],
      // Granted as it starts (70,006 bytes), refused when its end makes it grow.
      [100_000, [`data: ${u.slice(0, 70_000)}`, `${u.slice(70_000)}\n\ndata: small\n\n`]],
    ];
    for (const [limit, ps] of cases) {
      const b = budgetWith(limit, 0);
      const { events } = parse(b, ps);
      expect(events).toEqual([{ type: '', data: '', id: undefined, oversize: { head: u.slice(0, HEAD - 6), tail: u.slice(-TAIL) } }, small]);
      expect(b.used).toBe(0);
    }
  });

  it('data over the budget across lines: dropped as data over the cap across lines is, the next event read', () => {
    const b = budgetWith(FREE_BYTES, 2 * FREE_BYTES);
    const { events, p } = parse(b, [`data: a\ndata: ${u}\n\ndata: small\n\n`]);
    expect(events).toEqual([small]);
    expect([p.oversizeEvents, b.used]).toEqual([1, 2 * FREE_BYTES]);
  });
});

describe('refusals without edges', () => {
  const u = text(80_000, 6);

  it('SSE: a second data line kept across reads and refused: no edges (they would be that line\'s, not the data\'s), the next event read', () => {
    const b = new ByteBudget(FREE_BYTES);
    expect(b.share().take(FREE_BYTES, FREE_BYTES)).toBe(true);
    const events: SseEvent[] = [];
    const p = new SseParser((e) => events.push(e), { maxEventBytes: MAX_EVENT, share: b.share() });
    for (const piece of [`data: a\ndata: ${u.slice(0, 40_000)}`, `${u.slice(40_000)}\n\ndata: small\n\n`]) p.push(Buffer.from(piece, 'latin1'));
    expect(events).toEqual([{ type: '', data: 'small', id: undefined }]);
    expect([p.oversizeEvents, b.used]).toEqual([1, FREE_BYTES]);
  });

  it('AWS event stream: a frame whose prelude is split across reads is refused before its buffer is made, and skipped', () => {
    const b = new ByteBudget(0);
    const events: SseEvent[] = [];
    const d = new EventStreamDecoder((e) => events.push(e), { maxFrameBytes: MAX_EVENT, share: b.share() });
    const big = rawFrame(FRAME_HEADERS, Buffer.from(u, 'latin1'));
    const stream = Buffer.concat([big, rawFrame(FRAME_HEADERS, Buffer.from('{"t":"small"}'))]);
    for (const piece of splitAt(stream, [5, 30_000, 60_000])) {
      d.push(piece);
      expect(b.used).toBe(0);
    }
    expect(events.map((e) => e.data)).toEqual(['{"t":"small"}']);
    expect(d.oversizeFrames).toBe(1);
  });
});

describe('RequestMeter: what a request holds comes back when it ends, however it ends', () => {
  let t: ReturnType<typeof testInstruments> | undefined;
  afterEach(async () => {
    await t?.shutdown();
    t = undefined;
  });
  const labels = { provider: 'p', operation: 'chat', requestModel: 'm', serverAddress: 'h' };
  const half = Buffer.from(text(100_000, 9), 'latin1');
  const cases: [string, () => OpenAIChatAdapter | OllamaAdapter | BedrockAdapter, string, Buffer][] = [
    ['SSE', () => new OpenAIChatAdapter(), 'text/event-stream', Buffer.concat([Buffer.from('data: {"a":"'), half])],
    ['NDJSON', () => new OllamaAdapter(), 'application/x-ndjson', Buffer.concat([Buffer.from('{"a":"'), half])],
    ['AWS event stream', () => new BedrockAdapter(), 'application/vnd.amazon.eventstream', rawFrame(FRAME_HEADERS, Buffer.concat([half, half])).subarray(0, 150_000)],
    ['a JSON body', () => new OpenAIChatAdapter(), 'application/json', Buffer.concat([Buffer.from('{"a":"'), half])],
  ];

  it('a measurement that throws while a large line arrives: given back at once, before the request ends', () => {
    t = testInstruments();
    class Throwing extends OllamaAdapter {
      override onEvent(ev: SseEvent) {
        if (ev.data.includes('boom')) throw new Error('an adapter bug');
        return super.onEvent(ev);
      }
    }
    const budget = new ByteBudget(1 << 30);
    const deferred: (() => void)[] = [];
    const m = new RequestMeter(t.instruments, new Throwing(), { ...labels }, 1000, { maxEventBytes: MAX_EVENT, maxBodyBytes: MAX_EVENT, budget, defer: (fn) => deferred.push(fn) });
    m.responseStart(200, 'application/x-ndjson', undefined);
    // The throwing line is measured after the read (deferred), by when the large one's start is kept.
    m.chunk(Buffer.concat([Buffer.from('{"boom":1}\n{"a":"'), half]), 1001);
    expect(budget.used).toBeGreaterThan(FREE_BYTES);
    for (const fn of deferred.splice(0)) fn();
    expect(budget.used).toBe(0);
    m.finish(1003);
    expect(budget.used).toBe(0);
  });

  it('an event stream whose frame fails its CRC: given back at once, before the request ends', () => {
    t = testInstruments();
    const budget = new ByteBudget(1 << 30);
    const m = new RequestMeter(t.instruments, new BedrockAdapter(), { ...labels }, 1000, { maxEventBytes: MAX_EVENT, maxBodyBytes: MAX_EVENT, budget });
    m.responseStart(200, 'application/vnd.amazon.eventstream', undefined);
    const frame = rawFrame(FRAME_HEADERS, Buffer.concat([half, half]));
    frame[frame.length - 1]! ^= 0xff;
    m.chunk(frame.subarray(0, 100_000), 1001);
    expect(budget.used).toBeGreaterThan(FREE_BYTES);
    m.chunk(frame.subarray(100_000), 1002);
    expect(budget.used).toBe(0);
    m.finish(1003);
    expect(budget.used).toBe(0);
  });

  it.each(cases)('%s cut mid-event: at finish() and at discard()', (_, adapter, contentType, part) => {
    t = testInstruments();
    for (const end of ['finish', 'discard'] as const) {
      const budget = new ByteBudget(1 << 30);
      const m = new RequestMeter(t.instruments, adapter(), { ...labels }, 1000, { maxEventBytes: MAX_EVENT, maxBodyBytes: 4 * MAX_EVENT, budget });
      m.responseStart(200, contentType, undefined);
      m.chunk(part.subarray(0, 1000), 1001); // first read: the event starts
      m.chunk(part.subarray(1000), 1002);
      expect(budget.used).toBeGreaterThan(FREE_BYTES);
      if (end === 'finish') m.finish(1003, 'client_cancelled');
      else m.discard();
      expect(budget.used).toBe(0);
    }
  });
});
