import { ValueType, type Attributes, type HrTime } from '@opentelemetry/api';
import { emptyResource } from '@opentelemetry/resources';
import {
  AggregationTemporality,
  DataPointType,
  type CollectionResult,
  type HistogramMetricData,
  type MetricProducer,
} from '@opentelemetry/sdk-metrics';

/**
 * An explicit-bucket histogram for the one instrument recorded per streamed
 * event (the inter-chunk gap). The SDK's `Histogram.record()` sorts and
 * serialises the attribute set on every call (~1.7 µs here); this one keys
 * series by the identity of the attribute object, which the request meter
 * builds once per request, so a record is a WeakMap hit and a binary search.
 * It is exported through the same readers as a MetricProducer, as a cumulative
 * histogram with the same name, unit, buckets and attributes the SDK would
 * produce (bench/README.md has the measurement).
 */
export class FastHistogram {
  private readonly byObject = new WeakMap<Attributes, Series>();
  private readonly byKey = new Map<string, Series>();

  constructor(
    readonly name: string,
    readonly unit: string,
    readonly description: string,
    readonly boundaries: readonly number[],
  ) {}

  record(value: number, attributes: Attributes = EMPTY): void {
    if (!(value >= 0) || value === Infinity) return; // histograms take non-negative finite values
    let s = this.byObject.get(attributes);
    if (s === undefined) {
      const key = attributeKey(attributes);
      s = this.byKey.get(key);
      if (s === undefined) {
        s = new Series({ ...attributes }, this.boundaries.length);
        this.byKey.set(key, s);
      }
      this.byObject.set(attributes, s);
    }
    // Bucket i holds (b[i-1], b[i]]; the last one (b[n-1], +Inf).
    const b = this.boundaries;
    let lo = 0;
    let hi = b.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (value <= b[mid]!) hi = mid;
      else lo = mid + 1;
    }
    s.counts[lo]!++;
    s.count++;
    s.sum += value;
    if (value < s.min) s.min = value;
    if (value > s.max) s.max = value;
  }

  metricData(now: HrTime): HistogramMetricData {
    return {
      descriptor: { name: this.name, unit: this.unit, description: this.description, valueType: ValueType.DOUBLE },
      aggregationTemporality: AggregationTemporality.CUMULATIVE,
      dataPointType: DataPointType.HISTOGRAM,
      dataPoints: [...this.byKey.values()].map((s) => ({
        attributes: s.attributes,
        startTime: s.startTime,
        endTime: now,
        value: {
          buckets: { boundaries: [...this.boundaries], counts: Array.from(s.counts) },
          sum: s.sum,
          count: s.count,
          min: s.min,
          max: s.max,
        },
      })),
    };
  }
}

class Series {
  readonly counts: Float64Array;
  count = 0;
  sum = 0;
  min = Infinity;
  max = -Infinity;
  readonly startTime: HrTime = hrNow();
  constructor(readonly attributes: Attributes, boundaries: number) {
    this.counts = new Float64Array(boundaries + 1);
  }
}

/** Feeds FastHistograms to metric readers (Prometheus pull, OTLP push). */
export class FastHistogramProducer implements MetricProducer {
  private readonly histograms: FastHistogram[] = [];

  constructor(private readonly scope: { name: string; version?: string }) {}

  add(h: FastHistogram): FastHistogram {
    this.histograms.push(h);
    return h;
  }

  async collect(): Promise<CollectionResult> {
    const now = hrNow();
    return {
      resourceMetrics: {
        resource: emptyResource(), // readers use the SDK's resource
        scopeMetrics: [{ scope: this.scope, metrics: this.histograms.map((h) => h.metricData(now)) }],
      },
      errors: [],
    };
  }
}

const EMPTY: Attributes = {};

function attributeKey(a: Attributes): string {
  return JSON.stringify(Object.keys(a).sort().map((k) => [k, a[k]]));
}

function hrNow(): HrTime {
  const ms = Date.now();
  return [Math.floor(ms / 1000), (ms % 1000) * 1e6];
}
