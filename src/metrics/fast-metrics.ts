import { ValueType, type Attributes, type HrTime } from '@opentelemetry/api';
import { emptyResource } from '@opentelemetry/resources';
import {
  AggregationTemporality,
  DataPointType,
  type CollectionResult,
  type HistogramMetricData,
  type MetricData,
  type MetricProducer,
  type SumMetricData,
} from '@opentelemetry/sdk-metrics';

/**
 * Explicit-bucket histograms and sums for the request path. The SDK's
 * `record()`/`add()` sorts and serialises the attribute set on every call
 * (~1.7 µs and ~1 KiB of garbage here); these key their series by the
 * identity of the attribute object, which `LabelSets` hands out once per
 * label combination, so a record is a WeakMap hit and an update. A new
 * object with the same content still lands in the same series (keyed by
 * content on a miss). They are exported through the same readers as a
 * MetricProducer, as cumulative data with the name, unit, buckets and
 * attributes the SDK would produce (bench/README.md has the measurement).
 */
abstract class Keyed<S> {
  private readonly byObject = new WeakMap<Attributes, S>();
  protected readonly byKey = new Map<string, S>();

  protected series(attributes: Attributes): S {
    let s = this.byObject.get(attributes);
    if (s === undefined) {
      const key = attributeKey(attributes);
      s = this.byKey.get(key);
      if (s === undefined) {
        const others = this.byKey.size - (this.byKey.has(OVERFLOW_KEY) ? 1 : 0);
        if (others < MAX_SERIES - 1) {
          s = this.create(Object.freeze({ ...attributes }));
          this.byKey.set(key, s);
        } else {
          // As the SDK's cardinality limit: the rest share one overflow series.
          s = this.byKey.get(OVERFLOW_KEY);
          if (s === undefined) this.byKey.set(OVERFLOW_KEY, (s = this.create(Object.freeze({ ...OVERFLOW }))));
        }
      }
      this.byObject.set(attributes, s);
    }
    return s;
  }

  protected abstract create(attributes: Attributes): S;
  abstract metricData(now: HrTime): MetricData;
}

export class FastHistogram extends Keyed<HistogramSeries> {
  constructor(
    readonly name: string,
    readonly unit: string,
    readonly description: string,
    readonly boundaries: readonly number[],
  ) {
    super();
  }

  record(value: number, attributes: Attributes = EMPTY): void {
    this.recordTimes(value, 1, attributes);
  }

  /** `n` equal samples at once (a multi-token event's per-token gap): one update, not n. */
  recordTimes(value: number, n: number, attributes: Attributes = EMPTY): void {
    if (!(value >= 0) || value === Infinity) return; // histograms take non-negative finite values
    const s = this.series(attributes);
    // Bucket i holds (b[i-1], b[i]]; the last one (b[n-1], +Inf).
    const b = this.boundaries;
    let lo = 0;
    let hi = b.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (value <= b[mid]!) hi = mid;
      else lo = mid + 1;
    }
    s.counts[lo]! += n;
    s.count += n;
    s.sum += value * n;
    if (value < s.min) s.min = value;
    if (value > s.max) s.max = value;
  }

  protected create(attributes: Attributes): HistogramSeries {
    return new HistogramSeries(attributes, this.boundaries.length);
  }

  metricData(now: HrTime): HistogramMetricData {
    // One copy of the boundaries for all series; counts are copied (a snapshot), from a plain
    // array: Array.from of a Float64Array per series made a collection of 14,000 series ~30 ms.
    const boundaries = [...this.boundaries];
    return {
      descriptor: { name: this.name, unit: this.unit, description: this.description, valueType: ValueType.DOUBLE },
      aggregationTemporality: AggregationTemporality.CUMULATIVE,
      dataPointType: DataPointType.HISTOGRAM,
      dataPoints: [...this.byKey.values()].map((s) => ({
        attributes: s.attributes,
        startTime: s.startTime,
        endTime: now,
        value: {
          buckets: { boundaries, counts: s.counts.slice() },
          sum: s.sum,
          count: s.count,
          min: s.min,
          max: s.max,
        },
      })),
    };
  }
}

/** A Counter (`monotonic`) or an UpDownCounter. */
export class FastSum extends Keyed<SumSeries> {
  constructor(
    readonly name: string,
    readonly unit: string,
    readonly description: string,
    readonly monotonic: boolean,
  ) {
    super();
  }

  add(value: number, attributes: Attributes = EMPTY): void {
    // A counter ignores negative values, as the SDK's does; a non-finite value would poison the sum.
    if (!Number.isFinite(value) || (this.monotonic && value < 0)) return;
    this.series(attributes).value += value;
  }

  protected create(attributes: Attributes): SumSeries {
    return new SumSeries(attributes);
  }

  metricData(now: HrTime): SumMetricData {
    return {
      descriptor: { name: this.name, unit: this.unit, description: this.description, valueType: ValueType.DOUBLE },
      aggregationTemporality: AggregationTemporality.CUMULATIVE,
      dataPointType: DataPointType.SUM,
      isMonotonic: this.monotonic,
      dataPoints: [...this.byKey.values()].map((s) => ({ attributes: s.attributes, startTime: s.startTime, endTime: now, value: s.value })),
    };
  }
}

class HistogramSeries {
  readonly counts: number[];
  count = 0;
  sum = 0;
  min = Infinity;
  max = -Infinity;
  readonly startTime: HrTime = hrNow();
  constructor(readonly attributes: Attributes, boundaries: number) {
    this.counts = new Array<number>(boundaries + 1).fill(0);
  }
}

class SumSeries {
  value = 0;
  readonly startTime: HrTime = hrNow();
  constructor(readonly attributes: Attributes) {}
}

/** Feeds the fast instruments to metric readers (Prometheus pull, OTLP push). */
export class FastMetricProducer implements MetricProducer {
  private readonly metrics: Keyed<unknown>[] = [];

  constructor(private readonly scope: { name: string; version?: string }) {}

  add<M extends FastHistogram | FastSum>(m: M): M {
    this.metrics.push(m);
    return m;
  }

  async collect(): Promise<CollectionResult> {
    const now = hrNow();
    return {
      resourceMetrics: {
        resource: emptyResource(), // readers use the SDK's resource
        scopeMetrics: [{ scope: this.scope, metrics: this.metrics.map((m) => m.metricData(now)) }],
      },
      errors: [],
    };
  }
}

const EMPTY: Attributes = {};
/** The SDK's default cardinality limit per instrument, overflow series included. */
export const MAX_SERIES = 2000;
const OVERFLOW: Attributes = { 'otel.metric.overflow': true };
const OVERFLOW_KEY = attributeKey(OVERFLOW);

function attributeKey(a: Attributes): string {
  return JSON.stringify(Object.keys(a).sort().map((k) => [k, a[k]]));
}

/** The wall clock as an OpenTelemetry time, ms resolution. */
export function hrNow(): HrTime {
  const ms = Date.now();
  return [Math.floor(ms / 1000), (ms % 1000) * 1e6];
}
