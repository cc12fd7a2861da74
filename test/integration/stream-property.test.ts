// Generated streams of six APIs (OpenAI Chat and Responses, Anthropic, Gemini as SSE and as a
// JSON array, Ollama NDJSON, Bedrock ConverseStream's binary event-stream) through the proxy:
// any line ending, `data:` and `event:` with or without their space, comment events between,
// text, reasoning or tool-call deltas beside events that carry no output, usage or not (at the
// end, or so far on every chunk), any body framing, cut at generated points and written a
// millisecond apart. The client gets the body unchanged; the proxy counts exactly the content
// events, takes the output count from the usage, the events or nowhere as the API allows, and
// its TTFT and gap sums lie within what the upstream's writes and the client's reads allow, on
// the one clock they share; TPOT is their span over the count less one.
import fc from 'fast-check';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { hist, scrape, total, type Sample } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';
import { rawFrame, stringHeaders } from '../helpers/eventstream-frame.js';
import { splitAt } from '../helpers/ranges.js';

const MODEL = 'prop-model';
/** Float rounding in the exported sums (s). */
const EPS = 1e-6;

interface Plan {
  path: string;
  request: object;
  contentType: string;
  body: Buffer;
  /**
   * For each content event, the body offsets between which it is complete: just past its blank
   * line's CR and just past its LF, as the proxy may take a CRLF; else both just past its end.
   */
  contentEnds: [earliest: number, latest: number][];
  tokens: number;
  /** Where the output count comes from: the provider's usage; counted content events; none (an API whose events carry several tokens, with no usage). */
  source: 'usage' | 'events' | 'none';
  framing: 'chunked' | 'length' | 'close';
  pieces: Buffer[];
}

const genArb = fc.record({
  api: fc.constantFrom('chat' as const, 'anthropic' as const, 'responses' as const, 'gemini' as const, 'gemini-array' as const, 'ollama' as const, 'bedrock' as const),
  eol: fc.constantFrom('\n', '\r\n', '\r'),
  space: fc.boolean(),
  texts: fc.array(fc.string({ minLength: 1, maxLength: 8, unit: fc.constantFrom('a', 'é', '°', '中', '😀', '"', '\\', '\n', ' ', '{', '}', ']', ',') }), { minLength: 1, maxLength: 20 }),
  comments: fc.array(fc.boolean(), { maxLength: 24 }),
  /** Tokens beyond one per content event in the provider's count; undefined: the stream has no count. */
  usage: fc.option(fc.integer({ min: 0, max: 5 }), { nil: undefined }),
  /** What each content event carries (Chat and Anthropic): text, reasoning, or a tool call's arguments. */
  kinds: fc.array(fc.constantFrom('text' as const, 'reasoning' as const, 'tool' as const), { maxLength: 20 }),
  /** With usage, Chat and Gemini carry the count so far on every chunk too (vLLM's continuous usage, Gemini's usageMetadata): the last one is the count. */
  cumulative: fc.boolean(),
  framing: fc.constantFrom('chunked' as const, 'length' as const, 'close' as const),
  cuts: fc.array(fc.nat(), { maxLength: 12 }),
});
type Gen = typeof genArb extends fc.Arbitrary<infer T> ? T : never;

