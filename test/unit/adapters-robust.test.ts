// Every adapter against what a broken or hostile upstream may send: the events of every API
// (the fixtures' and hand-written ones of the APIs without a fixture), each possibly with one
// part of its JSON replaced by any JSON value, a number no count can be (negative, fractional,
// 1e400, which JSON.parse reads as Infinity), or a value of another type, offered to every
// adapter (mostly its own API's), in any order, under their own or another event name. No
// adapter may throw (the meter would stop measuring the stream), classify outside its three
// kinds, or report a token count that is not a whole number from 0 to 2^53 − 1 (a sum of parts
// too), or a server timing outside that range: an Infinity count made TPOT 0, and counts and times of 1e308 or 1e300 go
// into histogram sums that they spoil until the process restarts.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { anthropicMessages, anthropicVertex } from '../../src/providers/anthropic.js';
import { bedrockConverse, bedrockInvoke } from '../../src/providers/bedrock.js';
import { cohereChat } from '../../src/providers/cohere.js';
import { geminiStream } from '../../src/providers/gemini.js';
import { geminiInteractions } from '../../src/providers/gemini-interactions.js';
import { genericStream } from '../../src/providers/generic.js';
import { lmstudioChat } from '../../src/providers/lmstudio.js';
import { ollamaChat, ollamaGenerate } from '../../src/providers/ollama.js';
import { azureOpenaiChat, llamacppCompletion, openaiChat, openaiCompletions, workersAi } from '../../src/providers/openai-chat.js';
import { openaiResponses } from '../../src/providers/openai-responses.js';
import { sglangGenerate } from '../../src/providers/sglang.js';
import { tgiGenerate } from '../../src/providers/tgi.js';
import { tritonGenerate } from '../../src/providers/triton.js';
import type { ApiDescriptor, ResponseAdapter } from '../../src/providers/types.js';
import type { SseEvent } from '../../src/sse/parser.js';
import { fixture, sseEvents } from '../helpers/fixtures.js';
import { fault, faultText, oneCount, oneTime, withFault, type Fault } from '../helpers/json-faults.js';

const DESCRIPTORS: ApiDescriptor[] = [
  anthropicMessages, anthropicVertex, bedrockConverse, bedrockInvoke, cohereChat, geminiStream, geminiInteractions, genericStream, lmstudioChat,
  ollamaChat, ollamaGenerate, azureOpenaiChat, llamacppCompletion, openaiChat, openaiCompletions, workersAi, openaiResponses, sglangGenerate,
  tgiGenerate, tritonGenerate,
];

interface Seed {
  /** Whose events these are: an adapter is offered its own most of the time. */
  family: string;
  type: string;
  value: unknown;
  /** Bedrock's event-stream message type, for frames. */
  messageType?: string;
  /** `value.bytes` is an event to send base64-encoded, as Bedrock invoke does. */
  wrapped?: boolean;
}

const SSE_FIXTURES = ['anthropic-error.sse', 'anthropic-messages.sse', 'anthropic-thinking.sse', 'anthropic-tools.sse', 'gemini-thinking.sse', 'gemini.sse', 'llamacpp-chat.sse', 'openai-chat-tools.sse', 'openai-chat-usage.sse', 'openai-compat-reasoning.sse', 'openai-responses-reasoning.sse', 'openai-responses.sse', 'tgi-chat.sse', 'vllm-continuous-usage.sse'];

function json(data: string): unknown {
  try {
    return JSON.parse(data);
  } catch {
    return data;
  }
}

