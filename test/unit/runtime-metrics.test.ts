import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { DataPointType } from '@opentelemetry/sdk-metrics';
import { afterEach, describe, expect, it } from 'vitest';
import { GC_DURATION_BUCKETS } from '../../src/metrics/semconv.js';
import { blockFor } from '../helpers/busy.js';
import { testInstruments } from '../helpers/metrics.js';

// Ground truth from the kernel, not from the Node APIs the metrics read.
const CLOCK_TICKS = 100; // USER_HZ on Linux
function procStat(): { user: number; system: number } {
  // Fields after the command name (which may hold spaces), from field 3 on: utime is field 14.
  const rest = readFileSync('/proc/self/stat', 'utf8').split(') ')[1]!.split(' ');
  return { user: Number(rest[11]) / CLOCK_TICKS, system: Number(rest[12]) / CLOCK_TICKS };
}
function procRss(): number {
  const kb = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync('/proc/self/status', 'utf8'));
  return Number(kb![1]) * 1024;
}
function spinCpu(seconds: number): number {
  const start = process.cpuUsage();
  let x = 0;
  // cpuUsage() is a getrusage call: asked every turn, it made the spin mostly system time, 2 s of
  // wall for 0.3 s of user time alone and up to 17.7 s beside promtool. Ask every 100k turns.
  while (process.cpuUsage(start).user < seconds * 1e6) {
    for (let i = 0; i < 100_000; i++) x = (x * 31 + i) | 0;
  }
  return x;
}

describe('runtime metrics of the proxy process', () => {
  let t: ReturnType<typeof testInstruments> | undefined;
  afterEach(async () => {
    await t?.shutdown();
    t = undefined;
  });

  it('CPU time by mode agrees with the kernel and grows with the work done', async () => {
    t = testInstruments();
    const user0 = await t.sumValue('process.cpu.time', { 'cpu.mode': 'user' });
    spinCpu(0.3);
    const user1 = await t.sumValue('process.cpu.time', { 'cpu.mode': 'user' });
    const system1 = await t.sumValue('process.cpu.time', { 'cpu.mode': 'system' });
    const kernel = procStat();
    expect(user1 - user0).toBeGreaterThanOrEqual(0.3);
    // Read a moment apart, and the kernel's in 10 ms ticks: a few ticks of slack.
    expect(Math.abs(user1 - kernel.user)).toBeLessThan(0.1);
    expect(Math.abs(system1 - kernel.system)).toBeLessThan(0.1);
  });

  it('resident memory agrees with the kernel; heap in use follows what is retained', async () => {
    t = testInstruments();
    const rss = await t.sumValue('process.memory.usage');
    expect(Math.abs(rss - procRss())).toBeLessThan(8 * 2 ** 20);
    const heap0 = await t.sumValue('v8js.memory.heap.used');
    let kept: object[] | undefined = Array.from({ length: 400_000 }, (_, i) => ({ i, s: `x${i}` }));
    const heap1 = await t.sumValue('v8js.memory.heap.used');
    expect(heap1 - heap0).toBeGreaterThan(10 * 2 ** 20);
    expect(kept.length).toBe(400_000);
    kept = undefined;
    // Every space is reported; none uses more than it reserves.
    const { resourceMetrics } = await t.collect();
    const points = (name: string) =>
      resourceMetrics.scopeMetrics.flatMap((sm) =>
        sm.metrics.flatMap((m) => (m.descriptor.name === name && m.dataPointType === DataPointType.SUM ? m.dataPoints : [])),
      );
    const used = points('v8js.memory.heap.used');
    const size = new Map(points('v8js.memory.heap.space.size').map((p) => [p.attributes['v8js.heap.space.name'], p.value as number]));
    expect(used.map((p) => p.attributes['v8js.heap.space.name'])).toEqual(expect.arrayContaining(['new_space', 'old_space', 'code_space', 'large_object_space']));
    for (const p of used) expect(p.value as number, String(p.attributes['v8js.heap.space.name'])).toBeLessThanOrEqual(size.get(p.attributes['v8js.heap.space.name'])!);
    // ...and the two are not one figure: V8 reserves more than it uses (the young generation's second semi-space at least).
    expect([...size.values()].reduce((a, b) => a + b, 0)).toBeGreaterThan(used.reduce((a, p) => a + (p.value as number), 0));
  });

  it('records GC pauses by kind, with buckets that resolve milliseconds', async () => {
    t = testInstruments();
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const before = await t.histogram('v8js.gc.duration', { 'v8js.gc.type': 'major' });
    const start = performance.now();
    gc();
    gc();
    // Short-lived garbage for scavenges (and perhaps a major collection of its own).
    for (let i = 0; i < 200; i++) void Array.from({ length: 10_000 }, (_, j) => ({ j }));
    await sleep(50); // the observer delivers its entries on a later turn
    // Pauses stop the only thread that runs JavaScript: together no longer than the time they fell in.
    const wall = (performance.now() - start) / 1000;
    const after = await t.histogram('v8js.gc.duration', { 'v8js.gc.type': 'major' });
    expect(after.count - before.count).toBeGreaterThanOrEqual(2);
    expect(after.sum - before.sum).toBeGreaterThan(0);
    expect(after.sum - before.sum).toBeLessThanOrEqual(wall);
    const minor = await t.histogram('v8js.gc.duration', { 'v8js.gc.type': 'minor' });
    expect(minor.count).toBeGreaterThan(0);
    expect(GC_DURATION_BUCKETS).toEqual(expect.arrayContaining([0.001, 0.01, 0.1, 1, 10]));
  });

  it('stops recording GC pauses at shutdown', async () => {
    t = testInstruments();
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    gc();
    await sleep(20);
    t.instruments.shutdown();
    const before = await t.histogram('v8js.gc.duration');
    gc();
    await sleep(20);
    expect((await t.histogram('v8js.gc.duration')).count).toBe(before.count);
  });

  it('event-loop time splits into active and idle as the loop spends it', async () => {
    t = testInstruments();
    const a0 = await t.sumValue('nodejs.eventloop.time', { 'nodejs.eventloop.state': 'active' });
    const i0 = await t.sumValue('nodejs.eventloop.time', { 'nodejs.eventloop.state': 'idle' });
    blockFor(300);
    await sleep(300);
    const a1 = await t.sumValue('nodejs.eventloop.time', { 'nodejs.eventloop.state': 'active' });
    const i1 = await t.sumValue('nodejs.eventloop.time', { 'nodejs.eventloop.state': 'idle' });
    expect(a1 - a0).toBeGreaterThanOrEqual(0.29);
    // Idle unless the machine is busy elsewhere: most of the 300 ms, not nothing.
    expect(i1 - i0).toBeGreaterThan(0.1);
    expect(a1 - a0 + (i1 - i0)).toBeLessThan(5);
  });
});
