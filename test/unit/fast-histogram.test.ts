import fc from 'fast-check';
import { AggregationTemporality, DataPointType, MeterProvider, MetricReader, type HistogramMetricData } from '@opentelemetry/sdk-metrics';
import { describe, expect, it } from 'vitest';
import { FastHistogram, FastHistogramProducer } from '../../src/metrics/fast-histogram.js';
import { DEFAULT_BUCKETS } from '../../src/metrics/semconv.js';

class Reader extends MetricReader {
  constructor(fast: FastHistogramProducer) {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.CUMULATIVE, metricProducers: [fast] });
  }
  protected override async onForceFlush(): Promise<void> {}
  protected override async onShutdown(): Promise<void> {}
}

describe('FastHistogram', () => {
  it('aggregates exactly like the SDK histogram for the same values and attributes (property)', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.tuple(fc.double({ min: 0, max: 5, noNaN: true }), fc.constantFrom('a', 'b', 'c')), { maxLength: 200 }),
        async (samples) => {
          const fast = new FastHistogramProducer({ name: 'fast' });
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

  it('ignores negative, NaN and infinite values, as histograms must', () => {
    const fast = new FastHistogramProducer({ name: 'x' });
    const h = fast.add(new FastHistogram('h', 's', 'd', [1, 2]));
    for (const v of [-1, NaN, Infinity]) h.record(v, {});
    h.record(1.5, {});
    const dp = h.metricData([0, 0]).dataPoints;
    expect(dp.length).toBe(1);
    expect(dp[0]!.value).toMatchObject({ count: 1, sum: 1.5, buckets: { counts: [0, 1, 0] } });
  });
});
