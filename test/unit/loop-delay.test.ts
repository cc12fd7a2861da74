import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { blockFor } from '../helpers/busy.js';
import { testInstruments } from '../helpers/metrics.js';

const P50 = 'nodejs.eventloop.delay.p50';
const MAX = 'nodejs.eventloop.delay.max';

describe('event-loop-delay gauges', () => {
  let t: ReturnType<typeof testInstruments> | undefined;
  afterEach(async () => {
    await t?.shutdown();
    t = undefined;
  });

  it('report the delay beyond the sampling period, at the configured period', async () => {
    t = testInstruments({ loopDelayResolutionMs: 50 });
    await t.gaugeValue(MAX); // starts a fresh window
    await sleep(400); // ~8 idle samples: each the period itself, i.e. no delay
    blockFor(250);
    await sleep(120);
    const max = (await t.gaugeValue(MAX))!;
    // The sample due during the stall fires at its end: 250 ms minus up to one period late.
    expect(max).toBeGreaterThanOrEqual(0.195);
    expect(max).toBeLessThan(1);
    await sleep(400);
    const p50 = (await t.gaugeValue(P50))!;
    // An idle loop: the configured period is subtracted, so the median is ~0 (not 50 ms, and
    // not 40 ms as with a fixed 10 ms subtracted).
    expect(p50).toBeGreaterThanOrEqual(0);
    expect(p50).toBeLessThan(0.025);
  });

  it('report nothing for a window without a sample', async () => {
    t = testInstruments({ loopDelayResolutionMs: 10_000 });
    await sleep(150); // three periods of the default
    expect(await t.gaugeValue(MAX)).toBeUndefined();
  });
});
