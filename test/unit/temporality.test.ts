import fc from 'fast-check';
import { DeltaTemporalitySelector, LowMemoryTemporalitySelector } from '@opentelemetry/exporter-metrics-otlp-http';
import {
  AggregationTemporality,
  DataPointType,
  MeterProvider,
  MetricReader,
  type AggregationTemporalitySelector,
  type HistogramMetricData,
  type MetricData,
  type SumMetricData,
} from '@opentelemetry/sdk-metrics';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { FastHistogram, FastMetricProducer, FastSum } from '../../src/metrics/fast-metrics.js';
import { TemporalityView } from '../../src/metrics/temporality.js';

class Reader extends MetricReader {
  constructor(select: AggregationTemporalitySelector, view: TemporalityView) {
    super({ aggregationTemporalitySelector: select, metricProducers: [view] });
  }
  protected override async onForceFlush(): Promise<void> {}
  protected override async onShutdown(): Promise<void> {}
}

const BOUNDS = [0.001, 0.01, 0.1, 1];
const MODELS = ['a', 'b', 'c'] as const;
type Op = { kind: 'hist' | 'counter' | 'updown'; value: number; model: (typeof MODELS)[number] };

/** The SDK's instruments and the fast ones, fed the same calls, read through one reader. */
function setUp(select: AggregationTemporalitySelector) {
  const fast = new FastMetricProducer({ name: 'fast' });
  const reader = new Reader(select, new TemporalityView(fast, select));
  const meter = new MeterProvider({ readers: [reader] }).getMeter('sdk');
  const sdk = {
    hist: meter.createHistogram('sdk.hist', { unit: 's', advice: { explicitBucketBoundaries: BOUNDS } }),
    counter: meter.createCounter('sdk.counter'),
    updown: meter.createUpDownCounter('sdk.updown'),
  };
  const mine = {
    hist: fast.add(new FastHistogram('mine.hist', 's', 'd', BOUNDS)),
    counter: fast.add(new FastSum('mine.counter', '1', 'd', true)),
    updown: fast.add(new FastSum('mine.updown', '1', 'd', false)),
  };
  const apply = (op: Op) => {
    const attrs = { model: op.model };
    if (op.kind === 'hist') {
      sdk.hist.record(op.value, attrs);
      mine.hist.record(op.value, attrs);
    } else {
      const v = op.kind === 'counter' ? op.value : op.value - 2;
      sdk[op.kind].add(v, attrs);
      mine[op.kind].add(v, attrs);
    }
  };
  const collect = async () => {
    const { resourceMetrics } = await reader.collect();
    const all = resourceMetrics.scopeMetrics.flatMap((s) => s.metrics);
    // The SDK leaves out an instrument with nothing to report; the view reports it without points.
    const find = (name: string) => all.find((m) => m.descriptor.name === name);
    return (kind: Op['kind']) => ({ sdk: find(`sdk.${kind}`), mine: find(`mine.${kind}`) });
  };
  return { apply, collect };
}

function points(m: MetricData | undefined) {
  if (m === undefined) return {};
  if (m.dataPointType === DataPointType.HISTOGRAM) {
    return Object.fromEntries(
      (m as HistogramMetricData).dataPoints.map((p) => [String(p.attributes.model), { counts: p.value.buckets.counts, count: p.value.count, sum: p.value.sum }]),
    );
  }
  return Object.fromEntries((m as SumMetricData).dataPoints.map((p) => [String(p.attributes.model), p.value]));
}

const ops = fc.array(
  fc.record({ kind: fc.constantFrom('hist', 'counter', 'updown'), value: fc.integer({ min: 0, max: 4000 }).map((n) => n / 1000), model: fc.constantFrom(...MODELS) }),
  { maxLength: 40 },
) as fc.Arbitrary<Op[]>;

