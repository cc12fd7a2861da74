#!/usr/bin/env node
// Micro-benchmark of the WebSocket measurement alone (no sockets): µs per server message
// through WsSession (frame reading, JSON, the response's meter), for OpenAI Realtime text
// deltas (~190 B) and audio deltas (100 ms of 24 kHz PCM16: 6.4 KB of base64), each as one
// read, uncompressed and with permessage-deflate (zlib on the thread pool: wall time per
// message, the inflation included), CPU of the process (zlib's threads included) and wall
// time per message. The tunnel forwards a read before it calls the measurement, so this is
// work done after the bytes left, not delay.
// Run after `npm run build`:  node --expose-gc bench/micro/ws-meter.mjs
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import zlib from 'node:zlib';

const HERE = path.dirname(new URL(import.meta.url).pathname);
const dist = path.resolve(HERE, '../../dist');
const imp = (p) => import(pathToFileURL(path.join(dist, p)).href);
const [{ createTelemetry, SCOPE_NAME }, { Instruments }, { WsSession, detectWsApi }] = await Promise.all([
  imp('metrics/exporter.js'),
  imp('metrics/instruments.js'),
  imp('ws/session.js'),
]);
const telemetry = createTelemetry({ prometheus: true });
const ins = new Instruments(telemetry.provider.getMeter(SCOPE_NAME), undefined, { fast: telemetry.fast });

/** A server frame (unmasked), optionally compressed with the given raw deflate stream. */
function serverFrame(payload, rsv1) {
  const n = payload.length;
  const head = n < 126 ? Buffer.from([0x81 | (rsv1 ? 0x40 : 0), n]) : Buffer.from([0x81 | (rsv1 ? 0x40 : 0), 126, n >> 8, n & 0xff]);
  return Buffer.concat([head, payload]);
}
/** Messages as permessage-deflate with context takeover sends them. */
async function compressAll(texts) {
  const z = zlib.createDeflateRaw();
  let out = [];
  z.on('data', (c) => out.push(c));
  const result = [];
  for (const t of texts) {
    z.write(Buffer.from(t));
    await new Promise((r) => z.flush(zlib.constants.Z_SYNC_FLUSH, r));
    const all = Buffer.concat(out);
    out = [];
    result.push(all.subarray(0, all.length - 4));
  }
  z.destroy();
  return result;
}

const AUDIO = Buffer.alloc(4800, 7).map((_, i) => (i * 31) & 0xff).toString('base64');
const delta = (kind, k) =>
  kind === 'audio'
    ? JSON.stringify({ type: 'response.output_audio.delta', event_id: `event_${k}`, response_id: 'resp_1', item_id: 'item_1', output_index: 0, content_index: 0, delta: AUDIO })
    : JSON.stringify({ type: 'response.output_text.delta', event_id: `event_${k}`, response_id: 'resp_1', item_id: 'item_1', output_index: 0, content_index: 0, delta: ` tok${k}` });

async function run(kind, deflate, n) {
  const match = detectWsApi('/v1/realtime?model=gpt-realtime');
  let finished;
  const done = new Promise((r) => (finished = r));
  const s = new WsSession(match, {
    onResponse: () => finished(),
    instruments: ins,
    labels: { provider: 'openai', operation: 'realtime', requestModel: 'gpt-realtime', serverAddress: '127.0.0.1' },
    meter: { maxEventBytes: 1 << 20, maxBodyBytes: 1 << 20 },
    deflate,
    limitModel: (m) => m,
  });
  const texts = [JSON.stringify({ type: 'response.created', response: { id: 'resp_1' } })];
  for (let k = 0; k < n; k++) texts.push(delta(kind, k));
  texts.push(JSON.stringify({ type: 'response.done', response: { id: 'resp_1', status: 'completed', usage: { output_tokens: n } } }));
  const payloads = deflate ? await compressAll(texts) : texts.map((t) => Buffer.from(t));
  const frames = payloads.map((p) => serverFrame(p, deflate));
  globalThis.gc?.();
  // A realistic pace would be one message per read: all reads are pushed, then zlib drains.
  const t0 = performance.now();
  const c0 = process.cpuUsage();
  for (let i = 0; i < frames.length; i++) s.fromUpstream(frames[i], i);
  await done;
  const c = process.cpuUsage(c0);
  const wall = ((performance.now() - t0) * 1000) / frames.length;
  s.close(frames.length, undefined);
  return `${(((c.user + c.system) / frames.length)).toFixed(1)} µs CPU, ${wall.toFixed(1)} wall`;
}

const N = 2000;
for (let rep = 0; rep < 3; rep++) {
  const row = [];
  for (const kind of ['text', 'audio']) for (const deflate of [false, true]) row.push(`${kind}${deflate ? '+deflate' : ''} ${await run(kind, deflate, N)}`);
  console.log(`rep ${rep + 1}: ${row.join(' | ')} (per message, ${N} messages; CPU of the whole process, zlib's threads included)`);
}
await telemetry.shutdown?.();
