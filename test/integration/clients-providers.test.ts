import Anthropic from '@anthropic-ai/sdk';
import { BedrockRuntimeClient, ConverseStreamCommand, InvokeModelWithResponseStreamCommand } from '@aws-sdk/client-bedrock-runtime';
import { GoogleGenAI } from '@google/genai';
// The Bedrock client defaults to HTTP/2 (h2c on http://), which an HTTP/1.1 proxy does not speak:
// users put it in front of the proxy with the HTTP/1.1 handler, as here (see docs/providers.md).
import { NodeHttpHandler } from '@smithy/node-http-handler';
import { Ollama } from 'ollama';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { planBlocks, planGroups } from '../../src/simulate/formats/groups.js';
import { createSimulator, type Simulator } from '../../src/simulate/server.js';
import { fullText } from '../../src/simulate/text.js';
import { between, ClientTimes, earliestDue, requestSent, streamBounds, warmFetch, within } from '../helpers/bands.js';
import { hist, scrape, total, type Sample } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';
import { hashingFetch, recordResponses } from '../helpers/recording.js';

// Every client library, pointed at the proxy, in front of the simulator speaking its API. The
// proxy's timings are bounded by what each client saw (ClientTimes) and the simulator's schedule.
const PLAN = { ttft: 0.5, itl: 0.025, tokens: 30, jitter: 0.1 };
const N = PLAN.tokens;
const DUE = earliestDue(PLAN);

let sim: Simulator;
let proxy: RunningProxy;
let sent: string[];
const received: Promise<string>[] = [];

beforeAll(async () => {
  sim = createSimulator({ ...PLAN, seed: 11 });
  sent = recordResponses(sim.server);
  const simUrl = await sim.listen(0, '127.0.0.1');
  proxy = await startTestProxy(simUrl);
  await warmFetch();
});
afterAll(async () => {
  await proxy?.close();
  await sim?.close();
});

/** Scrapes until `count` requests for this model were recorded (the client may finish a moment before the proxy). */
async function settled(model: string, count: number): Promise<Sample[]> {
  for (let i = 0; ; i++) {
    const s = await scrape(proxy.metricsUrl);
    if (total(s, 'llm_proxy_streams_total', { gen_ai_request_model: model }) >= count || i > 40) return s;
    await new Promise((r) => setTimeout(r, 50));
  }
}

interface Expect {
  model: string;
  /** What the application saw of each request, on the shared clock. */
  times: ClientTimes[];
  provider: string;
  operation: string;
  /** Content events per request, from the simulator's plan. */
  events: number;
  output?: number;
}

/** The scraped metrics agree with the simulator's schedule (TTFT, gap count and mean, TPOT, tokens). */
async function checkMetrics(e: Expect): Promise<Sample[]> {
  const requests = e.times.length;
  const s = await settled(e.model, requests);
  const f = { gen_ai_request_model: e.model };
  const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f);
  const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f);
  const tpot = hist(s, 'gen_ai_server_time_per_output_token_seconds', f);
  // Events go out when their last token is due: the first no earlier than the first token's due
  // time, the last at the last token's, so the gaps add up to the span of the N tokens. Sums over
  // the requests: the bounds of each add up.
  const b = streamBounds(e.times, DUE.first, DUE.last);
  expect(ttft.count).toBe(requests);
  between(ttft.sum, b.ttft, 'TTFT');
  expect(gaps.count).toBe(requests * (e.events - 1));
  between(gaps.sum, b.span, 'sum of gaps');
  expect(tpot.count).toBe(requests);
  between(tpot.sum, b.span, 'TPOT', N - 1);
  expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' })).toBe(requests * (e.output ?? N));
  expect(total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'input' })).toBeGreaterThan(0);
  const streams = s.filter((x) => x.name === 'llm_proxy_streams_total' && x.labels.gen_ai_request_model === e.model);
  expect(streams.length).toBeGreaterThan(0);
  for (const x of streams) {
    expect(x.labels).toMatchObject({ gen_ai_provider_name: e.provider, gen_ai_operation_name: e.operation, outcome: 'ok', token_count_source: 'usage' });
  }
  return s;
}

