#!/usr/bin/env node
// Micro-benchmark of the measurement alone (no sockets): ns per event through
// RequestMeter.chunk(), with 1 and with 20 events per read, for the bench's
// own chunks and for chunks shaped like OpenAI's (longer header, `logprobs`,
// `finish_reason` and a per-event `obfuscation` after the text).
// Run after `npm run build`:
//   node --expose-gc bench/micro/meter.mjs                 this build
//   node --expose-gc bench/micro/meter.mjs --ab=/other/dist  this build vs another, interleaved
//   ... --format=openai                                     one chunk shape only (e.g. with --cpu-prof)
// Then the proxy's own shape: reads of a chunked body, one HTTP chunk per event, through
// the ChunkedDecoder alone (what metrics off pays too) and with the meter on its payload.
// Last, µs per whole request: meter set-up, responseStart, a bench-shaped stream of
// 10 events (role, 8 contents, [DONE]) one per read, finish; and the same plus the body
// tap that reads the model from the bench's request body.
// Machine drift between two invocations is as large as most effects here
// (±15 %), so compare builds with --ab: both run in one process, alternately.
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { buildRequestBody, contentEvent, DONE_EVENT, roleEvent } from '../lib/sse.mjs';

const HERE = path.dirname(new URL(import.meta.url).pathname);
const abArg = process.argv.find((a) => a.startsWith('--ab='));
const dists = [path.resolve(HERE, '../../dist'), ...(abArg ? [path.resolve(abArg.slice(5))] : [])];

async function load(dist) {
  const imp = (p) => import(pathToFileURL(path.join(dist, p)).href);
  const [{ createTelemetry, SCOPE_NAME }, { Instruments }, { RequestMeter }, { openaiChat }, { RequestBodyTap }, { ChunkedDecoder }] = await Promise.all([
    imp('metrics/exporter.js'),
    imp('metrics/instruments.js'),
    imp('measure/request-meter.js'),
    imp('providers/openai-chat.js'),
    imp('proxy/request-info.js'),
    imp('proxy/chunked.js'),
  ]);
  const telemetry = createTelemetry({ prometheus: true });
  const ins = new Instruments(telemetry.provider.getMeter(SCOPE_NAME), undefined, { fast: telemetry.fast });
  return { name: dist, RequestMeter, openaiChat, RequestBodyTap, ChunkedDecoder, ins };
}

const labels = { provider: 'openai', operation: 'chat', requestModel: 'bench', serverAddress: '127.0.0.1' };
const opts = { maxEventBytes: 1 << 20, maxBodyBytes: 1 << 20 };

const openaiEvent = (k) => {
  const pad = 'abcdefghij'.slice(0, 1 + (k % 9)); // OpenAI pads each chunk with a random-length `obfuscation`
  return `data: {"id":"chatcmpl-3nw4QRRZYqML8cJ7WZ96vN5bX8kRR","object":"chat.completion.chunk","created":1756201234,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_746b3b2afb","choices":[{"index":0,"delta":{"content":" tok${k}"},"logprobs":null,"finish_reason":null}],"obfuscation":"${pad}"}\n\n`;
};
const FORMATS = { bench: (k) => contentEvent(7, k), openai: openaiEvent };
const formatArg = process.argv.find((a) => a.startsWith('--format='))?.slice(9);
if (formatArg !== undefined && !FORMATS[formatArg]) throw new Error(`--format: one of ${Object.keys(FORMATS).join(', ')}`);

function readsOf(format, perRead, events) {
  const reads = [];
  for (let k = 1; k <= events; k += perRead) {
    let s = '';
    for (let j = k; j < k + perRead; j++) s += FORMATS[format](j);
    reads.push(Buffer.from(s));
  }
  return reads;
}

function run(impl, reads, events) {
  const m = new impl.RequestMeter(impl.ins, impl.openaiChat.newAdapter(), labels, 0, opts);
  m.responseStart(200, 'text/event-stream', undefined);
  m.chunk(Buffer.from(roleEvent(7)), 1);
  const t0 = performance.now();
  let t = 2;
  for (const r of reads) m.chunk(r, (t += 1.4));
  const ns = ((performance.now() - t0) * 1e6) / events;
  m.finish(t + 1);
  return ns;
}

