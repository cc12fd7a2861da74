// Generated OpenAI Chat streams through the proxy: any line ending, `data:` with or without its
// space, comment events between, usage or not, any body framing, cut at generated points and
// written a millisecond apart. The client gets the body unchanged; the proxy counts exactly the
// content events (or the usage), and its TTFT and gap sums lie within what the upstream's writes
// and the client's reads allow, on the one clock they share.
import fc from 'fast-check';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { hist, scrape, total, type Sample } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';
import { splitAt } from '../helpers/ranges.js';

const MODEL = 'prop-model';
/** Float rounding in the exported sums (s). */
const EPS = 1e-6;

interface Plan {
  body: Buffer;
  /** Offset just past each content event's blank line, in body bytes. */
  contentEnds: number[];
  tokens: number;
  usage: boolean;
  framing: 'chunked' | 'length' | 'close';
  pieces: Buffer[];
}

const genArb = fc.record({
  eol: fc.constantFrom('\n', '\r\n', '\r'),
  space: fc.boolean(),
  texts: fc.array(fc.string({ minLength: 1, maxLength: 8, unit: fc.constantFrom('a', 'é', '°', '中', '😀', '"', '\\', '\n', ' ') }), { minLength: 1, maxLength: 20 }),
  comments: fc.array(fc.boolean(), { maxLength: 24 }),
  usage: fc.option(fc.integer({ min: 0, max: 5 }), { nil: undefined }),
  framing: fc.constantFrom('chunked' as const, 'length' as const, 'close' as const),
  cuts: fc.array(fc.nat(), { maxLength: 12 }),
});
type Gen = typeof genArb extends fc.Arbitrary<infer T> ? T : never;

function render(g: Gen): Plan {
  const parts: string[] = [];
  const contentEnds: number[] = [];
  let at = 0;
  let i = 0;
  const event = (data: string, content = false) => {
    if (g.comments[i++ % Math.max(g.comments.length, 1)]) push(`: keep-alive${g.eol}${g.eol}`);
    push(`data:${g.space ? ' ' : ''}${data}${g.eol}${g.eol}`);
    if (content) contentEnds.push(at);
  };
  const push = (s: string) => {
    parts.push(s);
    at += Buffer.byteLength(s);
  };
  const chunk = (delta: object) => JSON.stringify({ id: 'c', object: 'chat.completion.chunk', model: MODEL, choices: [{ index: 0, delta, finish_reason: null }] });
  event(chunk({ role: 'assistant', content: '' }));
  for (const t of g.texts) event(chunk({ content: t }), true);
  event(JSON.stringify({ id: 'c', object: 'chat.completion.chunk', model: MODEL, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }));
  const tokens = g.usage === undefined ? g.texts.length : g.texts.length + g.usage;
  if (g.usage !== undefined) event(JSON.stringify({ id: 'c', object: 'chat.completion.chunk', model: MODEL, choices: [], usage: { prompt_tokens: 5, completion_tokens: tokens, total_tokens: 5 + tokens } }));
  event('[DONE]');
  const body = Buffer.from(parts.join(''));
  return { body, contentEnds, tokens, usage: g.usage !== undefined, framing: g.framing, pieces: splitAt(body, g.cuts) };
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
      sock.write(`HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n${framing}\r\n\r\n`);
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
    usage: total(s, 'llm_proxy_streams_total', { ...f, token_count_source: 'usage', outcome: 'ok' }),
    events: total(s, 'llm_proxy_streams_total', { ...f, token_count_source: 'events', outcome: 'ok' }),
  };
}

/** Sends the request; resolves with the decoded body and when each byte count was reached. */
function request(): Promise<{ sent: number; body: Buffer; reads: { at: number; end: number }[] }> {
  const u = new URL(proxy.proxyUrl);
  const payload = JSON.stringify({ model: MODEL, stream: true, messages: [{ role: 'user', content: 'x' }] });
  return new Promise((resolve, reject) => {
    const reads: { at: number; end: number }[] = [];
    const parts: Buffer[] = [];
    let end = 0;
    const req = http.request({ host: u.hostname, port: u.port, path: '/v1/chat/completions', method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
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
  it('any line ending, comment, usage, framing and split: the body unchanged, every content event counted once, TTFT and gaps within what the wire allows', async () => {
    await fc.assert(
      fc.asyncProperty(genArb, async (g) => {
        const plan = render(g);
        const before = figures(await scrape(proxy.metricsUrl));
        current = { plan, got: NaN, writes: [] };
        const r = await request();
        expect(r.body.equals(plan.body)).toBe(true);
        // The stream is recorded when the proxy's exchange ends, just after the client's end.
        let now = figures(await scrape(proxy.metricsUrl));
        for (let i = 0; i < 50 && now.ttft.count === before.ttft.count; i++) {
          await sleep(10);
          now = figures(await scrape(proxy.metricsUrl));
        }
        const k = plan.contentEnds.length;
        expect(now.ttft.count - before.ttft.count).toBe(1);
        expect(now.gaps.count - before.gaps.count).toBe(k - 1);
        expect(now.out - before.out).toBe(plan.tokens);
        expect([now.usage - before.usage, now.events - before.events]).toEqual(plan.usage ? [1, 0] : [0, 1]);

        // The proxy saw event j complete after the upstream's write that completed it, and before
        // the client's read that did.
        const written = (end: number) => current!.writes.find((w) => w.end >= end)!.at;
        const read = (end: number) => r.reads.find((x) => x.end >= end)!.at;
        const [first, last] = [plan.contentEnds[0]!, plan.contentEnds[k - 1]!];
        const ttft = now.ttft.sum - before.ttft.sum;
        expect(ttft).toBeGreaterThanOrEqual((written(first) - current!.got) / 1000 - EPS);
        expect(ttft).toBeLessThanOrEqual((read(first) - r.sent) / 1000 + EPS);
        const span = now.gaps.sum - before.gaps.sum;
        expect(span).toBeGreaterThanOrEqual((written(last) - read(first)) / 1000 - EPS);
        expect(span).toBeLessThanOrEqual((read(last) - written(first)) / 1000 + EPS);
      }),
      { numRuns: 60 },
    );
  });
});
