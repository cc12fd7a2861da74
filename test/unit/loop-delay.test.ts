import type { GaugeMetricData } from '@opentelemetry/sdk-metrics';
import { setTimeout as sleep } from 'node:timers/promises';
import { performance } from 'node:perf_hooks';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createTelemetry } from '../../src/metrics/exporter.js';
import { LoopDelayGauges, LoopDelaySampler } from '../../src/metrics/loop-delay.js';
import { blockFor } from '../helpers/busy.js';

const P50 = 'nodejs.eventloop.delay.p50';
const MAX = 'nodejs.eventloop.delay.max';

/** The gauge's value in a collection (undefined when it reported none). */
async function gauge(g: LoopDelayGauges, name: string): Promise<number | undefined> {
  const { resourceMetrics } = await g.collect();
  const m = resourceMetrics.scopeMetrics.flatMap((s) => s.metrics).find((x) => x.descriptor.name === name) as GaugeMetricData | undefined;
  return m?.dataPoints[0]?.value;
}

describe('event-loop-delay gauges', () => {
  it('record a stall that begins right after a collection (Node\'s own monitor forgot the tick before it on reset)', async () => {
    const g = make(50);
    await sleep(200);
    await gauge(g, MAX); // resets the window; the stall starts in the same turn, before any tick
    blockFor(250);
    await sleep(120);
    expect(await gauge(g, MAX)).toBeGreaterThanOrEqual(0.195);
  });

  const samplers: LoopDelaySampler[] = [];
  const sampler = (resolutionMs: number) => {
    const s = new LoopDelaySampler(resolutionMs);
    samplers.push(s);
    return s;
  };
  const make = (resolutionMs: number) => new LoopDelayGauges({ name: 'test' }, sampler(resolutionMs));
  afterEach(() => {
    for (const s of samplers.splice(0)) s.stop();
  });

  it('report the delay beyond the sampling period, at the configured period', async () => {
    const g = make(50);
    await gauge(g, MAX); // starts a fresh window
    await sleep(400); // ~8 idle samples: each the period itself, i.e. no delay
    blockFor(250);
    await sleep(120);
    const max = (await gauge(g, MAX))!;
    // The sample due during the stall fires at its end: 250 ms minus up to one period late.
    expect(max).toBeGreaterThanOrEqual(0.195);
    expect(max).toBeLessThan(1);
    await sleep(400);
    const p50 = (await gauge(g, P50))!;
    // An idle loop: the configured period is subtracted, so the median is ~0 (not 50 ms, and
    // not 40 ms as with a fixed 10 ms subtracted).
    expect(p50).toBeGreaterThanOrEqual(0);
    expect(p50).toBeLessThan(0.025);
  });

  it('report nothing for a window without a sample, then repeat the last values while none comes', async () => {
    const g = make(10_000);
    await sleep(150); // three periods of the default
    expect(await gauge(g, MAX)).toBeUndefined();
    const h = make(50);
    let first: number | undefined;
    for (let i = 0; i < 100 && first === undefined; i++) {
      await sleep(50);
      first = await gauge(h, P50);
    }
    expect(first).toBeGreaterThanOrEqual(0);
    // Collected again at once: no sample in between, the same values.
    expect(await gauge(h, P50)).toBe(first);
  });

  it('keep one window per reader: a collection by one does not empty the other\'s', async () => {
    const s = sampler(50);
    const a = new LoopDelayGauges({ name: 'a' }, s);
    const b = new LoopDelayGauges({ name: 'b' }, s);
    await Promise.all([gauge(a, MAX), gauge(b, MAX)]);
    await sleep(200);
    blockFor(250);
    await sleep(120);
    expect(await gauge(b, MAX)).toBeGreaterThanOrEqual(0.195);
    await sleep(120); // b's later collections see no stall; a's still does
    await gauge(b, MAX);
    expect(await gauge(a, MAX)).toBeGreaterThanOrEqual(0.195);
  });

  it('a tick that runs early (the clock did not move a whole period) records 1 ns, not a value the histogram refuses', async () => {
    const s = sampler(10);
    const w = s.window();
    const frozen = performance.now();
    const now = vi.spyOn(performance, 'now').mockImplementation(() => frozen);
    try {
      for (let i = 0; i < 100 && w.count < 3; i++) await sleep(10);
    } finally {
      now.mockRestore();
    }
    expect(w.count).toBeGreaterThanOrEqual(3);
    expect(w.min).toBe(1);
  });

  it('stop: no window records again', async () => {
    const s = sampler(10);
    const w = s.window();
    for (let i = 0; i < 100 && w.count === 0; i++) await sleep(10);
    expect(w.count).toBeGreaterThan(0);
    s.stop();
    w.reset();
    await sleep(100); // ten periods
    expect(w.count).toBe(0);
  });
});

describe('telemetry shutdown', () => {
  it('leaves no timer of its own behind (the final push\'s 5 s cap is cleared once the push is done)', async () => {
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
    const before = timers();
    const t = createTelemetry({ prometheus: true });
    await t.shutdown();
    expect(timers()).toBeLessThanOrEqual(before); // the 5 s timer would be one more (a timer of the runner may end meanwhile)
  });
});
