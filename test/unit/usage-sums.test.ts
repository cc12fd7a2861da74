// Usage and timings that an adapter adds up from parts (Gemini's candidates + thoughts and
// prompt + tool-use prompt, Bedrock's and Anthropic's input + cache reads + cache writes,
// Triton's per-response counts, Ollama's and LM Studio's load time + prompt time, Groq's
// queue time + prompt or total time). An absent or null part counts 0 (proto3 JSON leaves
// zeros out); a part that is there but is no count or time leaves the sum unreported, never
// reported short (the cache reads alone as the input, the thoughts alone as the output).
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { anthropicMessages } from '../../src/providers/anthropic.js';
import { bedrockConverse, bedrockInvoke } from '../../src/providers/bedrock.js';
import { geminiStream } from '../../src/providers/gemini.js';
import { geminiInteractions } from '../../src/providers/gemini-interactions.js';
import { lmstudioChat } from '../../src/providers/lmstudio.js';
import { ollamaChat } from '../../src/providers/ollama.js';
import { openaiChat } from '../../src/providers/openai-chat.js';
import { tritonGenerate } from '../../src/providers/triton.js';
import type { ApiDescriptor, ResponseAdapter } from '../../src/providers/types.js';
import { countPart, isSent, members, NOT_COUNTS, type Part, timePart, value } from '../helpers/usage-parts.js';

/**
 * The rule: undefined when the part that must be there (`first`, when the sum needs it) is not a
 * good value, when no part is sent, or when a sent part is bad; the sum of the good ones otherwise.
 */
function expectedSum(parts: Part[], firstRequired: boolean): number | undefined {
  if (firstRequired && parts[0]!.k !== 'ok') return undefined;
  if (!parts.some(isSent) || parts.some((p) => p.k === 'bad')) return undefined;
  return parts.reduce((s, p) => s + value(p), 0);
}

interface Case {
  name: string;
  api: ApiDescriptor;
  fields: string[];
  part: fc.Arbitrary<Part>;
  /** The first field must be a good value for any sum (the prompt count, the prompt time). */
  firstRequired: boolean;
  /** Feeds the parts' members (`m`) to a new adapter. */
  feed(a: ResponseAdapter, m: string): void;
  read(a: ResponseAdapter): number | undefined;
  /** The reported value for a sum (a unit change). */
  scale?: number;
  /**
   * How a later message's usage meets an earlier one's, for the counts (each message's usage
   * stands whole once it sends a part: `whole`; Anthropic keeps each part until it is sent again:
   * `part`).
   */
  merge?: 'whole' | 'part';
}

const ev = (type: string, data: string) => ({ type, data, id: undefined });
const interactionUsage = (a: ResponseAdapter, m: string) => a.onEvent(ev('interaction.complete', `{"event_type":"interaction.complete","interaction":{"status":"completed","usage":{${m}}}}`));

