import { afterEach, describe, expect, it } from 'vitest';
import { RequestMeter } from '../../src/measure/request-meter.js';
import { METRIC } from '../../src/metrics/semconv.js';
import { detectApi } from '../../src/providers/detect.js';
import { Router } from '../../src/proxy/routes.js';
import type { ResponseAdapter } from '../../src/providers/types.js';
import { testInstruments } from '../helpers/metrics.js';

/**
 * Streaming APIs that are not OpenAI-, Anthropic- or Gemini-shaped: the self-hosted
 * servers' own routes (llama.cpp `/completion`, TGI `/generate_stream`, SGLang
 * `/generate`, Triton's generate extension) and Cohere's Chat API. The events are
 * written from the servers' source and the official SDKs' types:
 * - llama.cpp `tools/server/server-task.cpp` (`to_json_non_oaicompat_partial/final`,
 *   `result_timings::to_json`); native routes send no `[DONE]`;
 * - TGI `router/src/lib.rs` (`StreamResponse`, `StreamDetails`, `ErrorResponse`) and
 *   `router/src/server.rs` (`generate_stream`: one event a token, `details` only when
 *   the request asked for them; axum writes `data:` without a space);
 * - SGLang `python/sglang/srt/entrypoints/http_server.py` (`data: ` + JSON, then
 *   `data: [DONE]`; errors `{"error":{"message"}}`) and the tokenizer manager's output
 *   (`text` cumulative by default, `meta_info.completion_tokens` running);
 * - Triton's generate extension (`/v2/models/{model}/generate_stream`, `text_output`);
 * - Cohere: cohere-python `v2/types/v2chat_stream_response.py` and its event types,
 *   `chat_finish_reason.py`; v1's `event_type` lines from the v1 OpenAPI;
 * - LM Studio: lmstudio-ai/docs `1_developer/2_rest/streaming-events.md` and `_2_rest/chat.md`
 *   (`chat.end.result.stats`);
 * - Cloudflare Workers AI: cloudflare/ai `packages/workers-ai-provider` (`utils.ts`, `streaming.ts`,
 *   `test/stream-text.test.ts`): `{"response"}` chunks, or OpenAI-shaped ones from newer models.
 */

let t: ReturnType<typeof testInstruments>;
afterEach(async () => t && (await t.shutdown()));

const opts = { maxEventBytes: 1 << 20, maxBodyBytes: 1 << 20 };
const labels = { provider: 'x', operation: 'text_completion', requestModel: 'm', serverAddress: '127.0.0.1' };

function meterFor(path: string): RequestMeter {
  const api = detectApi(path, undefined, path === '/v1/chat' ? ['cohere'] : path === '/api/v1/chat' ? ['lmstudio'] : [])!;
  return new RequestMeter(t.instruments, api.newAdapter() as ResponseAdapter, { ...labels }, 0, opts);
}

const ev = (o: unknown, space = true) => Buffer.from(`data:${space ? ' ' : ''}${JSON.stringify(o)}\n\n`);

const timings = { prompt_n: 12, prompt_ms: 40.5, prompt_per_token_ms: 3.375, prompt_per_second: 296.3, predicted_n: 6, predicted_ms: 60, predicted_per_token_ms: 10, predicted_per_second: 100 };

/** A llama.cpp `/completion` stream: `tokens_predicted` on every chunk (newer servers) or only the last. */
function llamacppStream(cumulativeEveryChunk: boolean): Buffer[] {
  const partial = (content: string, n: number) => ({
    index: 0,
    content,
    tokens: [1000 + n],
    stop: false,
    id_slot: 0,
    ...(cumulativeEveryChunk ? { tokens_predicted: n, tokens_evaluated: 12 } : {}),
  });
  return [
    ev(partial('Today', 1)),
    ev(partial(' in', 2)),
    ev(partial(' Paris', 4)), // two tokens: a partial stop word held back, then released
    ev(partial('', 5)), // a token held back as a possible stop word: no text
    ev(partial(' sunny', 6)),
    ev({ index: 0, content: '', tokens: [], id_slot: 0, stop: true, model: 'qwen2.5-7b-instruct-q4_k_m.gguf', tokens_predicted: 6, tokens_evaluated: 12, prompt: 'Weather?', has_new_line: false, truncated: false, stop_type: 'eos', stopping_word: '', tokens_cached: 17, timings }),
  ];
}

