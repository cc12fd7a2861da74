import fc from 'fast-check';
import { describe, expect, it, vi } from 'vitest';
import { GeminiInteractionsAdapter } from '../../src/providers/gemini-interactions.js';
import { GeminiAdapter } from '../../src/providers/gemini.js';
import { headSpine, tailSpine, type OpenContainer } from '../../src/providers/json-edges.js';
import { OllamaAdapter } from '../../src/providers/ollama.js';
import { OpenAIResponsesAdapter } from '../../src/providers/openai-responses.js';
import { EventKind, type ResponseAdapter } from '../../src/providers/types.js';
import { EventEdges } from '../../src/sse/event-edges.js';
import { JsonArrayParser } from '../../src/sse/json-array.js';
import { NdjsonParser } from '../../src/sse/ndjson.js';
import { SseParser, type SseEvent } from '../../src/sse/parser.js';
import { splitAt } from '../helpers/ranges.js';

describe('EventEdges: the first and last bytes of an event too large to keep', () => {
  it('keeps the first HEAD and the last TAIL bytes, however the pieces come', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 3 * EventEdges.TAIL }), fc.array(fc.nat(), { maxLength: 40 }), fc.integer({ min: 1, max: 97 }), (n, cuts, seed) => {
        const text = Buffer.alloc(n);
        for (let i = 0; i < n; i++) text[i] = 0x21 + ((i * seed + (i >> 7)) % 90); // ASCII: decoding is the identity
        const e = new EventEdges();
        for (const piece of splitAt(text, cuts)) e.add(piece, 0, piece.length);
        expect(e.total).toBe(n);
        expect(e.head()).toBe(text.toString('latin1', 0, Math.min(n, EventEdges.HEAD)));
        expect(e.tail()).toBe(text.toString('latin1', Math.max(0, n - EventEdges.TAIL)));
      }),
      { numRuns: 200 },
    );
  });

  it('copies what it keeps (the caller reuses its buffers)', () => {
    const piece = Buffer.from('abcdef');
    const e = new EventEdges();
    e.add(piece, 1, 5);
    piece.fill(0x7a);
    expect([e.head(), e.tail()]).toEqual(['bcde', 'bcde']);
  });
});