/** Events of the APIs the fixtures do not cover, in their documented shapes. */
const HAND_WRITTEN: Seed[] = [
  { family: 'llama.cpp', type: '', value: { index: 0, content: 'Hi', stop: false, tokens_predicted: 3, tokens_evaluated: 12, timings: { prompt_ms: 12.5, predicted_ms: 30, predicted_n: 3, predicted_per_token_ms: 10 } } },
  { family: 'llama.cpp', type: '', value: { index: 0, content: '', stop: true, stop_type: 'limit', tokens_predicted: 9, model: 'm' } },
  { family: 'sglang', type: '', value: { index: 0, text: 'Hello', output_ids: [1], meta_info: { id: 'r0', finish_reason: null, prompt_tokens: 5, completion_tokens: 2, cached_tokens: 1 } } },
  { family: 'sglang', type: '', value: { index: 0, text: 'Hello!', meta_info: { id: 'r0', finish_reason: { type: 'abort', message: 'x', err_type: 'BadRequest' }, prompt_tokens: 5, completion_tokens: 3 } } },
  { family: 'tgi', type: '', value: { generated_text: 'Hi', details: { generated_tokens: 4, finish_reason: 'length' } } },
  { family: 'tgi', type: '', value: { index: 1, token: { id: 2, text: 'Hi', logprob: -0.1, special: false }, generated_text: null, details: null } },
  { family: 'triton', type: '', value: { model_name: 'm', model_version: '1', text_output: ['a', ''], num_output_tokens: 2, num_input_tokens: 7 } },
  { family: 'cohere', type: 'content-delta', value: { type: 'content-delta', index: 0, delta: { message: { content: { text: 'Hi', thinking: 'x' } } } } },
  { family: 'cohere', type: 'tool-call-delta', value: { type: 'tool-call-delta', index: 0, delta: { message: { tool_calls: { function: { arguments: '{"a"' } } } } } },
  { family: 'cohere', type: 'message-end', value: { type: 'message-end', delta: { finish_reason: 'COMPLETE', usage: { billed_units: { input_tokens: 5, output_tokens: 3 }, tokens: { input_tokens: 9, output_tokens: 3 }, cached_tokens: 2 } } } },
  { family: 'cohere', type: '', value: { is_finished: true, event_type: 'stream-end', finish_reason: 'ERROR_LIMIT', response: { meta: { billed_units: { input_tokens: 5, output_tokens: 3 }, tokens: { input_tokens: 9, output_tokens: 3 } } } } },
  { family: 'lmstudio', type: 'message.delta', value: { type: 'message.delta', content: 'Hi' } },
  { family: 'lmstudio', type: 'chat.end', value: { type: 'chat.end', result: { model_instance_id: 'm', stats: { input_tokens: 5, total_output_tokens: 7, reasoning_output_tokens: 2, time_to_first_token_seconds: 0.2, tokens_per_second: 50 } } } },
  { family: 'interactions', type: 'step.delta', value: { event_type: 'step.delta', index: 0, delta: { type: 'text', text: 'Hi' }, metadata: { total_usage: { total_output_tokens: 2, total_thought_tokens: 1, total_tokens: 9 } } } },
  { family: 'interactions', type: 'interaction.completed', value: { event_type: 'interaction.completed', interaction: { id: 'i', model: 'g', status: 'completed', usage: { total_input_tokens: 5, total_output_tokens: 3, total_thought_tokens: 4, total_tokens: 12 } } } },
  { family: 'ollama', type: '', value: { model: 'llama3', created_at: 't', message: { role: 'assistant', content: 'Hi', thinking: 'x' }, done: false } },
  { family: 'ollama', type: '', value: { model: 'llama3', response: '', done: true, done_reason: 'stop', eval_count: 24, eval_duration: 4e8, prompt_eval_count: 5, prompt_eval_duration: 1e7, total_duration: 5e8, load_duration: 1e6 } },
  { family: 'openai', type: '', value: { response: 'Hi', tool_calls: [{ name: 'f', arguments: { a: 1 } }], usage: { prompt_tokens: 4, completion_tokens: 2 }, p: 'pad' } },
  { family: 'bedrock-invoke', type: 'chunk', value: { bytes: { generation: 'Hi', prompt_token_count: 5, generation_token_count: 1, stop_reason: null, 'amazon-bedrock-invocationMetrics': { inputTokenCount: 5, outputTokenCount: 2, invocationLatency: 300, firstByteLatency: 100 } } }, wrapped: true, messageType: 'event' },
  { family: 'bedrock-invoke', type: 'chunk', value: { bytes: { outputText: 'Hi', index: 0, totalOutputTextTokenCount: 2, completionReason: 'FINISH' } }, wrapped: true, messageType: 'event' },
  // Fields the fixtures do not carry: Gemini's tool-use prompt and cache, the Interactions API's, Anthropic's iterations,
  // SGLang's reasoning, TGI's input length, DeepSeek's cache hits, Groq's timings (in `usage` and in `x_groq`).
  { family: 'gemini', type: '', value: { candidates: [{ content: { parts: [{ text: 'x' }] } }], usageMetadata: { promptTokenCount: 5, toolUsePromptTokenCount: 2, cachedContentTokenCount: 1, candidatesTokenCount: 3, thoughtsTokenCount: 4 } } },
  { family: 'interactions', type: 'interaction.completed', value: { event_type: 'interaction.completed', interaction: { id: 'i', status: 'completed', usage: { total_input_tokens: 5, total_tool_use_tokens: 2, total_cached_tokens: 1, total_output_tokens: 3, total_thought_tokens: 1 } } } },
  { family: 'anthropic', type: 'message_delta', value: { type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { input_tokens: 5, output_tokens: 3, iterations: [{ input_tokens: 5, output_tokens: 7 }, { input_tokens: 9, output_tokens: 3 }] } } },
  { family: 'sglang', type: '', value: { index: 0, text: 'Hi', meta_info: { id: 'r0', finish_reason: null, prompt_tokens: 5, completion_tokens: 4, reasoning_tokens: 2, cached_tokens: 0 } } },
  { family: 'tgi', type: '', value: { token: { id: 2, text: '', special: true }, generated_text: 'Hi', details: { finish_reason: 'eos_token', generated_tokens: 3, input_length: 7, prompt_tokens: 7 } } },
  { family: 'openai', type: '', value: { id: 'c', choices: [], usage: { prompt_tokens: 9, completion_tokens: 3, prompt_cache_hit_tokens: 4, prompt_cache_miss_tokens: 5, queue_time: 0.01, prompt_time: 0.02, completion_time: 0.3, total_time: 0.32 } } },
  { family: 'openai', type: '', value: { id: 'c', choices: [], x_groq: { usage: { prompt_tokens: 9, completion_tokens: 3, queue_time: 0.01, prompt_time: 0.02, completion_time: 0.3, total_time: 0.32 } } } },
  { family: 'bedrock-converse', type: 'metadata', value: { usage: { inputTokens: 5, outputTokens: 2, totalTokens: 7, cacheReadInputTokens: 1, cacheWriteInputTokens: 1 }, metrics: { latencyMs: 100 } } },
  { family: 'bedrock-converse', type: 'throttlingException', value: { message: 'slow down' }, messageType: 'exception' },
];