const multiEvents = (reasoning = false, tool = false) => planGroups(planBlocks(N, reasoning, tool), true).length;

async function sameBytes(before: number, count: number) {
  const got = await Promise.all(received.slice(before));
  expect(got.length).toBe(count);
  expect(got).toEqual(sent.slice(sent.length - count));
}

describe('openai: Chat Completions and Responses', () => {
  const client = () => new OpenAI({ apiKey: 'sk-test', baseURL: `${proxy.proxyUrl}/v1`, fetch: hashingFetch(received), maxRetries: 0 });

  it('Chat Completions with include_usage and with tools', async () => {
    const before = received.length;
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined;
    const chat = new ClientTimes();
    for await (const c of await client().chat.completions.create({ model: 'c-chat', messages: [{ role: 'user', content: 'hi' }], stream: true, stream_options: { include_usage: true } })) {
      if (c.choices[0]?.delta?.content) chat.content();
      text += c.choices[0]?.delta?.content ?? '';
      if (c.usage) usage = c.usage;
    }
    expect(text).toBe(fullText(N));
    expect(usage?.completion_tokens).toBe(N);
    let args = '';
    const tools = new ClientTimes();
    for await (const c of await client().chat.completions.create({
      model: 'c-chat-tools',
      messages: [{ role: 'user', content: 'weather?' }],
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }],
      stream: true,
      stream_options: { include_usage: true },
    })) {
      if (c.choices[0]?.delta?.tool_calls?.[0]?.function?.arguments) tools.content();
      args += c.choices[0]?.delta?.tool_calls?.[0]?.function?.arguments ?? '';
    }
    expect(JSON.parse(args)).toEqual({ text: fullText(N) });
    await sameBytes(before, 2);
    await checkMetrics({ model: 'c-chat', times: [chat], provider: 'openai', operation: 'chat', events: N });
    await checkMetrics({ model: 'c-chat-tools', times: [tools], provider: 'openai', operation: 'chat', events: N });
  });

  it('Responses: text, reasoning summary, function call', async () => {
    const before = received.length;
    const run = async (model: string, extra: Partial<OpenAI.Responses.ResponseCreateParamsStreaming>) => {
      let text = '';
      let reasoning = '';
      let args = '';
      let done: OpenAI.Responses.Response | undefined;
      const times = new ClientTimes();
      for await (const ev of await client().responses.create({ model, input: 'hi', stream: true, ...extra })) {
        const content = ev.type === 'response.output_text.delta' || ev.type === 'response.reasoning_summary_text.delta' || ev.type === 'response.function_call_arguments.delta';
        if (content && ev.delta) times.content(); // the proxy counts a non-empty delta
        if (ev.type === 'response.output_text.delta') text += ev.delta;
        if (ev.type === 'response.reasoning_summary_text.delta') reasoning += ev.delta;
        if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
        if (ev.type === 'response.completed') done = ev.response;
      }
      return { text, reasoning, args, done, times };
    };
    const a = await run('r-text', {});
    expect(a.text).toBe(fullText(N));
    expect(a.done?.usage?.output_tokens).toBe(N);
    const b = await run('r-reason', { reasoning: { effort: 'low', summary: 'auto' } });
    expect(b.reasoning + b.text).toBe(fullText(N));
    expect(b.done?.usage?.output_tokens_details.reasoning_tokens).toBe(N / 2);
    const c = await run('r-tool', { tools: [{ type: 'function', name: 'get_weather', parameters: { type: 'object', properties: {} }, strict: false }] });
    expect(JSON.parse(c.args)).toEqual({ text: fullText(N) });
    await sameBytes(before, 3);
    await checkMetrics({ model: 'r-text', times: [a.times], provider: 'openai', operation: 'chat', events: N });
    const s = await checkMetrics({ model: 'r-reason', times: [b.times], provider: 'openai', operation: 'chat', events: N });
    expect(total(s, 'gen_ai_client_token_usage_sum', { gen_ai_request_model: 'r-reason', gen_ai_token_type: 'reasoning' })).toBe(N / 2);
    await checkMetrics({ model: 'r-tool', times: [c.times], provider: 'openai', operation: 'chat', events: N });
  });
});

