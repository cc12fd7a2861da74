import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ContentPrefix } from '../../src/providers/content-prefix.js';
import { OpenAIChatAdapter } from '../../src/providers/openai-chat.js';
import { EventKind } from '../../src/providers/types.js';
import { SseParser } from '../../src/sse/parser.js';
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

/**
 * As the request meter does: a one-line event offered to quickContentFrom
 * (the parser's lane), else its bytes to quickContent, else the decoded event
 * to onEvent.
 */
function classifyBytes(chunks: Buffer[]) {
  const a = new OpenAIChatAdapter();
  const kinds: EventKind[] = [];
  /** The output count each event reported, as the meter sees it: none for those the byte paths took. */
  const counts: (number | undefined)[] = [];
  let quick = 0;
  let laned = 0;
  const p = new SseParser(
    (e) => {
      kinds.push(a.onEvent(e));
      counts.push(a.cumulativeOutputTokens);
    },
    {
      onData: (buf, start, end, type) => {
        if (type !== '' || !a.quickContent(buf, start, end)) return false;
        kinds.push(EventKind.Content);
        counts.push(undefined);
        quick++;
        return true;
      },
      lane: {
        find: (buf, start, limit) => a.quickContentFrom(buf, start, limit),
        taken: () => {
          kinds.push(EventKind.Content);
          counts.push(undefined);
          quick++;
          laned++;
        },
      },
    },
  );
  for (const c of chunks) p.push(c);
  p.end();
  return { kinds, counts, quick, laned, adapter: a };
}

/** Cuts `buf` every `step` bytes (reads that end anywhere in an event). */
function cut(buf: Buffer, step: number): Buffer[] {
  const out: Buffer[] = [];
  for (let i = 0; i < buf.length; i += step) out.push(buf.subarray(i, i + step));
  return out;
}

/** Removes the n-th bracket (mod their count) of a JSON text. */
function dropBracket(d: string, n: number): string {
  const at: number[] = [];
  for (let i = 0; i < d.length; i++) if ('{}[]'.includes(d[i]!)) at.push(i); // UTF-16 indices, as slice() takes them
  if (at.length === 0) return d;
  const i = at[n % at.length]!;
  return d.slice(0, i) + d.slice(i + 1);
}

/** Removes the quote that closes the first `"content":"…` text. */
function dropClosingQuote(d: string): string {
  const start = d.indexOf('"content":"');
  if (start === -1) return d;
  for (let i = start + 11; i < d.length; i++) {
    if (d[i] === '\\') i++;
    else if (d[i] === '"') return d.slice(0, i) + d.slice(i + 1);
  }
  return d;
}

/** The byte path and the full parse see the same events alike; returns how many took the byte path. */
/**
 * The byte paths agree with JSON.parse on these events, in one read and in
 * reads of `step` bytes; returns how many events the byte paths took.
 */
function agreesWithFullParse(datas: string[], step = 97): { quick: number; laned: number } {
  const full = new OpenAIChatAdapter();
  // A leading space: JSON.parse accepts it, the byte path never matches it.
  const counts: (number | undefined)[] = [];
  const kinds = datas.map((data) => {
    const kind = full.onEvent({ type: '', data: ` ${data}`, id: '' });
    counts.push(full.cumulativeOutputTokens);
    return kind;
  });
  const bytes = Buffer.from(datas.map((d) => `data: ${d}\n\n`).join(''));
  let quick = 0;
  let laned = 0;
  for (const chunks of [[bytes], cut(bytes, step)]) {
    const fast = classifyBytes(chunks);
    expect(fast.kinds).toEqual(kinds);
    expect(fast.adapter.usage).toEqual(full.usage);
    // An event that reports a count never takes a byte path (per-token ITL needs its count).
    expect(fast.counts).toEqual(counts);
    expect(fast.adapter.responseModel).toBe(full.responseModel);
    expect(fast.adapter.errorType).toBe(full.errorType);
    expect(fast.adapter.serverTimings).toEqual(full.serverTimings);
    expect(fast.adapter.finishReasons.list()).toEqual(full.finishReasons.list());
    quick += fast.quick;
    laned += fast.laned;
  }
  return { quick, laned };
}

