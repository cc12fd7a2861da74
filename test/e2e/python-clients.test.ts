// Clients that are not Node's, as applications use them: Python's httpx (the transport of the
// official `openai` and `anthropic` Python SDKs) and aiohttp (Debian packages `python3-httpx`,
// `python3-aiohttp`; .ci/run installs them), and curl. Each streams through the proxy in front
// of the ground-truth upstream; the proxy's timings are bounded by what the client saw on the
// same monotonic clock, and the client must get the upstream's bytes exactly.
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { between, ClientTimes, streamBounds } from '../helpers/bands.js';
import { startGroundTruth } from '../helpers/ground-truth.js';
import { hist, scrape, total } from '../helpers/prom.js';
import { settledLoad, startTestProxy } from '../helpers/proxy.js';
import { tempDir } from '../helpers/temp-dir.js';

// Debian's interpreter, where apt puts the packages (a pyenv shim may come first on the PATH).
const PYTHON = '/usr/bin/python3';
const SCRIPT = join(__dirname, 'python/stream_clients.py');
const PLAN = { ttftMs: 60, itlMs: 5, tokens: 40 };
const FIRST_DUE = PLAN.ttftMs / 1000;
const LAST_DUE = (PLAN.ttftMs + (PLAN.tokens - 1) * PLAN.itlMs) / 1000;

interface PyStream {
  sent: number;
  first: number | null;
  last: number | null;
  contents: number;
  sha256: string;
  bytes: number;
  done: boolean;
  localPort: number;
  httpVersion: string;
  status: number;
  closing?: number;
}

/** CLOCK_MONOTONIC in ms (what Python's time.monotonic_ns() reads) minus performance.now(). */
const CLOCK_OFFSET_MS = Number(process.hrtime.bigint()) / 1e6 - performance.now();
const toPerf = (ns: number) => ns / 1e6 - CLOCK_OFFSET_MS;

function pythonReady(): string | undefined {
  const r = spawnSync(PYTHON, ['-c', 'import httpx, aiohttp'], { encoding: 'utf8' });
  if (r.status === 0) return undefined;
  return `${PYTHON} with httpx and aiohttp is needed (Debian: apt-get install python3-httpx python3-aiohttp; .ci/run does): ${r.error?.message ?? r.stderr.trim()}`;
}

/** This process's environment without proxy settings: httpx and curl would send loopback requests through them. */
const NO_PROXY_ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(https?|all|no)_proxy$/i.test(k)));

/** Runs a child without blocking this process's event loop (the proxy and upstream run in it). */
function run(cmd: string, args: string[], timeoutMs = 60_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env: NO_PROXY_ENV });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString('utf8')));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString('utf8')));
    const t = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(t);
      resolve({ code, stdout, stderr });
    });
  });
}

async function python(mode: string, n: number, proxyUrl = proxy.proxyUrl): Promise<PyStream[]> {
  const r = await run(PYTHON, [SCRIPT, mode, `${proxyUrl}/v1/chat/completions`, String(n)]);
  expect(r.code, `${mode} exited ${r.code}: ${r.stderr}`).toBe(0);
  const out = r.stdout.trim().split('\n').map((l) => JSON.parse(l) as PyStream);
  expect(out).toHaveLength(n);
  return out;
}

let gt: Awaited<ReturnType<typeof startGroundTruth>>;
let proxy: RunningProxy;
const logLines: Record<string, unknown>[] = [];
const requestLines = (model: string) => logLines.filter((l) => l.msg === 'request' && l.model === model);

const notReady = pythonReady();

beforeAll(async () => {
  gt = await startGroundTruth({ ...PLAN, alwaysUsage: true });
  proxy = await startTestProxy(gt.url, {}, { logLevel: 'info', logLines });
});
afterAll(async () => {
  await proxy?.close();
  await gt?.close();
});

