import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { createAnthropic } from '@ai-sdk/anthropic';
import { createGoogleGenerativeAI } from '@ai-sdk/google';
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { HTTPClient, Mistral } from '@mistralai/mistralai';
import { generateText, jsonSchema, streamText, tool, type LanguageModel, type ToolSet } from 'ai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { planBlocks, planGroups } from '../../src/simulate/formats/groups.js';
import { createSimulator, type Simulator } from '../../src/simulate/server.js';
import { fullText, promptTokens } from '../../src/simulate/text.js';
import { between, ClientTimes, earliestDue, sleepUntil, streamBounds, warmFetch } from '../helpers/bands.js';
import { hist, scrape, total, type Sample } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';
import { hashingFetch, recordResponses } from '../helpers/recording.js';

// Client libraries not covered elsewhere, pointed at the proxy:
// - the Vercel AI SDK (`ai` 6 with `@ai-sdk/openai` 3, `@ai-sdk/anthropic` 3, `@ai-sdk/google` 3 and
//   `@ai-sdk/openai-compatible` 2: the last lines that run on Node 20; ai 7 and its providers need
//   Node 22), in front of the simulator, whose schedule is the ground truth;
// - Mistral's own SDK (`@mistralai/mistralai`), in front of a hand-written Mistral upstream that
//   sends content event k at MISTRAL_TTFT + k * MISTRAL_GAP from the request's arrival (absolute
//   deadlines: one late timer does not push the rest), with content as a string and, as the
//   magistral reasoning models send it, as a list of thinking / text parts.
// Each test checks what the client got (every event; the same bytes as the upstream sent), what
// the client sent as the upstream saw it after the proxy, and the proxy's metrics.
const PLAN = { ttft: 0.5, itl: 0.025, tokens: 30, jitter: 0.1 };
const N = PLAN.tokens;
const DUE = earliestDue(PLAN);

interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: Record<string, unknown>;
}

let sim: Simulator;
let mock: http.Server;
let mockUrl: string;
let proxy: RunningProxy;
/** sha256 of each response body the simulator / the Mistral upstream wrote, in order of completion. */
let simSent: string[];
let mockSent: string[];
/** sha256 of each response body a client read through hashingFetch. */
const received: Promise<string>[] = [];
/** Every request as it arrived at an upstream (after the proxy), in order of arrival. */
const seen: Seen[] = [];

/** Records each request's method, target, headers and JSON body (beside the server's own handler). */
function recordRequests(server: http.Server): void {
  server.prependListener('request', (req: http.IncomingMessage) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: text ? (JSON.parse(text) as Record<string, unknown>) : {} });
    });
  });
}

// --- The Mistral upstream (`POST /v1/chat/completions`), chunks as La Plateforme streams them: a
// role chunk, content chunks, a finish chunk with `content: ""` that carries the usage, `[DONE]`.
const MISTRAL_TTFT = 0.3;
const MISTRAL_GAP = 0.05;

type Part = { type: 'text'; text: string } | { type: 'thinking'; thinking: { type: 'text'; text: string }[] };
const MISTRAL_TEXT = ['Bonjour', ' !', ' Comment', ' puis', '-je', ' vous', ' aider', ' ?'];
const MISTRAL_USAGE = { prompt_tokens: 9, total_tokens: 17, completion_tokens: 8 };
/** magistral: thinking parts (several tokens each), then text parts, then an empty text part (not content). */
const MAGISTRAL_THINKING = ['The user', ' asks for', ' 2 + 2.'];
const MAGISTRAL_TEXT = ['2 + 2', ' = 4'];
const MAGISTRAL_USAGE = { prompt_tokens: 10, total_tokens: 29, completion_tokens: 19 };
/** Codestral fill-in-the-middle (`POST /v1/fim/completions`): the same chunk shape as chat. */
const CODESTRAL_TEXT = ['(a', ', b', '):', '\n   ', ' return', ' a', ' +', ' b'];
const CODESTRAL_USAGE = { prompt_tokens: 12, total_tokens: 20, completion_tokens: 8 };

