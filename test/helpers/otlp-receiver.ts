import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface OtlpPoint {
  metric: string;
  unit: string;
  kind: 'histogram' | 'exponentialHistogram' | 'sum' | 'gauge';
  attributes: Record<string, string>;
  count?: number;
  sum?: number;
  value?: number;
  /** The metric's aggregation temporality, for histograms and sums. */
  temporality?: 'delta' | 'cumulative';
  startTimeUnixNano?: string;
  timeUnixNano?: string;
  /** Histograms: the samples their buckets hold (an exponential one's zero bucket and both ranges included). */
  bucketTotal?: number;
  /** Exponential histograms: the scale (bucket base 2^(2^-scale)). */
  scale?: number;
}

type Buckets = { bucketCounts?: (number | string)[] } | undefined;
const bucketSum = (b: Buckets) => (b?.bucketCounts ?? []).reduce((a: number, c) => a + Number(c), 0);

/** OTLP's AggregationTemporality: 1 delta, 2 cumulative (a number, or its name in proto3 JSON). */
function temporalityOf(t: unknown): OtlpPoint['temporality'] {
  if (t === 1 || t === 'AGGREGATION_TEMPORALITY_DELTA') return 'delta';
  if (t === 2 || t === 'AGGREGATION_TEMPORALITY_CUMULATIVE') return 'cumulative';
  return undefined;
}

export interface OtlpExport {
  resource: Record<string, string>;
  points: OtlpPoint[];
}

type AnyValue = { stringValue?: string; intValue?: number | string; doubleValue?: number; boolValue?: boolean };
const attrs = (list: { key: string; value: AnyValue }[] | undefined) =>
  Object.fromEntries((list ?? []).map((a) => [a.key, String(a.value.stringValue ?? a.value.intValue ?? a.value.doubleValue ?? a.value.boolValue)]));

/** An OTLP/HTTP JSON receiver on loopback that decodes every export request it gets. */
export async function startOtlpReceiver() {
  const exports: OtlpExport[] = [];
  const contentTypes: string[] = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString('utf8')));
    req.on('end', () => {
      contentTypes.push(String(req.headers['content-type']));
      if (req.url !== '/v1/metrics') {
        res.writeHead(404).end();
        return;
      }
      const msg = JSON.parse(body) as { resourceMetrics: { resource?: { attributes?: { key: string; value: AnyValue }[] }; scopeMetrics: { metrics: Record<string, unknown>[] }[] }[] };
      for (const rm of msg.resourceMetrics) {
        const points: OtlpPoint[] = [];
        for (const sm of rm.scopeMetrics)
          for (const m of sm.metrics) {
            for (const kind of ['histogram', 'exponentialHistogram', 'sum', 'gauge'] as const) {
              const data = m[kind] as { dataPoints: Record<string, unknown>[]; aggregationTemporality?: unknown } | undefined;
              if (!data) continue;
              for (const dp of data.dataPoints) {
                points.push({
                  metric: m.name as string,
                  unit: (m.unit as string) ?? '',
                  kind,
                  attributes: attrs(dp.attributes as { key: string; value: AnyValue }[]),
                  ...(dp.count !== undefined ? { count: Number(dp.count) } : {}),
                  ...(dp.sum !== undefined ? { sum: Number(dp.sum) } : {}),
                  ...(dp.asDouble !== undefined ? { value: Number(dp.asDouble) } : dp.asInt !== undefined ? { value: Number(dp.asInt) } : {}),
                  ...(temporalityOf(data.aggregationTemporality) ? { temporality: temporalityOf(data.aggregationTemporality) } : {}),
                  ...(dp.startTimeUnixNano !== undefined ? { startTimeUnixNano: String(dp.startTimeUnixNano) } : {}),
                  ...(dp.timeUnixNano !== undefined ? { timeUnixNano: String(dp.timeUnixNano) } : {}),
                  ...(kind === 'histogram' ? { bucketTotal: bucketSum(dp as Buckets) } : {}),
                  ...(kind === 'exponentialHistogram'
                    ? {
                        bucketTotal: Number(dp.zeroCount ?? 0) + bucketSum(dp.positive as Buckets) + bucketSum(dp.negative as Buckets),
                        scale: Number(dp.scale ?? 0),
                      }
                    : {}),
                });
              }
            }
          }
        exports.push({ resource: attrs(rm.resource?.attributes), points });
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/metrics`,
    exports,
    contentTypes,
    /** The latest cumulative data point for each metric + attribute set. */
    latest(): OtlpPoint[] {
      const byKey = new Map<string, OtlpPoint>();
      for (const e of exports) for (const p of e.points) byKey.set(`${p.metric}|${JSON.stringify(Object.entries(p.attributes).sort())}`, p);
      return [...byKey.values()];
    },
    close: () => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}
