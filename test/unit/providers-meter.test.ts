import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import { RequestMeter } from '../../src/measure/request-meter.js';
import { ChunkedDecoder } from '../../src/proxy/chunked.js';
import { METRIC } from '../../src/metrics/semconv.js';
import { AnthropicAdapter } from '../../src/providers/anthropic.js';
import { BedrockAdapter } from '../../src/providers/bedrock.js';
import { detectApi } from '../../src/providers/detect.js';
import { GeminiAdapter } from '../../src/providers/gemini.js';
import { GenericAdapter } from '../../src/providers/generic.js';
import { OllamaAdapter } from '../../src/providers/ollama.js';
import { OpenAIChatAdapter } from '../../src/providers/openai-chat.js';
import { OpenAIResponsesAdapter } from '../../src/providers/openai-responses.js';
import type { ResponseAdapter } from '../../src/providers/types.js';
import { encodeEventStreamFrame } from '../../src/sse/eventstream.js';
import { fixture, geminiArray } from '../helpers/fixtures.js';
import { views } from '../helpers/ranges.js';
import { testInstruments } from '../helpers/metrics.js';

// The production wiring: per-event histograms through the fast producer, the rest through the SDK.
function setup(perTokenItl = false) {
  const m = testInstruments({ perTokenItl });
  return { instruments: m.instruments, hist: m.histogram, names: m.names, shutdown: m.shutdown };
}

let t: ReturnType<typeof setup>;
afterEach(async () => t && (await t.shutdown()));

const labels = { provider: 'anthropic', operation: 'chat', requestModel: 'claude', serverAddress: 'api.anthropic.com' };
const opts = { maxEventBytes: 1 << 20, maxBodyBytes: 1 << 20 };
const meter = (a: ResponseAdapter, start = 0) => new RequestMeter(t.instruments, a, { ...labels }, start, opts);

/** Byte ranges of each SSE event (LF or CRLF separated). */
function sseChunks(bytes: Buffer): Buffer[] {
  const text = bytes.toString('latin1');
  const out: Buffer[] = [];
  const re = /\r?\n\r?\n/g;
  let start = 0;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    out.push(bytes.subarray(start, m.index + m[0].length));
    start = m.index + m[0].length;
  }
  return out;
}

/** Byte ranges of each event-stream frame. */
function frames(bytes: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let i = 0; i < bytes.length; ) {
    const n = bytes.readUInt32BE(i);
    out.push(bytes.subarray(i, i + n));
    i += n;
  }
  return out;
}

