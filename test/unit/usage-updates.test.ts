// Counts and times that a later message of the same answer may send again (vLLM's continuous
// usage, Gemini's usage on every chunk, Anthropic's message_delta, Bedrock's metadata, ...).
// The rule: a field not sent (absent or null) leaves the earlier figure; a good one replaces
// it; one that is there but is no count or time leaves the figure unreported, rather than an
// earlier, lower running count standing as the final one.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { anthropicMessages } from '../../src/providers/anthropic.js';
import { bedrockConverse, bedrockInvoke } from '../../src/providers/bedrock.js';
import { cohereChat } from '../../src/providers/cohere.js';
import { geminiStream } from '../../src/providers/gemini.js';
import { geminiInteractions } from '../../src/providers/gemini-interactions.js';
import { lmstudioChat } from '../../src/providers/lmstudio.js';
import { ollamaChat } from '../../src/providers/ollama.js';
import { llamacppCompletion, openaiChat } from '../../src/providers/openai-chat.js';
import { openaiResponses } from '../../src/providers/openai-responses.js';
import { sglangGenerate } from '../../src/providers/sglang.js';
import { tgiGenerate } from '../../src/providers/tgi.js';
import { tritonGenerate } from '../../src/providers/triton.js';
import type { ApiDescriptor, ResponseAdapter, ServerTimings, Usage } from '../../src/providers/types.js';
import { countPart, isSent, members, type Part, timePart } from '../helpers/usage-parts.js';

const ev = (type: string, data: string) => ({ type, data, id: undefined });
/** The template `t` with its `%` replaced by the member `m`, or left out with its comma when `m` is ''. */
const fill = (t: string, m: string) => (m === '' ? t.replace(/,%|%,|%/, '') : t.replace('%', m));

interface Case {
  name: string;
  api: ApiDescriptor;
  field: string;
  /** Feeds a message whose object holds the member `m` ('' when the field is left out). */
  feed(a: ResponseAdapter, m: string): void;
  read: { usage: keyof Usage } | { timing: keyof ServerTimings };
  /** A time's unit on the wire, in seconds. */
  scale?: number;
  /** The output count is also the event's running count (`cumulativeOutputTokens`, for per-token gaps): set by a good one only. */
  cumulative?: boolean;
  /** The figure from another source when the field is never sent. */
  otherwise?: number;
}

const chat = (usage: string) => (a: ResponseAdapter, m: string) => a.onEvent(ev('', `{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{${fill(usage, m)}}}`));
const chatTimings = (a: ResponseAdapter, m: string) => a.onEvent(ev('', `{"id":"c","object":"chat.completion.chunk","choices":[],"timings":{${fill('"predicted_n":5,%', m)}}}`));
const responses = (usage: string) => (a: ResponseAdapter, m: string) => a.onEvent(ev('response.completed', `{"type":"response.completed","response":{"usage":{${fill(usage, m)}}}}`));
const converse = (body: string) => (a: ResponseAdapter, m: string) => a.onEvent(ev('metadata', fill(body, m)));
/** A Bedrock invoke `chunk` event wrapping the model's own event `inner`. */
const invokeChunk = (a: ResponseAdapter, inner: string) => a.onEvent({ ...ev('chunk', JSON.stringify({ bytes: Buffer.from(inner).toString('base64') })), messageType: 'event' } as never);
const invokeMetrics = (a: ResponseAdapter, m: string) => invokeChunk(a, `{"type":"message_stop","amazon-bedrock-invocationMetrics":{${m}}}`);
const cohere = (usage: string) => (a: ResponseAdapter, m: string) => a.onEvent(ev('message-end', `{"type":"message-end","delta":{"finish_reason":"COMPLETE","usage":{${fill(usage, m)}}}}`));
const gemini = (a: ResponseAdapter, m: string) => a.onEvent(ev('', `{"candidates":[{"content":{"parts":[{"text":"Hi"}]}}],"usageMetadata":{${fill('"promptTokenCount":5,"candidatesTokenCount":9,%', m)}}}`));
const interactions = (a: ResponseAdapter, m: string) => a.onEvent(ev('interaction.complete', `{"event_type":"interaction.complete","interaction":{"status":"completed","usage":{${fill('"total_input_tokens":5,%', m)}}}}`));
const lmstudio = (a: ResponseAdapter, m: string) => a.onEvent(ev('chat.end', `{"type":"chat.end","result":{"stats":{${m}}}}`));
const llamacpp = (a: ResponseAdapter, m: string) => a.onEvent(ev('', `{${fill('"index":0,"content":"a","stop":false,%', m)}}`));
const sglang = (a: ResponseAdapter, m: string) => a.onEvent(ev('', `{"index":0,"text":"a","meta_info":{${fill('"id":"r","finish_reason":null,%', m)}}}`));
const invokeAnthropic = (a: ResponseAdapter, m: string) => {
  // The model's own message_delta, then the invocation metrics with another count.
  invokeChunk(a, `{"type":"message_delta","delta":{},"usage":{${m}}}`);
  invokeMetrics(a, '"outputTokenCount":999');
};
const tgi = (a: ResponseAdapter, m: string) => a.onEvent(ev('', `{"token":{"id":1,"text":"a","special":false},"details":{${fill('"finish_reason":"length",%', m)}}}`));
const ollama = (a: ResponseAdapter, m: string) => a.onEvent(ev('', `{"model":"m","done":true,"done_reason":"stop","message":{"role":"assistant","content":""}${fill(',%', m)}}`));