describe('llama.cpp native completion (/completion, /infill, /completions)', () => {
  it('paths: /completion and /infill are native; /completions stays with the completions adapter, which reads both shapes', () => {
    expect(detectApi('/completion', undefined)).toMatchObject({ api: 'llama.cpp-completion', defaultProviderName: 'llama.cpp', operation: 'text_completion' });
    expect(detectApi('/infill', undefined)?.api).toBe('llama.cpp-completion');
    expect(detectApi('/v1/completions', undefined)?.api).toBe('openai-completions');
    expect(detectApi('/completions', undefined)?.api).toBe('openai-completions');
    expect(detectApi('/v1/chat/completions', undefined)?.api).toBe('openai-chat');
    expect(detectApi('/x', 'llama.cpp-completion')?.api).toBe('llama.cpp-completion');
    // An app's own `/api/completion` (the Vercel AI SDK's useCompletion default) is another format.
    expect(detectApi('/api/completion', undefined)?.api).toBe('generic');
    expect(detectApi('/api/v1/completion', undefined)?.api).toBe('generic');
    expect(detectApi('/api/ai/completion', undefined)?.api).toBe('generic');
  });

  for (const path of ['/completion', '/completions']) {
    it(`${path}: TTFT at the first text, a gap per text chunk, TPOT and usage from tokens_predicted / tokens_evaluated`, async () => {
      t = testInstruments({ perTokenItl: true });
      const m = meterFor(path);
      m.responseStart(200, 'text/event-stream', undefined);
      llamacppStream(true).forEach((b, i) => m.chunk(b, 100 + 10 * i));
      const s = m.finish(200)!;
      // Text at 100, 110, 120, 140; the held-back token at 130 and the final chunk at 150 are not text.
      expect(s).toMatchObject({ ttftMs: 100, contentEvents: 4, outputTokens: 6, inputTokens: 12, tokenCountSource: 'usage', responseModel: 'qwen2.5-7b-instruct-q4_k_m.gguf', outcome: 'ok' });
      expect(s.tpotMs).toBeCloseTo(40 / 5, 9);
      expect(await t.histogram(METRIC.chunkGap)).toMatchObject({ count: 3 });
      // Per token: 110 (1 token), 120 split over 2 tokens, 140 over 2 (tokens 5 and 6).
      const per = await t.histogram(METRIC.perTokenItl);
      expect(per.count).toBe(5);
      expect(per.sum).toBeCloseTo(0.04, 9);
      expect(await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'output' })).toMatchObject({ count: 1, sum: 6 });
      expect((await t.histogram(METRIC.serverTpot)).sum).toBeCloseTo(0.01, 9);
      expect((await t.histogram(METRIC.serverTtft)).sum).toBeCloseTo(0.0405, 9);
    });
  }

  it('several prompts (or n > 1) interleave sequences by index: usage and the running count are their sums', async () => {
    t = testInstruments({ perTokenItl: true });
    const m = meterFor('/completion');
    m.responseStart(200, 'text/event-stream', undefined);
    const p = (index: number, content: string, n: number, stop = false) => ev({ index, content, tokens: [], stop, id_slot: index, tokens_predicted: n, tokens_evaluated: 10 + index });
    // Sequence 0: 3 tokens; sequence 1: 4 tokens; one event every 10 ms.
    [p(0, 'a', 1), p(1, 'b', 1), p(0, 'c', 2), p(1, 'd', 2), p(1, 'e', 3), p(0, 'f', 3), p(1, 'g', 4), p(0, '', 3, true), p(1, '', 4, true)].forEach((b, i) => m.chunk(b, 10 * i));
    const s = m.finish(100)!;
    expect(s).toMatchObject({ contentEvents: 7, outputTokens: 7, inputTokens: 21, tokenCountSource: 'usage' });
    expect(s.tpotMs).toBeCloseTo(60 / 6, 9);
    // Every content event after the first adds one token to the sum: 6 per-token samples of 10 ms.
    const per = await t.histogram(METRIC.perTokenItl);
    expect(per.count).toBe(6);
    expect(per.sum).toBeCloseTo(0.06, 9);
  });

  it('a fractional running count is no count: the gaps on both sides of its event give no per-token samples', async () => {
    t = testInstruments({ perTokenItl: true });
    const m = meterFor('/completion');
    m.responseStart(200, 'text/event-stream', undefined);
    // 1, then 3.5 (no server counts half tokens; a tiny fraction would make a time per token huge), then 5.
    [1, 3.5, 5].map((n, i) => ev({ index: 0, content: 'abc'[i], stop: false, tokens_predicted: n })).forEach((b, i) => m.chunk(b, 10 * i));
    const s = m.finish(30)!;
    expect((await t.histogram(METRIC.perTokenItl)).count).toBe(0);
    expect(s).toMatchObject({ contentEvents: 3, outputTokens: 5, tokenCountSource: 'usage' });
  });

  it('the native shapes are read only on their paths: on /v1/chat/completions such chunks are not content', () => {
    t = testInstruments();
    const m = meterFor('/v1/chat/completions');
    m.responseStart(200, 'text/event-stream', undefined);
    [ev({ index: 0, content: 'Today', stop: false, tokens_predicted: 1 }), ev({ response: 'Today' }), ev({ tool_calls: [{ name: 'f', arguments: '{}' }] })].forEach((b, i) => m.chunk(b, 10 * i));
    expect(m.finish(50)).toMatchObject({ contentEvents: 0, outputTokens: undefined, ttftMs: undefined });
  });

  it('older servers report tokens_predicted only at the end: the same TPOT, no per-token ITL', async () => {
    t = testInstruments({ perTokenItl: true });
    const m = meterFor('/completion');
    m.responseStart(200, 'text/event-stream', undefined);
    llamacppStream(false).forEach((b, i) => m.chunk(b, 100 + 10 * i));
    const s = m.finish(200)!;
    expect(s).toMatchObject({ contentEvents: 4, outputTokens: 6, tokenCountSource: 'usage' });
    expect(s.tpotMs).toBeCloseTo(8, 9);
    expect((await t.histogram(METRIC.perTokenItl)).count).toBe(0);
  });

  it('a cancelled native stream counts its text chunks (about one token each)', () => {
    t = testInstruments();
    const m = meterFor('/completion');
    m.responseStart(200, 'text/event-stream', undefined);
    llamacppStream(false).slice(0, 3).forEach((b, i) => m.chunk(b, 100 + 10 * i));
    expect(m.finish(200, 'client_cancelled')).toMatchObject({ outcome: 'cancelled', contentEvents: 3, outputTokens: 3, tokenCountSource: 'events' });
  });

  it('errors: a data error object (current servers) and the error: field (before 2025-09)', () => {
    t = testInstruments();
    const err = { error: { code: 500, message: 'context shift is disabled', type: 'server_error' } };
    for (const tail of [ev(err), Buffer.from(`error: ${JSON.stringify(err)}\n\n`)]) {
      const m = meterFor('/completion');
      m.responseStart(200, 'text/event-stream', undefined);
      m.chunk(llamacppStream(true)[0]!, 10);
      m.chunk(tail, 20);
      expect(m.finish(30)).toMatchObject({ outcome: 'error', errorType: 'server_error', contentEvents: 1 });
    }
  });

  it('a non-streamed /completion answer gives usage and model', () => {
    t = testInstruments();
    const m = meterFor('/completion');
    m.responseStart(200, 'application/json; charset=utf-8', undefined);
    m.chunk(Buffer.from(JSON.stringify({ index: 0, content: 'Today in Paris', tokens: [], id_slot: 0, stop: true, model: 'gpt-oss-20b', tokens_predicted: 4, tokens_evaluated: 9, timings })), 50);
    expect(m.finish(60)).toMatchObject({ streamed: false, outputTokens: 4, inputTokens: 9, responseModel: 'gpt-oss-20b', outcome: 'ok' });
  });
});