describe('@anthropic-ai/sdk: Messages', () => {
  const client = () => new Anthropic({ apiKey: 'sk-ant-test', baseURL: proxy.proxyUrl, fetch: hashingFetch(received), maxRetries: 0 });
  /** Runs a Messages stream to its final message, timing the content deltas as they reach the application (not the signature). */
  const finalMessage = async (params: Anthropic.MessageStreamParams) => {
    const times = new ClientTimes();
    const msg = await client()
      .messages.stream(params)
      .on('streamEvent', (ev) => {
        if (ev.type !== 'content_block_delta') return;
        const d = ev.delta;
        if ((d.type === 'text_delta' && d.text) || (d.type === 'thinking_delta' && d.thinking) || (d.type === 'input_json_delta' && d.partial_json)) times.content();
      })
      .finalMessage();
    return { msg, times };
  };

  it('text (two requests), thinking, tool use: multi-token events, TPOT from output_tokens', async () => {
    const before = received.length;
    const textTimes: ClientTimes[] = [];
    for (let i = 0; i < 2; i++) {
      const { msg, times } = await finalMessage({ model: 'a-text', max_tokens: 1000, messages: [{ role: 'user', content: 'hi' }] });
      textTimes.push(times);
      expect(msg.content).toEqual([expect.objectContaining({ type: 'text', text: fullText(N) })]);
      expect(msg.usage.output_tokens).toBe(N);
    }
    const { msg: th, times: thinkTimes } = await finalMessage({
      model: 'a-think',
      max_tokens: 2000,
      thinking: { type: 'enabled', budget_tokens: 1024 },
      messages: [{ role: 'user', content: 'hi' }],
    });
    expect(th.content.map((b) => b.type)).toEqual(['thinking', 'text']);
    const thinking = th.content[0]!.type === 'thinking' ? th.content[0]!.thinking : '';
    const answer = th.content[1]!.type === 'text' ? th.content[1]!.text : '';
    expect(thinking + answer).toBe(fullText(N));
    const { msg: tool, times: toolTimes } = await finalMessage({
      model: 'a-tool',
      max_tokens: 1000,
      tools: [{ name: 'get_weather', input_schema: { type: 'object', properties: {} } }],
      messages: [{ role: 'user', content: 'weather?' }],
    });
    expect(tool.stop_reason).toBe('tool_use');
    expect(tool.content[0]).toMatchObject({ type: 'tool_use', name: 'get_weather', input: { text: fullText(N) } });
    await sameBytes(before, 4);
    await checkMetrics({ model: 'a-text', times: textTimes, provider: 'anthropic', operation: 'chat', events: multiEvents() });
    await checkMetrics({ model: 'a-think', times: [thinkTimes], provider: 'anthropic', operation: 'chat', events: multiEvents(true) });
    await checkMetrics({ model: 'a-tool', times: [toolTimes], provider: 'anthropic', operation: 'chat', events: multiEvents(false, true) });
    expect(multiEvents()).toBeLessThan(N / 2); // the events really carry several tokens
  });
});

describe('@google/genai: generateContentStream', () => {
  it('text and thoughts, cumulative usage, model from the path', async () => {
    const before = received.length;
    const ai = new GoogleGenAI({ apiKey: 'test-key', httpOptions: { baseUrl: proxy.proxyUrl, fetch: hashingFetch(received) } });
    let text = '';
    let last: number | undefined;
    const textTimes = new ClientTimes();
    for await (const c of await ai.models.generateContentStream({ model: 'g-text', contents: 'hi' })) {
      if (c.text) textTimes.content();
      text += c.text ?? '';
      last = c.usageMetadata?.candidatesTokenCount ?? last;
    }
    expect(text).toBe(fullText(N));
    expect(last).toBe(N);
    let thoughts = '';
    let answer = '';
    const thinkTimes = new ClientTimes();
    for await (const c of await ai.models.generateContentStream({ model: 'g-think', contents: 'hi', config: { thinkingConfig: { includeThoughts: true } } })) {
      if (c.candidates?.[0]?.content?.parts?.some((p) => p.text)) thinkTimes.content();
      for (const p of c.candidates?.[0]?.content?.parts ?? []) {
        if (p.thought) thoughts += p.text ?? '';
        else answer += p.text ?? '';
      }
    }
    expect(thoughts + answer).toBe(fullText(N));
    expect(thoughts.length).toBeGreaterThan(0);
    await sameBytes(before, 2);
    await checkMetrics({ model: 'g-text', times: [textTimes], provider: 'gcp.gemini', operation: 'generate_content', events: multiEvents() });
    const s = await checkMetrics({ model: 'g-think', times: [thinkTimes], provider: 'gcp.gemini', operation: 'generate_content', events: multiEvents(true) });
    expect(total(s, 'gen_ai_client_token_usage_sum', { gen_ai_request_model: 'g-think', gen_ai_token_type: 'reasoning' })).toBe(N / 2);
  });
});

