import { describe, expect, it } from 'vitest';
import { AnthropicAdapter } from '../../src/providers/anthropic.js';
import { BedrockAdapter } from '../../src/providers/bedrock.js';
import { GeminiAdapter } from '../../src/providers/gemini.js';
import { OllamaAdapter } from '../../src/providers/ollama.js';
import { OpenAIChatAdapter } from '../../src/providers/openai-chat.js';
import { OpenAIResponsesAdapter } from '../../src/providers/openai-responses.js';
import { EventKind, type ResponseAdapter, type ServerTimings, type Usage } from '../../src/providers/types.js';
import { EventStreamDecoder } from '../../src/sse/eventstream.js';
import { NdjsonParser } from '../../src/sse/ndjson.js';
import { SseParser, type SseEvent } from '../../src/sse/parser.js';
import { fixture } from '../helpers/fixtures.js';

type Framing = 'sse' | 'ndjson' | 'eventstream';

interface Case {
  file: string;
  framing: Framing;
  adapter: () => ResponseAdapter;
  events: number;
  content: number;
  firstContent: number;
  usage: Usage;
  /** Why the model stopped, as the fixture's last event says. */
  finish: string[] | undefined;
  model: string | undefined;
  error?: { index: number; type: string };
  timings?: ServerTimings;
}

/**
 * Facts about every fixture, counted by hand from the files and
 * test/fixtures/sse/README.md (not computed by the code under test).
 */
const CASES: Case[] = [
  { file: 'openai-responses.sse', framing: 'sse', adapter: () => new OpenAIResponsesAdapter(), events: 31, content: 23, firstContent: 4, finish: ['completed'], usage: { inputTokens: 14, outputTokens: 23, cachedInputTokens: 0, reasoningTokens: 0 }, model: 'gpt-4.1-mini-2025-04-14' },
  { file: 'openai-responses-reasoning.sse', framing: 'sse', adapter: () => new OpenAIResponsesAdapter(), events: 34, content: 21, firstContent: 4, finish: ['completed'], usage: { inputTokens: 14, outputTokens: 75, cachedInputTokens: 0, reasoningTokens: 64 }, model: 'o4-mini-2025-04-16' },
  { file: 'anthropic-messages.sse', framing: 'sse', adapter: () => new AnthropicAdapter(), events: 11, content: 5, firstContent: 3, finish: ['end_turn'], usage: { inputTokens: 19, outputTokens: 24, cachedInputTokens: 0, cacheCreationInputTokens: 0 }, model: 'claude-sonnet-4-5-20250929' },
  { file: 'anthropic-tools.sse', framing: 'sse', adapter: () => new AnthropicAdapter(), events: 16, content: 7, firstContent: 3, finish: ['tool_use'], usage: { inputTokens: 402, outputTokens: 71, cachedInputTokens: 0, cacheCreationInputTokens: 0 }, model: 'claude-sonnet-4-5-20250929' },
  { file: 'anthropic-thinking.sse', framing: 'sse', adapter: () => new AnthropicAdapter(), events: 18, content: 8, firstContent: 3, finish: ['end_turn'], usage: { inputTokens: 48, outputTokens: 63, cachedInputTokens: 0, cacheCreationInputTokens: 0 }, model: 'claude-sonnet-4-5-20250929' },
  { file: 'anthropic-error.sse', framing: 'sse', adapter: () => new AnthropicAdapter(), events: 6, content: 2, firstContent: 3, finish: undefined, usage: { inputTokens: 19, cachedInputTokens: 0, cacheCreationInputTokens: 0 }, model: 'claude-sonnet-4-5-20250929', error: { index: 5, type: 'overloaded_error' } },
  { file: 'gemini.sse', framing: 'sse', adapter: () => new GeminiAdapter(), events: 3, content: 3, firstContent: 0, finish: ['STOP'], usage: { inputTokens: 12, outputTokens: 24 }, model: 'gemini-2.0-flash' },
  { file: 'gemini-thinking.sse', framing: 'sse', adapter: () => new GeminiAdapter(), events: 4, content: 4, firstContent: 0, finish: ['STOP'], usage: { inputTokens: 12, outputTokens: 24 + 87, reasoningTokens: 87 }, model: 'gemini-2.5-flash' },
  { file: 'ollama-chat.ndjson', framing: 'ndjson', adapter: () => new OllamaAdapter(), events: 24, content: 23, firstContent: 0, finish: ['stop'], usage: { inputTokens: 31, outputTokens: 24 }, model: 'llama3.2:3b', timings: { timePerOutputToken: 0.478 / 24, timeToFirstToken: 0.061 + 0.028456789, duration: 0.912345678 } },
  { file: 'bedrock-converse-stream.bin', framing: 'eventstream', adapter: () => new BedrockAdapter(), events: 9, content: 5, firstContent: 1, finish: ['end_turn'], usage: { inputTokens: 19, outputTokens: 24 }, model: undefined, timings: { duration: 1.187 } },
  { file: 'bedrock-invoke-anthropic.bin', framing: 'eventstream', adapter: () => new BedrockAdapter(), events: 8, content: 3, firstContent: 2, finish: ['end_turn'], usage: { inputTokens: 19, outputTokens: 24, cachedInputTokens: 0, cacheCreationInputTokens: 0 }, model: 'claude-sonnet-4-5-20250929', timings: { timeToFirstToken: 0.412, duration: 1.203 } },
  // OpenAI-compatible servers: the reference adapter, here for usage, timings and splits in one place.
  { file: 'llamacpp-chat.sse', framing: 'sse', adapter: () => new OpenAIChatAdapter(), events: 26, content: 23, firstContent: 1, finish: ['stop'], usage: { inputTokens: 31, outputTokens: 24 }, model: 'qwen2.5-7b-instruct', timings: { timePerOutputToken: 0.012561333333333332, timeToFirstToken: 0.042118 } },
  { file: 'vllm-continuous-usage.sse', framing: 'sse', adapter: () => new OpenAIChatAdapter(), events: 22, content: 18, firstContent: 1, finish: ['stop'], usage: { inputTokens: 46, outputTokens: 21 }, model: 'meta-llama/Llama-3.1-8B-Instruct' },
  { file: 'tgi-chat.sse', framing: 'sse', adapter: () => new OpenAIChatAdapter(), events: 26, content: 23, firstContent: 0, finish: ['stop'], usage: { inputTokens: 46, outputTokens: 24 }, model: 'meta-llama/Llama-3.1-8B-Instruct' },
  { file: 'openai-chat-tools.sse', framing: 'sse', adapter: () => new OpenAIChatAdapter(), events: 16, content: 12, firstContent: 1, finish: ['tool_calls'], usage: { inputTokens: 81, outputTokens: 19, cachedInputTokens: 0, reasoningTokens: 0, rejectedPredictionTokens: 0 }, model: 'gpt-4o-mini-2024-07-18' },
  { file: 'openai-compat-reasoning.sse', framing: 'sse', adapter: () => new OpenAIChatAdapter(), events: 27, content: 24, firstContent: 1, finish: ['stop'], usage: { inputTokens: 15, outputTokens: 25, reasoningTokens: 17, cachedInputTokens: 0 }, model: 'deepseek-reasoner' },
];

