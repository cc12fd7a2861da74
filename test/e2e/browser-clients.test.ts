// A browser as the client: headless Chromium (Debian package `chromium`; .ci/run installs it)
// opens a page on its own origin that streams through the proxy, as a web application calling a
// model server that allows CORS (vLLM's default) does. Chromium's own network stack meets the
// proxy: the CORS preflight, its fetch streaming, an abort, the official `openai` SDK loaded as
// ES modules, and its WebSocket with permessage-deflate. The page stamps what it sees; the
// proxy's timings are bounded by the page's window and the upstream's schedule (only durations:
// the page's clock has its own origin), and the bytes must be the upstream's.
import { join } from 'node:path';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { WebSocketServer, type RawData } from 'ws';
import type { RunningProxy } from '../../src/main.js';
import { between, ClientTimes, sleepUntil, streamBounds, type Range } from '../helpers/bands.js';
import { chromiumMissing, runPage, startPageServer } from '../helpers/chromium.js';
import { startGroundTruth } from '../helpers/ground-truth.js';
import { hist, scrape, total } from '../helpers/prom.js';
import { settledLoad, startTestProxy } from '../helpers/proxy.js';

const PLAN = { ttftMs: 60, itlMs: 5, tokens: 40 };
const FIRST_DUE = PLAN.ttftMs / 1000;
const LAST_DUE = (PLAN.ttftMs + (PLAN.tokens - 1) * PLAN.itlMs) / 1000;
const EXPECTED_TEXT = Array.from({ length: PLAN.tokens }, (_, k) => `w${k} `).join('');
/** The page's clock: 5 µs steps when cross-origin isolated (asserted); two stamps per bound. */
const PAGE_CLOCK_S = 10e-6;

interface PageStream {
  sent: number;
  first: number | null;
  last: number | null;
  contents: number;
  text: string;
}

const notReady = chromiumMissing();
let gt: Awaited<ReturnType<typeof startGroundTruth>>;
let proxy: RunningProxy;
let page: Awaited<ReturnType<typeof startPageServer>>;
const logLines: Record<string, unknown>[] = [];
const lines = (pred: (l: Record<string, unknown>) => boolean) => logLines.filter((l) => l.msg === 'request' && pred(l));

/** Runs one scenario of page.mjs against `proxyUrl` and returns the page's report. */
async function open<T>(scenario: string, proxyUrl: string, n = 1): Promise<T & { ok: boolean; crossOriginIsolated: boolean; error?: string }> {
  const r = await runPage(page, `/?s=${scenario}&n=${n}&proxy=${encodeURIComponent(proxyUrl)}`);
  const report = r as T & { ok: boolean; crossOriginIsolated: boolean; error?: string };
  expect(report.error, 'the page failed').toBeUndefined();
  expect(report.ok).toBe(true);
  expect(report.crossOriginIsolated, 'the page clock bound (PAGE_CLOCK_S) needs an isolated page').toBe(true);
  return report;
}

const times = (s: PageStream) => Object.assign(new ClientTimes(), { sent: s.sent, first: s.first ?? NaN, last: s.last ?? NaN });
const widen = ([lo, hi]: Range, by: number): Range => [lo - by, hi + by];

/** The proxy's TTFT, gaps and TPOT for `model` within what the page saw and the upstream's schedule. */
async function expectTimings(model: string, streams: PageStream[], metricsUrl = proxy.metricsUrl, firstDue = FIRST_DUE, lastDue = LAST_DUE, outputTokens = PLAN.tokens) {
  const n = streams.length;
  const b = streamBounds(streams.map(times), firstDue, lastDue);
  const m = await scrape(metricsUrl);
  const f = { gen_ai_request_model: model };
  const ttft = hist(m, 'gen_ai_client_operation_time_to_first_chunk_seconds', f);
  const gaps = hist(m, 'gen_ai_client_operation_time_per_output_chunk_seconds', f);
  const tpot = hist(m, 'gen_ai_server_time_per_output_token_seconds', f);
  expect(ttft.count).toBe(n);
  between(ttft.sum, widen(b.ttft, n * PAGE_CLOCK_S), `${model} TTFT`);
  expect(gaps.count).toBe(n * (streams[0]!.contents - 1));
  between(gaps.sum, widen(b.span, n * PAGE_CLOCK_S), `${model} gaps`);
  expect(tpot.count).toBe(n);
  between(tpot.sum, widen(b.span, n * PAGE_CLOCK_S), `${model} TPOT`, outputTokens - 1);
  return m;
}

