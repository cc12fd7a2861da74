// The benchmark's integrity check (bench/lib/sse.mjs, used by the load client): every fault a
// path can make to a stream is counted once, as what it is, wherever it happens and however
// the bytes are split into reads.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
// @ts-expect-error: the bench is plain JavaScript, with no types
import { SseSplitter, buildRequestBody, expectedEvent, parseTag, placeEvent, tagOf } from '../../bench/lib/sse.mjs';
// @ts-expect-error: the bench is plain JavaScript, with no types
import { fmt } from '../../bench/lib/stats.mjs';
// @ts-expect-error: the bench is plain JavaScript, with no types
import { writeReports } from '../../bench/lib/report.mjs';
import { tempDir } from '../helpers/temp-dir.js';

const expectedOf = expectedEvent as (sid: number, i: number, n: number) => string | null;

interface Check {
  sid: number;
  got: number;
  received: number;
  skipped: number;
  mismatched: number;
  merged: number;
  extra: number;
  arr: number[];
}

/** Feeds the bytes in the given reads, as the client does; returns the counts and lost events. */
function check(bytes: string, cuts: number[], n: number) {
  const st: Check = { sid: -1, got: 0, received: 0, skipped: 0, mismatched: 0, merged: 0, extra: 0, arr: [] };
  const sp = new SseSplitter();
  const points = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
  let from = 0;
  let read = 0;
  for (const to of [...points, bytes.length]) {
    const evs: string[] = [];
    sp.push(Buffer.from(bytes.slice(from, to), 'latin1'), evs);
    read++;
    for (const e of evs) {
      const first = (placeEvent as (s: Check, e: string, n: number) => number)(st, e, n);
      for (let k = first; first >= 0 && k < st.got; k++) st.arr[k] = read;
    }
    from = to;
  }
  const total = n + 3;
  return { ...st, lost: st.skipped + Math.max(0, total - st.got), rest: sp.rest as string };
}

function stream(sid: number, n: number): string[] {
  const out: string[] = [];
  for (let i = 0; i < n + 3; i++) out.push(expectedOf(sid, i, n)!);
  return out;
}

const fault = fc.oneof(
  fc.record({ kind: fc.constant('drop' as const), at: fc.nat() }),
  fc.record({ kind: fc.constant('dup' as const), at: fc.nat() }),
  fc.record({ kind: fc.constant('merge' as const), at: fc.nat(), tight: fc.boolean() }),
  fc.record({ kind: fc.constant('alter' as const), at: fc.nat(), byte: fc.nat() }),
);