const CASES: Case[] = [
  { name: 'OpenAI chat output', api: openaiChat, field: 'completion_tokens', feed: chat('"prompt_tokens":3,%'), read: { usage: 'outputTokens' }, cumulative: true },
  { name: 'OpenAI chat input', api: openaiChat, field: 'prompt_tokens', feed: chat('"completion_tokens":2,%'), read: { usage: 'inputTokens' } },
  { name: 'OpenAI chat reasoning', api: openaiChat, field: 'reasoning_tokens', feed: chat('"completion_tokens":20,"completion_tokens_details":{%}'), read: { usage: 'reasoningTokens' } },
  { name: 'OpenAI chat rejected prediction', api: openaiChat, field: 'rejected_prediction_tokens', feed: chat('"completion_tokens":20,"completion_tokens_details":{%}'), read: { usage: 'rejectedPredictionTokens' } },
  { name: 'OpenAI chat cached input', api: openaiChat, field: 'cached_tokens', feed: chat('"prompt_tokens":30,"prompt_tokens_details":{%}'), read: { usage: 'cachedInputTokens' } },
  { name: 'DeepSeek cached input', api: openaiChat, field: 'prompt_cache_hit_tokens', feed: chat('"prompt_tokens":30,%'), read: { usage: 'cachedInputTokens' } },
  { name: 'llama.cpp prompt time', api: openaiChat, field: 'prompt_ms', feed: chatTimings, read: { timing: 'timeToFirstToken' }, scale: 1e-3 },
  { name: 'llama.cpp time per token', api: openaiChat, field: 'predicted_per_token_ms', feed: chatTimings, read: { timing: 'timePerOutputToken' }, scale: 1e-3 },
  { name: 'Groq completion time per token', api: openaiChat, field: 'completion_time', feed: chat('"prompt_tokens":3,"completion_tokens":4,"prompt_time":0.1,%'), read: { timing: 'timePerOutputToken' }, scale: 1 / 4 },
  { name: 'llama.cpp native output', api: llamacppCompletion, field: 'tokens_predicted', feed: llamacpp, read: { usage: 'outputTokens' }, cumulative: true },
  { name: 'llama.cpp native input', api: llamacppCompletion, field: 'tokens_evaluated', feed: llamacpp, read: { usage: 'inputTokens' } },
  { name: 'SGLang output', api: sglangGenerate, field: 'completion_tokens', feed: sglang, read: { usage: 'outputTokens' }, cumulative: true },
  { name: 'SGLang input', api: sglangGenerate, field: 'prompt_tokens', feed: sglang, read: { usage: 'inputTokens' } },
  { name: 'SGLang cached input', api: sglangGenerate, field: 'cached_tokens', feed: sglang, read: { usage: 'cachedInputTokens' } },
  { name: 'SGLang reasoning', api: sglangGenerate, field: 'reasoning_tokens', feed: sglang, read: { usage: 'reasoningTokens' } },
  { name: 'Responses input', api: openaiResponses, field: 'input_tokens', feed: responses('%'), read: { usage: 'inputTokens' } },
  { name: 'Responses output', api: openaiResponses, field: 'output_tokens', feed: responses('%'), read: { usage: 'outputTokens' }, cumulative: true },
  { name: 'Responses cached input', api: openaiResponses, field: 'cached_tokens', feed: responses('"input_tokens_details":{%}'), read: { usage: 'cachedInputTokens' } },
  { name: 'Responses reasoning', api: openaiResponses, field: 'reasoning_tokens', feed: responses('"output_tokens_details":{%}'), read: { usage: 'reasoningTokens' } },
  { name: 'Anthropic output', api: anthropicMessages, field: 'output_tokens', feed: (a, m) => a.onEvent(ev('message_delta', `{"type":"message_delta","delta":{},"usage":{${m}}}`)), read: { usage: 'outputTokens' }, cumulative: true },
  { name: 'Bedrock Converse output', api: bedrockConverse, field: 'outputTokens', feed: converse('{"usage":{"inputTokens":3,%},"metrics":{}}'), read: { usage: 'outputTokens' }, cumulative: true },
  { name: 'Bedrock Converse cache read', api: bedrockConverse, field: 'cacheReadInputTokens', feed: converse('{"usage":{%},"metrics":{}}'), read: { usage: 'cachedInputTokens' } },
  { name: 'Bedrock Converse cache write', api: bedrockConverse, field: 'cacheWriteInputTokens', feed: converse('{"usage":{%},"metrics":{}}'), read: { usage: 'cacheCreationInputTokens' } },
  { name: 'Bedrock Converse latency', api: bedrockConverse, field: 'latencyMs', feed: converse('{"usage":{},"metrics":{%}}'), read: { timing: 'duration' }, scale: 1e-3 },
  { name: 'Bedrock invoke metrics input', api: bedrockInvoke, field: 'inputTokenCount', feed: invokeMetrics, read: { usage: 'inputTokens' } },
  { name: 'Bedrock invoke metrics output', api: bedrockInvoke, field: 'outputTokenCount', feed: invokeMetrics, read: { usage: 'outputTokens' } },
  { name: 'Bedrock invoke Anthropic output', api: bedrockInvoke, field: 'output_tokens', feed: invokeAnthropic, read: { usage: 'outputTokens' }, otherwise: 999 },
  { name: 'Bedrock invoke first byte', api: bedrockInvoke, field: 'firstByteLatency', feed: invokeMetrics, read: { timing: 'timeToFirstToken' }, scale: 1e-3 },
  { name: 'Bedrock invoke latency', api: bedrockInvoke, field: 'invocationLatency', feed: invokeMetrics, read: { timing: 'duration' }, scale: 1e-3 },
  { name: 'Cohere output', api: cohereChat, field: 'output_tokens', feed: cohere('"tokens":{%}'), read: { usage: 'outputTokens' }, cumulative: true },
  { name: 'Cohere input', api: cohereChat, field: 'input_tokens', feed: cohere('"tokens":{%}'), read: { usage: 'inputTokens' } },
  { name: 'Cohere billed output', api: cohereChat, field: 'output_tokens', feed: cohere('"tokens":{"output_tokens":1},"billed_units":{%}'), read: { usage: 'billedOutputTokens' } },
  { name: 'Cohere billed input', api: cohereChat, field: 'input_tokens', feed: cohere('"tokens":{"input_tokens":1},"billed_units":{%}'), read: { usage: 'billedInputTokens' } },
  { name: 'Cohere cached input', api: cohereChat, field: 'cached_tokens', feed: cohere('%'), read: { usage: 'cachedInputTokens' } },
  { name: 'Gemini cached input', api: geminiStream, field: 'cachedContentTokenCount', feed: gemini, read: { usage: 'cachedInputTokens' } },
  { name: 'Gemini thoughts', api: geminiStream, field: 'thoughtsTokenCount', feed: gemini, read: { usage: 'reasoningTokens' } },
  { name: 'Interactions cached input', api: geminiInteractions, field: 'total_cached_tokens', feed: interactions, read: { usage: 'cachedInputTokens' } },
  { name: 'Interactions thoughts', api: geminiInteractions, field: 'total_thought_tokens', feed: interactions, read: { usage: 'reasoningTokens' } },
  { name: 'LM Studio output', api: lmstudioChat, field: 'total_output_tokens', feed: lmstudio, read: { usage: 'outputTokens' }, cumulative: true },
  { name: 'LM Studio input', api: lmstudioChat, field: 'input_tokens', feed: lmstudio, read: { usage: 'inputTokens' } },
  { name: 'LM Studio reasoning', api: lmstudioChat, field: 'reasoning_output_tokens', feed: lmstudio, read: { usage: 'reasoningTokens' } },
  { name: 'Ollama output', api: ollamaChat, field: 'eval_count', feed: ollama, read: { usage: 'outputTokens' }, cumulative: true },
  { name: 'Ollama input', api: ollamaChat, field: 'prompt_eval_count', feed: ollama, read: { usage: 'inputTokens' } },
  { name: 'TGI output', api: tgiGenerate, field: 'generated_tokens', feed: tgi, read: { usage: 'outputTokens' } },
  { name: 'TGI input', api: tgiGenerate, field: 'input_length', feed: tgi, read: { usage: 'inputTokens' } },
  { name: 'Triton input', api: tritonGenerate, field: 'num_input_tokens', feed: (a, m) => a.onEvent(ev('', `{${fill('"model_name":"m","text_output":"a",%', m)}}`)), read: { usage: 'inputTokens' } },
];