/** A TGI `/generate_stream` stream of `n` tokens, the last one the special end-of-sequence token. */
function tgiStream(n: number, details: boolean): Buffer[] {
  const out: Buffer[] = [];
  for (let i = 1; i <= n; i++) {
    const last = i === n;
    out.push(
      ev(
        {
          index: i,
          token: { id: last ? 2 : 500 + i, text: last ? '</s>' : ` w${i}`, logprob: -0.25, special: last },
          generated_text: last ? 'w1 w2 w3' : null,
          details: last && details ? { finish_reason: 'eos_token', generated_tokens: n, seed: null, input_length: 7 } : null,
        },
        false,
      ),
    );
  }
  return out;
}

describe('TGI native generate_stream', () => {
  it('path and forced provider', () => {
    expect(detectApi('/generate_stream', undefined)).toMatchObject({ api: 'tgi-generate', defaultProviderName: 'tgi', operation: 'text_completion' });
    expect(detectApi('/', 'tgi-generate')?.api).toBe('tgi-generate');
  });

  it('every token event is a token (the special end-of-sequence one too); usage from details', async () => {
    t = testInstruments({ perTokenItl: true });
    const m = meterFor('/generate_stream');
    m.responseStart(200, 'text/event-stream', undefined);
    tgiStream(4, true).forEach((b, i) => m.chunk(b, 200 + 25 * i));
    m.chunk(Buffer.from(':\n\n'), 400); // axum keep-alive comment
    const s = m.finish(410)!;
    expect(s).toMatchObject({ ttftMs: 200, contentEvents: 4, outputTokens: 4, inputTokens: 7, tokenCountSource: 'usage', outcome: 'ok', responseModel: undefined });
    expect(s.tpotMs).toBeCloseTo(75 / 3, 9);
    expect(await t.histogram(METRIC.chunkGap)).toMatchObject({ count: 3 });
    expect((await t.histogram(METRIC.perTokenItl)).count).toBe(3); // `index` is the running count
  });

  it('without details the token events are the count, and agree with it', () => {
    t = testInstruments();
    const m = meterFor('/generate_stream');
    m.responseStart(200, 'text/event-stream', undefined);
    tgiStream(5, false).forEach((b, i) => m.chunk(b, 10 * i));
    const s = m.finish(100)!;
    expect(s).toMatchObject({ contentEvents: 5, outputTokens: 5, tokenCountSource: 'events' });
    expect(s.tpotMs).toBeCloseTo(10, 9);
  });

  it('an error event ends the measurement with its error_type', () => {
    t = testInstruments();
    const m = meterFor('/generate_stream');
    m.responseStart(200, 'text/event-stream', undefined);
    m.chunk(tgiStream(3, false)[0]!, 10);
    m.chunk(ev({ error: 'Request failed during generation: Server error: CUDA out of memory', error_type: 'generation' }, false), 20);
    expect(m.finish(30)).toMatchObject({ outcome: 'error', errorType: 'generation', contentEvents: 1 });
  });

  it('a 422 validation error body (JSON): the status is the type, the body is read without harm', () => {
    t = testInstruments();
    const m = meterFor('/generate_stream');
    m.responseStart(422, 'application/json', undefined);
    m.chunk(Buffer.from('{"error":"Input validation error: `inputs` must have less than 4096 tokens","error_type":"validation"}'), 5);
    expect(m.finish(6)).toMatchObject({ outcome: 'error', errorType: '422', streamed: false, outputTokens: undefined });
  });
});

