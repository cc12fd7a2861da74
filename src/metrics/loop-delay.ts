import { ValueType, type HrTime } from '@opentelemetry/api';
import { emptyResource } from '@opentelemetry/resources';
import { AggregationTemporality, DataPointType, type CollectionResult, type GaugeMetricData, type MetricProducer } from '@opentelemetry/sdk-metrics';
import { monitorEventLoopDelay, type IntervalHistogram } from 'node:perf_hooks';
import { DEFAULT_LOOP_RESOLUTION_MS, METRIC } from './semconv.js';

const GAUGES = [
  [METRIC.eventLoopDelayP50, 'median', (h: IntervalHistogram) => h.percentile(50)],
  [METRIC.eventLoopDelayP99, '99th percentile', (h: IntervalHistogram) => h.percentile(99)],
  [METRIC.eventLoopDelayMax, 'maximum', (h: IntervalHistogram) => h.max],
] as const;

/**
 * The proxy's event-loop delay (p50, p99, max) since the previous collection by the same
 * reader: a saturated proxy shows here, so it is not blamed on the provider. One instance per
 * reader, given to that reader alone as a metric producer, each with its own window (Node's
 * sampling histogram, emptied when its reader collects): with Prometheus and OTLP both on, an
 * SDK observable gauge had one window that every collection emptied, so a stall between an OTLP
 * push and the next scrape never reached Prometheus. A window with no sample repeats the
 * previous values (none before the first sample).
 */
export class LoopDelayGauges implements MetricProducer {
  private readonly histogram: IntervalHistogram;
  private last: GaugeMetricData[] = [];

  constructor(
    private readonly scope: { name: string; version?: string },
    private readonly resolutionMs = DEFAULT_LOOP_RESOLUTION_MS,
  ) {
    this.histogram = monitorEventLoopDelay({ resolution: resolutionMs });
    this.histogram.enable();
  }

  async collect(): Promise<CollectionResult> {
    // Read in the check phase: a collection run by a timer (OTLP's interval) can come before the
    // sampler's own timer in the loop turn that ends a stall, and a reset() then would lose the
    // stall's sample (Node's histogram measures a tick from the one before, which reset() forgets).
    await new Promise<void>((resolve) => setImmediate(resolve));
    const h = this.histogram;
    if (h.count > 0) {
      const ms = Date.now();
      const now: HrTime = [Math.floor(ms / 1000), (ms % 1000) * 1e6];
      // Samples are the sampling timer's full period: subtract the period to get the delay.
      const delay = (ns: number) => Math.max(0, ns / 1e9 - this.resolutionMs / 1000);
      this.last = GAUGES.map(([name, what, read]) => ({
        descriptor: { name, unit: 's', description: `Event-loop delay of the proxy process, ${what} since the previous collection by the same reader.`, valueType: ValueType.DOUBLE },
        aggregationTemporality: AggregationTemporality.CUMULATIVE,
        dataPointType: DataPointType.GAUGE,
        dataPoints: [{ attributes: {}, startTime: now, endTime: now, value: delay(read(h)) }],
      }));
    }
    h.reset();
    return {
      resourceMetrics: { resource: emptyResource(), scopeMetrics: [{ scope: this.scope, metrics: this.last }] },
      errors: [],
    };
  }

  shutdown(): void {
    this.histogram.disable();
  }
}