describe('TemporalityView', () => {
  for (const [name, select] of [
    ['delta', DeltaTemporalitySelector],
    ['lowmemory', LowMemoryTemporalitySelector],
  ] as const) {
    it(`gives the fast instruments the SDK's own ${name} temporality and data, collection after collection (property)`, async () => {
      await fc.assert(
        fc.asyncProperty(fc.array(ops, { minLength: 1, maxLength: 5 }), async (batches) => {
          const { apply, collect } = setUp(select);
          for (const batch of batches) {
            for (const op of batch) apply(op);
            const read = await collect();
            for (const kind of ['hist', 'counter', 'updown'] as const) {
              const { sdk, mine } = read(kind);
              const expected = kind === 'updown' ? AggregationTemporality.CUMULATIVE : AggregationTemporality.DELTA;
              // The view, like the SDK, never exports a metric without points.
              if (mine !== undefined) {
                expect(mine.dataPoints.length).toBeGreaterThan(0);
                expect(mine.aggregationTemporality).toBe(expected);
              }
              if (sdk !== undefined) expect(sdk.aggregationTemporality).toBe(expected);
              // A delta sum of 0 says as much as no point: the SDK reports a series added 0 in
              // the interval, the view (which sees only the cumulative value) leaves it out.
              const drop = (p: Record<string, unknown>) =>
                kind === 'counter' ? Object.fromEntries(Object.entries(p).filter(([, v]) => v !== 0)) : p;
              const a = drop(points(sdk));
              const b = drop(points(mine));
              expect(Object.keys(b).sort()).toEqual(Object.keys(a).sort());
              for (const k of Object.keys(a)) {
                if (typeof a[k] === 'number') expect(b[k]).toBeCloseTo(a[k] as number, 9);
                else {
                  const x = a[k] as { counts: number[]; count: number; sum: number };
                  const y = b[k] as typeof x;
                  expect(y.counts).toEqual(x.counts);
                  expect(y.count).toBe(x.count);
                  expect(y.sum).toBeCloseTo(x.sum, 9);
                }
              }
            }
          }
        }),
        { numRuns: 150 },
      );
    });
  }

  it('chains delta intervals: each starts where the series\' last one ended; min and max only in the first', async () => {
    const { apply, collect } = setUp(DeltaTemporalitySelector);
    apply({ kind: 'hist', value: 0.5, model: 'a' });
    apply({ kind: 'hist', value: 0.002, model: 'a' });
    await sleep(3); // the clock (ms) moves, so a series' own start cannot pass for the last interval's end
    const first = (await collect())('hist').mine as HistogramMetricData;
    expect(first.dataPoints).toHaveLength(1);
    expect(first.aggregationTemporality).toBe(AggregationTemporality.DELTA);
    const p1 = first.dataPoints[0]!;
    expect(p1.value).toMatchObject({ count: 2, min: 0.002, max: 0.5 });
    expect((await collect())('hist').mine).toBeUndefined(); // nothing new: no point, no empty metric
    apply({ kind: 'hist', value: 0.05, model: 'a' });
    const p3 = ((await collect())('hist').mine as HistogramMetricData).dataPoints[0]!;
    expect(p3.startTime).toEqual(p1.endTime);
    expect(p3.value).toMatchObject({ count: 1, min: undefined, max: undefined });
    expect(p3.value.sum).toBeCloseTo(0.05, 12);
    expect(p3.value.buckets.counts).toEqual([0, 0, 1, 0, 0]);
  });

  it('chains a counter\'s delta intervals too; a series first added 0 is reported once, as the SDK reports it, then not until it moves', async () => {
    const { apply, collect } = setUp(DeltaTemporalitySelector);
    apply({ kind: 'counter', value: 0, model: 'a' });
    apply({ kind: 'counter', value: 2, model: 'b' });
    await sleep(3); // as above
    const r1 = (await collect())('counter');
    expect(points(r1.sdk)).toEqual({ a: 0, b: 2 });
    expect(points(r1.mine)).toEqual({ a: 0, b: 2 });
    apply({ kind: 'counter', value: 1, model: 'b' });
    const r2 = (await collect())('counter');
    expect(points(r2.sdk)).toEqual({ b: 1 });
    expect(points(r2.mine)).toEqual({ b: 1 });
    const b1 = (r1.mine as SumMetricData).dataPoints.find((p) => p.attributes.model === 'b')!;
    const b2 = (r2.mine as SumMetricData).dataPoints[0]!;
    expect(b2.startTime).toEqual(b1.endTime);
    expect(r2.mine!.aggregationTemporality).toBe(AggregationTemporality.DELTA);
  });

  it('leaves the data cumulative when the exporter asks for it', async () => {
    const { apply, collect } = setUp(() => AggregationTemporality.CUMULATIVE);
    apply({ kind: 'counter', value: 3, model: 'b' });
    await collect();
    apply({ kind: 'counter', value: 4, model: 'b' });
    const m = (await collect())('counter').mine as SumMetricData;
    expect(m.aggregationTemporality).toBe(AggregationTemporality.CUMULATIVE);
    expect(m.dataPoints.map((p) => p.value)).toEqual([7]);
  });
});