describe('SGLang native /generate', () => {
  const chunk = (text: string, n: number, extra: Record<string, unknown> = {}, finish: unknown = null) =>
    ev({ text, output_ids: Array.from({ length: n }, (_, i) => 100 + i), meta_info: { id: 'ab12', finish_reason: finish, prompt_tokens: 9, completion_tokens: n, cached_tokens: 4, ...extra } });

  it('path: /generate (not Ollama\'s /api/generate)', () => {
    // TGI and vLLM's demo server answer at `/generate` too: the label comes from the route or its host.
    expect(detectApi('/generate', undefined)).toMatchObject({ api: 'sglang-generate', defaultProviderName: '_OTHER' });
    expect(detectApi('/x', 'sglang-generate')).toMatchObject({ api: 'sglang-generate', defaultProviderName: 'sglang' });
    expect(detectApi('/api/generate', undefined)?.api).toBe('ollama-generate');
    // KoboldCpp, Aphrodite and text-generation-webui serve other formats there.
    expect(detectApi('/api/v1/generate', undefined)?.api).toBe('generic');
    expect(detectApi('/api/latest/generate', undefined)?.api).toBe('generic'); // KoboldCpp
  });

  it('cumulative text: content when completion_tokens grows; TPOT and per-token ITL from the running count', async () => {
    t = testInstruments({ perTokenItl: true });
    const m = meterFor('/generate');
    m.responseStart(200, 'text/event-stream', undefined);
    const events = [
      chunk('Today', 1),
      chunk('Today in', 2),
      chunk('Today in Paris it', 4), // two tokens coalesced
      chunk('Today in Paris it', 4, { e2e_latency: 0.2 }, { type: 'stop', matched: 2 }), // the finish, no new token
      Buffer.from('data: [DONE]\n\n'),
    ];
    events.forEach((b, i) => m.chunk(b, 50 + 10 * i));
    const s = m.finish(100)!;
    expect(s).toMatchObject({ ttftMs: 50, contentEvents: 3, outputTokens: 4, inputTokens: 9, tokenCountSource: 'usage', outcome: 'ok' });
    expect(s.tpotMs).toBeCloseTo(20 / 3, 9);
    const per = await t.histogram(METRIC.perTokenItl);
    expect(per.count).toBe(3);
    expect(per.sum).toBeCloseTo(0.02, 9);
    expect(await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'cached_input' })).toMatchObject({ count: 1, sum: 4 });
  });

  it('as SGLang\'s own benchmark: a first token with no text yet (incremental output) does not stop TTFT', () => {
    t = testInstruments();
    const m = meterFor('/generate');
    m.responseStart(200, 'text/event-stream', undefined);
    [chunk('', 1), chunk('Tod', 2), chunk('ay', 3)].forEach((b, i) => m.chunk(b, 10 + 10 * i));
    expect(m.finish(50)).toMatchObject({ ttftMs: 20, contentEvents: 2, outputTokens: 3 });
  });

  it('a batch request: sequences told apart by index, usage summed', () => {
    t = testInstruments();
    const m = meterFor('/generate');
    m.responseStart(200, 'text/event-stream', undefined);
    const b = (index: number, n: number) => ev({ index, text: 'x'.repeat(n), meta_info: { id: `r${index}`, finish_reason: null, prompt_tokens: 5 + index, completion_tokens: n } });
    [b(0, 1), b(1, 1), b(0, 2), b(1, 1), b(1, 3)].forEach((x, i) => m.chunk(x, 10 * i));
    // index 1 at 30 repeats its count: not content.
    expect(m.finish(60)).toMatchObject({ contentEvents: 4, outputTokens: 5, inputTokens: 11 });
  });

  it('errors: {"error":{"message"}} and an abort finish_reason', () => {
    t = testInstruments();
    for (const [tail, type] of [
      [ev({ error: { message: 'The input is too long' } }), 'error'],
      [chunk('Today in', 2, {}, { type: 'abort', message: 'Abort in waiting queue', status_code: 503, err_type: 'ServiceUnavailable' }), 'ServiceUnavailable'],
    ] as const) {
      const m = meterFor('/generate');
      m.responseStart(200, 'text/event-stream', undefined);
      m.chunk(chunk('Today', 1), 10);
      m.chunk(tail, 20);
      expect(m.finish(30)).toMatchObject({ outcome: 'error', errorType: type, contentEvents: 1 });
    }
  });

  it('a non-streamed answer (SGLang meta_info, or TGI /generate details) gives usage', () => {
    t = testInstruments();
    for (const [body, out, input] of [
      [{ text: 'Today in Paris', output_ids: [1, 2, 3], meta_info: { id: 'x', finish_reason: { type: 'length', length: 3 }, prompt_tokens: 8, completion_tokens: 3 } }, 3, 8],
      // TGI's non-streamed `Details` has no input length (only `StreamDetails` does).
      [{ generated_text: 'Today in Paris', details: { finish_reason: 'length', generated_tokens: 3, seed: null, prefill: [] } }, 3, undefined],
    ] as const) {
      const m = meterFor('/generate');
      m.responseStart(200, 'application/json', undefined);
      m.chunk(Buffer.from(JSON.stringify(body)), 5);
      expect(m.finish(6)).toMatchObject({ streamed: false, outputTokens: out, inputTokens: input });
    }
  });
});