const isTime = (c: Case) => 'timing' in c.read;
const read = (c: Case, a: ResponseAdapter) => ('usage' in c.read ? a.usage[c.read.usage] : a.serverTimings?.[c.read.timing]);

/** What the rule says the figure is after the two messages. */
function expected(first: Part, later: Part): number | undefined {
  const now = isSent(later) ? later : first;
  return now.k === 'ok' ? now.v : undefined;
}

describe('a count or time that a later message sends again', () => {
  it.each(CASES.map((c) => [c.name, c] as const))('%s: a later bad one leaves it unreported; a later absent or null one leaves the earlier', (_, c) => {
    let badAfterGood = 0;
    const part = isTime(c) ? timePart : countPart;
    fc.assert(
      fc.property(part, part, (first, later) => {
        const a = c.api.newAdapter();
        c.feed(a, members([c.field], [first]));
        c.feed(a, members([c.field], [later]));
        if (first.k === 'ok' && later.k === 'bad') badAfterGood++;
        const want = !isSent(first) && !isSent(later) && c.otherwise !== undefined ? c.otherwise : expected(first, later);
        const got = read(c, a);
        if (want === undefined) expect(got).toBeUndefined();
        else expect(got).toBeCloseTo(want * (c.scale ?? 1), 9);
        if (c.cumulative) expect(a.cumulativeOutputTokens).toBe(later.k === 'ok' ? later.v : undefined);
      }),
      { numRuns: 300 },
    );
    expect(badAfterGood).toBeGreaterThan(10); // the case the rule is about came up
  });
});