function familyOf(fixtureName: string): string {
  if (fixtureName.startsWith('openai-responses')) return 'responses';
  if (/^(openai|llamacpp|tgi|vllm)/.test(fixtureName)) return 'openai';
  return fixtureName.replace(/[-.].*$/, ''); // anthropic, gemini
}

/** The families of events each adapter reads (a generic stream reads none: it gets any). */
const OWN: Record<string, string[]> = {
  anthropic: ['anthropic'],
  'anthropic-vertex': ['anthropic'],
  'bedrock-converse': ['bedrock-converse'],
  'bedrock-invoke': ['bedrock-invoke', 'anthropic'],
  'cohere-chat': ['cohere'],
  'gemini-interactions': ['interactions'],
  gemini: ['gemini'],
  'lmstudio-chat': ['lmstudio'],
  'ollama-chat': ['ollama'],
  'ollama-generate': ['ollama'],
  'openai-chat': ['openai'],
  'workers-ai': ['openai'],
  'llama.cpp-completion': ['llama.cpp', 'openai'],
  'openai-completions': ['openai'],
  'openai-responses': ['responses'],
  'sglang-generate': ['sglang', 'tgi'],
  'tgi-generate': ['tgi'],
  'triton-generate': ['triton'],
};

/** Every event of the fixtures (Bedrock's frames decoded), and the hand-written ones. */
function seeds(): Seed[] {
  const out: Seed[] = [];
  for (const name of SSE_FIXTURES) for (const e of sseEvents([fixture(name)])) out.push({ family: familyOf(name), type: e.type, value: json(e.data) });
  for (const line of fixture('ollama-chat.ndjson').toString('utf8').split('\n')) if (line !== '') out.push({ family: 'ollama', type: '', value: json(line) });
  for (const name of ['bedrock-converse-stream.decoded.jsonl', 'bedrock-invoke-anthropic.decoded.jsonl']) {
    for (const line of fixture(name).toString('utf8').split('\n')) {
      if (line === '') continue;
      const f = JSON.parse(line) as { headers: Record<string, string>; payload: Record<string, unknown> };
      // Bedrock invoke's base64 `bytes` are kept decoded, so that a mutation reaches inside them.
      const payload = typeof f.payload.bytes === 'string' ? { ...f.payload, bytes: JSON.parse(Buffer.from(f.payload.bytes, 'base64').toString('utf8')) as unknown } : f.payload;
      out.push({ family: name.replace(/-(anthropic|stream)\..*$/, ''), type: f.headers[':event-type']!, value: payload, messageType: f.headers[':message-type'], wrapped: payload !== f.payload });
    }
  }
  return [...out, ...HAND_WRITTEN];
}