describe('RequestMeter with the other framings and adapters', () => {
  it('Anthropic: TTFT at the first text_delta, one gap per event, TPOT from the final output_tokens', async () => {
    t = setup();
    const m = meter(new AnthropicAdapter(), 1000);
    m.responseStart(200, 'text/event-stream; charset=utf-8', undefined);
    const ev = sseChunks(fixture('anthropic-messages.sse'));
    expect(ev.length).toBe(11);
    // message_start, block start and ping early; 5 text deltas 60 ms apart from 1300; the rest at 1600.
    for (let i = 0; i < 3; i++) m.chunk(ev[i]!, 1010 + i);
    for (let k = 0; k < 5; k++) m.chunk(ev[3 + k]!, 1300 + 60 * k);
    for (let i = 8; i < 11; i++) m.chunk(ev[i]!, 1600);
    const s = m.finish(1601)!;
    expect(s.ttftMs).toBe(300);
    expect(s.contentEvents).toBe(5);
    expect(s.outputTokens).toBe(24);
    expect(s.tpotMs).toBeCloseTo(240 / 23, 9);
    expect((await t.hist(METRIC.chunkGap)).count).toBe(4);
    expect(await t.hist(METRIC.tokenUsage, { 'gen_ai.token.type': 'input' })).toMatchObject({ count: 1, sum: 19 });
    expect(await t.hist(METRIC.tokenUsage, { 'gen_ai.token.type': 'cached_input' })).toMatchObject({ count: 1, sum: 0 });
    expect((await t.hist(METRIC.timeToFirstByte)).sum).toBeCloseTo(0.01, 9);
  });

  it('an in-band error ends the measurement with its type (Anthropic event: error)', async () => {
    t = setup();
    const m = meter(new AnthropicAdapter());
    m.responseStart(200, 'text/event-stream', undefined);
    sseChunks(fixture('anthropic-error.sse')).forEach((c, i) => m.chunk(c, 10 * i));
    const s = m.finish(100)!;
    // Anthropic events carry several tokens each: without the provider's count the output is unknown.
    expect(s).toMatchObject({ errorType: 'overloaded_error', outcome: 'error', contentEvents: 2, tokenCountSource: 'none', outputTokens: undefined, tpotMs: undefined });
    expect((await t.hist(METRIC.duration)).attributes[0]!['error.type']).toBe('overloaded_error');
  });

  it('a cancelled multi-token stream (Anthropic, Gemini, Bedrock) records no output count; a one-token-per-event stream counts its events; neither records TPOT', async () => {
    t = setup();
    const anthropicEvents = sseChunks(fixture('anthropic-messages.sse')).slice(0, 6); // message_start … 3 text deltas
    const a = meter(new AnthropicAdapter(), 0);
    a.responseStart(200, 'text/event-stream', undefined);
    anthropicEvents.forEach((c, i) => a.chunk(c, 100 + 50 * i));
    const sa = a.finish(500, 'client_cancelled')!;
    expect(sa).toMatchObject({ outcome: 'cancelled', contentEvents: 3, tokenCountSource: 'none', outputTokens: undefined, tpotMs: undefined });
    expect(sa.ttftMs).toBe(250);
    expect((await t.hist(METRIC.chunkGap)).count).toBe(2); // the gaps between events are still measured
    expect((await t.hist(METRIC.tpot)).count).toBe(0);
    const o = meter(new OpenAIChatAdapter(), 0);
    o.responseStart(200, 'text/event-stream', undefined);
    sseChunks(fixture('openai-chat.sse')).slice(0, 6).forEach((c, i) => o.chunk(c, 100 + 20 * i));
    const so = o.finish(400, 'client_cancelled')!;
    expect(so).toMatchObject({ outcome: 'cancelled', contentEvents: 5, tokenCountSource: 'events', outputTokens: 5 });
    // Its TPOT is known (the request log shows it) but not recorded: the semantic conventions
    // define TPOT for successful responses; its gaps are in the per-gap histogram.
    expect(so.tpotMs).toBeCloseTo(20, 6);
    expect((await t.hist(METRIC.tpot)).count).toBe(0);
    expect((await t.hist(METRIC.chunkGap)).count).toBe(2 + 4);
    const done = meter(new OpenAIChatAdapter(), 0);
    done.responseStart(200, 'text/event-stream', undefined);
    sseChunks(fixture('openai-chat.sse')).forEach((c, i) => done.chunk(c, 100 + 20 * i));
    expect(done.finish(1000)).toMatchObject({ outcome: 'ok' });
    expect((await t.hist(METRIC.tpot)).count).toBe(1);
  });

  it('an error status wins over the error type its body carries, however the body is framed', async () => {
    t = setup();
    const bodies: [() => ResponseAdapter, string, string][] = [
      [() => new AnthropicAdapter(), 'text/event-stream', 'event: error\ndata: {"type":"error","error":{"type":"rate_limit_error","message":"slow"}}\n\n'],
      [() => new OpenAIChatAdapter(), 'text/event-stream', 'data: {"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}\n\n'],
      [() => new GeminiAdapter(), 'text/event-stream', 'data: {"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}\r\n\r\n'],
      [() => new AnthropicAdapter(), 'application/json', '{"type":"error","error":{"type":"rate_limit_error","message":"slow"}}'],
    ];
    for (const [adapter, type, body] of bodies) {
      const m = meter(adapter());
      m.responseStart(429, type, undefined);
      m.chunk(Buffer.from(body), 10);
      expect(m.finish(20), `${type}: ${body}`).toMatchObject({ errorType: '429', outcome: 'error' });
    }
    // With a 2xx status the body's own type is the error type.
    const ok = meter(new AnthropicAdapter());
    ok.responseStart(200, 'text/event-stream', undefined);
    ok.chunk(Buffer.from(bodies[0]![2]), 10);
    expect(ok.finish(20)).toMatchObject({ errorType: 'rate_limit_error' });
  });

  it('llama.cpp `error:` field and legacy function_call deltas, through the meter: error type, TTFT and gaps', async () => {
    t = setup();
    const chunk = (delta: unknown) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`;
    const a = meter(new OpenAIChatAdapter(), 0);
    a.responseStart(200, 'text/event-stream', undefined);
    a.chunk(Buffer.from(chunk({ role: 'assistant', content: '' })), 5);
    a.chunk(Buffer.from(chunk({ content: 'Hi' })), 40);
    a.chunk(Buffer.from('error: {"code":400,"message":"context exceeded","type":"invalid_request_error"}\n\n'), 50);
    expect(a.finish(60)).toMatchObject({ ttftMs: 40, errorType: 'invalid_request_error', outcome: 'error' });
    const f = meter(new OpenAIChatAdapter(), 0);
    f.responseStart(200, 'text/event-stream', undefined);
    f.chunk(Buffer.from(chunk({ role: 'assistant', content: null, function_call: { name: 'get_weather', arguments: '' } })), 10);
    for (let k = 0; k < 4; k++) f.chunk(Buffer.from(chunk({ function_call: { arguments: `"a${k}"` } })), 100 + 20 * k);
    const s = f.finish(200)!;
    expect(s).toMatchObject({ ttftMs: 100, contentEvents: 4, outcome: 'ok' });
    expect(s.tpotMs).toBeCloseTo(20, 9);
  });

  it('Mistral on Vertex AI (`:streamRawPredict`): measured as Chat, thinking parts and usage on the last chunk', async () => {
    t = setup();
    const path = '/v1/projects/p/locations/europe-west4/publishers/mistralai/models/magistral-medium-2506:streamRawPredict';
    const api = detectApi(path, undefined)!;
    // Mistral's chunks (mistralai/client-python CompletionChunk): content a string or a list of parts.
    const chunk = (delta: unknown, extra: object = {}) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'magistral-medium-2506', choices: [{ index: 0, delta, finish_reason: null }], ...extra })}\n\n`;
    const m = meter(api.newAdapter(), 0);
    m.responseStart(200, 'text/event-stream', undefined);
    m.chunk(Buffer.from(chunk({ role: 'assistant', content: '' })), 5);
    m.chunk(Buffer.from(chunk({ content: [{ type: 'thinking', thinking: [{ type: 'text', text: 'Hmm' }] }] })), 50);
    m.chunk(Buffer.from(chunk({ content: 'Bon' })), 70);
    m.chunk(Buffer.from(chunk({ content: 'jour' }, { usage: { prompt_tokens: 9, completion_tokens: 3, total_tokens: 12 } })), 90);
    m.chunk(Buffer.from('data: [DONE]\n\n'), 95);
    const s = m.finish(100)!;
    expect(s).toMatchObject({ ttftMs: 50, contentEvents: 3, outputTokens: 3, tokenCountSource: 'usage', outcome: 'ok' });
    expect(s.tpotMs).toBeCloseTo(20, 9);
    expect(api.modelFromPath?.(path)).toBe('magistral-medium-2506');
  });

  it('Responses error events, flat and nested (as the API sends a 429 mid-stream): the code, not "error"', async () => {
    t = setup();
    const cases: [string, string][] = [
      ['{"type":"error","sequence_number":2,"error":{"type":"too_many_requests","code":"too_many_requests","message":"Too Many Requests","param":null}}', 'too_many_requests'],
      ['{"type":"error","sequence_number":2,"error":{"type":"server_error","code":null,"message":"x"}}', 'server_error'],
      ['{"type":"error","code":"rate_limit_exceeded","message":"x","param":null}', 'rate_limit_exceeded'],
      ['{"type":"error","message":"x"}', 'error'],
    ];
    for (const [data, want] of cases) {
      const m = meter(new OpenAIResponsesAdapter());
      m.responseStart(200, 'text/event-stream', undefined);
      m.chunk(Buffer.from(`event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"Hi"}\n\nevent: error\ndata: ${data}\n\n`), 10);
      expect(m.finish(20), data).toMatchObject({ errorType: want, outcome: 'error', contentEvents: 1 });
    }
  });

  it('Ollama NDJSON (application/x-ndjson): content lines, eval_count, server timings', async () => {
    t = setup();
    const m = meter(new OllamaAdapter());
    m.responseStart(200, 'application/x-ndjson', undefined);
    const lines = fixture('ollama-chat.ndjson').toString('utf8').split(/(?<=\n)/).map((l) => Buffer.from(l));
    expect(lines.length).toBe(24);
    lines.forEach((l, i) => m.chunk(l, 100 + 20 * i));
    const s = m.finish(600)!;
    expect(s).toMatchObject({ streamed: true, ttftMs: 100, contentEvents: 23, outputTokens: 24, inputTokens: 31, responseModel: 'llama3.2:3b' });
    expect(s.tpotMs).toBeCloseTo((22 * 20) / 23, 9);
    expect((await t.hist(METRIC.serverTpot)).sum).toBeCloseTo(0.478 / 24, 9);
    expect((await t.hist(METRIC.serverDuration)).sum).toBeCloseTo(0.912345678, 9);
    expect((await t.hist(METRIC.serverTtft)).count).toBe(1);
  });

  it('Bedrock event-stream: frames split anywhere, usage from metadata, firstByteLatency exported', async () => {
    t = setup();
    const m = meter(new BedrockAdapter());
    m.responseStart(200, 'application/vnd.amazon.eventstream', undefined);
    const bytes = fixture('bedrock-invoke-anthropic.bin');
    const fr = frames(bytes);
    expect(fr.length).toBe(8);
    // Deliver each frame in two halves; the content frames (2, 3, 4) complete at 200, 250, 300.
    fr.forEach((f, i) => {
      const h = f.length >> 1;
      m.chunk(f.subarray(0, h), 50 * i);
      m.chunk(f.subarray(h), 50 * i + 100);
    });
    const s = m.finish(500)!;
    expect(s).toMatchObject({ ttftMs: 200, contentEvents: 3, outputTokens: 24, inputTokens: 19, responseModel: 'claude-sonnet-4-5-20250929' });
    expect(s.tpotMs).toBeCloseTo(100 / 23, 9);
    expect((await t.hist(METRIC.serverTtft)).sum).toBeCloseTo(0.412, 9);
    expect((await t.hist(METRIC.serverDuration)).sum).toBeCloseTo(1.203, 9);
  });

  it('Bedrock exception frame: in-band error; a corrupt frame stops measuring without throwing', async () => {
    t = setup();
    const m = meter(new BedrockAdapter());
    m.responseStart(200, 'application/vnd.amazon.eventstream', undefined);
    const fr = frames(fixture('bedrock-converse-stream.bin'));
    m.chunk(fr[0]!, 1);
    m.chunk(fr[1]!, 2);
    m.chunk(encodeEventStreamFrame({ ':exception-type': 'modelStreamErrorException', ':message-type': 'exception' }, '{"message":"x"}'), 3);
    m.chunk(fr[2]!, 4);
    const s = m.finish(5)!;
    expect(s).toMatchObject({ errorType: 'modelStreamErrorException', contentEvents: 1 });

    const m2 = meter(new BedrockAdapter());
    m2.responseStart(200, 'application/vnd.amazon.eventstream', undefined);
    const bad = Buffer.from(fr[2]!);
    bad[bad.length - 1] = bad[bad.length - 1]! ^ 1;
    m2.chunk(fr[1]!, 1);
    expect(() => m2.chunk(bad, 2)).not.toThrow();
    m2.chunk(fr[3]!, 3); // ignored: the decoder stopped
    const s2 = m2.finish(4)!;
    expect(s2).toMatchObject({ contentEvents: 1, outcome: 'ok' });
  });

  it('per-token ITL (opt-in): a multi-token event spreads its gap over its tokens (vLLM continuous usage)', async () => {
    t = setup(true);
    const m = meter(new OpenAIChatAdapter());
    m.responseStart(200, 'text/event-stream', undefined);
    sseChunks(fixture('vllm-continuous-usage.sse')).forEach((c, i) => m.chunk(c, 10 * i));
    m.finish(1000);
    const per = await t.hist(METRIC.perTokenItl);
    // content events at chunks 1..18 (10 ms apart), cumulative 1 -> 20 on them (the 21st token
    // is counted on the finish chunk, which has no content): 19 tokens after the first event
    expect(per.count).toBe(19);
    expect(per.sum).toBeCloseTo(0.17, 9);
    expect((await t.hist(METRIC.chunkGap)).count).toBe(17);
  });

  it('per-token ITL skips the gaps on both sides of a content event that reports no count', async () => {
    t = setup(true);
    const m = meter(new OpenAIChatAdapter());
    m.responseStart(200, 'text/event-stream', undefined);
    const chunk = (delta: string, n: number | undefined) =>
      Buffer.from(`data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":${delta},"finish_reason":null}]${n === undefined ? '' : `,"usage":{"prompt_tokens":5,"completion_tokens":${n},"total_tokens":${5 + n}}`}}\n\n`);
    // Counts 0 (role), 1, none, 3, 4, 6: 40 ms apart. Known on both sides: C→D (1 token) and D→E (2 tokens).
    [chunk('{"role":"assistant","content":""}', 0), chunk('{"content":"A"}', 1), chunk('{"content":"B"}', undefined), chunk('{"content":"C"}', 3), chunk('{"content":"D"}', 4), chunk('{"content":"E F"}', 6), Buffer.from('data: [DONE]\n\n')].forEach((c, i) => m.chunk(c, 40 * i));
    m.finish(300);
    const per = await t.hist(METRIC.perTokenItl);
    expect(per.count).toBe(3);
    expect(per.sum).toBeCloseTo(0.04 + 0.02 + 0.02, 9);
  });

  it('per-token ITL is off by default and skips gaps with unknown counts (Gemini 2.0: usage only at the end)', async () => {
    t = setup();
    const m = meter(new OpenAIChatAdapter());
    m.responseStart(200, 'text/event-stream', undefined);
    sseChunks(fixture('vllm-continuous-usage.sse')).forEach((c, i) => m.chunk(c, 10 * i));
    m.finish(1000);
    expect(await t.names()).not.toContain(METRIC.perTokenItl);
    await t.shutdown();
    t = setup(true);
    const g = meter(new GeminiAdapter());
    g.responseStart(200, 'text/event-stream', undefined);
    sseChunks(fixture('gemini.sse')).forEach((c, i) => g.chunk(c, 100 * i));
    const s = g.finish(400)!;
    expect(s.outputTokens).toBe(24);
    expect(s.tpotMs).toBeCloseTo(200 / 23, 9);
    expect((await t.hist(METRIC.perTokenItl)).count).toBe(0);
  });

  it('Gemini thinking: reasoning tokens reported as their own token type, output includes them', async () => {
    t = setup(true);
    const g = meter(new GeminiAdapter());
    g.responseStart(200, 'text/event-stream', undefined);
    sseChunks(fixture('gemini-thinking.sse')).forEach((c, i) => g.chunk(c, 100 * i));
    const s = g.finish(400)!;
    expect(s.outputTokens).toBe(111);
    expect(await t.hist(METRIC.tokenUsage, { 'gen_ai.token.type': 'reasoning' })).toMatchObject({ count: 1, sum: 87 });
    // chunk 2 -> 3: 16 tokens over 100 ms; 3 -> 4: 7 tokens over 100 ms; 1 -> 2 unknown (no count on chunk 1)
    const per = await t.hist(METRIC.perTokenItl);
    expect(per.count).toBe(23);
    expect(per.sum).toBeCloseTo(0.2, 9);
  });

  it('Gemini without alt=sse: the streamed JSON array is measured element by element, at every split', async () => {
    const { bytes, pieces } = geminiArray();
    // The same chunks 100 ms apart, as one read each: TTFT at the first, one gap per later one.
    t = setup();
    const g = meter(new GeminiAdapter(), 0);
    g.responseStart(200, 'application/json; charset=UTF-8', undefined);
    pieces.forEach((p, i) => g.chunk(p, 100 * (i + 1)));
    const s = g.finish(500)!;
    expect(s).toMatchObject({ streamed: true, ttftMs: 100, contentEvents: 3, outputTokens: 24, tokenCountSource: 'usage', outcome: 'ok' });
    expect(s.tpotMs).toBeCloseTo(200 / 23, 9);
    expect(await t.hist(METRIC.chunkGap)).toMatchObject({ count: 2 });
    expect((await t.hist(METRIC.chunkGap)).sum).toBeCloseTo(0.2, 9);
    // Whitespace (or a BOM) before the array: the framing is decided by the first byte that is not.
    const w = meter(new GeminiAdapter(), 0);
    w.responseStart(200, 'application/json', undefined);
    w.chunk(Buffer.from('\ufeff \r\n'), 5);
    pieces.forEach((p, i) => w.chunk(p, 100 * (i + 1)));
    expect(w.finish(500)).toMatchObject({ streamed: true, ttftMs: 100, contentEvents: 3, outputTokens: 24 });
    // Any split of the same body: the same events, each at the read that completed it.
    for (let i = 1; i < bytes.length; i += 7) {
      const m = new RequestMeter(t.instruments, new GeminiAdapter(), { ...labels }, 0, opts);
      m.responseStart(200, 'application/json', undefined);
      m.chunk(bytes.subarray(0, i), 10);
      m.chunk(bytes.subarray(i), 20);
      expect(m.finish(30), `split at ${i}`).toMatchObject({ streamed: true, contentEvents: 3, outputTokens: 24 });
    }
  });

  it('Gemini without alt=sse, an error status: the array body is an error answer, not a stream', async () => {
    t = setup();
    const g = meter(new GeminiAdapter(), 0);
    g.responseStart(429, 'application/json; charset=UTF-8', undefined);
    g.chunk(Buffer.from('[{\r\n  "error": {\r\n    "code": 429,\r\n    "message": "quota",\r\n    "status": "RESOURCE_EXHAUSTED"\r\n  }\r\n}\r\n]'), 40);
    expect(g.finish(50)).toMatchObject({ streamed: false, errorType: '429', outcome: 'error', ttftMs: undefined, contentEvents: 0 });
  });

  it('Gemini generateContent (one JSON object): usage from the whole body, no TTFT', async () => {
    t = setup();
    const g = meter(new GeminiAdapter(), 0);
    g.responseStart(200, 'application/json', undefined);
    const body = JSON.stringify(geminiArray().chunks[2], null, 2);
    g.chunk(Buffer.from(body.slice(0, 5)), 50);
    g.chunk(Buffer.from(body.slice(5)), 60);
    expect(g.finish(70)).toMatchObject({ streamed: false, ttftMs: undefined, contentEvents: 0, outputTokens: 24, outcome: 'ok' });
  });

  it('unknown API: a stream is timed (duration, first byte) with no TTFT; a non-stream records nothing', async () => {
    t = setup();
    expect(detectApi('/v1/models', undefined)!.api).toBe('generic');
    const m = meter(new GenericAdapter(), 0);
    m.responseStart(200, 'text/event-stream', undefined);
    m.chunk(Buffer.from('data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'), 40);
    m.chunk(Buffer.from('data: [DONE]\n\n'), 90);
    const s = m.finish(100)!;
    expect(s).toMatchObject({ streamed: true, contentEvents: 0, ttftMs: undefined, tokenCountSource: 'none' });
    expect((await t.hist(METRIC.timeToFirstByte)).sum).toBeCloseTo(0.04, 9);
    expect((await t.hist(METRIC.duration)).count).toBe(1);
    expect((await t.hist(METRIC.ttft)).count).toBe(0);

    const n = meter(new GenericAdapter(), 0);
    n.responseStart(200, 'application/json', undefined);
    n.chunk(Buffer.from('{"data":[]}'), 5);
    expect(n.finish(6)).toBeUndefined();
    const never = meter(new GenericAdapter(), 0); // upstream unreachable: no response at all
    expect(never.finish(6, 'upstream_unreachable')).toBeUndefined();
    expect((await t.hist(METRIC.duration)).count).toBe(1);
    expect((await t.hist(METRIC.timeToFirstByte)).count).toBe(1);
  });
});