describe('the structure around the cuts of a JSON text too large to parse whole', () => {
  /** Every container of a JSON text, with where its brackets and its members' separators and colons are. */
  interface Container {
    kind: 'object' | 'array';
    open: number;
    close: number;
    members: Array<{ key?: string; value: unknown; before: number; colon: number; after: number; node?: Container }>;
  }
  /** A reference reader: recursive descent over a whole JSON text (no shared code with json-edges.ts). */
  function containers(text: string): Container | undefined {
    let i = 0;
    const ws = () => {
      while (i < text.length && ' \t\r\n'.includes(text[i]!)) i++;
    };
    const str = () => {
      const s = i;
      for (i++; text[i] !== '"'; i++) if (text[i] === '\\') i++;
      i++;
      return JSON.parse(text.slice(s, i)) as string;
    };
    const value = (): { node?: Container } => {
      ws();
      const c = text[i];
      if (c === '{' || c === '[') {
        const node: Container = { kind: c === '{' ? 'object' : 'array', open: i, close: -1, members: [] };
        let before = i++;
        ws();
        if (text[i] === (c === '{' ? '}' : ']')) {
          node.close = i++;
          return { node };
        }
        for (;;) {
          let key: string | undefined;
          let colon = -1;
          ws();
          const s = i;
          if (node.kind === 'object') {
            key = str();
            ws();
            colon = i++;
          }
          const v = value();
          ws();
          const vs = node.kind === 'object' ? colon + 1 : s;
          node.members.push({ key, value: JSON.parse(text.slice(vs, i)), before, colon, after: i, node: v.node });
          if (text[i] === ',') {
            before = i++;
            continue;
          }
          node.close = i++;
          return { node };
        }
      }
      if (c === '"') str();
      else while (i < text.length && !',]} \t\r\n'.includes(text[i]!)) i++;
      return {};
    };
    return value().node;
  }
  /** What headSpine and tailSpine should find for a cut at `p`: the containers open across it, outermost first. */
  function expected(root: Container | undefined, p: number) {
    const head: unknown[] = [];
    const tail: unknown[] = [];
    for (let c = root; c !== undefined && c.open < p && c.close >= p; ) {
      const members = (keep: (m: Container['members'][number]) => boolean) => {
        const ms = c!.members.filter(keep);
        return c!.kind === 'object' ? { members: Object.fromEntries(ms.map((m) => [m.key!, m.value])), elements: [] } : { members: {}, elements: ms.map((m) => m.value) };
      };
      const whole = c.members.filter((m) => m.after < p);
      const at = c.members.find((m) => m.before < p && m.after >= p);
      head.push({ kind: c.kind, ...members((m) => m.after < p), open: c.kind === 'array' ? whole.length : at !== undefined && at.colon < p ? at.key : undefined });
      tail.push({ kind: c.kind, ...members((m) => m.before >= p) });
      c = at?.node;
    }
    return { head, tail };
  }

  it('finds, on each side of any cut, the containers open across it and their members whole on that side', () => {
    // Keys and strings full of quotes, backslashes, brackets, commas and colons, which only the
    // structure tells apart, and characters of 2-4 UTF-8 bytes and escapes (`\u0001`).
    const tricky = fc.string({ unit: fc.constantFrom('"', '\\', '{', '}', '[', ']', ',', ':', 'a', ' ', '°', 'u', '😀', '\u0001', '\n') });
    const json = fc.letrec((tie) => ({
      v: fc.oneof({ depthSize: 'small', withCrossShrink: true }, tricky, fc.integer(), fc.double({ noNaN: true, noDefaultInfinity: true }), fc.boolean(), fc.constant(null), tie('a'), tie('o')),
      a: fc.array(tie('v'), { maxLength: 5 }),
      o: fc.dictionary(fc.oneof(tricky, fc.constant('__proto__')), tie('v'), { maxKeys: 5 }),
    })).o;
    fc.assert(
      fc.property(json, fc.constantFrom(0, 1, 2, '\t'), fc.boolean(), fc.nat(), (o, indent, crlf, at) => {
        // Line ends outside strings (JSON.stringify escapes those inside) as CRLF or LF.
        const text = crlf ? JSON.stringify(o, null, indent).replaceAll('\n', '\r\n') : JSON.stringify(o, null, indent);
        // Cut at a byte, as EventEdges does: a character cut in two decodes as U+FFFD on each side.
        const bytes = Buffer.from(text);
        const b = at % (bytes.length + 1);
        // The reference's cut in the text: before the cut character for the head, after it for the tail.
        let before = 0;
        let after = 0;
        for (let i = 0, off = 0; i <= text.length; ) {
          if (off <= b) before = i;
          if (off >= b) {
            after = i;
            break;
          }
          const cp = text.codePointAt(i)!;
          off += Buffer.byteLength(String.fromCodePoint(cp));
          i += cp > 0xffff ? 2 : 1;
        }
        const root = containers(text);
        const plain = (spine: OpenContainer[]) => spine.map((c) => ({ ...c, members: { ...c.members } }));
        expect(plain(headSpine(bytes.subarray(0, b).toString()))).toEqual(expected(root, before).head);
        expect(plain(tailSpine(bytes.subarray(b).toString()))).toEqual(expected(root, after).tail);
      }),
      { numRuns: 3000 },
    );
  });

  it('parses at most 512 members, and returns at most 32 containers, however many a hostile text has (review 152: 267 ms an event before)', () => {
    const parse = vi.spyOn(JSON, 'parse');
    try {
      for (const [read, text] of [
        [tailSpine, `${','.repeat(65_535)}]`],
        [tailSpine, `${',x'.repeat(32_767)}]`],
        [tailSpine, ',x]'.repeat(21_845)],
        [tailSpine, ']'.repeat(65_536)],
        [headSpine, `[${',x'.repeat(511)}`],
        [headSpine, '{"a":['.repeat(170)],
      ] as const) {
        parse.mockClear();
        const spine = read(text);
        expect(parse.mock.calls.length).toBeLessThanOrEqual(512);
        expect(spine.length).toBeLessThanOrEqual(32);
      }
      // An array's elements past the budget keep their positions.
      expect(tailSpine(`${',1'.repeat(300)}]`)[0]!.elements).toEqual([...Array(172).fill(undefined), ...Array(128).fill(1)]);
    } finally {
      parse.mockRestore();
    }
  });

  it('reads a cut Responses event by where its fields are, not by how they are spelt', () => {
    const head = '{"type":"response.completed","response":{"id":"r","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"instructions":"say \\"status\\":\\"no\\" {","model":"gpt-5","output":[{"type":"image_generation_call","result":"iVBORw0KGgo';
    const tail = 'Zz==","status":"completed"}],"tools":[{"type":"function","parameters":{"usage":{"type":"object"}}}],"usage":{"input_tokens":11,"output_tokens":1290},"user":null,"metadata":{"k":"\\"usage\\":{"}}}';
    const h = headSpine(head);
    expect(h.map((c) => c.open)).toEqual(['response', 'output', 0, 'result']);
    expect(h[1]!.members).toMatchObject({ id: 'r', status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' }, model: 'gpt-5' });
    expect(h[3]!.members).toMatchObject({ type: 'image_generation_call' });
    const t = tailSpine(tail);
    expect(t.map((c) => c.kind)).toEqual(['object', 'object', 'array', 'object']);
    expect(t[1]!.members).toEqual({ tools: [{ type: 'function', parameters: { usage: { type: 'object' } } }], usage: { input_tokens: 11, output_tokens: 1290 }, user: null, metadata: { k: '"usage":{' } });
    expect(t[3]!.members).toEqual({ status: 'completed' });
    // Not cut inside a container: nothing open.
    expect([headSpine('{"a":1}'), tailSpine('{"a":1}'), headSpine(''), tailSpine('')]).toEqual([[], [], [], []]);
  });
});

/** Events of `chunks` through the framing, each classified by the adapter. */
function run(adapter: ResponseAdapter, framing: 'sse' | 'ndjson' | 'json-array', chunks: Buffer[], maxEventBytes?: number): { kinds: EventKind[]; oversize: number; states: unknown[] } {
  const kinds: EventKind[] = [];
  const states: unknown[] = [];
  let oversize = 0;
  const on = (e: SseEvent) => {
    if (e.oversize) oversize++;
    kinds.push(adapter.onEvent(e));
    states.push(state(adapter));
  };
  const opts = maxEventBytes === undefined ? {} : { maxEventBytes };
  const p = framing === 'sse' ? new SseParser(on, opts) : framing === 'ndjson' ? new NdjsonParser(on, opts) : new JsonArrayParser(on, opts);
  for (const c of chunks) p.push(c);
  if (!(p instanceof JsonArrayParser)) p.end();
  return { kinds, oversize, states };
}

/** What an adapter has made of the events so far. */
function state(a: ResponseAdapter) {
  return {
    usage: { ...a.usage },
    finish: a.finishReasons?.list(),
    complete: a.complete,
    model: a.responseModel,
    error: a.errorType,
    reasoning: (a as { reasoningStreamed?: boolean }).reasoningStreamed,
  };
}

describe('a finished response too large to keep is still read', () => {
  // A Responses stream with the image_generation tool: response.completed repeats the image's
  // base64 in `output` (here 1.5 MB, over the default 1 MiB cap).
  const image = 'iVBORw0KGgo'.padEnd(1_500_000, 'QUFB');
  const ev = (o: { type: string } & Record<string, unknown>, named = true) => `${named ? `event: ${o.type}\n` : ''}data: ${JSON.stringify(o)}\n\n`;
  const response = (status: string, extra: Record<string, unknown> = {}) => ({
    id: 'resp_1',
    object: 'response',
    created_at: 1764979200,
    status,
    error: null,
    incomplete_details: null,
    instructions: 'Draw what is asked.',
    model: 'gpt-5-2025-08-07',
    output: [
      { id: 'ig_1', type: 'image_generation_call', status: 'completed', result: image },
      { id: 'msg_1', type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'Here it is.', annotations: [] }] },
    ],
    tools: [{ type: 'image_generation', size: '1024x1024', quality: 'high' }],
    usage: { input_tokens: 11, input_tokens_details: { cached_tokens: 0 }, output_tokens: 1290, output_tokens_details: { reasoning_tokens: 64 }, total_tokens: 1301 },
    user: null,
    metadata: {},
    ...extra,
  });
  const stream = (final: Record<string, unknown> & { type: string }, named = true) =>
    Buffer.from(
      [
        ev({ type: 'response.created', sequence_number: 0, response: { ...response('in_progress'), output: [], usage: null } }, named),
        ev({ type: 'response.image_generation_call.partial_image', sequence_number: 1, partial_image_b64: image }, named),
        ...['Here', ' it', ' is', '.'].map((delta, i) => ev({ type: 'response.output_text.delta', sequence_number: 2 + i, item_id: 'msg_1', output_index: 1, content_index: 0, delta }, named)),
        ev(final, named),
      ].join(''),
    );

  it('Responses: usage, finish reason and completion from the edges of response.completed, at any split', () => {
    const bytes = stream({ type: 'response.completed', sequence_number: 9, response: response('completed') });
    for (const cuts of [[], [100_000, 1_600_000, 3_100_000], [...Array(60).keys()].map((i) => i * 65_537 + 13), [bytes.length - 3, bytes.length - 40_000]]) {
      const a = new OpenAIResponsesAdapter();
      const { kinds, oversize } = run(a, 'sse', splitAt(bytes, cuts));
      expect(oversize).toBe(2); // the partial image, and response.completed
      expect(kinds.filter((k) => k === EventKind.Content).length).toBe(4);
      expect(a.usage).toEqual({ inputTokens: 11, outputTokens: 1290, cachedInputTokens: 0, reasoningTokens: 64 });
      expect(a.finishReasons.list()).toEqual(['completed']);
      expect(a.complete).toBe(true);
      expect(a.errorType).toBeUndefined();
    }
  });

  it('Responses: an incomplete response says why; a stream without event: names is read by the payload types', () => {
    const incomplete = stream({ type: 'response.incomplete', sequence_number: 9, response: response('incomplete', { incomplete_details: { reason: 'max_output_tokens' } }) }, false);
    const a = new OpenAIResponsesAdapter();
    run(a, 'sse', [incomplete]);
    expect(a.finishReasons.list()).toEqual(['max_output_tokens']);
    expect(a.usage.outputTokens).toBe(1290);
    expect(a.complete).toBe(true);
    // Usage farther from the end than the edges keep (70 KB of metadata after it): no count,
    // but the response still finished.
    const b = new OpenAIResponsesAdapter();
    run(b, 'sse', [stream({ type: 'response.completed', sequence_number: 9, response: response('completed', { metadata: { note: 'x'.repeat(70_000) } }) })]);
    expect(b.usage.outputTokens).toBeUndefined();
    expect(b.finishReasons.list()).toEqual(['completed']);
    expect(b.complete).toBe(true);
  });

  it('Ollama /api/generate: the last line, large by its context, gives its counts, timings and done_reason', () => {
    const lines = [
      ...['Para', 'bens', '!'].map((response) => ({ model: 'llama3.2', created_at: '2026-12-06T05:00:00Z', response, done: false })),
      {
        model: 'llama3.2',
        created_at: '2026-12-06T05:00:01Z',
        response: '',
        done: true,
        done_reason: 'length',
        context: Array.from({ length: 180_000 }, (_, i) => (i * 7919) % 128_000),
        total_duration: 2_100_000_000,
        load_duration: 50_000_000,
        prompt_eval_count: 180_000,
        prompt_eval_duration: 1_500_000_000,
        eval_count: 4,
        eval_duration: 80_000_000,
      },
    ];
    const bytes = Buffer.from(lines.map((l) => `${JSON.stringify(l)}\n`).join(''));
    for (const cuts of [[], [500, 700_000], [...Array(30).keys()].map((i) => i * 50_021)]) {
      const a = new OllamaAdapter();
      const { kinds, oversize } = run(a, 'ndjson', splitAt(bytes, cuts));
      expect(oversize).toBe(1);
      expect(kinds).toEqual([EventKind.Content, EventKind.Content, EventKind.Content, EventKind.None]);
      expect(a.usage).toEqual({ inputTokens: 180_000, outputTokens: 4 });
      expect(a.finishReasons.list()).toEqual(['length']);
      expect(a.complete).toBe(true);
      expect(a.serverTimings).toEqual({ timePerOutputToken: 0.08 / 4, timeToFirstToken: 1.55, duration: 2.1 });
    }
    // Without its newline at the body's end, too.
    const a = new OllamaAdapter();
    run(a, 'ndjson', [bytes.subarray(0, bytes.length - 1)]);
    expect(a.usage.outputTokens).toBe(4);
  });
});

