import { PrometheusSerializer } from '@opentelemetry/exporter-prometheus';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { AggregationTemporality, DataPointType, type MetricData, type ResourceMetrics } from '@opentelemetry/sdk-metrics';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createTelemetry, SCOPE_NAME } from '../../src/metrics/exporter.js';
import { Instruments } from '../../src/metrics/instruments.js';
import { PrometheusText } from '../../src/metrics/prometheus-text.js';
import { VERSION } from '../../src/version.js';
import { parseProm } from '../helpers/prom.js';

// The exporter's serializer as the proxy configured it before PrometheusText replaced it.
const reference = new PrometheusSerializer(undefined, false, undefined, false, false);

// Label values with what the exposition must escape (backslash, newline, quote) and names
// with what it must sanitise (dots, dashes, runs of underscores).
const labelName = fc.stringMatching(/^[a-z][a-z0-9._-]{0,12}$/);
const labelValue = fc.oneof(fc.string({ maxLength: 12 }), fc.constantFrom('a\\b', 'x\ny', 'q"uote', ''), fc.integer(), fc.boolean());
// Names that sanitise to one label are joined (a rule the exporter's serializer lacks): tested apart.
const attributes = fc
  .dictionary(labelName, labelValue, { maxKeys: 4 })
  .filter((a) => new Set(Object.keys(a).map((k) => k.replace(/[^a-z0-9_]/gi, '_').replace(/_{2,}/g, '_'))).size === Object.keys(a).length);
const number = fc.oneof(fc.double({ noNaN: true }), fc.integer(), fc.constantFrom(0, 1e21, 1e-7, Infinity, -Infinity));
const time: [number, number] = [1, 0];

const histogram = fc.record({
  name: fc.stringMatching(/^[a-z][a-z0-9._]{0,20}$/),
  description: fc.string({ maxLength: 20 }),
  infiniteLast: fc.boolean(),
  bounds: fc.uniqueArray(fc.double({ min: 0, max: 100, noNaN: true }), { maxLength: 6 }).map((b) => b.sort((x, y) => x - y)),
  points: fc.array(fc.tuple(attributes, fc.nat(1000), fc.double({ min: 0, max: 1e6, noNaN: true })), { maxLength: 4 }),
}).map(({ name, description, infiniteLast, bounds, points }): MetricData => {
  const boundaries = infiniteLast ? [...bounds, Infinity] : bounds;
  return {
    descriptor: { name, description, unit: '', valueType: 1 },
    aggregationTemporality: AggregationTemporality.CUMULATIVE,
    dataPointType: DataPointType.HISTOGRAM,
    dataPoints: points.map(([attrs, count, sum], i) => ({
      attributes: i % 2 === 0 ? Object.freeze(attrs) : attrs,
      startTime: time,
      endTime: time,
      value: { buckets: { boundaries, counts: [...boundaries, 0].map((_, k) => (count * (k + 1)) % 7) }, sum, count },
    })),
  };
});

const sum = fc.record({
  name: fc.stringMatching(/^[a-z0-9][a-z0-9._]{0,20}$/),
  description: fc.string({ maxLength: 20 }),
  unit: fc.constantFrom('', '{token}', 's'),
  kind: fc.constantFrom('counter', 'updown', 'gauge'),
  points: fc.array(fc.tuple(attributes, number), { maxLength: 4 }),
}).map(({ name, description, unit, kind, points }): MetricData => {
  const dataPoints = points.map(([attrs, value]) => ({ attributes: attrs, startTime: time, endTime: time, value }));
  const descriptor = { name, description, unit, valueType: 1 };
  return kind === 'gauge'
    ? { descriptor, aggregationTemporality: AggregationTemporality.CUMULATIVE, dataPointType: DataPointType.GAUGE, dataPoints }
    : { descriptor, aggregationTemporality: AggregationTemporality.CUMULATIVE, dataPointType: DataPointType.SUM, isMonotonic: kind === 'counter', dataPoints };
});