describe('bench integrity check', () => {
  it('an intact stream, split into reads anywhere, counts nothing and places every event', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 30 }), fc.integer({ min: 1, max: 9999 }), fc.array(fc.nat(), { maxLength: 40 }), (n, sid, cuts) => {
        const r = check(stream(sid, n).join(''), cuts, n);
        expect([r.lost, r.merged, r.mismatched, r.extra, r.received, r.got, r.rest]).toEqual([0, 0, 0, 0, n + 3, n + 3, '']);
        expect(r.arr.filter((x) => x !== undefined)).toHaveLength(n + 3);
      }),
    );
  });

  it('one fault anywhere is counted once, as what it is, and the events after it are placed again', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 30 }), fault, fc.array(fc.nat(), { maxLength: 20 }), (n, f, cuts) => {
        const evs = stream(42, n);
        const at = f.at % evs.length;
        const want = { lost: 0, merged: 0, mismatched: 0, extra: 0 };
        if (f.kind === 'drop') {
          evs.splice(at, 1);
          want.lost = 1;
        } else if (f.kind === 'dup') {
          evs.splice(at + 1, 0, evs[at]!);
          want.extra = 1;
        } else if (f.kind === 'merge') {
          if (at === evs.length - 1) return; // nothing after the last event to glue it to
          // No blank line between the two records, or not even a line break ("}data: ").
          evs.splice(at, 2, evs[at]!.slice(0, f.tight ? -2 : -1) + evs[at + 1]!);
          want.merged = 1;
        } else {
          const e = evs[at]!;
          const p = 6 + (f.byte % (e.length - 8)); // inside the record, not its "data: " or its blank line
          const c = e[p] === 'x' ? 'y' : 'x';
          evs[at] = e.slice(0, p) + c + e.slice(p + 1);
          want.mismatched = 1;
        }
        const r = check(evs.join(''), cuts, n);
        expect({ lost: r.lost, merged: r.merged, mismatched: r.mismatched, extra: r.extra }).toEqual(want);
        // The event after the fault is placed at its own position again.
        if (f.kind !== 'drop' || at < n + 2) expect(r.arr[n + 2]).toBeDefined();
      }),
    );
  });

  it('a merged event whose last record claims a position the stream does not have stands for no jump past the end', () => {
    const n = 20;
    for (const claim of ['"tok 4000000"', '"tok 0"']) {
      const evs = stream(42, n);
      evs.splice(3, 2, evs[3]!.slice(0, -1) + evs[4]!.replace('"tok 4"', claim));
      const r = check(evs.join(''), [], n);
      expect(r.got).toBe(n + 3);
      expect(r.merged).toBe(1);
      expect(r.lost).toBeLessThanOrEqual(1); // the glued-in record is altered: its position counts as missing
    }
  });

  it('a stream cut short counts the missing tail as lost', () => {
    const n = 10;
    const evs = stream(7, n);
    for (let keep = 0; keep <= evs.length; keep++) expect(check(evs.slice(0, keep).join(''), [], n).lost).toBe(evs.length - keep);
  });

  it('the request tag travels in the body and is read back from it', () => {
    for (const tag of [1, 42, 1_000_000]) expect(parseTag(buildRequestBody({ user: tagOf(tag) }))).toBe(tag);
    expect(parseTag(buildRequestBody())).toBeUndefined();
  });
});

