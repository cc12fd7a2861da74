import { describe, expect, it } from 'vitest';
import { NdjsonParser } from '../../src/sse/ndjson.js';
import type { SseEvent } from '../../src/sse/parser.js';
import { fixture } from '../helpers/fixtures.js';

function lines(chunks: (string | Buffer)[], max?: number, end = true): SseEvent[] {
  const out: SseEvent[] = [];
  const p = new NdjsonParser((e) => out.push(e), max === undefined ? {} : { maxEventBytes: max });
  for (const c of chunks) p.push(typeof c === 'string' ? Buffer.from(c) : c);
  if (end) p.end();
  return out;
}

describe('NDJSON line framing', () => {
  it('the Ollama fixture: one event per line, equal to a whole-text split, at every split point', () => {
    const bytes = fixture('ollama-chat.ndjson');
    const want = bytes.toString('utf8').split('\n').filter((l) => l !== '');
    expect(want.length).toBe(24);
    for (let i = 0; i <= bytes.length; i++) {
      const got = lines([bytes.subarray(0, i), bytes.subarray(i)]).map((e) => e.data);
      if (got.join('\n') !== want.join('\n')) expect(got, `split at ${i}`).toEqual(want);
    }
    expect(lines([bytes])[0]).toEqual({ type: '', data: want[0], id: undefined });
  });

  it('strips CR, skips blank lines, reassembles UTF-8 split across reads', () => {
    const deg = Buffer.from('{"a":"22°C"}\r\n\n  \n{"b":1}\n');
    const i = deg.indexOf(0xb0); // second byte of °
    expect(lines([deg.subarray(0, i), deg.subarray(i)]).map((e) => e.data)).toEqual(['{"a":"22°C"}', '{"b":1}']);
  });

  it('a last line without a newline is emitted by end() only', () => {
    expect(lines(['{"a":1}\n{"b":2}'], undefined, false).map((e) => e.data)).toEqual(['{"a":1}']);
    expect(lines(['{"a":1}\n{"b":2}']).map((e) => e.data)).toEqual(['{"a":1}', '{"b":2}']);
  });

  it('drops lines over the cap, in one chunk or across chunks, and keeps going: an event with their edges in their place', () => {
    const long = 'x'.repeat(100);
    const show = (evs: { data: string; oversize?: { head: string; tail: string } }[]) => evs.map((e) => (e.oversize ? `*${e.oversize.head.length}/${e.oversize.tail}` : e.data));
    expect(show(lines([`${long}\n{"ok":1}\n`], 50))).toEqual([`*100/${long}`, '{"ok":1}']);
    expect(show(lines([long.slice(0, 30), long.slice(30), '\n{"ok":2}\n'], 50))).toEqual([`*100/${long}`, '{"ok":2}']);
    // A last line without its newline, over the cap, at the body's end.
    expect(show(lines([long], 50))).toEqual([`*100/${long}`]);
    // The rest of the long line comes with the next line in one read: only the next line is one.
    expect(show(lines([long.slice(0, 60), 'tail\n{"ok":3}\n'], 50))).toEqual([`*64/${long.slice(0, 60)}tail`, '{"ok":3}']);
    // Every split of a body with two lines over the cap between short ones.
    const a = `{"done":true,"context":[${'1,'.repeat(40)}2],"eval_count":7}`;
    const body = Buffer.from(`{"n":1}\n${a}\n{"n":2}\n${a.replace('7', '8')}\n{"n":3}\n`);
    const want = ['{"n":1}', `*${a.length}/${a}`, '{"n":2}', `*${a.length}/${a.replace('7', '8')}`, '{"n":3}'];
    for (let i = 0; i <= body.length; i++) {
      for (let j = i; j <= body.length; j += 7) {
        const got = show(lines([body.subarray(0, i), body.subarray(i, j), body.subarray(j)], 50));
        if (got.join('|') !== want.join('|')) expect(got, `split at ${i}, ${j}`).toEqual(want);
      }
    }
  });

  it('leaves out a UTF-8 BOM that starts the body, also split across reads, and only there', () => {
    const bom = Buffer.from([0xef, 0xbb, 0xbf]);
    const body = Buffer.concat([bom, Buffer.from('{"a":1}\n'), bom, Buffer.from('{"b":2}\n')]);
    for (let i = 0; i <= body.length; i++) {
      const got = lines([body.subarray(0, i), body.subarray(i)]).map((e) => e.data);
      expect(got, `split at ${i}`).toEqual(['{"a":1}', '\ufeff{"b":2}']);
    }
  });
});
