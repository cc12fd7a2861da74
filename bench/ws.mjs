#!/usr/bin/env node
// WebSocket benchmark: what the proxy adds to the messages of an OpenAI Realtime session, next
// to a direct connection and nginx, with the proxy's measurement on and off; and whether its
// Realtime figures match what the client saw. Not part of `npm run bench` (whose paths speak
// HTTP); run after `npm run build`:
//   node bench/ws.mjs [--reps=3] [--scenarios=20x1,20x100,1.4x100] [--paths=direct,proxy,proxy-nometrics,nginx] [--profile[=DIR]]
// The ground-truth emitter (a Realtime upstream) and the client share this process and its
// clock; each path is a process of its own. Per scenario (Δ ms × sessions), every session sends
// a response.create, and the emitter writes delta k of every session in one pass at
// t0 + k·Δ (the batched pattern of the HTTP bench), each stamped with its scheduled time.
// Added latency = (arrival − scheduled) quantile through the path − the same through direct,
// in the same repetition; paths alternate, reversed every second repetition.
import os from 'node:os';
import fs from 'node:fs';
import path from 'node:path';
import { WebSocket, WebSocketServer } from 'ws';
import { children, cpuMsOf, freePort, killAllSync, pathDefs } from './lib/paths.mjs';
import { arg, shared, killPathsOnExit, scenarios, sleep, until } from './lib/focused.mjs';
import { agg, fmt, fmtAgg, quant } from './lib/stats.mjs';

const REPS = Number(arg('reps', '3'));
const SCENARIOS = scenarios('20x1,20x100,1.4x100').map(({ delta, n, count }) => ({ delta, sessions: n, messages: count }));
const PATHS = arg('paths', 'direct,proxy,proxy-nometrics,nginx').split(',');
killPathsOnExit();

// ---- the emitter: a Realtime upstream on a batched schedule ----
const emitterPort = await freePort();
const wss = new WebSocketServer({ host: '127.0.0.1', port: emitterPort, perMessageDeflate: false });
/** Sessions that asked for a response in the current run. */
let waiting = [];
let expectSessions = 0;
let onAllAsked = () => {};
// The API's own key order (type first, delta last), with the schedule stamp among the keys
// before the delta: a stamp after it would send every message down the proxy's slow path.
const payload = (i, k, sched) => `{"type":"response.output_text.delta","event_id":"e${i}_${k}","response_id":"r${i}","item_id":"i${i}","output_index":0,"content_index":0,"sched":${sched.toFixed(3)},"delta":" tok${k}"}`;
wss.on('connection', (ws, req) => {
  const i = Number(new URL(req.url, 'http://x').searchParams.get('i'));
  ws.send(JSON.stringify({ type: 'session.created', session: { model: 'bench' } }));
  ws.on('message', (d) => {
    if (JSON.parse(d.toString()).type !== 'response.create') return;
    ws.send(JSON.stringify({ type: 'response.created', response: { id: `r${i}` } }));
    waiting.push({ ws, i });
    if (waiting.length === expectSessions) onAllAsked();
  });
});

/** Writes every delta of the run on the shared clock; returns the emitter's lateness p99 (ms). */
async function emit(sessions, delta, messages) {
  const t0 = shared() + 20;
  const late = [];
  for (let k = 0; k < messages; k++) {
    const due = t0 + k * delta;
    await until(due);
    late.push(shared() - due);
    for (const s of sessions) s.ws.send(payload(s.i, k, due));
  }
  for (const s of sessions) s.ws.send(JSON.stringify({ type: 'response.done', response: { id: `r${s.i}`, status: 'completed', usage: { output_tokens: messages } } }));
  return quant(late, 0.99);
}

// ---- the client ----
async function run(url, { delta, sessions, messages }) {
  const clients = [];
  const lat = [];
  const gaps = [];
  let lost = 0;
  let altered = 0;
  for (let i = 0; i < sessions; i++) {
    const ws = new WebSocket(`${url.replace(/^http/, 'ws')}/v1/realtime?model=bench&i=${i}`, { perMessageDeflate: false });
    const c = { ws, i, next: 0, last: -1, first: -1, done: undefined };
    c.done = new Promise((resolve, reject) => {
      ws.on('error', reject);
      ws.on('message', (d) => {
        const at = shared();
        const s = d.toString();
        if (s.startsWith('{"type":"response.output_text.delta"')) {
          const m = /"sched":([\d.]+),"delta":" tok(\d+)"\}$/.exec(s);
          const k = m ? Number(m[2]) : -1;
          if (k !== c.next || s !== payload(i, k, Number(m[1]))) altered++;
          c.next = k + 1;
          lat.push(at - Number(m[1]));
          if (c.last >= 0) gaps.push(at - c.last);
          else c.first = at;
          c.last = at;
        } else if (s.includes('"response.done"')) {
          lost += messages - c.next;
          resolve();
        }
      });
    });
    await new Promise((r, j) => ws.once('open', r).once('error', j));
    clients.push(c);
  }
  waiting = [];
  expectSessions = sessions;
  const asked = new Promise((r) => (onAllAsked = r));
  for (const c of clients) c.ws.send(JSON.stringify({ type: 'response.create' }));
  await asked;
  const emitterLate = await emit(waiting, delta, messages);
  await Promise.all(clients.map((c) => c.done));
  const tpot = clients.map((c) => (c.last - c.first) / (messages - 1));
  for (const c of clients) c.ws.close();
  await sleep(100);
  return { lat, gaps, lost, altered, emitterLate, tpotMean: tpot.reduce((a, b) => a + b, 0) / tpot.length };
}

