import type { Attributes, AttributeValue } from '@opentelemetry/api';
import { DataPointType, type MetricData, type ResourceMetrics } from '@opentelemetry/sdk-metrics';
import { setImmediate as nextTurn } from 'node:timers/promises';

/**
 * The Prometheus text exposition, byte for byte what the OpenTelemetry
 * exporter's `PrometheusSerializer` writes as the proxy configures it (no
 * prefix, no timestamps, `target_info`, scope labels on every line), written
 * for the scrape not to stall the streams:
 * - the label block of a series is built once per attribute object and kept
 *   (the fast instruments hand out the same object every collection), so a
 *   scrape formats numbers, not labels: the exporter's serializer sanitised
 *   and escaped every label of every bucket line again, ~15 µs per line;
 * - it hands out the text in pieces of `SLICE_LINES` lines with a turn of the
 *   event loop between them, and the metrics port sends each piece as it comes:
 *   a scrape of many series no longer blocks every stream for its whole length
 *   (2,000 series per instrument took 4.6 s in one piece), nor builds and
 *   encodes one string of tens of MB.
 * test/unit/prometheus-text.test.ts checks the output against the exporter's
 * serializer on random data.
 */
export class PrometheusText {
  /** The label block (`k="v",...`, no braces) of each attribute object, without scope labels. */
  private readonly labelCache = new WeakMap<Attributes, string>();

  constructor(private readonly sliceLines = SLICE_LINES) {}

  /** The whole exposition as one string. */
  async serialize(rm: ResourceMetrics): Promise<string> {
    let text = '';
    for await (const piece of this.pieces(rm)) text += piece;
    return text;
  }

  /**
   * The exposition in pieces of about `sliceLines` lines, with a turn of the event loop
   * before each next piece, so that a caller can send each piece as it comes. Every line is
   * written as a newline and the line, and a metric ends with a newline: the exporter's
   * `(header + "\n" + lines).trim() + "\n"`, without having to take back a newline already sent.
   */
  async *pieces(rm: ResourceMetrics): AsyncGenerator<string> {
    const info = labelBlock(rm.resource.attributes);
    let out = `# HELP target_info Target metadata\n# TYPE target_info gauge\ntarget_info${info === '' ? '' : `{${info}}`} 1\n`;
    let lines = 0;
    let any = false;
    for (const sm of rm.scopeMetrics) {
      const scope: Attributes = { 'otel.scope.name': sm.scope.name };
      if (sm.scope.schemaUrl) scope['otel.scope.schema_url'] = sm.scope.schemaUrl;
      if (sm.scope.version) scope['otel.scope.version'] = sm.scope.version;
      const scopeLabels = labelBlock(scope);
      for (const metric of sm.metrics) {
        const name = metricName(metric);
        if (name === undefined) continue;
        any = true;
        out += `# HELP ${name} ${escapeString(metric.descriptor.description || 'description missing')}`;
        if (metric.descriptor.unit) out += `\n# UNIT ${name} ${escapeString(metric.descriptor.unit)}`;
        out += `\n# TYPE ${name} ${prometheusType(metric)}`;
        if (metric.dataPointType === DataPointType.HISTOGRAM) {
          for (const dp of metric.dataPoints) {
            const labels = this.labels(dp.attributes, scopeLabels);
            const h = dp.value;
            if (h.count != null) out += `\n${name}_count{${labels}} ${valueString(h.count)}`;
            if (h.sum != null) out += `\n${name}_sum{${labels}} ${valueString(h.sum)}`;
            const bounds = h.buckets.boundaries;
            const counts = h.buckets.counts;
            let cumulative = 0;
            let infinite = false;
            for (let i = 0; i < counts.length; i++) {
              cumulative += counts[i]!;
              const upper = bounds[i];
              if (upper === undefined && infinite) break;
              if (upper === Infinity) infinite = true;
              const le = upper === undefined || upper === Infinity ? '+Inf' : String(upper);
              out += `\n${name}_bucket{${labels},le="${le}"} ${valueString(cumulative)}`;
            }
            lines += counts.length + 2;
            if (lines >= this.sliceLines) {
              yield out;
              out = '';
              lines = 0;
              await nextTurn();
            }
          }
        } else if (metric.dataPointType === DataPointType.SUM || metric.dataPointType === DataPointType.GAUGE) {
          for (const dp of metric.dataPoints) {
            out += `\n${name}{${this.labels(dp.attributes, scopeLabels)}} ${valueString(dp.value)}`;
            if (++lines >= this.sliceLines) {
              yield out;
              out = '';
              lines = 0;
              await nextTurn();
            }
          }
        }
        out += '\n';
      }
    }
    if (!any) out += NO_REGISTERED_METRICS;
    yield out;
  }

