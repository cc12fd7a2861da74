import fc from 'fast-check';
import { AggregationTemporality, DataPointType, MeterProvider, MetricReader, type HistogramMetricData, type SumMetricData } from '@opentelemetry/sdk-metrics';
import { describe, expect, it } from 'vitest';
import { FastHistogram, FastMetricProducer, FastSum, MAX_SERIES } from '../../src/metrics/fast-metrics.js';
import { LabelSets } from '../../src/metrics/label-sets.js';
import { DEFAULT_BUCKETS } from '../../src/metrics/semconv.js';

class Reader extends MetricReader {
  constructor(fast: FastMetricProducer) {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.CUMULATIVE, metricProducers: [fast] });
  }
  protected override async onForceFlush(): Promise<void> {}
  protected override async onShutdown(): Promise<void> {}
}

describe('FastHistogram', () => {
  it('aggregates exactly like the SDK histogram for the same values and attributes (property)', async () => {
    await fc.assert(
      fc.asyncProperty(
        // Values on the boundaries too (a bucket holds its upper bound), which doubles almost never hit.
        fc.array(fc.tuple(fc.oneof(fc.double({ min: 0, max: 5, noNaN: true }), fc.constantFrom(...DEFAULT_BUCKETS.itl)), fc.constantFrom('a', 'b', 'c')), { maxLength: 200 }),
        async (samples) => {
          const fast = new FastMetricProducer({ name: 'fast' });
          const reader = new Reader(fast);
          const provider = new MeterProvider({ readers: [reader] });
          const bounds = [...DEFAULT_BUCKETS.itl];
          const sdk = provider.getMeter('sdk').createHistogram('sdk', { unit: 's', advice: { explicitBucketBoundaries: bounds } });
          const mine = fast.add(new FastHistogram('mine', 's', 'd', bounds));
          const attrs = { a: { model: 'a' }, b: { model: 'b' }, c: { model: 'c' } } as const;
          for (const [v, k] of samples) {
            sdk.record(v, attrs[k]);
            mine.record(v, { ...attrs[k] }); // a fresh object each time: keyed by content too
          }
          const { resourceMetrics } = await reader.collect();
          const all = resourceMetrics.scopeMetrics.flatMap((s) => s.metrics).filter((m) => m.dataPointType === DataPointType.HISTOGRAM) as HistogramMetricData[];
          const pick = (name: string) =>
            Object.fromEntries(
              all
                .find((m) => m.descriptor.name === name)!
                .dataPoints.map((dp) => [String(dp.attributes.model), { counts: dp.value.buckets.counts, count: dp.value.count, sum: dp.value.sum, min: dp.value.min, max: dp.value.max }]),
            );
          if (samples.length === 0) {
            expect(all.find((m) => m.descriptor.name === 'mine')!.dataPoints).toEqual([]);
            return;
          }
          const a = pick('sdk');
          const b = pick('mine');
          expect(Object.keys(b).sort()).toEqual(Object.keys(a).sort());
          for (const k of Object.keys(a)) {
            expect(b[k]!.counts).toEqual(a[k]!.counts);
            expect(b[k]!.count).toBe(a[k]!.count);
            expect(b[k]!.sum).toBeCloseTo(a[k]!.sum!, 9);
            expect(b[k]!.min).toBe(a[k]!.min);
            expect(b[k]!.max).toBe(a[k]!.max);
          }
          await provider.shutdown();
        },
      ),
      { numRuns: 60 },
    );
  });

  it('hands out a snapshot: what is recorded after a collection does not change its data points', async () => {
    // The exposition is written over several event-loop turns after the collection, and OTLP
    // exports asynchronously: bucket lines must keep agreeing with their _count.
    const fast = new FastMetricProducer({ name: 'fast' });
    const h = fast.add(new FastHistogram('h', 's', 'd', [1, 2]));
    h.record(0.5, { a: '1' });
    const { resourceMetrics } = await fast.collect();
    const dp = (resourceMetrics.scopeMetrics[0]!.metrics[0] as HistogramMetricData).dataPoints[0]!;
    h.record(0.5, { a: '1' });
    h.record(1.5, { a: '1' });
    expect(dp.value.count).toBe(1);
    expect(dp.value.buckets.counts).toEqual([1, 0, 0]);
  });

  it('ignores negative, NaN and infinite values, as histograms must', () => {
    const fast = new FastMetricProducer({ name: 'x' });
    const h = fast.add(new FastHistogram('h', 's', 'd', [1, 2]));
    for (const v of [-1, NaN, Infinity]) h.record(v, {});
    h.record(1.5, {});
    const dp = h.metricData([0, 0]).dataPoints;
    expect(dp.length).toBe(1);
    expect(dp[0]!.value).toMatchObject({ count: 1, sum: 1.5, buckets: { counts: [0, 1, 0] } });
  });

  it('recordTimes(v, n) is n records of v in one update (property)', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.double({ min: 0, max: 5, noNaN: true }), fc.integer({ min: 1, max: 70_000 })), { maxLength: 20 }), (samples) => {
        const once = new FastHistogram('h', 's', 'd', [0.5, 1, 2]);
        const each = new FastHistogram('h', 's', 'd', [0.5, 1, 2]);
        // One attributes object, as the hot path passes: a fresh {} per record is a WeakMap miss
        // and a key build each time (20x slower), which made up to 42 M records outlast the
        // timeout on a loaded CI machine. Distinct objects are the next test's subject.
        const attrs = {};
        for (const [v, n] of samples) {
          once.recordTimes(v, n, attrs);
          for (let i = 0; i < n; i++) each.record(v, attrs);
        }
        const [a] = once.metricData([0, 0]).dataPoints;
        const [b] = each.metricData([0, 0]).dataPoints;
        expect(a?.value.buckets.counts).toEqual(b?.value.buckets.counts);
        expect(a?.value.count).toBe(b?.value.count);
        expect([a?.value.min, a?.value.max]).toEqual([b?.value.min, b?.value.max]);
        if (a !== undefined) expect(Math.abs(a.value.sum! - b!.value.sum!)).toBeLessThanOrEqual(1e-9 * Math.max(1, b!.value.sum!));
      }),
      { numRuns: 30 },
    );
  });

  it('keeps one series per attribute content, whichever object carries it', () => {
    const fast = new FastMetricProducer({ name: 'x' });
    const h = fast.add(new FastHistogram('h', 's', 'd', [1]));
    const shared = { m: 'a' };
    h.record(0.5, shared);
    h.record(0.5, shared);
    h.record(2, { m: 'a' });
    h.record(2, { m: 'b' });
    const dps = h.metricData([0, 0]).dataPoints;
    expect(dps.map((d) => [d.attributes.m, d.value.count, d.value.buckets.counts])).toEqual([
      ['a', 3, [2, 1]],
      ['b', 1, [0, 1]],
    ]);
    // The series keeps its own copy: changing the caller's object later changes nothing.
    shared.m = 'z';
    expect(h.metricData([0, 0]).dataPoints[0]!.attributes).toEqual({ m: 'a' });
  });
});

