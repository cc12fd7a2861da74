import { PrometheusExporter, PrometheusSerializer } from '@opentelemetry/exporter-prometheus';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { MeterProvider, type MetricReader } from '@opentelemetry/sdk-metrics';
import { hostname } from 'node:os';
import { VERSION } from '../version.js';
import { withUnitSuffixes } from './prometheus-names.js';

export const SCOPE_NAME = 'llm-latency-proxy';

export interface Telemetry {
  readonly provider: MeterProvider;
  /** Renders the Prometheus text exposition. */
  scrape(): Promise<string>;
  shutdown(): Promise<void>;
}

export interface TelemetryOptions {
  serviceInstanceId?: string;
  /** Extra readers (e.g. OTLP push, an in-memory reader in tests). */
  readers?: MetricReader[];
}

/**
 * The MeterProvider with a pull-mode Prometheus reader. The exporter does not
 * start its own server: the metrics port is ours (it also serves health checks).
 */
export function createTelemetry(opts: TelemetryOptions = {}): Telemetry {
  const prometheus = new PrometheusExporter({ preventServerStart: true });
  const serializer = new PrometheusSerializer(undefined, false, undefined, false, false);
  const resource = resourceFromAttributes({
    'service.name': process.env.OTEL_SERVICE_NAME ?? 'llm-latency-proxy',
    'service.version': VERSION,
    'service.instance.id':
      opts.serviceInstanceId ?? process.env.POD_NAME ?? `${process.env.HOSTNAME ?? hostname()}:${process.pid}`,
  });
  const provider = new MeterProvider({ resource, readers: [prometheus, ...(opts.readers ?? [])] });
  return {
    provider,
    async scrape() {
      const { resourceMetrics, errors } = await prometheus.collect();
      if (errors.length > 0) throw new AggregateError(errors, 'metric collection failed');
      return serializer.serialize(withUnitSuffixes(resourceMetrics));
    },
    async shutdown() {
      await provider.shutdown();
    },
  };
}
