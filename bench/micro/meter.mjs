#!/usr/bin/env node
// Micro-benchmark of the measurement alone (no sockets): ns and bytes allocated
// per OpenAI chat event through RequestMeter.chunk(), with 1 and with 20 events
// per read. Run after `npm run build`:  node --expose-gc bench/micro/meter.mjs
import { performance } from 'node:perf_hooks';
import { createTelemetry, SCOPE_NAME } from '../../dist/metrics/exporter.js';
import { Instruments } from '../../dist/metrics/instruments.js';
import { RequestMeter } from '../../dist/measure/request-meter.js';
import { openaiChat } from '../../dist/providers/openai-chat.js';
import { contentEvent, roleEvent } from '../lib/sse.mjs';

const telemetry = createTelemetry({ prometheus: true });
const ins = new Instruments(telemetry.provider.getMeter(SCOPE_NAME), undefined, { fast: telemetry.fast });
const labels = { provider: 'openai', operation: 'chat', requestModel: 'bench', serverAddress: '127.0.0.1' };
const opts = { maxEventBytes: 1 << 20, maxBodyBytes: 1 << 20 };

function run(perRead, events) {
  const reads = [];
  for (let k = 1; k <= events; k += perRead) {
    let s = '';
    for (let j = k; j < k + perRead; j++) s += contentEvent(7, j);
    reads.push(Buffer.from(s));
  }
  const m = new RequestMeter(ins, openaiChat.newAdapter(), labels, 0, opts);
  m.responseStart(200, 'text/event-stream', undefined);
  m.chunk(Buffer.from(roleEvent(7)), 1);
  const heap0 = process.memoryUsage().heapUsed;
  const t0 = performance.now();
  let t = 2;
  for (const r of reads) m.chunk(r, (t += 1.4));
  const ns = ((performance.now() - t0) * 1e6) / events;
  const heap = process.memoryUsage().heapUsed - heap0;
  m.finish(t + 1);
  return { ns, bytes: heap / events };
}

const EVENTS = 200_000;
for (const perRead of [1, 20]) {
  for (let i = 0; i < 3; i++) run(perRead, 20_000); // warm-up
  const res = [];
  for (let i = 0; i < 5; i++) {
    globalThis.gc?.();
    res.push(run(perRead, EVENTS));
  }
  res.sort((a, b) => a.ns - b.ns);
  const med = res[2];
  console.log(`${perRead} event(s)/read: ${med.ns.toFixed(0)} ns/event, ~${med.bytes.toFixed(0)} B allocated/event (heap growth, GC may hide some)`);
}