async function mistralStream(res: http.ServerResponse, model: string): Promise<void> {
  const t0 = performance.now();
  const id = `cmpl-${model}`;
  const chunk = (delta: Record<string, unknown>, finish: string | null = null, usage?: object) =>
    `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 1760000000, model, choices: [{ index: 0, delta, finish_reason: finish }], ...(usage ? { usage } : {}) })}\n\n`;
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
  res.write(chunk({ role: 'assistant', content: '' }));
  const deltas: (string | Part[])[] = model.startsWith('magistral')
    ? [...MAGISTRAL_THINKING.map((t): Part[] => [{ type: 'thinking', thinking: [{ type: 'text', text: t }] }]), ...MAGISTRAL_TEXT.map((t): Part[] => [{ type: 'text', text: t }])]
    : model.startsWith('codestral')
      ? CODESTRAL_TEXT
      : MISTRAL_TEXT;
  for (const [k, d] of deltas.entries()) {
    await sleepUntil(t0, MISTRAL_TTFT + MISTRAL_GAP * k);
    res.write(chunk({ content: d }));
  }
  await sleepUntil(t0, MISTRAL_TTFT + MISTRAL_GAP * deltas.length);
  if (model.startsWith('magistral')) res.write(chunk({ content: [{ type: 'text', text: '' }] }));
  res.write(chunk({ content: '' }, 'stop', model.startsWith('magistral') ? MAGISTRAL_USAGE : model.startsWith('codestral') ? CODESTRAL_USAGE : MISTRAL_USAGE));
  res.end('data: [DONE]\n\n');
}

beforeAll(async () => {
  sim = createSimulator({ ...PLAN, seed: 23 });
  simSent = recordResponses(sim.server);
  recordRequests(sim.server);
  const simUrl = await sim.listen(0, '127.0.0.1');

  mock = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (c: Buffer) => (raw += c.toString('utf8')));
    req.on('end', () => {
      if (req.method !== 'POST' || (req.url !== '/v1/chat/completions' && req.url !== '/v1/fim/completions')) return void res.writeHead(404).end();
      const model = String((JSON.parse(raw) as { model?: unknown }).model);
      mistralStream(res, model).catch(() => res.destroy());
    });
  });
  mockSent = recordResponses(mock);
  recordRequests(mock);
  await new Promise<void>((r) => mock.listen(0, '127.0.0.1', r));
  mockUrl = `http://127.0.0.1:${(mock.address() as AddressInfo).port}`;

  // `/vllm` stands for an OpenAI-compatible server (vLLM) on a route that names it; `/mistral` for
  // a route to api.mistral.ai, whose host gives `mistral_ai` (here the route says so).
  proxy = await startTestProxy(simUrl, {
    routes: [
      { prefix: '/vllm', upstream: simUrl, providerName: 'vllm' },
      { prefix: '/mistral', upstream: mockUrl, providerName: 'mistral_ai' },
    ],
  });
  await warmFetch();
});
afterAll(async () => {
  await proxy?.close();
  await sim?.close();
  await new Promise((r) => mock?.close(r));
});

/** Scrapes until `count` requests for this model were recorded (the client may finish a moment before the proxy). */
async function settled(model: string, count = 1): Promise<Sample[]> {
  for (let i = 0; ; i++) {
    const s = await scrape(proxy.metricsUrl);
    if (total(s, 'llm_proxy_streams_total', { gen_ai_request_model: model }) >= count || i > 40) return s;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The last `count` bodies the clients read are the last `count` the upstream wrote, byte for byte. */
async function sameBytes(sent: string[], before: number, count: number): Promise<void> {
  const got = await Promise.all(received.slice(before));
  expect(got.length).toBe(count);
  expect(got).toEqual(sent.slice(sent.length - count));
}

/** The request as the upstream saw it: the proxy asked for an uncompressed stream and added its headers. */
function lastRequest(): Seen {
  const r = seen.at(-1)!;
  expect(r.method).toBe('POST');
  expect(r.headers['accept-encoding']).toBe('identity');
  expect(r.headers['x-forwarded-proto']).toBe('http');
  expect(r.headers['x-request-id']).toMatch(/.+/);
  expect(r.headers['content-type']).toBe('application/json');
  return r;
}

interface Expect {
  /** What the application saw of the stream, on the shared clock. */
  times: ClientTimes;
  model: string;
  provider: string;
  operation: string;
  /** Content events, from the simulator's plan (what the client also saw as deltas). */
  events: number;
  /** Output tokens the proxy should report, and where it takes them from. */
  output?: number;
  source?: 'usage' | 'events';
  /** Input tokens the proxy should report (the simulator's count of the recorded body). */
  input?: number;
}

/** The scraped metrics of one request agree with the simulator's schedule, token counts and labels. */
async function checkMetrics(e: Expect): Promise<Sample[]> {
  const s = await settled(e.model);
  const f = { gen_ai_request_model: e.model };
  const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f);
  expect(ttft.count).toBe(1);
  // Events go out when their last token is due: the first no earlier than the first token's
  // due time, the last at the last token's, so the gaps add up to the span of the N tokens.
  const b = streamBounds(e.times, DUE.first, DUE.last);
  between(ttft.sum, b.ttft, 'TTFT');
  const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f);
  expect(gaps.count).toBe(e.events - 1);
  between(gaps.sum, b.span, 'sum of gaps');
  const tpot = hist(s, 'gen_ai_server_time_per_output_token_seconds', f);
  expect(tpot.count).toBe(1);
  between(tpot.sum, b.span, 'TPOT', N - 1);
  expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(e.output ?? N);
  expect(total(s, 'gen_ai_client_token_usage_count', { ...f, gen_ai_token_type: 'output' })).toBe(1);
  if (e.input !== undefined) expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(e.input);
  const streams = s.filter((x) => x.name === 'llm_proxy_streams_total' && x.labels.gen_ai_request_model === e.model && x.value > 0);
  expect(streams.map((x) => [x.labels, x.value])).toEqual([
    [
      expect.objectContaining({ gen_ai_provider_name: e.provider, gen_ai_operation_name: e.operation, server_address: '127.0.0.1', outcome: 'ok', token_count_source: e.source ?? 'usage' }),
      1,
    ],
  ]);
  // The simulator answers with the requested model: the response model label is set from the stream.
  expect(total(s, 'gen_ai_client_operation_duration_seconds_count', { ...f, gen_ai_provider_name: e.provider, gen_ai_response_model: e.model })).toBe(1);
  return s;
}

