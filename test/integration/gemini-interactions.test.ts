import { createHash } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { GoogleGenAI } from '@google/genai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { between, ClientTimes, sleepUntil, streamBounds, warmFetch } from '../helpers/bands.js';
import { hist, scrape, total, type Sample } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';
import { hashingFetch } from '../helpers/recording.js';

// The Gemini Interactions API (`POST /v1beta/interactions`, stream: true) through the proxy,
// with Google's own SDK as the client. The upstream is written here from the SDK's event types
// (`InteractionSSEEvent` in @google/genai): a thought summary, then answer text, content event k
// at TTFT + k * GAP from the request's arrival (absolute deadlines: one late timer does not push the rest).
const TTFT = 0.3; // s to the first content event (the thought summary)
const GAP = 0.03; // s between content events
const THOUGHTS = ['Counting', ' from one.'];
const ANSWER = ['1, 2,', ' 3, 4,', ' 5, 6,', ' 7, 8.'];
const USAGE = { total_input_tokens: 12, total_cached_tokens: 0, total_output_tokens: 16, total_thought_tokens: 40, total_tokens: 68 };
const CONTENT_EVENTS = THOUGHTS.length + ANSWER.length;

let upstream: http.Server;
let proxy: RunningProxy;
/** sha256 of every response body the upstream sent, in order. */
const sentHashes: string[] = [];

async function serve(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
  const t0 = performance.now();
  let raw = '';
  for await (const c of req) raw += c;
  const body = JSON.parse(raw) as { model: string };
  const hash = createHash('sha256');
  const send = (o: { event_type: string } & Record<string, unknown>) => {
    const b = Buffer.from(`event: ${o.event_type}\ndata: ${JSON.stringify(o)}\n\n`);
    hash.update(b);
    return res.write(b);
  };
  res.on('close', () => sentHashes.push(hash.digest('hex')));
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  const interaction = { id: 'v1_abc', object: 'interaction', model: body.model };
  send({ event_type: 'interaction.created', interaction: { ...interaction, status: 'in_progress' } });
  send({ event_type: 'step.start', index: 0, step: { type: 'thought' } });
  let k = 0;
  for (const t of THOUGHTS) {
    await sleepUntil(t0, TTFT + GAP * k++);
    send({ event_type: 'step.delta', index: 0, delta: { type: 'thought_summary', content: { type: 'text', text: t } } });
  }
  send({ event_type: 'step.delta', index: 0, delta: { type: 'thought_signature', signature: 'c2ln' } });
  send({ event_type: 'step.stop', index: 0 });
  send({ event_type: 'step.start', index: 1, step: { type: 'model_output' } });
  for (const [i, t] of ANSWER.entries()) {
    await sleepUntil(t0, TTFT + GAP * k++);
    if (res.destroyed) return;
    send({ event_type: 'step.delta', index: 1, delta: { type: 'text', text: t } });
    // The stream the client abandons after its second text waits here until the client has left
    // (5 s at most): sent on the deadlines, the rest went out at once after a stall of the test's
    // process, and the client found the stream complete before it could leave.
    if (body.model === 'gemini-cancelled' && i === 1) {
      await new Promise<void>((r) => {
        const backstop = setTimeout(r, 5000);
        res.once('close', () => (clearTimeout(backstop), r()));
      });
    }
  }
  send({ event_type: 'step.stop', index: 1 });
  send({ event_type: 'interaction.completed', interaction: { ...interaction, status: 'completed', usage: USAGE } });
  res.end();
}

beforeAll(async () => {
  upstream = http.createServer((req, res) => void serve(req, res).catch(() => res.destroy()));
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  const upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  proxy = await startTestProxy(upstreamUrl);
  await warmFetch();
  // One stream straight from the upstream, not timed: the SDK's first stream (its code's first
  // run) added 14-27 ms between the proxy's first event and the application's.
  const direct = new GoogleGenAI({ apiKey: 'test-key', httpOptions: { baseUrl: upstreamUrl } });
  for await (const e of await direct.interactions.create({ model: 'warm-up', input: 'Count.', stream: true })) void e;
});
afterAll(async () => {
  await proxy?.close();
  await new Promise((r) => upstream?.close(r));
});

