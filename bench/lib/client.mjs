// Load client. Runs as its own process (not the emitter's, not the path's),
// controlled over IPC by bench/run.mjs. Timestamps every event on arrival with
// performance.now(), parses the SSE stream incrementally and checks that every
// event arrived once, in order, with identical bytes.
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import { SseSplitter, placeEvent, buildRequestBody, tagOf } from './sse.mjs';
import { origin } from './clock.mjs'; // origin + performance.now(): the clock the bench's processes share ("shared ms")
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity, maxFreeSockets: 2048 });
// Every request carries a tag of its own (the body's `user` field, which the emitter reads
// back): a path that hands one request's stream to another client (a pooled-connection mix-up)
// is caught, although every stream is well-formed.
let tagCounter = 0;

/** raw data of the last stream run, analysed on request */
let last = null;
/** held streams (memory scenario) */
let held = [];

function openStream(url, headers, n, onEvent) {
  // Returns a record filled while the stream runs; resolves when it ends.
  const tag = ++tagCounter;
  const body = buildRequestBody({ user: tagOf(tag) });
  const rec = {
    sid: -1,
    tag,
    n,
    start: 0,
    arr: new Float64Array(n + 3).fill(NaN),
    got: 0, // the position of the next expected event
    received: 0, // events received
    skipped: 0, // positions a later event jumped over: lost in the middle of the stream
    mismatched: 0,
    merged: 0,
    extra: 0, // beyond the end, or a position already passed (a duplicate)
    coalesced: 0,
    status: 0,
    /** the start of the body of a non-200 answer (a path's error page) */
    body: '',
    error: null,
    ended: false,
    req: null,
  };
  const done = new Promise((resolve) => {
    const u = new URL(url);
    const req = http.request(
      {
        host: u.hostname,
        port: u.port,
        path: '/v1/chat/completions',
        method: 'POST',
        agent,
        headers: {
          'content-type': 'application/json',
          accept: 'text/event-stream',
          authorization: 'Bearer sk-bench',
          'content-length': Buffer.byteLength(body),
          ...headers,
        },
      },
      (res) => {
        rec.status = res.statusCode;
        // The emitter names the stream in a header too: an altered first event then does not
        // make every later one of the stream compare against another stream's bytes.
        const sid = Number(res.headers['x-bench-sid']);
        if (sid > 0) rec.sid = sid;
        res.on('error', (err) => {
          rec.error = rec.error || String(err.message || err);
          resolve(rec);
        });
        res.on('close', () => resolve(rec));
        if (res.statusCode !== 200) {
          // The path answered with an error instead of the stream: keep what it said.
          res.on('data', (chunk) => {
            if (rec.body.length < 300) rec.body += chunk.toString('latin1').slice(0, 300 - rec.body.length);
          });
          res.on('end', () => {
            rec.ended = true;
            resolve(rec);
          });
          return;
        }
        const sp = new SseSplitter();
        const evs = [];
        res.on('data', (chunk) => {
          const t = performance.now();
          evs.length = 0;
          sp.push(chunk, evs);
          for (let j = 0; j < evs.length; j++) {
            const first = placeEvent(rec, evs[j], n);
            if (first < 0) continue;
            if (j > 0) rec.coalesced++;
            for (let k = first; k < rec.got; k++) rec.arr[k] = t;
            if (onEvent) for (let k = first; k < rec.got; k++) onEvent(rec, k);
          }
        });
        res.on('end', () => {
          rec.ended = true;
          if (sp.rest.length) rec.mismatched++;
          resolve(rec);
        });
      },
    );
    rec.req = req;
    req.on('error', (err) => {
      rec.error = rec.error || String(err.message || err);
      resolve(rec);
    });
    rec.start = performance.now();
    req.end(body);
  });
  rec.done = done;
  return rec;
}

/**
 * Closes the agent's idle connections, so that a run opens its own. A connection kept
 * from an earlier run can meet the server's keep-alive timeout (Node's default: 5 s) just
 * as it is reused, and the request fails with ECONNRESET: a race of the harness, not of
 * the path. Runs of one path can be ~5 s apart (another path's run in between).
 */
function dropIdle() {
  let n = 0;
  for (const list of Object.values(agent.freeSockets)) {
    for (const s of [...list]) {
      s.destroy();
      n++;
    }
  }
  return n;
}

