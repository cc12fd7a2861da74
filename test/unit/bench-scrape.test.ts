// The bench's reading of the proxy's /metrics around a run (bench/lib/scrape.mjs): its runtime
// figures are checked against the proxy's own exposition, rendered by the proxy's own telemetry,
// with GC pauses counted by an observer of the test's and a loop stall the test makes.
import { constants, PerformanceObserver } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { afterEach, describe, expect, it } from 'vitest';
// @ts-expect-error: the bench is plain JavaScript, with no types
import { fmtRuntime, metricsDiff, parseMetrics, runtimeDiff } from '../../bench/lib/scrape.mjs';
import { createTelemetry, SCOPE_NAME, type Telemetry } from '../../src/metrics/exporter.js';
import { RuntimeMetrics } from '../../src/metrics/runtime.js';
import { GC_DURATION_BUCKETS } from '../../src/metrics/semconv.js';
import { blockFor } from '../helpers/busy.js';

interface Runtime {
  loopDelayMaxMs?: number;
  loopDelayP99Ms?: number;
  gc: Record<string, { count: number; sumMs: number }>;
  gcLongestAtMostMs?: number;
}
const diff = runtimeDiff as (a: unknown, b: unknown) => Runtime | undefined;

async function text(t: Telemetry): Promise<string> {
  let out = '';
  for await (const piece of t.scrape!()) out += piece;
  return out;
}

const KIND: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor',
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb',
};