function decode(framing: Framing, chunks: Buffer[]): SseEvent[] {
  const out: SseEvent[] = [];
  const push = (e: SseEvent) => out.push(e);
  if (framing === 'sse') {
    const p = new SseParser(push);
    for (const c of chunks) p.push(c);
    p.end();
  } else if (framing === 'ndjson') {
    const p = new NdjsonParser(push);
    for (const c of chunks) p.push(c);
    p.end();
  } else {
    const p = new EventStreamDecoder(push);
    for (const c of chunks) p.push(c);
  }
  return out;
}

function run(c: Case, chunks: Buffer[]) {
  const events = decode(c.framing, chunks);
  const a = c.adapter();
  const kinds = events.map((e) => a.onEvent(e));
  return { events, kinds, adapter: a };
}

/** A summary that must not depend on how the bytes were split. */
function digest(r: ReturnType<typeof run>): string {
  const a = r.adapter;
  return JSON.stringify([r.events.map((e) => [e.type, e.data]), r.kinds, a.usage, a.responseModel, a.errorType, a.serverTimings ?? null, a.finishReasons?.list() ?? null]);
}

describe('provider adapters on every fixture', () => {
  for (const c of CASES) {
    it(`${c.file}: content events, first token, usage, finish reason, model, error`, () => {
      const r = run(c, [fixture(c.file)]);
      expect(r.events.length).toBe(c.events);
      expect(r.kinds.filter((k) => k === EventKind.Content).length).toBe(c.content);
      expect(r.kinds.indexOf(EventKind.Content)).toBe(c.firstContent);
      expect(r.adapter.usage).toEqual(c.usage);
      expect(r.adapter.responseModel).toBe(c.model);
      expect(r.adapter.finishReasons?.list()).toEqual(c.finish);
      if (c.error) {
        expect(r.kinds.indexOf(EventKind.Error)).toBe(c.error.index);
        expect(r.adapter.errorType).toBe(c.error.type);
      } else {
        expect(r.kinds.includes(EventKind.Error)).toBe(false);
        expect(r.adapter.errorType).toBeUndefined();
      }
      if (c.timings) {
        const got = r.adapter.serverTimings ?? {};
        expect(Object.keys(got).sort()).toEqual(Object.keys(c.timings).sort());
        for (const [k, v] of Object.entries(c.timings)) expect(got[k as keyof ServerTimings], k).toBeCloseTo(v, 9);
      } else {
        expect(r.adapter.serverTimings ?? undefined).toBeUndefined();
      }
    });

    it(`${c.file}: identical result when split at every byte offset`, () => {
      const bytes = fixture(c.file);
      const whole = digest(run(c, [bytes]));
      for (let i = 1; i < bytes.length; i++) {
        const got = digest(run(c, [bytes.subarray(0, i), bytes.subarray(i)]));
        if (got !== whole) expect(got, `split at ${i}`).toBe(whole);
      }
    });

    it(`${c.file}: identical result fed one byte at a time and in random pieces`, () => {
      const bytes = fixture(c.file);
      const whole = digest(run(c, [bytes]));
      const ones = Array.from({ length: bytes.length }, (_, i) => bytes.subarray(i, i + 1));
      expect(digest(run(c, ones))).toBe(whole);
      let seed = 7;
      for (let round = 0; round < 20; round++) {
        const pieces: Buffer[] = [];
        for (let i = 0; i < bytes.length; ) {
          seed = (seed * 1103515245 + 12345) >>> 0;
          const n = 1 + (seed % 97);
          pieces.push(Buffer.from(bytes.subarray(i, i + n))); // copies: the parsers must not keep references
          i += n;
        }
        expect(digest(run(c, pieces))).toBe(whole);
      }
    });
  }
});

