// The Prometheus exposition at the series cap: every instrument filled to 2,000 label sets (six
// labels each, as a chat request through a route carries), its size in bytes and lines, and the
// heap a scrape holds from its collection until its client has read it (README: at most 4 in
// flight). `--old-ttft` renders the TTFT buckets as they were before 2026-12-05 (to 60 s) to
// price the three added since; `--old-itl` leaves out the six ITL/TPOT boundaries added between
// 15 and 60 ms (session 52). Needs the build (npm run build).
//   node --expose-gc bench/micro/exposition-size.mjs [--old-ttft] [--old-itl]
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const HERE = path.dirname(new URL(import.meta.url).pathname);
const imp = (p) => import(pathToFileURL(path.join(HERE, '../../dist', p)).href);
const [{ createTelemetry, SCOPE_NAME }, { Instruments }, { DEFAULT_BUCKETS }, { MAX_SERIES }] = await Promise.all([
  imp('metrics/exporter.js'),
  imp('metrics/instruments.js'),
  imp('metrics/semconv.js'),
  imp('metrics/fast-metrics.js'),
]);
if (typeof globalThis.gc !== 'function') throw new Error('run with node --expose-gc');
const oldTtft = process.argv.includes('--old-ttft');
// `--old-itl`: the ITL/TPOT buckets before the six between 15 and 60 ms (2026-12-05, session 52).
const oldItl = process.argv.includes('--old-itl');
const ADDED_ITL = new Set([0.0175, 0.0225, 0.0275, 0.035, 0.045, 0.06]);
const buckets = {
  ...DEFAULT_BUCKETS,
  ...(oldTtft ? { ttft: DEFAULT_BUCKETS.ttft.filter((b) => b <= 60) } : {}),
  ...(oldItl ? { itl: DEFAULT_BUCKETS.itl.filter((b) => !ADDED_ITL.has(b)) } : {}),
};
const telemetry = createTelemetry({ prometheus: true });
const ins = new Instruments(telemetry.provider.getMeter(SCOPE_NAME), buckets, { fast: telemetry.fast, perTokenItl: true });
const histograms = [ins.ttft, ins.chunkGap, ins.tpot, ins.duration, ins.tokenUsage, ins.timeToFirstByte, ins.upstreamConnect, ins.serverTtft, ins.serverTpot, ins.serverDuration];
// Past the cap, so the overflow series is there too.
for (let i = 0; i < MAX_SERIES + 100; i++) {
  const model = `gpt-4o-mini-2024-07-18-${i}`;
  const a = { 'gen_ai.provider.name': 'openai', 'gen_ai.operation.name': 'chat', 'server.address': 'api.openai.com', 'server.port': 443, 'gen_ai.request.model': model, 'gen_ai.response.model': model };
  for (const h of histograms) h.record(0.05 + i * 1e-4, a);
  ins.perTokenItl.recordTimes(0.01, 2, a);
  ins.streams.add(1, a);
  ins.streamsActive.add(1, a);
}
let bytes = 0;
let lines = 0;
for await (const piece of telemetry.scrape()) {
  bytes += Buffer.byteLength(piece);
  for (let i = piece.indexOf('\n'); i !== -1; i = piece.indexOf('\n', i + 1)) lines++;
}
globalThis.gc();
globalThis.gc();
const before = process.memoryUsage().heapUsed;
// Scrapes that collected and sent their first piece, then wait for a client that does not read.
const held = [];
for (let k = 0; k < 4; k++) {
  const scrape = telemetry.scrape();
  held.push([scrape, await scrape.next()]);
}
globalThis.gc();
globalThis.gc();
const perScrape = (process.memoryUsage().heapUsed - before) / held.length;
console.log(
  `${[oldTtft && 'TTFT buckets to 60 s', oldItl && 'ITL buckets before session 52'].filter(Boolean).join(', ') || 'default buckets'}: exposition ${(bytes / 1e6).toFixed(1)} MB, ${lines} lines; ` +
    `heap held per waiting scrape ${(perScrape / 1e6).toFixed(1)} MB`,
);
await telemetry.shutdown();
