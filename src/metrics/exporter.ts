import type { OTLPMetricExporter as OtlpExporterClass } from '@opentelemetry/exporter-metrics-otlp-http';
import { PrometheusExporter } from '@opentelemetry/exporter-prometheus';
import { detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources';
import {
  AggregationType,
  InstrumentType,
  MeterProvider,
  PeriodicExportingMetricReader,
  type AggregationOption,
  type MetricReader,
} from '@opentelemetry/sdk-metrics';
import { createRequire } from 'node:module';
import { hostname } from 'node:os';
import { VERSION } from '../version.js';
import { FastMetricProducer } from './fast-metrics.js';
import { LoopDelayGauges, LoopDelaySampler } from './loop-delay.js';
import { withUnitSuffixes } from './prometheus-names.js';
import { PrometheusText } from './prometheus-text.js';
import { TemporalityView } from './temporality.js';
import { egressAgentFactory, type EgressSettings } from '../proxy/egress.js';

export const SCOPE_NAME = 'llm-latency-proxy';
/** How long the shutdown waits for the final OTLP push (see `shutdown`). */
export const SHUTDOWN_PUSH_MS = 5000;

export interface Telemetry {
  readonly provider: MeterProvider;
  /** The request path's instruments, registered with every reader (see fast-metrics.ts). */
  readonly fast: FastMetricProducer;
  /**
   * Collects and renders the Prometheus text exposition, in pieces to send as they come
   * (undefined when the Prometheus exporter is off). A failed collection throws before the
   * first piece.
   */
  scrape: (() => AsyncGenerator<string>) | undefined;
  /** Pushes what is pending (OTLP) and stops. */
  shutdown(): Promise<void>;
}

export interface TelemetryOptions {
  serviceInstanceId?: string;
  prometheus?: boolean;
  otlp?: { endpoint: string | undefined; intervalMs: number; exponentialHistograms: boolean };
  /** The egress proxies the OTLP exporter's requests go through (NO_PROXY applied per host). */
  egress?: EgressSettings;
  /** Event-loop-delay sampling period, ms (config `metrics.loopDelayResolutionMs`). */
  loopDelayResolutionMs?: number;
  /** Extra readers (an in-memory reader in tests). */
  readers?: MetricReader[];
}

/**
 * The OTLP exporter and its protobuf/HTTP transport are loaded only when OTLP
 * is on: eagerly they added ~30 ms and ~3 MiB of RSS to every start-up (the SDK
 * parts it shares are loaded anyway). The package is CommonJS, so a synchronous
 * require keeps createTelemetry synchronous.
 */
function loadOtlpExporter(): { OTLPMetricExporter: typeof OtlpExporterClass } {
  return createRequire(import.meta.url)('@opentelemetry/exporter-metrics-otlp-http') as { OTLPMetricExporter: typeof OtlpExporterClass };
}

/**
 * The MeterProvider with a pull-mode Prometheus reader and/or an OTLP/HTTP push
 * reader. The Prometheus exporter does not start its own server: the metrics
 * port is ours (it also serves health checks). The OTLP exporter reads the
 * standard OTEL_EXPORTER_OTLP_* variables (endpoint, headers, timeout).
 */
export function createTelemetry(opts: TelemetryOptions = {}): Telemetry {
  const readers: MetricReader[] = [...(opts.readers ?? [])];
  const scope = { name: SCOPE_NAME, version: VERSION };
  const fast = new FastMetricProducer(scope);
  // One event-loop-delay sampler, one window per reader (loop-delay.ts).
  const sampler = new LoopDelaySampler(opts.loopDelayResolutionMs);
  const loopDelay = () => new LoopDelayGauges(scope, sampler);
  let prometheus: PrometheusExporter | undefined;
  if (opts.prometheus ?? true) {
    prometheus = new PrometheusExporter({ preventServerStart: true, metricProducers: [fast, loopDelay()] });
    readers.push(prometheus);
  }
  if (opts.otlp) {
    const exponential = opts.otlp.exponentialHistograms;
    const { OTLPMetricExporter } = loadOtlpExporter();
    const egress = opts.egress;
    const exporter = new OTLPMetricExporter({
      ...(opts.otlp.endpoint ? { url: opts.otlp.endpoint } : {}),
      ...(egress !== undefined && (egress.http !== undefined || egress.https !== undefined) ? { httpAgentOptions: egressAgentFactory(egress) } : {}),
      ...(exponential
        ? {
            aggregationPreference: (t: InstrumentType): AggregationOption =>
              t === InstrumentType.HISTOGRAM
                ? { type: AggregationType.EXPONENTIAL_HISTOGRAM, options: { maxSize: 160, recordMinMax: true } }
                : { type: AggregationType.DEFAULT },
          }
        : {}),
    });
    // The fast instruments follow the exporter's temporality (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE) as the SDK's do.
    const view = new TemporalityView(fast, (t) => exporter.selectAggregationTemporality(t));
    readers.push(new PeriodicExportingMetricReader({ exporter, metricProducers: [view, loopDelay()], exportIntervalMillis: opts.otlp.intervalMs, exportTimeoutMillis: Math.min(30_000, opts.otlp.intervalMs) }));
  }
  const text = new PrometheusText();
  // OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (the SDK's env detector, which discards a
  // malformed OTEL_RESOURCE_ATTRIBUTES whole, as the specification says) override these.
  const resource = resourceFromAttributes({
    'service.name': 'llm-latency-proxy',
    'service.version': VERSION,
    'service.instance.id':
      opts.serviceInstanceId ?? (process.env.POD_NAME || `${process.env.HOSTNAME || hostname()}:${process.pid}`),
  }).merge(detectResources({ detectors: [envDetector] }));
  const provider = new MeterProvider({ resource, readers });
  const prom = prometheus;
  return {
    provider,
    fast,
    scrape: prom
      ? async function* () {
          const { resourceMetrics, errors } = await prom.collect();
          if (errors.length > 0) throw new AggregateError(errors, 'metric collection failed');
          yield* text.pieces(withUnitSuffixes(resourceMetrics));
        }
      : undefined,
    async shutdown() {
      sampler.stop();
      // The final OTLP push waits at most SHUTDOWN_PUSH_MS: a collector that does not answer held
      // the exit ~12 s (its export timeout and retry), past a container's grace period after a
      // 30 s drain (Compose's 40 s). A push still in flight then is lost with the process.
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([provider.shutdown(), new Promise<void>((resolve) => (timer = setTimeout(resolve, SHUTDOWN_PUSH_MS)))]);
      clearTimeout(timer);
    },
  };
}