describe('a Gemini chunk too large to keep (a generated image) is still read', () => {
  // gemini-2.5-flash-image: the image comes as one part's base64 (here 1.5 MB, over the default
  // 1 MiB cap), in a chunk that may also finish the candidate and carry the usage.
  const image = 'iVBORw0KGgo'.padEnd(1_500_000, 'QUFB');
  const usage = (out?: number) => ({
    promptTokenCount: 9,
    ...(out === undefined ? {} : { candidatesTokenCount: out }),
    totalTokenCount: 9 + (out ?? 0),
    promptTokensDetails: [{ modality: 'TEXT', tokenCount: 9 }],
    ...(out === undefined ? {} : { candidatesTokensDetails: [{ modality: 'IMAGE', tokenCount: out }] }),
  });
  const chunk = (parts: unknown[], extra: Record<string, unknown> = {}, out?: number) => ({
    candidates: [{ content: { parts, role: 'model' }, ...extra, index: 0 }],
    usageMetadata: usage(out),
    modelVersion: 'gemini-2.5-flash-image',
    responseId: 'resp-1',
  });
  const text = chunk([{ text: 'Here is your cat: ' }]);
  const imageAndFinish = chunk([{ inlineData: { mimeType: 'image/png', data: image } }], { finishReason: 'STOP' }, 1295);
  // The API's two spellings: SSE events on one line (`alt=sse`, CRLF-framed), and the streamed
  // array (no `alt`) with each element pretty-printed.
  const sse = (chunks: object[], spaced = false) => Buffer.from(chunks.map((c) => `data: ${spaced ? JSON.stringify(c, null, 1).replace(/\n\s*/g, ' ') : JSON.stringify(c)}\r\n\r\n`).join(''));
  const array = (chunks: object[]) => Buffer.from(`[${chunks.map((c) => JSON.stringify(c, null, 2)).join(',\r\n')}]`);
  const splits = (bytes: Buffer) => [[], [100_000, 1_600_000], [...Array(50).keys()].map((i) => i * 65_537 + 13), [bytes.length - 3, bytes.length - 40_000]];

  it('the image is output, and its chunk gives the finish reason, usage and model, at any split and in both framings', () => {
    for (const [framing, bytes] of [
      ['sse', sse([text, imageAndFinish])],
      ['sse', sse([text, imageAndFinish], true)],
      ['json-array', array([text, imageAndFinish])],
    ] as const) {
      for (const cuts of splits(bytes)) {
        const a = new GeminiAdapter();
        const { kinds, oversize } = run(a, framing, splitAt(bytes, cuts));
        expect(oversize).toBe(1);
        expect(kinds).toEqual([EventKind.Content, EventKind.Content]);
        expect(a.usage).toEqual({ inputTokens: 9, outputTokens: 1295 });
        expect(a.finishReasons.list()).toEqual(['STOP']);
        expect(a.complete).toBe(true);
        expect(a.responseModel).toBe('gemini-2.5-flash-image');
      }
    }
  });

  it('an image first and the finish after it; a large chunk that is no output; two candidates in one chunk', () => {
    const a = new GeminiAdapter();
    const first = chunk([{ inlineData: { mimeType: 'image/png', data: image } }]);
    const last = chunk([{ text: '' }], { finishReason: 'MAX_TOKENS' }, 1290);
    expect(run(a, 'sse', [sse([first, last])]).kinds).toEqual([EventKind.Content, EventKind.None]);
    expect([a.usage.outputTokens, a.finishReasons.list(), a.complete]).toEqual([1290, ['MAX_TOKENS'], true]);
    // A tool's result is not the model's output, however large; the finish it carries still counts.
    const b = new GeminiAdapter();
    const result = chunk([{ codeExecutionResult: { outcome: 'OUTCOME_OK', output: image } }], { finishReason: 'STOP' }, 3);
    expect(run(b, 'json-array', [array([result])]).kinds).toEqual([EventKind.None]);
    expect([b.usage.outputTokens, b.finishReasons.list(), b.complete]).toEqual([3, ['STOP'], true]);
    // candidateCount 2, both finished in one chunk: each finish reason goes with its own index.
    const c = new GeminiAdapter();
    const both = {
      candidates: [
        { content: { parts: [{ inlineData: { mimeType: 'image/png', data: image } }], role: 'model' }, finishReason: 'STOP', index: 0 },
        { content: { parts: [{ text: 'Sorry.' }], role: 'model' }, finishReason: 'SAFETY', index: 1 },
      ],
      usageMetadata: usage(1300),
    };
    expect(run(c, 'sse', [sse([both])]).kinds).toEqual([EventKind.Content]);
    expect([c.finishReasons.list(), c.complete, c.usage.outputTokens]).toEqual([['STOP', 'SAFETY'], true, 1300]);
  });
});

