import { ValueType } from '@opentelemetry/api';
import { emptyResource } from '@opentelemetry/resources';
import { AggregationTemporality, DataPointType, type CollectionResult, type GaugeMetricData, type MetricProducer } from '@opentelemetry/sdk-metrics';
import { createHistogram, performance, type RecordableHistogram } from 'node:perf_hooks';
import { hrNow } from './fast-metrics.js';
import { DEFAULT_LOOP_RESOLUTION_MS, METRIC } from './semconv.js';

const GAUGES = [
  [METRIC.eventLoopDelayP50, 'median', (h: RecordableHistogram) => h.percentile(50)],
  [METRIC.eventLoopDelayP99, '99th percentile', (h: RecordableHistogram) => h.percentile(99)],
  [METRIC.eventLoopDelayMax, 'maximum', (h: RecordableHistogram) => h.max],
] as const;

/**
 * Samples the event loop's delay: a timer every `resolutionMs`, each tick recording how late it
 * ran (ns) into every reader's window. Node's own monitorEventLoopDelay measures a tick from the
 * one before, and its reset() forgets that one: a stall that began within a period after a
 * collection was lost to that reader. Here the previous tick is the sampler's, never reset.
 */
export class LoopDelaySampler {
  private last = performance.now();
  private readonly timer: NodeJS.Timeout;
  private readonly windows = new Set<RecordableHistogram>();

  constructor(readonly resolutionMs = DEFAULT_LOOP_RESOLUTION_MS) {
    this.timer = setInterval(() => {
      const now = performance.now();
      // Histograms take integers ≥ 1: a tick on time is 1 ns late.
      const lateNs = Math.max(1, Math.round((now - this.last - this.resolutionMs) * 1e6));
      this.last = now;
      for (const w of this.windows) w.record(lateNs);
    }, resolutionMs);
    this.timer.unref();
  }

  /** A window of its own, for one reader. */
  window(): RecordableHistogram {
    const h = createHistogram();
    this.windows.add(h);
    return h;
  }

  stop(): void {
    clearInterval(this.timer);
    this.windows.clear();
  }
}

/**
 * The proxy's event-loop delay (p50, p99, max) since the previous collection by the same
 * reader: a saturated proxy shows here, so it is not blamed on the provider. One instance per
 * reader, given to that reader alone as a metric producer, each with its own window: with
 * Prometheus and OTLP both on, SDK observable gauges over one histogram had one window that every
 * collection emptied, so a stall between an OTLP push and the next scrape never reached
 * Prometheus. A window with no sample repeats the previous values (none before the first sample).
 */
export class LoopDelayGauges implements MetricProducer {
  private readonly histogram: RecordableHistogram;
  private last: GaugeMetricData[] = [];

  constructor(
    private readonly scope: { name: string; version?: string },
    sampler: LoopDelaySampler,
  ) {
    this.histogram = sampler.window();
  }

  async collect(): Promise<CollectionResult> {
    // Read in the check phase: a collection run by a timer (OTLP's interval) can come before the
    // sampler's tick in the loop turn that ends a stall; that tick records the stall.
    await new Promise<void>((resolve) => setImmediate(resolve));
    const h = this.histogram;
    if (h.count > 0) {
      const now = hrNow();
      const seconds = (ns: number) => (ns <= 1 ? 0 : ns / 1e9);
      this.last = GAUGES.map(([name, what, read]) => ({
        descriptor: { name, unit: 's', description: `Event-loop delay of the proxy process, ${what} since the previous collection by the same reader.`, valueType: ValueType.DOUBLE },
        aggregationTemporality: AggregationTemporality.CUMULATIVE,
        dataPointType: DataPointType.GAUGE,
        dataPoints: [{ attributes: {}, startTime: now, endTime: now, value: seconds(read(h)) }],
      }));
    }
    h.reset();
    return {
      resourceMetrics: { resource: emptyResource(), scopeMetrics: [{ scope: this.scope, metrics: this.last }] },
      errors: [],
    };
  }
}
