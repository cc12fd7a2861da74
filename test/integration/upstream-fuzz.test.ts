// What any upstream may send: answers of every framing the proxy reads (SSE chunked or to the
// close, Anthropic SSE, Ollama NDJSON, Bedrock's binary event stream, a JSON body, an error, a
// 100 Continue first), with bytes replaced, inserted, deleted or repeated, written in pieces,
// then closed, reset or left open a while. The proxy must never throw (vitest fails the run on
// an uncaught error in this process), must answer every client in HTTP/1.1, must pass on what
// it forwards byte for byte (a malformed stream too: the client's body is the upstream's bytes
// from the end of a head on, or their payload when the proxy frames it, perhaps cut short), and
// must go on serving.
import net, { type AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { chunked, mutate, mutationArb, pieces } from '../helpers/byte-mutations.js';
import { fixture } from '../helpers/fixtures.js';
import { startTestProxy } from '../helpers/proxy.js';
import { scrape, total } from '../helpers/prom.js';

const latin1 = (b: Buffer) => b.toString('latin1');
const head = (lines: string[]) => `${lines.join('\r\n')}\r\n\r\n`;
const JSON_BODY = '{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}';
const ERROR_BODY = '{"error":{"message":"slow down","type":"rate_limit_error"}}';

/** An answer template: the path the client asks (it picks the adapter) and the upstream's bytes for body cuts. */
interface Template {
  path: string;
  answer(cuts: number[]): string;
}
const TEMPLATES: Template[] = [
  { path: '/v1/chat/completions', answer: (c) => head(['HTTP/1.1 200 OK', 'Content-Type: text/event-stream', 'Transfer-Encoding: chunked']) + chunked(latin1(fixture('openai-chat-usage.sse')), c) },
  { path: '/v1/chat/completions', answer: () => head(['HTTP/1.1 200 OK', 'Content-Type: text/event-stream', 'Connection: close']) + latin1(fixture('openai-chat.sse')) },
  { path: '/v1/messages', answer: (c) => head(['HTTP/1.1 200 OK', 'Content-Type: text/event-stream', 'Transfer-Encoding: chunked']) + chunked(latin1(fixture('anthropic-messages.sse')), c) },
  { path: '/api/chat', answer: (c) => head(['HTTP/1.1 200 OK', 'Content-Type: application/x-ndjson', 'Transfer-Encoding: chunked']) + chunked(latin1(fixture('ollama-chat.ndjson')), c) },
  { path: '/model/m/converse-stream', answer: (c) => head(['HTTP/1.1 200 OK', 'Content-Type: application/vnd.amazon.eventstream', 'Transfer-Encoding: chunked']) + chunked(latin1(fixture('bedrock-converse-stream.bin')), c) },
  { path: '/v1/chat/completions', answer: () => head(['HTTP/1.1 200 OK', 'Content-Type: application/json', `Content-Length: ${JSON_BODY.length}`]) + JSON_BODY },
  { path: '/v1/chat/completions', answer: () => head(['HTTP/1.1 429 Too Many Requests', 'Content-Type: application/json', 'Retry-After: 1', `Content-Length: ${ERROR_BODY.length}`]) + ERROR_BODY },
  { path: '/v1/chat/completions', answer: (c) => 'HTTP/1.1 100 Continue\r\n\r\n' + head(['HTTP/1.1 200 OK', 'Content-Type: text/event-stream', 'Transfer-Encoding: chunked']) + chunked(latin1(fixture('openai-chat.sse')), c) },
];

const NASTY = ['\r', '\n', '\r\n', '\0', ' ', ':', '0', 'ffffffffffffffff', ';ext=1', '\x80', '\xff', '\r\n\r\n', '\n\n', 'data: ', 'data: [DONE]\n\n', 'event: error\n', '0\r\n\r\n',
  'HTTP/1.1 200 OK\r\n', 'Content-Length: 5\r\n', 'Content-Length: 99999\r\n', 'Transfer-Encoding: chunked\r\n', 'Connection: close\r\n', '{"usage":{"completion_tokens":-1}}', 'x'.repeat(70_000)];

interface Script {
  template: number;
  bytes: Buffer;
  cuts: number[];
  end: 'end' | 'destroy' | 'open';
}
const scriptArb: fc.Arbitrary<Script> = fc
  .record({
    template: fc.nat(TEMPLATES.length - 1),
    bodyCuts: fc.array(fc.nat(), { maxLength: 4 }),
    mutations: fc.array(mutationArb(NASTY), { maxLength: 3 }),
    cuts: fc.array(fc.nat(), { maxLength: 4 }),
    end: fc.constantFrom('end', 'destroy', 'open'),
  })
  .map(({ template, bodyCuts, mutations, cuts, end }) => ({ template, bytes: Buffer.from(mutations.reduce(mutate, TEMPLATES[template]!.answer(bodyCuts)), 'latin1'), cuts, end }) as Script);

/** The answers to play, by the X-Script field of the request. */
const scripts = new Map<number, Script>();
let nextId = 0;

/** Plays the script a request names: its pieces 1 ms apart, then a FIN, a reset, or 150 ms of nothing and a FIN. */
async function answer(sock: net.Socket, s: Script | undefined): Promise<void> {
  if (s === undefined) return void sock.destroy();
  for (const p of pieces(s.bytes, s.cuts)) {
    if (sock.destroyed) return;
    sock.write(p);
    await sleep(1);
  }
  if (s.end === 'destroy') sock.resetAndDestroy();
  else if (s.end === 'end') sock.end();
  else setTimeout(() => sock.end(), 150);
}

let up: net.Server;
let proxy: RunningProxy;
const upSockets = new Set<net.Socket>();

beforeAll(async () => {
  up = net.createServer((sock) => {
    upSockets.add(sock);
    sock.on('close', () => upSockets.delete(sock));
    sock.on('error', () => {});
    let buf = Buffer.alloc(0);
    let busy = false;
    sock.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      // The proxy's requests are well-formed: a head, and a body of its Content-Length.
      const end = buf.indexOf('\r\n\r\n');
      if (busy || end < 0) return;
      const h = latin1(buf.subarray(0, end));
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(h)?.[1] ?? 0);
      if (buf.length < end + 4 + length) return;
      buf = buf.subarray(end + 4 + length);
      busy = true;
      void answer(sock, scripts.get(Number(/\r\nx-script: *(\d+)/i.exec(h)?.[1]))).then(() => (busy = false));
    });
  });
  await new Promise<void>((r) => up.listen(0, '127.0.0.1', r));
  proxy = await startTestProxy(`http://127.0.0.1:${(up.address() as AddressInfo).port}`, { timeouts: { response: 2, idle: 2 } });
});