describe('a Gemini Interactions event too large to keep (a generated image) is still read', () => {
  const image = 'iVBORw0KGgo'.padEnd(1_500_000, 'QUFB');
  const ev = (o: { event_type: string } & Record<string, unknown>, named: boolean) => `${named ? `event: ${o.event_type}\n` : ''}data: ${JSON.stringify(o)}\n\n`;
  const interaction = (status: string, outputs: unknown[]) => ({ id: 'v1_1', model: 'gemini-3-pro-image-preview', status, outputs, usage: { total_input_tokens: 9, total_output_tokens: 1300, total_tokens: 1309 } });
  const stream = (named: boolean, status = 'completed', legacy = false) =>
    Buffer.from(
      [
        ev({ event_type: legacy ? 'interaction.start' : 'interaction.created', interaction: interaction('in_progress', []) }, named),
        ev({ event_type: legacy ? 'content.delta' : 'step.delta', index: 0, delta: { type: 'text', text: 'A cat:' } }, named),
        ev({ event_type: legacy ? 'content.delta' : 'step.delta', index: 1, delta: { type: 'image', mime_type: 'image/png', data: image }, metadata: { total_usage: { total_input_tokens: 9, total_output_tokens: 1300 } } }, named),
        ev({ event_type: legacy ? 'interaction.complete' : 'interaction.completed', interaction: interaction(status, [{ type: 'text', text: 'A cat:' }, { type: 'image', mime_type: 'image/png', data: image }]) }, named),
      ].join(''),
    );

  it('the image is output with its running usage, and the finished interaction that repeats it ends the stream, at any split', () => {
    for (const [named, legacy] of [[true, false], [false, false], [true, true]] as const) {
      const bytes = stream(named, 'completed', legacy);
      for (const cuts of [[], [...Array(60).keys()].map((i) => i * 65_537 + 13)]) {
        const a = new GeminiInteractionsAdapter();
        const { kinds, oversize } = run(a, 'sse', splitAt(bytes, cuts));
        expect(oversize).toBe(2);
        expect(kinds).toEqual([EventKind.None, EventKind.Content, EventKind.Content, EventKind.None]);
        expect(a.usage).toMatchObject({ inputTokens: 9, outputTokens: 1300 });
        expect(a.finishReasons.list()).toEqual(['completed']);
        expect(a.complete).toBe(true);
      }
    }
    // A failed interaction's status is read from the head too.
    const b = new GeminiInteractionsAdapter();
    expect(run(b, 'sse', [stream(true, 'failed')]).kinds.at(-1)).toBe(EventKind.Error);
    expect(b.errorType).toBe('interaction_failed');
  });
});