const multiEvents = (reasoning = false, tool = false) => planGroups(planBlocks(N, reasoning, tool), true).length;
const half = Math.floor(N / 2);

/** Runs streamText to the end and collects what the application sees. */
async function stream(model: LanguageModel, opts: { tools?: ToolSet; providerOptions?: Parameters<typeof streamText>[0]['providerOptions'] } = {}) {
  const times = new ClientTimes();
  const r = streamText({ model, prompt: 'What is the weather in Paris?', maxRetries: 0, ...opts });
  const textDeltas: string[] = [];
  const reasoningDeltas: string[] = [];
  const toolInputDeltas: string[] = [];
  for await (const p of r.fullStream) {
    if (p.type === 'error') throw p.error;
    if (p.type === 'text-delta') textDeltas.push(p.text);
    if (p.type === 'reasoning-delta' && p.text !== '') reasoningDeltas.push(p.text); // Anthropic's signature comes as an empty one
    if (p.type === 'tool-input-delta') toolInputDeltas.push(p.delta);
    if (p.type === 'text-delta' || (p.type === 'reasoning-delta' && p.text !== '') || p.type === 'tool-input-delta') times.content();
  }
  return {
    times,
    textDeltas,
    reasoningDeltas,
    toolInputDeltas,
    text: await r.text,
    reasoning: await r.reasoningText,
    toolCalls: await r.toolCalls,
    usage: await r.usage,
    finishReason: await r.finishReason,
  };
}

const weatherTool = tool({
  description: 'Current weather',
  inputSchema: jsonSchema<{ text: string }>({ type: 'object', properties: { text: { type: 'string' } }, required: ['text'], additionalProperties: false }),
});