afterAll(async () => {
  await proxy?.close();
  await new Promise<void>((r) => (up ? up.close(() => r()) : r()));
});

/** One request for the script on a new client connection: everything the proxy sent, or `hung` when it neither ended nor closed in 8 s. */
function request(s: Script): Promise<string> {
  const id = nextId++;
  scripts.set(id, s);
  const body = '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}';
  return new Promise((resolve) => {
    const sock = net.connect(Number(new URL(proxy.proxyUrl).port), '127.0.0.1', () =>
      sock.write(head([`POST ${TEMPLATES[s.template]!.path} HTTP/1.1`, 'Host: x', 'Content-Type: application/json', `Content-Length: ${body.length}`, `X-Script: ${id}`, 'Connection: close']) + body),
    );
    let text = '';
    const t = setTimeout(() => (sock.destroy(), resolve('hung')), 8000);
    sock.on('data', (d: Buffer) => (text += latin1(d)));
    sock.on('error', () => {});
    sock.on('close', () => {
      clearTimeout(t);
      scripts.delete(id);
      resolve(text);
    });
  });
}

/** A chunked body's payload, as far as its framing holds (a cut stream's too). */
function dechunk(b: string): string {
  let out = '';
  let i = 0;
  for (;;) {
    const eol = b.indexOf('\r\n', i);
    if (eol < 0) return out;
    const size = Number.parseInt(b.slice(i, eol).split(';')[0]!, 16);
    if (!(size > 0)) return out;
    out += b.slice(eol + 2, eol + 2 + size);
    i = eol + 2 + size + 2;
  }
}