const CASES: Case[] = [
  {
    name: 'Gemini output = candidates + thoughts',
    merge: 'whole',
    api: geminiStream,
    fields: ['candidatesTokenCount', 'thoughtsTokenCount'],
    part: countPart,
    firstRequired: false,
    feed: (a, m) => a.onEvent(ev('', `{"candidates":[{"content":{"parts":[{"text":"Hi"}]}}],"usageMetadata":{"promptTokenCount":5${m === '' ? '' : ','}${m}}}`)),
    read: (a) => a.usage.outputTokens,
  },
  {
    name: 'Gemini input = prompt + tool-use prompt',
    merge: 'whole',
    api: geminiStream,
    fields: ['promptTokenCount', 'toolUsePromptTokenCount'],
    part: countPart,
    firstRequired: true,
    feed: (a, m) => a.onEvent(ev('', `{"candidates":[{"content":{"parts":[{"text":"Hi"}]}}],"usageMetadata":{${m}}}`)),
    read: (a) => a.usage.inputTokens,
  },
  {
    name: 'Interactions output = output + thoughts',
    merge: 'whole',
    api: geminiInteractions,
    fields: ['total_output_tokens', 'total_thought_tokens'],
    part: countPart,
    firstRequired: false,
    feed: interactionUsage,
    read: (a) => a.usage.outputTokens,
  },
  {
    name: 'Interactions input = input + tool use',
    merge: 'whole',
    api: geminiInteractions,
    fields: ['total_input_tokens', 'total_tool_use_tokens'],
    part: countPart,
    firstRequired: true,
    feed: interactionUsage,
    read: (a) => a.usage.inputTokens,
  },
  {
    name: 'Bedrock Converse input = input + cache read + cache write',
    merge: 'whole',
    api: bedrockConverse,
    fields: ['inputTokens', 'cacheReadInputTokens', 'cacheWriteInputTokens'],
    part: countPart,
    firstRequired: false,
    feed: (a, m) => a.onEvent(ev('metadata', `{"usage":{${m}},"metrics":{"latencyMs":10}}`)),
    read: (a) => a.usage.inputTokens,
  },
  {
    name: 'Anthropic input = input + cache creation + cache read',
    merge: 'part',
    api: anthropicMessages,
    fields: ['input_tokens', 'cache_creation_input_tokens', 'cache_read_input_tokens'],
    part: countPart,
    firstRequired: false,
    feed: (a, m) => a.onEvent(ev('message_start', `{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"c","content":[],"usage":{${m}}}}`)),
    read: (a) => a.usage.inputTokens,
  },
  {
    name: 'Ollama TTFT = prompt eval + load (ns)',
    api: ollamaChat,
    fields: ['prompt_eval_duration', 'load_duration'],
    part: timePart,
    firstRequired: true,
    feed: (a, m) => a.onEvent(ev('', `{"model":"m","done":true,"done_reason":"stop","message":{"role":"assistant","content":""}${m === '' ? '' : ','}${m}}`)),
    read: (a) => a.serverTimings?.timeToFirstToken,
    scale: 1e-9,
  },
  {
    name: 'LM Studio TTFT = time to first token + model load',
    api: lmstudioChat,
    fields: ['time_to_first_token_seconds', 'model_load_time_seconds'],
    part: timePart,
    firstRequired: true,
    feed: (a, m) => a.onEvent(ev('chat.end', `{"type":"chat.end","result":{"stats":{${m}}}}`)),
    read: (a) => a.serverTimings?.timeToFirstToken,
  },
  {
    name: 'Groq TTFT = prompt time + queue time',
    merge: 'whole',
    api: openaiChat,
    fields: ['prompt_time', 'queue_time'],
    part: timePart,
    firstRequired: true,
    feed: (a, m) => a.onEvent(ev('', `{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2${m === '' ? '' : ','}${m}}}`)),
    read: (a) => a.serverTimings?.timeToFirstToken,
  },
  {
    name: 'Groq duration = total time + queue time',
    merge: 'whole',
    api: openaiChat,
    fields: ['total_time', 'queue_time'],
    part: timePart,
    firstRequired: true,
    feed: (a, m) => a.onEvent(ev('', `{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2${m === '' ? '' : ','}${m}}}`)),
    read: (a) => a.serverTimings?.duration,
  },
];