describe('ai + @ai-sdk/openai', () => {
  const provider = () => createOpenAI({ apiKey: 'sk-test', baseURL: `${proxy.proxyUrl}/v1`, fetch: hashingFetch(received) });

  it("openai('…'): the default model is the Responses API (POST /v1/responses); one text delta per event, usage from response.completed", async () => {
    const before = received.length;
    const model = 'gpt-5-mini';
    const out = await stream(provider()(model));
    expect(out.textDeltas.length).toBe(N);
    expect(out.text).toBe(fullText(N));
    expect(out.usage).toMatchObject({ outputTokens: N });
    expect(out.finishReason).toBe('stop');
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.url).toBe('/v1/responses');
    expect(req.body).toMatchObject({ model, stream: true, input: [{ role: 'user', content: [{ type: 'input_text', text: 'What is the weather in Paris?' }] }] });
    // Responses has no stream_options: usage always comes with response.completed.
    expect(req.body).not.toHaveProperty('stream_options');
    expect(req.headers).toMatchObject({ authorization: 'Bearer sk-test', accept: '*/*' });
    // The runtime part is `v20.20.2` on Node 20 and `24` on Node 24 (from navigator.userAgent there).
    expect(req.headers['user-agent']).toMatch(new RegExp(`^ai-sdk/openai/3\\.\\S+ ai-sdk/provider-utils/4\\.\\S+ runtime/node\\.js/v?${process.versions.node.split('.')[0]}(\\.|$)`));

    const s = await checkMetrics({ times: out.times, model, provider: 'openai', operation: 'chat', events: N, input: promptTokens(req.body) });
    expect(total(s, 'gen_ai_client_token_usage_sum', { gen_ai_request_model: model, gen_ai_token_type: 'reasoning' })).toBe(0);
  });

  it('Responses with a reasoning summary (providerOptions.openai.reasoningSummary): summary deltas are content, reasoning tokens recorded', async () => {
    const before = received.length;
    const model = 'o4-mini';
    const out = await stream(provider()(model), { providerOptions: { openai: { reasoningEffort: 'low', reasoningSummary: 'auto' } } });
    expect(out.reasoningDeltas.length + out.textDeltas.length).toBe(N);
    expect(out.reasoning).toBe(fullText(half));
    expect(out.reasoning! + out.text).toBe(fullText(N));
    expect(out.usage).toMatchObject({ outputTokens: N, outputTokenDetails: { reasoningTokens: half } });
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.url).toBe('/v1/responses');
    expect(req.body).toMatchObject({ model, stream: true, reasoning: { effort: 'low', summary: 'auto' } });

    const s = await checkMetrics({ times: out.times, model, provider: 'openai', operation: 'chat', events: N, input: promptTokens(req.body) });
    expect(total(s, 'gen_ai_client_token_usage_sum', { gen_ai_request_model: model, gen_ai_token_type: 'reasoning' })).toBe(half);
  });

  it('openai.chat(…): Chat Completions with stream_options.include_usage (the SDK asks for usage itself)', async () => {
    const before = received.length;
    const model = 'gpt-4o-mini';
    const out = await stream(provider().chat(model));
    expect(out.textDeltas.length).toBe(N);
    expect(out.text).toBe(fullText(N));
    expect(out.usage).toMatchObject({ outputTokens: N });
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.url).toBe('/v1/chat/completions');
    expect(req.body).toEqual({ model, stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'What is the weather in Paris?' }] });

    await checkMetrics({ times: out.times, model, provider: 'openai', operation: 'chat', events: N, input: promptTokens(req.body) });
  });

  it('openai.chat(…) with a tool: tool-call argument deltas are the content', async () => {
    const before = received.length;
    const model = 'gpt-4.1-mini';
    const out = await stream(provider().chat(model), { tools: { get_weather: weatherTool } });
    expect(out.toolInputDeltas.length).toBe(N);
    expect(out.toolCalls).toEqual([expect.objectContaining({ toolName: 'get_weather', input: { text: fullText(N) } })]);
    expect(out.finishReason).toBe('tool-calls');
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.url).toBe('/v1/chat/completions');
    expect(req.body).toMatchObject({ model, stream: true, stream_options: { include_usage: true }, tools: [{ type: 'function', function: { name: 'get_weather' } }] });

    await checkMetrics({ times: out.times, model, provider: 'openai', operation: 'chat', events: N, input: promptTokens(req.body) });
  });

  it('abortSignal mid-stream: the SDK closes the connection; recorded as cancelled, output counted from the events seen', async () => {
    const model = 'gpt-4o-cancelled';
    const ac = new AbortController();
    const openai = createOpenAI({ apiKey: 'sk-test', baseURL: `${proxy.proxyUrl}/v1` });
    const times = new ClientTimes();
    // 200 tokens (~5 s): with the plan's 30 the 25 after the abort took ~0.6 s, and a stall of
    // this process that long (the simulator runs in it) would let them all out before the abort.
    const tokens = 200;
    const r = streamText({ model: openai.chat(model), prompt: 'What is the weather in Paris?', maxRetries: 0, abortSignal: ac.signal, headers: { 'x-sim-tokens': String(tokens) } });
    const K = 5;
    let deltas = 0;
    const types: string[] = [];
    for await (const p of r.fullStream) {
      types.push(p.type);
      if (p.type === 'text-delta') times.content();
      if (p.type === 'text-delta' && ++deltas === K) ac.abort();
    }
    // ai 6 ends the stream with an `abort` part instead of throwing.
    expect(types.at(-1)).toBe('abort');
    expect(deltas).toBeGreaterThanOrEqual(K);
    expect(deltas).toBeLessThan(tokens);
    const req = lastRequest();
    expect(req.url).toBe('/v1/chat/completions');
    expect(req.headers['x-sim-tokens']).toBe(String(tokens));

    const f = { gen_ai_request_model: model };
    const s = await settled(model);
    expect(total(s, 'llm_proxy_streams_total', { ...f, gen_ai_provider_name: 'openai', outcome: 'cancelled', token_count_source: 'events' })).toBe(1);
    expect(hist(s, 'gen_ai_client_operation_duration_seconds', { ...f, error_type: 'client_cancelled' }).count).toBe(1);
    const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f);
    expect(ttft.count).toBe(1);
    between(ttft.sum, streamBounds(times, DUE.first, DUE.last).ttft, 'TTFT');
    // The proxy saw the K events the client read, and possibly more that were on their way when
    // the client closed (a stalled client reads late); never the whole stream.
    const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f);
    const events = gaps.count + 1;
    expect(events).toBeGreaterThanOrEqual(deltas);
    expect(events).toBeLessThan(tokens);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(events);
    // TPOT is for successful responses (semantic conventions): the gaps above carry this one's speed.
    expect(hist(s, 'gen_ai_server_time_per_output_token_seconds', f).count).toBe(0);
  });

  it('generateText (not streamed): a Responses JSON answer; usage and duration recorded, no TTFT or gaps', async () => {
    const before = received.length;
    const model = 'gpt-5-nano';
    const times = new ClientTimes(); // hashingFetch stamps `sent` as the SDK's request goes to fetch
    const out = await generateText({ model: provider()(model), prompt: 'What is the weather in Paris?', maxRetries: 0 });
    expect(out.text).toBe(fullText(N));
    expect(out.usage).toMatchObject({ outputTokens: N });
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.url).toBe('/v1/responses');
    expect(req.body).toMatchObject({ model });
    expect(req.body).not.toHaveProperty('stream');

    const f = { gen_ai_request_model: model };
    const s = await settled(model);
    expect(hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f).count).toBe(0);
    expect(hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f).count).toBe(0);
    const duration = hist(s, 'gen_ai_client_operation_duration_seconds', { ...f, gen_ai_response_model: model });
    expect(duration.count).toBe(1);
    // The answer is sent when the last token is due; the proxy's request starts after the SDK's
    // request went to fetch and ends before fetch had the body's last byte (the SDK's own parsing
    // after it, 6-20 ms on its first non-streamed call, stays out of the window).
    expect(times.bodyEnd, 'the body never ended').not.toBeNaN();
    between(duration.sum, [DUE.last, (times.bodyEnd - times.sent) / 1000], 'duration');
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(N);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(promptTokens(req.body));
    expect(total(s, 'llm_proxy_streams_total', { ...f, gen_ai_provider_name: 'openai', gen_ai_operation_name: 'chat', outcome: 'ok', token_count_source: 'usage' })).toBe(1);
  });
});