describe('Python and curl clients through the proxy', () => {
  it('has Python with httpx and aiohttp', () => {
    expect(notReady, notReady).toBeUndefined();
  });

  for (const mode of ['httpx', 'aiohttp'] as const) {
    it(`${mode}: sequential streams on one kept-alive connection, bytes identical, TTFT, gaps and TPOT within what the client saw`, async () => {
      expect(notReady, notReady).toBeUndefined();
      const n = 4;
      const before = gt.sent.length;
      const streams = await python(mode, n);
      const sent = gt.sent.slice(before);
      expect(sent).toHaveLength(n);
      for (const [i, s] of streams.entries()) {
        expect(s.status).toBe(200);
        expect(s.httpVersion).toBe('HTTP/1.1');
        expect(s.done, 'the client read data: [DONE]').toBe(true);
        expect(s.contents).toBe(PLAN.tokens);
        expect({ sha256: s.sha256, bytes: s.bytes }).toEqual({ sha256: sent[i]!.sha256, bytes: sent[i]!.bytes });
      }
      // The proxy kept the client's connection open between answers, so the pool reused it.
      expect(new Set(streams.map((s) => s.localPort)).size).toBe(1);

      const times = streams.map((s) => Object.assign(new ClientTimes(), { sent: toPerf(s.sent), first: toPerf(s.first!), last: toPerf(s.last!) }));
      const b = streamBounds(times, FIRST_DUE, LAST_DUE);
      const model = `py-${mode}`;
      const m = await scrape(proxy.metricsUrl);
      const f = { gen_ai_request_model: model };
      const ttft = hist(m, 'gen_ai_client_operation_time_to_first_chunk_seconds', f);
      const gaps = hist(m, 'gen_ai_client_operation_time_per_output_chunk_seconds', f);
      const tpot = hist(m, 'gen_ai_server_time_per_output_token_seconds', f);
      expect(ttft.count).toBe(n);
      between(ttft.sum, b.ttft, `${mode} TTFT`);
      expect(gaps.count).toBe(n * (PLAN.tokens - 1));
      between(gaps.sum, b.span, `${mode} gaps`);
      expect(tpot.count).toBe(n);
      between(tpot.sum, b.span, `${mode} TPOT`, PLAN.tokens - 1);
      // Exactly: each stream's TPOT is its span over (tokens - 1), its gaps sum to that span.
      expect(Math.abs(tpot.sum * (PLAN.tokens - 1) - gaps.sum)).toBeLessThanOrEqual(1e-6 * n);
      expect(total(m, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(n * PLAN.tokens);
      const lines = requestLines(model);
      expect(lines.map((l) => [l.status, l.outcome])).toEqual(Array(n).fill([200, 'ok']));
    });
  }

  it('httpx closing a stream after its third content event (the openai SDK\'s stream.close()): cancelled, and the upstream connection closed after it', async () => {
    expect(notReady, notReady).toBeUndefined();
    const n = 3;
    // A stream of 4,000 tokens (20 s), so that it is still running however late the close reaches the upstream.
    const long = await startGroundTruth({ ...PLAN, tokens: 4000 });
    const longProxy = await startTestProxy(long.url, {}, { logLevel: 'info', logLines });
    onTestFinished(async () => {
      await longProxy.close();
      await long.close();
    });
    const streams = await python('cancel', n, longProxy.proxyUrl);
    for (const s of streams) {
      expect(s.status).toBe(200);
      expect(s.contents).toBe(3);
      expect(s.done).toBe(false);
    }
    // h11 cannot reuse a connection whose body was not read: each stream had its own.
    expect(new Set(streams.map((s) => s.localPort)).size).toBe(n);
    expect((await settledLoad(longProxy)).active).toBe(0);
    const cut = long.cut;
    expect(cut).toHaveLength(n);
    for (const [i, c] of cut.entries()) {
      // Cause before effect: the upstream lost its connection only after the client decided to close.
      expect(c.closedAt).toBeGreaterThanOrEqual(toPerf(streams[i]!.closing!));
      expect(c.contentSendTimes.length).toBeLessThan(4000);
    }
    const m = await scrape(longProxy.metricsUrl);
    const f = { gen_ai_request_model: 'py-cancel' };
    expect(total(m, 'llm_proxy_streams_total', { ...f, outcome: 'cancelled' })).toBe(n);
    expect(total(m, 'llm_proxy_streams_total', { ...f, outcome: 'ok' })).toBe(0);
    expect(hist(m, 'gen_ai_client_operation_time_to_first_chunk_seconds', f).count).toBe(n);
    expect(hist(m, 'gen_ai_server_time_per_output_token_seconds', f).count).toBe(0);
    expect(requestLines('py-cancel').map((l) => l.outcome)).toEqual(Array(n).fill('cancelled'));
  });

  it('curl with a 2 MiB body: its Expect: 100-continue is answered, the body reaches the upstream whole, the stream comes back byte for byte', async () => {
    const dir = tempDir('llp-curl-');
    const body = JSON.stringify({ model: 'curl-big', stream: true, messages: [{ role: 'user', content: 'x'.repeat(2 * 1024 * 1024) }] });
    writeFileSync(join(dir, 'body.json'), body);
    const before = gt.sent.length;
    const r = await run('curl', ['-sS', '-v', '-N', '--http1.1', '--noproxy', '*', '-o', join(dir, 'out'), '-w', '%{json}',
      '-H', 'content-type: application/json', '--data-binary', `@${join(dir, 'body.json')}`, `${proxy.proxyUrl}/v1/chat/completions`]);
    expect(r.code, r.stderr).toBe(0);
    // curl sends Expect: 100-continue for a body over 1 MiB and waits up to 1 s for the 100.
    expect(r.stderr).toMatch(/^> Expect: 100-continue\r?$/m);
    expect(r.stderr).toMatch(/^< HTTP\/1\.1 100 Continue\r?$/m);
    const w = JSON.parse(r.stdout) as { http_code: number; size_upload: number };
    expect(w.http_code).toBe(200);
    expect(w.size_upload).toBe(body.length);
    const sent = gt.sent.slice(before);
    expect(sent).toHaveLength(1);
    expect(sent[0]!.requestBytes).toBe(body.length);
    const out = readFileSync(join(dir, 'out'));
    expect({ sha256: createHash('sha256').update(out).digest('hex'), bytes: out.length }).toEqual({ sha256: sent[0]!.sha256, bytes: sent[0]!.bytes });
    const lines = requestLines('curl-big');
    expect(lines.map((l) => [l.status, l.outcome])).toEqual([[200, 'ok']]);
    expect(typeof lines[0]!.uploadMs).toBe('number');
  });
});