function withDeadline(promises, ms) {
  let t;
  return Promise.race([
    Promise.all(promises).then(() => false),
    new Promise((r) => {
      t = setTimeout(() => r(true), ms);
    }),
  ]).finally(() => clearTimeout(t));
}

async function streamRun(m) {
  const cpu0 = process.cpuUsage();
  const w0 = performance.now();
  const recs = [];
  const rounds = m.rounds || 1;
  const seq = m.sequential || false;
  let timedOut = false;
  for (let r = 0; r < rounds && !timedOut; r++) {
    if (seq) {
      for (let i = 0; i < m.c && !timedOut; i++) {
        const rec = openStream(m.url, m.headers, m.n);
        recs.push(rec);
        timedOut = await withDeadline([rec.done], m.deadlineMs);
      }
    } else {
      const batch = [];
      for (let i = 0; i < m.c; i++) batch.push(openStream(m.url, m.headers, m.n));
      recs.push(...batch);
      timedOut = await withDeadline(
        batch.map((b) => b.done),
        m.deadlineMs,
      );
    }
  }
  if (timedOut)
    for (const r of recs)
      if (!r.ended) {
        r.cutByDeadline = true;
        r.req.destroy();
      }
  const cpu = process.cpuUsage(cpu0);
  last = { recs, m, wallMs: performance.now() - w0, cpuMs: (cpu.user + cpu.system) / 1000, timedOut };
  return { ok: true, timedOut };
}

function q(sorted, p) {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(p * (sorted.length - 1) + 0.5))];
}
function summarize(values) {
  const a = Float64Array.from(values).sort();
  let sum = 0;
  for (const v of a) sum += v;
  return {
    n: a.length,
    p50: q(a, 0.5),
    p90: q(a, 0.9),
    p99: q(a, 0.99),
    max: a.length ? a[a.length - 1] : NaN,
    min: a.length ? a[0] : NaN,
    mean: a.length ? sum / a.length : NaN,
    sum,
  };
}

/**
 * Where the events above the reported latency p99 sit: in how many distinct ticks (event
 * indexes k), and how many in the first three ticks of their stream. Few ticks
 * means stalls that hit every stream at once (GC, the path descheduled); many
 * means a cost paid in most ticks (draining a burst); many in the first ticks
 * means the start-up of the run.
 */
function tailShape(lat, latTick, n, p99) {
  if (lat.length < 100) return null;
  const ticks = new Set();
  let events = 0;
  let first3 = 0;
  for (let i = 0; i < lat.length; i++) {
    if (lat[i] <= p99) continue;
    events++;
    ticks.add(latTick[i]);
    if (latTick[i] <= 3) first3++;
  }
  return { p99, events, ticks: ticks.size, ticksTotal: n, first3 };
}

// Where each first event's time went, on the shared clock: the request leg (client
// start -> the emitter has the request) and the response leg (the emitter writes event 1 ->
// the client has it); the emitter's own wait and lateness are in neither. A leg over
// STALL_MS is counted as stalled: their p50s are 0.1-0.8 ms, and on this VM a woken process
// now and then waits for the next scheduler tick (4 ms).
const STALL_MS = 1.5;
function ttftLegShape(legs) {
  if (legs.length === 0) return undefined;
  const q50 = (i) => q(Float64Array.from(legs, (l) => l[i]).sort(), 0.5);
  let reqStalled = 0;
  let respStalled = 0;
  for (const l of legs) {
    if (l[1] > STALL_MS) reqStalled++;
    if (l[2] > STALL_MS) respStalled++;
  }
  const slowest = legs
    .slice()
    .sort((a, b) => b[0] - a[0])
    .slice(0, Math.max(1, Math.ceil(legs.length / 100)))
    .map(([t, rq, rs]) => `${t.toFixed(2)} (req ${rq.toFixed(2)}, resp ${rs.toFixed(2)})`)
    .join(', ');
  // What is left of each TTFT once its two legs and the emitter's wait (having the request ->
  // writing the first token) are taken out: 0 (to rounding) when all four come from the right
  // stamps; a TTFT or a leg taken at another event or stamp leaves its difference.
  let restMin = Infinity;
  let restMax = -Infinity;
  for (const [t, rq, rs, wait] of legs) {
    restMin = Math.min(restMin, t - rq - rs - wait);
    restMax = Math.max(restMax, t - rq - rs - wait);
  }
  return { n: legs.length, reqP50: q50(1), respP50: q50(2), reqStalled, respStalled, restMin, restMax, slowest };
}