describe('OpenAI Chat adapter on recorded-shape streams', () => {
  it('the byte path classifies every fixture like the full parse, and takes most plain deltas of OpenAI streams', () => {
    for (const c of CASES) {
      const full = classify(c.file);
      const fast = classifyBytes([fixture(c.file)]);
      expect(fast.kinds, c.file).toEqual(full.kinds);
      expect(fast.adapter.usage, c.file).toEqual(full.adapter.usage);
      expect(fast.adapter.responseModel, c.file).toBe(full.adapter.responseModel);
      expect(fast.adapter.serverTimings, c.file).toEqual(full.adapter.serverTimings);
      expect(fast.adapter.errorType, c.file).toBe(full.adapter.errorType);
      if (c.file.startsWith('openai-chat.') || c.file.startsWith('openai-chat-usage')) expect(fast.quick, c.file).toBeGreaterThanOrEqual(c.content - 2);
    }
  });

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

  it("Moonshot (Kimi): usage inside the finishing choice, its cached_tokens, on both paths and at every split", () => {
    // The shape of a captured moonshot-v1-8k stream: no top-level usage; the finish chunk carries
    // it in choices[0], with Kimi's cached_tokens at the usage's top level.
    const head = '{"id":"chatcmpl-67c9","object":"chat.completion.chunk","created":1741252964,"model":"moonshot-v1-8k","choices":[{"index":0,';
    const texts = ['Today', ' in', ' Paris', ' it', ' is', ' 22°C'];
    const lines = [
      `${head}"delta":{"role":"assistant","content":""},"finish_reason":null}],"system_fingerprint":"fpv0_ca1d2527"}`,
      ...texts.map((t) => `${head}"delta":{"content":${JSON.stringify(t)}},"finish_reason":null}],"system_fingerprint":"fpv0_ca1d2527"}`),
      `${head}"delta":{},"finish_reason":"stop","usage":{"prompt_tokens":39,"completion_tokens":7,"total_tokens":46,"cached_tokens":32}}],"system_fingerprint":"fpv0_ca1d2527"}`,
      '[DONE]',
    ];
    const bytes = Buffer.from(lines.map((l) => `data: ${l}\n\n`).join(''));
    const full = new OpenAIChatAdapter();
    const kinds = sseEvents([bytes]).map((e) => full.onEvent(e));
    expect(kinds.filter((k) => k === EventKind.Content).length).toBe(6);
    expect(full.usage).toMatchObject({ inputTokens: 39, outputTokens: 7, cachedInputTokens: 32 });
    expect(full.finishReasons.list()).toEqual(['stop']);
    for (let i = 1; i < bytes.length; i++) {
      const fast = classifyBytes([bytes.subarray(0, i), bytes.subarray(i)]);
      if (fast.kinds.join() !== kinds.join()) expect(fast.kinds, `split at ${i}`).toEqual(kinds);
      if (fast.adapter.usage.outputTokens !== 7 || fast.adapter.usage.cachedInputTokens !== 32) expect(fast.adapter.usage, `split at ${i}`).toMatchObject({ inputTokens: 39, outputTokens: 7, cachedInputTokens: 32 });
    }
    // Content in the chunk that carries the usage (a newer Kimi frame): read by the full parse,
    // also once the byte path knows the stream's prefix.
    const both = Buffer.from(
      [...lines.slice(0, 3), `${head}"delta":{"content":"ok"},"finish_reason":null,"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"cached_tokens":7}}],"system_fingerprint":"fpv0_ca1d2527"}`]
        .map((l) => `data: ${l}\n\n`)
        .join(''),
    );
    const fast = classifyBytes([both]);
    expect(fast.kinds.filter((k) => k === EventKind.Content).length).toBe(3);
    expect(fast.adapter.usage).toMatchObject({ inputTokens: 10, outputTokens: 2, cachedInputTokens: 7 });
    // A choice's usage before its delta is in the bytes a learned prefix would cover: such a
    // prefix is not learned, so each event's own count reaches the meter as the full parse gives it.
    const early = Buffer.from(
      [1, 2, 3, 4]
        .map((n) => `data: ${head}"usage":{"prompt_tokens":3,"completion_tokens":4},"delta":{"content":"t${n}"},"finish_reason":null}]}\n\n`)
        .join(''),
    );
    const earlyFull = new OpenAIChatAdapter();
    const earlyCounts = sseEvents([early]).map((e) => (earlyFull.onEvent(e), earlyFull.cumulativeOutputTokens));
    expect(earlyCounts).toEqual([4, 4, 4, 4]);
    expect(classifyBytes([early]).counts).toEqual(earlyCounts);
    // Two choices each with their own: no request total from them (as vLLM's per-choice counts).
    const two = new OpenAIChatAdapter();
    for (const i of [0, 1]) two.onEvent({ type: '', data: `{"model":"moonshot-v1-8k","choices":[{"index":${i},"delta":{},"finish_reason":"stop","usage":{"prompt_tokens":39,"completion_tokens":${5 + i}}}]}`, id: undefined });
    expect(two.usage.inputTokens).toBe(39);
    expect(two.usage.outputTokens).toBeUndefined();
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

describe('the byte path (quickContent on a learned prefix) agrees with the full parse', () => {
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
    .record({ index: fc.nat(2), delta, finish_reason: fc.option(fc.constantFrom('stop', 'length', 'error', ''), { nil: null }) })
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

  it('same kind for every event, same usage, model, error, timings and finish reasons, on chunks of any shape (property)', () => {
    fc.assert(
      fc.property(fc.array(event, { minLength: 1, maxLength: 12 }), fc.integer({ min: 1, max: 400 }), (datas, step) => {
        agreesWithFullParse(datas, step);
      }),
      { numRuns: 3000 },
    );
  });

  it('the byte path (learned prefix) agrees with the full parse on streams of generated chunks (property)', () => {
    // Streams whose chunks share a header, as real ones do, so the learned prefix is used; the
    // text, the first choice's other fields and everything after the choices vary.
    const header = fc.record(
      {
        id: fc.constantFrom('chatcmpl-1', 'chatcmpl-"x\\'),
        object: fc.constant('chat.completion.chunk'),
        created: fc.nat(),
        model: fc.constantFrom('m1', 'gpt-4o'),
        system_fingerprint: fc.constantFrom('fp_1', '"content":"'),
        x: fc.constantFrom({ choices: [{ delta: { content: 'nested' } }] }, 'y'),
      },
      { requiredKeys: ['id', 'model'] },
    );
    const firstChoice = fc.oneof(
      { weight: 6, arbitrary: fc.record({ index: fc.constant(0), delta: fc.record({ content: tricky }) }) },
      { weight: 2, arbitrary: fc.record({ index: fc.constant(0), delta: fc.record({ reasoning_content: tricky }) }) },
      { weight: 1, arbitrary: fc.record({ index: fc.constant(0), delta: fc.record({ content: fc.constant(null), reasoning_content: tricky }) }) },
      { weight: 1, arbitrary: fc.record({ index: fc.constant(0), delta: fc.record({ content: tricky }), logprobs: fc.constant(null), finish_reason: fc.option(fc.constant('stop'), { nil: null }) }) },
      { weight: 1, arbitrary: fc.record({ x: fc.record({ content: tricky }), delta: fc.record({ content: tricky }) }) },
      { weight: 1, arbitrary: choice },
    );
    // Rare, as in real streams: a second choice, usage, an error, server timings.
    const rare = <T,>(arb: fc.Arbitrary<T>, oneIn: number) =>
      fc.oneof({ weight: oneIn - 1, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: arb });
    const tail = fc
      .record({
        more: rare(fc.array(choice, { minLength: 1, maxLength: 1 }), 8),
        usage: fc.oneof({ weight: 5, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.record({ completion_tokens: fc.nat(100), prompt_tokens: fc.nat(100) }) }),
        error: rare(fc.record({ type: fc.constantFrom('server_error', 'overloaded') }), 12),
        timings: rare(fc.record({ prompt_ms: fc.nat(100), predicted_per_token_ms: fc.nat(50), predicted_n: fc.nat(50) }), 8),
        obfuscation: rare(tricky, 2),
      })
      .map((t) => Object.fromEntries(Object.entries(t).filter(([, v]) => v !== undefined)) as { more?: unknown[] });
    // Now and then an event is broken in a way the byte path must notice (see content-prefix.ts).
    const mangling = fc.oneof(
      { weight: 20, arbitrary: fc.constant((d: string) => d) },
      { weight: 1, arbitrary: fc.nat().map((n) => (d: string) => dropBracket(d, n)) },
      { weight: 1, arbitrary: fc.constant((d: string) => d.replace('"content":"', '"content":"\t')) }, // a raw control byte
      { weight: 1, arbitrary: fc.constant((d: string) => d.replace('"content":"', '"content":"\\q')) }, // an invalid escape
      { weight: 1, arbitrary: fc.constant(dropClosingQuote) },
      { weight: 1, arbitrary: fc.constant((d: string) => d.replace(/\](?=[^\]]*$)/, '}')) }, // the last ] written as }
      { weight: 1, arbitrary: fc.constant((d: string) => `${d}\ndata: ${d}`) }, // two objects in one event
      {
        weight: 2,
        arbitrary: fc.constant((d: string) => d.replaceAll('"error"', '"\\u0065rror"').replaceAll('"usage"', '"\\u0075sage"').replaceAll('"timings"', '"tim\\u0069ngs"')),
      },
    );
    let quickTotal = 0;
    let lanedTotal = 0;
    fc.assert(
      fc.property(header, fc.array(fc.tuple(firstChoice, tail, mangling), { minLength: 1, maxLength: 12 }), fc.integer({ min: 1, max: 400 }), (h, evs, step) => {
        const datas = evs.map(([c0, t, mangle]) => {
          const { more, ...rest } = t;
          return mangle(JSON.stringify({ ...h, choices: [c0, ...(more ?? [])], ...rest }));
        });
        const { quick, laned } = agreesWithFullParse(datas, step);
        quickTotal += quick;
        lanedTotal += laned;
      }),
      { numRuns: 3000 },
    );
    // Both byte paths were really exercised: the lane and the one that knows the event's end.
    expect(lanedTotal).toBeGreaterThan(1000);
    expect(quickTotal - lanedTotal).toBeGreaterThan(100);
  });

  it('follows a prefix that changes (llama.cpp\'s created per second), and gives up on one that never repeats', () => {
    const chunk = (created: number, text: string) => `{"id":"c","created":${created},"model":"m","choices":[{"index":0,"delta":{"content":"${text}"}}]}`;
    const bytes = (d: string) => [Buffer.from(d), 0, Buffer.byteLength(d)] as const;
    const p = new ContentPrefix();
    for (let t = 1; t <= 8; t++) {
      expect(p.match(...bytes(chunk(t, 'a')))).toBe(false); // a new second: not sure
      p.learn(chunk(t, 'a'));
      expect(p.match(...bytes(chunk(t, 'b')))).toBe(true);
    }
    const q = new ContentPrefix();
    for (let t = 1; t <= 8; t++) q.learn(chunk(t, 'a')); // never matched: four tries, then no more
    expect(q.learned).toBe(chunk(4, '').slice(0, -5));
  });

  it('matchFrom: every byte of the prefix is compared, in a read with one event, in one with many, and in a range of a chunked read', () => {
    const data = '{"id":"chatcmpl-A","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Hi"}}]}';
    const p = new ContentPrefix();
    p.learn(data);
    const n = p.learned!.length;
    expect(n % 8).not.toBe(0); // so the bytes after the last whole word are checked too
    const event = `data: ${data}\n\n`;
    const other = event.repeat(3);
    const framed = (e: string) => `${Buffer.byteLength(e).toString(16)}\r\n${e}\r\n`;
    // [bytes before the event, bytes after it, whether the search may run to the read's end]
    const reads: [string, string, boolean][] = [
      ['', '', true],
      ['', other, true],
      // One HTTP chunk of several in a read: the range ends at the chunk's payload end.
      [`${framed(event)}${framed(event)}${Buffer.byteLength(event).toString(16)}\r\n`, `\r\n${framed(event)}`, false],
    ];
    // The read's memory: a slice of Node's shared pool (as the proxy's reads are, at a
    // byte offset, beside other reads), or memory of its own (Buffer.alloc).
    const copies: [string, (b: Buffer) => Buffer][] = [
      ['pooled', (b) => Buffer.from(b)],
      ['own memory', (b) => { const c = Buffer.alloc(b.length); b.copy(c); return c; }],
    ];
    for (const [before, after, toEnd] of reads) for (const [memory, copy] of copies) {
      const ok = copy(Buffer.from(`${before}${event}${after}`));
      const s = Buffer.byteLength(before) + 6;
      const limit = toEnd ? ok.length : Buffer.byteLength(before) + Buffer.byteLength(event);
      const what = `${before.length} bytes before, ${after.length} after, ${memory}`;
      expect(p.matchFrom(ok, s, limit), what).toBe(s + data.length);
      for (let k = 0; k < n; k++) {
        const bad = copy(ok);
        bad[s + k] = bad[s + k] === 0x5a ? 0x59 : 0x5a; // Z, or Y where it was Z
        expect(p.matchFrom(bad, s, limit), `byte ${k}, ${what}`).toBe(-1);
        expect(p.matchFrom(ok, s, limit), `after byte ${k}, ${what}`).toBe(s + data.length);
      }
      // Eight bytes compared as one double: a word that reads as a NaN, +0 or -0 is not the prefix's.
      for (let w = 0; w + 8 <= n; w += 8) {
        for (const word of [[0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0x80], [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf8, 0x7f], [0, 0, 0, 0, 0, 0, 0xf8, 0xff]]) {
          const bad = copy(ok);
          bad.set(word, s + w);
          expect(p.matchFrom(bad, s, limit), `word at ${w} = ${word}, ${what}`).toBe(-1);
        }
      }
      // A range that ends before the event does is not the event, whatever follows the range.
      for (const cut of [1, 2, 5, 8]) expect(p.matchFrom(ok, s, s + data.length - cut), `${what}, ${cut} bytes short`).toBe(-1);
    }
  });

  it('never learns a prefix with a line break (data joined from several lines)', () => {
    const split = 'data: {"id":1,\ndata: "model":"m","choices":[{"delta":{"content":"a"}}]}\n\n';
    const p = new ContentPrefix();
    p.learn('{"id":1,\n"model":"m","choices":[{"delta":{"content":"a"}}]}');
    expect(p.learned).toBeUndefined();
    // The same event twice, then once with its second line missing "data:": that line is an
    // unknown field, so the event is `{"id":1,` and not content.
    const broken = 'data: {"id":1,\n"model":"m","choices":[{"delta":{"content":"b"}}]}\n\n';
    const { kinds } = classifyBytes([Buffer.from(split + split + broken)]);
    expect(kinds).toEqual([EventKind.Content, EventKind.Content, EventKind.None]);
  });

  it('matchFrom: a line break outside a string ends the search (it ends the SSE line)', () => {
    const data = '{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"Hi"}}]}';
    const p = new ContentPrefix();
    p.learn(data);
    for (const br of ['\n', '\r']) {
      const broken = Buffer.from(`data: ${data.replace('}}]}', `}${br}}]}`)}\n\n`);
      expect(p.matchFrom(broken, 6, broken.length)).toBe(-1);
      // Through the parser: the event is the line before the break, which is not JSON.
      const { kinds } = classifyBytes([Buffer.from(`data: ${data}\n\n`), broken]);
      expect(kinds).toEqual([EventKind.Content, EventKind.None]);
    }
  });

  it('learns the prefix of OpenAI, Azure and DeepSeek chunks, and declines what it must read', () => {
    const learn = (data: string) => {
      const p = new ContentPrefix();
      p.learn(data);
      return p;
    };
    const b = (s: string) => {
      const buf = Buffer.from(`data: ${s}\n\n`);
      return [buf, 6, buf.length - 2] as const;
    };
    const openai = (text: string, tail = '') =>
      `{"id":"chatcmpl-A","object":"chat.completion.chunk","created":1,"model":"gpt-4o","service_tier":"default","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":"${text}"},"logprobs":null,"finish_reason":null}],"usage":null${tail},"obfuscation":"k1"}`;
    const p = learn(openai('Hi'));
    expect(p.learned).toBe(openai('Hi').slice(0, openai('Hi').indexOf('Hi')));
    expect(p.match(...b(openai(' there')))).toBe(true);
    expect(p.match(...b(openai('a \\"error\\" in the text')))).toBe(true);
    expect(p.match(...b(openai('say \\"x\\"usage')))).toBe(true); // an escaped quote is not the text's end
    expect(p.match(...b(openai('')))).toBe(false); // empty text
    expect(p.match(...b(openai('x', ',"error":{"type":"server_error"}')))).toBe(false);
    expect(p.match(...b(openai('x', ',"usage":{"completion_tokens":3}')))).toBe(false);
    expect(p.match(...b(openai('x', ',"timings":{}')))).toBe(false);
    expect(p.match(...b(openai('x').replace('"finish_reason":null', '"finish_reason":"length"')))).toBe(false); // vLLM's last token
    expect(p.match(...b(openai('x').replace('"finish_reason":null', '"finish_reason":""')))).toBe(true); // no reason, as a string
    expect(p.match(...b(openai('x').replace('"finish_reason":null', '"finish_reason":"","x":"\\u0022"')))).toBe(false); // still scanned after it
    expect(p.match(...b(openai('x').replace('"index":0', '"index":1')))).toBe(false); // another choice
    expect(p.match(...b(openai('x').slice(0, -1)))).toBe(false); // truncated

    const azure = '{"choices":[{"content_filter_results":{"hate":{"filtered":false}},"delta":{"content":"Hi"},"finish_reason":null,"index":0}],"created":1,"id":"c","model":"gpt-4o","object":"chat.completion.chunk"}';
    expect(learn(azure).learned).toBe(azure.slice(0, azure.indexOf('Hi')));
    const deepseek = '{"id":"d","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner","choices":[{"index":0,"delta":{"content":null,"reasoning_content":"Let"},"finish_reason":null}]}';
    expect(learn(deepseek).learned).toBe(deepseek.slice(0, deepseek.indexOf('Let')));
    // Only choices[0].delta's own key counts; a prefix naming usage or error is never learned.
    expect(learn('{"x":{"delta":{"content":"a"}},"choices":[{"delta":{"content":"b"}}]}').learned).toBe('{"x":{"delta":{"content":"a"}},"choices":[{"delta":{"content":"');
    expect(learn('{"x":{"delta":{"content":"a"}},"choices":[]}').learned).toBeUndefined();
    expect(learn('{"choices":[{"x":{"content":"a"},"delta":{"content":"b"}}]}').learned).toBe('{"choices":[{"x":{"content":"a"},"delta":{"content":"');
    expect(learn('{"id":"a\\"{b\\\\","choices":[{"delta":{"content":"b"}}]}').learned).toBe('{"id":"a\\"{b\\\\","choices":[{"delta":{"content":"');
    expect(learn('{"usage":{"completion_tokens":1},"choices":[{"delta":{"content":"b"}}]}').learned).toBeUndefined();
    expect(learn('{"\\u0065rror":{"type":"x"},"choices":[{"delta":{"content":"b"}}]}').learned).toBeUndefined();
    expect(learn('{"timings":{"prompt_ms":1},"choices":[{"delta":{"content":"b"}}]}').learned).toBeUndefined();
    expect(learn('{"choices":[{"finish_reason":"stop","delta":{"content":"b"}}]}').learned).toBeUndefined();
    expect(learn('{"choices":[{"finish_reason":null,"delta":{"content":"b"}}]}').learned).toBe('{"choices":[{"finish_reason":null,"delta":{"content":"');
    expect(learn('{"choices":[{"finish_reason":"","delta":{"content":"b"}}]}').learned).toBe('{"choices":[{"finish_reason":"","delta":{"content":"');
    expect(learn('{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}').learned).toBe('{"choices":[{"delta":{"content":"');
  });

});