describe('FastSum', () => {
  it('adds exactly like the SDK counter and up-down counter for the same calls (property)', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.tuple(fc.integer({ min: -3, max: 3 }), fc.constantFrom('a', 'b', 'c')), { maxLength: 200 }),
        async (calls) => {
          const fast = new FastMetricProducer({ name: 'fast' });
          const reader = new Reader(fast);
          const provider = new MeterProvider({ readers: [reader] });
          const meter = provider.getMeter('sdk');
          const sdkCounter = meter.createCounter('sdk_c', { unit: '{x}' });
          const sdkUpDown = meter.createUpDownCounter('sdk_u', { unit: '{x}' });
          const myCounter = fast.add(new FastSum('my_c', '{x}', 'd', true));
          const myUpDown = fast.add(new FastSum('my_u', '{x}', 'd', false));
          for (const [v, k] of calls) {
            sdkCounter.add(v, { k });
            sdkUpDown.add(v, { k });
            myCounter.add(v, { k });
            myUpDown.add(v, { k });
          }
          const { resourceMetrics } = await reader.collect();
          const sums = resourceMetrics.scopeMetrics.flatMap((s) => s.metrics).filter((m) => m.dataPointType === DataPointType.SUM) as SumMetricData[];
          const pick = (name: string) => {
            const m = sums.find((x) => x.descriptor.name === name);
            return { monotonic: m?.isMonotonic, points: Object.fromEntries((m?.dataPoints ?? []).map((dp) => [String(dp.attributes.k), dp.value])) };
          };
          const sdkC = pick('sdk_c');
          const sdkU = pick('sdk_u');
          // The SDK reports an instrument only once it has a data point.
          if (Object.keys(sdkC.points).length > 0) expect(pick('my_c')).toEqual(sdkC);
          else expect(pick('my_c').points).toEqual({});
          if (Object.keys(sdkU.points).length > 0) expect(pick('my_u')).toEqual(sdkU);
          else expect(pick('my_u').points).toEqual({});
          await provider.shutdown();
        },
      ),
      { numRuns: 60 },
    );
  });

  it('ignores NaN and infinities, and negative values on a counter', () => {
    const fast = new FastMetricProducer({ name: 'x' });
    const c = fast.add(new FastSum('c', '{x}', 'd', true));
    const u = fast.add(new FastSum('u', '{x}', 'd', false));
    for (const v of [NaN, Infinity, -Infinity, -1, 2]) {
      c.add(v);
      u.add(v);
    }
    expect(c.metricData([0, 0]).dataPoints.map((d) => d.value)).toEqual([2]);
    expect(u.metricData([0, 0]).dataPoints.map((d) => d.value)).toEqual([1]);
  });
});