describe('Gemini REST without alt=sse: a streamed JSON array', () => {
  it('each array element is measured as it arrives (TTFT, gaps), as with SSE', async () => {
    // What a caller gets from the plain REST endpoint (no client library sends this: they all ask for SSE).
    const before = received.length;
    const times = new ClientTimes();
    const res = await hashingFetch(received)(`${proxy.proxyUrl}/v1beta/models/g-array:streamGenerateContent`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-goog-api-key': 'test-key' },
      body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'hi' }] }] }),
    });
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    // Read as it streams: an element with text is timed when its closing brace arrives (a scan
    // of brace depth outside strings; the elements are objects).
    let body = '';
    let depth = 0;
    let inString = false;
    let escaped = false;
    let from = 0;
    const decoder = new TextDecoder();
    for await (const chunk of res.body!) {
      let i = body.length;
      body += decoder.decode(chunk, { stream: true });
      for (; i < body.length; i++) {
        const ch = body[i];
        if (inString) {
          if (escaped) escaped = false;
          else if (ch === '\\') escaped = true;
          else if (ch === '"') inString = false;
        } else if (ch === '"') inString = true;
        else if (ch === '{' && depth++ === 0) from = i;
        else if (ch === '}' && --depth === 0) {
          const el = JSON.parse(body.slice(from, i + 1)) as { candidates?: { content?: { parts?: { text?: string }[] } }[] };
          if (el.candidates?.[0]?.content?.parts?.some((p) => p.text)) times.content();
        }
      }
    }
    const chunks = JSON.parse(body) as { candidates: { content: { parts: { text: string }[] } }[]; usageMetadata: { candidatesTokenCount: number } }[];
    expect(chunks.length).toBe(multiEvents());
    expect(chunks.map((c) => c.candidates[0]!.content.parts[0]!.text).join('')).toBe(fullText(N));
    expect(chunks.at(-1)!.usageMetadata.candidatesTokenCount).toBe(N);
    await sameBytes(before, 1);
    await checkMetrics({ model: 'g-array', times: [times], provider: 'gcp.gemini', operation: 'generate_content', events: multiEvents() });
  });
});

describe('ollama: chat and generate (NDJSON)', () => {
  it('streams; eval_count is the output, eval_duration is exported as the server-reported TPOT', async () => {
    const before = received.length;
    const ollama = new Ollama({ host: proxy.proxyUrl, fetch: hashingFetch(received) });
    let text = '';
    let evalCount: number | undefined;
    const chat = new ClientTimes();
    for await (const part of await ollama.chat({ model: 'o-chat', messages: [{ role: 'user', content: 'hi' }], stream: true })) {
      if (part.message.content) chat.content();
      text += part.message.content;
      if (part.done) evalCount = part.eval_count;
    }
    expect(text).toBe(fullText(N));
    expect(evalCount).toBe(N);
    let gen = '';
    const generate = new ClientTimes();
    for await (const part of await ollama.generate({ model: 'o-gen', prompt: 'hi', stream: true })) {
      if (part.response) generate.content();
      gen += part.response;
    }
    expect(gen).toBe(fullText(N));
    await sameBytes(before, 2);
    const s = await checkMetrics({ model: 'o-chat', times: [chat], provider: 'ollama', operation: 'chat', events: N });
    await checkMetrics({ model: 'o-gen', times: [generate], provider: 'ollama', operation: 'text_completion', events: N });
    const server = hist(s, 'llm_proxy_server_time_per_output_token_seconds', { gen_ai_request_model: 'o-chat' });
    expect(server.count).toBe(1);
    within(server.mean, PLAN.itl, { what: 'server TPOT', rel: 0.01 });
  });
});

