import { createHash, type Hash } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { InferenceClient } from '@huggingface/inference';
import { CohereClient, CohereClientV2 } from 'cohere-ai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { between, ClientTimes, sleepUntil, streamBounds, warmFetch } from '../helpers/bands.js';
import { hist, scrape, total, type Sample } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';
import { hashingFetch } from '../helpers/recording.js';

// The APIs that are neither OpenAI-, Anthropic- nor Gemini-shaped, through the proxy, with the
// vendors' own client libraries where there is one: Cohere's `cohere-ai` (Chat v2 SSE and v1
// JSON lines) and Hugging Face's `@huggingface/inference` (TGI's native stream); llama.cpp's
// native `/completion` has no JS SDK, so a plain fetch reads it. The upstream is written here
// from the SDKs' own types and the servers' sources, and sends its events on a fixed schedule:
// content event k at TTFT + k * GAP from the request's arrival (absolute deadlines, so one late
// timer does not push the rest), other events next to the content event they precede.
const TTFT = 0.3; // s to the first content event
const GAP = 0.05; // s between content events

let upstream: http.Server;
let proxy: RunningProxy;
/** sha256 of every response body the upstream sent, in order of the requests. */
const sent: Promise<string>[] = [];
/** sha256 of every response body a client read, in order of the requests. */
const received: Promise<string>[] = [];
/** What each request looked like on arrival at the upstream (after the proxy). */
const requests: { url: string; headers: http.IncomingHttpHeaders; body: Record<string, unknown> }[] = [];

/** One upstream response: a hash of its bytes, and content events on the schedule. */
class Reply {
  private readonly hash: Hash = createHash('sha256');
  private readonly t0 = performance.now();
  private k = 0;
  constructor(readonly res: http.ServerResponse, contentType: string) {
    let done!: (h: string) => void;
    sent.push(new Promise((r) => (done = r)));
    res.on('close', () => done(this.hash.digest('hex')));
    res.writeHead(200, { 'content-type': contentType });
  }
  /** Sends now (not content, or sent with the next content event). */
  write(s: string): void {
    const b = Buffer.from(s);
    this.hash.update(b);
    this.res.write(b);
  }
  /** Waits for the next content event's time, then sends it with whatever comes before it. */
  async content(...s: string[]): Promise<void> {
    await sleepUntil(this.t0, TTFT + GAP * this.k++);
    for (const x of s) this.write(x);
  }
  /** Waits one more GAP (a non-content event sent after the last content). */
  async later(s: string): Promise<void> {
    await sleepUntil(this.t0, TTFT + GAP * this.k);
    this.write(s);
  }
  end(): void {
    this.res.end();
  }
}