describe('bench/run.mjs options', () => {
  const run = (...args: string[]) => runWith({}, ...args);
  /** With the environment's BENCH_* settings replaced by `env`. */
  const runWith = (env: Record<string, string>, ...args: string[]) => {
    const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('BENCH_')));
    return spawnSync(process.execPath, ['bench/run.mjs', ...args], { encoding: 'utf8', timeout: 20_000, env: { ...base, ...env } });
  };

  it('--help prints the options and starts nothing', () => {
    const r = run('--help');
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/^usage: node bench\/run\.mjs/);
    for (const o of ['--quick', '--reps=N', '--paths=', '--phases=', '--gap=', '--mem=', '--out=', '--profile=', '--quiet-budget=']) expect(r.stdout).toContain(o);
  });

  // 12 bench processes one after another, as below: up to 16.8 s in full suites.
  it('a misspelt option, path or phase is refused before anything starts (exit 2)', { timeout: 120_000 }, () => {
    for (const [args, message] of [
      [['--path=proxy'], /unknown or malformed option "--path=proxy"/],
      [['--reps'], /unknown or malformed option "--reps"/],
      [['--quick=1'], /unknown or malformed option "--quick=1"/],
      [['quick'], /unknown or malformed option "quick"/],
      [['--paths=direct,prxy'], /unknown path prxy \(one of direct, proxy,/],
      [['--phases=gap,sustained'], /unknown phase sustained/],
      [['--reps=three'], /malformed option "--reps=three"/],
      [['--reps=0'], /malformed option "--reps=0"/],
      [['--profile='], /malformed option "--profile="/],
      [['--quiet-budget=abc'], /malformed option "--quiet-budget=abc"/],
      [['--gap=1.4'], /malformed option "--gap=1.4"/],
      [['--paths=proxy', '--paths=nginx'], /malformed option "--paths=nginx"/], // given twice: which one?
    ] as const) {
      const r = run(...args);
      expect(r.status, args.join(' ')).toBe(2);
      expect(r.stderr, args.join(' ')).toMatch(message);
      expect(r.stderr).not.toMatch(/\[bench/); // no progress line: nothing was started
    }
  });

  // 21 bench processes one after another: 1.7 s alone, but up to 35 s in full suites while
  // promtool's mutation runs held both cores, over half the unit tests' 60 s.
  it('every invocation the docs show parses as meant (--dry-run)', { timeout: 120_000 }, () => {
    const plan = (...args: string[]) => {
      const r = run('--dry-run', ...args);
      expect(r.status, `${args.join(' ')}: ${r.stderr}`).toBe(0);
      return JSON.parse(r.stdout) as { mode: string; paths: string[]; phases: string[]; reps: number; out: string; gap: string | null; profile: string | null };
    };
    // Only the full run of everything replaces the results the README is rendered from.
    const results = path.resolve('bench/results');
    expect(plan().out).toBe(results);
    for (const args of [['--quick'], ['--phases=gap'], ['--paths=direct,proxy'], ['--reps=1'], ['--gap=1.4x100'], ['--mem=10x20'], ['--profile=/tmp/prof']]) {
      expect(plan(...args).out, args.join(' ')).toBe(path.join(results, 'scratch'));
    }
    expect(plan('--quick', '--out=/tmp/x').out).toBe('/tmp/x');
    // a setting that changes what is measured, too; keeping the logs does not
    const outWith = (env: Record<string, string>) => JSON.parse(runWith(env, '--dry-run').stdout).out;
    const settings: Record<string, string>[] = [{ BENCH_PROXY_NODE_FLAGS: '--trace-gc' }, { BENCH_EMITTER_BUSYWAIT: '1' }, { BENCH_HEAP_SNAPSHOT_DIR: '/tmp/h' }];
    for (const env of settings) {
      expect(outWith(env), JSON.stringify(env)).toBe(path.join(results, 'scratch'));
    }
    expect(outWith({ BENCH_KEEP_TMP: '1' })).toBe(results);
    expect(plan()).toMatchObject({ mode: 'full', reps: 3, paths: ['direct', 'proxy', 'proxy-nometrics', 'nginx', 'http-proxy', 'portkey'], phases: ['ttft', 'gap', 'sustain', 'mem', 'cancel'] });
    expect(plan('--quick')).toMatchObject({ mode: 'quick', reps: 1 });
    expect(plan('--paths=direct,proxy,nginx', '--phases=ttft,gap', '--reps=3', '--out=/tmp/x')).toMatchObject({ paths: ['direct', 'proxy', 'nginx'], phases: ['ttft', 'gap'], reps: 3 });
    expect(plan('--paths=proxy,proxy-alt', '--phases=ttft', '--reps=5')).toMatchObject({ paths: ['direct', 'proxy', 'proxy-alt'], reps: 5 });
    expect(plan('--phases=gap', '--gap=20x250,1.4x100')).toMatchObject({ gap: '20x250,1.4x100' });
    expect(plan('--quick', '--phases=gap', '--profile=/tmp/prof')).toMatchObject({ profile: '/tmp/prof' });
  });

  it("records the commit measured, and says when the proxy's build is older than its source", () => {
    const commitOf = () => JSON.parse(run('--dry-run').stdout).commit as string;
    const head = spawnSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).stdout.trim();
    expect(commitOf()).toMatch(new RegExp(`^${head}(-dirty)?$`)); // npm test built dist/ just now
    const cli = path.resolve('dist/cli.js');
    const { atime, mtime } = fs.statSync(cli);
    try {
      fs.utimesSync(cli, atime, new Date(0)); // a build from before any source file
      expect(commitOf()).toMatch(new RegExp(`^${head}(-dirty)?\\+stale-dist$`));
    } finally {
      fs.utimesSync(cli, atime, mtime);
    }
  });
});

describe('report number format', () => {
  it('writes what rounds to zero without a sign, and keeps real negatives', () => {
    expect([fmt(-0.04, 1), fmt(-0.0004, 3), fmt(-0, 0), fmt(-0.4, 0), fmt(0.04, 1)]).toEqual(['0.0', '0.000', '0', '0', '0.0']);
    expect([fmt(-0.06, 1), fmt(-1.25, 2), fmt(-12, 0), fmt(-0.0006, 3)]).toEqual(['-0.1', '-1.25', '-12', '-0.001']);
    expect([fmt(null), fmt(Number.NaN), fmt(Number.POSITIVE_INFINITY)]).toEqual(['–', '–', 'Infinity']);
  });
});