describe('detection', () => {
  const cases: [string, string | undefined, string, string | undefined][] = [
    ['/v1/chat/completions', undefined, 'openai-chat', undefined],
    ['/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21', undefined, 'openai-chat', 'gpt-4o-prod'],
    ['/v1/completions', undefined, 'openai-completions', undefined],
    ['/v1/responses', undefined, 'openai-responses', undefined],
    ['/v1/messages', undefined, 'anthropic', undefined],
    ['/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse&key=secret', undefined, 'gemini', 'gemini-2.5-flash'],
    ['/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.0-flash:streamGenerateContent', undefined, 'gemini', 'gemini-2.0-flash'],
    // The AI SDK posts a model id with a slash as the path (`google('tunedModels/x')`).
    ['/v1beta/tunedModels/my-tuned-1:streamGenerateContent?alt=sse', undefined, 'gemini', 'tunedModels/my-tuned-1'],
    ['/v1beta/tunedModels/my-tuned-1:generateContent', undefined, 'gemini', 'tunedModels/my-tuned-1'],
    ['/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict', undefined, 'anthropic-vertex', 'claude-sonnet-4@20250514'],
    // Vertex AI's other partner models on rawPredict speak OpenAI-shaped Chat (langchain-google-vertexai
    // model_garden_maas: `publishers/mistralai/models/{model}:streamRawPredict`); embeddings and OCR are not generation.
    ['/v1/projects/p/locations/us-central1/publishers/mistralai/models/mistral-large-2411:streamRawPredict', undefined, 'openai-chat', 'mistral-large-2411'],
    ['/v1/projects/p/locations/us-central1/publishers/ai21/models/jamba-1.5-large@001:rawPredict', undefined, 'openai-chat', 'jamba-1.5-large@001'],
    ['/v1/projects/p/locations/us-central1/publishers/mistralai/models/mistral-ocr-2505:rawPredict', undefined, 'generic', undefined],
    ['/v1/projects/p/locations/us-central1/publishers/mistralai/models/codestral-embed:rawPredict', undefined, 'generic', undefined],
    ['/api/chat', undefined, 'ollama-chat', undefined],
    ['/api/generate', undefined, 'ollama-generate', undefined],
    ['/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse-stream', undefined, 'bedrock-converse', 'anthropic.claude-3-5-sonnet-20240620-v1:0'],
    ['/model/us.anthropic.claude-sonnet-4-v1%3A0/invoke-with-response-stream', undefined, 'bedrock-invoke', 'us.anthropic.claude-sonnet-4-v1:0'],
    ['/custom/path', 'anthropic', 'anthropic', undefined],
    ['/custom/path', 'no-such-provider', 'generic', undefined],
    ['/v1/models', undefined, 'generic', undefined],
  ];
  for (const [path, provider, api, model] of cases) {
    it(`${path} (${provider ?? 'no provider'}) -> ${api}`, () => {
      const d = detectApi(path, provider)!;
      expect(d.api).toBe(api);
      expect(d.modelFromPath?.(path)).toBe(model);
    });
  }

  it('semantic-convention provider and operation names', () => {
    expect(detectApi('/v1/messages', undefined)).toMatchObject({ defaultProviderName: 'anthropic', operation: 'chat' });
    expect(detectApi('/v1beta/models/g:streamGenerateContent', undefined)).toMatchObject({ defaultProviderName: 'gcp.gemini', operation: 'generate_content' });
    expect(detectApi('/model/m/converse-stream', undefined)).toMatchObject({ defaultProviderName: 'aws.bedrock', operation: 'chat' });
    expect(detectApi('/openai/deployments/d/chat/completions', undefined)).toMatchObject({ defaultProviderName: 'azure.ai.openai' });
    expect(detectApi('/api/generate', undefined)).toMatchObject({ defaultProviderName: 'ollama', operation: 'text_completion' });
    expect(detectApi('/x', 'vllm')).toMatchObject({ api: 'openai-chat', defaultProviderName: 'vllm' });
    expect(detectApi('/v1/projects/p/locations/l/publishers/mistralai/models/m:streamRawPredict', undefined)).toMatchObject({ defaultProviderName: 'gcp.vertex_ai', operation: 'chat' });
  });
});

