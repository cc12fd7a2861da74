import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { testInstruments } from '../helpers/metrics.js';

const P50 = 'nodejs.eventloop.delay.p50';
const MAX = 'nodejs.eventloop.delay.max';

function blockFor(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    // a stalled event loop
  }
}

describe('event-loop-delay gauges', () => {
  let t: ReturnType<typeof testInstruments> | undefined;
  afterEach(async () => {
    await t?.shutdown();
    t = undefined;
  });

  it('report the delay beyond the sampling period, at the configured period', async () => {
    t = testInstruments({ loopDelayResolutionMs: 20 });
    await t.gaugeValue(MAX); // starts a fresh window
    await sleep(200); // ~10 idle samples: each the period itself, i.e. no delay
    blockFor(150);
    await sleep(60);
    const max = (await t.gaugeValue(MAX))!;
    // The sample due during the stall fires at its end: 150 ms minus up to one period late.
    expect(max).toBeGreaterThanOrEqual(0.125);
    expect(max).toBeLessThan(1);
    await sleep(200);
    const p50 = (await t.gaugeValue(P50))!;
    // An idle loop: the period is subtracted, so the median is ~0, not 20 ms.
    expect(p50).toBeGreaterThanOrEqual(0);
    expect(p50).toBeLessThan(0.015);
  });

  it('report nothing for a window without a sample', async () => {
    t = testInstruments({ loopDelayResolutionMs: 10_000 });
    await sleep(150); // three periods of the default
    expect(await t.gaugeValue(MAX)).toBeUndefined();
  });
});
