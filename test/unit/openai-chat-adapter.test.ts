import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { OpenAIChatAdapter, quickContent } from '../../src/providers/openai-chat.js';
import { EventKind } from '../../src/providers/types.js';
import { fixture, sseEvents } from '../helpers/fixtures.js';

/** Facts about each fixture, from test/fixtures/sse/README.md (counted by hand from the files). */
const CASES = [
  { file: 'openai-chat.sse', events: 26, content: 23, firstContent: 1, output: undefined, input: undefined, model: 'gpt-4o-mini-2024-07-18' },
  { file: 'openai-chat-usage.sse', events: 27, content: 23, firstContent: 1, output: 23, input: 14, model: 'gpt-4o-mini-2024-07-18' },
  { file: 'openai-chat-tools.sse', events: 16, content: 12, firstContent: 1, output: 19, input: 81, model: 'gpt-4o-mini-2024-07-18' },
  { file: 'openai-compat-reasoning.sse', events: 27, content: 24, firstContent: 1, output: 25, input: 15, model: 'deepseek-reasoner', reasoning: 17 },
  { file: 'vllm-continuous-usage.sse', events: 22, content: 18, firstContent: 1, output: 21, input: 46, model: 'meta-llama/Llama-3.1-8B-Instruct' },
  { file: 'llamacpp-chat.sse', events: 26, content: 23, firstContent: 1, output: 24, input: 31, model: 'qwen2.5-7b-instruct' },
  { file: 'tgi-chat.sse', events: 26, content: 23, firstContent: 0, output: 24, input: 46, model: 'meta-llama/Llama-3.1-8B-Instruct' },
] as const;

function classify(file: string, chunks?: Buffer[]) {
  const bytes = fixture(file);
  const events = sseEvents(chunks ?? [bytes]);
  const a = new OpenAIChatAdapter();
  const kinds = events.map((e) => a.onEvent(e));
  return { events, kinds, adapter: a };
}

describe('OpenAI Chat adapter on recorded-shape streams', () => {
  for (const c of CASES) {
    it(`${c.file}: content events, first token, usage`, () => {
      const { events, kinds, adapter } = classify(c.file);
      expect(events.length).toBe(c.events);
      expect(kinds.filter((k) => k === EventKind.Content).length).toBe(c.content);
      expect(kinds.indexOf(EventKind.Content)).toBe(c.firstContent);
      expect(kinds.includes(EventKind.Error)).toBe(false);
      // After the last content event nothing else is content (finish, usage, [DONE]).
      const last = kinds.lastIndexOf(EventKind.Content);
      expect(events.slice(last + 1).every((e) => e.data === '[DONE]' || !/"(content|reasoning_content|arguments)":"[^"]/.test(e.data))).toBe(true);
      expect(adapter.usage.outputTokens).toBe(c.output);
      expect(adapter.usage.inputTokens).toBe(c.input);
      expect(adapter.responseModel).toBe(c.model);
      if ('reasoning' in c) expect(adapter.usage.reasoningTokens).toBe(c.reasoning);
    });

    it(`${c.file}: same classification when split at every byte offset`, () => {
      const bytes = fixture(c.file);
      const whole = classify(c.file).kinds;
      for (let i = 1; i < bytes.length; i += 1) {
        const got = classify(c.file, [bytes.subarray(0, i), bytes.subarray(i)]).kinds;
        if (got.join() !== whole.join()) expect(got, `split at ${i}`).toEqual(whole);
      }
    });
  }

  it('vLLM continuous usage: cumulative output tokens follow the stream (a 3-token chunk jumps 8 -> 11)', () => {
    const events = sseEvents([fixture('vllm-continuous-usage.sse')]);
    const a = new OpenAIChatAdapter();
    const cumulative: (number | undefined)[] = [];
    for (const e of events) if (a.onEvent(e) === EventKind.Content) cumulative.push(a.cumulativeOutputTokens);
    const jumps = cumulative.slice(1).map((v, i) => (v ?? 0) - (cumulative[i] ?? 0));
    expect(jumps.filter((j) => j === 3).length).toBe(1);
    expect(jumps.every((j) => j === 1 || j === 3)).toBe(true);
  });

  it('treats an OpenAI-compatible error line as an in-band error with its type', () => {
    const a = new OpenAIChatAdapter();
    const k = a.onEvent({ type: '', data: '{"error":{"message":"secret prompt text","type":"server_error","code":null}}', id: undefined });
    expect(k).toBe(EventKind.Error);
    expect(a.errorType).toBe('server_error');
  });

  it('ignores keep-alives, non-JSON and [DONE]', () => {
    const a = new OpenAIChatAdapter();
    for (const data of ['[DONE]', '', 'not json', '42', 'null', '{"choices":"x"}']) {
      expect(a.onEvent({ type: '', data, id: undefined })).toBe(EventKind.None);
    }
  });

  it('reads usage and model from a non-streamed body', () => {
    const a = new OpenAIChatAdapter();
    a.onBody(JSON.stringify({ model: 'gpt-x', choices: [], usage: { prompt_tokens: 5, completion_tokens: 9 } }));
    expect(a.usage).toMatchObject({ inputTokens: 5, outputTokens: 9 });
    expect(a.responseModel).toBe('gpt-x');
  });
});