/** With `NodeHttpHandler` the Bedrock client sends through node:http, not fetch: the handler stamps when a request goes to it (after signing). */
class StampingHandler extends NodeHttpHandler {
  override handle(...a: Parameters<NodeHttpHandler['handle']>): ReturnType<NodeHttpHandler['handle']> {
    requestSent();
    return super.handle(...a);
  }
}

describe('@aws-sdk/client-bedrock-runtime: ConverseStream and InvokeModelWithResponseStream', () => {
  const client = () =>
    new BedrockRuntimeClient({
      region: 'us-east-1',
      endpoint: proxy.proxyUrl,
      credentials: { accessKeyId: 'AKIDEXAMPLE', secretAccessKey: 'not-a-secret' },
      maxAttempts: 1,
      requestHandler: new StampingHandler(),
    });

  it('ConverseStream: text and usage; model from the path; event-stream framing measured', async () => {
    const modelId = 'anthropic.claude-3-5-sonnet-20240620-v1:0';
    const times = new ClientTimes();
    const out = await client().send(new ConverseStreamCommand({ modelId, messages: [{ role: 'user', content: [{ text: 'hi' }] }] }));
    let text = '';
    let outputTokens: number | undefined;
    for await (const ev of out.stream!) {
      if (ev.contentBlockDelta?.delta?.text) times.content();
      text += ev.contentBlockDelta?.delta?.text ?? '';
      if (ev.metadata) outputTokens = ev.metadata.usage?.outputTokens;
    }
    expect(text).toBe(fullText(N));
    expect(outputTokens).toBe(N);
    await checkMetrics({ model: modelId, times: [times], provider: 'aws.bedrock', operation: 'chat', events: multiEvents() });
  });

  it('InvokeModelWithResponseStream (Anthropic body): chunks decode to the text; invocation metrics exported', async () => {
    const modelId = 'anthropic.claude-sonnet-4-5-20250929-v1:0';
    const times = new ClientTimes();
    const out = await client().send(
      new InvokeModelWithResponseStreamCommand({
        modelId,
        contentType: 'application/json',
        body: JSON.stringify({ anthropic_version: 'bedrock-2023-05-31', max_tokens: 1000, messages: [{ role: 'user', content: 'hi' }] }),
      }),
    );
    let text = '';
    for await (const ev of out.body!) {
      const inner = JSON.parse(Buffer.from(ev.chunk!.bytes!).toString('utf8')) as { type: string; delta?: { text?: string } };
      if (inner.type === 'content_block_delta' && inner.delta?.text) times.content();
      if (inner.type === 'content_block_delta') text += inner.delta?.text ?? '';
    }
    expect(text).toBe(fullText(N));
    const s = await checkMetrics({ model: modelId, times: [times], provider: 'aws.bedrock', operation: 'chat', events: multiEvents() });
    const fb = hist(s, 'llm_proxy_server_time_to_first_token_seconds', { gen_ai_request_model: modelId });
    expect(fb.count).toBe(1);
    within(fb.mean, PLAN.ttft, { what: 'server firstByteLatency' });
  });

  it('the event-stream bytes reach a client unchanged (raw fetch, hashed both ends)', async () => {
    const f = hashingFetch(received);
    const before = received.length;
    for (const op of ['converse-stream', 'invoke-with-response-stream']) {
      const res = await f(`${proxy.proxyUrl}/model/raw-model/${op}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: [{ role: 'user', content: [{ text: 'hi' }] }], max_tokens: 100 }),
      });
      expect(res.headers.get('content-type')).toBe('application/vnd.amazon.eventstream');
      await res.arrayBuffer();
    }
    await sameBytes(before, 2);
  });
});