describe('ai + @ai-sdk/anthropic (Messages)', () => {
  const provider = () => createAnthropic({ apiKey: 'sk-ant-test', baseURL: `${proxy.proxyUrl}/v1`, fetch: hashingFetch(received) });

  it('text: multi-token content_block_delta events, one text delta each; TPOT from message_delta output_tokens', async () => {
    const before = received.length;
    const model = 'claude-sonnet-4-5';
    const out = await stream(provider()(model));
    expect(out.textDeltas.length).toBe(multiEvents());
    expect(multiEvents()).toBeLessThan(N / 2); // the events really carry several tokens
    expect(out.text).toBe(fullText(N));
    expect(out.usage).toMatchObject({ outputTokens: N });
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.url).toBe('/v1/messages');
    expect(req.body).toMatchObject({ model, stream: true, messages: [{ role: 'user', content: [{ type: 'text', text: 'What is the weather in Paris?' }] }] });
    expect(req.body.max_tokens).toEqual(expect.any(Number));
    expect(req.headers).toMatchObject({ 'x-api-key': 'sk-ant-test', 'anthropic-version': '2023-06-01' });
    expect(req.headers['user-agent']).toMatch(/^ai-sdk\/anthropic\/3\./);

    await checkMetrics({ times: out.times, model, provider: 'anthropic', operation: 'chat', events: multiEvents(), input: promptTokens(req.body) });
  });

  it('extended thinking (providerOptions.anthropic.thinking): thinking deltas are content; the signature delta is not', async () => {
    const before = received.length;
    const model = 'claude-opus-4-1';
    const out = await stream(provider()(model), { providerOptions: { anthropic: { thinking: { type: 'enabled', budgetTokens: 1024 } } } });
    expect(out.reasoningDeltas.length + out.textDeltas.length).toBe(multiEvents(true));
    expect(out.reasoning! + out.text).toBe(fullText(N));
    expect(out.reasoning).toBe(fullText(half));
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.body).toMatchObject({ model, stream: true, thinking: { type: 'enabled', budget_tokens: 1024 } });

    await checkMetrics({ times: out.times, model, provider: 'anthropic', operation: 'chat', events: multiEvents(true), input: promptTokens(req.body) });
  });
});

