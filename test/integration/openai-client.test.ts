import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { createSimulator, type Simulator } from '../../src/simulate/server.js';
import { between, ClientTimes, earliestDue, streamBounds, warmFetch } from '../helpers/bands.js';
import { hist, scrape, total } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';
import { hashingFetch, recordResponses } from '../helpers/recording.js';

// The official client, pointed at the proxy, in front of the simulator. Simulator, proxy and
// client share one clock: the proxy's timings are bounded by what the client saw and the schedule.
const PLAN = { ttft: 0.3, itl: 0.004, tokens: 40, jitter: 0.2 };
const DUE = earliestDue(PLAN);

let sim: Simulator;
let proxy: RunningProxy;
let sent: string[];
const received: Promise<string>[] = [];
let client: OpenAI;
let simUrl: string;

beforeAll(async () => {
  sim = createSimulator({ ...PLAN, seed: 7 });
  sent = recordResponses(sim.server);
  simUrl = await sim.listen(0, '127.0.0.1');
  proxy = await startTestProxy(simUrl);
  client = new OpenAI({ apiKey: 'sk-test-not-a-key', baseURL: `${proxy.proxyUrl}/v1`, fetch: hashingFetch(received), maxRetries: 0 });
  await warmFetch();
});
afterAll(async () => {
  await proxy?.close();
  await sim?.close();
});

async function metricsFor(model: string) {
  const s = await scrape(proxy.metricsUrl);
  const f = { gen_ai_request_model: model };
  return {
    ttft: hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f),
    gaps: hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f),
    tpot: hist(s, 'gen_ai_server_time_per_output_token_seconds', f),
    duration: hist(s, 'gen_ai_client_operation_duration_seconds', f),
    outTokens: total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' }),
    inTokens: total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' }),
    samples: s,
  };
}

