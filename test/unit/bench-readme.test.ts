// The README's benchmark block is the rendering of bench/results/latest.json (and of the earlier
// run its marker names for the brackets), not figures typed by hand: a new run that is not
// written into the README, or an edit of a figure, fails here.
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
// @ts-expect-error: the bench is plain JavaScript, with no types
import { num, readBlock, renderBlock, summarize, writeBlock } from '../../bench/lib/readme-summary.mjs';

const ROOT = path.resolve(__dirname, '../..');
const readJson = (rel: string) => JSON.parse(fs.readFileSync(path.join(ROOT, rel), 'utf8'));
const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
const results = readJson('bench/results/latest.json');

describe("README's benchmark block", () => {
  const block = readBlock(readme);
  const bracket = block.bracket ? readJson(block.bracket) : null;

  it('is what bench/results/latest.json and the named bracket run give', () => {
    expect(block.bracket, 'the marker names the bracket run').toMatch(/^bench\/results\/runs\/.+\.summary\.json$/);
    expect(bracket.version).toBe(1);
    expect(block.body).toBe(renderBlock(summarize(results), bracket));
  });

  it("is of the results' run: its date, duration and every path that ran", () => {
    const { meta } = results;
    expect(block.body).toContain(`finished ${meta.date.slice(0, 16).replace('T', ' ')} UTC`);
    expect(block.body).toContain(`${Math.round(meta.durationS).toLocaleString('en-US')} s`);
    for (const p of ['nginx (1 worker)', 'http-proxy', 'Portkey', 'metrics off']) expect(block.body).toContain(`| ${p} |`);
  });

  it('shows each of the issue targets with its verdict, and no other verdict', () => {
    const rows = block.body.split('\n').filter((l: string) => / \| (met|missed|no verdict)( \[(met|missed|no verdict|not run)\])? \| /.test(l));
    const judged = results.targets.filter((t: { target: string }) => !t.target.startsWith('measurement error'));
    // one row per target, plus the measurement-error summary row
    expect(rows).toHaveLength(judged.length + 1);
    for (const t of judged) {
      const line = rows.find((l: string) => l.startsWith(`| ${t.target} |`));
      expect(line, t.target).toBeDefined();
      expect(line).toContain(`| ${t.met === null ? 'no verdict' : t.met ? 'met' : 'missed'}`);
    }
  });

  it('would fail on a figure changed by hand or a newer run not written in', () => {
    const s = summarize(results);
    const body = renderBlock(s, bracket);
    const edited = structuredClone(s);
    edited.ttft['ttft c=1'].proxy.addedP99.median += 0.5;
    expect(renderBlock(edited, bracket)).not.toBe(body);
    const later = structuredClone(s);
    later.meta.date = '2030-01-01T00:00:00.000Z';
    expect(renderBlock(later, bracket)).not.toBe(body);
  });

  it('is replaced in place, keeping the text around it and the bracket it names', () => {
    const again = writeBlock(readme, block.body, block.bracket);
    expect(again).toBe(readme);
    const other = writeBlock(readme, 'x\n', null);
    expect(readBlock(other)).toMatchObject({ body: 'x\n', bracket: null });
    expect(other.slice(0, block.start)).toBe(readme.slice(0, block.start));
    expect(other.slice(other.indexOf('<!-- /bench-table -->'))).toBe(readme.slice(readme.indexOf('<!-- /bench-table -->')));
  });
});

describe('bench summary', () => {
  it('keeps what the README shows and is small enough to keep for every run', () => {
    const s = summarize(results);
    expect(JSON.stringify(s).length).toBeLessThan(40_000);
    expect(s.meta.paths).toEqual(['proxy', 'proxy-nometrics', 'nginx', 'http-proxy', 'portkey']);
    const t = results.figures.ttft['ttft c=1'].proxy.addedP99;
    expect(s.ttft['ttft c=1'].proxy.addedP99.median).toBeCloseTo(t.median, 3);
    expect(s.targets).toHaveLength(results.targets.length);
  });

  it('refuses a file that is not a results file', () => {
    expect(() => summarize({ meta: {} })).toThrow(/not a bench results file/);
  });

  it('writes three significant digits, without a sign on what rounds to zero', () => {
    expect([0.4512, 0.066, -0.51, 19.34, 4.392, 106.4, 879_012, 1_357_400, -0.001, null, Number.NaN].map(num)).toEqual([
      '0.45',
      '0.07',
      '-0.51',
      '19.3',
      '4.39',
      '106',
      '879,000',
      '1,360,000',
      '0.00',
      '–',
      '–',
    ]);
  });
});