describe('a count with an older or second name', () => {
  const tgi = (details: unknown) => {
    const a = tgiGenerate.newAdapter();
    a.onEvent(ev('', JSON.stringify({ token: { id: 1, text: 'a', special: false }, details: { finish_reason: 'length', ...(details as object) } })));
    return a.usage.inputTokens;
  };
  const cohereOut = (usage: unknown) => {
    const a = cohereChat.newAdapter();
    a.onEvent(ev('message-end', JSON.stringify({ type: 'message-end', delta: { finish_reason: 'COMPLETE', usage } })));
    return [a.usage.outputTokens, a.usage.inputTokens];
  };
  const deepseek = (usage: unknown) => {
    const a = openaiChat.newAdapter();
    a.onEvent(ev('', JSON.stringify({ choices: [], usage: { prompt_tokens: 30, ...(usage as object) } })));
    return a.usage.cachedInputTokens;
  };

  it('stands in only when the first name is not sent: one that is there but bad leaves the figure unreported', () => {
    expect(tgi({ input_length: 7, prompt_tokens: 9 })).toBe(7);
    expect(tgi({ prompt_tokens: 9 })).toBe(9);
    expect(tgi({ input_length: null, prompt_tokens: 9 })).toBe(9);
    expect(tgi({ input_length: -7, prompt_tokens: 9 })).toBeUndefined();
    // Cohere: the model's own counts, else the billed ones.
    expect(cohereOut({ tokens: { output_tokens: 12, input_tokens: 40 }, billed_units: { output_tokens: 10, input_tokens: 30 } })).toEqual([12, 40]);
    expect(cohereOut({ billed_units: { output_tokens: 10, input_tokens: 30 } })).toEqual([10, 30]);
    expect(cohereOut({ tokens: { output_tokens: '12', input_tokens: 1.5 }, billed_units: { output_tokens: 10, input_tokens: 30 } })).toEqual([undefined, undefined]);
    // OpenAI's cached count, else DeepSeek's.
    expect(deepseek({ prompt_tokens_details: { cached_tokens: 4 }, prompt_cache_hit_tokens: 5 })).toBe(4);
    expect(deepseek({ prompt_cache_hit_tokens: 5 })).toBe(5);
    expect(deepseek({ prompt_tokens_details: { cached_tokens: -4 }, prompt_cache_hit_tokens: 5 })).toBeUndefined();
  });
});