  private labels(attributes: Attributes, scopeLabels: string): string {
    let own = this.labelCache.get(attributes);
    if (own === undefined) {
      own = labelBlock(attributes);
      // Only frozen objects can be trusted not to change under the cache (LabelSets freezes its sets).
      if (Object.isFrozen(attributes)) this.labelCache.set(attributes, own);
    }
    return own === '' ? scopeLabels : `${own},${scopeLabels}`;
  }
}

/** Lines written between two yields to the event loop: ~1-2 ms of work here. */
const SLICE_LINES = 2000;
const NO_REGISTERED_METRICS = '# no registered metrics';

function metricName(metric: MetricData): string | undefined {
  let name = sanitizeName(escapeString(metric.descriptor.name));
  if (name === '' || name === '_') return undefined; // the exporter logs these and leaves them out
  if (name[0]! >= '0' && name[0]! <= '9') name = `_${name}`;
  if (metric.dataPointType === DataPointType.SUM && metric.isMonotonic && !name.endsWith('_total')) name += '_total';
  return name;
}

function prometheusType(metric: MetricData): string {
  switch (metric.dataPointType) {
    case DataPointType.SUM:
      return metric.isMonotonic ? 'counter' : 'gauge';
    case DataPointType.GAUGE:
      return 'gauge';
    case DataPointType.HISTOGRAM:
      return 'histogram';
    default:
      return 'untyped';
  }
}

/**
 * A series' labels. Prometheus refuses the whole scrape for one invalid or repeated label name,
 * and attribute names come from users too (OTEL_RESOURCE_ATTRIBUTES), so they follow the
 * OpenTelemetry Prometheus compatibility rules beyond what the exporter's serializer does: a name
 * that starts with a digit gets `key_` before it, and attributes whose names sanitise to one
 * label are one label, their values joined with `;` in the order of the original names.
 */
function labelBlock(attributes: Attributes): string {
  const entries = Object.entries(attributes);
  const names = entries.map(([key]) => labelName(key));
  let s = '';
  if (new Set(names).size === names.length) {
    for (let i = 0; i < entries.length; i++) s += `${i > 0 ? ',' : ''}${names[i]}="${escapeValue(entries[i]![1])}"`;
    return s;
  }
  const joined = new Map<string, [string, AttributeValue | undefined][]>();
  entries.forEach(([key, value], i) => {
    const list = joined.get(names[i]!);
    if (list === undefined) joined.set(names[i]!, [[key, value]]);
    else list.push([key, value]);
  });
  for (const [name, list] of joined) {
    list.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    s += `${s.length > 0 ? ',' : ''}${name}="${list.map(([, v]) => escapeValue(v)).join(';')}"`;
  }
  return s;
}

function labelName(key: string): string {
  const name = sanitizeName(key);
  return name.charCodeAt(0) >= 0x30 && name.charCodeAt(0) <= 0x39 ? `key_${name}` : name;
}

function sanitizeName(name: string): string {
  return name.replace(/[^a-z0-9_]/gi, '_').replace(/_{2,}/g, '_');
}

function escapeString(s: string): string {
  return s.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

function escapeValue(value: AttributeValue | undefined): string {
  const s = value === undefined ? '' : typeof value === 'string' ? value : JSON.stringify(value);
  return escapeString(s).replace(/"/g, '\\"');
}

function valueString(value: number): string {
  return value === Infinity ? '+Inf' : value === -Infinity ? '-Inf' : `${value}`;
}