/** The request and the answer `g` describes, in its API's wire format. */
function render(g: Gen): Plan {
  const parts: Buffer[] = [];
  const contentEnds: [number, number][] = [];
  let at = 0;
  let i = 0;
  const push = (s: string | Buffer) => {
    const b = Buffer.from(s);
    parts.push(b);
    at += b.length;
  };
  /** An SSE event (a comment event before it, as `g.comments` says); `content` when it carries output. */
  const event = (data: object | string, content = false, type?: string) => {
    if (g.comments[i++ % Math.max(g.comments.length, 1)]) push(`: keep-alive${g.eol}${g.eol}`);
    if (type !== undefined) push(`event:${g.space ? ' ' : ''}${type}${g.eol}`);
    push(`data:${g.space ? ' ' : ''}${typeof data === 'string' ? data : JSON.stringify(data)}${g.eol}${g.eol}`);
    if (content) contentEnds.push([g.eol === '\r\n' ? at - 1 : at, at]);
  };
  const k = g.texts.length;
  const usage = g.usage !== undefined;
  const tokens = k + (g.usage ?? 0);
  // Without usage, APIs whose events carry one token are counted; the others have no count.
  const source = usage ? 'usage' : ['chat', 'responses', 'ollama'].includes(g.api) ? 'events' : 'none';
  const soFar = usage && g.cumulative; // the count up to each chunk on the chunk
  const kind = (j: number) => g.kinds[j % Math.max(g.kinds.length, 1)] ?? 'text';
  const messages = [{ role: 'user', content: 'x' }];
  let path = '/v1/chat/completions';
  let request: object = { model: MODEL, stream: true, messages };
  let contentType = 'text/event-stream';
  if (g.api === 'chat') {
    const count = (n: number) => (soFar ? { usage: { prompt_tokens: 5, completion_tokens: n, total_tokens: 5 + n } } : {});
    const chunk = (delta: object, n: number) => ({ id: 'c', object: 'chat.completion.chunk', model: MODEL, choices: [{ index: 0, delta, finish_reason: null }], ...count(n) });
    event(chunk({ role: 'assistant', content: '' }, 0));
    let toolOpen = false;
    g.texts.forEach((t, j) => {
      const what = kind(j);
      if (what === 'tool' && !toolOpen) {
        // A tool call opens with its id and name and empty arguments: not output yet.
        toolOpen = true;
        event(chunk({ content: null, tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'f', arguments: '' } }] }, j));
      }
      const delta = what === 'text' ? { content: t } : what === 'reasoning' ? { reasoning_content: t } : { tool_calls: [{ index: 0, function: { arguments: t } }] };
      event(chunk(delta, j + 1), true);
    });
    event({ id: 'c', object: 'chat.completion.chunk', model: MODEL, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], ...count(k) });
    if (usage) event({ id: 'c', object: 'chat.completion.chunk', model: MODEL, choices: [], usage: { prompt_tokens: 5, completion_tokens: tokens, total_tokens: 5 + tokens } });
    event('[DONE]');
  } else if (g.api === 'anthropic') {
    path = '/v1/messages';
    request = { model: MODEL, stream: true, max_tokens: 100, messages };
    const e = (type: string, data: object, content = false) => event({ type, ...data }, content, type);
    e('message_start', { message: { id: 'm', type: 'message', role: 'assistant', model: MODEL, content: [], stop_reason: null, usage: { input_tokens: 5, output_tokens: 1 } } });
    e('ping', {});
    // A block for each run of one kind; a thinking block ends with its signature, a tool-use
    // block begins with empty JSON: neither is output.
    let open: { kind: string; index: number } | undefined;
    const close = () => {
      if (open === undefined) return;
      if (open.kind === 'reasoning') e('content_block_delta', { index: open.index, delta: { type: 'signature_delta', signature: 'c2ln' } });
      e('content_block_stop', { index: open.index });
    };
    g.texts.forEach((t, j) => {
      const what = kind(j);
      if (open?.kind !== what) {
        close();
        const index = open === undefined ? 0 : open.index + 1;
        open = { kind: what, index };
        const block = what === 'text' ? { type: 'text', text: '' } : what === 'reasoning' ? { type: 'thinking', thinking: '' } : { type: 'tool_use', id: 'toolu_1', name: 'f', input: {} };
        e('content_block_start', { index, content_block: block });
        if (what === 'tool') e('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json: '' } });
      }
      const delta = what === 'text' ? { type: 'text_delta', text: t } : what === 'reasoning' ? { type: 'thinking_delta', thinking: t } : { type: 'input_json_delta', partial_json: t };
      e('content_block_delta', { index: open.index, delta }, true);
    });
    close();
    e('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, ...(usage && { usage: { output_tokens: tokens } }) });
    e('message_stop', {});
  } else if (g.api === 'responses') {
    path = '/v1/responses';
    request = { model: MODEL, stream: true, input: 'x' };
    const e = (type: string, data: object, content = false) => event({ type, ...data }, content, type);
    e('response.created', { response: { id: 'r', object: 'response', model: MODEL, status: 'in_progress' } });
    for (const t of g.texts) e('response.output_text.delta', { item_id: 'i', output_index: 0, content_index: 0, delta: t }, true);
    e('response.completed', { response: { id: 'r', object: 'response', model: MODEL, status: 'completed', ...(usage && { usage: { input_tokens: 5, output_tokens: tokens, total_tokens: 5 + tokens } }) } });
  } else if (g.api === 'gemini') {
    path = `/v1beta/models/${MODEL}:streamGenerateContent?alt=sse`;
    request = { contents: [{ role: 'user', parts: [{ text: 'x' }] }] };
    const candidate = (text: string, extra: object = {}) => ({ candidates: [{ content: { role: 'model', parts: [{ text }] }, index: 0, ...extra }], modelVersion: MODEL });
    const count = (n: number) => (soFar ? { usageMetadata: { promptTokenCount: 5, candidatesTokenCount: n, totalTokenCount: 5 + n } } : {});
    g.texts.forEach((t, j) => event({ ...candidate(t), ...count(j + 1) }, true));
    event({ ...candidate('', { finishReason: 'STOP' }), ...(usage && { usageMetadata: { promptTokenCount: 5, candidatesTokenCount: tokens, totalTokenCount: 5 + tokens } }) });
  } else if (g.api === 'gemini-array') {
    // Without alt=sse: one JSON array, each element an event once its closing brace is in.
    path = `/v1beta/models/${MODEL}:streamGenerateContent`;
    request = { contents: [{ role: 'user', parts: [{ text: 'x' }] }] };
    contentType = 'application/json; charset=UTF-8';
    const sep = g.eol === '\r' ? '\r\n' : g.eol;
    const candidate = (text: string, extra: object = {}) => ({ candidates: [{ content: { role: 'model', parts: [{ text }] }, index: 0, ...extra }], modelVersion: MODEL });
    const count = (n: number) => (soFar ? { usageMetadata: { promptTokenCount: 5, candidatesTokenCount: n, totalTokenCount: 5 + n } } : {});
    g.texts.forEach((t, j) => {
      push(`${j === 0 ? '[' : `${sep},${sep}`}${JSON.stringify({ ...candidate(t), ...count(j + 1) }, null, g.space ? 2 : undefined)}`);
      contentEnds.push([at, at]);
    });
    push(`${sep},${sep}${JSON.stringify({ ...candidate('', { finishReason: 'STOP' }), ...(usage && { usageMetadata: { promptTokenCount: 5, candidatesTokenCount: tokens, totalTokenCount: 5 + tokens } }) })}${sep}]`);
  } else if (g.api === 'bedrock') {
    path = `/model/${MODEL}/converse-stream`;
    request = { messages: [{ role: 'user', content: [{ text: 'x' }] }] };
    contentType = 'application/vnd.amazon.eventstream';
    // Frames from the tests' own encoder, not the proxy's: a bug shared by both would cancel out.
    const frame = (type: string, payload: object, content = false) => {
      const headers = stringHeaders({ ':event-type': type, ':content-type': 'application/json', ':message-type': 'event' });
      push(rawFrame(headers, Buffer.from(JSON.stringify({ ...payload, p: 'abcdefghij'.slice(0, 1 + (at % 10)) }))));
      if (content) contentEnds.push([at, at]);
    };
    frame('messageStart', { role: 'assistant' });
    for (const t of g.texts) frame('contentBlockDelta', { contentBlockIndex: 0, delta: { text: t } }, true);
    frame('contentBlockStop', { contentBlockIndex: 0 });
    frame('messageStop', { stopReason: 'end_turn' });
    frame('metadata', { metrics: { latencyMs: 100 }, ...(usage && { usage: { inputTokens: 5, outputTokens: tokens, totalTokens: 5 + tokens } }) });
  } else {
    path = '/api/chat';
    request = { model: MODEL, messages };
    contentType = 'application/x-ndjson';
    const eol = g.eol === '\r' ? '\n' : g.eol; // NDJSON lines end in LF
    const line = (o: object, content = false) => {
      push(JSON.stringify({ model: MODEL, created_at: '2026-12-04T00:00:00Z', ...o }) + eol);
      if (content) contentEnds.push([at, at]); // a line ends at its LF
    };
    for (const t of g.texts) line({ message: { role: 'assistant', content: t }, done: false }, true);
    line({ message: { role: 'assistant', content: '' }, done: true, done_reason: 'stop', ...(usage && { prompt_eval_count: 5, eval_count: tokens }) });
  }
  const body = Buffer.concat(parts);
  return { path, request, contentType, body, contentEnds, tokens, source, framing: g.framing, pieces: splitAt(body, g.cuts) };
}

let proxy: RunningProxy;
let server: net.Server;
/** The plan the upstream answers the next request with, and what it saw. */
let current: { plan: Plan; got: number; writes: { at: number; end: number }[] } | undefined;

beforeAll(async () => {
  server = net.createServer((sock) => {
    sock.on('error', () => {});
    let buf = '';
    sock.on('data', async (d: Buffer) => {
      buf += d.toString('latin1');
      const at = buf.indexOf('\r\n\r\n');
      if (at < 0) return;
      const len = Number(/\r\ncontent-length: *(\d+)/i.exec(buf.slice(0, at))?.[1] ?? 0);
      if (buf.length < at + 4 + len) return;
      buf = '';
      const c = current!;
      c.got = performance.now();
      const { plan } = c;
      const framing = plan.framing === 'chunked' ? 'transfer-encoding: chunked' : plan.framing === 'length' ? `content-length: ${plan.body.length}` : 'connection: close';
      sock.write(`HTTP/1.1 200 OK\r\ncontent-type: ${plan.contentType}\r\n${framing}\r\n\r\n`);
      let end = 0;
      for (const p of plan.pieces) {
        await sleep(1);
        end += p.length;
        sock.write(plan.framing === 'chunked' ? Buffer.concat([Buffer.from(`${p.length.toString(16)}\r\n`), p, Buffer.from('\r\n')]) : p);
        c.writes.push({ at: performance.now(), end }); // after the write: the proxy cannot have read it before
      }
      if (plan.framing === 'chunked') sock.write('0\r\n\r\n');
      if (plan.framing === 'close') sock.end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  proxy = await startTestProxy(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
});
afterAll(async () => {
  await proxy?.close();
  await new Promise((r) => server.close(r));
});

function figures(s: Sample[]) {
  const f = { gen_ai_request_model: MODEL };
  return {
    ttft: hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f),
    gaps: hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', f),
    out: total(s, 'gen_ai_client_token_usage_sum', { ...f, gen_ai_token_type: 'output' }),
    tpot: hist(s, 'gen_ai_server_time_per_output_token_seconds', f),
    streams: (['usage', 'events', 'none'] as const).map((source) => total(s, 'llm_proxy_streams_total', { ...f, token_count_source: source, outcome: 'ok' })),
  };
}

/** Sends the plan's request; resolves with the decoded body and when each byte count was reached. */
function request(plan: Plan): Promise<{ sent: number; body: Buffer; reads: { at: number; end: number }[] }> {
  const u = new URL(proxy.proxyUrl);
  const payload = JSON.stringify(plan.request);
  return new Promise((resolve, reject) => {
    const reads: { at: number; end: number }[] = [];
    const parts: Buffer[] = [];
    let end = 0;
    const req = http.request({ host: u.hostname, port: u.port, path: plan.path, method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
      res.on('data', (d: Buffer) => {
        end += d.length;
        reads.push({ at: performance.now(), end }); // before: the proxy had it
        parts.push(d);
      });
      res.on('end', () => resolve({ sent, body: Buffer.concat(parts), reads }));
      res.on('error', reject);
    });
    req.on('error', reject);
    const sent = performance.now();
    req.end(payload);
  });
}

describe('generated streams through the proxy', () => {
  it('any API, line ending, comment, usage, framing and split: the body unchanged, every content event counted once, TTFT and gaps within what the wire allows', async () => {
    await fc.assert(
      fc.asyncProperty(genArb, async (g) => {
        const plan = render(g);
        const before = figures(await scrape(proxy.metricsUrl));
        current = { plan, got: NaN, writes: [] };
        const r = await request(plan);
        expect(r.body.equals(plan.body)).toBe(true);
        // The stream is recorded when the proxy's exchange ends, just after the client's end.
        const recorded = (f: ReturnType<typeof figures>) => f.streams.reduce((a, b) => a + b);
        let now = figures(await scrape(proxy.metricsUrl));
        for (let i = 0; i < 50 && recorded(now) === recorded(before); i++) {
          await sleep(10);
          now = figures(await scrape(proxy.metricsUrl));
        }
        const k = plan.contentEnds.length;
        expect(now.ttft.count - before.ttft.count).toBe(1);
        expect(now.gaps.count - before.gaps.count).toBe(k - 1);
        const counted = plan.source === 'usage' ? plan.tokens : plan.source === 'events' ? k : undefined;
        expect(now.out - before.out).toBe(counted ?? 0);
        expect(now.streams.map((n, j) => n - before.streams[j]!)).toEqual(['usage', 'events', 'none'].map((s) => (s === plan.source ? 1 : 0)));

        // The proxy saw event j complete after the upstream's write that completed it, and before
        // the client's read that did.
        const written = (end: number) => current!.writes.find((w) => w.end >= end)!.at;
        const read = (end: number) => r.reads.find((x) => x.end >= end)!.at;
        const [first, last] = [plan.contentEnds[0]!, plan.contentEnds[k - 1]!];
        const ttft = now.ttft.sum - before.ttft.sum;
        expect(ttft).toBeGreaterThanOrEqual((written(first[0]) - current!.got) / 1000 - EPS);
        expect(ttft).toBeLessThanOrEqual((read(first[1]) - r.sent) / 1000 + EPS);
        const span = now.gaps.sum - before.gaps.sum;
        expect(span).toBeGreaterThanOrEqual((written(last[0]) - read(first[1])) / 1000 - EPS);
        expect(span).toBeLessThanOrEqual((read(last[1]) - written(first[0])) / 1000 + EPS);
        // TPOT = (last − first) / (output tokens − 1): the same span, when both are defined.
        const tpot = counted !== undefined && k >= 2 && counted >= 2;
        expect(now.tpot.count - before.tpot.count).toBe(tpot ? 1 : 0);
        if (tpot) expect(Math.abs((now.tpot.sum - before.tpot.sum) * (counted - 1) - span)).toBeLessThanOrEqual(EPS * counted);
      }),
      { numRuns: 120 },
    );
  });
});