describe('usage and timings added up from parts', () => {
  it.each(CASES.map((c) => [c.name, c] as const))('%s: absent parts count 0; a bad part leaves the sum unreported', (_, c) => {
    fc.assert(
      fc.property(fc.tuple(...c.fields.map(() => c.part)), (parts) => {
        const a = c.api.newAdapter();
        c.feed(a, members(c.fields, parts));
        const want = expectedSum(parts, c.firstRequired);
        const got = c.read(a);
        if (want === undefined) expect(got).toBeUndefined();
        else expect(got).toBeCloseTo(want * (c.scale ?? 1), 9);
      }),
      { numRuns: 300 },
    );
  });

  it.each(CASES.filter((c) => c.merge !== undefined).map((c) => [c.name, c] as const))(
    '%s, over two messages: a bad part in the later one makes the figure unreported, not the earlier figure kept',
    (_, c) => {
      const parts = fc.tuple(...c.fields.map(() => c.part));
      fc.assert(
        fc.property(parts, parts, (first, later) => {
          const a = c.api.newAdapter();
          c.feed(a, members(c.fields, first));
          c.feed(a, members(c.fields, later));
          const now = c.merge === 'part' ? later.map((p, i) => (isSent(p) ? p : first[i]!)) : later.some(isSent) ? later : first;
          const want = expectedSum(now, c.firstRequired);
          const got = c.read(a);
          if (want === undefined) expect(got).toBeUndefined();
          else expect(got).toBe(want);
        }),
        { numRuns: 300 },
      );
    },
  );

  it('each case meets a bad part beside good ones, and sums of several good parts', () => {
    // The property above has power only if both outcomes are common: check the generator once.
    for (const c of CASES) {
      const samples = fc.sample(fc.tuple(...c.fields.map(() => c.part)), { numRuns: 300, seed: 7 });
      const badBesideGood = samples.filter((p) => p.some((x) => x.k === 'bad') && p.some((x) => x.k === 'ok')).length;
      const summed = samples.filter((p) => expectedSum(p, c.firstRequired) !== undefined && p.filter((x) => x.k === 'ok').length > 1).length;
      expect(badBesideGood, c.name).toBeGreaterThan(30);
      expect(summed, c.name).toBeGreaterThan(15);
    }
  });

  it('Triton: the running sum of per-response counts is lost for good at a bad one; absent or null ones add nothing', () => {
    // With several sequences a count is a list of one count each (`[3]` is a count there); a list
    // with a bad element, or none, is no count.
    const notCounts = [...NOT_COUNTS.filter((t) => t !== '[3]'), '[1,-1]', '[1,"2"]', '[1.5]', '[null]'];
    const piece = fc.oneof(
      { weight: 1, arbitrary: fc.constant<Part>({ k: 'absent' }) },
      { weight: 1, arbitrary: fc.constant<Part>({ k: 'null' }) },
      { weight: 6, arbitrary: fc.integer({ min: 0, max: 50 }).map((v): Part => ({ k: 'ok', v })) },
      { weight: 1, arbitrary: fc.constantFrom(...notCounts).map((text): Part => ({ k: 'bad', text })) },
    );
    fc.assert(
      fc.property(fc.array(piece, { minLength: 1, maxLength: 12 }), (parts) => {
        const a = tritonGenerate.newAdapter();
        let sum: number | undefined;
        let lost = false;
        for (const p of parts) {
          const kind = a.onEvent(ev('', `{"model_name":"m","text_output":"a"${p.k === 'absent' ? '' : ','}${members(['num_output_tokens'], [p])}}`));
          expect(kind).toBe(1);
          if (p.k === 'bad') lost = true;
          if (!lost && p.k === 'ok') sum = (sum ?? 0) + p.v;
          expect(a.usage.outputTokens).toBe(lost ? undefined : sum);
          // The per-token ITL reads a running count only from an event that reported one.
          expect(a.cumulativeOutputTokens).toBe(!lost && p.k === 'ok' ? sum : undefined);
        }
      }),
      { numRuns: 300 },
    );
  });

  it('Anthropic: an input past 2^53 − 1 is no count; sent iterations are the output, or none when one is unusable (not the last pass alone)', () => {
    const max = Number.MAX_SAFE_INTEGER;
    const a = anthropicMessages.newAdapter();
    a.onEvent(ev('message_start', `{"type":"message_start","message":{"usage":{"input_tokens":${max},"cache_read_input_tokens":${max}}}}`));
    expect(a.usage.inputTokens).toBeUndefined();
    const delta = (iterations: string) => `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":40,"iterations":${iterations}}}`;
    const out = (iterations: string) => {
      const b = anthropicMessages.newAdapter();
      b.onEvent(ev('message_delta', delta(iterations)));
      return [b.usage.outputTokens, b.cumulativeOutputTokens];
    };
    expect(out('[{"output_tokens":3500},{"output_tokens":40}]')).toEqual([3540, 3540]);
    expect(out('[{"output_tokens":3500},{"output_tokens":-1}]')).toEqual([undefined, undefined]);
    expect(out('[{"output_tokens":3500},{}]')).toEqual([undefined, undefined]);
    expect(out(`[{"output_tokens":${max}},{"output_tokens":40}]`)).toEqual([undefined, undefined]);
    expect(out('[]')).toEqual([40, 40]);
  });

  it('Bedrock invoke with an Anthropic model: a bad cache part leaves the input unreported, not the invocation metrics\' count in its place', () => {
    const chunk = (inner: unknown) => ({ type: 'chunk', data: JSON.stringify({ bytes: Buffer.from(JSON.stringify(inner)).toString('base64') }), id: undefined, messageType: 'event' });
    const metrics = { inputTokenCount: 19, outputTokenCount: 5, invocationLatency: 300, firstByteLatency: 100 };
    const run = (usage: unknown) => {
      const a = bedrockInvoke.newAdapter();
      a.onEvent(chunk({ type: 'message_start', message: { usage } }));
      a.onEvent(chunk({ type: 'message_stop', 'amazon-bedrock-invocationMetrics': metrics }));
      return a.usage.inputTokens;
    };
    expect(run({ input_tokens: 19, cache_read_input_tokens: 100 })).toBe(119);
    expect(run({ input_tokens: 19, cache_read_input_tokens: -100 })).toBeUndefined();
    expect(run({})).toBe(19); // nothing of the model's own: the metrics
  });

  it('xAI and OpenAI: a reasoning count that is there but bad leaves the output unreported, unless the total says the completion holds it', () => {
    const chunk = (c: number, r: string, total: number) => `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":${c},"completion_tokens_details":{"reasoning_tokens":${r}},"total_tokens":${total}}}`;
    const out = (text: string) => {
      const a = openaiChat.newAdapter();
      a.onEvent(ev('', text));
      return a.usage.outputTokens;
    };
    expect(out(chunk(10, '-4', 17))).toBeUndefined(); // xAI's total would say apart: cannot tell
    expect(out(chunk(10, '-4', 13))).toBe(10); // OpenAI's: the completion holds the reasoning
    expect(out(chunk(10, '4', 17))).toBe(14);
    expect(out(chunk(10, 'null', 13))).toBe(10);
  });

  it('Anthropic: a bad part leaves the input unreported until a later event sends a good one', () => {
    const a = anthropicMessages.newAdapter();
    a.onEvent(ev('message_start', '{"type":"message_start","message":{"usage":{"input_tokens":-3,"cache_read_input_tokens":100,"output_tokens":1}}}'));
    expect(a.usage.inputTokens).toBeUndefined();
    expect(a.usage.cachedInputTokens).toBe(100);
    a.onEvent(ev('message_delta', '{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":7,"output_tokens":9}}'));
    expect(a.usage.inputTokens).toBe(107);
    expect(a.usage.outputTokens).toBe(9);
  });
  it('xAI: completion + reasoning (its total says they are apart) past 2^53 − 1 is no count; in range it is the output', () => {
    const max = Number.MAX_SAFE_INTEGER;
    const chunk = (c: number, r: number) => `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":${c},"completion_tokens_details":{"reasoning_tokens":${r}},"total_tokens":${3 + c + r}}}`;
    const a = openaiChat.newAdapter();
    a.onEvent(ev('', chunk(max, max)));
    expect(a.usage.outputTokens).toBeUndefined();
    const b = openaiChat.newAdapter();
    b.onEvent(ev('', chunk(10, 4)));
    expect(b.usage.outputTokens).toBe(14);
  });
});