function analyze(m) {
  // m.t0BySid: sid -> shared ms of due(1); m.delta: ms; m.window: [from, to] shared ms (events arrived in it are counted)
  const { recs } = last;
  const n = last.m.n;
  const lat = [];
  const latTick = []; // the tick (event index k) of each latency sample, for the tail's shape
  const gaps = [];
  const ttft = [];
  const ttftLegs = []; // [TTFT, request leg, response leg] per request (staggered runs)
  let tpotSum = 0;
  let tpotCount = 0;
  // The same three figures as the upstream (the emitter) sent them, over the same streams.
  const up = { ttft: { sum: 0, count: 0 }, itl: { sum: 0, count: 0 }, tpot: { sum: 0, count: 0 } };
  let lost = 0;
  let undelivered = 0;
  let merged = 0;
  let mismatched = 0;
  let extra = 0;
  let coalesced = 0;
  let events = 0;
  // Streams that carried another request's events (the emitter saw a different tag for the
  // stream id they got), and streams whose request reached the emitter without a tag.
  let misrouted = 0;
  let untagged = 0;
  let errors = 0;
  let incomplete = 0;
  // Requests the path answered with an error status, or dropped before any answer: the
  // path refused them. Counted apart from the events lost or altered in a stream it served.
  let refused = 0;
  const refusedSamples = [];
  let maxGap = 0;
  const statuses = {};
  const errorSamples = [];
  for (const r of recs) {
    statuses[r.status] = (statuses[r.status] || 0) + 1;
    if (r.status !== 200 && !r.cutByDeadline) {
      refused++;
      if (refusedSamples.length < 3)
        refusedSamples.push(r.status ? `HTTP ${r.status}: ${JSON.stringify(r.body.slice(0, 160))}` : `no answer: ${r.error ?? 'closed'}`);
      continue;
    }
    if (r.error) {
      errors++;
      if (errorSamples.length < 3) errorSamples.push(r.error);
    }
    const expected = n + 3;
    lost += r.skipped;
    if (r.got < expected) {
      // a stream cut by the run's deadline is "undelivered" (too slow), one
      // that ended or failed without its events is "lost"
      if (r.cutByDeadline) undelivered += expected - r.got;
      else lost += expected - r.got;
      incomplete++;
    }
    if (m.tagBySid && r.sid >= 0) {
      const tag = m.tagBySid[r.sid];
      if (tag === undefined) untagged++;
      else if (tag !== r.tag) misrouted++;
    }
    merged += r.merged;
    mismatched += r.mismatched;
    extra += r.extra;
    coalesced += r.coalesced;
    events += r.received;
    const t0 = m.t0BySid ? m.t0BySid[r.sid] : undefined;
    const sent1 = m.sent1BySid?.[r.sid];
    const sentLast = m.sentLastBySid?.[r.sid];
    if (!Number.isNaN(r.arr[1])) {
      ttft.push(r.arr[1] - r.start);
      const arrival = m.arrivals?.[r.sid];
      if (sent1 !== undefined && arrival !== undefined) {
        up.ttft.sum += sent1 - arrival;
        up.ttft.count++;
      }
      if (t0 !== undefined && sent1 !== undefined && m.ttftMs !== undefined)
        ttftLegs.push([r.arr[1] - r.start, t0 - m.ttftMs - (origin + r.start), origin + r.arr[1] - sent1, sent1 - (t0 - m.ttftMs)]);
    }
    for (let k = 1; k <= n; k++) {
      const a = r.arr[k];
      if (Number.isNaN(a)) continue;
      if (t0 !== undefined) {
        lat.push(origin + a - (t0 + (k - 1) * m.delta));
        latTick.push(k);
      }
      if (k >= 2 && !Number.isNaN(r.arr[k - 1])) {
        const g = a - r.arr[k - 1];
        gaps.push(g);
        if (g > maxGap) maxGap = g;
      }
    }
    if (n >= 2 && !Number.isNaN(r.arr[1]) && !Number.isNaN(r.arr[n])) {
      tpotSum += (r.arr[n] - r.arr[1]) / (n - 1);
      tpotCount++;
      if (sent1 !== undefined && sentLast !== undefined) {
        up.itl.sum += sentLast - sent1;
        up.itl.count += n - 1;
        up.tpot.sum += (sentLast - sent1) / (n - 1);
        up.tpot.count++;
      }
    }
  }
  const latency = summarize(lat);
  let windowEvents;
  if (m.window) {
    const a = m.window[0] - origin;
    const b = m.window[1] - origin;
    windowEvents = 0;
    for (const r of recs) for (let i = 0; i < r.got; i++) if (r.arr[i] >= a && r.arr[i] <= b) windowEvents++; // NaN (skipped) never counts
  }
  return {
    streams: recs.length,
    windowEvents,
    events,
    lost,
    undelivered,
    merged,
    mismatched,
    extra,
    misrouted,
    untagged,
    coalesced,
    errors,
    errorSamples,
    incomplete,
    refused,
    refusedSamples,
    statuses,
    timedOut: last.timedOut,
    wallMs: last.wallMs,
    cpuMs: last.cpuMs,
    latency,
    latencyTail: tailShape(lat, latTick, n, latency.p99),
    gap: summarize(gaps),
    maxGap,
    ttft: summarize(ttft),
    ttftLegs: ttftLegShape(ttftLegs),
    tpot: { sum: tpotSum, count: tpotCount },
    upstream: up.ttft.count > 0 ? up : undefined,
  };
}

