// What any upstream may send: answers of every framing the proxy reads (SSE chunked or to the
// close, Anthropic SSE, Ollama NDJSON, Bedrock's binary event stream, a JSON body, an error, a
// 100 Continue first), with bytes replaced, inserted, deleted or repeated, written in pieces,
// then closed, reset or left open a while. The proxy must never throw (vitest fails the run on
// an uncaught error in this process) and must answer every client in HTTP/1.1: with its own
// named 502/504 only when the answer was broken or reset, else with the upstream's status,
// Content-Type and body bytes as its head parser read them (a malformed stream too: chunk
// framing passed on as it came, a body read to the close framed by the proxy), perhaps cut
// short, and whole when the answer was whole; the end-to-end fields of the upstream's head
// passed on as they were and in order, no hop-by-hop one nor one its Connection names (RFC 9110
// §7.6.1). It must go on serving. Where the upstream's head ends is taken from the proxy's own
// parser (src/proxy/http1.ts): which blank line ends a mutated head is its choice, and the rest
// is checked against it.
import net, { type AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { chunked, mutate, mutationArb, writeInPieces } from '../helpers/byte-mutations.js';
import { fixture } from '../helpers/fixtures.js';
import { HOP_BY_HOP } from '../helpers/http.js';
import { settledLoad, startTestProxy } from '../helpers/proxy.js';
import { rawHeader } from '../../src/proxy/headers.js';
import { headEnd, parseResponseHead, type ResponseHead } from '../../src/proxy/http1.js';

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
  { path: '/v1/chat/completions', answer: (c) => head(['HTTP/1.1 200 OK', 'Content-Type: text/event-stream', 'Transfer-Encoding: chunked', 'Connection: X-Hop , X-Other', 'X-Hop: hop', 'Keep-Alive: timeout=77', 'X-Other: o', 'Proxy-Connection: x-pc', 'X-End: e2e']) + chunked(latin1(fixture('openai-chat-usage.sse')), c) },
  { path: '/v1/chat/completions', answer: () => head(['HTTP/1.1 200 OK', 'Content-Type: text/event-stream', 'Connection: close']) + latin1(fixture('openai-chat.sse')) },
  { path: '/v1/messages', answer: (c) => head(['HTTP/1.1 200 OK', 'Content-Type: text/event-stream', 'Transfer-Encoding: chunked']) + chunked(latin1(fixture('anthropic-messages.sse')), c) },
  { path: '/api/chat', answer: (c) => head(['HTTP/1.1 200 OK', 'Content-Type: application/x-ndjson', 'Transfer-Encoding: chunked']) + chunked(latin1(fixture('ollama-chat.ndjson')), c) },
  { path: '/model/m/converse-stream', answer: (c) => head(['HTTP/1.1 200 OK', 'Content-Type: application/vnd.amazon.eventstream', 'Transfer-Encoding: chunked']) + chunked(latin1(fixture('bedrock-converse-stream.bin')), c) },
  { path: '/v1/chat/completions', answer: () => head(['HTTP/1.1 200 OK', 'Content-Type: application/json', 'Upgrade: h2c', 'Connection: Upgrade', 'Trailer: X-T', `Content-Length: ${JSON_BODY.length}`, 'Set-Cookie: a=1', 'Set-Cookie: b=2']) + JSON_BODY },
  { path: '/v1/chat/completions', answer: () => head(['HTTP/1.1 429 Too Many Requests', 'Content-Type: application/json', 'Retry-After: 1', 'Proxy-Authenticate: Basic realm="up"', `Content-Length: ${ERROR_BODY.length}`]) + ERROR_BODY },
  { path: '/v1/chat/completions', answer: (c) => 'HTTP/1.1 100 Continue\r\n\r\n' + head(['HTTP/1.1 200 OK', 'Content-Type: text/event-stream', 'Transfer-Encoding: chunked']) + chunked(latin1(fixture('openai-chat.sse')), c) },
];

const NASTY = ['\r', '\n', '\r\n', '\0', ' ', ':', '0', 'ffffffffffffffff', ';ext=1', '\x80', '\xff', '\r\n\r\n', '\n\n', 'data: ', 'data: [DONE]\n\n', 'event: error\n', '0\r\n\r\n',
  'HTTP/1.1 200 OK\r\n', 'Content-Length: 5\r\n', 'Content-Length: 99999\r\n', 'Transfer-Encoding: chunked\r\n', 'Connection: close\r\n', '{"usage":{"completion_tokens":-1}}', 'x'.repeat(70_000)];