// --- Cohere Chat v2 (`POST /v2/chat`): `event: <type>` + `data: <json>`, shapes from cohere-ai's
// `V2ChatStreamResponse` (the SDK turns the wire's snake_case into camelCase).
const sse = (o: { type: string } & Record<string, unknown>) => `event: ${o.type}\ndata: ${JSON.stringify(o)}\n\n`;
const messageStart = (id: string) => sse({ id, type: 'message-start', delta: { message: { role: 'assistant', content: [], tool_plan: '', tool_calls: [], citations: [] } } });
const contentStart = (index: number, type: 'text' | 'thinking') => sse({ type: 'content-start', index, delta: { message: { content: { type, [type]: '' } } } });
const contentDelta = (index: number, content: { text: string } | { thinking: string }) => sse({ type: 'content-delta', index, delta: { message: { content } } });
const contentEnd = (index: number) => sse({ type: 'content-end', index });
const messageEnd = (id: string, finish_reason: string, usage: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
  sse({ id, type: 'message-end', delta: { finish_reason, usage, ...extra } });

const THINKING = ['The user', ' wants', ' to count.'];
const TEXT = ['One', ',', ' two', ',', ' three', '.'];
/** `tokens` is what the model read and wrote (thinking included); `billed_units` is less. */
const COHERE_USAGE = { billed_units: { input_tokens: 12, output_tokens: TEXT.length }, tokens: { input_tokens: 40, output_tokens: THINKING.length + TEXT.length }, cached_tokens: 24 };

async function cohereV2(r: Reply, model: string): Promise<void> {
  const id = `msg_${model}`;
  r.write(messageStart(id));
  if (model === 'command-a-tools') {
    // A tool call: the plan, then the call's arguments (tool-call-start's are empty: not content).
    const plan = ['I will', ' look up', ' the weather.'];
    const args = ['{"loc', 'ation"', ': "Par', 'is"}'];
    for (const p of plan) await r.content(sse({ type: 'tool-plan-delta', delta: { message: { tool_plan: p } } }));
    const start = sse({ type: 'tool-call-start', index: 0, delta: { message: { tool_calls: { id: 'get_weather_1', type: 'function', function: { name: 'get_weather', arguments: '' } } } } });
    for (const [i, a] of args.entries()) await r.content(...(i === 0 ? [start] : []), sse({ type: 'tool-call-delta', index: 0, delta: { message: { tool_calls: { function: { arguments: a } } } } }));
    r.write(sse({ type: 'tool-call-end', index: 0 }));
    await r.later(messageEnd(id, 'TOOL_CALL', { billed_units: { input_tokens: 30, output_tokens: 7 }, tokens: { input_tokens: 900, output_tokens: 7 } }));
  } else if (model === 'command-a-error') {
    // Cohere ends a failed generation with finish_reason ERROR and the message in delta.error.
    r.write(contentStart(0, 'text'));
    await r.content(contentDelta(0, { text: 'Hola' }));
    await r.content(contentDelta(0, { text: ' mundo' }));
    r.write(contentEnd(0));
    await r.later(messageEnd(id, 'ERROR', { tokens: { input_tokens: 8, output_tokens: 2 } }, { error: 'internal server error' }));
  } else {
    r.write(contentStart(0, 'thinking'));
    for (const t of THINKING) await r.content(contentDelta(0, { thinking: t }));
    for (const [i, t] of TEXT.entries()) await r.content(...(i === 0 ? [contentEnd(0), contentStart(1, 'text')] : []), contentDelta(1, { text: t }));
    r.write(contentEnd(1));
    await r.later(messageEnd(id, 'COMPLETE', COHERE_USAGE));
  }
}

// --- Cohere Chat v1 (`POST /v1/chat`): one JSON object a line, `event_type`.
const V1_TEXT = ['Hello', ' there', ',', ' friend', '!'];
async function cohereV1(r: Reply): Promise<void> {
  const line = (o: Record<string, unknown>) => `${JSON.stringify(o)}\n`;
  r.write(line({ is_finished: false, event_type: 'stream-start', generation_id: 'g-1' }));
  for (const t of V1_TEXT) await r.content(line({ is_finished: false, event_type: 'text-generation', text: t }));
  const meta = { api_version: { version: '1' }, billed_units: { input_tokens: 9, output_tokens: 5 }, tokens: { input_tokens: 70, output_tokens: 5 } };
  await r.later(line({ is_finished: true, event_type: 'stream-end', finish_reason: 'COMPLETE', response: { response_id: 'r-1', text: V1_TEXT.join(''), generation_id: 'g-1', chat_history: [], finish_reason: 'COMPLETE', meta } }));
}

// --- TGI `/generate_stream` (router/src/lib.rs `StreamResponse`): `data:` without a space (axum),
// one event a token, the last one the special end-of-sequence token with generated_text and,
// when the request asked for them, details.
const TGI_TOKENS = ['Once', ' upon', ' a', ' time', ',', ' there', ' was'];
const TGI_N = TGI_TOKENS.length + 1; // with </s>
const TGI_INPUT = 6;
async function tgi(r: Reply, details: boolean): Promise<void> {
  const ev = (o: unknown) => `data:${JSON.stringify(o)}\n\n`;
  for (const [i, t] of TGI_TOKENS.entries()) {
    await r.content(ev({ index: i + 1, token: { id: 1000 + i, text: t, logprob: -0.1, special: false }, generated_text: null, details: null }));
  }
  await r.content(
    ev({
      index: TGI_N,
      token: { id: 2, text: '</s>', logprob: -0.01, special: true },
      generated_text: TGI_TOKENS.join(''),
      details: details ? { finish_reason: 'eos_token', generated_tokens: TGI_N, seed: null, input_length: TGI_INPUT } : null,
    }),
  );
}

// --- llama.cpp `/completion` (tools/server/server-task.cpp): `data: ` + JSON, no [DONE];
// `tokens_predicted` running on every chunk; a chunk may carry two tokens (a stop-word prefix
// held back, then released) or none (a token held back).
const LLAMA = [
  { content: 'Today', n: 1 },
  { content: ' in', n: 2 },
  { content: ' Paris', n: 4 },
  { content: '', n: 5 },
  { content: ' sunny', n: 6 },
];
const LLAMA_INPUT = 12;
async function llamacpp(r: Reply): Promise<void> {
  const ev = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
  for (const c of LLAMA) await r.content(ev({ index: 0, content: c.content, tokens: [], stop: false, id_slot: 0, tokens_predicted: c.n, tokens_evaluated: LLAMA_INPUT }));
  await r.later(
    ev({ index: 0, content: '', tokens: [], id_slot: 0, stop: true, model: 'qwen2.5-0.5b-instruct-q8_0.gguf', tokens_predicted: 6, tokens_evaluated: LLAMA_INPUT, stop_type: 'eos', stopping_word: '', tokens_cached: 17, truncated: false }),
  );
}

async function serve(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
  let raw = '';
  for await (const c of req) raw += c;
  const body = JSON.parse(raw) as Record<string, unknown>;
  const url = req.url ?? '';
  requests.push({ url, headers: req.headers, body });
  if (url === '/v2/chat') {
    const r = new Reply(res, 'text/event-stream');
    await cohereV2(r, String(body.model));
    r.end();
  } else if (url === '/v1/chat') {
    const r = new Reply(res, 'application/stream+json');
    await cohereV1(r);
    r.end();
  } else if (url === '/' || url === '/generate_stream') {
    const r = new Reply(res, 'text/event-stream');
    await tgi(r, (body.parameters as { details?: boolean } | undefined)?.details === true);
    r.end();
  } else if (url === '/completion') {
    const r = new Reply(res, 'text/event-stream');
    await llamacpp(r);
    r.end();
  } else {
    res.writeHead(404).end();
  }
}

beforeAll(async () => {
  upstream = http.createServer((req, res) => void serve(req, res).catch(() => res.destroy()));
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  const up = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  // `/tgi` is a TGI server's root: @huggingface/inference posts to the endpoint URL itself (TGI
  // serves `POST /` with `stream: true` as /generate_stream), a path nothing can be detected from.
  // `/cohere` stands for a route to Cohere's host: `/v1/chat` is Cohere's v1 Chat only there
  // (other APIs use that path), which a route to `api.cohere.com` gets from its host.
  proxy = await startTestProxy(up, {
    routes: [
      { prefix: '/tgi', upstream: up, provider: 'tgi-generate' },
      { prefix: '/cohere', upstream: up, providerName: 'cohere' },
    ],
  });
  await warmFetch();
});
afterAll(async () => {
  await proxy?.close();
  await new Promise((r) => upstream?.close(r));
});

/** Each series' growth since `before` (the TGI and llama.cpp requests name no model to filter on). */
function since(before: Sample[], now: Sample[]): Sample[] {
  const key = (s: Sample) => `${s.name}${JSON.stringify(Object.entries(s.labels).sort())}`;
  const old = new Map(before.map((s) => [key(s), s.value]));
  return now.map((s) => ({ ...s, value: s.value - (old.get(key(s)) ?? 0) }));
}

/** Scrapes until `count` more streams matching `f` were recorded (the client may finish a moment before the proxy). */
async function settled(before: Sample[], f: Record<string, string>, count = 1): Promise<Sample[]> {
  for (let i = 0; ; i++) {
    const s = since(before, await scrape(proxy.metricsUrl));
    if (total(s, 'llm_proxy_streams_total', f) >= count || i > 40) return s;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The bytes the client read are the bytes the upstream sent, for the last request. */
async function sameBytes(): Promise<void> {
  expect(received.length).toBe(sent.length);
  expect(await received.at(-1)).toBe(await sent.at(-1));
}

interface Timing {
  /** Content events in the stream. */
  events: number;
  /** Output tokens TPOT divides by (what the model produced). */
  out: number;
  /** Output tokens the usage histogram reports (the billable count where the provider gives one); `out` if unset. */
  usageOut?: number;
  /** Seconds from the first to the last content event. */
  span?: number;
  /** What the application saw of the stream, on the shared clock. */
  times: ClientTimes;
}

/** One request's TTFT, gaps and TPOT against the schedule, bounded by what the client saw. */
function checkTiming(s: Sample[], f: Record<string, string>, t: Timing): void {
  const b = streamBounds(t.times, TTFT, TTFT + (t.span ?? GAP * (t.events - 1)));
  const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f);
  expect(ttft.count).toBe(1);
  between(ttft.sum, b.ttft, 'TTFT');
  const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f);
  expect(gaps.count).toBe(t.events - 1);
  between(gaps.sum, b.span, 'sum of gaps');
  const tpot = hist(s, 'gen_ai_server_time_per_output_token_seconds', f);
  expect(tpot.count).toBe(1);
  between(tpot.sum, b.span, 'TPOT', t.out - 1);
  expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(t.usageOut ?? t.out);
  expect(hist(s, 'gen_ai_client_operation_duration_seconds', f).count).toBe(1);
}

const cohereV2Client = () => new CohereClientV2({ token: 'test-key', baseUrl: proxy.proxyUrl, maxRetries: 0, fetch: hashingFetch(received) });

describe('cohere-ai: CohereClientV2.chatStream (POST /v2/chat, SSE)', () => {
  it('the SDK gets every delta; TTFT at the first thinking delta, a gap per delta; TPOT from tokens, token usage from billed units', async () => {
    const before = await scrape(proxy.metricsUrl);
    const model = 'command-a-reasoning-08-2025';
    const thinking: string[] = [];
    const text: string[] = [];
    let end: unknown;
    const times = new ClientTimes();
    const stream = await cohereV2Client().chatStream({ model, messages: [{ role: 'user', content: 'Count to three.' }] });
    for await (const e of stream) {
      if (e.type === 'content-delta') times.content();
      if (e.type === 'content-delta' && e.delta?.message?.content?.thinking !== undefined) thinking.push(e.delta.message.content.thinking);
      if (e.type === 'content-delta' && e.delta?.message?.content?.text !== undefined) text.push(e.delta.message.content.text);
      if (e.type === 'message-end') end = e.delta;
    }
    expect(thinking).toEqual(THINKING);
    expect(text).toEqual(TEXT);
    expect(end).toMatchObject({ finishReason: 'COMPLETE', usage: { tokens: { inputTokens: 40, outputTokens: 9 }, billedUnits: { outputTokens: TEXT.length }, cachedTokens: 24 } });
    await sameBytes();
    // What the real client sends: the path, JSON with stream: true, and Accept: text/event-stream.
    const req = requests.at(-1)!;
    expect(req).toMatchObject({ url: '/v2/chat', body: { model, stream: true, messages: [{ role: 'user', content: 'Count to three.' }] } });
    expect(req.headers).toMatchObject({ accept: 'text/event-stream', authorization: 'Bearer test-key', 'content-type': 'application/json' });

    const f = { gen_ai_request_model: model };
    const s = await settled(before, f);
    // Semantic conventions: "When systems report both used tokens and billable tokens,
    // instrumentation MUST report billable tokens." TPOT divides the streamed span by what was produced.
    checkTiming(s, f, { times, events: THINKING.length + TEXT.length, out: COHERE_USAGE.tokens.output_tokens, usageOut: COHERE_USAGE.billed_units.output_tokens });
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(COHERE_USAGE.billed_units.input_tokens);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'cached_input' })).toBe(COHERE_USAGE.cached_tokens);
    const streams = s.filter((x) => x.name === 'llm_proxy_streams_total' && x.value > 0);
    expect(streams.map((x) => x.labels)).toEqual([
      expect.objectContaining({ gen_ai_provider_name: 'cohere', gen_ai_operation_name: 'chat', gen_ai_request_model: model, outcome: 'ok', token_count_source: 'usage' }),
    ]);
  });

  it('a tool call: tool-plan and tool-call argument deltas are the content', async () => {
    const before = await scrape(proxy.metricsUrl);
    const model = 'command-a-tools';
    let plan = '';
    let args = '';
    let finish: unknown;
    const times = new ClientTimes();
    const stream = await cohereV2Client().chatStream({
      model,
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { location: { type: 'string' } } } } }],
    });
    for await (const e of stream) {
      if (e.type === 'tool-plan-delta' || e.type === 'tool-call-delta') times.content();
      if (e.type === 'tool-plan-delta') plan += e.delta?.message?.toolPlan ?? '';
      if (e.type === 'tool-call-start') expect(e.delta?.message?.toolCalls).toMatchObject({ id: 'get_weather_1', function: { name: 'get_weather' } });
      if (e.type === 'tool-call-delta') args += e.delta?.message?.toolCalls?.function?.arguments ?? '';
      if (e.type === 'message-end') finish = e.delta?.finishReason;
    }
    expect(plan).toBe('I will look up the weather.');
    expect(JSON.parse(args)).toEqual({ location: 'Paris' });
    expect(finish).toBe('TOOL_CALL');
    await sameBytes();

    const f = { gen_ai_request_model: model };
    const s = await settled(before, f);
    checkTiming(s, f, { times, events: 7, out: 7 });
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(30); // billed (900 read)
    expect(total(s, 'llm_proxy_streams_total', { ...f, gen_ai_provider_name: 'cohere', outcome: 'ok', token_count_source: 'usage' })).toBe(1);
  });

  it('message-end with finish_reason ERROR: an in-band error (error_type "error"), the deltas before it measured', async () => {
    const before = await scrape(proxy.metricsUrl);
    const model = 'command-a-error';
    const text: string[] = [];
    let end: unknown;
    const times = new ClientTimes();
    const stream = await cohereV2Client().chatStream({ model, messages: [{ role: 'user', content: 'Hola' }] });
    for await (const e of stream) {
      if (e.type === 'content-delta') times.content();
      if (e.type === 'content-delta') text.push(e.delta?.message?.content?.text ?? '');
      if (e.type === 'message-end') end = e.delta;
    }
    // The SDK does not throw: the error is in the last event, for the caller to see.
    expect(text).toEqual(['Hola', ' mundo']);
    expect(end).toMatchObject({ finishReason: 'ERROR', error: 'internal server error' });
    await sameBytes();

    const f = { gen_ai_request_model: model, gen_ai_provider_name: 'cohere' };
    const s = await settled(before, f);
    expect(total(s, 'llm_proxy_streams_total', { ...f, outcome: 'error' })).toBe(1);
    expect(total(s, 'llm_proxy_streams_total', { ...f, outcome: 'ok' })).toBe(0);
    expect(hist(s, 'gen_ai_client_operation_duration_seconds', { ...f, error_type: 'error' }).count).toBe(1);
    const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f);
    expect(ttft.count).toBe(1);
    between(ttft.sum, streamBounds(times, TTFT, TTFT + GAP).ttft, 'TTFT');
    expect(hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f).count).toBe(1);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(2);
    // TPOT is for successful responses (semantic conventions), so a failed one records none.
    expect(hist(s, 'gen_ai_server_time_per_output_token_seconds', f).count).toBe(0);
  });
});

