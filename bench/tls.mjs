#!/usr/bin/env node
// TLS-upstream benchmark: what the proxy costs when its upstream speaks HTTPS, as every hosted
// LLM API does (`npm run bench` uses plain-HTTP upstreams). Not part of `npm run bench`; run
// after `npm run build`:
//   node bench/tls.mjs [--reps=3] [--scenarios=20x100,1.4x100] [--paths=direct,proxy,proxy-nometrics]
// For an A/B of two builds add `proxy-alt` and set BENCH_ALT_CLI=/other/dist/cli.js.
// An HTTPS emitter (a self-signed certificate the paths trust through NODE_EXTRA_CA_CERTS)
// sends event k of every stream in one pass at t0 + k·Δ, stamped with its scheduled time; the
// client (this process, plain HTTP to the path) checks every event's bytes and order. Direct
// means the client does TLS itself. Reported: latency (arrival − scheduled) quantiles, the
// path's CPU per event (all its threads, from the scheduler's runtime), events lost or altered.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { cpuMsOf, pathDefs } from './lib/paths.mjs';
import { arg, shared, killPathsOnExit, scenarios, until } from './lib/focused.mjs';
import { agg, fmt, fmtAgg, quant } from './lib/stats.mjs';

const REPS = Number(arg('reps', '3'));
const SCENARIOS = scenarios('20x100,1.4x100').map(({ delta, n, count }) => ({ delta, streams: n, events: count }));
const PATHS = arg('paths', 'direct,proxy,proxy-nometrics').split(',');
killPathsOnExit();

const tmpRoot = fs.mkdtempSync(path.join(os.tmpdir(), 'llm-proxy-tls-bench-'));
const key = path.join(tmpRoot, 'key.pem');
const cert = path.join(tmpRoot, 'cert.pem');
execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '2', '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost', '-keyout', key, '-out', cert], { stdio: 'ignore' });
process.env.NODE_EXTRA_CA_CERTS = cert; // inherited by the paths

// ---- the emitter: an OpenAI-style SSE upstream over TLS, on a batched schedule ----
const event = (i, k, sched) => `data: {"id":"c${i}","object":"chat.completion.chunk","created":1,"model":"bench","sched":${sched.toFixed(3)},"choices":[{"index":0,"delta":{"content":" tok${k}"},"finish_reason":null}]}\n\n`;
let waiting = [];
let expect = 0;
let onAll = () => {};
const emitter = https.createServer({ key: fs.readFileSync(key), cert: fs.readFileSync(cert), keepAliveTimeout: 60_000 }, (req, res) => {
  req.resume();
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    res.flushHeaders();
    waiting.push({ res, i: Number(new URL(req.url, 'https://x').searchParams.get('i')) });
    if (waiting.length === expect) onAll();
  });
});
await new Promise((r) => emitter.listen(0, '127.0.0.1', r));
const emitterPort = emitter.address().port;
const emitterUrl = `https://localhost:${emitterPort}`;

async function emit(streams, delta, events) {
  const t0 = shared() + 20;
  for (let k = 0; k < events; k++) {
    const due = t0 + k * delta;
    await until(due);
    for (const s of streams) s.res.write(event(s.i, k, due));
  }
  for (const s of streams) s.res.end('data: [DONE]\n\n');
}

// ---- the client ----
async function run(url, { delta, streams, events }, agent) {
  const lat = [];
  let lost = 0;
  let altered = 0;
  waiting = [];
  expect = streams;
  const all = new Promise((r) => (onAll = r));
  const done = [];
  for (let i = 0; i < streams; i++) {
    done.push(
      new Promise((resolve, reject) => {
        const mod = url.startsWith('https:') ? https : http;
        const req = mod.request(`${url}/v1/chat/completions?i=${i}`, { method: 'POST', agent, headers: { 'content-type': 'application/json' } }, (res) => {
          let buf = '';
          let next = 0;
          res.setEncoding('utf8');
          res.on('data', (d) => {
            const at = shared();
            buf += d;
            let j;
            while ((j = buf.indexOf('\n\n')) !== -1) {
              const ev = buf.slice(0, j + 2);
              buf = buf.slice(j + 2);
              if (ev === 'data: [DONE]\n\n') continue;
              const m = /"sched":([\d.]+),.*" tok(\d+)"/.exec(ev);
              const k = m ? Number(m[2]) : -1;
              if (k !== next || ev !== event(i, k, Number(m[1]))) altered++;
              next = k + 1;
              lat.push(at - Number(m[1]));
            }
          });
          res.on('end', () => {
            lost += events - next;
            resolve();
          });
          res.on('error', reject);
        });
        req.on('error', reject);
        req.end('{"model":"bench","stream":true}');
      }),
    );
  }
  await all;
  await emit(waiting, delta, events);
  await Promise.all(done);
  return { lat, lost, altered };
}

