// The README's benchmark block is the rendering of bench/results/latest.json (and of the earlier
// run its marker names for the brackets), not figures typed by hand: a new run that is not
// written into the README, or an edit of a figure, fails here.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
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
    for (const p of ['this proxy', 'nginx (1 worker)', 'http-proxy', 'Portkey', 'metrics off']) expect(block.body).toContain(`| ${p} |`);
  });

  it('is of a full run of everything, as the README says', () => {
    const { meta } = results;
    expect(meta).toMatchObject({ mode: 'full', reps: 3, phases: ['ttft', 'gap', 'sustain', 'mem', 'cancel'] });
    for (const p of ['direct', 'proxy', 'proxy-nometrics', 'nginx', 'http-proxy', 'portkey']) expect(meta.paths[p], p).toEqual({ ok: true });
  });

  // Read from latest.json's figures here, not through summarize(), so that a renderer that
  // takes the wrong field or column fails even though the README agrees with it.
  it("puts latest.json's figures in the right rows and columns", () => {
    const F = results.figures;
    const tables: string[] = block.body.split('\n\n').filter((t: string) => t.startsWith('|'));
    const cell = (tableHead: string, rowStart: RegExp, column: string) => {
      const t = tables.find((x) => x.startsWith(`| ${tableHead} |`) && x.split('\n')[0]!.includes(`| ${column} |`));
      expect(t, tableHead).toBeDefined();
      const lines = t!.split('\n').map((l: string) => l.split('|').slice(1, -1).map((c) => c.trim()));
      const col = lines[0]!.indexOf(column);
      const row = lines.find((r: string[]) => rowStart.test(r[0] ?? ''));
      expect(col, column).toBeGreaterThan(0);
      expect(row, String(rowStart)).toBeDefined();
      return row![col];
    };
    const pair = (x: { addedP50: { median: number }; addedP99: { median: number } }) => `${num(x.addedP50.median)} / ${num(x.addedP99.median)}`;
    const t1 = F.ttft['ttft c=1'];
    expect(cell('figure', /^added TTFT p50 \/ p99, 1 stream/, 'this proxy')).toBe(`${pair(t1.proxy)} [${pair(bracket.ttft['ttft c=1'].proxy)}]`);
    expect(cell('figure', /^added TTFT p50 \/ p99, 1 stream/, 'http-proxy')).toBe(pair(t1['http-proxy']));
    expect(cell('figure', /^… Δ 1.4 ms × 100 streams/, 'nginx (1 worker)')).toBe(pair(F.gap['gap d=1.4 c=100'].nginx));
    expect(cell('figure', /^… Δ 20 ms × 1,000 streams/, 'metrics off')).toBe(pair(F.gap['gap d=20 c=1000']['proxy-nometrics']));
    const hp = F.sustained['http-proxy'].streams;
    expect(cell('figure', /^streams sustained/, 'http-proxy')).toBe(`${hp.median} [${hp.min}–${hp.max}]`);
    const mem = F.memory.proxy;
    expect(cell('figure', /^RSS per open stream/, 'this proxy')).toMatch(
      new RegExp(`^${[mem.rssPerStreamKiB, mem.youngPerStreamKiB, mem.rssSecondRampKiB].map((a) => num(a.median)).join(' / ')}; ${num(mem.heapPerStreamKiB.median)} \\[`),
    );
    expect(cell('figure', /^cancellation/, 'nginx (1 worker)')).toBe(num(F.cancellation.nginx.p99.median));
    expect(cell('figure', /^cancellation/, 'http-proxy')).toBe('never closed');
    expect(cell('path', /^this proxy$/, 'request leg p50 (ms)')).toMatch(new RegExp(`^${num(t1.proxy.requestLegP50.median)} \\[`));
    expect(cell('path', /^nginx/, 'response leg p50 (ms)')).toBe(num(t1.nginx.responseLegP50.median));
    const acc = F.accuracy['gap d=1.4 c=1000'].itl;
    expect(cell('scenario', /^Δ 1.4 ms × 1,000 streams$/, 'ITL error, worst repetition')).toMatch(new RegExp(`^${acc.absErrMs.max.toFixed(3)} \\[`));
    expect(cell('scenario', /^Δ 1.4 ms × 1,000 streams$/, 'ITL vs emitter')).toBe(acc.errUpMs.median.toFixed(3).replace(/^-(0\.0+)$/, '$1'));
    const busy = F.metricsCost.busiest;
    expect(cell('scenario', /\(busiest\)$/, 'on ÷ off, steady')).toMatch(new RegExp(`^${num(busy.steadyRatio)} \\[`));
    expect(cell('scenario', /\(busiest\)$/, "proxy's CPU share, steady")).toMatch(new RegExp(`^${num(busy.onCpuShare.median)} \\[`));
  });

  it('shows each of the issue targets with its verdict, and no other verdict', () => {
    const rows = block.body.split('\n').filter((l: string) => / \| (met|missed|no verdict)( \[(met|missed|no verdict|not run)\])? \| /.test(l));
    const judged = results.targets.filter((t: { target: string }) => !t.target.startsWith('measurement error'));
    // one row per target, plus the measurement-error rows (ITL and TPOT; TTFT)
    expect(rows).toHaveLength(judged.length + 2);
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

  it('fails on a figure of the README changed by hand', () => {
    const row = block.body.split('\n').find((l: string) => l.startsWith('| added TTFT p50 / p99, 1 stream'));
    const edited = readme.replace(row, row.replace(/\| (\d+\.\d+) \//, (_: string, v: string) => `| ${(Number(v) + 0.5).toFixed(2)} /`));
    expect(edited).not.toBe(readme);
    expect(readBlock(edited).body).not.toBe(renderBlock(summarize(results), bracket));
  });

  it('reads the same from a CRLF checkout, and writes it back with CRLF, changing no byte outside the block', () => {
    const lf = readme.replace(/\r\n/g, '\n'); // this checkout's own may be either
    const crlf = lf.replace(/\n/g, '\r\n');
    expect(readBlock(crlf)).toMatchObject({ body: block.body, bracket: block.bracket });
    expect(writeBlock(crlf, block.body, block.bracket)).toBe(crlf);
    const other = writeBlock(crlf, 'x\n', null);
    expect(other.replace(/\r\n/g, '')).not.toContain('\n');
    expect(readBlock(other)).toMatchObject({ body: 'x\n', bracket: null });
    // Mixed endings, and a stray CR before a line end, outside the block: kept as they were.
    const i = lf.indexOf('<!-- bench-table');
    const j = lf.indexOf('<!-- /bench-table -->');
    const mixed = `${lf.slice(0, i).replace('\n', '\r\r\n').replace(/\n\n$/, '\r\n\n')}${lf.slice(i, j)}${lf.slice(j).replace('\n', '\r\n')}`;
    expect(mixed).toContain('\r\r\n');
    const out = writeBlock(mixed, 'x\n', null);
    const at = mixed.indexOf('<!-- bench-table');
    expect(out.slice(0, at)).toBe(mixed.slice(0, at));
    expect(out.slice(out.indexOf('<!-- /bench-table -->'))).toBe(mixed.slice(mixed.indexOf('<!-- /bench-table -->')));
    expect(readBlock(out)).toMatchObject({ body: 'x\n', bracket: null });
    expect(writeBlock(mixed, block.body, block.bracket)).toBe(mixed);
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

  it('renders runs of fewer phases, paths or checks without a misleading word', () => {
    type Results = typeof results;
    const variant = (f: (r: Results) => void) => {
      const r = structuredClone(results);
      f(r);
      return renderBlock(summarize(r), summarize(results));
    };
    const quick = variant((r) => {
      r.meta.mode = 'quick';
      r.meta.reps = 1;
    });
    expect(quick).toContain('`npm run bench -- --quick` (quick: 1 repetition,');
    expect(quick).toContain('One repetition');
    // no accuracy checks at all: no verdict, not a vacuous "0 of 0 … met"
    const noAcc = variant((r) => {
      r.targets = r.targets.filter((t: { target: string }) => !t.target.startsWith('measurement error'));
      r.figures.accuracy = {};
    });
    expect(noAcc).not.toMatch(/0 of 0/);
    expect(noAcc).not.toContain('Measurement accuracy');
    // a check without a verdict is not counted as within
    const nullAcc = variant((r) => {
      for (const t of r.targets) if (t.target.startsWith('measurement error')) t.met = null;
    });
    // The bracket is the results' own count, whatever the last run's was.
    for (const [row, pattern] of [
      ['ITL and TPOT', /^measurement error (itl|tpot) /],
      ['TTFT', /^measurement error ttft /],
    ] as const) {
      const checks = results.targets.filter((t: { target: string }) => pattern.test(t.target));
      const within = checks.filter((t: { met: boolean | null }) => t.met === true).length;
      expect(checks.length).toBeGreaterThan(0);
      const verdict = within === checks.length ? 'met' : 'missed';
      expect(nullAcc).toMatch(new RegExp(`${row} .*\\| 0 of ${checks.length} within \\[${within} of ${checks.length}\\] \\| every one \\| no verdict \\[${verdict}\\] \\|`));
    }
    const unmeasured = variant((r) => {
      const t = r.targets.find((x: { target: string }) => x.target === 'cancellation p99');
      Object.assign(t, { value: null, met: false, unmeasured: true });
    });
    // The brackets hold the results' own verdicts, whatever the last run's were.
    const was = (target: string) => (results.targets.find((x: { target: string }) => x.target === target).met === true ? 'met' : 'missed');
    expect(unmeasured).toMatch(new RegExp(`\\| cancellation p99 \\| unmeasured \\[[\\d.]+\\] \\| <= 20 ms \\| missed \\(unmeasured\\) \\[${was('cancellation p99')}\\] \\|`));
    // a ratio over a peer's 0 is Infinity, which JSON writes as null: met, it shows as ∞; a null
    // that is not met stays a dash
    const overZero = variant((r) => {
      const t = r.targets.find((x: { target: string }) => x.target === 'streams sustained vs portkey');
      Object.assign(t, { value: null, met: true, note: '250 vs 0' });
    });
    expect(overZero).toMatch(new RegExp(`\\| streams sustained vs portkey \\| ∞ \\[[^\\]]+\\] \\| >= 3x \\| met \\[${was('streams sustained vs portkey')}\\] \\| 250 vs 0 \\|`));
    const nullMissed = variant((r) => {
      const t = r.targets.find((x: { target: string }) => x.target === 'streams sustained vs portkey');
      Object.assign(t, { value: null, met: false });
    });
    expect(nullMissed).toMatch(new RegExp(`\\| streams sustained vs portkey \\| – \\[[^\\]]+\\] \\| >= 3x \\| missed \\[${was('streams sustained vs portkey')}\\] \\|`));
    // phases that did not run leave their rows out
    const gapOnly = variant((r) => {
      r.meta.phases = ['gap'];
      r.figures.ttft = {};
      r.figures.sustained = {};
      r.figures.memory = {};
      r.figures.cancellation = {};
      r.figures.integrity = {};
      r.targets = r.targets.filter((t: { target: string }) => /^added gap|^events\/s|\(gap d=/.test(t.target));
    });
    expect(gapOnly).toContain('phases gap only');
    expect(gapOnly).not.toMatch(/added TTFT|streams sustained|RSS per open stream|cancellation →|TTFT at 1 stream by leg/);
    // a run whose proxy did not start: no proxy column, so no bracket sentence about it
    const noProxy = variant((r) => {
      r.meta.paths.proxy = { ok: false, error: 'EADDRINUSE' };
    });
    expect(noProxy).not.toContain('| this proxy |');
    expect(noProxy).not.toContain('In brackets');
    for (const text of [quick, noAcc, nullAcc, unmeasured, gapOnly, noProxy]) expect(text).not.toMatch(/NaN|undefined|Infinity|\[\]/);
  });

  it("names the commit of a run from before runs recorded theirs, and never replaces a recorded one", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-readme-'));
    try {
      const head = spawnSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: ROOT, encoding: 'utf8' }).stdout.trim();
      const write = (meta: Record<string, unknown>, ...args: string[]) => {
        fs.writeFileSync(path.join(dir, 'r.json'), JSON.stringify({ ...results, meta: { ...results.meta, ...meta } }));
        fs.rmSync(path.join(dir, 's.json'), { force: true });
        const r = spawnSync(process.execPath, ['bench/readme.mjs', `--results=${path.join(dir, 'r.json')}`, `--summary=${path.join(dir, 's.json')}`, ...args], { cwd: ROOT, encoding: 'utf8' });
        const out = fs.existsSync(path.join(dir, 's.json')) ? JSON.parse(fs.readFileSync(path.join(dir, 's.json'), 'utf8')) : null;
        return { status: r.status, stderr: r.stderr, written: out !== null, commit: out?.meta.commit };
      };
      expect(write({ commit: undefined }, `--commit=${head}`)).toMatchObject({ status: 0, written: true, commit: head });
      expect(write({ commit: undefined })).toMatchObject({ status: 0, written: true, commit: null });
      expect(write({ commit: `${head}-dirty` }, `--commit=${head}`)).toMatchObject({ status: 0, written: true, commit: `${head}-dirty` });
      expect(write({ commit: 'abcdef0' }, `--commit=${head}`)).toMatchObject({ status: 2, written: false, stderr: expect.stringMatching(/record their commit, abcdef0/) });
      expect(write({ commit: undefined }, '--commit=no-such-rev')).toMatchObject({ status: 2, written: false, stderr: expect.stringMatching(/not a commit/) });
      const alone = spawnSync(process.execPath, ['bench/readme.mjs', '--check', `--commit=${head}`], { cwd: ROOT, encoding: 'utf8' });
      expect([alone.status, alone.stderr]).toEqual([2, expect.stringMatching(/use it with --summary/)]);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
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