describe('cohere-ai: CohereClient.chatStream (POST /v1/chat, JSON lines)', () => {
  it('the SDK gets every text-generation line; application/stream+json is measured as JSON lines', async () => {
    const before = await scrape(proxy.metricsUrl);
    const model = 'command-r-08-2024';
    const text: string[] = [];
    let end: unknown;
    const co = new CohereClient({ token: 'test-key', baseUrl: `${proxy.proxyUrl}/cohere`, maxRetries: 0, fetch: hashingFetch(received) });
    const times = new ClientTimes();
    const stream = await co.chatStream({ model, message: 'Say hello.' });
    for await (const e of stream) {
      if (e.eventType === 'text-generation') times.content();
      if (e.eventType === 'text-generation') text.push(e.text);
      if (e.eventType === 'stream-end') end = e;
    }
    expect(text).toEqual(V1_TEXT);
    expect(end).toMatchObject({ finishReason: 'COMPLETE', response: { text: V1_TEXT.join(''), meta: { tokens: { inputTokens: 70, outputTokens: 5 } } } });
    await sameBytes();
    // v1 asks for its default framing (JSON lines) with no particular Accept.
    const req = requests.at(-1)!;
    expect(req).toMatchObject({ url: '/v1/chat', body: { model, message: 'Say hello.', stream: true } });
    expect(req.headers.accept).toBe('*/*');

    const f = { gen_ai_request_model: model };
    const s = await settled(before, f);
    checkTiming(s, f, { times, events: V1_TEXT.length, out: 5 });
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(9); // billed (70 read)
    expect(total(s, 'llm_proxy_streams_total', { ...f, gen_ai_provider_name: 'cohere', gen_ai_operation_name: 'chat', outcome: 'ok', token_count_source: 'usage' })).toBe(1);
  });
});

