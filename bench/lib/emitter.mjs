// Ground-truth SSE emitter. Runs as its own process, controlled over IPC by
// bench/run.mjs. Serves POST /v1/chat/completions with OpenAI-style chunks on a
// fixed schedule (due(k) = t0 + (k-1)*delta) and records its own lateness.
//
// Modes (set per run with {cmd:'config'}):
//   batched   - the run's `expected` streams start together: every tick writes
//               event k to ALL streams (the batched-decode pattern).
//   staggered - each stream has its own t0 = request arrival + ttft.
//   hold      - headers + role chunk, then nothing until {cmd:'release'}.
//   cancel    - staggered with a long stream; records when each response's
//               socket closes before the stream finished.
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import { roleEvent, contentEvent, usageEvent, DONE_EVENT, parseTag } from './sse.mjs';
import { origin } from './clock.mjs';

/** performance.now() `t` on the clock the bench's processes share ("shared ms" below; clock.mjs). */
const toShared = (t) => origin + t;

let sidCounter = 0;
let cfg = { mode: 'staggered', delta: 20, n: 3, ttft: 10, expected: 0, lead: 25 };
let run = newRun();
let active = [];
let timer = null;
let immediate = null;

function newRun() {
  return {
    streams: [],
    lateness: [], // ms, one per content event written
    // ms, one per content event the emitter slept until (its due time was still ahead when the
    // stream was last looked at): how late the sleep ended. Not the events written to catch up
    // after a stall, whose lateness is the stall's, not the sleep's.
    wakeLateness: [],
    t0: null, // batched: shared perf-time t0
    closes: new Map(), // sid -> shared ms of premature close
    cpu0: process.cpuUsage(),
    arrivals: new Map(), // sid -> shared ms of request arrival
    t0BySid: new Map(), // sid -> shared ms of due(1)
    sent1BySid: new Map(), // sid -> shared ms at which event 1 was written
    sentLastBySid: new Map(), // sid -> shared ms at which event n was written
    tagBySid: new Map(), // sid -> the client's tag for the request that opened it
  };
}

function startStream(req, res, tag) {
  const now = performance.now();
  const sid = ++sidCounter;
  if (tag !== undefined) run.tagBySid.set(sid, tag);
  res.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    'x-bench-sid': String(sid),
  });
  res.flushHeaders();
  res.write(roleEvent(sid));
  const s = { sid, res, k: 1, n: cfg.n, delta: cfg.delta, t0: Infinity, done: false, arrival: now, waited: false };
  run.arrivals.set(sid, toShared(now));
  res.on('close', () => {
    if (!s.done) {
      s.done = true;
      run.closes.set(sid, origin + performance.now());
    }
  });
  run.streams.push(s);
  if (cfg.mode === 'staggered' || cfg.mode === 'cancel') {
    s.t0 = now + cfg.ttft;
    run.t0BySid.set(sid, toShared(s.t0));
    active.push(s);
    kick();
  } else if (cfg.mode === 'batched') {
    active.push(s);
    if (run.t0 !== null) {
      // late stream (the batch already started without it): joins the ticks
      s.t0 = run.t0;
      run.t0BySid.set(sid, toShared(s.t0));
      kick();
    } else if (run.streams.length === cfg.expected) startBatch();
    else if (run.streams.length === 1) {
      // do not wait forever for streams a path failed to open
      run.startTimer = setTimeout(() => {
        if (run.t0 === null) {
          run.startedIncomplete = run.streams.length;
          startBatch();
        }
      }, cfg.startTimeoutMs ?? 8000);
    }
  }
  // hold: nothing more until release
}

function startBatch() {
  if (run.startTimer) clearTimeout(run.startTimer);
  const t0 = performance.now() + cfg.lead;
  run.t0 = t0;
  for (const s of run.streams) {
    if (s.t0 === Infinity) {
      s.t0 = t0;
      run.t0BySid.set(s.sid, toShared(t0));
    }
  }
  kick();
}

function finish(s) {
  if (s.done) return;
  s.res.write(usageEvent(s.sid, s.n));
  s.res.write(DONE_EVENT);
  s.done = true;
  s.res.end();
}

function loop() {
  timer = null;
  immediate = null;
  let next = Infinity;
  let removed = false;
  const lat = run.lateness;
  const wake = run.wakeLateness;
  // Emit every due event. For the batched mode all streams share one due
  // time per tick, so one pass writes event k to every stream.
  for (let i = 0; i < active.length; i++) {
    const s = active[i];
    if (s.done) {
      removed = true;
      continue;
    }
    let due = s.t0 + (s.k - 1) * s.delta;
    while (s.k <= s.n) {
      const now = performance.now();
      if (due > now) {
        s.waited = true;
        break;
      }
      lat.push(now - due);
      if (s.waited) {
        wake.push(now - due);
        s.waited = false;
      }
      s.res.write(contentEvent(s.sid, s.k));
      // When the upstream sent its first and last token: the truth the proxy's TTFT and
      // ITL should match, less the loopback hop (bench/README.md, figure 7).
      if (s.k === 1) run.sent1BySid.set(s.sid, toShared(now));
      if (s.k === s.n) run.sentLastBySid.set(s.sid, toShared(now));
      s.k++;
      due = s.t0 + (s.k - 1) * s.delta;
    }
    if (s.k > s.n) {
      finish(s);
      removed = true;
    } else if (due < next) next = due;
  }
  if (removed) active = active.filter((s) => !s.done);
  schedule(next);
}