interface Script {
  template: number;
  bytes: Buffer;
  /** The mutations changed the template's bytes. */
  mutated: boolean;
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
  .map(({ template, bodyCuts, mutations, cuts, end }) => {
    const original = TEMPLATES[template]!.answer(bodyCuts);
    const text = mutations.reduce(mutate, original);
    return { template, bytes: Buffer.from(text, 'latin1'), mutated: text !== original, cuts, end } as Script;
  });

/** The answers to play, by the X-Script field of the request. */
const scripts = new Map<number, Script>();
let nextId = 0;

/** Plays the script a request names: its pieces 1 ms apart, then a FIN, a reset, or 150 ms of nothing and a FIN. */
async function answer(sock: net.Socket, s: Script | undefined): Promise<void> {
  if (s === undefined) return void sock.destroy();
  if (!(await writeInPieces(sock, s.bytes, s.cuts))) return;
  if (s.end === 'destroy') sock.resetAndDestroy();
  else if (s.end === 'end') sock.end();
  else setTimeout(() => sock.end(), 150);
}

let up: net.Server;
let proxy: RunningProxy;
const upSockets = new Set<net.Socket>();

beforeAll(async () => {
  up = net.createServer({ noDelay: true }, (sock) => {
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

/**
 * The payload of a chunked body the proxy framed itself (a body it read to the close): strict,
 * as far as it came (a cut stream's too). The upstream's own chunk framing is passed on as it
 * came, a lax one too (bare LF), and is compared as bytes instead.
 */
function dechunk(b: string): string {
  let payload = '';
  let i = 0;
  for (;;) {
    const eol = b.indexOf('\r\n', i);
    if (eol < 0) return payload;
    const m = /^([0-9a-fA-F]+)(;[^\r\n]*)?$/.exec(b.slice(i, eol));
    expect(m, `chunk-size line ${JSON.stringify(b.slice(i, eol + 2))}`).not.toBeNull();
    const size = Number.parseInt(m![1]!, 16);
    if (size === 0) return payload;
    const data = b.slice(eol + 2, eol + 2 + size);
    payload += data;
    if (data.length < size) return payload;
    const crlf = b.slice(eol + 2 + size, eol + 4 + size);
    if (crlf.length < 2) return payload;
    expect(crlf, 'CRLF after chunk data').toBe('\r\n');
    i = eol + 4 + size;
  }
}

/** The answer as the proxy reads it (its own head parser: 1xx skipped), or undefined where it reads none. */
function upstreamAnswer(bytes: Buffer): { head: ResponseHead; body: string } | undefined {
  let data = bytes;
  for (;;) {
    const end = headEnd(data);
    if (end < 0) return undefined;
    let head: ResponseHead;
    try {
      head = parseResponseHead(data.subarray(0, end));
    } catch {
      return undefined;
    }
    data = data.subarray(end);
    if (head.status === 101) return undefined;
    if (head.status >= 200) return { head, body: latin1(data) };
  }
}

const field = (headText: string, name: string) => new RegExp(`\r\n${name}: *([^\r\n]*)`, 'i').exec(headText)?.[1];

/** Fields the proxy sets itself (the framing, Connection), or adds when the upstream has none (Date). */
const OWN = new Set(['connection', 'transfer-encoding', 'content-length']);

/**
 * The upstream's end-to-end fields reach the client as they were, in order, with their names'
 * case; its hop-by-hop ones, and those its Connection names, do not; and the proxy adds none
 * but its own framing, Connection and Date.
 */
function checkFields(what: string, upHead: readonly string[], clientHead: string): void {
  const named = new Set<string>();
  for (let i = 0; i < upHead.length; i += 2) {
    if (upHead[i]!.toLowerCase() === 'connection') for (const t of upHead[i + 1]!.split(',')) named.add(t.trim().toLowerCase());
  }
  const expected: string[] = [];
  for (let i = 0; i < upHead.length; i += 2) {
    const n = upHead[i]!.toLowerCase();
    if (!OWN.has(n) && !HOP_BY_HOP.has(n) && !named.has(n)) expected.push(`${upHead[i]}: ${upHead[i + 1]}`);
  }
  const upDate = expected.some((l) => /^date:/i.test(l));
  const got = clientHead
    .split('\r\n')
    .slice(1)
    .filter((l) => l !== '' && !OWN.has(l.slice(0, l.indexOf(':')).toLowerCase()) && (upDate || !/^date:/i.test(l)));
  expect(got, what).toEqual(expected);
  // The client asked to close: the proxy's Connection says so, not the upstream's.
  expect(field(clientHead, 'connection'), what).toBe('close');
}

const LAST_CHUNK = '0\r\n\r\n';

/** Checks one exchange; returns the final status. */
function check(s: Script, text: string): number {
  const what = JSON.stringify(latin1(s.bytes).slice(0, 300));
  expect(text, what).not.toBe('hung');
  // No 1xx reaches the client (it sent no Expect): the proxy reads them and goes on.
  expect(/^HTTP\/1\.1 [2-5]\d\d /.test(text), `${what} -> ${JSON.stringify(text.slice(0, 200))}`).toBe(true);
  const status = Number(text.slice(9, 12));
  const end = text.indexOf('\r\n\r\n');
  expect(end, 'a whole head').toBeGreaterThan(0);
  const clientHead = text.slice(0, end + 2);
  const body = text.slice(end + 4);
  // The proxy's own answer (an upstream that broke before its head): its JSON error, named. Only
  // a broken answer, or one the upstream reset, may get it.
  if ((status === 502 || status === 504) && /^\{"error":\{"type":"[a-z_]+",.*"source":"llm-latency-proxy"\}\}$/.test(body)) {
    expect(s.mutated || s.end === 'destroy', `${what}: a whole answer got ${text.slice(0, 300)}`).toBe(true);
    return status;
  }
  // Else the upstream's answer as the proxy read it: its status and Content-Type, and its body from
  // the end of its head on, as sent (chunk framing and all), or as payload when the proxy frames
  // a body it read to the close; perhaps cut short.
  const up = upstreamAnswer(s.bytes);
  expect(up, `${what}: forwarded ${text.slice(0, 300)}`).toBeDefined();
  expect(status, what).toBe(up!.head.status);
  const upHead = up!.head.rawHeaders;
  expect(field(clientHead, 'content-type'), what).toBe(rawHeader(upHead, 'content-type'));
  checkFields(what, upHead, clientHead);
  const upChunked = rawHeader(upHead, 'transfer-encoding') !== undefined;
  const framedHere = !upChunked && /chunked/i.test(field(clientHead, 'transfer-encoding') ?? '');
  const payload = framedHere ? dechunk(body) : body;
  const length = field(clientHead, 'content-length');
  if (length !== undefined) expect(body.length, what).toBeLessThanOrEqual(Number(length));
  // The last chunk and trailers are the proxy's own (Node's ServerResponse writes `0\r\n\r\n`), where
  // the upstream's, mutated into a lax framing (bare LF, extensions, trailers), may differ: the
  // bytes before it are the upstream's, and the upstream did send a last chunk there.
  const ownEnd = upChunked && payload.endsWith(LAST_CHUNK) && !up!.body.startsWith(payload);
  const forwarded = ownEnd ? payload.slice(0, -LAST_CHUNK.length) : payload;
  expect(up!.body.startsWith(forwarded), `${what} -> ${JSON.stringify(text.slice(0, 400))}`).toBe(true);
  if (ownEnd) expect(up!.body.slice(forwarded.length), `${what}: the proxy ended a body the upstream did not`).toMatch(/^0+(?![0-9a-fA-F])[^\n]*\n/);
  // A whole answer the upstream did not reset comes whole.
  if (!s.mutated && s.end !== 'destroy') expect(payload, what).toBe(up!.body);
  return status;
}

/** Resolves once the upstream has no open connection (at most ~3 s, then fails). */
async function upstreamClosed(): Promise<void> {
  for (let i = 0; i < 150 && upSockets.size > 0; i++) await sleep(20);
  expect(upSockets.size).toBe(0);
}

describe('any bytes from an upstream', () => {
  it('mutated answers of every framing, in pieces, closed, reset or left open: no throw, an HTTP/1.1 answer to every client, the upstream\'s status, type and bytes forwarded, whole answers whole, and the proxy serves on', async () => {
    const statuses: number[] = [];
    let runs = 0;
    const valid: Script = { template: 0, bytes: Buffer.from(TEMPLATES[0]!.answer([100, 2000]), 'latin1'), mutated: false, cuts: [], end: 'end' };
    await fc.assert(
      fc.asyncProperty(fc.array(scriptArb, { minLength: 1, maxLength: 3 }), async (batch) => {
        runs++;
        // Every upstream connection of the run before is closed first (the probe's script ends its
        // own with a FIN right after its answer): a request sent on a kept-alive connection as the
        // upstream closes it gets a 502, the race every keep-alive pool has, which is not what this
        // test is about (it failed a whole answer so once, on a loaded machine).
        await upstreamClosed();
        const texts = await Promise.all(batch.map(request));
        batch.forEach((s, i) => statuses.push(check(s, texts[i]!)));
        // A well-formed stream afterwards comes through whole, its chunk framing as the upstream's,
        // once every upstream connection of the batch is closed (each script ends its own).
        await upstreamClosed();
        const ok = await request(valid);
        expect(check(valid, ok)).toBe(200);
        expect(ok.endsWith(latin1(valid.bytes).slice(latin1(valid.bytes).indexOf('\r\n\r\n') + 4))).toBe(true);
      }),
      { numRuns: 60 },
    );
    expect(runs).toBe(60);
    // The generator reached both outcomes: answers passed on, and the proxy's own 502s.
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThan(10);
    expect(statuses.filter((s) => s === 502).length).toBeGreaterThan(0);

    expect(await settledLoad(proxy)).toEqual({ active: 0, inFlight: 0 });
  });
});