describe('report verdicts that must not drop out', () => {
  type Rec = Record<string, unknown>;
  const meta = { mode: 'full', date: 'x', node: 'v20', cpus: 2, cpuModel: 'cpu', memGiB: 24, kernel: 'k', reps: 3, durationS: 1, paths: { direct: { ok: true }, proxy: { ok: true }, 'http-proxy': { ok: true } } };
  const cancel = (path: string, rep: number, over: Rec = {}): Rec => ({ phase: 'cancel', key: 'cancel c=100', rep, path, requested: 100, aborted: 100, errors: 0, timedOut: false, closed: 100, notClosed: 0, p50: 2, p99: 4, max: 5, ...over });
  const mem = (path: string, rep: number, over: Rec = {}): Rec => ({
    phase: 'mem', key: 'mem 100->3000', rep, path, n1: 100, n2: 3000, rss1KiB: 1000, rss2KiB: 59000, rssPerStreamKiB: 20, heapPerStreamKiB: 5, youngGrowthKiB: 0, gcForced: true,
    requested: { n1: 100, n2: 3000 }, probed: true, holdTimedOut: false, holdErrors: [], release: { streams: 3000, lost: 0, mismatched: 0, timedOut: false }, ...over,
  });
  const report = (runs: Rec[]) => writeReports({ meta, runs, out: tempDir('llp-bench-report-') }) as { targets: { target: string; value: number | null; met: boolean }[]; failures: string[]; warnings: string[] };
  const reps = [1, 2, 3];

  it('a proxy that never closes its upstream after an abort fails the cancellation target, as one that closes late does', () => {
    const fine = report(reps.map((rep) => cancel('proxy', rep)));
    expect(fine.targets).toEqual([expect.objectContaining({ target: 'cancellation p99', value: 4, met: true })]);
    expect(fine.failures).toEqual([]);
    const never = report(reps.map((rep) => cancel('proxy', rep, { closed: 0, notClosed: 100, p50: NaN, p99: NaN, max: NaN })));
    expect(never.targets).toEqual([expect.objectContaining({ target: 'cancellation p99', value: null, met: false })]);
    expect(never.failures).toEqual([expect.stringMatching(/^cancellation p99: no upstream connection was seen closed .*not closed: 300/)]);
  });

  it('a memory ramp that held fewer streams than asked, lost some on release or read without a forced GC fails this proxy (a peer: a warning)', () => {
    const fine = report(reps.map((rep) => mem('proxy', rep)));
    expect(fine.targets).toEqual([expect.objectContaining({ target: 'RSS per open stream', value: 20, met: true })]);
    expect(fine.failures).toEqual([]);
    const short = report(reps.map((rep) => mem('proxy', rep, rep === 2 ? { n2: 300, gcForced: false, release: { streams: 300, lost: 4, mismatched: 0, timedOut: true } } : {})));
    expect(short.failures).toEqual(['mem 100->3000 rep2 proxy: held 100 and 300 streams of 100 and 3000; on release: lost 4, altered 0, timed out; no GC was forced before a reading']);
    const peer = report(reps.map((rep) => mem('http-proxy', rep, { holdTimedOut: true, probed: false, gcForced: false })));
    expect(peer.failures).toEqual([]);
    expect(peer.warnings).toHaveLength(3);
    expect(peer.warnings[0]).toBe('mem 100->3000 rep1 http-proxy: opening the streams timed out');
    // No stream opened on any ramp: no slope, and the row says so instead of vanishing.
    const none = report(reps.map((rep) => mem('proxy', rep, { n1: 0, n2: 0, rssPerStreamKiB: null })));
    expect(none.targets).toEqual([expect.objectContaining({ target: 'RSS per open stream', value: null, met: false })]);
    expect(none.failures).toContain('RSS per open stream: no ramp opened any stream, or every ramp failed');
  });
});
