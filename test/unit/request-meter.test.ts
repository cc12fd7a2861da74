import { afterEach, describe, expect, it } from 'vitest';
import { afterIo, afterIoFailures, drainAfterIo } from '../../src/measure/after-io.js';
import { RequestMeter } from '../../src/measure/request-meter.js';
import { CardinalityLimiter } from '../../src/metrics/labels.js';
import { METRIC } from '../../src/metrics/semconv.js';
import { OpenAIChatAdapter } from '../../src/providers/openai-chat.js';
import { OpenAIResponsesAdapter } from '../../src/providers/openai-responses.js';
import { GeminiAdapter } from '../../src/providers/gemini.js';
import { GeminiInteractionsAdapter } from '../../src/providers/gemini-interactions.js';
import { AnthropicAdapter } from '../../src/providers/anthropic.js';
import { OllamaAdapter } from '../../src/providers/ollama.js';
import { BedrockAdapter } from '../../src/providers/bedrock.js';
import { EventKind, type ResponseAdapter, type ServerTimings, type Usage } from '../../src/providers/types.js';
import { fixture } from '../helpers/fixtures.js';
import { testInstruments } from '../helpers/metrics.js';

const labels = { provider: 'openai', operation: 'chat', requestModel: 'gpt-4o-mini', serverAddress: 'api.openai.com' };
const opts = { maxEventBytes: 1 << 20, maxBodyBytes: 1 << 20 };

/** Splits a fixture into its SSE events' byte ranges so each can be "delivered" at a chosen time. */
/** AWS event-stream frames: each starts with its total length (big-endian). */
function eventStreamFrames(bytes: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let i = 0; i + 4 <= bytes.length; i += bytes.readUInt32BE(i)) out.push(bytes.subarray(i, i + bytes.readUInt32BE(i)));
  return out;
}

function eventChunks(bytes: Buffer): Buffer[] {
  const text = bytes.toString('latin1');
  const out: Buffer[] = [];
  let start = 0;
  for (;;) {
    // An event ends at a blank line: LF LF, or CRLF CRLF (Gemini).
    const lf = text.indexOf('\n\n', start);
    const crlf = text.indexOf('\r\n\r\n', start);
    const end = crlf !== -1 && (lf === -1 || crlf < lf) ? crlf + 4 : lf === -1 ? -1 : lf + 2;
    if (end === -1) break;
    out.push(bytes.subarray(start, end));
    start = end;
  }
  if (start < bytes.length) out.push(bytes.subarray(start));
  return out;
}

let t: ReturnType<typeof testInstruments>;
afterEach(async () => t && (await t.shutdown()));