describe('ai + @ai-sdk/google (Gemini streamGenerateContent?alt=sse)', () => {
  const provider = () => createGoogleGenerativeAI({ apiKey: 'g-test', baseURL: `${proxy.proxyUrl}/v1beta`, fetch: hashingFetch(received) });

  it('text: model from the path, cumulative usageMetadata', async () => {
    const before = received.length;
    const model = 'gemini-2.5-flash';
    const out = await stream(provider()(model));
    expect(out.textDeltas.length).toBe(multiEvents());
    expect(out.text).toBe(fullText(N));
    expect(out.usage).toMatchObject({ outputTokens: N });
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.url).toBe(`/v1beta/models/${model}:streamGenerateContent?alt=sse`);
    expect(req.body).toMatchObject({ contents: [{ role: 'user', parts: [{ text: 'What is the weather in Paris?' }] }] });
    expect(req.body).not.toHaveProperty('model');
    expect(req.headers['x-goog-api-key']).toBe('g-test');
    expect(req.headers['user-agent']).toMatch(/^ai-sdk\/google\/3\./);

    await checkMetrics({ times: out.times, model, provider: 'gcp.gemini', operation: 'generate_content', events: multiEvents(), input: promptTokens(req.body) });
  });

  it('a tuned model: the SDK posts a model id with a slash as the path (`/v1beta/tunedModels/{id}`)', async () => {
    const before = received.length;
    const model = 'tunedModels/sentiment-tuned-7';
    const out = await stream(provider()(model));
    expect(out.text).toBe(fullText(N));
    await sameBytes(simSent, before, 1);
    expect(lastRequest().url).toBe(`/v1beta/${model}:streamGenerateContent?alt=sse`);
    // Labelled with its collection: a tuned model's id could also be a base model's name.
    await checkMetrics({ times: out.times, model, provider: 'gcp.gemini', operation: 'generate_content', events: multiEvents(), input: promptTokens(lastRequest().body) });
  });

  it('thoughts (providerOptions.google.thinkingConfig.includeThoughts): thought parts are content; output = candidates + thoughts', async () => {
    const before = received.length;
    const model = 'gemini-2.5-pro';
    const out = await stream(provider()(model), { providerOptions: { google: { thinkingConfig: { includeThoughts: true } } } });
    expect(out.reasoningDeltas.length + out.textDeltas.length).toBe(multiEvents(true));
    expect(out.reasoning).toBe(fullText(half));
    expect(out.reasoning! + out.text).toBe(fullText(N));
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.body).toMatchObject({ generationConfig: { thinkingConfig: { includeThoughts: true } } });

    const s = await checkMetrics({ times: out.times, model, provider: 'gcp.gemini', operation: 'generate_content', events: multiEvents(true), input: promptTokens(req.body) });
    expect(total(s, 'gen_ai_client_token_usage_sum', { gen_ai_request_model: model, gen_ai_token_type: 'reasoning' })).toBe(half);
  });
});

describe('ai + @ai-sdk/openai-compatible (a vLLM-style server)', () => {
  const provider = (includeUsage: boolean) =>
    createOpenAICompatible({ name: 'vllm', baseURL: `${proxy.proxyUrl}/vllm/v1`, includeUsage, fetch: hashingFetch(received) });

  it('includeUsage: true asks for stream_options.include_usage; the count comes from usage', async () => {
    const before = received.length;
    const model = 'Qwen/Qwen3-8B';
    const out = await stream(provider(true)(model));
    expect(out.textDeltas.length).toBe(N);
    expect(out.text).toBe(fullText(N));
    expect(out.usage).toMatchObject({ outputTokens: N });
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.url).toBe('/v1/chat/completions');
    expect(req.body).toMatchObject({ model, stream: true, stream_options: { include_usage: true } });
    expect(req.headers).not.toHaveProperty('authorization');
    expect(req.headers['user-agent']).toMatch(/^ai-sdk\/openai-compatible\/2\./);

    await checkMetrics({ times: out.times, model, provider: 'vllm', operation: 'chat', events: N, input: promptTokens(req.body) });
  });

  it('by default the provider asks for no usage: the proxy counts the content events (and records no input count)', async () => {
    const before = received.length;
    const model = 'meta-llama/Llama-3.1-8B-Instruct';
    const out = await stream(provider(false)(model));
    expect(out.text).toBe(fullText(N));
    expect(out.usage.outputTokens).toBeUndefined();
    await sameBytes(simSent, before, 1);

    const req = lastRequest();
    expect(req.body).toMatchObject({ model, stream: true });
    expect(req.body).not.toHaveProperty('stream_options');

    const s = await checkMetrics({ times: out.times, model, provider: 'vllm', operation: 'chat', events: N, source: 'events' });
    expect(total(s, 'gen_ai_client_token_usage_count', { gen_ai_request_model: model, gen_ai_token_type: 'input' })).toBe(0);
  });
});

