import type { ResourceMetrics } from '@opentelemetry/sdk-metrics';

/**
 * The name the OpenTelemetry Collector's Prometheus exporter gives an
 * instrument: dots become underscores (done by the serializer), the unit is
 * appended as a word (`s` -> `_seconds`), unit annotations in braces are
 * dropped, counters get `_total` (done by the serializer). Applying the same
 * rule here makes a direct scrape and an OTLP -> Collector -> Prometheus path
 * show identical names, so one dashboard serves both.
 */
const UNIT_WORDS: Readonly<Record<string, string>> = {
  s: 'seconds',
  ms: 'milliseconds',
  us: 'microseconds',
  ns: 'nanoseconds',
  By: 'bytes',
  KiBy: 'kibibytes',
  MiBy: 'mebibytes',
  min: 'minutes',
  h: 'hours',
  d: 'days',
  '%': 'percent',
};

export function unitSuffix(unit: string): string {
  if (unit === '' || unit.startsWith('{')) return '';
  if (unit === '1') return 'ratio';
  return UNIT_WORDS[unit] ?? unit.replace(/[^A-Za-z0-9]/g, '_');
}

export function prometheusBaseName(name: string, unit: string): string {
  const base = name.replace(/[^A-Za-z0-9_:]/g, '_');
  const suffix = unitSuffix(unit);
  if (suffix === '' || base.endsWith(`_${suffix}`)) return base;
  return `${base}_${suffix}`;
}

/** A copy of `rm` whose instrument names carry their unit suffix. */
export function withUnitSuffixes(rm: ResourceMetrics): ResourceMetrics {
  return {
    resource: rm.resource,
    scopeMetrics: rm.scopeMetrics.map((sm) => ({
      scope: sm.scope,
      metrics: sm.metrics.map((m) => ({
        ...m,
        descriptor: { ...m.descriptor, name: prometheusBaseName(m.descriptor.name, m.descriptor.unit), unit: '' },
      })),
    })),
  };
}