describe('quickContent: the no-parse path agrees with the full parse', () => {
  const tricky = fc.oneof(
    fc.string(),
    fc.constantFrom('', 'tok 1', '"', '\\', '\\"', '"delta":{"content":"x', '"usage"', '"error"', '}', '\u2028', 'é😀'),
  );
  const entries = <T>(pairs: [string, T | undefined][]) => pairs.filter(([, v]) => v !== undefined) as [string, T][];
  const shuffled = <T>(arb: fc.Arbitrary<[string, T][]>) =>
    arb.chain((es) => fc.shuffledSubarray(es, { minLength: es.length, maxLength: es.length })).map((es) => Object.fromEntries(es));
  const delta = fc
    .record({
      role: fc.option(fc.constant('assistant'), { nil: undefined }),
      content: fc.option(fc.oneof(tricky, fc.constant(null)), { nil: undefined }),
      reasoning_content: fc.option(tricky, { nil: undefined }),
      reasoning: fc.option(tricky, { nil: undefined }),
      tool_calls: fc.option(fc.array(fc.record({ index: fc.nat(3), function: fc.record({ arguments: tricky }) }), { maxLength: 2 }), { nil: undefined }),
    })
    .chain((d) => shuffled(fc.constant(entries(Object.entries(d)))));
  const choice = fc
    .record({ index: fc.nat(2), delta, finish_reason: fc.option(fc.constantFrom('stop', 'length', 'error'), { nil: null }) })
    .chain((c) => shuffled(fc.constant(Object.entries(c) as [string, unknown][])));
  const chunk = fc
    .record({
      id: fc.constant('chatcmpl-1'),
      object: fc.constant('chat.completion.chunk'),
      model: fc.option(fc.constantFrom('m1', 'm2', ''), { nil: undefined }),
      choices: fc.array(choice, { maxLength: 3 }),
      usage: fc.option(fc.oneof(fc.record({ prompt_tokens: fc.nat(100), completion_tokens: fc.nat(100) }), fc.constant(null)), { nil: undefined, freq: 4 }),
      error: fc.option(fc.record({ type: fc.constantFrom('server_error', 'overloaded') }), { nil: undefined, freq: 10 }),
      timings: fc.option(fc.record({ prompt_ms: fc.nat(100), predicted_per_token_ms: fc.nat(50), predicted_n: fc.nat(50) }), { nil: undefined, freq: 8 }),
    })
    .chain((c) => shuffled(fc.constant(entries(Object.entries(c)))));
  const event = fc.oneof({ weight: 12, arbitrary: chunk.map((c) => JSON.stringify(c)) }, { weight: 1, arbitrary: fc.constantFrom('[DONE]', '{not json', '{"choices":[{"delta":{"content":"x"}}]', '') });

  it('same kind for every event, same usage, model, error and timings', () => {
    fc.assert(
      fc.property(fc.array(event, { minLength: 1, maxLength: 12 }), (datas) => {
        const fast = new OpenAIChatAdapter();
        const full = new OpenAIChatAdapter();
        for (const data of datas) {
          // A leading space: JSON.parse accepts it, the no-parse path declines it.
          const kFast = fast.onEvent({ type: '', data, id: '' });
          const kFull = full.onEvent({ type: '', data: ` ${data}`, id: '' });
          if (data.trimStart().startsWith('{')) expect(kFast).toBe(kFull);
        }
        expect(fast.usage).toEqual(full.usage);
        expect(fast.cumulativeOutputTokens).toBe(full.cumulativeOutputTokens);
        expect(fast.responseModel).toBe(full.responseModel);
        expect(fast.errorType).toBe(full.errorType);
        expect(fast.serverTimings).toEqual(full.serverTimings);
      }),
      { numRuns: 3000 },
    );
  });

  it('takes the fast path for the plain deltas of OpenAI, vLLM, llama.cpp and DeepSeek reasoning streams', () => {
    expect(quickContent('{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}')).toBe(true);
    expect(quickContent('{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"Let"},"finish_reason":null}],"model":"deepseek-reasoner"}')).toBe(true);
    expect(quickContent('{"choices":[{"delta":{"content":""}}]}')).toBe(false);
    expect(quickContent('{"choices":[{"delta":{"content":"x"}}],"usage":{"completion_tokens":3}}')).toBe(false);
    expect(quickContent('{"choices":[{"delta":{"content":"x"}}],"usage":null}')).toBe(true); // OpenAI with include_usage
    expect(quickContent('{"choices":[{"delta":{"content":"x"}}],"usage":null,"usage":{"completion_tokens":3}}')).toBe(false);
    expect(quickContent('{"choices":[{"delta":{"content":"x"}}]')).toBe(false); // truncated: let the parse decide
  });
});