async function settled(model: string, count: number): Promise<Sample[]> {
  for (let i = 0; ; i++) {
    const s = await scrape(proxy.metricsUrl);
    if (total(s, 'llm_proxy_streams_total', { gen_ai_request_model: model }) >= count || i > 40) return s;
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('@google/genai: interactions.create({ stream: true })', () => {
  it('the SDK gets every event; TTFT at the thought summary, gaps per delta, usage with thoughts, bytes unchanged', async () => {
    // Hashes what the client receives, and stamps when the request went to fetch.
    const received: Promise<string>[] = [];
    const thoughts: string[] = [];
    const text: string[] = [];
    let usage: Record<string, unknown> | undefined;
    const ai = new GoogleGenAI({ apiKey: 'test-key', httpOptions: { baseUrl: proxy.proxyUrl, fetch: hashingFetch(received) } });
    const times = new ClientTimes();
    const stream = await ai.interactions.create({ model: 'gemini-3-flash-preview', input: 'Count to eight.', stream: true });
    for await (const e of stream) {
      if (e.event_type === 'step.delta' && (e.delta.type === 'text' || e.delta.type === 'thought_summary')) times.content();
      if (e.event_type === 'step.delta' && e.delta.type === 'text') text.push(e.delta.text);
      if (e.event_type === 'step.delta' && e.delta.type === 'thought_summary') thoughts.push((e.delta.content as { text: string }).text);
      if (e.event_type === 'interaction.completed') usage = e.interaction.usage as Record<string, unknown>;
    }
    expect(thoughts).toEqual(THOUGHTS);
    expect(text).toEqual(ANSWER);
    expect(usage).toMatchObject(USAGE);
    await new Promise((r) => setTimeout(r, 50));
    expect(await Promise.all(received)).toEqual(sentHashes.slice(-1));

    const s = await settled('gemini-3-flash-preview', 1);
    const f = { gen_ai_request_model: 'gemini-3-flash-preview' };
    const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f);
    expect(ttft.count).toBe(1);
    const b = streamBounds(times, TTFT, TTFT + GAP * (CONTENT_EVENTS - 1));
    between(ttft.mean, b.ttft, 'TTFT');
    const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f);
    expect(gaps.count).toBe(CONTENT_EVENTS - 1);
    between(gaps.mean, b.span, 'mean gap', CONTENT_EVENTS - 1);
    const tpot = hist(s, 'gen_ai_server_time_per_output_token_seconds', f);
    expect(tpot.count).toBe(1);
    const out = USAGE.total_output_tokens + USAGE.total_thought_tokens;
    between(tpot.mean, b.span, 'TPOT', out - 1);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(out);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'reasoning' })).toBe(USAGE.total_thought_tokens);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(USAGE.total_input_tokens);
    const streams = s.filter((x) => x.name === 'llm_proxy_streams_total' && x.labels.gen_ai_request_model === 'gemini-3-flash-preview');
    expect(streams.map((x) => x.labels)).toEqual([
      expect.objectContaining({ gen_ai_provider_name: 'gcp.gemini', gen_ai_operation_name: 'generate_content', outcome: 'ok', token_count_source: 'usage' }),
    ]);
    expect(total(s, 'gen_ai_client_operation_duration_seconds_count', { ...f, gen_ai_response_model: 'gemini-3-flash-preview' })).toBe(1);
  });

  it('a stream the client abandons: cancelled, TTFT and gaps kept, no TPOT (several tokens per event)', async () => {
    const ai = new GoogleGenAI({ apiKey: 'test-key', httpOptions: { baseUrl: proxy.proxyUrl } });
    const stream = await ai.interactions.create({ model: 'gemini-cancelled', input: 'Count.', stream: true });
    let texts = 0;
    // Leaving the loop cancels the SDK's stream, which closes the connection.
    for await (const e of stream) if (e.event_type === 'step.delta' && e.delta.type === 'text' && ++texts === 2) break;
    expect(texts).toBe(2);
    const s = await settled('gemini-cancelled', 1);
    const f = { gen_ai_request_model: 'gemini-cancelled' };
    expect(hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f).count).toBe(1);
    expect(hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f).count).toBeGreaterThanOrEqual(THOUGHTS.length + 1);
    expect(hist(s, 'gen_ai_server_time_per_output_token_seconds', f).count).toBe(0);
    expect(total(s, 'llm_proxy_streams_total', { ...f, outcome: 'cancelled', token_count_source: 'none' })).toBe(1);
  });
});