const defs = pathDefs({ emitterUrl, emitterPort, tmpRoot });
defs.direct = { start: async () => ({ url: emitterUrl, pids: () => [], stop: async () => {} }) };
const results = {};
for (let rep = 0; rep < REPS; rep++) {
  const order = rep % 2 === 0 ? PATHS : [PATHS[0], ...PATHS.slice(1).reverse()];
  for (const name of order) {
    const inst = await defs[name].start(`-tls${rep}`);
    const agent = inst.url.startsWith('https:') ? new https.Agent({ keepAlive: true, maxSockets: Infinity, ca: fs.readFileSync(cert) }) : new http.Agent({ keepAlive: true, maxSockets: Infinity });
    try {
      await run(inst.url, { delta: 20, streams: 5, events: 20 }, agent); // warm-up
      for (const sc of SCENARIOS) {
        const k = `${sc.delta}x${sc.streams}`;
        const cpu0 = cpuMsOf(inst.pids());
        const r = await run(inst.url, sc, agent);
        r.cpuUsPerEvent = ((cpuMsOf(inst.pids()) - cpu0) * 1000) / (sc.streams * sc.events);
        ((results[k] ??= {})[name] ??= []).push(r);
        process.stderr.write(`rep ${rep + 1} ${name} ${k}: p50 ${fmt(quant(r.lat, 0.5))} p99 ${fmt(quant(r.lat, 0.99))} ms, lost ${r.lost}, altered ${r.altered}, cpu ${fmt(r.cpuUsPerEvent, 1)} µs/event\n`);
      }
    } finally {
      agent.destroy();
      await inst.stop();
    }
  }
}

let out = `# TLS-upstream benchmark, ${new Date().toISOString()}\n\nNode ${process.version}, ${os.cpus().length} × ${os.cpus()[0]?.model.split(' ').slice(0, 2).join(' ')}, loopback; emitter (HTTPS) and client in one process, each path in its own. ${REPS} repetitions; median [min–max]. Times in ms; "added" = path − direct in the same repetition (direct: the client does TLS itself).\n\n`;
out += '| scenario | path | lat p50 | lat p99 | added p50 | added p99 | lost/altered | path CPU µs/event |\n|---|---|---|---|---|---|---|---|\n';
for (const [k, byPath] of Object.entries(results)) {
  const direct = byPath.direct ?? [];
  for (const [name, reps] of Object.entries(byPath)) {
    const q = (p) => reps.map((r) => quant(r.lat, p));
    const added = (p) => reps.map((r, i) => quant(r.lat, p) - quant(direct[i]?.lat ?? [NaN], p));
    const d = name === 'direct';
    out += `| ${k} | ${name} | ${fmtAgg(agg(q(0.5)))} | ${fmtAgg(agg(q(0.99)))} | ${d ? '' : fmtAgg(agg(added(0.5)))} | ${d ? '' : fmtAgg(agg(added(0.99)))} | ${reps.reduce((a, r) => a + r.lost, 0)}/${reps.reduce((a, r) => a + r.altered, 0)} | ${d ? '' : fmtAgg(agg(reps.map((r) => r.cpuUsPerEvent)), 1)} |\n`;
  }
}
console.log(out);
fs.writeFileSync(path.join(tmpRoot, 'tls.md'), out);
process.stderr.write(`wrote ${path.join(tmpRoot, 'tls.md')}\n`);
emitter.closeAllConnections();
emitter.close();
process.exit(0);