describe('Triton generate extension', () => {
  const step = (text: string) => ev({ model_name: 'ensemble', model_version: '1', sequence_end: false, sequence_id: 0, sequence_start: false, text_output: text });

  it('paths, model from the path', () => {
    const api = detectApi('/v2/models/llama-3-8b/generate_stream', undefined)!;
    expect(api).toMatchObject({ api: 'triton-generate', defaultProviderName: 'triton' });
    expect(api.modelFromPath?.('/v2/models/llama-3-8b/versions/2/generate_stream')).toBe('llama-3-8b');
    expect(detectApi('/v2/models/ensemble/versions/1/generate', undefined)?.api).toBe('triton-generate');
    expect(detectApi('/generate_stream', undefined)?.api).toBe('tgi-generate');
  });

  it('vLLM backend counts (num_output_tokens per response, summed) and several sequences (an array)', async () => {
    t = testInstruments({ perTokenItl: true });
    const m = meterFor('/v2/models/vllm_model/generate_stream');
    m.responseStart(200, 'text/event-stream', undefined);
    const r = (text: unknown, n: number) => ev({ model_name: 'vllm_model', model_version: '1', text_output: text, num_input_tokens: 11, num_output_tokens: n });
    [r(['Today', 'Hi'], 2), r(['', ''], 0), r([' in', ' there'], 2), r([' Paris', '!'], 3)].forEach((b, i) => m.chunk(b, 100 + 10 * i));
    const s = m.finish(200)!;
    expect(s).toMatchObject({ ttftMs: 100, contentEvents: 3, outputTokens: 7, inputTokens: 11, tokenCountSource: 'usage' });
    expect(s.tpotMs).toBeCloseTo(30 / 6, 9);
    expect((await t.histogram(METRIC.perTokenItl)).count).toBe(5);
  });

  it('content: non-empty text_output; count by events; error event', () => {
    t = testInstruments();
    const m = meterFor('/v2/models/ensemble/generate_stream');
    m.responseStart(200, 'text/event-stream', undefined);
    [step('Today'), step(' in'), step(''), step(' Paris')].forEach((b, i) => m.chunk(b, 100 + 5 * i));
    expect(m.finish(130)).toMatchObject({ ttftMs: 100, contentEvents: 3, outputTokens: 3, tokenCountSource: 'events', responseModel: 'ensemble' });
    const e = meterFor('/v2/models/ensemble/generate_stream');
    e.responseStart(200, 'text/event-stream', undefined);
    e.chunk(step('Today'), 1);
    e.chunk(ev({ error: 'in ensemble \'ensemble\', Encountered error for requestId 1: max_tokens must be > 0' }), 2);
    expect(e.finish(3)).toMatchObject({ outcome: 'error', errorType: 'error', contentEvents: 1 });
  });
});