// @huggingface/inference is held below 4.13.17: from 4.13.17 on, textGenerationStream with an
// endpointUrl posts an OpenAI Completions body to `<endpointUrl>/v1/completions` (and yields those
// chunks under the TGI type), so no release after 4.13.16 reaches TGI's native stream.
describe('@huggingface/inference: textGenerationStream against a TGI endpoint (native stream)', () => {
  async function run(endpointUrl: string, details: boolean) {
    const hf = new InferenceClient('hf_test', { endpointUrl, fetch: hashingFetch(received) });
    const tokens: { text: string; special: boolean }[] = [];
    let generated: string | null = null;
    let got: unknown;
    const times = new ClientTimes();
    for await (const e of hf.textGenerationStream({ inputs: 'Tell me a story.', parameters: { max_new_tokens: 20, details } })) {
      times.content(); // every token event is content, </s> included
      tokens.push({ text: e.token.text, special: e.token.special });
      if (e.generated_text !== null) generated = e.generated_text;
      if (e.details) got = e.details;
    }
    expect(tokens.map((t) => t.text)).toEqual([...TGI_TOKENS, '</s>']);
    expect(tokens.map((t) => t.special)).toEqual([...TGI_TOKENS.map(() => false), true]);
    expect(generated).toBe(TGI_TOKENS.join(''));
    if (details) expect(got).toMatchObject({ finish_reason: 'eos_token', generated_tokens: TGI_N, input_length: TGI_INPUT });
    else expect(got).toBeUndefined();
    await sameBytes();
    return times;
  }

  it('endpointUrl = the server root: the client posts to it; a route forced to tgi-generate measures it; usage from details', async () => {
    const before = await scrape(proxy.metricsUrl);
    const times = await run(`${proxy.proxyUrl}/tgi`, true);
    const req = requests.at(-1)!;
    expect(req).toMatchObject({ url: '/', body: { inputs: 'Tell me a story.', parameters: { max_new_tokens: 20, details: true }, stream: true } });
    expect(req.body).not.toHaveProperty('model');
    expect(req.headers).toMatchObject({ authorization: 'Bearer hf_test', 'content-type': 'application/json', accept: '*/*' });
    expect(req.headers['user-agent']).toMatch(/^@huggingface\/inference\/4\./);

    const f = { gen_ai_provider_name: 'tgi' };
    const s = await settled(before, f);
    // Every token event is a token, </s> included: N events, N − 1 gaps, TPOT = GAP.
    checkTiming(s, f, { times, events: TGI_N, out: TGI_N });
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(TGI_INPUT);
    const streams = s.filter((x) => x.name === 'llm_proxy_streams_total' && x.value > 0);
    expect(streams.map((x) => x.labels)).toEqual([
      expect.objectContaining({ gen_ai_provider_name: 'tgi', gen_ai_operation_name: 'text_completion', outcome: 'ok', token_count_source: 'usage' }),
    ]);
    expect(streams[0]!.labels).not.toHaveProperty('gen_ai_request_model');
  });

  it('endpointUrl = …/generate_stream, no details: detected from the path; the token events are the count', async () => {
    const before = await scrape(proxy.metricsUrl);
    const times = await run(`${proxy.proxyUrl}/generate_stream`, false);
    expect(requests.at(-1)).toMatchObject({ url: '/generate_stream', body: { stream: true } });

    const f = { gen_ai_provider_name: 'tgi' };
    const s = await settled(before, f);
    checkTiming(s, f, { times, events: TGI_N, out: TGI_N });
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(0);
    expect(total(s, 'llm_proxy_streams_total', { ...f, gen_ai_operation_name: 'text_completion', outcome: 'ok', token_count_source: 'events' })).toBe(1);
  });
});