describe('an event over the cap reads as the same event under a cap it fits in', () => {
  // Each stream is read twice: with the default 1 MiB cap, where its large events come as edges,
  // and with a 64 MiB one, where they are parsed whole. What the adapter makes of them must not
  // differ, event by event (review 151 found these shapes read differently).
  const image = 'iVBORw0KGgo'.padEnd(1_500_000, 'QUFB');
  type Shape = { name: string; adapter: () => ResponseAdapter; framing: 'sse' | 'ndjson' | 'json-array'; events: object[]; named?: (o: object) => string | undefined; cap?: number };
  const cands = (...c: object[]) => ({ candidates: c, usageMetadata: { promptTokenCount: 9, totalTokenCount: 9 }, modelVersion: 'gemini-2.5-flash-image' });
  const usageOnly = (out: number, thoughts?: number) => ({ usageMetadata: { promptTokenCount: 9, candidatesTokenCount: out, ...(thoughts === undefined ? {} : { thoughtsTokenCount: thoughts }), totalTokenCount: 9 + out }, modelVersion: 'gemini-2.5-flash-image' });
  const imagePart = { inlineData: { mimeType: 'image/png', data: image } };
  const gemini = (name: string, events: object[]): Shape[] => [
    { name: `${name} (SSE)`, adapter: () => new GeminiAdapter(), framing: 'sse', events },
    { name: `${name} (array)`, adapter: () => new GeminiAdapter(), framing: 'json-array', events },
  ];
  const interactions = (name: string, events: Array<{ event_type: string } & Record<string, unknown>>): Shape[] => [
    { name, adapter: () => new GeminiInteractionsAdapter(), framing: 'sse', events, named: (o) => (o as { event_type: string }).event_type },
    { name: `${name}, without event: names`, adapter: () => new GeminiInteractionsAdapter(), framing: 'sse', events },
  ];
  const interaction = (status: string, last = true) => {
    const outputs = [{ type: 'text', text: 'A cat:' }, { type: 'image', mime_type: 'image/png', data: image }];
    const usage = { total_input_tokens: 9, total_output_tokens: 1300, total_tokens: 1309 };
    // `last`: status, model and usage after the outputs, where only the tail has them.
    return last ? { id: 'v1_1', outputs, status, model: 'gemini-3-pro-image-preview', usage } : { id: 'v1_1', status, model: 'gemini-3-pro-image-preview', outputs, usage };
  };
  const shapes: Shape[] = [
    // Vertex writes `index` first and leaves it out for candidate 0, and `role` before `parts`.
    ...gemini('Vertex order, two candidates over three chunks', [
      cands({ content: { role: 'model', parts: [{ text: 'a' }] } }, { index: 1, content: { role: 'model', parts: [{ text: 'b' }] } }),
      cands({ content: { role: 'model', parts: [imagePart] }, finishReason: 'STOP' }, { index: 1, content: { role: 'model', parts: [{ text: 'c' }] } }),
      { candidates: [{ index: 1, content: { role: 'model', parts: [{ text: '' }] }, finishReason: 'MAX_TOKENS' }], ...usageOnly(1300) },
    ]),
    ...gemini('Vertex order, both candidates finish in the image chunk', [
      cands({ content: { role: 'model', parts: [imagePart] }, finishReason: 'MAX_TOKENS' }, { index: 1, content: { role: 'model', parts: [{ text: 'c' }] }, finishReason: 'STOP' }),
      usageOnly(1300),
    ]),
    ...gemini('a function call whose arguments spell index, finishReason and modelVersion', [
      cands({ content: { parts: [{ functionCall: { name: 'save', args: { blob: image, rows: [{ index: 7 }], last: { finishReason: 'SAFETY', modelVersion: 'evil' } } } }], role: 'model' }, index: 0 }),
      { candidates: [{ content: { parts: [{ text: '' }], role: 'model' }, finishReason: 'STOP', index: 0 }], ...usageOnly(40) },
    ]),
    ...gemini('a thought image, its thoughts counted apart', [cands({ content: { parts: [{ ...imagePart, thought: true }], role: 'model' }, index: 0 }), { candidates: [{ content: { parts: [{ text: 'Done.' }], role: 'model' }, finishReason: 'STOP', index: 0 }], ...usageOnly(3, 500) }]),
    ...gemini('usage details and grounding after the image', [
      { ...cands({ content: { parts: [{ text: 'x' }, imagePart], role: 'model' }, finishReason: 'STOP', index: 0, groundingMetadata: { groundingSupports: [{ segment: { startIndex: 0, endIndex: 1, text: 'x' } }] } }), usageMetadata: { promptTokenCount: 9, candidatesTokenCount: 1295, totalTokenCount: 1304, promptTokensDetails: [{ modality: 'TEXT', tokenCount: 9 }], candidatesTokensDetails: [{ modality: 'IMAGE', tokenCount: 1290 }] } },
    ]),
    ...interactions('Interactions: status, model and usage after the outputs', [
      { event_type: 'step.delta', index: 0, delta: { type: 'text', text: 'A cat:' } },
      { event_type: 'step.delta', index: 1, delta: { type: 'image', mime_type: 'image/png', data: image } },
      { event_type: 'interaction.completed', interaction: interaction('completed') },
    ]),
    ...interactions('Interactions: a failed interaction, its status after the outputs', [{ event_type: 'step.delta', index: 0, delta: { type: 'text', text: 'A' } }, { event_type: 'interaction.completed', interaction: interaction('failed') }]),
    ...interactions('Interactions: status first, a delta whose type follows its data, large arguments', [
      { event_type: 'step.delta', index: 0, delta: { data: image, mime_type: 'image/png', type: 'image' }, metadata: { total_usage: { total_input_tokens: 9, total_output_tokens: 1290 } } },
      { event_type: 'step.start', index: 1, step: { type: 'function_call', name: 'save', arguments: { content: image } } },
      { event_type: 'step.delta', index: 1, delta: { type: 'arguments_delta', arguments: image } },
      { event_type: 'interaction.completed', interaction: interaction('incomplete', false) },
    ]),
    {
      name: 'Responses: usage after tools that spell usage',
      adapter: () => new OpenAIResponsesAdapter(),
      framing: 'sse',
      events: [
        { type: 'response.output_text.delta', delta: 'Hi' },
        { type: 'response.completed', response: { status: 'completed', model: 'gpt-5', output: [{ type: 'image_generation_call', result: image }], tools: [{ type: 'function', parameters: { usage: { output_tokens: 1 } } }], usage: { input_tokens: 11, output_tokens: 1290 }, metadata: { k: '"usage":{' } } },
      ],
      named: (o) => (o as { type: string }).type,
    },
    {
      name: 'Responses: a response that failed after its image, and one written in the SDK field order without event: names',
      adapter: () => new OpenAIResponsesAdapter(),
      framing: 'sse',
      events: [
        { type: 'response.output_text.delta', delta: 'Hi' },
        // openai-python's models declare `response, sequence_number, type`: a gateway that dumps them puts `type` last.
        { response: { status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' }, model: 'gpt-5', output: [{ type: 'image_generation_call', result: image }], usage: { input_tokens: 11, output_tokens: 1290 } }, sequence_number: 5, type: 'response.incomplete' },
        { type: 'response.failed', response: { status: 'failed', error: { code: 'server_error', message: 'x' }, model: 'gpt-5', output: [{ type: 'image_generation_call', result: image }] } },
      ],
    },
    {
      name: 'Responses: a gateway that relays only final events, one of them a long text',
      adapter: () => new OpenAIResponsesAdapter(),
      framing: 'sse',
      events: [
        { type: 'response.output_text.done', item_id: 'msg_1', output_index: 0, content_index: 0, text: 'x'.repeat(1_200_000) },
        { type: 'response.completed', response: { status: 'completed', model: 'gpt-5', usage: { input_tokens: 1, output_tokens: 300_000 } } },
      ],
      named: (o) => (o as { type: string }).type,
    },
    {
      name: 'Gemini under a cap below 64 KiB: the event is whole in its tail',
      adapter: () => new GeminiAdapter(),
      framing: 'sse',
      cap: 16 * 1024,
      events: [cands({ content: { parts: [{ text: 'y'.repeat(40_000) }], role: 'model' }, finishReason: 'STOP', index: 0 }), usageOnly(9000)],
    },
    {
      name: 'Responses under a cap below 64 KiB',
      adapter: () => new OpenAIResponsesAdapter(),
      framing: 'sse',
      cap: 16 * 1024,
      events: [{ type: 'response.output_text.delta', delta: 'Hi' }, { type: 'response.completed', response: { status: 'completed', model: 'gpt-5', output: [{ type: 'image_generation_call', result: 'z'.repeat(40_000) }], usage: { input_tokens: 11, output_tokens: 1290 } } }],
      named: (o) => (o as { type: string }).type,
    },
    ...interactions('Interactions: a thought step large by its signature, a model output step large by its image', [
      { event_type: 'step.start', index: 0, step: { type: 'thought', signature: image } },
      { event_type: 'step.start', index: 1, step: { type: 'model_output', content: [{ type: 'image', mime_type: 'image/png', data: image }] } },
      { event_type: 'interaction.completed', interaction: { id: 'v1_1', status: 'completed', usage: { total_input_tokens: 9, total_output_tokens: 1290 } } },
    ]),
    {
      name: 'Ollama: a tool call over the cap in a line before the last',
      adapter: () => new OllamaAdapter(),
      framing: 'ndjson',
      events: [
        { model: 'llama3.2', message: { role: 'assistant', content: '', tool_calls: [{ function: { name: 'write_file', arguments: { path: 'a.txt', content: image } } }] }, done: false },
        { model: 'llama3.2', message: { role: 'assistant', content: '' }, done: true, done_reason: 'stop', eval_count: 400_000, eval_duration: 4e9, prompt_eval_count: 20 },
      ],
    },
    {
      name: 'Ollama: the last line of /api/generate, large by its context',
      adapter: () => new OllamaAdapter(),
      framing: 'ndjson',
      events: [
        { model: 'llama3.2', response: 'Hi', done: false },
        { model: 'llama3.2', response: '', done: true, done_reason: 'stop', context: Array.from({ length: 300_000 }, (_, i) => i % 1000), total_duration: 9e8, eval_count: 2, eval_duration: 4e7, prompt_eval_count: 300_000 },
      ],
    },
  ];
  const frame = (shape: Shape): Buffer => {
    const texts = shape.events.map((e) => JSON.stringify(e));
    if (shape.framing === 'ndjson') return Buffer.from(texts.map((t) => `${t}\n`).join(''));
    if (shape.framing === 'json-array') return Buffer.from(`[${shape.events.map((e) => JSON.stringify(e, null, 2)).join(',\r\n')}]`);
    return Buffer.from(shape.events.map((e, k) => `${shape.named?.(e) !== undefined ? `event: ${shape.named(e)}\n` : ''}data: ${texts[k]}\r\n\r\n`).join(''));
  };

  it.each(shapes.map((s) => [s.name, s] as const))('%s', (_name, shape) => {
    const bytes = frame(shape);
    const whole = shape.adapter();
    const wholeRun = run(whole, shape.framing, [bytes], 64 * 1024 * 1024);
    expect(wholeRun.oversize).toBe(0);
    for (const cuts of [[], [...Array(40).keys()].map((i) => i * 81_919 + 7)]) {
      const a = shape.adapter();
      const r = run(a, shape.framing, splitAt(bytes, cuts), shape.cap);
      expect(r.oversize).toBeGreaterThan(0);
      // Event by event: each one's kind, and what the adapter knows after it.
      expect([r.kinds, r.states]).toEqual([wholeRun.kinds, wholeRun.states]);
    }
  });
});