describe('@mistralai/mistralai: client.chat.stream (POST /v1/chat/completions)', () => {
  const client = (serverURL: string) => new Mistral({ apiKey: 'mistral-test', serverURL, httpClient: new HTTPClient({ fetcher: hashingFetch(received) }) });

  interface MistralTiming {
    /** What the application saw of the stream, on the shared clock. */
    times: ClientTimes;
    model: string;
    events: number;
    usage: { prompt_tokens: number; completion_tokens: number };
    operation?: string;
  }
  async function checkMistral(t: MistralTiming): Promise<void> {
    const s = await settled(t.model);
    const f = { gen_ai_request_model: t.model };
    const b = streamBounds(t.times, MISTRAL_TTFT, MISTRAL_TTFT + MISTRAL_GAP * (t.events - 1));
    const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f);
    expect(ttft.count).toBe(1);
    between(ttft.sum, b.ttft, 'TTFT');
    const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f);
    expect(gaps.count).toBe(t.events - 1);
    between(gaps.sum, b.span, 'sum of gaps');
    const tpot = hist(s, 'gen_ai_server_time_per_output_token_seconds', f);
    expect(tpot.count).toBe(1);
    between(tpot.sum, b.span, 'TPOT', t.usage.completion_tokens - 1);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(t.usage.completion_tokens);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(t.usage.prompt_tokens);
    const streams = s.filter((x) => x.name === 'llm_proxy_streams_total' && x.labels.gen_ai_request_model === t.model && x.value > 0);
    expect(streams.map((x) => [x.labels, x.value])).toEqual([
      [expect.objectContaining({ gen_ai_provider_name: 'mistral_ai', gen_ai_operation_name: t.operation ?? 'chat', outcome: 'ok', token_count_source: 'usage' }), 1],
    ]);
    expect(total(s, 'gen_ai_client_operation_duration_seconds_count', { ...f, gen_ai_response_model: t.model })).toBe(1);
  }

  /** What the request looked like at the upstream, for both Mistral tests. */
  function checkMistralRequest(model: string): void {
    const req = lastRequest();
    expect(req.url).toBe('/v1/chat/completions');
    // stream: true, and no stream_options: Mistral sends the usage on the finish chunk anyway.
    expect(req.body).toEqual({ model, stream: true, messages: [{ role: 'user', content: 'Bonjour' }] });
    expect(req.headers).toMatchObject({ accept: 'text/event-stream', authorization: 'Bearer mistral-test', 'user-agent': expect.stringMatching(/^mistral-client-typescript\/2\./) });
    // The SDK (Speakeasy-generated) always sets a Cookie header, empty without cookie auth; it is passed on.
    expect(req.headers.cookie).toBe('');
  }

  it('content as a string: every chunk reaches the SDK; usage from the finish chunk', async () => {
    const before = received.length;
    const model = 'mistral-small-latest';
    const deltas: unknown[] = [];
    let usage: unknown;
    let finish: unknown;
    const times = new ClientTimes();
    for await (const e of await client(`${proxy.proxyUrl}/mistral`).chat.stream({ model, messages: [{ role: 'user', content: 'Bonjour' }] })) {
      const c = e.data.choices[0]!;
      if (c.delta.content) times.content();
      if (c.delta.content) deltas.push(c.delta.content);
      if (c.finishReason) finish = c.finishReason;
      if (e.data.usage) usage = e.data.usage;
    }
    expect(deltas).toEqual(MISTRAL_TEXT);
    expect(finish).toBe('stop');
    expect(usage).toEqual({ promptTokens: 9, completionTokens: 8, totalTokens: 17 });
    await sameBytes(mockSent, before, 1);
    checkMistralRequest(model);
    await checkMistral({ times, model, events: MISTRAL_TEXT.length, usage: MISTRAL_USAGE });
  });

  it('magistral: content as a list of thinking and text parts; both are content, the empty text part is not', async () => {
    const before = received.length;
    const model = 'magistral-medium-latest';
    const parts: unknown[] = [];
    const times = new ClientTimes();
    for await (const e of await client(`${proxy.proxyUrl}/mistral`).chat.stream({ model, messages: [{ role: 'user', content: 'Bonjour' }] })) {
      const content = e.data.choices[0]!.delta.content;
      if (Array.isArray(content)) times.content(); // the empty text part too: a later last only widens the bounds
      if (Array.isArray(content)) parts.push(...content);
    }
    expect(parts).toEqual([
      ...MAGISTRAL_THINKING.map((t) => ({ type: 'thinking', thinking: [{ type: 'text', text: t }] })),
      ...MAGISTRAL_TEXT.map((t) => ({ type: 'text', text: t })),
      { type: 'text', text: '' },
    ]);
    await sameBytes(mockSent, before, 1);
    checkMistralRequest(model);
    // 5 content events carrying 19 tokens: TPOT = span / 18, not span / 4.
    await checkMistral({ times, model, events: MAGISTRAL_THINKING.length + MAGISTRAL_TEXT.length, usage: MAGISTRAL_USAGE });
  });
});