// Between due times the emitter sleeps in a futex wait, which takes a sub-millisecond
// timeout (Node's timers have 1 ms granularity) and oversleeps by ~0.08 ms here (p99
// ~0.15), and spins only the last SPIN_MS. It used to spin with setImmediate for the
// whole last 2 ms, which at Δ = 1.4 ms held one of the machine's two cores: the path's
// forwarding and the client's read then queued for the other, and a woken process could
// wait for the next scheduler tick (4 ms here). bench/README.md has the A/B;
// BENCH_EMITTER_BUSYWAIT=1 restores the old wait to repeat it.
const sleeper = new Int32Array(new SharedArrayBuffer(4));
const SPIN_MS = 0.25;
// Sleep in slices, polling I/O between them: a request that arrives meanwhile waits at most one.
const SLICE_MS = 0.2;
const BUSY_WAIT = !!process.env.BENCH_EMITTER_BUSYWAIT;

function schedule(next) {
  if (next === Infinity) return;
  const wait = next - performance.now();
  if (wait > 2) timer = setTimeout(loop, Math.floor(wait - 1.2));
  // Sleep in the next check phase, not here: Node writes a chunked response on the
  // next tick (it corks the socket), so the events just written leave first.
  else immediate = setImmediate(wait > SPIN_MS && !BUSY_WAIT ? sleepThenLoop : loop, next);
}

function sleepThenLoop(next) {
  const wait = next - performance.now();
  if (wait > SPIN_MS) Atomics.wait(sleeper, 0, 0, Math.min(wait - SPIN_MS, SLICE_MS));
  loop();
}

function kick() {
  if (timer) clearTimeout(timer);
  if (immediate) clearImmediate(immediate);
  timer = null;
  immediate = null;
  loop();
}

const server = http.createServer((req, res) => {
  if (req.method === 'POST' && req.url.startsWith('/v1/chat/completions')) {
    // Read the body (for the client's request tag), then start streaming.
    let body = '';
    req.on('data', (d) => {
      if (body.length < 4096) body += d.toString('latin1');
    });
    req.on('end', () => startStream(req, res, parseTag(body)));
    return;
  }
  if (req.url === '/health') {
    res.end('ok');
    return;
  }
  res.writeHead(404).end();
});
server.keepAliveTimeout = 60_000;
server.headersTimeout = 65_000;
server.requestTimeout = 0;
server.maxConnections = 100_000;

function quantiles(arr) {
  if (arr.length === 0) return { n: 0 };
  const a = Float64Array.from(arr).sort();
  const q = (p) => a[Math.min(a.length - 1, Math.floor(p * (a.length - 1) + 0.5))];
  let sum = 0;
  for (const v of a) sum += v;
  return { n: a.length, p50: q(0.5), p99: q(0.99), max: a[a.length - 1], mean: sum / a.length };
}

process.on('message', (m) => {
  if (m.cmd === 'config') {
    if (run.startTimer) clearTimeout(run.startTimer);
    cfg = { ...cfg, ...m.cfg };
    run = newRun();
    process.send({ id: m.id, ok: true });
  } else if (m.cmd === 'report') {
    const cpu = process.cpuUsage(run.cpu0);
    const rep = {
      id: m.id,
      streams: run.streams.length,
      unfinished: run.streams.filter((s) => !s.done).length,
      startedIncomplete: run.startedIncomplete ?? null,
      t0BySid: Object.fromEntries(run.t0BySid),
      sent1BySid: Object.fromEntries(run.sent1BySid),
      sentLastBySid: Object.fromEntries(run.sentLastBySid),
      arrivals: Object.fromEntries(run.arrivals),
      tagBySid: Object.fromEntries(run.tagBySid),
      lateness: quantiles(run.lateness),
      wakeLateness: quantiles(run.wakeLateness),
      closes: Object.fromEntries(run.closes),
      cpuMs: (cpu.user + cpu.system) / 1000,
    };
    process.send(rep);
  } else if (m.cmd === 'release') {
    for (const s of run.streams) if (!s.done) finish(s);
    active = [];
    process.send({ id: m.id, ok: true });
  } else if (m.cmd === 'endAll') {
    for (const s of run.streams) {
      if (!s.done) {
        s.done = true;
        s.res.destroy();
      }
    }
    active = [];
    process.send({ id: m.id, ok: true });
  } else if (m.cmd === 'exit') {
    process.exit(0);
  }
});
process.on('disconnect', () => process.exit(0));

// A deep accept queue, like nginx's `backlog=4096`: a level's 1,000+ connections arrive at once.
server.listen(0, '127.0.0.1', 4096, () => {
  process.send({ ready: true, port: server.address().port });
});