describe('Cohere Chat', () => {
  const named = (o: { type: string } & Record<string, unknown>) => Buffer.from(`event: ${o.type}\ndata: ${JSON.stringify(o)}\n\n`);
  const delta = (index: number, content: Record<string, unknown>) => named({ type: 'content-delta', index, delta: { message: { content } } });
  const end = (finish_reason: string, extra: Record<string, unknown> = {}) =>
    named({ type: 'message-end', delta: { finish_reason, usage: { billed_units: { input_tokens: 5, output_tokens: 4 }, tokens: { input_tokens: 70, output_tokens: 6 }, cached_tokens: 64 }, ...extra } });
  const v2 = [
    named({ id: '5c1f', type: 'message-start', delta: { message: { role: 'assistant', content: [], tool_plan: '', tool_calls: [], citations: [] } } }),
    named({ type: 'content-start', index: 0, delta: { message: { content: { type: 'thinking', thinking: '' } } } }),
    delta(0, { thinking: 'The user' }),
    named({ type: 'content-end', index: 0 }),
    named({ type: 'content-start', index: 1, delta: { message: { content: { type: 'text', text: '' } } } }),
    delta(1, { text: 'Hola' }),
    delta(1, { text: '' }),
    delta(1, { text: '!' }),
    named({ type: 'citation-start', index: 0, delta: { message: { citations: { start: 0, end: 4, text: 'Hola', sources: [] } } } }),
    named({ type: 'content-end', index: 1 }),
    named({ type: 'tool-plan-delta', delta: { message: { tool_plan: 'I will' } } }),
    named({ type: 'tool-call-start', index: 0, delta: { message: { tool_calls: { id: 'w_1', type: 'function', function: { name: 'get_weather', arguments: '' } } } } }),
    named({ type: 'tool-call-delta', index: 0, delta: { message: { tool_calls: { function: { arguments: '{"loc' } } } } }),
    named({ type: 'tool-call-end', index: 0 }),
  ];

  it('paths and host', () => {
    expect(detectApi('/v2/chat', undefined)).toMatchObject({ api: 'cohere-chat', defaultProviderName: 'cohere', operation: 'chat' });
    // `/v1/chat` is Cohere's only on a Cohere route (its host, or `providerName: cohere`): Writer
    // serves OpenAI-shaped chunks there; LM Studio's `/api/v1/chat` has its own adapter.
    expect(detectApi('/v1/chat', undefined, ['cohere'])?.api).toBe('cohere-chat');
    // A route to Cohere's host whose label says otherwise is still Cohere's: the router gives both names.
    const r = new Router([{ prefix: '/', upstream: 'https://api.cohere.com', stripPrefix: true, forwardedHeaders: true, providerName: 'my-gateway' }]).match('/v1/chat')!;
    expect(r.resolved.providerName).toBe('my-gateway');
    expect(detectApi(r.upstreamPath, undefined, r.resolved.providerNames)?.api).toBe('cohere-chat');
    expect(detectApi('/v1/chat', undefined)?.api).toBe('generic');
    expect(detectApi('/compatibility/v1/chat/completions', undefined)?.api).toBe('openai-chat');
  });

  it('v2 SSE: thinking, text, tool plan and tool arguments are content; TPOT from tokens, token usage from billed units', async () => {
    t = testInstruments();
    const m = meterFor('/v2/chat');
    m.responseStart(200, 'text/event-stream', undefined);
    [...v2, end('TOOL_CALL')].forEach((b, i) => m.chunk(b, 10 * i));
    const s = m.finish(200)!;
    // Content: thinking (20), Hola (50), ! (70), tool plan (100), arguments (120).
    expect(s).toMatchObject({ ttftMs: 20, contentEvents: 5, outputTokens: 6, inputTokens: 70, tokenCountSource: 'usage', outcome: 'ok', responseModel: undefined });
    expect(s.tpotMs).toBeCloseTo(100 / 5, 9);
    expect(await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'cached_input' })).toMatchObject({ sum: 64 });
    // Token usage reports the billable counts (semantic conventions: MUST), TPOT the produced ones.
    expect(await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'input' })).toMatchObject({ sum: 5 });
    expect(await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'output' })).toMatchObject({ sum: 4 });
  });

  it('v2 as JSON lines (application/stream+json) measures the same', () => {
    t = testInstruments();
    const m = meterFor('/v2/chat');
    m.responseStart(200, 'application/stream+json', undefined);
    const lines = [...v2, end('COMPLETE')].map((b) => Buffer.from(`${b.toString().split('\n')[1]!.slice('data: '.length)}\n`));
    lines.forEach((b, i) => m.chunk(b, 10 * i));
    expect(m.finish(200)).toMatchObject({ ttftMs: 20, contentEvents: 5, outputTokens: 6, outcome: 'ok' });
  });

  it('finish_reason ERROR or TIMEOUT is an in-band error; MAX_TOKENS, ERROR_LIMIT, ERROR_TOXIC are not', () => {
    t = testInstruments();
    // v1's ERROR_LIMIT (the context length cut the reply) and ERROR_TOXIC (a filtered reply) are stops.
    for (const [reason, outcome, type] of [['ERROR', 'error', 'error'], ['TIMEOUT', 'error', 'timeout'], ['MAX_TOKENS', 'ok', undefined], ['ERROR_LIMIT', 'ok', undefined], ['ERROR_TOXIC', 'ok', undefined]] as const) {
      const m = meterFor('/v2/chat');
      m.responseStart(200, 'text/event-stream', undefined);
      m.chunk(delta(0, { text: 'Hola' }), 10);
      m.chunk(end(reason, reason === 'ERROR' ? { error: 'internal server error' } : {}), 20);
      expect(m.finish(30), reason).toMatchObject({ outcome, errorType: type });
    }
  });

  it('v1 JSON lines: text-generation and tool-calls-chunk are content; usage from stream-end meta.tokens', () => {
    t = testInstruments();
    const m = meterFor('/v1/chat');
    m.responseStart(200, 'application/stream+json', undefined);
    const line = (o: unknown) => Buffer.from(`${JSON.stringify(o)}\n`);
    [
      line({ is_finished: false, event_type: 'stream-start', generation_id: 'g1' }),
      line({ is_finished: false, event_type: 'text-generation', text: 'Hello' }),
      line({ is_finished: false, event_type: 'text-generation', text: ' there' }),
      line({ is_finished: false, event_type: 'tool-calls-chunk', tool_call_delta: { text: 'I will look' } }),
      line({ is_finished: false, event_type: 'tool-calls-chunk', tool_call_delta: { index: 0, name: 'get_weather' } }),
      line({ is_finished: false, event_type: 'tool-calls-chunk', tool_call_delta: { index: 0, parameters: '{"city"' } }),
      line({ is_finished: true, event_type: 'stream-end', finish_reason: 'COMPLETE', response: { response_id: 'r', text: 'Hello there', generation_id: 'g1', finish_reason: 'COMPLETE', meta: { api_version: { version: '1' }, billed_units: { input_tokens: 9, output_tokens: 20 }, tokens: { input_tokens: 17, output_tokens: 24 } } } }),
    ].forEach((b, i) => m.chunk(b, 10 * i));
    expect(m.finish(100)).toMatchObject({ ttftMs: 10, contentEvents: 4, outputTokens: 24, inputTokens: 17, outcome: 'ok' });
  });

  it('JSON lines sent as application/json (a content type not verified for v1): read whole at the end, usage and errors kept', () => {
    t = testInstruments();
    const line = (o: unknown) => `${JSON.stringify(o)}\n`;
    for (const [finish, outcome] of [['COMPLETE', 'ok'], ['ERROR', 'error']] as const) {
      const m = meterFor('/v1/chat');
      m.responseStart(200, 'application/json', undefined);
      m.chunk(Buffer.from(line({ is_finished: false, event_type: 'text-generation', text: 'Hello' })), 10);
      m.chunk(Buffer.from(line({ is_finished: true, event_type: 'stream-end', finish_reason: finish, response: { meta: { tokens: { input_tokens: 17, output_tokens: 24 } } } })), 20);
      expect(m.finish(30), finish).toMatchObject({ streamed: false, outputTokens: 24, inputTokens: 17, outcome, ttftMs: undefined });
    }
  });

  it('a cancelled v2 stream counts its deltas (one token each, as Cohere documents)', () => {
    t = testInstruments();
    const m = meterFor('/v2/chat');
    m.responseStart(200, 'text/event-stream', undefined);
    v2.slice(0, 8).forEach((b, i) => m.chunk(b, 10 * i));
    expect(m.finish(100, 'client_cancelled')).toMatchObject({ outcome: 'cancelled', contentEvents: 3, outputTokens: 3, tokenCountSource: 'events' });
  });
});