describe('fetch: llama.cpp native /completion (no official JS SDK)', () => {
  it('TPOT from the running tokens_predicted, input from tokens_evaluated; a chunk with no text is no event', async () => {
    const before = await scrape(proxy.metricsUrl);
    const times = new ClientTimes();
    const res = await hashingFetch(received)(`${proxy.proxyUrl}/completion`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'Weather?', n_predict: 16, stream: true }),
    });
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    // Read as it streams, to time the events with text as they arrive.
    const contents: string[] = [];
    let body = '';
    const decoder = new TextDecoder();
    for await (const chunk of res.body!) {
      body += decoder.decode(chunk, { stream: true });
      const events = body.split('\n\n');
      body = events.pop()!;
      for (const e of events.filter((b) => b.startsWith('data: '))) {
        const c = (JSON.parse(e.slice('data: '.length)) as { content: string }).content;
        if (c !== '') times.content();
        contents.push(c);
      }
    }
    const text = contents.join('');
    expect(text).toBe(LLAMA.map((c) => c.content).join(''));
    await sameBytes();

    const f = { gen_ai_provider_name: 'llama.cpp' };
    const s = await settled(before, f);
    // Text at k = 0, 1, 2 and 4 (k = 3 held a token back): 3 gaps over 4 GAPs; 6 tokens.
    checkTiming(s, f, { times, events: 4, out: 6, span: 4 * GAP });
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBe(LLAMA_INPUT);
    const streams = s.filter((x) => x.name === 'llm_proxy_streams_total' && x.value > 0);
    expect(streams.map((x) => x.labels)).toEqual([
      expect.objectContaining({ gen_ai_provider_name: 'llama.cpp', gen_ai_operation_name: 'text_completion', outcome: 'ok', token_count_source: 'usage' }),
    ]);
    expect(total(s, 'gen_ai_client_operation_duration_seconds_count', { ...f, gen_ai_response_model: 'qwen2.5-0.5b-instruct-q8_0.gguf' })).toBe(1);
  });
});