describe('@mistralai/mistralai: client.fim.stream (Codestral fill-in-the-middle, POST /v1/fim/completions)', () => {
  it('chat-shaped chunks on a completions path: measured as a text completion, usage from the finish chunk', async () => {
    const before = received.length;
    const model = 'codestral-latest';
    const mistral = new Mistral({ apiKey: 'mistral-test', serverURL: `${proxy.proxyUrl}/mistral`, httpClient: new HTTPClient({ fetcher: hashingFetch(received) }) });
    let code = '';
    const times = new ClientTimes();
    for await (const e of await mistral.fim.stream({ model, prompt: 'def add', suffix: '\n\nprint(add(1, 2))' })) {
      const c = e.data.choices[0]!.delta.content;
      if (typeof c === 'string' && c !== '') times.content(); // not the role chunk's or the finish chunk's ''
      if (typeof c === 'string') code += c;
    }
    expect(code).toBe(CODESTRAL_TEXT.join(''));
    await sameBytes(mockSent, before, 1);

    const req = lastRequest();
    expect(req.url).toBe('/v1/fim/completions');
    expect(req.body).toEqual({ model, stream: true, prompt: 'def add', suffix: '\n\nprint(add(1, 2))' });
    expect(req.headers.accept).toBe('text/event-stream');

    const s = await settled(model);
    const f = { gen_ai_request_model: model };
    const b = streamBounds(times, MISTRAL_TTFT, MISTRAL_TTFT + MISTRAL_GAP * (CODESTRAL_TEXT.length - 1));
    const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f);
    expect(ttft.count).toBe(1);
    between(ttft.sum, b.ttft, 'TTFT');
    const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f);
    expect(gaps.count).toBe(CODESTRAL_TEXT.length - 1);
    between(gaps.sum, b.span, 'sum of gaps');
    expect(hist(s, 'gen_ai_server_time_per_output_token_seconds', f).count).toBe(1);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(CODESTRAL_USAGE.completion_tokens);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(CODESTRAL_USAGE.prompt_tokens);
    expect(total(s, 'llm_proxy_streams_total', { ...f, gen_ai_provider_name: 'mistral_ai', gen_ai_operation_name: 'text_completion', outcome: 'ok', token_count_source: 'usage' })).toBe(1);
  });
});

describe('without the proxy (control)', () => {
  it('both SDKs ask for compressed answers (fetch adds Accept-Encoding: gzip, deflate): the identity above is the proxy rewriting it', async () => {
    const n = seen.length;
    for await (const _ of await new Mistral({ apiKey: 'k', serverURL: mockUrl }).chat.stream({ model: 'mistral-control', messages: [{ role: 'user', content: 'hi' }] })) {
      // drain
    }
    const out = await stream(createOpenAI({ apiKey: 'k', baseURL: `${mockUrl}/v1` }).chat('ai-sdk-control'));
    expect(out.text).toBe(MISTRAL_TEXT.join(''));
    expect(seen.slice(n).map((r) => [r.body.model, r.headers['accept-encoding']])).toEqual([
      ['mistral-control', expect.stringMatching(/gzip/)],
      ['ai-sdk-control', expect.stringMatching(/gzip/)],
    ]);
    // Nothing of this went through the proxy.
    expect(total(await scrape(proxy.metricsUrl), 'llm_proxy_streams_total', { gen_ai_request_model: 'mistral-control' })).toBe(0);
  });
});