/** Checks one exchange; returns the final status. */
function check(s: Script, text: string): number {
  const what = JSON.stringify(latin1(s.bytes).slice(0, 300));
  expect(text, what).not.toBe('hung');
  expect(text.startsWith('HTTP/1.1 '), `${what} -> ${JSON.stringify(text.slice(0, 200))}`).toBe(true);
  const final = text.replace(/^(?:HTTP\/1\.1 1\d\d[^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n)+/, '');
  const status = Number(final.slice(9, 12));
  const headEnd = final.indexOf('\r\n\r\n');
  const body = headEnd < 0 ? '' : final.slice(headEnd + 4);
  // The proxy's own answer (an upstream that broke before its head): its JSON error, named.
  const proxyError = (status === 502 || status === 504) && /^\{"error":\{"type":"[a-z_]+",.*"source":"llm-latency-proxy"\}\}$/.test(body);
  if (!proxyError) {
    // The body starts where the upstream's did: after one of its blank lines (LF LF or LF CR LF,
    // as the proxy's parser ends a head; which one depends on the mutations), as sent, or as
    // payload the proxy framed.
    const upstream = latin1(s.bytes);
    const framed = /\r\ntransfer-encoding: chunked\r\n/i.test(final.slice(0, headEnd + 2));
    const starts: number[] = [];
    for (const blank of ['\n\n', '\n\r\n']) for (let i = upstream.indexOf(blank); i >= 0; i = upstream.indexOf(blank, i + 1)) starts.push(i + blank.length);
    const payload = framed ? dechunk(body) : undefined;
    const forwarded = starts.some((k) => upstream.startsWith(body, k) || (payload !== undefined && upstream.startsWith(payload, k)));
    expect(forwarded, `${what} -> ${JSON.stringify(final.slice(0, 400))}`).toBe(true);
  }
  return status;
}

describe('any bytes from an upstream', () => {
  it('mutated answers of every framing, in pieces, closed, reset or left open: no throw, an HTTP/1.1 answer to every client, what is forwarded is the upstream\'s bytes, and the proxy serves on', async () => {
    const statuses: number[] = [];
    let runs = 0;
    const valid: Script = { template: 0, bytes: Buffer.from(TEMPLATES[0]!.answer([100, 2000]), 'latin1'), cuts: [], end: 'end' };
    await fc.assert(
      fc.asyncProperty(fc.array(scriptArb, { minLength: 1, maxLength: 3 }), async (batch) => {
        runs++;
        const texts = await Promise.all(batch.map(request));
        batch.forEach((s, i) => statuses.push(check(s, texts[i]!)));
        // A well-formed stream afterwards comes through whole, its chunk framing as the upstream's.
        // First every upstream connection of the batch is closed (each script ends its own): a
        // request sent on a kept-alive connection as the upstream closes it gets a 502, the race
        // every keep-alive pool has, which is not what this test is about.
        for (let i = 0; i < 150 && upSockets.size > 0; i++) await sleep(20);
        expect(upSockets.size).toBe(0);
        const ok = await request(valid);
        expect(check(valid, ok)).toBe(200);
        expect(ok.endsWith(latin1(valid.bytes).slice(latin1(valid.bytes).indexOf('\r\n\r\n') + 4))).toBe(true);
      }),
      { numRuns: 60 },
    );
    expect(runs).toBe(60);
    // The generator reached both outcomes: answers passed on, and the proxy's own 502s.
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThan(10);
    expect(statuses.filter((s) => s === 502).length).toBeGreaterThan(3);

    let active = -1;
    for (let i = 0; i < 100 && active !== 0; i++) {
      active = total(await scrape(proxy.metricsUrl), 'llm_proxy_streams_active');
      if (active !== 0) await sleep(50);
    }
    expect(active).toBe(0);
  });
});