async function scrapeRealtime(metricsUrl) {
  const text = await (await fetch(metricsUrl)).text();
  const sum = (name) =>
    text
      .split('\n')
      .filter((l) => l.startsWith(`${name}{`) && l.includes('gen_ai_operation_name="realtime"'))
      .reduce((a, l) => a + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
  return {
    gapSum: sum('gen_ai_client_operation_time_per_output_chunk_seconds_sum'),
    gapCount: sum('gen_ai_client_operation_time_per_output_chunk_seconds_count'),
    tpotSum: sum('gen_ai_server_time_per_output_token_seconds_sum'),
    tpotCount: sum('gen_ai_server_time_per_output_token_seconds_count'),
  };
}

const tmpRoot = fs.mkdtempSync(path.join(os.tmpdir(), 'llm-proxy-ws-bench-'));
// --profile[=DIR]: the proxy paths run under --cpu-prof (summarise with bench/profile-summary.mjs).
const profArg = process.argv.find((a) => a === '--profile' || a.startsWith('--profile='));
const profileDir = profArg === undefined ? null : profArg.includes('=') ? profArg.slice(10) : path.join(tmpRoot, 'profiles');
const defs = pathDefs({ emitterUrl: `http://127.0.0.1:${emitterPort}`, emitterPort, tmpRoot, profileDir, websocket: true });
const results = {}; // scenario -> path -> [rep results]
for (let rep = 0; rep < REPS; rep++) {
  const order = rep % 2 === 0 ? PATHS : [PATHS[0], ...PATHS.slice(1).reverse()];
  for (const name of order) {
    const inst = await defs[name].start(`-ws${rep}`);
    try {
      await run(inst.url, { delta: 20, sessions: 5, messages: 20 }); // warm-up
      for (const sc of SCENARIOS) {
        const key = `${sc.delta}x${sc.sessions}`;
        const before = inst.metricsUrl ? await scrapeRealtime(inst.metricsUrl) : undefined;
        const cpu0 = cpuMsOf(inst.pids());
        const r = await run(inst.url, sc);
        r.cpuMs = cpuMsOf(inst.pids()) - cpu0;
        if (before) {
          const after = await scrapeRealtime(inst.metricsUrl);
          r.proxyGapMean = ((after.gapSum - before.gapSum) / (after.gapCount - before.gapCount)) * 1000;
          r.proxyGapCount = after.gapCount - before.gapCount;
          r.proxyTpotMean = ((after.tpotSum - before.tpotSum) / (after.tpotCount - before.tpotCount)) * 1000;
        }
        ((results[key] ??= {})[name] ??= []).push(r);
        process.stderr.write(`rep ${rep + 1} ${name} ${key}: p50 ${fmt(quant(r.lat, 0.5))} p99 ${fmt(quant(r.lat, 0.99))} ms, lost ${r.lost}, altered ${r.altered}, cpu ${fmt(r.cpuMs, 0)} ms\n`);
      }
    } finally {
      await inst.stop();
    }
  }
}

let out = `# WebSocket (OpenAI Realtime) benchmark, ${new Date().toISOString()}\n\nNode ${process.version}, ${os.cpus().length} × ${os.cpus()[0]?.model.split(' ').slice(0, 2).join(' ')}, loopback; emitter and client in one process, each path in its own. ${REPS} repetitions; median [min–max]. Times in ms. "Added" = path − direct in the same repetition.\n\n`;
out += '| scenario | path | lat p50 | added p50 | added p99 | lost/altered | path CPU ms | proxy gap mean − client | proxy TPOT mean − client |\n|---|---|---|---|---|---|---|---|---|\n';
for (const [key, byPath] of Object.entries(results)) {
  const direct = byPath.direct ?? [];
  for (const [name, reps] of Object.entries(byPath)) {
    const p50 = reps.map((r) => quant(r.lat, 0.5));
    const added50 = reps.map((r, i) => quant(r.lat, 0.5) - quant(direct[i]?.lat ?? [NaN], 0.5));
    const added99 = reps.map((r, i) => quant(r.lat, 0.99) - quant(direct[i]?.lat ?? [NaN], 0.99));
    const clientGap = (r) => r.gaps.reduce((a, b) => a + b, 0) / r.gaps.length;
    const acc = reps[0].proxyGapMean !== undefined ? fmtAgg(agg(reps.map((r) => r.proxyGapMean - clientGap(r))), 3) : '';
    const accT = reps[0].proxyTpotMean !== undefined ? fmtAgg(agg(reps.map((r) => r.proxyTpotMean - r.tpotMean)), 3) : '';
    const loss = `${reps.reduce((a, r) => a + r.lost, 0)}/${reps.reduce((a, r) => a + r.altered, 0)}`;
    out += `| ${key} | ${name} | ${fmtAgg(agg(p50))} | ${name === 'direct' ? '' : fmtAgg(agg(added50))} | ${name === 'direct' ? '' : fmtAgg(agg(added99))} | ${loss} | ${name === 'direct' ? '' : fmtAgg(agg(reps.map((r) => r.cpuMs)), 0)} | ${acc} | ${accT} |\n`;
  }
}
console.log(out);
fs.writeFileSync(path.join(tmpRoot, 'ws.md'), out);
process.stderr.write(`wrote ${path.join(tmpRoot, 'ws.md')}\n`);
wss.close();
killAllSync();
void children;
process.exit(0);