async function holdOpen(m) {
  // Open m.c more streams in hold mode; resolve when each has its role chunk.
  const pending = [];
  for (let i = 0; i < m.c; i++) {
    let ok;
    const p = new Promise((r) => (ok = r));
    const rec = openStream(m.url, m.headers, 0, (rec, i) => {
      if (i === 0) ok();
    });
    rec.done.then(() => ok());
    held.push(rec);
    pending.push(p);
  }
  const timedOut = await withDeadline(pending, m.deadlineMs);
  const open = held.filter((r) => r.got >= 1 && !r.ended).length;
  return { open, timedOut, errors: held.filter((r) => r.error).slice(0, 3).map((r) => r.error) };
}

async function holdWait(m) {
  const timedOut = await withDeadline(
    held.map((r) => r.done),
    m.deadlineMs,
  );
  let lost = 0;
  let mismatched = 0;
  for (const r of held) {
    lost += r.skipped + Math.max(0, 3 - r.got);
    mismatched += r.mismatched + r.merged + r.extra;
    if (!r.ended) r.req.destroy();
  }
  const res = { streams: held.length, lost, mismatched, timedOut };
  held = [];
  return res;
}

async function cancelRun(m) {
  // Open m.c streams; each aborts after a random number of content events
  // in [m.minEvents, m.maxEvents]. Returns sid -> abort time (shared ms).
  const aborts = {};
  const recs = [];
  for (let i = 0; i < m.c; i++) {
    const after = m.minEvents + Math.floor(Math.random() * (m.maxEvents - m.minEvents + 1));
    const rec = openStream(m.url, m.headers, m.n, (rec, idx) => {
      if (idx === after) {
        aborts[rec.sid] = origin + performance.now();
        rec.req.destroy();
      }
    });
    recs.push(rec);
  }
  const timedOut = await withDeadline(
    recs.map((r) => r.done),
    m.deadlineMs,
  );
  for (const r of recs) if (!r.ended) r.req.destroy();
  return {
    aborts,
    timedOut,
    errors: recs.filter((r) => r.error && r.error !== 'socket hang up' && r.error !== 'aborted').length,
  };
}

process.on('message', async (m) => {
  let res;
  try {
    if (m.cmd === 'run') res = await streamRun(m);
    else if (m.cmd === 'analyze') res = analyze(m);
    else if (m.cmd === 'hold') res = await holdOpen(m);
    else if (m.cmd === 'holdWait') res = await holdWait(m);
    else if (m.cmd === 'cancel') res = await cancelRun(m);
    else if (m.cmd === 'dropIdle') res = { dropped: dropIdle() };
    else if (m.cmd === 'exit') process.exit(0);
    else res = { error: 'unknown cmd ' + m.cmd };
  } catch (err) {
    res = { error: String(err && err.stack ? err.stack : err) };
  }
  process.send({ id: m.id, ...res });
});
process.on('disconnect', () => process.exit(0));
process.send({ ready: true });