describe('what is and is not a token', () => {
  it('Anthropic: an empty thinking_delta, the signature_delta and partial_json "" are not content', () => {
    const r = run(CASES.find((c) => c.file === 'anthropic-thinking.sse')!, [fixture('anthropic-thinking.sse')]);
    const sig = r.events.findIndex((e) => e.data.includes('signature_delta'));
    expect(r.kinds[sig]).toBe(EventKind.None);
    expect(r.kinds[sig - 1]).toBe(EventKind.None); // the empty thinking_delta just before it
    const tools = run(CASES.find((c) => c.file === 'anthropic-tools.sse')!, [fixture('anthropic-tools.sse')]);
    const emptyJson = tools.events.findIndex((e) => e.data.includes('"partial_json":""'));
    expect(emptyJson).toBeGreaterThan(0);
    expect(tools.kinds[emptyJson]).toBe(EventKind.None);
  });

  it('Gemini: cumulative output (candidates + thoughts) follows the chunks', () => {
    const c = CASES.find((x) => x.file === 'gemini-thinking.sse')!;
    const events = decode('sse', [fixture(c.file)]);
    const a = new GeminiAdapter();
    const cum = events.map((e) => (a.onEvent(e), a.cumulativeOutputTokens));
    expect(cum).toEqual([undefined, 1 + 87, 17 + 87, 24 + 87]);
  });

  it('Ollama: the done line is not content; the generate API `response` field is', () => {
    const a = new OllamaAdapter();
    expect(a.onEvent({ type: '', data: '{"model":"m","response":"Hi","done":false}', id: undefined })).toBe(EventKind.Content);
    expect(a.onEvent({ type: '', data: '{"model":"m","response":"","done":true,"eval_count":2,"prompt_eval_count":3}', id: undefined })).toBe(EventKind.None);
    expect(a.usage).toEqual({ inputTokens: 3, outputTokens: 2 });
    expect(a.onEvent({ type: '', data: '{"error":"model \\"x\\" not found, secret"}', id: undefined })).toBe(EventKind.Error);
    expect(a.errorType).toBe('ollama_error');
  });

  it('Responses: response.failed and error events are in-band errors with their code', () => {
    const a = new OpenAIResponsesAdapter();
    expect(a.onEvent({ type: 'response.output_text.delta', data: '{"type":"response.output_text.delta","delta":""}', id: undefined })).toBe(EventKind.None);
    expect(
      a.onEvent({ type: 'response.failed', data: '{"type":"response.failed","response":{"model":"gpt-x","error":{"code":"server_error","message":"private"},"usage":null}}', id: undefined }),
    ).toBe(EventKind.Error);
    expect(a.errorType).toBe('server_error');
    expect(a.responseModel).toBe('gpt-x');
    const b = new OpenAIResponsesAdapter();
    expect(b.onEvent({ type: 'error', data: '{"type":"error","code":"rate_limit_exceeded","message":"x"}', id: undefined })).toBe(EventKind.Error);
    expect(b.errorType).toBe('rate_limit_exceeded');
    // Without `event:` lines the payload type is used.
    const c = new OpenAIResponsesAdapter();
    expect(c.onEvent({ type: '', data: '{"type":"response.output_text.delta","delta":"Hi"}', id: undefined })).toBe(EventKind.Content);
  });

  it('Gemini: an {"error":…} event is an in-band error typed by its status', () => {
    const a = new GeminiAdapter();
    expect(a.onEvent({ type: '', data: '{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}', id: undefined })).toBe(EventKind.Error);
    expect(a.errorType).toBe('UNAVAILABLE');
  });

  it('Bedrock: exception and error frames are in-band errors typed by their header', () => {
    const a = new BedrockAdapter();
    const ev = { type: 'throttlingException', data: '{"message":"Too many requests"}', id: undefined, messageType: 'exception' };
    expect(a.onEvent(ev)).toBe(EventKind.Error);
    expect(a.errorType).toBe('throttlingException');
    const b = new BedrockAdapter();
    expect(b.onEvent({ type: 'contentBlockDelta', data: '{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"hm"}}}', id: undefined, messageType: 'event' } as SseEvent)).toBe(EventKind.Content);
    expect(b.onEvent({ type: 'contentBlockDelta', data: '{"contentBlockIndex":0,"delta":{"toolUse":{"input":""}}}', id: undefined, messageType: 'event' } as SseEvent)).toBe(EventKind.None);
  });

  it('usage arithmetic: Anthropic and Bedrock add cache reads and writes to input; OpenAI-style totals already include them', () => {
    const a = new AnthropicAdapter();
    a.onEvent({ type: 'message_start', data: '{"type":"message_start","message":{"model":"c","usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":1}}}', id: undefined });
    a.onEvent({ type: 'message_delta', data: '{"type":"message_delta","usage":{"output_tokens":7}}', id: undefined });
    expect(a.usage).toEqual({ inputTokens: 1110, outputTokens: 7, cachedInputTokens: 1000, cacheCreationInputTokens: 100 });
    const b = new BedrockAdapter();
    b.onEvent({ type: 'metadata', data: '{"usage":{"inputTokens":10,"outputTokens":5,"cacheReadInputTokens":1000,"cacheWriteInputTokens":100,"totalTokens":1115}}', id: undefined, messageType: 'event' } as SseEvent);
    expect(b.usage).toEqual({ inputTokens: 1110, outputTokens: 5, cachedInputTokens: 1000, cacheCreationInputTokens: 100 });
    const r = new OpenAIResponsesAdapter();
    r.onEvent({ type: 'response.completed', data: '{"type":"response.completed","response":{"usage":{"input_tokens":1010,"input_tokens_details":{"cached_tokens":1000},"output_tokens":80,"output_tokens_details":{"reasoning_tokens":64}}}}', id: undefined });
    expect(r.usage).toEqual({ inputTokens: 1010, outputTokens: 80, cachedInputTokens: 1000, reasoningTokens: 64 });
  });

  it('non-streamed bodies: usage and model for each API', () => {
    const an = new AnthropicAdapter();
    an.onBody(JSON.stringify({ type: 'message', model: 'claude-x', usage: { input_tokens: 3, output_tokens: 9, cache_read_input_tokens: 2 } }));
    expect(an.usage).toMatchObject({ inputTokens: 5, outputTokens: 9 });
    expect(an.responseModel).toBe('claude-x');
    const g = new GeminiAdapter();
    g.onBody(JSON.stringify([{ candidates: [], usageMetadata: { promptTokenCount: 4 } }, { modelVersion: 'gemini-x', usageMetadata: { promptTokenCount: 4, candidatesTokenCount: 11 } }]));
    expect(g.usage).toMatchObject({ inputTokens: 4, outputTokens: 11 });
    const b = new BedrockAdapter();
    b.onBody(JSON.stringify({ output: { message: { content: [{ text: 'hi' }] } }, stopReason: 'end_turn', usage: { inputTokens: 2, outputTokens: 6 }, metrics: { latencyMs: 300 } }));
    expect(b.usage).toMatchObject({ inputTokens: 2, outputTokens: 6 });
    expect(b.serverTimings?.duration).toBeCloseTo(0.3, 9);
    const o = new OllamaAdapter();
    o.onBody(JSON.stringify({ model: 'llama', message: { content: 'hi' }, done: true, eval_count: 8, prompt_eval_count: 5, eval_duration: 80_000_000 }));
    expect(o.usage).toEqual({ inputTokens: 5, outputTokens: 8 });
    expect(o.serverTimings?.timePerOutputToken).toBeCloseTo(0.01, 9);
  });
});
