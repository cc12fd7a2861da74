import type { Attributes, HrTime } from '@opentelemetry/api';
import {
  AggregationTemporality,
  DataPointType,
  InstrumentType,
  type AggregationTemporalitySelector,
  type CollectionResult,
  type HistogramMetricData,
  type MetricData,
  type MetricProducer,
  type SumMetricData,
} from '@opentelemetry/sdk-metrics';

interface Last {
  readonly time: HrTime;
  readonly count: number;
  readonly sum: number;
  readonly counts: readonly number[];
}

/**
 * The fast instruments (fast-metrics.ts) keep cumulative series, and a MetricProducer's data
 * reaches the exporter as it is: the reader does not convert it. This view gives one reader the
 * temporality its exporter asks for per instrument type, as the SDK does for its own
 * instruments: with `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta` (or `lowmemory`)
 * the histograms and counters become delta, the up-down counters stay cumulative.
 *
 * A delta point is the difference from what this view reported last, over [last collection,
 * now]; a series with nothing new since is left out, as the SDK leaves out an unrecorded one,
 * and so is a metric (or scope) left without points, in either temporality.
 * A delta histogram carries min and max only in its series' first interval: the cumulative
 * series keeps no per-interval extremes (keeping them would cost the hot path a reset).
 * One view per reader: it remembers what it reported.
 */
export class TemporalityView implements MetricProducer {
  /** Per metric name, per series (the series' attribute object is stable): what was reported. */
  private readonly last = new Map<string, Map<Attributes, Last>>();

  constructor(
    private readonly source: MetricProducer,
    private readonly select: AggregationTemporalitySelector,
  ) {}

  async collect(): Promise<CollectionResult> {
    const result = await this.source.collect();
    const rm = result.resourceMetrics;
    for (const sm of rm.scopeMetrics) {
      sm.metrics = sm.metrics
        .map((m) => (this.select(instrumentType(m)) === AggregationTemporality.DELTA ? this.delta(m) : m))
        // A metric without points is left out, as the SDK leaves out its own: some collectors
        // and backends refuse an export holding one (opentelemetry-js#4130).
        .filter((m) => m.dataPoints.length > 0);
    }
    rm.scopeMetrics = rm.scopeMetrics.filter((sm) => sm.metrics.length > 0);
    return result;
  }

  private delta(m: MetricData): MetricData {
    if (m.aggregationTemporality === AggregationTemporality.DELTA) return m;
    let seen = this.last.get(m.descriptor.name);
    if (seen === undefined) this.last.set(m.descriptor.name, (seen = new Map()));
    if (m.dataPointType === DataPointType.HISTOGRAM) return histogramDelta(m, seen);
    if (m.dataPointType === DataPointType.SUM) return sumDelta(m, seen);
    return m; // gauges have no temporality to convert
  }
}

function instrumentType(m: MetricData): InstrumentType {
  if (m.dataPointType === DataPointType.SUM) return m.isMonotonic ? InstrumentType.COUNTER : InstrumentType.UP_DOWN_COUNTER;
  if (m.dataPointType === DataPointType.GAUGE) return InstrumentType.GAUGE;
  return InstrumentType.HISTOGRAM;
}

function histogramDelta(m: HistogramMetricData, seen: Map<Attributes, Last>): HistogramMetricData {
  const dataPoints: HistogramMetricData['dataPoints'] = [];
  for (const p of m.dataPoints) {
    const v = p.value;
    const prev = seen.get(p.attributes);
    const count = v.count - (prev?.count ?? 0);
    if (count === 0) continue;
    const counts = v.buckets.counts.map((c, i) => c - (prev?.counts[i] ?? 0));
    seen.set(p.attributes, { time: p.endTime, count: v.count, sum: v.sum ?? 0, counts: v.buckets.counts });
    dataPoints.push({
      ...p,
      startTime: prev?.time ?? p.startTime,
      value: {
        buckets: { boundaries: v.buckets.boundaries, counts },
        count,
        sum: v.sum === undefined ? undefined : v.sum - (prev?.sum ?? 0),
        // Extremes of the whole series are those of this interval only when it is the first.
        min: prev === undefined ? v.min : undefined,
        max: prev === undefined ? v.max : undefined,
      },
    });
  }
  return { ...m, aggregationTemporality: AggregationTemporality.DELTA, dataPoints };
}

function sumDelta(m: SumMetricData, seen: Map<Attributes, Last>): SumMetricData {
  const dataPoints: SumMetricData['dataPoints'] = [];
  for (const p of m.dataPoints) {
    const prev = seen.get(p.attributes);
    const value = p.value - (prev?.sum ?? 0);
    if (prev !== undefined && value === 0) continue;
    seen.set(p.attributes, { time: p.endTime, count: 0, sum: p.value, counts: [] });
    dataPoints.push({ ...p, startTime: prev?.time ?? p.startTime, value });
  }
  return { ...m, aggregationTemporality: AggregationTemporality.DELTA, dataPoints };
}