describe('LM Studio native /api/v1/chat', () => {
  const named = (o: { type: string } & Record<string, unknown>) => Buffer.from(`event: ${o.type}\ndata: ${JSON.stringify(o)}\n\n`);
  const stream = [
    named({ type: 'chat.start', model_instance_id: 'qwen/qwen3-8b' }),
    named({ type: 'prompt_processing.start' }),
    named({ type: 'prompt_processing.progress', progress: 0.5 }),
    named({ type: 'prompt_processing.end' }),
    named({ type: 'reasoning.start' }),
    named({ type: 'reasoning.delta', content: 'Let me' }),
    named({ type: 'reasoning.end' }),
    named({ type: 'tool_call.start', tool: 'get_weather' }),
    named({ type: 'tool_call.arguments', tool: 'get_weather', arguments: {} }), // even empty: the call is output
    named({ type: 'tool_call.success', tool: 'get_weather', arguments: { city: 'Paris' }, output: '22C' }),
    named({ type: 'message.start' }),
    named({ type: 'message.delta', content: 'The current' }),
    named({ type: 'message.delta', content: '' }),
    named({ type: 'message.delta', content: ' weather' }),
    named({ type: 'message.end' }),
    named({ type: 'chat.end', result: { model_instance_id: 'qwen/qwen3-8b', output: [], stats: { input_tokens: 120, total_output_tokens: 9, reasoning_output_tokens: 3, tokens_per_second: 50, time_to_first_token_seconds: 0.25, model_load_time_seconds: 1.5 }, response_id: 'resp_1' } }),
  ];

  it('path; reasoning, tool arguments and message deltas are content; usage and server timings from chat.end stats', async () => {
    // `/api/v1/chat` is a common route name in apps: LM Studio's only on a route named lmstudio.
    expect(detectApi('/api/v1/chat', undefined, ['lmstudio'])).toMatchObject({ api: 'lmstudio-chat', defaultProviderName: 'lmstudio' });
    expect(detectApi('/api/v1/chat', undefined)?.api).toBe('generic');
    expect(detectApi('/x', 'lmstudio')?.api).toBe('lmstudio-chat');
    expect(detectApi('/api/chat', undefined)?.api).toBe('ollama-chat');
    t = testInstruments();
    const m = meterFor('/api/v1/chat');
    m.responseStart(200, 'text/event-stream', undefined);
    stream.forEach((b, i) => m.chunk(b, 10 * i));
    const s = m.finish(200)!;
    // Content at 50 (reasoning), 80 (tool arguments), 110, 130.
    expect(s).toMatchObject({ ttftMs: 50, contentEvents: 4, outputTokens: 9, inputTokens: 120, responseModel: 'qwen/qwen3-8b', outcome: 'ok' });
    expect(s.tpotMs).toBeCloseTo(80 / 8, 9);
    expect((await t.histogram(METRIC.serverTtft)).sum).toBeCloseTo(1.75, 9); // with the model load, as Ollama's
    expect((await t.histogram(METRIC.serverTpot)).sum).toBeCloseTo(0.02, 9);
    expect(await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'reasoning' })).toMatchObject({ sum: 3 });
  });

  it('an error event ends as an error, with the usage of the chat.end that follows it', () => {
    t = testInstruments();
    const m = meterFor('/api/v1/chat');
    m.responseStart(200, 'text/event-stream', undefined);
    m.chunk(stream[11]!, 10);
    m.chunk(named({ type: 'error', error: { type: 'model_crashed', message: 'The model has crashed without additional information.' } }), 20);
    m.chunk(stream[15]!, 30);
    expect(m.finish(40)).toMatchObject({ outcome: 'error', errorType: 'model_crashed', contentEvents: 1, outputTokens: 9, inputTokens: 120, tokenCountSource: 'usage' });
    // Cut after the error, before chat.end: still an error.
    const cut = meterFor('/api/v1/chat');
    cut.responseStart(200, 'text/event-stream', undefined);
    cut.chunk(stream[11]!, 10);
    cut.chunk(named({ type: 'error', error: { type: 'model_crashed', message: 'x' } }), 20);
    expect(cut.finish(40)).toMatchObject({ outcome: 'error', errorType: 'model_crashed' });
  });
});