describe('cardinality limit', () => {
  it('puts series past the SDK\'s limit into one overflow series, as the SDK does', async () => {
    const fast = new FastMetricProducer({ name: 'fast' });
    const reader = new Reader(fast);
    const provider = new MeterProvider({ readers: [reader] });
    const meter = provider.getMeter('sdk');
    const sdkCounter = meter.createCounter('sdk_c');
    const sdkHist = meter.createHistogram('sdk_h', { advice: { explicitBucketBoundaries: [1] } });
    const myCounter = fast.add(new FastSum('my_c', '', 'd', true));
    const myHist = fast.add(new FastHistogram('my_h', '', 'd', [1]));
    const n = MAX_SERIES + 500;
    for (let i = 0; i < n; i++) {
      for (let k = 0; k < 2; k++) {
        sdkCounter.add(1, { m: `model-${i}` });
        myCounter.add(1, { m: `model-${i}` });
        sdkHist.record(0.5, { m: `model-${i}` });
        myHist.record(0.5, { m: `model-${i}` });
      }
    }
    const { resourceMetrics } = await reader.collect();
    const all = resourceMetrics.scopeMetrics.flatMap((sm) => sm.metrics);
    const shape = (name: string) => {
      const m = all.find((x) => x.descriptor.name === name)!;
      const points = m.dataPoints as { attributes: Record<string, unknown>; value: unknown }[];
      const overflow = points.find((p) => p.attributes['otel.metric.overflow'] === true);
      const v = (x: unknown) => (typeof x === 'number' ? x : (x as { count: number }).count);
      return { points: points.length, overflow: overflow && v(overflow.value), total: points.reduce((a, p) => a + v(p.value), 0) };
    };
    expect(shape('sdk_c').points).toBe(MAX_SERIES); // what the SDK does, checked here
    expect(shape('my_c')).toEqual(shape('sdk_c'));
    expect(shape('my_h')).toEqual(shape('sdk_h'));
    expect(shape('my_c').total).toBe(2 * n);
    await provider.shutdown();
  });
});

describe('LabelSets', () => {
  it('hands out one frozen object per combination, leaving undefined values out', () => {
    const sets = new LabelSets();
    const a = sets.of('p', 'openai', 'm', undefined);
    expect(a).toEqual({ p: 'openai' });
    expect(Object.isFrozen(a)).toBe(true);
    expect(sets.of('p', 'openai', 'm', undefined)).toBe(a);
    expect(sets.of('p', 'openai')).toBe(a); // same content, same object
    const b = sets.of('p', 'openai', 'm', 'gpt');
    expect(b).toEqual({ p: 'openai', m: 'gpt' });
    expect(b).not.toBe(a);
    // A value that contains the separator cannot pose as another combination.
    expect(sets.of('p', 'x\u0000m\u0000y')).not.toEqual(sets.of('p', 'x', 'm', 'y'));
  });

  it('derives sets from a base once, replacing a name the base has', () => {
    const sets = new LabelSets();
    const base = sets.of('p', 'openai');
    const t = sets.with(base, 'type', 'input');
    expect(t).toEqual({ p: 'openai', type: 'input' });
    expect(sets.with(base, 'type', 'input')).toBe(t);
    expect(sets.with(base, 'type', 'output')).toEqual({ p: 'openai', type: 'output' });
    expect(sets.with(t, 'p', 'anthropic')).toEqual({ p: 'anthropic', type: 'input' });
    expect(base).toEqual({ p: 'openai' }); // the base is unchanged
  });

  it('stops caching past its bound and still returns correct sets', () => {
    const sets = new LabelSets(3);
    const objs = ['a', 'b', 'c', 'd', 'e'].map((m) => sets.of('m', m));
    expect(objs.map((o) => o.m)).toEqual(['a', 'b', 'c', 'd', 'e']);
    expect(sets.of('m', 'a')).toBe(objs[0]); // cached before the bound
    expect(sets.of('m', 'c')).toBe(objs[2]); // the third set is the last one cached
    expect(sets.of('m', 'd')).not.toBe(objs[3]);
    expect(sets.of('m', 'e')).toEqual({ m: 'e' });
    expect(sets.of('m', 'e')).not.toBe(objs[4]); // past the bound: a fresh object each time
    expect(sets.with(objs[0]!, 'x', '1')).toEqual({ m: 'a', x: '1' });
  });
});
