import type { Attributes, Histogram, Meter } from '@opentelemetry/api';
import { constants, performance, PerformanceObserver } from 'node:perf_hooks';
import { getHeapSpaceStatistics } from 'node:v8';
import { GC_DURATION_BUCKETS, METRIC } from './semconv.js';

/**
 * The proxy process's own health, so that an operator can tell a slow proxy
 * from a slow provider without restarting it with profiling flags: event-loop
 * utilisation, CPU time, resident memory, V8 heap per space and GC pauses
 * (OpenTelemetry runtime and process semantic conventions; the event-loop
 * delay is in loop-delay.ts, one window per reader). Everything
 * but the GC histogram is read when a reader collects; GC pauses are recorded
 * from Node's performance observer, which delivers them after the collection,
 * off the request path.
 */
export class RuntimeMetrics {
  private readonly gcObserver: PerformanceObserver;

  constructor(meter: Meter) {
    // Cumulative counters, so that rate() gives the share of any window whatever the
    // scrape interval, and two readers (Prometheus and OTLP) do not split them.
    const loopTime = meter.createObservableCounter(METRIC.eventLoopTime, {
      unit: 's',
      description: 'Time the event loop of the proxy process has spent active (running callbacks) and idle (waiting for I/O); rate(active) is the event-loop utilisation.',
    });
    const active = Object.freeze({ 'nodejs.eventloop.state': 'active' });
    const idle = Object.freeze({ 'nodejs.eventloop.state': 'idle' });
    loopTime.addCallback((obs) => {
      const u = performance.eventLoopUtilization();
      obs.observe(u.active / 1000, active);
      obs.observe(u.idle / 1000, idle);
    });

    const cpu = meter.createObservableCounter(METRIC.processCpuTime, {
      unit: 's',
      description: 'CPU time of the proxy process (all its threads), in user and in system mode.',
    });
    const user = Object.freeze({ 'cpu.mode': 'user' });
    const system = Object.freeze({ 'cpu.mode': 'system' });
    cpu.addCallback((obs) => {
      const c = process.cpuUsage();
      obs.observe(c.user / 1e6, user);
      obs.observe(c.system / 1e6, system);
    });

    const rss = meter.createObservableUpDownCounter(METRIC.processMemoryUsage, {
      unit: 'By',
      description: 'Resident set size of the proxy process: its physical memory, the V8 heap and the buffers of streams in flight included.',
    });
    rss.addCallback((obs) => obs.observe(process.memoryUsage.rss()));

    const heapUsed = meter.createObservableUpDownCounter(METRIC.heapUsed, {
      unit: 'By',
      description: 'V8 heap memory in use, per heap space.',
    });
    // The convention's v8js.memory.heap.limit, renamed by it: the space's reserved size, not a limit.
    const heapSize = meter.createObservableUpDownCounter(METRIC.heapSpaceSize, {
      unit: 'By',
      description: 'V8 heap memory reserved, per heap space.',
    });
    const spaces = new Map<string, Attributes>();
    const space = (name: string) => {
      let a = spaces.get(name);
      if (a === undefined) spaces.set(name, (a = Object.freeze({ 'v8js.heap.space.name': name })));
      return a;
    };
    meter.addBatchObservableCallback(
      (obs) => {
        for (const s of getHeapSpaceStatistics()) {
          obs.observe(heapUsed, s.space_used_size, space(s.space_name));
          obs.observe(heapSize, s.space_size, space(s.space_name));
        }
      },
      [heapUsed, heapSize],
    );

    const gc: Histogram = meter.createHistogram(METRIC.gcDuration, {
      unit: 's',
      description: 'Garbage-collection pauses of the proxy process, by kind: the event loop (and every timestamp the proxy takes) waits while one runs.',
      advice: { explicitBucketBoundaries: [...GC_DURATION_BUCKETS] },
    });
    const kinds = new Map<number, Attributes>([
      [constants.NODE_PERFORMANCE_GC_MINOR, Object.freeze({ 'v8js.gc.type': 'minor' })],
      [constants.NODE_PERFORMANCE_GC_MAJOR, Object.freeze({ 'v8js.gc.type': 'major' })],
      [constants.NODE_PERFORMANCE_GC_INCREMENTAL, Object.freeze({ 'v8js.gc.type': 'incremental' })],
      [constants.NODE_PERFORMANCE_GC_WEAKCB, Object.freeze({ 'v8js.gc.type': 'weakcb' })],
    ]);
    // A kind a later Node adds is still a pause: kept under a custom value, as the convention allows.
    const other = Object.freeze({ 'v8js.gc.type': 'other' });
    this.gcObserver = new PerformanceObserver((list) => {
      for (const entry of list.getEntries()) {
        const kind = (entry as { detail?: { kind?: number } }).detail?.kind;
        gc.record(entry.duration / 1000, (kind !== undefined ? kinds.get(kind) : undefined) ?? other);
      }
    });
    this.gcObserver.observe({ entryTypes: ['gc'] });
  }

  shutdown(): void {
    this.gcObserver.disconnect();
  }
}
