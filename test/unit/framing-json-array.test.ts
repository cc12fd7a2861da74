import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { JsonArrayParser, type JsonArrayKind } from '../../src/sse/json-array.js';
import { geminiArray } from '../helpers/fixtures.js';
import { splitAt } from '../helpers/ranges.js';

/** The elements dispatched; an oversize one's edges (see EventEdges) in `edges`, one per element dropped. */
function elements(chunks: (string | Buffer)[], max?: number): { data: string[]; kind: JsonArrayKind; oversize: number; edges?: Array<{ head: string; tail: string }> } {
  const data: string[] = [];
  const edges: Array<{ head: string; tail: string }> = [];
  const p = new JsonArrayParser((e) => {
    expect(e.type).toBe('');
    expect(e.id).toBeUndefined();
    if (e.oversize) {
      expect(e.data).toBe('');
      edges.push(e.oversize);
    } else data.push(e.data);
  }, max === undefined ? {} : { maxEventBytes: max });
  for (const c of chunks) p.push(typeof c === 'string' ? Buffer.from(c) : c);
  expect(edges.length).toBe(p.oversizeElements);
  return { data, kind: p.kind, oversize: p.oversizeElements, ...(edges.length > 0 ? { edges } : {}) };
}

describe('streamed JSON array framing', () => {
  it("Gemini's array: one event per element, at every split point", () => {
    const { bytes, chunks } = geminiArray();
    expect(chunks.length).toBe(3);
    for (let i = 0; i <= bytes.length; i++) {
      const got = elements([bytes.subarray(0, i), bytes.subarray(i)]);
      const parsed = got.data.map((d) => JSON.parse(d) as unknown);
      if (got.kind !== 'done' || JSON.stringify(parsed) !== JSON.stringify(chunks)) {
        expect({ kind: got.kind, parsed }, `split at ${i}`).toEqual({ kind: 'done', parsed: chunks });
      }
    }
  });

  it('any array of JSON values, any whitespace, split anywhere: the objects and arrays come out in order, as written', () => {
    // Strings full of brackets, quotes, backslashes and non-ASCII: the scanner must not count them.
    const tricky = fc.string({ unit: fc.constantFrom('{', '}', '[', ']', '"', '\\', ',', 'a', '°', '😀', '\n', ' ') });
    const value = fc.letrec((tie) => ({
      json: fc.oneof({ depthSize: 'small' }, tricky, fc.integer(), fc.boolean(), fc.constant(null), tie('arr'), tie('obj')),
      arr: fc.array(tie('json'), { maxLength: 4 }),
      obj: fc.dictionary(tricky, tie('json'), { maxKeys: 4 }),
    })).json;
    const space = fc.constantFrom('', ' ', '\r\n', '\n\t ');
    fc.assert(
      fc.property(fc.array(value, { maxLength: 6 }), fc.integer({ min: 0, max: 4 }), space, fc.array(fc.nat(), { maxLength: 8 }), fc.option(fc.integer({ min: 2, max: 300 })), (items, indent, sep, cuts, cap) => {
        const texts = items.map((v) => JSON.stringify(v, null, indent));
        const bytes = Buffer.from(`${sep}[${sep}${texts.join(`${sep},${sep}`)}${sep}]${sep}`);
        const got = elements(splitAt(bytes, cuts, true), cap ?? undefined);
        const objects = texts.filter((_, k) => typeof items[k] === 'object' && items[k] !== null);
        // Over the cap: in its place, its first KiB and last 64 KiB.
        const over = (t: string) => cap !== null && Buffer.byteLength(t) > cap;
        const edges = objects.filter(over).map((t) => ({ head: Buffer.from(t).subarray(0, 1024).toString(), tail: Buffer.from(t).subarray(-65_536).toString() }));
        expect(got.kind).toBe('done');
        expect(got.data).toEqual(objects.filter((t) => !over(t)));
        expect(got.edges ?? []).toEqual(edges);
      }),
      { numRuns: 300 },
    );
  });

  it('reassembles UTF-8 split across reads; skips a BOM; ignores bytes after the closing bracket', () => {
    const body = Buffer.from('\ufeff [{"t":"22°C"},{"u":"😀"}] trailing {"x":1}');
    for (let i = 0; i <= body.length; i++) {
      expect(elements([body.subarray(0, i), body.subarray(i)]).data, `split at ${i}`).toEqual(['{"t":"22°C"}', '{"u":"😀"}']);
    }
  });

  it('a body that is not an array is left alone: kind "other", no events', () => {
    expect(elements(['  ', '\r\n{"candidates":[]}'])).toEqual({ data: [], kind: 'other', oversize: 0 });
    expect(elements(['  \n'])).toMatchObject({ data: [], kind: 'unknown' });
  });

  it('a cut-off stream emits the elements that completed, not the partial one', () => {
    expect(elements(['[{"a":1},\r\n{"b":"unterminated ]}'])).toMatchObject({ data: ['{"a":1}'], kind: 'array' });
  });

  it('drops elements over the cap, in one read or across reads, and keeps going', () => {
    const long = `{"x":"${'y'.repeat(100)}"}`;
    // In its place, its edges: here the whole element (both under EventEdges' sizes).
    const edges = [{ head: long, tail: long }];
    expect(elements([`[${long},{"ok":1}]`], 50)).toEqual({ data: ['{"ok":1}'], kind: 'done', oversize: 1, edges });
    expect(elements([`[${long.slice(0, 30)}`, long.slice(30, 80), `${long.slice(80)},{"ok":2}]`], 50)).toEqual({ data: ['{"ok":2}'], kind: 'done', oversize: 1, edges });
    // Over the cap only with its last read; one exactly at the cap is kept.
    expect(elements([`[${long.slice(0, 40)}`, `${long.slice(40)},{"ok":3}]`], 50)).toEqual({ data: ['{"ok":3}'], kind: 'done', oversize: 1, edges });
    const fits = `{"x":"${'y'.repeat(42)}"}`;
    expect(fits.length).toBe(50);
    expect(elements([`[${fits.slice(0, 20)}`, `${fits.slice(20)}]`], 50)).toEqual({ data: [fits], kind: 'done', oversize: 0 });
  });
});
