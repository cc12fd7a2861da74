#!/usr/bin/env node
// Small load generator for the Compose demo stack: sends streaming OpenAI-style chat completions
// through the proxy at a modest, steady rate so the Grafana dashboard has data as soon as it opens.
// No dependencies (Node >= 20: global fetch, AbortSignal.timeout).
//
// Environment (all optional):
//   LOADGEN_TARGET        proxy base URL                                  (http://proxy:8080)
//   LOADGEN_PATH          request path                                    (/v1/chat/completions)
//   LOADGEN_RATE          requests started per second; 0 = do nothing     (2)
//   LOADGEN_MAX_INFLIGHT  cap on concurrent streams                       (16)
//   LOADGEN_MAX_REQUESTS  stop after this many requests; 0 = run forever  (0)
//   LOADGEN_MODELS        comma-separated model names, used round-robin   (gpt-4o-mini,llama-3.1-8b-instruct)
//   LOADGEN_MAX_TOKENS    upper bound of the random max_tokens per request (256)
//   LOADGEN_TIMEOUT_MS    per-request timeout                             (60000)
//   LOADGEN_REPORT_MS     interval between summary log lines              (10000)
//   LOADGEN_API_KEY       bearer token sent upstream                      (sk-loadgen-simulator)
//   LOADGEN_UPSTREAM / LOADGEN_SIMULATOR_URL / LOADGEN_ALLOW_REAL_UPSTREAM
//       Safety switch: when the proxy's upstream (LOADGEN_UPSTREAM) is set and is not the simulator,
//       the generator exits 0 without sending anything unless LOADGEN_ALLOW_REAL_UPSTREAM=1, so
//       pointing the stack at a paid provider never produces synthetic traffic by accident.
//
// With LOADGEN_MAX_REQUESTS > 0 the process exits when all requests have finished: code 0 if every
// request succeeded, 1 otherwise. Logs are one JSON object per line on stdout.

const env = process.env;
const num = (name, dflt) => {
  const raw = env[name];
  if (raw === undefined || raw === '') return dflt;
  const n = Number(raw);
  if (!Number.isFinite(n) || n < 0) {
    log('error', `invalid ${name}=${raw}`);
    process.exit(2);
  }
  return n;
};

function log(level, msg, extra = {}) {
  process.stdout.write(JSON.stringify({ time: new Date().toISOString(), level, msg, ...extra }) + '\n');
}

const target = (env.LOADGEN_TARGET || 'http://proxy:8080').replace(/\/+$/, '');
const path = env.LOADGEN_PATH || '/v1/chat/completions';
const rate = num('LOADGEN_RATE', 2);
const maxInflight = Math.max(1, num('LOADGEN_MAX_INFLIGHT', 16));
const maxRequests = num('LOADGEN_MAX_REQUESTS', 0);
const models = (env.LOADGEN_MODELS || 'gpt-4o-mini,llama-3.1-8b-instruct')
  .split(',')
  .map((m) => m.trim())
  .filter(Boolean);
const maxTokens = Math.max(2, num('LOADGEN_MAX_TOKENS', 256));
const timeoutMs = num('LOADGEN_TIMEOUT_MS', 60_000);
const reportMs = num('LOADGEN_REPORT_MS', 10_000);
const apiKey = env.LOADGEN_API_KEY || 'sk-loadgen-simulator';

const upstream = (env.LOADGEN_UPSTREAM || '').replace(/\/+$/, '');
const simulator = (env.LOADGEN_SIMULATOR_URL || '').replace(/\/+$/, '');
if (upstream && simulator && upstream !== simulator && env.LOADGEN_ALLOW_REAL_UPSTREAM !== '1') {
  log('info', 'proxy upstream is not the simulator; not generating load (set LOADGEN_ALLOW_REAL_UPSTREAM=1 to override)', {
    upstream,
  });
  process.exit(0);
}
if (rate === 0 || models.length === 0) {
  log('info', 'LOADGEN_RATE is 0 or no models configured; nothing to do');
  process.exit(0);
}

const prompts = [
  'Explain time to first token in one paragraph.',
  'Write a haiku about tail latency.',
  'List three reasons a stream might stall.',
  'Summarise what a reverse proxy does.',
  'Describe continuous batching to a new engineer.',
];

const stats = { sent: 0, ok: 0, failed: 0, inflight: 0, events: 0 };
const errors = new Map();

async function one(i) {
  const model = models[i % models.length];
  const body = {
    model,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: 16 + Math.floor(Math.random() * (maxTokens - 15)),
    messages: [{ role: 'user', content: prompts[i % prompts.length] }],
  };
  stats.inflight++;
  try {
    const res = await fetch(target + path, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKey}` },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    });
    if (!res.ok || !res.body) {
      await res.body?.cancel().catch(() => {});
      throw new Error(`HTTP ${res.status}`);
    }
    // Read the whole stream as a client would; count SSE data events.
    const decoder = new TextDecoder();
    let tail = '';
    for await (const chunk of res.body) {
      const text = tail + decoder.decode(chunk, { stream: true });
      const lines = text.split('\n');
      tail = lines.pop() ?? '';
      for (const line of lines) if (line.startsWith('data:')) stats.events++;
    }
    if (tail.startsWith('data:')) stats.events++;
    stats.ok++;
  } catch (err) {
    stats.failed++;
    const key = err?.name === 'TimeoutError' ? 'timeout' : String(err?.cause?.code ?? err?.message ?? err);
    errors.set(key, (errors.get(key) ?? 0) + 1);
  } finally {
    stats.inflight--;
  }
}

function summary(msg) {
  log('info', msg, { target: target + path, rate, ...stats, errors: Object.fromEntries(errors) });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  log('info', 'loadgen starting', { target: target + path, rate, maxInflight, maxRequests, models });
  const reporter = reportMs > 0 ? setInterval(() => summary('loadgen summary'), reportMs) : undefined;
  const pending = new Set();
  const start = performance.now();
  for (let i = 0; maxRequests === 0 || i < maxRequests; i++) {
    const due = start + (i * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 0) await sleep(wait);
    while (stats.inflight >= maxInflight) await sleep(10);
    stats.sent++;
    const p = one(i).finally(() => pending.delete(p));
    pending.add(p);
  }
  await Promise.allSettled([...pending]);
  if (reporter) clearInterval(reporter);
  summary('loadgen done');
  process.exit(stats.failed > 0 ? 1 : 0);
}

for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => {
    // PID 1 in a container: without a handler the signal would be ignored until the kill timeout.
    summary(`loadgen stopping on ${sig}`);
    process.exit(0);
  });
}

main().catch((err) => {
  log('error', 'loadgen crashed', { error: String(err?.stack ?? err) });
  process.exit(2);
});