describe("the bench's reading of the proxy's runtime metrics", () => {
  let t: Telemetry | undefined;
  let runtime: RuntimeMetrics | undefined;
  afterEach(async () => {
    runtime?.shutdown();
    await t?.shutdown();
    t = runtime = undefined;
  });

  it('GC pauses by kind, their total and the bucket of the longest, as an observer of its own saw them; the loop stall between two scrapes', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as (opts?: { type: 'major' | 'minor' }) => void;
    t = createTelemetry({ prometheus: true, loopDelayResolutionMs: 10 });
    runtime = new RuntimeMetrics(t.provider.getMeter(SCOPE_NAME));
    const seen: Record<string, { count: number; sumMs: number; maxMs: number }> = {};
    // Node hands a GC entry to every observer in one task, and a scrape takes the histogram's
    // snapshot before its first turn ends: an entry is in the diff exactly when it reached this
    // observer while `counting`, which is switched right before each scrape is called.
    let counting = false;
    const observer = new PerformanceObserver((list) => {
      if (!counting) return;
      for (const e of list.getEntries()) {
        const kind = KIND[(e as { detail?: { kind?: number } }).detail?.kind ?? -1] ?? 'other';
        const s = (seen[kind] ??= { count: 0, sumMs: 0, maxMs: 0 });
        s.count++;
        s.sumMs += e.duration;
        s.maxMs = Math.max(s.maxMs, e.duration);
      }
    });
    observer.observe({ entryTypes: ['gc'] });
    // A collection just before the first scrape: in the diff or not, as its entry comes.
    gc();
    counting = true;
    const before = parseMetrics(await text(t));
    for (let i = 0; i < 3; i++) gc();
    for (let i = 0; i < 2; i++) gc({ type: 'minor' });
    blockFor(80); // a stall the loop-delay sampler (10 ms) must see
    // Entries reach the observers on a later turn, however late a loaded machine runs it.
    for (let i = 0; i < 500 && ((seen.major?.count ?? 0) < 3 || (seen.minor?.count ?? 0) < 2); i++) await sleep(10);
    counting = false;
    const after = parseMetrics(await text(t));
    observer.disconnect();

    const rt = diff(before, after)!;
    expect(seen.major?.count ?? 0).toBeGreaterThanOrEqual(3);
    expect(Object.keys(rt.gc).sort()).toEqual(Object.keys(seen).sort());
    let longest = 0;
    for (const [kind, s] of Object.entries(seen)) {
      expect(rt.gc[kind]!.count, kind).toBe(s.count);
      expect(rt.gc[kind]!.sumMs, kind).toBeCloseTo(s.sumMs, 3);
      longest = Math.max(longest, s.maxMs);
    }
    // The smallest bucket bound at or above the longest pause.
    const bound = GC_DURATION_BUCKETS.find((b) => b * 1000 >= longest);
    expect(rt.gcLongestAtMostMs).toBeCloseTo(bound! * 1000, 9);
    // Blocked 80 ms with a sample due every 10: the sample after the stall is late by at least
    // 80 less one period.
    expect(rt.loopDelayMaxMs).toBeGreaterThanOrEqual(70);
    expect(rt.loopDelayP99Ms).toBeLessThanOrEqual(rt.loopDelayMaxMs!);
    expect(fmtRuntime(rt)).toMatch(/^ \| its loop delay max \d+\.\d ms, GC .*major \d+ \(\d+\.\d ms\)/);
  });

  it('a failed or foreign scrape gives no runtime figures, and no collection between scrapes reads as none', async () => {
    t = createTelemetry({ prometheus: true, loopDelayResolutionMs: 10 });
    runtime = new RuntimeMetrics(t.provider.getMeter(SCOPE_NAME));
    const a = parseMetrics(await text(t));
    expect(diff({ error: 'ECONNREFUSED' }, a)).toBeUndefined();
    expect(diff(a, null)).toBeUndefined();
    // Sums alone (as stored in a results file: no series kept) are not a scrape this reader can diff.
    expect(diff(JSON.parse(JSON.stringify(a)), a)).toBeUndefined();
    // A restart between two scrapes (fewer pauses in the second) is no run's figure.
    setFlagsFromString('--expose-gc');
    (runInNewContext('gc') as () => void)();
    for (let i = 0; i < 500 && (await text(t)).match(/v8js_gc_duration_seconds_count\{v8js_gc_type="major"/) === null; i++) await sleep(10);
    const b = parseMetrics(await text(t));
    expect(diff(a, b)).toBeDefined();
    expect(diff(b, a)).toBeUndefined();
    const same = diff(a, a)!;
    expect(same.gc).toEqual({});
    expect(same.gcLongestAtMostMs).toBeUndefined();
    expect(fmtRuntime(undefined)).toBe('');
    expect(fmtRuntime(same)).toContain('GC none');
  });

  it('the accuracy histograms: sum and count over the run, summed over label sets, and the streams the client held back', () => {
    const scrape = (n: number) =>
      parseMetrics(
        [
          '# HELP gen_ai_client_operation_time_to_first_chunk_seconds x',
          `gen_ai_client_operation_time_to_first_chunk_seconds_sum{gen_ai_provider_name="openai"} ${0.5 * n}`,
          `gen_ai_client_operation_time_to_first_chunk_seconds_sum{gen_ai_provider_name="anthropic"} ${0.25 * n}`,
          `gen_ai_client_operation_time_to_first_chunk_seconds_count{gen_ai_provider_name="openai"} ${2 * n}`,
          `gen_ai_client_operation_time_to_first_chunk_seconds_count{gen_ai_provider_name="anthropic"} ${n}`,
          `gen_ai_client_operation_time_per_output_chunk_seconds_sum ${n}`,
          `gen_ai_client_operation_time_per_output_chunk_seconds_count ${10 * n}`,
          `llm_proxy_streams_client_paced_total{gen_ai_provider_name="openai"} ${n}`,
          'not a sample line',
          'gen_ai_server_time_per_output_token_seconds_sum NaN',
        ].join('\n'),
      );
    const d = metricsDiff(scrape(1), scrape(3));
    expect(d.ttft).toEqual({ sumS: 1.5, count: 6 });
    expect(d.itl).toEqual({ sumS: 2, count: 20 });
    // Absent after the run: not a zero.
    expect(d.tpot.count).toBeNaN();
    expect(d.held).toBe(2);
    expect(metricsDiff(null, scrape(1))).toEqual({ error: 'no scrape' });
  });
});