describe('RequestMeter with a controllable clock', () => {
  it('records TTFT at the first content event, one gap per later content event, TPOT from usage', async () => {
    t = testInstruments();
    const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 1000, opts);
    m.responseStart(200, 'text/event-stream; charset=utf-8', undefined);
    const chunks = eventChunks(fixture('openai-chat-usage.sse'));
    expect(chunks.length).toBe(27);
    // role chunk at 1050 (must not stop TTFT), 23 content chunks 20 ms apart from 1250,
    // then finish + usage + [DONE] 100 ms later (must not count as gaps).
    m.chunk(chunks[0]!, 1050);
    for (let k = 0; k < 23; k++) m.chunk(chunks[1 + k]!, 1250 + 20 * k);
    for (let k = 24; k < 27; k++) m.chunk(chunks[k]!, 1800);
    const s = m.finish(1801)!;
    expect(s.ttftMs).toBe(250);
    expect(s.contentEvents).toBe(23);
    expect(s.outputTokens).toBe(23);
    expect(s.tokenCountSource).toBe('usage');
    expect(s.tpotMs).toBeCloseTo(20, 9);
    expect(s.maxGapMs).toBe(20); // the role chunk and the trailing events (110 ms after the last content) are not content

    const ttft = await t.histogram(METRIC.ttft);
    expect(ttft.count).toBe(1);
    expect(ttft.sum).toBeCloseTo(0.25, 9);
    const gaps = await t.histogram(METRIC.chunkGap);
    expect(gaps.count).toBe(22);
    expect(gaps.sum).toBeCloseTo(22 * 0.02, 9);
    const tpot = await t.histogram(METRIC.tpot);
    expect(tpot.count).toBe(1);
    expect(tpot.sum).toBeCloseTo(0.02, 9);
    expect(tpot.attributes[0]).toMatchObject({ 'gen_ai.response.model': 'gpt-4o-mini-2024-07-18', 'gen_ai.request.model': 'gpt-4o-mini' });
    const out = await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'output' });
    expect(out).toMatchObject({ count: 1, sum: 23 });
    const input = await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'input' });
    expect(input).toMatchObject({ count: 1, sum: 14 });
    const dur = await t.histogram(METRIC.duration);
    expect(dur.count).toBe(1);
    expect(dur.sum).toBeCloseTo(0.801, 9);
    expect(dur.attributes[0]!['error.type']).toBeUndefined();
    expect(await t.sumValue(METRIC.streamsActive)).toBe(0);
  });

  it('a stream its client held back: content that arrived from the pause on is not recorded, nor is a TPOT whose span holds the pause; what came before is, deferred or not', async () => {
    const chunks = eventChunks(fixture('openai-chat-usage.sse'));
    // `held`: when the pause began; told to the meter after the 8th content event (as the proxy
    // tells it in the check phase of the turn the pause began in), or at once for `callFirst`.
    const run = async (held: number | undefined, defer?: typeof afterIo, callFirst = false) => {
      t = testInstruments();
      const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 1000, { ...opts, defer });
      m.responseStart(200, 'text/event-stream', undefined);
      m.chunk(chunks[0]!, 1050);
      if (callFirst && held !== undefined) m.clientHeld(held);
      // 23 content events 20 ms apart from 1250; the pause (when held) began at 1395, between
      // the 8th (1390) and the 9th (1410): the 9th and later arrived after it.
      for (let k = 0; k < 23; k++) {
        m.chunk(chunks[1 + k]!, 1250 + 20 * k);
        if (k === 7 && held !== undefined && !callFirst) m.clientHeld(held);
        // A later pause of the same stream does not move the first one's start.
        if (k === 15 && held !== undefined) m.clientHeld(held + 300);
      }
      for (let k = 24; k < 27; k++) m.chunk(chunks[k]!, 1800);
      if (defer) drainAfterIo();
      const s = m.finish(1801)!;
      if (defer) drainAfterIo();
      const r = { s, ttft: await t.histogram(METRIC.ttft), gaps: await t.histogram(METRIC.chunkGap), tpot: await t.histogram(METRIC.tpot), out: await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'output' }), dur: await t.histogram(METRIC.duration) };
      await t.shutdown();
      return r;
    };
    for (const defer of [undefined, afterIo]) {
      const kept = await run(undefined, defer);
      expect([kept.ttft.count, kept.gaps.count, kept.tpot.count]).toEqual([1, 22, 1]);
      const held = await run(1395, defer);
      // TTFT and the 7 gaps up to the 8th event are the provider's; the rest are left out.
      expect(held.ttft).toMatchObject({ count: 1 });
      expect(held.ttft.sum).toBeCloseTo(0.25, 9);
      expect(held.gaps.count).toBe(7);
      expect(held.gaps.sum).toBeCloseTo(7 * 0.02, 9);
      expect(held.tpot.count).toBe(0);
      // The rest of the request is recorded as before; the log's summary keeps what it saw.
      expect(held.out).toMatchObject({ count: 1, sum: 23 });
      expect(held.dur.count).toBe(1);
      expect(held.s).toMatchObject({ contentEvents: 23, outputTokens: 23, maxGapMs: 20, outcome: 'ok' });
      expect(held.s.tpotMs).toBeCloseTo(20, 9);
      // Held before the first content event: no TTFT either.
      const early = await run(1100, defer, true);
      expect([early.ttft.count, early.gaps.count, early.tpot.count]).toEqual([0, 0, 0]);
      expect(early.out.count).toBe(1);
      // "At or after": a pause that began at an event's own arrival (1390, the 8th) leaves it out
      // when it is measured after the verdict.
      const edge = await run(1390, defer, true);
      expect([edge.ttft.count, edge.gaps.count, edge.tpot.count]).toEqual([1, 6, 0]);
      // Held after the last content event (1690), on the trailing usage events: every gap and
      // the TPOT span are the provider's.
      const late = await run(1700, defer, true);
      expect([late.ttft.count, late.gaps.count, late.tpot.count]).toEqual([1, 22, 1]);
      expect(late.tpot.sum).toBeCloseTo(0.02, 9);
    }
    t = testInstruments(); // for afterEach
  });

  it('with afterIo, the start-of-stream instrument calls wait for the end of the loop iteration, and record the same values', async () => {
    t = testInstruments();
    const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 1000, { ...opts, defer: afterIo });
    m.responseStart(200, 'text/event-stream', undefined);
    const chunks = eventChunks(fixture('openai-chat-usage.sse'));
    m.chunk(chunks[0]!, 1050);
    m.chunk(chunks[1]!, 1250);
    m.chunk(chunks[2]!, 1270);
    // In this tick nothing is recorded: TTFB, TTFT and the active-streams gauge wait, and so do
    // the stream's first events, which need a full parse (no prefix is learned yet).
    const early = [await t.histogram(METRIC.ttft), await t.histogram(METRIC.timeToFirstByte), await t.histogram(METRIC.chunkGap)];
    expect(early.map((h) => h.count)).toEqual([0, 0, 0]);
    drainAfterIo();
    expect(await t.histogram(METRIC.ttft)).toMatchObject({ count: 1, sum: 0.25 });
    expect(await t.histogram(METRIC.timeToFirstByte)).toMatchObject({ count: 1, sum: 0.05 });
    expect((await t.histogram(METRIC.chunkGap)).sum).toBeCloseTo(0.02, 9); // at their own arrival times
    expect(await t.sumValue(METRIC.streamsActive)).toBe(1);
    // Once the prefix is learned, a plain delta is measured from its bytes at once.
    m.chunk(chunks[3]!, 1300);
    expect(await t.histogram(METRIC.chunkGap)).toMatchObject({ count: 2 });
    expect((await t.histogram(METRIC.chunkGap)).sum).toBeCloseTo(0.05, 9);
    m.finish(1300);
    expect(await t.sumValue(METRIC.streamsActive)).toBe(0);
    // Queued work runs on its own too, in order, and a throwing job does not stop the rest.
    const ran: number[] = [];
    const failed = afterIoFailures();
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.message);
    process.on('warning', onWarning);
    afterIo(() => ran.push(1));
    afterIo(() => {
      throw new Error('boom');
    });
    afterIo(() => ran.push(3));
    await new Promise((r) => setImmediate(r));
    expect(ran).toEqual([1, 3]);
    // Even a thrown value that cannot be turned into text.
    afterIo(() => ran.push(4));
    afterIo(() => {
      throw Object.create(null);
    });
    afterIo(() => ran.push(6));
    await new Promise((r) => setImmediate(r));
    expect(ran).toEqual([1, 3, 4, 6]);
    // ...and the failures are counted, and said once on stderr (a process warning).
    expect(afterIoFailures()).toBe(failed + 2);
    await new Promise((r) => setImmediate(r));
    process.off('warning', onWarning);
    if (failed === 0) expect(warnings.some((m) => m.includes('boom'))).toBe(true);
    // A job that drains (shutdown from inside a job) does not run the earlier jobs again.
    const again: number[] = [];
    afterIo(() => again.push(1));
    afterIo(() => {
      again.push(2);
      drainAfterIo();
    });
    afterIo(() => again.push(3));
    drainAfterIo();
    expect(again).toEqual([1, 2, 3]);
  });

  it('deferred: a content delta found from its bytes after an in-band error that is still queued is not counted, as when nothing waits', async () => {
    t = testInstruments();
    const chunk = (content: string) =>
      `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"${content}"}}]}\n\n`;
    const reads = [
      `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n${chunk('a')}`,
      chunk('b') + chunk('c'), // learned: these take the byte path
      // In one read: an error (full parse: it waits when deferred), then a delta the byte path knows.
      `data: {"error":{"message":"overloaded","type":"server_error"}}\n\n${chunk('d')}`,
      chunk('e'),
    ].map((r) => Buffer.from(r));
    const run = (deferred: boolean) => {
      const jobs: (() => void)[] = [];
      const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, deferred ? { ...opts, defer: (f) => jobs.push(f) } : opts);
      m.responseStart(200, 'text/event-stream', undefined);
      reads.forEach((r, k) => {
        m.chunk(r, 10 * (k + 1));
        if (k !== 2) for (let i = 0; i < jobs.length; i++) jobs[i]!(); // after read 3 the error still waits
        if (k !== 2) jobs.length = 0;
      });
      return m.finish(100)!;
    };
    const now = run(false);
    expect(now).toMatchObject({ contentEvents: 3, errorType: 'server_error', outcome: 'error' });
    expect(run(true)).toEqual(now);
  });

  it('caps the response model values with the limiter it is given (the upstream controls them)', async () => {
    t = testInstruments();
    const limiter = new CardinalityLimiter(1);
    const body = (model: string) => Buffer.from(`data: {"model":"${model}","choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n`);
    for (const model of ['m-1', 'm-2', 'm-1']) {
      const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, { ...opts, limitResponseModel: (x) => limiter.limit(x) });
      m.responseStart(200, 'text/event-stream', undefined);
      m.chunk(body(model), 10);
      m.finish(20);
    }
    const d = await t.histogram(METRIC.duration);
    expect(d.attributes.map((a) => a['gen_ai.response.model']).sort()).toEqual(['_OTHER', 'm-1']);
  });

  it('labels each instrument as defined: the request\'s at the stream\'s start, the response model at its end; billed counts for token usage, streamed ones for TPOT', async () => {
    t = testInstruments();
    // A stub adapter: every event is content, and what the end reads is set before finish().
    const adapter: ResponseAdapter & { usage: Usage; responseModel: string | undefined; serverTimings: ServerTimings | undefined } = {
      onEvent: () => EventKind.Content,
      usage: {},
      cumulativeOutputTokens: undefined,
      responseModel: undefined,
      errorType: undefined,
      serverTimings: undefined,
    };
    const m = new RequestMeter(t.instruments, adapter, { ...labels, requestModel: 'req-m' }, 1000, opts);
    m.responseStart(200, 'text/event-stream', undefined);
    m.chunk(Buffer.from('data: a\n\n'), 1100);
    m.chunk(Buffer.from('data: b\n\n'), 1120);
    m.chunk(Buffer.from('data: c\n\n'), 1140);
    adapter.usage = { inputTokens: 7, billedInputTokens: 9, outputTokens: 3, billedOutputTokens: 5 };
    adapter.responseModel = 'resp-m';
    adapter.serverTimings = { timeToFirstToken: 0.05, timePerOutputToken: 0.01, duration: 0.2 };
    const s = m.finish(1200)!;
    // TPOT divides the streamed span by the streamed tokens: (1140 - 1100) / (3 - 1), not / (5 - 1).
    expect(s.tpotMs).toBeCloseTo(20, 9);
    expect(await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'output' })).toMatchObject({ count: 1, sum: 5 });
    expect(await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'input' })).toMatchObject({ count: 1, sum: 9 });
    const models = async (name: string) => {
      const h = await t.histogram(name);
      expect(h.count, name).toBeGreaterThan(0);
      return h.attributes.map((a) => [a['gen_ai.request.model'], a['gen_ai.response.model']]);
    };
    // Recorded as the stream starts, before any response model is known.
    for (const name of [METRIC.timeToFirstByte, METRIC.ttft, METRIC.chunkGap]) expect(await models(name), name).toEqual([['req-m', undefined]]);
    // Recorded at the end, with the model that answered.
    for (const name of [METRIC.tpot, METRIC.duration, METRIC.serverTtft, METRIC.serverTpot, METRIC.serverDuration])
      expect(await models(name), name).toEqual([['req-m', 'resp-m']]);
    expect(await models(METRIC.tokenUsage)).toEqual([
      ['req-m', 'resp-m'],
      ['req-m', 'resp-m'],
    ]);
    expect((await t.histogram(METRIC.serverTpot)).sum).toBeCloseTo(0.01, 12);
  });

  it('counts content events when the stream has no usage, and TPOT uses that count', async () => {
    t = testInstruments();
    const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
    m.responseStart(200, 'text/event-stream', undefined);
    const chunks = eventChunks(fixture('openai-chat.sse'));
    chunks.forEach((c, i) => m.chunk(c, 100 + i * 3));
    const s = m.finish(1000)!;
    expect(s.tokenCountSource).toBe('events');
    expect(s.outputTokens).toBe(23);
    // content events are chunks 1..23, 3 ms apart
    expect(s.tpotMs).toBeCloseTo(3, 9);
  });

  it('uses the provider count for TPOT when events carry several tokens (vLLM 3-token chunk)', async () => {
    t = testInstruments();
    const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
    m.responseStart(200, 'text/event-stream', undefined);
    const chunks = eventChunks(fixture('vllm-continuous-usage.sse'));
    chunks.forEach((c, i) => m.chunk(c, 10 * i));
    const s = m.finish(1000)!;
    expect(s.contentEvents).toBe(18);
    expect(s.outputTokens).toBe(21);
    // first content at chunk 1 (10 ms), last content at chunk 18 (180 ms): 170 / 20
    expect(s.tpotMs).toBeCloseTo(170 / 20, 9);
    expect((await t.histogram(METRIC.chunkGap)).count).toBe(17);
  });

  it('records a cancelled stream with error.type client_cancelled and keeps the tokens seen', async () => {
    t = testInstruments();
    const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
    m.responseStart(200, 'text/event-stream', undefined);
    const chunks = eventChunks(fixture('openai-chat.sse'));
    for (let i = 0; i < 6; i++) m.chunk(chunks[i]!, 10 * i);
    const s = m.finish(100, 'client_cancelled')!;
    expect(s.outcome).toBe('cancelled');
    // Content 10 ms apart until 50, cancelled at 100: the stall the client gave up in is the longest gap.
    expect(s.maxGapMs).toBe(50);
    const dur = await t.histogram(METRIC.duration);
    expect(dur.attributes[0]!['error.type']).toBe('client_cancelled');
    expect(await t.sumValue(METRIC.streams, { outcome: 'cancelled' })).toBe(1);
    // a second finish (e.g. a late close event) records nothing
    expect(m.finish(200)).toBeUndefined();
    expect((await t.histogram(METRIC.duration)).count).toBe(1);
  });

  // Clients that stop reading at the API's last event and close: the server's end of body may
  // come a few ms later (a separate write), and the whole answer was already forwarded.
  it.each([
    ['OpenAI Chat', () => new OpenAIChatAdapter(), 'openai-chat-usage.sse', 'text/event-stream', 'data: [DONE]'],
    ['Anthropic', () => new AnthropicAdapter(), 'anthropic-messages.sse', 'text/event-stream', 'message_stop'],
    ['Responses', () => new OpenAIResponsesAdapter(), 'openai-responses.sse', 'text/event-stream', 'response.completed'],
    ['Ollama', () => new OllamaAdapter(), 'ollama-chat.ndjson', 'application/x-ndjson', '"done":true'],
    ['Bedrock Converse', () => new BedrockAdapter(), 'bedrock-converse-stream.bin', 'application/vnd.amazon.eventstream', 'metadata'],
    ['Bedrock InvokeModel (Anthropic)', () => new BedrockAdapter(), 'bedrock-invoke-anthropic.bin', 'application/vnd.amazon.eventstream', 'message_stop'],
    // No last event of its own: the chunk with the (only) candidate's finishReason ends it.
    ['Gemini', () => new GeminiAdapter(), 'gemini.sse', 'text/event-stream', '"finishReason"'],
  ] as const)('%s: a client that hangs up after the last event had its answer (ok, with TPOT); before it, cancelled', async (_n, adapter, file, ct, last) => {
    const bytes = fixture(file);
    const chunks =
      ct === 'application/x-ndjson' ? bytes.toString('latin1').split(/(?<=\n)/).map((l) => Buffer.from(l, 'latin1'))
      : ct === 'application/vnd.amazon.eventstream' ? eventStreamFrames(bytes)
      : eventChunks(bytes);
    // The last piece holds the terminal event (an invoke chunk's payload is base64 JSON).
    const lastText = chunks.at(-1)!.toString('latin1');
    const b64 = /"bytes":"([^"]+)"/.exec(lastText)?.[1];
    expect(lastText + (b64 ? Buffer.from(b64, 'base64').toString('utf8') : '')).toContain(last);
    for (const upTo of [chunks.length, chunks.length - 1]) {
      t = testInstruments();
      const m = new RequestMeter(t.instruments, adapter(), { ...labels }, 0, opts);
      m.responseStart(200, ct, undefined);
      for (let i = 0; i < upTo; i++) m.chunk(chunks[i]!, 100 + 10 * i);
      const s = m.finish(100 + 10 * upTo + 5, 'client_cancelled')!;
      const whole = upTo === chunks.length;
      expect([s.outcome, s.errorType]).toEqual(whole ? ['ok', undefined] : ['cancelled', 'client_cancelled']);
      expect(await t.sumValue(METRIC.streams, { outcome: whole ? 'ok' : 'cancelled' })).toBe(1);
      if (whole) expect((await t.histogram(METRIC.tpot)).count).toBe(1);
      else expect((await t.histogram(METRIC.tpot)).count).toBe(0);
      await t.shutdown();
    }
  });

  it('Gemini with several candidates is whole once each one seen has finished; the Interactions API once interaction.complete(d) came', async () => {
    t = testInstruments();
    const usage = { promptTokenCount: 3, candidatesTokenCount: 4, totalTokenCount: 7 };
    const gemini = (cands: object[] | undefined, usageMetadata?: object) =>
      `data: ${JSON.stringify({ ...(cands ? { candidates: cands } : {}), ...(usageMetadata ? { usageMetadata } : {}), modelVersion: 'gemini-2.5-flash' })}\r\n\r\n`;
    const part = (index: number, text: string, finishReason?: string) => ({ index, content: { role: 'model', parts: [{ text }] }, ...(finishReason ? { finishReason } : {}) });
    const run = (adapter: () => ResponseAdapter, ct: string, events: string[]) => {
      const m = new RequestMeter(t.instruments, adapter(), { ...labels }, 0, opts);
      m.responseStart(200, ct, undefined);
      events.forEach((e, i) => m.chunk(Buffer.from(e), 10 + i));
      return m.finish(50, 'client_cancelled')!;
    };
    const outcome = (events: string[]) => run(() => new GeminiAdapter(), 'text/event-stream', events).outcome;
    const g = [gemini([part(0, 'a'), part(1, 'b')]), gemini([part(0, 'c', 'STOP')], usage), gemini([part(1, 'd', 'MAX_TOKENS')], usage)];
    expect(outcome(g.slice(0, 2))).toBe('cancelled'); // candidate 1 still going
    expect(outcome(g)).toBe('ok');
    // Candidate 0 finished, then candidate 1 appears: not whole.
    expect(outcome([gemini([part(0, 'a', 'STOP')], usage), gemini([part(1, 'b')])])).toBe('cancelled');
    // A finishReason of its own on an empty part (Gemini 2.x sends the last chunk so) counts too.
    expect(outcome([gemini([part(0, 'a')]), gemini([{ content: { role: 'model', parts: [{ text: '' }] }, finishReason: 'STOP' }], usage)])).toBe('ok');
    // A candidate's latest chunk decides: STOP on an early empty chunk (some gateways), or an unspecified reason, then more text.
    expect(outcome([gemini([part(0, '', 'STOP')], usage), gemini([part(0, 'more')], usage)])).toBe('cancelled');
    expect(outcome([gemini([part(0, 'a', 'FINISH_REASON_UNSPECIFIED')], usage), gemini([part(0, 'b')], usage)])).toBe('cancelled');
    expect(outcome([gemini([part(0, 'a', 'FINISH_REASON_UNSPECIFIED')], usage)])).toBe('cancelled');
    // The output count in a usage-only chunk after the finish: whole only once it came.
    const late = [gemini([part(0, 'a')], { promptTokenCount: 3 }), gemini([part(0, 'b', 'STOP')], { promptTokenCount: 3 }), gemini(undefined, usage)];
    expect(outcome(late.slice(0, 2))).toBe('cancelled');
    expect(outcome(late)).toBe('ok');
    const iev = (o: { event_type: string } & Record<string, unknown>) => `event: ${o.event_type}\ndata: ${JSON.stringify(o)}\n\n`;
    const i = [
      iev({ event_type: 'interaction.start', interaction: { id: 'v1_a', status: 'in_progress' } }),
      iev({ event_type: 'content.delta', index: 0, delta: { type: 'text', text: 'Hi' } }),
      iev({ event_type: 'interaction.completed', interaction: { id: 'v1_a', status: 'completed', usage: { total_input_tokens: 1, total_output_tokens: 2, total_tokens: 3 } } }),
    ];
    expect(run(() => new GeminiInteractionsAdapter(), 'text/event-stream', i.slice(0, 2)).outcome).toBe('cancelled');
    expect(run(() => new GeminiInteractionsAdapter(), 'text/event-stream', i)).toMatchObject({ outcome: 'ok', outputTokens: 2 });
    const failed = iev({ event_type: 'interaction.completed', interaction: { id: 'v1_a', status: 'failed' } });
    expect(run(() => new GeminiInteractionsAdapter(), 'text/event-stream', [...i.slice(0, 2), failed])).toMatchObject({ outcome: 'error', errorType: 'interaction_failed' });
  });

  it('marks an HTTP error status and an in-band error', async () => {
    t = testInstruments();
    const m1 = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
    m1.responseStart(429, 'application/json', undefined);
    m1.chunk(Buffer.from('{"error":{"type":"rate_limit_exceeded"}}'), 5);
    expect(m1.finish(6)!.errorType).toBe('429');
    const m2 = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
    m2.responseStart(200, 'text/event-stream', undefined);
    m2.chunk(Buffer.from('data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"error":{"type":"server_error"}}\n\ndata: {"choices":[{"delta":{"content":"b"}}]}\n\n'), 5);
    const s = m2.finish(9)!;
    expect(s.errorType).toBe('server_error');
    expect(s.contentEvents).toBe(1);
  });

  it('an upstream error the client hung up on is the upstream\'s error, not a cancellation', async () => {
    t = testInstruments();
    // The OpenAI/Anthropic SDKs abort the stream on an in-band error event...
    const m1 = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
    m1.responseStart(200, 'text/event-stream', undefined);
    m1.chunk(Buffer.from('data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"error":{"type":"server_error"}}\n\n'), 5);
    expect([m1.finish(40, 'client_cancelled')!.outcome, (await t.histogram(METRIC.duration)).attributes[0]!['error.type']]).toEqual(['error', 'server_error']);
    // ... and cancel a 429/503 body they will retry, before or after its first byte.
    for (const body of [undefined, '{"error":']) {
      const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
      m.responseStart(503, 'application/json', undefined);
      if (body) m.chunk(Buffer.from(body), 5);
      const s = m.finish(12, 'client_cancelled')!;
      expect([s.outcome, s.errorType]).toEqual(['error', '503']);
    }
    expect(await t.sumValue(METRIC.streams, { outcome: 'cancelled' })).toBe(0);
    expect(await t.sumValue(METRIC.streams, { outcome: 'error' })).toBe(3);
    // A healthy stream the client gives up on is still a cancellation; other failures keep their type.
    const m4 = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
    m4.responseStart(200, 'text/event-stream', undefined);
    m4.chunk(Buffer.from('data: {"choices":[{"delta":{"content":"a"}}]}\n\n'), 5);
    expect(m4.finish(9, 'client_cancelled')!.outcome).toBe('cancelled');
    const m5 = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
    m5.responseStart(200, 'text/event-stream', undefined);
    m5.chunk(Buffer.from('data: {"error":{"type":"server_error"}}\n\n'), 5);
    expect(m5.finish(9, 'timeout')!.errorType).toBe('timeout');
  });

  it('does not parse a compressed body (forwarded untouched, timed only)', async () => {
    t = testInstruments();
    const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
    m.responseStart(200, 'text/event-stream', 'gzip');
    m.chunk(Buffer.from('data: {"choices":[{"delta":{"content":"a"}}]}\n\n'), 5);
    const s = m.finish(9)!;
    expect(s.contentEvents).toBe(0);
    expect((await t.histogram(METRIC.ttft)).count).toBe(0);
    expect((await t.histogram(METRIC.duration)).count).toBe(1);
  });

  it('parses a body whose codings are all identity in any case, or `none`; not one with a real coding', async () => {
    t = testInstruments();
    const events = (coding: string | undefined) => {
      const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
      m.responseStart(200, 'text/event-stream', coding);
      m.chunk(Buffer.from('data: {"choices":[{"delta":{"content":"a"}}]}\n\n'), 5);
      return m.finish(9)!.contentEvents;
    };
    expect([undefined, '', 'identity', 'Identity', ' IDENTITY ', 'none', 'None', 'identity, none', 'identity,,IDENTITY'].map(events)).toEqual([1, 1, 1, 1, 1, 1, 1, 1, 1]);
    // A list (one field, or several joined) is plain only when every coding in it is.
    expect(['gzip', 'GZIP', 'br', 'deflate', 'zstd', 'gzip, identity', 'identity, gzip', 'none,br'].map(events)).toEqual([0, 0, 0, 0, 0, 0, 0, 0]);
  });

  it('counts no tokens from events once a Chat stream carried audio, which holds many tokens a delta', async () => {
    t = testInstruments();
    const run = (deltas: object[]) => {
      const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
      m.responseStart(200, 'text/event-stream', undefined);
      deltas.forEach((d, i) => m.chunk(Buffer.from(`data: ${JSON.stringify({ model: 'gpt-4o-audio-preview', choices: [{ index: 0, delta: d }] })}\n\n`), 10 + i));
      return m.finish(50)!;
    };
    const text = run([{ content: 'a' }, { content: 'b' }, { content: 'c' }]);
    expect(text).toMatchObject({ contentEvents: 3, outputTokens: 3, tokenCountSource: 'events' });
    const audio = run([{ audio: { id: 'x', transcript: 'Hel' } }, { audio: { id: 'x', data: 'AAAA' } }, { audio: { id: 'x', data: 'BBBB', transcript: 'lo' } }]);
    expect(audio).toMatchObject({ contentEvents: 3, outputTokens: undefined, tokenCountSource: 'none' });
  });

  it('counts no tokens from events when the Chat stream relays Claude or Gemini (its model names one): their chunks hold several tokens', async () => {
    t = testInstruments();
    const run = (model: string, usage?: object) => {
      const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
      m.responseStart(200, 'text/event-stream', undefined);
      ['The capital', ' of France is', ' Paris.'].forEach((content, i) => m.chunk(Buffer.from(`data: ${JSON.stringify({ model, choices: [{ index: 0, delta: { content } }] })}\n\n`), 10 + 40 * i));
      if (usage) m.chunk(Buffer.from(`data: ${JSON.stringify({ model, choices: [], usage })}\n\n`), 100);
      return m.finish(110)!;
    };
    // The vendors' ids (Bedrock's, Gemini's resource names), OpenRouter's vendor prefixes, and LiteLLM's
    // own prefixes (its proxy puts the name the client asked for on every chunk).
    for (const model of [
      'claude-sonnet-4-5-20250929', 'anthropic/claude-sonnet-4', 'anthropic/claude-3.5-sonnet:beta', '~anthropic/claude-sonnet-latest', 'us.anthropic.claude-3-7-sonnet-20250219-v1:0',
      'anthropic.claude-3-5-sonnet-20240620-v1:0', 'bedrock/anthropic.claude-3-haiku-20240307-v1:0', 'bedrock/converse/us.anthropic.claude-3-7-sonnet-20250219-v1:0',
      'bedrock/invoke/anthropic.claude-3-haiku-20240307-v1:0', 'arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-sonnet-20240620-v1:0',
      'openrouter/anthropic/claude-3.5-sonnet', 'azure_ai/claude-sonnet-4-5', 'vertex_ai/claude-3-7-sonnet@20250219',
      'gemini-2.5-flash', 'google/gemini-2.5-pro', 'models/gemini-2.0-flash', 'vertex_ai/gemini-2.5-pro', 'vertex_ai_beta/gemini-1.5-pro', 'gemini/gemini-2.5-flash',
      'openrouter/google/gemini-2.5-pro', 'publishers/google/models/gemini-2.0-flash-001',
    ]) {
      expect(run(model), model).toMatchObject({ contentEvents: 3, outputTokens: undefined, tokenCountSource: 'none', tpotMs: undefined });
    }
    // With the provider's count, TPOT is as for any stream: (90 - 10) / (9 - 1).
    expect(run('claude-sonnet-4-5', { prompt_tokens: 5, completion_tokens: 9, total_tokens: 14 })).toMatchObject({ outputTokens: 9, tokenCountSource: 'usage', tpotMs: 10 });
    // Other models stream about one token an event (Gemma and Llama on vLLM), also those whose names
    // only contain one (distillations, fine-tunes, GGUF builds).
    for (const model of ['gpt-4o-mini', 'gemma-3-27b-it', 'meta-llama/Llama-3.1-8B-Instruct', 'my-claude-finetune', 'ft:gpt-4o-mini-2024-07-18:acme:claude-distill:AbC12', 'reedmayhew/claude-3.7-sonnet-reasoning-gemma3-12B', 'myorg/gemini-style-llama-8b', 'hf.co/bartowski/claude-x-GGUF:Q4_K_M', 'Qwen3-8B-Claude-Distill', 'google/gemma-3-27b-it', 'openai.gpt-oss-120b-1:0']) {
      expect(run(model), model).toMatchObject({ contentEvents: 3, outputTokens: 3, tokenCountSource: 'events', tpotMs: 40 });
    }
  });

  it('a Chat finish reason that reports a failure (Mistral\'s `error`, DeepSeek\'s `insufficient_system_resource`) makes the request an error; its usage is still read', async () => {
    t = testInstruments();
    const run = (reason: string, usageAfter: boolean) => {
      const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
      m.responseStart(200, 'text/event-stream', undefined);
      const usage = { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 };
      ['a', 'b', 'c'].forEach((content, i) => m.chunk(Buffer.from(`data: ${JSON.stringify({ model: 'm', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`), 10 + i));
      m.chunk(Buffer.from(`data: ${JSON.stringify({ model: 'm', choices: [{ index: 0, delta: { content: '' }, finish_reason: reason }], ...(usageAfter ? {} : { usage }) })}\n\n`), 20);
      if (usageAfter) m.chunk(Buffer.from(`data: ${JSON.stringify({ model: 'm', choices: [], usage })}\n\n`), 21);
      m.chunk(Buffer.from('data: [DONE]\n\n'), 22);
      return m.finish(23)!;
    };
    for (const reason of ['error', 'insufficient_system_resource']) {
      for (const usageAfter of [false, true]) {
        expect(run(reason, usageAfter), `${reason} ${usageAfter}`).toMatchObject({ outcome: 'error', errorType: reason, outputTokens: 3, inputTokens: 5, finishReasons: [reason] });
      }
    }
    // TPOT is recorded for successful requests only.
    expect((await t.histogram(METRIC.tpot)).count).toBe(0);
    for (const reason of ['stop', 'length', 'content_filter', 'tool_calls']) {
      expect(run(reason, false), reason).toMatchObject({ outcome: 'ok', errorType: undefined, outputTokens: 3, tpotMs: 1 });
    }
    expect((await t.histogram(METRIC.tpot)).count).toBe(4);
  });

  it('counts no tokens from events once a Responses stream carried audio; its transcript alone is one token an event', async () => {
    t = testInstruments();
    const run = (types: string[]) => {
      const m = new RequestMeter(t.instruments, new OpenAIResponsesAdapter(), { ...labels }, 0, opts);
      m.responseStart(200, 'text/event-stream', undefined);
      types.forEach((type, i) => m.chunk(Buffer.from(`event: ${type}\ndata: ${JSON.stringify({ type, delta: 'AAAA' })}\n\n`), 10 + i));
      return m.finish(50, 'client_cancelled')!;
    };
    expect(run(['response.audio.transcript.delta', 'response.audio.transcript.delta'])).toMatchObject({ contentEvents: 2, outputTokens: 2, tokenCountSource: 'events' });
    expect(run(['response.audio.transcript.delta', 'response.audio.delta', 'response.audio.delta'])).toMatchObject({ contentEvents: 3, outputTokens: undefined, tokenCountSource: 'none' });
  });

  describe('TPOT and reasoning the provider counts', () => {
    /** SSE events, one every 20 ms from t = 100 (the stream's start is 0); the summary. */
    const run = (adapter: ResponseAdapter, events: string[], predicted = false) => {
      const m = new RequestMeter(t.instruments, adapter, { ...labels }, 0, opts);
      if (predicted) m.predictedOutput();
      m.responseStart(200, 'text/event-stream', undefined);
      events.forEach((e, i) => m.chunk(Buffer.from(`${e}\n\n`), 100 + 20 * i));
      return m.finish(100 + 20 * events.length)!;
    };
    const chat = (delta: object, usage?: object) => `data: ${JSON.stringify({ model: 'o', choices: usage ? [] : [{ index: 0, delta }], ...(usage ? { usage } : {}) })}`;
    const resp = (type: string, body: object) => `event: ${type}\ndata: ${JSON.stringify({ type, ...body })}`;
    const gem = (parts: object[], usage: object) => `data: ${JSON.stringify({ candidates: [{ content: { role: 'model', parts } }], usageMetadata: usage, modelVersion: 'g' })}`;

    it('Chat: reasoning counted but not streamed is left out of TPOT; streamed reasoning is not', () => {
      t = testInstruments();
      const hidden = run(new OpenAIChatAdapter(), [
        ...['a', 'b', 'c', 'd', 'e', 'f'].map((c) => chat({ content: c })),
        chat({}, { completion_tokens: 306, completion_tokens_details: { reasoning_tokens: 300 } }),
      ]);
      expect(hidden).toMatchObject({ outputTokens: 306, contentEvents: 6 });
      expect(hidden.tpotMs).toBeCloseTo(100 / 5, 9); // 5 intervals of 20 ms between 6 visible tokens
      const shown = run(new OpenAIChatAdapter(), [
        ...['r', 's', 't'].map((c) => chat({ reasoning_content: c })),
        ...['a', 'b', 'c'].map((c) => chat({ content: c })),
        chat({}, { completion_tokens: 6, completion_tokens_details: { reasoning_tokens: 3 } }),
      ]);
      expect(shown.tpotMs).toBeCloseTo(100 / 5, 9);
      const none = run(new OpenAIChatAdapter(), [...['a', 'b', 'c'].map((c) => chat({ content: c })), chat({}, { completion_tokens: 3, completion_tokens_details: { reasoning_tokens: 0 } })]);
      expect(none.tpotMs).toBeCloseTo(40 / 2, 9);
    });

    it('Chat: a prediction\'s rejected tokens are billed as output but not in the span TPOT divides (Predicted Outputs)', async () => {
      t = testInstruments();
      // OpenAI's CompletionUsage: rejected_prediction_tokens "are still counted in the total completion tokens".
      const six = ['a', 'b', 'c', 'd', 'e', 'f'].map((c) => chat({ content: c }));
      const usage = { prompt_tokens: 100, completion_tokens: 206, completion_tokens_details: { reasoning_tokens: 0, accepted_prediction_tokens: 3, rejected_prediction_tokens: 200 } };
      const predicted = run(new OpenAIChatAdapter(), [...six, chat({}, usage)], true);
      expect(predicted).toMatchObject({ outputTokens: 206, contentEvents: 6 });
      expect(predicted.tpotMs).toBeCloseTo(100 / 5, 9); // not 100 / 205
      // Billed: the output histogram keeps all 206; the TPOT histogram has the streamed pace.
      expect(await t.histogram(METRIC.tokenUsage, { 'gen_ai.token.type': 'output' })).toMatchObject({ count: 1, sum: 206 });
      expect((await t.histogram(METRIC.tpot)).sum).toBeCloseTo(0.02, 9);
      // A count that cannot hold every content event besides them takes nothing out.
      const tooMany = run(new OpenAIChatAdapter(), [...six, chat({}, { completion_tokens: 8, completion_tokens_details: { rejected_prediction_tokens: 5 } })], true);
      expect(tooMany.tpotMs).toBeCloseTo(100 / 7, 9);
      // A request without a prediction: the field is something else (the SGLang gateway's rejected
      // speculative drafts, outside completion_tokens), and the whole count stays.
      const drafts = run(new OpenAIChatAdapter(), [...six, chat({}, { completion_tokens: 24, completion_tokens_details: { accepted_prediction_tokens: 18, rejected_prediction_tokens: 6 } })]);
      expect(drafts).toMatchObject({ outputTokens: 24, contentEvents: 6 });
      expect(drafts.tpotMs).toBeCloseTo(100 / 23, 9);
    });

    it('Chat: Perplexity\'s top-level reasoning_tokens are streamed in `content` (`<think>`): the count is kept whole', () => {
      t = testInstruments();
      // 100 events 20 ms apart, the first 60 of them the <think> part; 300 tokens of which 180 reasoning.
      const events = Array.from({ length: 100 }, (_, k) => chat({ content: k === 0 ? '<think>Let' : k === 60 ? '</think>The' : ` w${k}` }));
      const s = run(new OpenAIChatAdapter(), [...events, chat({}, { prompt_tokens: 9, completion_tokens: 300, total_tokens: 309, reasoning_tokens: 180 })]);
      expect(s).toMatchObject({ outputTokens: 300, contentEvents: 100 });
      expect(s.tpotMs).toBeCloseTo((99 * 20) / 299, 9); // not / (300 - 180 - 1)
    });

    it('Chat: xAI counts reasoning outside completion_tokens (output is both); reasoning inside `content` keeps the whole count', () => {
      t = testInstruments();
      const six = ['a', 'b', 'c', 'd', 'e', 'f'].map((c) => chat({ content: c }));
      // Grok 4: 300 hidden reasoning tokens beside 6 completion tokens, total = prompt + both.
      const grok = run(new OpenAIChatAdapter(), [...six, chat({}, { prompt_tokens: 10, completion_tokens: 6, total_tokens: 316, completion_tokens_details: { reasoning_tokens: 300 } })]);
      expect(grok).toMatchObject({ outputTokens: 306, contentEvents: 6 });
      expect(grok.tpotMs).toBeCloseTo(100 / 5, 9);
      // Reasoning beside the count but no total to tell: the count cannot hold it, so none is taken out.
      const noTotal = run(new OpenAIChatAdapter(), [...six, chat({}, { prompt_tokens: 10, completion_tokens: 6, completion_tokens_details: { reasoning_tokens: 3 } })]);
      expect(noTotal).toMatchObject({ outputTokens: 6 });
      expect(noTotal.tpotMs).toBeCloseTo(100 / 5, 9);
      // `<think>` text inside content, counted as reasoning: every event is in the span.
      const inline = run(new OpenAIChatAdapter(), [...six, chat({}, { prompt_tokens: 10, completion_tokens: 6, total_tokens: 16, completion_tokens_details: { reasoning_tokens: 3 } })]);
      expect(inline).toMatchObject({ outputTokens: 6 });
      expect(inline.tpotMs).toBeCloseTo(100 / 5, 9);
    });

    it('Responses: hidden reasoning left out, a streamed reasoning summary keeps the count whole', () => {
      t = testInstruments();
      const done = (out: number, reasoning: number) => resp('response.completed', { response: { model: 'o', usage: { output_tokens: out, output_tokens_details: { reasoning_tokens: reasoning } } } });
      const text = (d: string) => resp('response.output_text.delta', { delta: d });
      const hidden = run(new OpenAIResponsesAdapter(), [text('a'), text('b'), text('c'), done(203, 200)]);
      expect(hidden.tpotMs).toBeCloseTo(40 / 2, 9);
      const summary = run(new OpenAIResponsesAdapter(), [resp('response.reasoning_summary_text.delta', { delta: 'thinking' }), text('a'), text('b'), done(203, 200)]);
      expect(summary.tpotMs).toBeCloseTo(40 / 202, 9);
    });

    it('Anthropic: thinking not displayed (only its signature streamed) is left out of TPOT; summarized thinking is not', () => {
      t = testInstruments();
      const ev = (o: { type: string } & Record<string, unknown>) => `event: ${o.type}\ndata: ${JSON.stringify(o)}`;
      const text = (x: string) => ev({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: x } });
      const end = ev({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 305, output_tokens_details: { thinking_tokens: 300 } } });
      const omitted = run(new AnthropicAdapter(), [
        ev({ type: 'content_block_start', index: 0, content_block: { type: 'thinking', thinking: '', signature: '' } }),
        ev({ type: 'content_block_delta', index: 0, delta: { type: 'signature_delta', signature: 'c2ln' } }),
        ...['a', 'b', 'c', 'd', 'e'].map(text),
        end,
      ]);
      expect(omitted).toMatchObject({ outputTokens: 305, contentEvents: 5 });
      expect(omitted.tpotMs).toBeCloseTo(80 / 4, 9); // 4 intervals of 20 ms between 5 visible events, 5 tokens
      const summarized = run(new AnthropicAdapter(), [ev({ type: 'content_block_delta', index: 0, delta: { type: 'thinking_delta', thinking: 'hm' } }), ...['a', 'b', 'c', 'd'].map(text), end]);
      expect(summarized.tpotMs).toBeCloseTo(80 / 304, 9);
    });

    it('no TPOT where the span does not hold the counted output: Claude thinking hidden and not counted, a Responses stream of whole parts', async () => {
      t = testInstruments();
      const ev = (o: { type: string } & Record<string, unknown>) => `event: ${o.type}\ndata: ${JSON.stringify(o)}`;
      const text = (x: string) => ev({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: x } });
      const hiddenThinking = ev({ type: 'content_block_start', index: 0, content_block: { type: 'thinking', thinking: '', signature: '' } });
      const end = (usage: object) => ev({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage });
      // 300 thinking tokens among the 305 with no count of them: 305 − 1 would make TPOT ~76x too low.
      const claude = run(new AnthropicAdapter(), [hiddenThinking, ...['a', 'b', 'c', 'd', 'e'].map(text), end({ output_tokens: 305, output_tokens_details: null })]);
      expect(claude).toMatchObject({ outcome: 'ok', outputTokens: 305, tokenCountSource: 'usage', contentEvents: 5, tpotMs: undefined });
      expect(claude.ttftMs).toBe(120);
      expect((await t.histogram(METRIC.tpot)).count).toBe(0);
      // Counted, it is left out as before; shown, it is inside the span.
      expect(run(new AnthropicAdapter(), [hiddenThinking, ...['a', 'b', 'c', 'd', 'e'].map(text), end({ output_tokens: 305, output_tokens_details: { thinking_tokens: 300 } })]).tpotMs).toBeCloseTo(80 / 4, 9);
      expect((await t.histogram(METRIC.tpot)).count).toBe(1);
      // Whole parts at the end of the answer: TTFT at the first, no TPOT from their ~0 ms span.
      const whole = run(new OpenAIResponsesAdapter(), [
        resp('response.output_text.done', { item_id: 'msg_1', output_index: 0, content_index: 0, text: 'It is sunny in Paris.' }),
        resp('response.function_call_arguments.done', { item_id: 'fc_1', output_index: 1, name: 'f', arguments: '{"city":"Paris"}' }),
        resp('response.completed', { response: { model: 'o', usage: { output_tokens: 40 } } }),
      ]);
      expect(whole).toMatchObject({ outcome: 'ok', outputTokens: 40, contentEvents: 2, tpotMs: undefined });
      expect(whole.ttftMs).toBe(100);
      expect((await t.histogram(METRIC.tpot)).count).toBe(1);
    });

    it('thinking that begins after the first content event (between tool uses) lies inside the span: not left out (Anthropic, Interactions, Responses)', () => {
      t = testInstruments();
      // 5 events before the hidden thinking, 5 after: 9 intervals of 20 ms, the thinking among them.
      const ev = (o: { type: string } & Record<string, unknown>) => `event: ${o.type}\ndata: ${JSON.stringify(o)}`;
      const text = (x: string) => ev({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: x } });
      const claude = run(new AnthropicAdapter(), [
        ...['a', 'b', 'c', 'd', 'e'].map(text),
        ev({ type: 'content_block_start', index: 2, content_block: { type: 'thinking', thinking: '', signature: '' } }),
        ev({ type: 'content_block_delta', index: 2, delta: { type: 'signature_delta', signature: 'c2ln' } }),
        ...['f', 'g', 'h', 'i', 'j'].map(text),
        ev({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 310, output_tokens_details: { thinking_tokens: 300 } } }),
      ]);
      expect(claude).toMatchObject({ outputTokens: 310, contentEvents: 10 });
      expect(claude.tpotMs).toBeCloseTo(220 / 309, 9);
      const iev = (o: { event_type: string } & Record<string, unknown>) => `event: ${o.event_type}\ndata: ${JSON.stringify(o)}`;
      const itext = (x: string) => iev({ event_type: 'step.delta', index: 1, delta: { type: 'text', text: x } });
      const interactions = run(new GeminiInteractionsAdapter(), [
        ...['a', 'b', 'c', 'd', 'e'].map(itext),
        iev({ event_type: 'step.start', index: 2, step: { type: 'thought', signature: 'c2ln' } }),
        ...['f', 'g', 'h', 'i', 'j'].map(itext),
        iev({ event_type: 'interaction.completed', interaction: { status: 'completed', usage: { total_input_tokens: 1, total_output_tokens: 10, total_thought_tokens: 300, total_tokens: 311 } } }),
      ]);
      expect(interactions).toMatchObject({ outputTokens: 310, contentEvents: 10 });
      expect(interactions.tpotMs).toBeCloseTo(200 / 309, 9);
      const rtext = (x: string) => resp('response.output_text.delta', { delta: x });
      const responses = run(new OpenAIResponsesAdapter(), [
        ...['a', 'b', 'c', 'd', 'e'].map(rtext),
        resp('response.output_item.added', { output_index: 2, item: { id: 'rs_2', type: 'reasoning', summary: [] } }),
        ...['f', 'g', 'h', 'i', 'j'].map(rtext),
        resp('response.completed', { response: { model: 'o', usage: { output_tokens: 310, output_tokens_details: { reasoning_tokens: 300 } } } }),
      ]);
      expect(responses).toMatchObject({ outputTokens: 310, contentEvents: 10 });
      expect(responses.tpotMs).toBeCloseTo(200 / 309, 9);
      // The same reasoning item before the first content event: left out, as before.
      const first = run(new OpenAIResponsesAdapter(), [
        resp('response.output_item.added', { output_index: 0, item: { id: 'rs_1', type: 'reasoning', summary: [] } }),
        ...['a', 'b', 'c', 'd', 'e'].map(rtext),
        resp('response.completed', { response: { model: 'o', usage: { output_tokens: 305, output_tokens_details: { reasoning_tokens: 300 } } } }),
      ]);
      expect(first.tpotMs).toBeCloseTo(80 / 4, 9);
    });

    it('Gemini Interactions: thoughts without a summary are left out of TPOT', () => {
      t = testInstruments();
      const ev = (o: { event_type: string } & Record<string, unknown>) => `event: ${o.event_type}\ndata: ${JSON.stringify(o)}`;
      const hidden = run(new GeminiInteractionsAdapter(), [
        ev({ event_type: 'step.start', index: 0, step: { type: 'thought', signature: 'c2ln' } }),
        ...['a', 'b', 'c', 'd', 'e'].map((x) => ev({ event_type: 'step.delta', index: 1, delta: { type: 'text', text: x } })),
        ev({ event_type: 'interaction.completed', interaction: { status: 'completed', usage: { total_input_tokens: 10, total_output_tokens: 5, total_thought_tokens: 300, total_tokens: 315 } } }),
      ]);
      expect(hidden).toMatchObject({ outputTokens: 305, contentEvents: 5 });
      expect(hidden.tpotMs).toBeCloseTo(80 / 4, 9);
    });

    it('Gemini: thoughts counted but not streamed are left out; streamed thought parts are not', () => {
      t = testInstruments();
      const hidden = run(new GeminiAdapter(), [
        gem([{ text: 'a' }], { candidatesTokenCount: 1, thoughtsTokenCount: 80 }),
        gem([{ text: 'b' }], { candidatesTokenCount: 2, thoughtsTokenCount: 80 }),
        gem([{ text: 'c' }], { candidatesTokenCount: 3, thoughtsTokenCount: 80 }),
      ]);
      expect(hidden).toMatchObject({ outputTokens: 83 });
      expect(hidden.tpotMs).toBeCloseTo(40 / 2, 9);
      const shown = run(new GeminiAdapter(), [
        gem([{ text: 'plan', thought: true }], {}),
        gem([{ text: 'b' }], { candidatesTokenCount: 1, thoughtsTokenCount: 80 }),
        gem([{ text: 'c' }], { candidatesTokenCount: 2, thoughtsTokenCount: 80 }),
      ]);
      expect(shown.tpotMs).toBeCloseTo(40 / 81, 9);
    });
  });

  it('reads usage from a non-streamed JSON body', async () => {
    t = testInstruments();
    const m = new RequestMeter(t.instruments, new OpenAIChatAdapter(), { ...labels }, 0, opts);
    m.responseStart(200, 'application/json', undefined);
    const body = Buffer.from(JSON.stringify({ model: 'gpt-x', choices: [{ message: { content: 'hi' } }], usage: { prompt_tokens: 3, completion_tokens: 7 } }));
    m.chunk(body.subarray(0, 10), 1);
    m.chunk(body.subarray(10), 2);
    const s = m.finish(3)!;
    expect(s).toMatchObject({ streamed: false, outputTokens: 7, inputTokens: 3, tokenCountSource: 'usage', ttftMs: undefined });
  });
});