const SEEDS = seeds();
/** An event for adapter `api`: mostly one of its own API's, else any. */
function eventArb(api: string) {
  const own = SEEDS.flatMap((x, i) => ((OWN[api] ?? []).includes(x.family) ? [i] : []));
  const any = fc.nat(SEEDS.length - 1);
  return fc.record({
    seed: own.length === 0 ? any : fc.oneof({ arbitrary: fc.constantFrom(...own), weight: 3 }, { arbitrary: any, weight: 1 }),
    /** A faulted node; none: the event as it was. */
    mutation: fc.option(fault, { nil: undefined }),
    /** The event under another event's name (an adapter must not trust the name alone). */
    renamed: fc.oneof({ arbitrary: fc.constant(undefined), weight: 3 }, { arbitrary: fc.nat(SEEDS.length - 1), weight: 1 }),
  });
}

type Ev = { seed: number; mutation: Fault | undefined; renamed: number | undefined };

function render(e: Ev): SseEvent & { messageType?: string } {
  const seed = SEEDS[e.seed]!;
  let value = withFault(seed.value, e.mutation);
  const inner = (value as { bytes?: unknown } | null)?.bytes;
  if (seed.wrapped === true && inner !== null && typeof inner === 'object') value = { ...(value as object), bytes: Buffer.from(faultText(inner)).toString('base64') };
  const other = e.renamed === undefined ? seed : SEEDS[e.renamed]!;
  return { type: other.type, data: faultText(value), id: undefined, ...(other.messageType !== undefined && { messageType: other.messageType }) };
}

function expectSane(a: ResponseAdapter, what: string): void {
  for (const [k, v] of Object.entries(a.usage)) expect(oneCount(v), `${what}: usage.${k} = ${v}`).toBe(true);
  expect(oneCount(a.cumulativeOutputTokens), `${what}: cumulativeOutputTokens = ${a.cumulativeOutputTokens}`).toBe(true);
  for (const [k, v] of Object.entries(a.serverTimings ?? {})) expect(oneTime(v), `${what}: serverTimings.${k} = ${v}`).toBe(true);
  if (a.errorType !== undefined) expect(a.errorType).toMatch(/^[A-Za-z0-9_.-]{1,64}$/);
  if (a.responseModel !== undefined) expect(typeof a.responseModel).toBe('string');
}

describe('adapters against broken and hostile events', () => {
  it('the seeds hold every event of every fixture and every hand-written one, and every adapter but the generic one has its own', () => {
    expect(SEEDS.length).toBeGreaterThan(300);
    expect(SEEDS.filter((s) => s.messageType !== undefined).length).toBeGreaterThan(15);
    for (const d of DESCRIPTORS) if (d !== genericStream) expect(SEEDS.some((x) => OWN[d.api]!.includes(x.family)), d.api).toBe(true);
  });

  it.each(DESCRIPTORS.map((d) => [d.api + (d === anthropicVertex ? ' (vertex)' : d === azureOpenaiChat ? ' (azure)' : ''), d] as const))(
    '%s: never throws, classifies into its three kinds, reports only whole counts and times from 0 to 2^53 − 1',
    (name, d) => {
      fc.assert(
        fc.property(fc.array(eventArb(d.api), { minLength: 1, maxLength: 12 }), (events) => {
          const a = d.newAdapter();
          const evs = events.map(render);
          for (const ev of evs) {
            const kind = a.onEvent(ev);
            expect([0, 1, 2]).toContain(kind);
            expectSane(a, `${name} after ${JSON.stringify(ev).slice(0, 300)}`);
          }
          // The same events as a non-streamed body: one object, or Gemini's array of them.
          if (a.onBody !== undefined) {
            const b = d.newAdapter();
            b.onBody!(evs[0]!.data);
            expectSane(b, `${name} body ${evs[0]!.data.slice(0, 300)}`);
            const c = d.newAdapter();
            c.onBody!(`[${evs.map((e) => e.data).join(',')}]`);
            expectSane(c, `${name} array body`);
          }
        }),
        { numRuns: 600 },
      );
    },
  );
});