const resourceMetrics = fc
  .record({
    resource: attributes,
    scopes: fc.array(
      fc.record({
        name: fc.string({ maxLength: 8 }),
        version: fc.option(fc.string({ maxLength: 5 }), { nil: undefined }),
        schemaUrl: fc.option(fc.constant('https://opentelemetry.io/schemas/1.37.0'), { nil: undefined }),
        metrics: fc.array(fc.oneof(histogram, sum), { maxLength: 4 }),
      }),
      { maxLength: 3 },
    ),
  })
  .map(
    ({ resource, scopes }): ResourceMetrics => ({
      resource: resourceFromAttributes(resource),
      scopeMetrics: scopes.map(({ name, version, schemaUrl, metrics }) => ({
        scope: { name, ...(version === undefined ? {} : { version }), ...(schemaUrl === undefined ? {} : { schemaUrl }) },
        metrics,
      })),
    }),
  );

/** Counts the event loop's turns (a setImmediate chain) until stopped. */
function countTurns() {
  const c = { turns: 0, running: true, stop: () => void (c.running = false) };
  const spin = (): void => {
    if (!c.running) return;
    c.turns++;
    setImmediate(spin);
  };
  setImmediate(spin);
  return c;
}

describe('PrometheusText', () => {
  it('writes exactly what the OpenTelemetry exporter serializer writes (property), twice from its cache', async () => {
    await fc.assert(
      fc.asyncProperty(resourceMetrics, fc.integer({ min: 1, max: 5 }), async (rm, slice) => {
        const text = new PrometheusText(slice);
        const expected = reference.serialize(rm);
        expect(await text.serialize(rm)).toBe(expected);
        expect(await text.serialize(rm)).toBe(expected); // label blocks now come from the cache
      }),
      { numRuns: 300 },
    );
  });

  it('keeps label blocks only for frozen attribute objects: a changed plain object is written as it is now', async () => {
    const text = new PrometheusText();
    const attributes: Record<string, string> = { model: 'a' };
    const rm = (): ResourceMetrics => ({
      resource: resourceFromAttributes({}),
      scopeMetrics: [
        {
          scope: { name: 's' },
          metrics: [
            {
              descriptor: { name: 'g', description: 'd', unit: '', valueType: 1 },
              aggregationTemporality: AggregationTemporality.CUMULATIVE,
              dataPointType: DataPointType.GAUGE,
              dataPoints: [{ attributes, startTime: time, endTime: time, value: 1 }],
            },
          ],
        },
      ],
    });
    expect(await text.serialize(rm())).toContain('g{model="a",otel_scope_name="s"} 1');
    attributes.model = 'b';
    expect(await text.serialize(rm())).toContain('g{model="b",otel_scope_name="s"} 1');
  });

  it('hands out counters and gauges in slices too, each piece once the slice is full, with a turn of the event loop between', async () => {
    const point = (i: number) => ({ attributes: { model: `m${i}` }, startTime: time, endTime: time, value: i });
    const metric = (name: string, dataPointType: DataPointType.SUM | DataPointType.GAUGE, n: number): MetricData =>
      dataPointType === DataPointType.SUM
        ? { descriptor: { name, description: 'd', unit: '', valueType: 1 }, aggregationTemporality: AggregationTemporality.CUMULATIVE, dataPointType, isMonotonic: true, dataPoints: Array.from({ length: n }, (_, i) => point(i)) }
        : { descriptor: { name, description: 'd', unit: '', valueType: 1 }, aggregationTemporality: AggregationTemporality.CUMULATIVE, dataPointType, dataPoints: Array.from({ length: n }, (_, i) => point(i)) };
    const rm: ResourceMetrics = {
      resource: resourceFromAttributes({}),
      scopeMetrics: [{ scope: { name: 's' }, metrics: [metric('c', DataPointType.SUM, 7), metric('g', DataPointType.GAUGE, 5)] }],
    };
    const pieces: string[] = [];
    const turnsBefore: number[] = [];
    const loop = countTurns();
    for await (const piece of new PrometheusText(3).pieces(rm)) {
      pieces.push(piece);
      turnsBefore.push(loop.turns);
    }
    loop.stop();
    expect(pieces.join('')).toBe(reference.serialize(rm));
    // 12 points, 3 lines a slice: 4 full pieces, then what remains (the last metric's end).
    expect(pieces.map((p) => (p.match(/^[cg](_total)?\{/gm) ?? []).length)).toEqual([3, 3, 3, 3, 0]);
    for (let i = 1; i < turnsBefore.length; i++) expect(turnsBefore[i]!, `piece ${i}`).toBeGreaterThan(turnsBefore[i - 1]!);
  });

  it('writes the proxy instruments with their escaped labels, yielding to the event loop every slice of lines', async () => {
    const telemetry = createTelemetry({ prometheus: true, serviceInstanceId: 'test' });
    const ins = new Instruments(telemetry.provider.getMeter(SCOPE_NAME, '0'), undefined, { fast: telemetry.fast });
    for (let i = 0; i < 300; i++) {
      const labels = ins.labels.of('gen_ai.provider.name', 'openai', 'gen_ai.request.model', `m${i}`, 'error.type', i % 2 ? 'x"y\\z' : undefined);
      ins.chunkGap.record(i / 1e4, labels);
      ins.ttft.record(i / 100, labels);
      ins.streams.add(1, labels);
    }
    // Event-loop turns that other work (the streams) gets while a scrape is written.
    const loop = countTurns();
    let text = '';
    for await (const piece of telemetry.scrape!()) text += piece;
    loop.stop();
    const turns = loop.turns;
    expect(text).toContain(
      `gen_ai_client_operation_time_to_first_chunk_seconds_bucket{gen_ai_provider_name="openai",gen_ai_request_model="m1",error_type="x\\"y\\\\z",otel_scope_name="llm-latency-proxy",otel_scope_version="${VERSION}",le="0.02"} 1\n`,
    );
    const lines = text.split('\n').length;
    expect(lines).toBeGreaterThan(15_000);
    // One turn at least per 2,000 lines written (the first turn may come before the scrape starts writing).
    expect(turns).toBeGreaterThanOrEqual(Math.floor(lines / 2000) - 1);
    await telemetry.shutdown();
  });

  it('target_info carries OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME; a malformed OTEL_RESOURCE_ATTRIBUTES is discarded whole', async () => {
    const saved = { attrs: process.env.OTEL_RESOURCE_ATTRIBUTES, name: process.env.OTEL_SERVICE_NAME };
    const targetInfo = async () => {
      const telemetry = createTelemetry({ prometheus: true, serviceInstanceId: 'test' });
      let text = '';
      for await (const piece of telemetry.scrape!()) text += piece;
      await telemetry.shutdown();
      return parseProm(text).find((x) => x.name === 'target_info')?.labels;
    };
    try {
      process.env.OTEL_RESOURCE_ATTRIBUTES = 'service.namespace=llm,deployment.environment.name=prod%2Ceu,service.name=from-attrs';
      delete process.env.OTEL_SERVICE_NAME;
      expect(await targetInfo()).toEqual({
        service_name: 'from-attrs',
        service_version: VERSION,
        service_instance_id: 'test',
        service_namespace: 'llm',
        deployment_environment_name: 'prod,eu',
      });
      process.env.OTEL_SERVICE_NAME = 'from-name'; // wins over service.name in the attributes, as the specification says
      expect(await targetInfo()).toMatchObject({ service_name: 'from-name', service_namespace: 'llm' });
      // Names Prometheus would refuse the whole scrape for: one that starts with a digit, two
      // that sanitise to one label (joined with ';' in the order of the original names).
      process.env.OTEL_RESOURCE_ATTRIBUTES = '1abc=v,a_b=2,a.b=1,a-b=3';
      const text = await (async () => {
        const telemetry = createTelemetry({ prometheus: true, serviceInstanceId: 'test' });
        let t = '';
        for await (const piece of telemetry.scrape!()) t += piece;
        await telemetry.shutdown();
        return t;
      })();
      const info = /^target_info\{(.*)\} 1$/m.exec(text)?.[1];
      expect(info).toContain('key_1abc="v"');
      expect(info).toContain('a_b="3;1;2"'); // a-b, a.b, a_b
      expect(info!.match(/(?:^|,)a_b=/g)).toHaveLength(1);
      process.env.OTEL_RESOURCE_ATTRIBUTES = 'service.namespace=llm,broken';
      delete process.env.OTEL_SERVICE_NAME;
      expect(await targetInfo()).toEqual({ service_name: 'llm-latency-proxy', service_version: VERSION, service_instance_id: 'test' });
    } finally {
      for (const [k, v] of [['OTEL_RESOURCE_ATTRIBUTES', saved.attrs], ['OTEL_SERVICE_NAME', saved.name]] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });
});
