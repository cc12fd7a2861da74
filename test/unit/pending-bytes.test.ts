import v8 from 'node:v8';
import vm from 'node:vm';
import { describe, expect, it } from 'vitest';
import { JsonArrayParser } from '../../src/sse/json-array.js';
import { NdjsonParser } from '../../src/sse/ndjson.js';
import { SseParser, type SseEvent } from '../../src/sse/parser.js';
import { PendingBytes } from '../../src/sse/pending-bytes.js';

/**
 * An upstream may send one event as thousands of 1-byte HTTP chunks, each handed on as its own
 * piece. What a piece costs to keep must not be an object per piece: a 2 MB line kept as 2
 * million small Buffers holds hundreds of MB of heap until its end.
 */
v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

function heapGrowthWhileFeeding(feed: (piece: Buffer) => void, size: number): number {
  const source = Buffer.alloc(size, 0x7a);
  gc(); // what earlier tests left is not freed during the measurement, hiding growth
  const before = process.memoryUsage().heapUsed;
  for (let i = 0; i < size; i++) feed(source.subarray(i, i + 1));
  return process.memoryUsage().heapUsed - before;
}

const SIZE = 2 * 1024 * 1024;
// What an object per piece would keep is ~100 bytes a byte (200 MB); garbage the loop makes is
// bounded by the young generation (16-32 MB).
const BOUND = 64 * 1024 * 1024;

describe('PendingBytes', () => {
  it('keeps an event sent one byte at a time in one growing buffer, and gives the bytes back whole', () => {
    const p = new PendingBytes(4 * SIZE);
    const grew = heapGrowthWhileFeeding((b) => p.add(b, 0, 1), SIZE);
    expect(grew).toBeLessThan(BOUND);
    expect(p.length).toBe(SIZE);
    expect(p.bytes().equals(Buffer.alloc(SIZE, 0x7a))).toBe(true);
  });

  it('copies (the caller reuses its buffer), stops at the cap once, and starts over after clear()', () => {
    const p = new PendingBytes(10);
    const b = Buffer.from('abcdef');
    expect(p.add(b, 1, 4)).toBe(false);
    b.fill(0x2d);
    expect(p.bytes().toString()).toBe('bcd');
    const kept = p.bytes();
    expect(p.add(Buffer.from('12345678'), 0, 8)).toBe(true); // 11 > 10
    expect(p.over).toBe(true);
    expect(p.add(Buffer.from('x'), 0, 1)).toBe(false); // dropped, and reported once
    expect(p.length).toBe(0);
    expect(kept.toString()).toBe('bcd'); // a view handed out earlier is not overwritten
    p.clear();
    expect(p.add(Buffer.from('xyz'), 0, 3)).toBe(false);
    expect(p.bytes().toString()).toBe('xyz');
  });
});

describe('a long event in 1-byte pieces', () => {
  type Parser = { push(b: Buffer): void };
  const framings: [string, (onEvent: (e: SseEvent) => void, max: number) => Parser, string, string][] = [
    ['NDJSON', (f, max) => new NdjsonParser(f, { maxEventBytes: max }), '{"a":"', '"}\n'],
    ['SSE', (f, max) => new SseParser(f, { maxEventBytes: max }), 'data: {"a":"', '"}\n\n'],
    ['JSON array', (f, max) => new JsonArrayParser(f, { maxEventBytes: max }), '[{"a":"', '"}'],
  ];
  it.each(framings)('%s: bounded heap while the event is open, the event intact at its end', (_name, make, head, tail) => {
    const out: SseEvent[] = [];
    const parser = make((e) => out.push(e), 4 * SIZE);
    parser.push(Buffer.from(head));
    const grew = heapGrowthWhileFeeding((b) => parser.push(b), SIZE);
    parser.push(Buffer.from(tail));
    expect(grew).toBeLessThan(BOUND);
    expect(out).toHaveLength(1);
    expect(out[0]!.data).toBe(`{"a":"${'z'.repeat(SIZE)}"}`);
  });
});