describe('official openai client through the proxy', () => {
  it('streams with include_usage: bytes identical, metrics match the schedule', async () => {
    const n = 5;
    const before = received.length;
    const times: ClientTimes[] = [];
    for (let i = 0; i < n; i++) {
      const t = new ClientTimes();
      times.push(t);
      const stream = await client.chat.completions.create({
        model: 'usage-model',
        messages: [{ role: 'user', content: 'weather?' }],
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = '';
      let usage: OpenAI.CompletionUsage | null | undefined;
      for await (const chunk of stream) {
        if (chunk.choices[0]?.delta?.content) t.content();
        text += chunk.choices[0]?.delta?.content ?? '';
        if (chunk.usage) usage = chunk.usage;
      }
      expect(text.length).toBeGreaterThan(0);
      expect(text).toContain('°C');
      expect(usage?.completion_tokens).toBe(PLAN.tokens);
    }
    const got = await Promise.all(received.slice(before));
    expect(got).toEqual(sent.slice(sent.length - n));
    const m = await metricsFor('usage-model');
    const b = streamBounds(times, DUE.first, DUE.last);
    expect(m.ttft.count).toBe(n);
    between(m.ttft.sum, b.ttft, 'TTFT');
    expect(m.gaps.count).toBe(n * (PLAN.tokens - 1));
    between(m.gaps.sum, b.span, 'sum of gaps');
    expect(m.tpot.count).toBe(n);
    between(m.tpot.sum, b.span, 'TPOT', PLAN.tokens - 1);
    // Exactly: each stream's TPOT is its span over (tokens - 1), its gaps sum to that span.
    expect(Math.abs(m.tpot.sum * (PLAN.tokens - 1) - m.gaps.sum)).toBeLessThanOrEqual(1e-6 * n);
    expect(m.outTokens).toBe(n * PLAN.tokens);
    expect(m.inTokens).toBeGreaterThan(0);
    expect(total(m.samples, 'llm_proxy_streams_total', { gen_ai_request_model: 'usage-model', token_count_source: 'usage' })).toBe(n);
  });

  it('streams without usage: tokens are counted from events', async () => {
    const times = new ClientTimes();
    const stream = await client.chat.completions.create({ model: 'count-model', messages: [{ role: 'user', content: 'x' }], stream: true });
    let chunks = 0;
    for await (const c of stream) {
      if (!c.choices[0]?.delta?.content) continue;
      times.content();
      chunks++;
    }
    expect(chunks).toBe(PLAN.tokens);
    const m = await metricsFor('count-model');
    expect(m.outTokens).toBe(PLAN.tokens);
    expect(total(m.samples, 'llm_proxy_streams_total', { gen_ai_request_model: 'count-model', token_count_source: 'events' })).toBe(1);
    between(m.tpot.sum, streamBounds(times, DUE.first, DUE.last).span, 'TPOT', PLAN.tokens - 1);
    expect(Math.abs(m.tpot.sum * (PLAN.tokens - 1) - m.gaps.sum)).toBeLessThanOrEqual(1e-6);
  });

  it('streams tool-call arguments as content', async () => {
    const stream = await client.chat.completions.create({
      model: 'tool-model',
      messages: [{ role: 'user', content: 'x' }],
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { text: { type: 'string' } } } } }],
      stream: true,
      stream_options: { include_usage: true },
    });
    let args = '';
    let name = '';
    for await (const c of stream) {
      const tc = c.choices[0]?.delta?.tool_calls?.[0];
      if (tc?.function?.name) name = tc.function.name;
      args += tc?.function?.arguments ?? '';
    }
    expect(name).toBe('get_weather');
    expect(JSON.parse(args)).toHaveProperty('text');
    const m = await metricsFor('tool-model');
    expect(m.ttft.count).toBe(1);
    expect(m.gaps.count).toBe(PLAN.tokens - 1);
    expect(m.outTokens).toBe(PLAN.tokens);
  });

  it('non-streaming: usage from the JSON body, no TTFT', async () => {
    const r = await client.chat.completions.create({ model: 'plain-model', messages: [{ role: 'user', content: 'x' }] });
    expect(r.usage?.completion_tokens).toBe(PLAN.tokens);
    const m = await metricsFor('plain-model');
    expect(m.ttft.count).toBe(0);
    expect(m.duration.count).toBe(1);
    expect(m.outTokens).toBe(PLAN.tokens);
  });

  it('the simulator ends an answer cut by max_tokens with finish_reason "length", and refuses an unknown plan key', async () => {
    const stream = await client.chat.completions.create({ model: 'capped-model', max_tokens: 7, messages: [{ role: 'user', content: 'x' }], stream: true });
    const reasons: (string | null)[] = [];
    for await (const chunk of stream) reasons.push(chunk.choices[0]?.finish_reason ?? null);
    expect(reasons.filter((r) => r !== null)).toEqual(['length']);
    expect(reasons.length).toBe(1 + 7 + 1); // role chunk, 7 tokens, finish chunk
    const plain = await client.chat.completions.create({ model: 'capped-model', max_tokens: PLAN.tokens + 1, messages: [{ role: 'user', content: 'x' }] });
    expect(plain.choices[0]?.finish_reason).toBe('stop');
    const put = await fetch(`${simUrl}/_sim/config`, { method: 'PUT', body: '{"itll":0.002}' });
    expect(put.status).toBe(400);
    expect(((await put.json()) as { error: { message: string } }).error.message).toMatch(/unknown key itll/);
    const notJson = await fetch(`${simUrl}/_sim/config`, { method: 'PUT', body: '{itl: 0.002}' });
    expect(notJson.status).toBe(400);
    await notJson.arrayBuffer();
  });

  it('the simulator refuses a plan it cannot keep or a bad x-sim-* header with a 400, and the plan stays as it was', async () => {
    const before = await (await fetch(`${simUrl}/_sim/config`)).json();
    // Node timers hold at most ~24.8 days: a longer delay fired every millisecond (a warning each).
    for (const patch of ['{"itl":3000000}', '{"ttft":1e300}', '{"tokens":5000000000}', '{"jitter":5}', '{"itl":3,"tokens":1000000}']) {
      const r = await fetch(`${simUrl}/_sim/config`, { method: 'PUT', body: patch });
      expect(r.status, patch).toBe(400);
      await r.arrayBuffer();
    }
    expect(await (await fetch(`${simUrl}/_sim/config`)).json()).toEqual(before);
    for (const [name, value] of [['x-sim-tokens', '-5'], ['x-sim-ttft', 'abc'], ['x-sim-ttft', '3000000'], ['x-sim-itl', '']] as [string, string][]) {
      const r = await fetch(`${simUrl}/v1/chat/completions`, { method: 'POST', headers: { [name]: value }, body: '{"model":"m","stream":true}' });
      expect(r.status, `${name}: ${value}`).toBe(400);
      expect(((await r.json()) as { error: { message: string } }).error.message).toContain(name);
    }
    const ok = await fetch(`${simUrl}/v1/chat/completions`, { method: 'POST', headers: { 'x-sim-tokens': '3', 'x-sim-ttft': '0' }, body: '{"model":"m","stream":true}' });
    expect(ok.status).toBe(200);
    expect((await ok.text()).match(/"content":"[^"]+"/g)).toHaveLength(3);
  });

  it('the simulator allows cross-origin calls as vLLM does (a browser page through the proxy): preflight answered, ACAO on answers', async () => {
    const origin = { origin: 'http://127.0.0.1:1' };
    const pre = await fetch(`${proxy.proxyUrl}/v1/chat/completions`, {
      method: 'OPTIONS',
      headers: { ...origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization,content-type,x-stainless-os' },
    });
    expect(pre.status).toBe(204);
    expect(pre.headers.get('access-control-allow-origin')).toBe('*');
    expect(pre.headers.get('access-control-allow-methods')).toContain('POST');
    expect(pre.headers.get('access-control-allow-headers')).toBe('authorization,content-type,x-stainless-os');
    const r = await fetch(`${proxy.proxyUrl}/v1/chat/completions`, { method: 'POST', headers: origin, body: '{"model":"cors-model","stream":true,"max_tokens":2}' });
    expect(r.headers.get('access-control-allow-origin')).toBe('*');
    expect((await r.text()).match(/"content":"[^"]+"/g)).toHaveLength(2);
    const notFound = await fetch(`${proxy.proxyUrl}/v1/nothing`, { method: 'POST', headers: origin, body: '{}' });
    expect(notFound.status).toBe(404);
    expect(notFound.headers.get('access-control-allow-origin')).toBe('*');
    await notFound.arrayBuffer();
    // The plan is not the pages' to read or change.
    const config = await fetch(`${simUrl}/_sim/config`, { headers: origin });
    expect(config.status).toBe(200);
    expect(config.headers.get('access-control-allow-origin')).toBeNull();
    await config.arrayBuffer();
    const configPre = await fetch(`${simUrl}/_sim/config`, { method: 'OPTIONS', headers: { ...origin, 'access-control-request-method': 'PUT' } });
    expect(configPre.headers.get('access-control-allow-origin')).toBeNull();
    await configPre.arrayBuffer();
  });

  it('a Responses stream cut by max_output_tokens ends response.incomplete, and its usage is still measured', async () => {
    const stream = await client.responses.create({ model: 'incomplete-model', input: 'x', max_output_tokens: 16, stream: true });
    const types: string[] = [];
    let reason: string | undefined;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'response.incomplete') reason = ev.response.incomplete_details?.reason;
    }
    expect(types.at(-1)).toBe('response.incomplete');
    expect(types).not.toContain('response.completed');
    expect(reason).toBe('max_output_tokens');
    const m = await metricsFor('incomplete-model');
    expect(m.outTokens).toBe(16);
    expect(m.tpot.count).toBe(1);
    expect(total(m.samples, 'llm_proxy_streams_total', { gen_ai_request_model: 'incomplete-model', outcome: 'ok', token_count_source: 'usage' })).toBe(1);
  });

  it('the simulator reports a token limit the way each API does', async () => {
    const post = async (path: string, body: object) => (await fetch(`${simUrl}${path}`, { method: 'POST', body: JSON.stringify(body) })).text();
    expect(await post('/v1/messages', { model: 'm', max_tokens: 3, messages: [], stream: true })).toContain('"stop_reason":"max_tokens"');
    expect(await post('/v1/messages', { model: 'm', max_tokens: 3, messages: [] })).toContain('"stop_reason":"max_tokens"');
    expect(await post('/v1/messages', { model: 'm', max_tokens: 1000, messages: [] })).toContain('"stop_reason":"end_turn"');
    expect(await post('/v1beta/models/g:streamGenerateContent?alt=sse', { contents: [], generationConfig: { maxOutputTokens: 3 } })).toContain('"finishReason":"MAX_TOKENS"');
    expect(await post('/api/chat', { model: 'm', messages: [], options: { num_predict: 3 } })).toContain('"done_reason":"length"');
    expect(await post('/model/m/converse', { messages: [], inferenceConfig: { maxTokens: 3 } })).toContain('"stopReason":"max_tokens"');
  });

  it('abort mid-stream: recorded as client_cancelled, nothing left in flight', async () => {
    const ac = new AbortController();
    // 400 tokens (~1.6 s): with the plan's 40 the 35 after the abort took 0.14 s, and a stall of
    // this process that long (the simulator runs in it) would let them all out before the abort.
    const tokens = 400;
    const stream = await client.chat.completions.create(
      { model: 'abort-model', messages: [{ role: 'user', content: 'x' }], stream: true },
      { signal: ac.signal, headers: { 'x-sim-tokens': String(tokens) } },
    );
    let seen = 0;
    try {
      for await (const c of stream) {
        if (c.choices[0]?.delta?.content) seen++;
        if (seen === 5) ac.abort();
      }
    } catch (e) {
      expect((e as Error).name).toMatch(/Abort/);
    }
    expect(seen).toBeLessThan(tokens);
    const deadline = Date.now() + 3000;
    let cancelled = 0;
    while (Date.now() < deadline) {
      const s = await scrape(proxy.metricsUrl);
      cancelled = hist(s, 'gen_ai_client_operation_duration_seconds', { gen_ai_request_model: 'abort-model', error_type: 'client_cancelled' }).count;
      if (cancelled === 1) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(cancelled).toBe(1);
    expect(proxy.forwarder.inFlight.size).toBe(0);
  });
});
