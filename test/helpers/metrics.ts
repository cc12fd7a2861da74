import {
  AggregationTemporality,
  DataPointType,
  MeterProvider,
  MetricReader,
  type HistogramMetricData,
} from '@opentelemetry/sdk-metrics';
import { FastMetricProducer } from '../../src/metrics/fast-metrics.js';
import { Instruments, type InstrumentOptions } from '../../src/metrics/instruments.js';

class TestReader extends MetricReader {
  constructor(fast: FastMetricProducer) {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.CUMULATIVE, metricProducers: [fast] });
  }
  protected override async onForceFlush(): Promise<void> {}
  protected override async onShutdown(): Promise<void> {}
}

/** Instruments wired to an in-memory reader, and helpers to read what was recorded. */
export function testInstruments(opts: InstrumentOptions = {}) {
  const fast = new FastMetricProducer({ name: 'test' });
  const reader = new TestReader(fast);
  const provider = new MeterProvider({ readers: [reader] });
  const instruments = new Instruments(provider.getMeter('test'), undefined, { fast, ...opts });
  async function histogram(name: string, filter: Record<string, string> = {}) {
    const { resourceMetrics } = await reader.collect();
    let count = 0;
    let sum = 0;
    const attributes: Record<string, unknown>[] = [];
    for (const sm of resourceMetrics.scopeMetrics) {
      for (const m of sm.metrics) {
        if (m.descriptor.name !== name || m.dataPointType !== DataPointType.HISTOGRAM) continue;
        for (const dp of (m as HistogramMetricData).dataPoints) {
          if (!Object.entries(filter).every(([k, v]) => dp.attributes[k] === v)) continue;
          count += dp.value.count;
          sum += dp.value.sum ?? 0;
          attributes.push(dp.attributes);
        }
      }
    }
    return { count, sum, attributes };
  }
  async function sumValue(name: string, filter: Record<string, string> = {}) {
    const { resourceMetrics } = await reader.collect();
    let total = 0;
    for (const sm of resourceMetrics.scopeMetrics)
      for (const m of sm.metrics)
        if (m.descriptor.name === name && m.dataPointType === DataPointType.SUM)
          for (const dp of m.dataPoints) if (Object.entries(filter).every(([k, v]) => dp.attributes[k] === v)) total += dp.value as number;
    return total;
  }
  /** The last value of a gauge (undefined when it reported nothing). */
  async function gaugeValue(name: string) {
    const { resourceMetrics } = await reader.collect();
    for (const sm of resourceMetrics.scopeMetrics)
      for (const m of sm.metrics)
        if (m.descriptor.name === name && m.dataPointType === DataPointType.GAUGE) return m.dataPoints[0]?.value as number | undefined;
    return undefined;
  }
  async function names() {
    const { resourceMetrics } = await reader.collect();
    return resourceMetrics.scopeMetrics.flatMap((sm) => sm.metrics.map((m) => m.descriptor.name));
  }
  return { instruments, histogram, sumValue, gaugeValue, names, collect: () => reader.collect(), shutdown: () => { instruments.shutdown(); return provider.shutdown(); } };
}