describe('a chunked read measured as ranges of its own buffer', () => {
  const SSE = 'text/event-stream';
  const GEMINI_ARRAY = 'gemini.sse as a JSON array';
  const CASES: [string, string, () => ResponseAdapter][] = [
    ['openai-chat.sse', SSE, () => new OpenAIChatAdapter()],
    ['openai-chat-usage.sse', SSE, () => new OpenAIChatAdapter()],
    ['openai-chat-tools.sse', SSE, () => new OpenAIChatAdapter()],
    ['vllm-continuous-usage.sse', SSE, () => new OpenAIChatAdapter()],
    ['llamacpp-chat.sse', SSE, () => new OpenAIChatAdapter()],
    ['tgi-chat.sse', SSE, () => new OpenAIChatAdapter()],
    ['openai-compat-reasoning.sse', SSE, () => new OpenAIChatAdapter()],
    ['openai-responses.sse', SSE, () => new OpenAIResponsesAdapter()],
    ['anthropic-messages.sse', SSE, () => new AnthropicAdapter()],
    ['anthropic-error.sse', SSE, () => new AnthropicAdapter()],
    ['gemini.sse', SSE, () => new GeminiAdapter()],
    ['ollama-chat.ndjson', 'application/x-ndjson', () => new OllamaAdapter()],
    ['bedrock-converse-stream.bin', 'application/vnd.amazon.eventstream', () => new BedrockAdapter()],
    [GEMINI_ARRAY, 'application/json', () => new GeminiAdapter()],
  ];
  /** The fixture's bytes; Gemini's chunks as a streamed JSON array (no `alt=sse`) by name. */
  const bodyOf = (file: string): Buffer => (file === GEMINI_ARRAY ? geminiArray().bytes : fixture(file));

  /** The body as HTTP chunks of the given sizes (cycled), as an upstream frames it. */
  function chunkFramed(body: Buffer, sizes: number[]): Buffer {
    const parts: Buffer[] = [];
    for (let i = 0, k = 0; i < body.length; k++) {
      const n = Math.min(sizes.length ? 1 + (sizes[k % sizes.length]! % 400) : body.length, body.length - i);
      parts.push(Buffer.from(`${n.toString(16)}\r\n`), body.subarray(i, i + n), Buffer.from('\r\n'));
      i += n;
    }
    parts.push(Buffer.from('0\r\n\r\n'));
    return Buffer.concat(parts);
  }

  /**
   * The measurement of `wire` read in the given pieces: every payload range offered as a range,
   * or as a copy of its own; with `drains`, the meter defers as in the proxy, and the deferred
   * jobs run after the reads whose entry is true (the end of a loop iteration), else later.
   * Returns the summary and every per-gap sample, in order.
   */
  function measure(file: string, type: string, adapter: () => ResponseAdapter, wire: Buffer, cuts: number[], asRanges: boolean, drains?: boolean[]) {
    const jobs: (() => void)[] = [];
    const drain = () => {
      for (let i = 0; i < jobs.length; i++) jobs[i]!();
      jobs.length = 0;
    };
    const m = new RequestMeter(t.instruments, adapter(), { ...labels }, 0, drains ? { ...opts, defer: (f) => jobs.push(f) } : opts);
    const gaps: number[] = [];
    const record = t.instruments.chunkGap.record;
    t.instruments.chunkGap.record = (v, l) => {
      gaps.push(v);
      record.call(t.instruments.chunkGap, v, l);
    };
    try {
      m.responseStart(200, type, undefined);
      const dec = new ChunkedDecoder();
      const at = [0, ...[...new Set(cuts.map((c) => c % (wire.length + 1)))].sort((a, b) => a - b), wire.length];
      for (let k = 1; k < at.length; k++) {
        const read = Buffer.from(wire.subarray(at[k - 1], at[k]));
        dec.push(read);
        const arrival = 10 * k;
        if (asRanges) for (let i = 0; i < dec.ranges.length; i += 2) m.chunk(read, arrival, dec.ranges[i], dec.ranges[i + 1]);
        else for (const v of views(read, dec.ranges)) m.chunk(Buffer.from(v), arrival);
        read.fill(0x0a); // the upstream client's reads are not reused, but nothing may depend on that
        if (drains?.[k % drains.length]) drain();
      }
      expect(dec.done, file).toBe(true);
      const summary = m.finish(10 * at.length)!;
      drain();
      return { summary, gaps };
    } finally {
      t.instruments.chunkGap.record = record;
    }
  }

  it('gives the measurement of the same payload offered piece by piece, for every framing and every split (property)', async () => {
    t = setup();
    for (const [file, type, adapter] of CASES) {
      const body = bodyOf(file);
      // Reference: the payload pieces as buffers of their own, as before ranges.
      fc.assert(
        fc.property(fc.array(fc.nat(), { maxLength: 6 }), fc.array(fc.nat(), { maxLength: 12 }), (sizes, cuts) => {
          const wire = chunkFramed(body, sizes);
          expect(measure(file, type, adapter, wire, cuts, true)).toEqual(measure(file, type, adapter, wire, cuts, false));
        }),
        { numRuns: 60, examples: [[[], []], [[0], []], [[5000], [7, 300]]] },
      );
    }
  });

  it('measures the same when the events that need a full parse wait for the end of the loop iteration, whenever it comes (property)', async () => {
    t = setup();
    // Plus an NDJSON body whose last line has no newline: the meter's end reads that line.
    const ndjson = fixture('ollama-chat.ndjson');
    const unterminated = ndjson.subarray(0, ndjson.length - 1);
    expect(ndjson[ndjson.length - 1]).toBe(0x0a);
    const cases: [string, string, () => ResponseAdapter, Buffer][] = [
      ...CASES.map(([file, type, adapter]): [string, string, () => ResponseAdapter, Buffer] => [file, type, adapter, bodyOf(file)]),
      ['ollama-chat.ndjson, no final newline', 'application/x-ndjson', () => new OllamaAdapter(), unterminated],
    ];
    for (const [file, type, adapter, body] of cases) {
      fc.assert(
        fc.property(fc.array(fc.nat(), { maxLength: 6 }), fc.array(fc.nat(), { maxLength: 12 }), fc.array(fc.boolean(), { minLength: 1, maxLength: 5 }), (sizes, cuts, drains) => {
          const wire = chunkFramed(body, sizes);
          const now = measure(file, type, adapter, wire, cuts, true);
          const deferred = measure(file, type, adapter, wire, cuts, true, drains);
          expect(deferred, file).toEqual(now);
          expect(now.gaps.length, file).toBe(Math.max(0, now.summary.contentEvents - 1));
        }),
        { numRuns: 60, examples: [[[], [], [true]], [[0], [], [true]], [[0], [], [false]], [[5000], [7, 300], [false, true]]] },
      );
    }
  });

  it('one read holding a whole OpenAI stream, one HTTP chunk per event: every content event counted', async () => {
    t = setup();
    const body = fixture('openai-chat.sse');
    const events = sseChunks(body);
    const wire = Buffer.concat([...events.flatMap((e) => [Buffer.from(`${e.length.toString(16)}\r\n`), e, Buffer.from('\r\n')]), Buffer.from('0\r\n\r\n')]);
    const s = measure('openai-chat.sse', SSE, () => new OpenAIChatAdapter(), wire, [], true).summary;
    const whole = meter(new OpenAIChatAdapter(), 0);
    whole.responseStart(200, SSE, undefined);
    whole.chunk(body, 10);
    const w = whole.finish(20)!;
    expect(s.contentEvents).toBeGreaterThan(5);
    expect(s).toEqual(w);
  });
});