beforeAll(async () => {
  gt = await startGroundTruth({ ...PLAN, alwaysUsage: true, cors: true });
  proxy = await startTestProxy(gt.url, {}, { logLevel: 'info', logLines });
  page = await startPageServer(join(__dirname, 'browser'), { openai: join(__dirname, '../../node_modules/openai') });
});
afterAll(async () => {
  await proxy?.close();
  await gt?.close();
  await page?.close();
});

describe('Chromium through the proxy (a page on another origin)', () => {
  it('has Chromium', () => {
    expect(notReady, notReady).toBeUndefined();
  });

  it('fetch: the CORS preflight reaches the upstream and is not a stream; sequential streams arrive byte for byte, timed within what the page saw', async () => {
    expect(notReady, notReady).toBeUndefined();
    const n = 3;
    const [before, preflights] = [gt.sent.length, gt.preflights.length];
    const streamsBefore = total(await scrape(proxy.metricsUrl), 'llm_proxy_streams_total');
    const r = await open<{ streams: (PageStream & { status: number; done: boolean; sha256: string; bytes: number })[] }>('fetch', proxy.proxyUrl, n);
    const sent = gt.sent.slice(before);
    expect(sent).toHaveLength(n);
    for (const [i, s] of r.streams.entries()) {
      // Chromium hands a cross-origin page the body only when the upstream's CORS header came through.
      expect(s.status).toBe(200);
      expect(s.done).toBe(true);
      expect(s.contents).toBe(PLAN.tokens);
      expect(s.text).toBe(EXPECTED_TEXT);
      expect({ sha256: s.sha256, bytes: s.bytes }).toEqual({ sha256: sent[i]!.sha256, bytes: sent[i]!.bytes });
    }
    // Chromium asked once (the upstream allows 600 s of caching) with the page's origin and headers.
    const asked = gt.preflights.slice(preflights);
    expect(asked).toHaveLength(1);
    expect(asked[0]!.origin).toBe(page.origin);
    expect(asked[0]!['access-control-request-method']).toBe('POST');
    expect(asked[0]!['access-control-request-headers']).toBe('authorization,content-type');
    const options = lines((l) => l.method === 'OPTIONS');
    expect(options.map((l) => [l.status, l.outcome])).toEqual([[204, 'ok']]);

    const m = await expectTimings('browser-fetch', r.streams);
    // The preflight is a request, not a stream: only the n POSTs count.
    expect(total(m, 'llm_proxy_streams_total') - streamsBefore).toBe(n);
    expect(total(m, 'gen_ai_client_token_usage_sum', { gen_ai_request_model: 'browser-fetch', gen_ai_token_type: 'output' })).toBe(n * PLAN.tokens);
    expect(lines((l) => l.model === 'browser-fetch').map((l) => [l.status, l.outcome])).toEqual(Array(n).fill([200, 'ok']));
  });

  it('the openai SDK in the browser (dangerouslyAllowBrowser): its streams, usage and finish reason come through, timed within what the page saw', async () => {
    expect(notReady, notReady).toBeUndefined();
    const n = 2;
    const r = await open<{ streams: (PageStream & { usage: { completion_tokens: number } | null; finish: string | null })[] }>('openai', proxy.proxyUrl, n);
    expect(r.streams).toHaveLength(n);
    for (const s of r.streams) {
      expect(s.text).toBe(EXPECTED_TEXT);
      expect(s.contents).toBe(PLAN.tokens);
      expect(s.usage?.completion_tokens).toBe(PLAN.tokens);
      expect(s.finish).toBe('stop');
    }
    await expectTimings('browser-openai', r.streams);
    expect(lines((l) => l.model === 'browser-openai').map((l) => [l.status, l.outcome, l.finishReasons])).toEqual(Array(n).fill([200, 'ok', ['stop']]));
  });

  it('AbortController after the third content event: the stream is cancelled and its upstream connection closed', async () => {
    expect(notReady, notReady).toBeUndefined();
    // 4,000 tokens (20 s): still running however late the abort reaches the upstream.
    const long = await startGroundTruth({ ...PLAN, tokens: 4000, cors: true });
    const longProxy = await startTestProxy(long.url, {}, { logLevel: 'info', logLines });
    onTestFinished(async () => {
      await longProxy.close();
      await long.close();
    });
    const r = await open<{ status: number; contents: number; aborted: string | null }>('abort', longProxy.proxyUrl);
    expect(r).toMatchObject({ status: 200, contents: 3, aborted: 'AbortError' });
    expect((await settledLoad(longProxy)).active).toBe(0);
    for (let i = 0; i < 100 && long.cut.length === 0; i++) await new Promise((res) => setTimeout(res, 20));
    expect(long.cut).toHaveLength(1);
    expect(long.sent).toHaveLength(0);
    expect(long.cut[0]!.contentSendTimes.length).toBeLessThan(4000);
    const m = await scrape(longProxy.metricsUrl);
    const f = { gen_ai_request_model: 'browser-abort' };
    expect(total(m, 'llm_proxy_streams_total', { ...f, outcome: 'cancelled' })).toBe(1);
    expect(total(m, 'llm_proxy_streams_total', { ...f, outcome: 'ok' })).toBe(0);
    expect(hist(m, 'gen_ai_client_operation_time_to_first_chunk_seconds', f).count).toBe(1);
    expect(hist(m, 'gen_ai_server_time_per_output_token_seconds', f).count).toBe(0);
    expect(lines((l) => l.model === 'browser-abort').map((l) => l.outcome)).toEqual(['cancelled']);
  });

  it('a Realtime session over Chromium\'s WebSocket: permessage-deflate negotiated end to end, messages unchanged, the response timed from the page\'s response.create', async () => {
    expect(notReady, notReady).toBeUndefined();
    const WAIT = 30; // ms from response.create to response.created
    const SPACING = 15; // ms between text deltas
    const DELTAS = 8;
    const OUTPUT_TOKENS = 12;
    const sent: string[] = [];
    const offers: (string | undefined)[] = [];
    const creates: string[] = [];
    const wss = new WebSocketServer({ noServer: true, perMessageDeflate: { threshold: 0 } });
    const upstream = http.createServer((_req, res) => res.writeHead(404).end());
    upstream.on('upgrade', (req, socket, head) => {
      offers.push(req.headers['sec-websocket-extensions']);
      wss.handleUpgrade(req, socket, head, (ws) => {
        const send = (o: Record<string, unknown>) => {
          const s = JSON.stringify({ event_id: `event_${sent.length}`, ...o });
          sent.push(s);
          ws.send(s);
        };
        send({ type: 'session.created', session: { id: 'sess_1', object: 'realtime.session', model: 'gpt-realtime', type: 'realtime' } });
        ws.on('message', async (data: RawData) => {
          const got = performance.now();
          const text = data.toString();
          if ((JSON.parse(text) as { type: string }).type !== 'response.create') return;
          creates.push(text);
          const id = 'resp_1';
          await sleepUntil(got, WAIT / 1000);
          send({ type: 'response.created', response: { id, object: 'realtime.response', status: 'in_progress', output: [] } });
          send({ type: 'response.output_item.added', response_id: id, output_index: 0, item: { id: 'item_1', type: 'message', role: 'assistant', content: [] } });
          for (let k = 0; k < DELTAS; k++) {
            // Never before its due time after the create arrived: the bounds' lower side.
            await sleepUntil(got, (WAIT + (k + 1) * SPACING) / 1000);
            send({ type: 'response.output_text.delta', response_id: id, item_id: 'item_1', output_index: 0, content_index: 0, delta: `tok${k} ` });
          }
          send({ type: 'response.done', response: { id, object: 'realtime.response', status: 'completed', output: [], usage: { total_tokens: 20, input_tokens: 8, output_tokens: OUTPUT_TOKENS } } });
        });
      });
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    const wsProxy = await startTestProxy(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`);
    onTestFinished(async () => {
      await wsProxy.close();
      upstream.closeAllConnections();
      await new Promise((r) => upstream.close(r));
    });

    const r = await open<{ extensions: string; got: string[]; sent: number; first: number; last: number }>('websocket', wsProxy.proxyUrl);
    // Chromium offered compression and the upstream's acceptance reached it through the tunnel.
    expect(offers[0]).toMatch(/permessage-deflate/);
    expect(r.extensions).toMatch(/^permessage-deflate/);
    expect(r.got).toEqual(sent);
    // The page's response.create reached the upstream (compressed by Chromium, read by the proxy).
    expect(creates.map((c) => JSON.parse(c) as unknown)).toEqual([{ type: 'response.create', response: { output_modalities: ['text'] } }]);

    for (let i = 0; i < 50 && wsProxy.forwarder.inFlight.size > 0; i++) await new Promise((res) => setTimeout(res, 20));
    const stream: PageStream = { sent: r.sent, first: r.first, last: r.last, contents: DELTAS, text: '' };
    const firstDue = (WAIT + SPACING) / 1000;
    const lastDue = (WAIT + DELTAS * SPACING) / 1000;
    const m = await expectTimings('browser-realtime', [stream], wsProxy.metricsUrl, firstDue, lastDue, OUTPUT_TOKENS);
    const f = { gen_ai_request_model: 'browser-realtime', gen_ai_operation_name: 'realtime' };
    expect(total(m, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(OUTPUT_TOKENS);
    expect(total(m, 'llm_proxy_streams_total', { ...f, outcome: 'ok' })).toBe(1);
  });
});