describe('Cloudflare Workers AI /ai/run', () => {
  it('paths and the model from the path (slashes kept)', () => {
    const path = '/client/v4/accounts/0123abcd/ai/run/@cf/meta/llama-3.1-8b-instruct';
    const api = detectApi(path, undefined)!;
    expect(api).toMatchObject({ api: 'workers-ai', defaultProviderName: 'cloudflare.workers_ai', operation: 'chat' });
    expect(api.modelFromPath?.(path)).toBe('@cf/meta/llama-3.1-8b-instruct');
    expect(api.modelFromPath?.('/v1/acct/gw/workers-ai/%40cf%2Fmeta%2Fllama-3.1-8b-instruct?x=1')).toBe('@cf/meta/llama-3.1-8b-instruct');
    expect(detectApi('/v1/acct/gw/workers-ai/@hf/thebloke/mistral-7b-instruct-v0.1-awq', undefined)?.api).toBe('workers-ai');
    expect(detectApi('/v1/acct/gw/workers-ai/%40cf%2Fmeta%2Fllama-3.1-8b-instruct?x=1', undefined)?.api).toBe('workers-ai');
    // The path Cloudflare's own workers-ai-provider builds for the gateway (utils.ts createRun).
    expect(detectApi('/v1/acct/gw/workers-ai/run/@cf/meta/llama-3.1-8b-instruct', undefined)?.api).toBe('workers-ai');
    expect(api.modelFromPath?.('/v1/acct/gw/workers-ai/run/@cf/meta/llama-3.1-8b-instruct')).toBe('@cf/meta/llama-3.1-8b-instruct');
    // The gateway's OpenAI-compatible path for Workers AI is OpenAI Chat.
    expect(detectApi('/v1/acct/gw/workers-ai/v1/chat/completions', undefined)?.api).toBe('openai-chat');
  });

  it('native {"response"} chunks: content, padding and empty tool_calls are not; usage from the final chunk', () => {
    t = testInstruments();
    const m = meterFor('/client/v4/accounts/a/ai/run/@cf/meta/llama-3.1-8b-instruct');
    m.responseStart(200, 'text/event-stream', undefined);
    [
      ev({ response: 'Today', p: 'abdefgh' }),
      ev({ response: ' in', p: 'ab' }),
      ev({ tool_calls: [], p: 'abdefgh' }),
      ev({ response: ' Paris' }),
      ev({ response: '', usage: { prompt_tokens: 14, completion_tokens: 3, total_tokens: 17, prompt_tokens_details: { cached_tokens: 0 } } }),
      Buffer.from('data: [DONE]\n\n'),
    ].forEach((b, i) => m.chunk(b, 100 + 10 * i));
    const s = m.finish(200)!;
    expect(s).toMatchObject({ ttftMs: 100, contentEvents: 3, outputTokens: 3, inputTokens: 14, tokenCountSource: 'usage', outcome: 'ok' });
    expect(s.tpotMs).toBeCloseTo(15, 9);
  });

  it('native tool calls (argument fragments at the top level, nested or flat) and OpenAI-shaped chunks on the same path', () => {
    t = testInstruments();
    const m = meterFor('/client/v4/accounts/a/ai/run/@cf/openai/gpt-oss-20b');
    m.responseStart(200, 'text/event-stream', undefined);
    [
      ev({ tool_calls: [{ id: 'c1', type: 'function', index: 0, function: { name: 'get_weather', arguments: '' } }] }),
      ev({ tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] }),
      ev({ tool_calls: [{ name: 'get_time', arguments: '{"tz":"CET"}' }] }),
      ev({ tool_calls: [{ id: null, type: null, index: 0, function: { name: null, arguments: null } }] }), // the closing item
      ev({ id: 'chatcmpl-1', object: 'chat.completion.chunk', model: '@cf/openai/gpt-oss-20b', choices: [{ index: 0, delta: { reasoning_content: 'Okay' }, finish_reason: null }], usage: { prompt_tokens: 13, total_tokens: 16, completion_tokens: 3 } }),
    ].forEach((b, i) => m.chunk(b, 10 * i));
    expect(m.finish(50)).toMatchObject({ ttftMs: 10, contentEvents: 3, outputTokens: 3, responseModel: '@cf/openai/gpt-oss-20b' });
  });

  it('a JSON answer records nothing: the path also serves embeddings, images and speech', async () => {
    t = testInstruments();
    const m = meterFor('/client/v4/accounts/a/ai/run/@cf/baai/bge-base-en-v1.5');
    m.responseStart(200, 'application/json', undefined);
    m.chunk(Buffer.from('{"result":{"shape":[1,768],"data":[[0.1]]},"success":true,"errors":[],"messages":[]}'), 5);
    expect(m.finish(6)).toBeUndefined();
    expect((await t.histogram(METRIC.duration)).count).toBe(0);
  });
});