const impls = await Promise.all(dists.map(load));
const EVENTS = 100_000;
const ROUNDS = 7;

/** `measure(impl)` for every build, warmed up, then ROUNDS times alternately: "median .. min .." per build. */
function interleaved(measure, warmups, digits) {
  for (const impl of impls) for (let i = 0; i < warmups; i++) measure(impl);
  const res = impls.map(() => []);
  for (let i = 0; i < ROUNDS; i++) {
    impls.forEach((impl, j) => {
      globalThis.gc?.();
      res[j].push(measure(impl));
    });
  }
  return res
    .map((r, j) => {
      r.sort((a, b) => a - b);
      return `${impls.length > 1 ? `${j === 0 ? 'this' : 'other'} ` : ''}median ${r[ROUNDS >> 1].toFixed(digits)} min ${r[0].toFixed(digits)}`;
    })
    .join(' | ');
}

for (const format of formatArg ? [formatArg] : Object.keys(FORMATS)) {
  for (const perRead of [1, 20]) {
    const reads = readsOf(format, perRead, EVENTS);
    const line = interleaved((impl) => run(impl, reads, EVENTS), 3, 0);
    console.log(`${format.padEnd(6)} ${String(perRead).padStart(2)} event(s)/read: ns/event ${line}`);
  }
}

// ---- chunked reads, decoded and measured as the proxy does
function chunkedReadsOf(perRead, events) {
  return readsOf('bench', perRead, events).map((r) => {
    const evs = r.toString('latin1').split(/(?<=\n\n)/);
    return Buffer.from(evs.map((e) => `${e.length.toString(16)}\r\n${e}\r\n`).join(''), 'latin1');
  });
}
function runChunked(impl, reads, events, withMeter) {
  const dec = new impl.ChunkedDecoder();
  const m = new impl.RequestMeter(impl.ins, impl.openaiChat.newAdapter(), labels, 0, opts);
  m.responseStart(200, 'text/event-stream', undefined);
  m.chunk(Buffer.from(roleEvent(7)), 1);
  const t0 = performance.now();
  let t = 2;
  for (const r of reads) {
    dec.push(r);
    if (!withMeter) continue;
    t += 1.4;
    const g = dec.ranges;
    if (g !== undefined) for (let i = 0; i < g.length; i += 2) m.chunk(r, t, g[i], g[i + 1]);
    else for (const d of dec.data) m.chunk(d, t); // builds before ranges (--ab)
  }
  const ns = ((performance.now() - t0) * 1e6) / events;
  m.finish(t + 1);
  return ns;
}
for (const perRead of [1, 20]) {
  const reads = chunkedReadsOf(perRead, EVENTS);
  for (const withMeter of [false, true]) {
    const line = interleaved((impl) => runChunked(impl, reads, EVENTS, withMeter), 3, 0);
    console.log(`chunked ${String(perRead).padStart(2)} event(s)/read, ${withMeter ? 'decoder + meter' : 'decoder only   '}: ns/event ${line}`);
  }
}

// ---- per request
const REQUEST_READS = [roleEvent(7), ...Array.from({ length: 8 }, (_, k) => contentEvent(7, k + 1)), DONE_EVENT].map((e) => Buffer.from(e));
const REQUEST_BODY = Buffer.from(buildRequestBody());
function runRequests(impl, withTap, count) {
  const t0 = performance.now();
  for (let i = 0; i < count; i++) {
    if (withTap) {
      const tap = new impl.RequestBodyTap(opts.maxBodyBytes);
      tap.push(REQUEST_BODY);
      tap.model();
    }
    const m = new impl.RequestMeter(impl.ins, impl.openaiChat.newAdapter(), labels, 0, opts);
    m.responseStart(200, 'text/event-stream', undefined);
    let t = 10;
    for (const r of REQUEST_READS) m.chunk(r, (t += 1.4));
    m.finish(t + 1);
  }
  return ((performance.now() - t0) * 1000) / count;
}
const REQUESTS = 20_000;
for (const withTap of [false, true]) {
  const line = interleaved((impl) => runRequests(impl, withTap, REQUESTS), 1, 1);
  console.log(`request (10 events${withTap ? `, body tap on ${REQUEST_BODY.length} B` : ''}): µs/request ${line}`);
}
