import { createHash, randomBytes } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import http2 from 'node:http2';
import net, { type AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { createGzip, gzipSync } from 'node:zlib';
import Anthropic from '@anthropic-ai/sdk';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { API_BY_NAME } from '../../src/providers/detect.js';
import { fixture } from '../helpers/fixtures.js';
import { rawRequest } from '../helpers/http.js';
import { startTestProxy } from '../helpers/proxy.js';
import { hist, parseProm, scrape, total } from '../helpers/prom.js';

type Handler = (req: IncomingMessage, res: ServerResponse, body: Buffer) => void;

/** A loopback upstream whose behaviour each test scripts. */
async function upstream(handler: Handler) {
  const seen: { method?: string; url?: string; rawHeaders: string[]; body: Buffer }[] = [];
  const sockets = new Set<net.Socket>();
  const server = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (d: Buffer) => parts.push(d));
    req.on('end', () => {
      const body = Buffer.concat(parts);
      seen.push({ method: req.method, url: req.url, rawHeaders: req.rawHeaders, body });
      handler(req, res, body);
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    server,
    sockets,
    close: () => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** Scrapes until a request for `model` has been recorded (the record follows the response's end), for 2 s at most. */
async function scrapeOnceRecorded(metricsUrl: string, model: string) {
  let samples = await scrape(metricsUrl);
  for (let i = 0; i < 100 && total(samples, 'llm_proxy_streams_total', { gen_ai_request_model: model }) === 0; i++) {
    await sleep(20);
    samples = await scrape(metricsUrl);
  }
  return samples;
}

let proxy: RunningProxy | undefined;
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
  for (const c of cleanups.splice(0)) await c();
});

describe('transparent forwarding', () => {
  it('forwards method, path, query, headers and body; rewrites Host; drops hop-by-hop request fields', async () => {
    const up = await upstream((_req, res) => res.end('ok'));
    cleanups.push(up.close);
    proxy = await startTestProxy(`${up.url}/base`);
    const body = randomBytes(300_000);
    const r = await rawRequest(proxy.proxyUrl, '/v1/some/path?a=1&b=%20x', {
      method: 'PATCH',
      headers: { 'X-Custom': 'yes', 'X-Empty': '', Authorization: 'Bearer sk-test', Connection: 'X-Drop', 'X-Drop': 'gone', 'Keep-Alive': 'timeout=1', 'content-type': 'application/octet-stream' },
      body,
    });
    expect(r.status).toBe(200);
    const s = up.seen[0]!;
    expect(s.method).toBe('PATCH');
    expect(s.url).toBe('/base/v1/some/path?a=1&b=%20x');
    expect(sha(s.body)).toBe(sha(body));
    const names = s.rawHeaders.filter((_, i) => i % 2 === 0).map((n) => n.toLowerCase());
    expect(names).toContain('x-custom');
    // An empty value is a field all the same (`Accept-Encoding:` means identity only).
    expect(names).toContain('x-empty');
    expect(s.rawHeaders[s.rawHeaders.findIndex((n, i) => i % 2 === 0 && n.toLowerCase() === 'x-empty') + 1]).toBe('');
    expect(names).toContain('authorization');
    expect(names).not.toContain('x-drop');
    expect(names).not.toContain('keep-alive');
    const host = s.rawHeaders[s.rawHeaders.findIndex((n, i) => i % 2 === 0 && n.toLowerCase() === 'host') + 1];
    expect(host).toBe(new URL(up.url).host);
    expect(names).toContain('x-forwarded-for');
  });

  it('streams the body byte-identical, keeps status and end-to-end headers (repeated Set-Cookie), drops hop-by-hop ones', async () => {
    const payload = Buffer.concat([Buffer.from('data: {"x":"°"}\n\n'), randomBytes(200_000), Buffer.from('\r\n\r\n:\n\n')]);
    const up = await upstream(async (_req, res) => {
      res.writeHead(207, 'Multi', ['Content-Type', 'text/event-stream', 'Set-Cookie', 'a=1', 'Set-Cookie', 'b=2', 'X-Upstream', 'u', 'X-Empty', '', 'Connection', 'X-Secret', 'X-Secret', 's', 'Keep-Alive', 'timeout=5']);
      for (let i = 0; i < payload.length; i += 777) {
        res.write(payload.subarray(i, i + 777));
        if (i % (777 * 50) === 0) await sleep(1);
      }
      res.end();
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const r = await rawRequest(proxy.proxyUrl, '/v1/chat/completions', { method: 'POST', body: Buffer.from('{"model":"m","stream":true}') });
    expect(r.status).toBe(207);
    expect(r.res.statusMessage).toBe('Multi');
    expect(sha(r.body)).toBe(sha(payload));
    const pairs: [string, string][] = [];
    for (let i = 0; i < r.rawHeaders.length; i += 2) pairs.push([r.rawHeaders[i]!.toLowerCase(), r.rawHeaders[i + 1]!]);
    expect(pairs.filter(([n]) => n === 'set-cookie').map(([, v]) => v)).toEqual(['a=1', 'b=2']);
    expect(pairs.find(([n]) => n === 'x-upstream')?.[1]).toBe('u');
    expect(pairs.find(([n]) => n === 'x-empty')?.[1]).toBe('');
    expect(pairs.some(([n]) => n === 'x-secret' || n === 'keep-alive')).toBe(false);
  });

  it('an HTTP/1.0 client gets a chunked stream unframed, to the close, and its events are measured; also when it offers TE: chunked', async () => {
    // Eight events per tick, each its own HTTP chunk: one read holds several, and the proxy,
    // which cannot pass the chunk framing on to HTTP/1.0, writes each payload piece.
    const event = (k: number) => `data: {"id":"c","choices":[{"index":0,"delta":{"content":"t${k}"}}]}\n\n`;
    const events = Array.from({ length: 24 }, (_, k) => event(k));
    const up = await upstream(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (let i = 0; i < events.length; i += 8) {
        for (const e of events.slice(i, i + 8)) res.write(e);
        await sleep(20);
      }
      res.end();
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const body = '{"model":"m","stream":true}';
    /** An HTTP/1.0 exchange read to the close: its head (lower case) and body. */
    const http10 = async (port: string, request: string) => {
      const raw = await new Promise<Buffer>((resolve, reject) => {
        const parts: Buffer[] = [];
        const s = net.connect(Number(port), '127.0.0.1', () => s.write(request));
        s.on('data', (d: Buffer) => parts.push(d));
        s.on('end', () => resolve(Buffer.concat(parts)));
        s.on('error', reject);
      });
      const sep = raw.indexOf('\r\n\r\n');
      return { head: raw.subarray(0, sep).toString('latin1').toLowerCase(), body: raw.subarray(sep + 4).toString() };
    };
    // RFC 9112 §6.1: no Transfer-Encoding to HTTP/1.0, even to a client whose TE offers chunked
    // (Node's server would chunk the answer then).
    // With keep-alive asked for too: a stream of unknown length must still end with the close.
    for (const [n, te] of ['', 'TE: chunked\r\nConnection: TE\r\n', 'TE: chunked\r\nConnection: keep-alive, TE\r\n'].entries()) {
      const { head, body: got } = await http10(new URL(proxy.proxyUrl).port, `POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\n${te}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
      expect(head.startsWith('http/1.1 200'), te).toBe(true);
      expect(head, te).not.toContain('transfer-encoding');
      expect(head, te).toContain('connection: close');
      expect(got, te).toBe(events.join(''));
      const samples = await scrape(proxy.metricsUrl);
      expect(hist(samples, 'gen_ai_client_operation_time_to_first_chunk_seconds').count, te).toBe(n + 1);
      expect(hist(samples, 'gen_ai_client_operation_time_per_output_chunk_seconds').count, te).toBe((n + 1) * (events.length - 1));
    }
  });

  it('a request pipelined behind an HTTP/1.0 stream, whose answer could never be delivered, is not sent upstream', async () => {
    // HTTP/1.0 with keep-alive: the stream has no length, so it is delimited by the close, and
    // the request behind it never has the connection for its answer.
    const up = await upstream(async (req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const slow = req.url!.includes('slow');
      for (let k = 0; k < (slow ? 6 : 2); k++) {
        res.write(`data: {"id":"c","choices":[{"index":0,"delta":{"content":"t${k}"}}]}\n\n`);
        await sleep(slow ? 40 : 1);
      }
      res.end('data: [DONE]\n\n');
    });
    cleanups.push(up.close);
    const logLines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(up.url, {}, { logLevel: 'info', logLines });
    const { port } = new URL(proxy.proxyUrl);
    const req = (path: string, model: string) => {
      const body = `{"model":"${model}","stream":true}`;
      return `POST ${path} HTTP/1.0\r\nHost: x\r\nX-Request-Id: ${model}\r\nConnection: keep-alive\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
    };
    const raw = await new Promise<string>((resolve, reject) => {
      const parts: Buffer[] = [];
      const s = net.connect(Number(port), '127.0.0.1', () => s.write(req('/v1/chat/completions?slow', 'm-first') + req('/v1/chat/completions', 'm-queued')));
      s.on('data', (d: Buffer) => parts.push(d));
      s.on('close', () => resolve(Buffer.concat(parts).toString('latin1')));
      s.on('error', reject);
    });
    expect(raw.match(/^HTTP\/1\.1 /gm)).toHaveLength(1); // only the first answer was delivered
    const samples = await scrapeOnceRecorded(proxy.metricsUrl, 'm-first');
    expect(total(samples, 'llm_proxy_streams_total', { gen_ai_request_model: 'm-first', outcome: 'ok' })).toBe(1);
    // Never sent: the upstream did not have it, and no provider latency was measured for it.
    expect(up.seen.map((x) => x.url)).toEqual(['/v1/chat/completions?slow']);
    expect(total(samples, 'llm_proxy_streams_total', { gen_ai_request_model: 'm-queued' })).toBe(0);
    for (let i = 0; i < 100 && logLines.length < 2; i++) await sleep(20);
    expect(logLines.filter((l) => l.msg === 'request').map((l) => [l.reqId, l.outcome])).toEqual([
      ['m-first', 'ok'],
      ['m-queued', 'cancelled'],
    ]);
  });

  it('a request pipelined behind a long stream is sent when its answer has the connection, and timed from there', async () => {
    let streamEnded = 0;
    let behindArrived = 0;
    const up = await upstream(async (req, res) => {
      if (req.url!.includes('slow')) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        for (let k = 0; k < 10; k++) {
          res.write(`data: {"id":"a","choices":[{"index":0,"delta":{"content":"t${k}"}}]}\n\n`);
          await sleep(50);
        }
        streamEnded = performance.now();
        res.end('data: [DONE]\n\n');
      } else {
        behindArrived = performance.now();
        const b = JSON.stringify({ id: 'b', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'hi' } }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } });
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(b) });
        res.end(b);
      }
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const { port } = new URL(proxy.proxyUrl);
    const req = (path: string, body: string) => `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
    const raw = await new Promise<string>((resolve, reject) => {
      const parts: Buffer[] = [];
      const s = net.connect(Number(port), '127.0.0.1', () =>
        s.write(req('/v1/chat/completions?slow', '{"model":"m-stream","stream":true}') + req('/v1/chat/completions', '{"model":"m-behind"}')),
      );
      s.on('data', (d: Buffer) => {
        parts.push(d);
        if (Buffer.concat(parts).toString().includes('"id":"b"')) s.end();
      });
      s.on('close', () => resolve(Buffer.concat(parts).toString('latin1')));
      s.on('error', reject);
    });
    expect(raw.match(/^HTTP\/1\.1 200/gm)).toHaveLength(2);
    const samples = await scrapeOnceRecorded(proxy.metricsUrl, 'm-behind');
    expect(total(samples, 'llm_proxy_streams_total', { gen_ai_request_model: 'm-behind', outcome: 'ok' })).toBe(1);
    const stream = hist(samples, 'gen_ai_client_operation_duration_seconds', { gen_ai_request_model: 'm-stream' });
    const behind = hist(samples, 'gen_ai_client_operation_duration_seconds', { gen_ai_request_model: 'm-behind' });
    expect(stream.sum).toBeGreaterThan(0.45); // ten events 50 ms apart
    expect(behind.sum).toBeLessThan(stream.sum / 2); // its wait behind the stream is not the provider's
    expect(behindArrived).toBeGreaterThanOrEqual(streamEnded); // one upstream exchange per client connection at a time
  });

  it('a burst of pipelined requests is forwarded one at a time, each answered in order, with no listener build-up', async () => {
    let active = 0;
    let most = 0;
    const up = await upstream(async (req, res) => {
      most = Math.max(most, ++active);
      await sleep(5);
      active--;
      const b = JSON.stringify({ id: req.url, object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'hi' } }] });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(b) });
      res.end(b);
    });
    cleanups.push(up.close);
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.name);
    process.on('warning', onWarning);
    try {
      proxy = await startTestProxy(up.url);
      const { port } = new URL(proxy.proxyUrl);
      const n = 30;
      let all = '';
      for (let i = 0; i < n; i++) all += `POST /v1/chat/completions?n=${i} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`;
      const raw = await new Promise<string>((resolve, reject) => {
        const parts: Buffer[] = [];
        const s = net.connect(Number(port), '127.0.0.1', () => s.write(all));
        s.on('data', (d: Buffer) => {
          parts.push(d);
          if (Buffer.concat(parts).toString().includes(`?n=${n - 1}"`)) s.end();
        });
        s.on('close', () => resolve(Buffer.concat(parts).toString('latin1')));
        s.on('error', reject);
      });
      expect([...raw.matchAll(/"id":"\/v1\/chat\/completions\?n=(\d+)"/g)].map((m) => Number(m[1]))).toEqual([...Array(n).keys()]);
      expect(most).toBe(1);
      await sleep(20); // a warning is emitted on the next tick
      expect(warnings).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });

  it('passes a gzip body through compressed, with its Content-Encoding', async () => {
    const plain = Buffer.from('data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'.repeat(100));
    const gz = gzipSync(plain);
    const up = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'content-encoding': 'gzip' });
      res.end(gz);
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const r = await rawRequest(proxy.proxyUrl, '/v1/chat/completions', { method: 'POST', headers: { 'accept-encoding': 'gzip' }, body: Buffer.from('{}') });
    expect(sha(r.body)).toBe(sha(gz));
    expect(r.rawHeaders.map((h) => h.toLowerCase())).toContain('gzip');
  });

  it('reads the coding from every Content-Encoding field: `identity` first and `gzip` after is compressed, and not parsed', async () => {
    const plain = 'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n';
    // The body is plain, so a meter that read only the first field would time its first token.
    const up = await upstream((req, res) => {
      const second = req.url!.includes('gzip') ? 'gzip' : 'none';
      res.writeHead(200, ['Content-Type', 'text/event-stream', 'Content-Encoding', 'identity', 'Content-Encoding', second]);
      res.end(plain);
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    for (const path of ['/v1/chat/completions?gzip', '/v1/chat/completions?plain']) {
      const r = await rawRequest(proxy.proxyUrl, path, { method: 'POST', body: Buffer.from('{}') });
      expect(r.body.toString()).toBe(plain);
    }
    const samples = await scrape(proxy.metricsUrl);
    expect(hist(samples, 'gen_ai_client_operation_duration_seconds').count).toBe(2);
    expect(hist(samples, 'gen_ai_client_operation_time_to_first_chunk_seconds').count).toBe(1); // the `identity, none` one
  });

  it('asks a recognised LLM API for identity encoding, so that a server that compresses when asked (as Anthropic does) is still measured', async () => {
    // The Anthropic fixture, one event per 20 ms, gzip-compressed and flushed per event when the request accepts gzip.
    const events = fixture('anthropic-messages.sse').toString('utf8').split(/(?<=\n\n)/);
    const texts = events.flatMap((e) => [...e.matchAll(/"text_delta","text":"((?:[^"\\]|\\.)*)"/g)].map((m) => JSON.parse(`"${m[1]}"`) as string));
    expect(texts.length).toBe(5);
    const up = await upstream(async (req, res) => {
      const gzip = /\bgzip\b/.test(req.headers['accept-encoding'] ?? '');
      res.writeHead(200, { 'content-type': 'text/event-stream', ...(gzip ? { 'content-encoding': 'gzip' } : {}) });
      const z = gzip ? createGzip() : undefined;
      z?.on('data', (d: Buffer) => res.write(d));
      for (const e of events) {
        if (z) await new Promise<void>((r) => { z.write(e); z.flush(() => r()); });
        else res.write(e);
        await sleep(20);
      }
      if (z) await new Promise<void>((r) => z.end(r));
      res.end();
    });
    cleanups.push(up.close);
    const stream = async () => {
      const client = new Anthropic({ apiKey: 'k', baseURL: proxy!.proxyUrl, maxRetries: 0 });
      const got: string[] = [];
      for await (const ev of await client.messages.create({ model: 'claude-x', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }], stream: true })) {
        if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') got.push(ev.delta.text);
      }
      return got;
    };
    const acceptSeen = () => {
      const h = up.seen.at(-1)!.rawHeaders;
      return h.filter((_, i) => i % 2 === 1 && h[i - 1]!.toLowerCase() === 'accept-encoding');
    };

    proxy = await startTestProxy(up.url);
    expect(await stream()).toEqual(texts);
    expect(acceptSeen()).toEqual(['identity']);
    let samples = await scrape(proxy.metricsUrl);
    expect(hist(samples, 'gen_ai_client_operation_time_to_first_chunk_seconds').count).toBe(1);
    expect(hist(samples, 'gen_ai_client_operation_time_per_output_chunk_seconds').count).toBe(texts.length - 1);
    // Left as the client sent them: an API the proxy does not know (nothing of it would be read),
    // a request that is not a generation call, no header at all, a SigV4 signature over the header.
    const post = (path: string, headers: Record<string, string>, method = 'POST') => rawRequest(proxy!.proxyUrl, path, { method, headers, body: method === 'POST' ? Buffer.from('{}') : undefined });
    await post('/v1/other', { 'accept-encoding': 'gzip' });
    expect(acceptSeen()).toEqual(['gzip']);
    await post('/v1/chat/completions', { 'accept-encoding': 'gzip' }, 'GET');
    expect(acceptSeen()).toEqual(['gzip']);
    // A GET that resumes a background response's stream is a generation call's stream.
    await post('/v1/responses/resp_abc?stream=true&starting_after=3', { 'accept-encoding': 'gzip' }, 'GET');
    expect(acceptSeen()).toEqual(['identity']);
    await post('/v1/chat/completions', {});
    expect(acceptSeen()).toEqual([]);
    // The rewritten field keeps its place and its name's bytes; repeats become one.
    await post('/v1/chat/completions', { 'X-First': '1', 'Accept-Encoding': 'gzip, deflate', 'X-Last': '2' });
    const names = up.seen.at(-1)!.rawHeaders.filter((_, i) => i % 2 === 0);
    expect(names.filter((n) => ['X-First', 'Accept-Encoding', 'X-Last'].includes(n))).toEqual(['X-First', 'Accept-Encoding', 'X-Last']);
    expect(acceptSeen()).toEqual(['identity']);
    const sigv4 = 'AWS4-HMAC-SHA256 Credential=AKID/20261130/us-east-1/bedrock/aws4_request, SignedHeaders=accept-encoding;host;x-amz-date, Signature=abc';
    await post('/model/m/converse-stream', { 'accept-encoding': 'gzip', authorization: sigv4 });
    expect(acceptSeen()).toEqual(['gzip']);
    await post('/model/m/converse-stream?X-Amz-SignedHeaders=accept-encoding%3Bhost', { 'accept-encoding': 'gzip' });
    expect(acceptSeen()).toEqual(['gzip']);
    await post('/model/m/converse-stream', { 'accept-encoding': 'gzip', authorization: sigv4.replace('accept-encoding;', '') });
    expect(acceptSeen()).toEqual(['identity']);
    await proxy.close();

    // Metrics off: nothing to read, nothing changed.
    proxy = await startTestProxy(up.url, {}, { metricsEnabled: false });
    await post('/v1/chat/completions', { 'accept-encoding': 'gzip' });
    expect(acceptSeen()).toEqual(['gzip']);
    await proxy.close();

    // Turned off: the client's own value goes upstream, the compressed stream passes untouched and is only timed.
    proxy = await startTestProxy(up.url, { metrics: { identityEncoding: false } });
    expect(await stream()).toEqual(texts);
    expect(acceptSeen()[0]).toMatch(/gzip/);
    samples = await scrape(proxy.metricsUrl);
    expect(hist(samples, 'gen_ai_client_operation_time_to_first_chunk_seconds').count).toBe(0);
    expect(hist(samples, 'gen_ai_client_operation_duration_seconds').count).toBe(1);
  });

  it('forwards a malformed stream byte-for-byte and keeps serving', async () => {
    const garbage = Buffer.concat([Buffer.from('data: {not json\n\n\r\r\revent:\xff\xfe\n'), randomBytes(50_000), Buffer.from([0xef, 0xbb])]);
    const up = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(garbage);
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    for (let i = 0; i < 3; i++) {
      const r = await rawRequest(proxy.proxyUrl, '/v1/chat/completions', { method: 'POST', body: Buffer.from('{"model":"m"}') });
      expect(sha(r.body)).toBe(sha(garbage));
    }
    const samples = await scrape(proxy.metricsUrl);
    expect(hist(samples, 'gen_ai_client_operation_duration_seconds').count).toBe(3);
  });

  it('never lets an absolute-form target or Host header choose the destination', async () => {
    const up = await upstream((_req, res) => res.end('from-configured-upstream'));
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const port = Number(new URL(proxy.proxyUrl).port);
    const reply = await new Promise<string>((resolve, reject) => {
      const s = net.connect(port, '127.0.0.1', () => {
        s.write('GET http://evil.example/latest/meta-data HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n');
      });
      let data = '';
      s.on('data', (d) => (data += d.toString()));
      s.on('end', () => resolve(data));
      s.on('error', reject);
    });
    expect(reply).toContain('from-configured-upstream');
    expect(up.seen[0]!.url).toBe('/latest/meta-data');
  });
});

describe('requests the proxy does not forward', () => {
  /** Raw bytes on a new connection; everything the proxy sent until it closed (or 2 s passed). */
  async function exchange(url: string, bytes: string): Promise<{ text: string; closed: boolean }> {
    const u = new URL(url);
    return new Promise((resolve) => {
      const s = net.connect(Number(u.port), u.hostname, () => s.write(bytes));
      let text = '';
      s.on('data', (d: Buffer) => (text += d.toString('latin1')));
      s.on('error', () => {});
      const t = setTimeout(() => (s.destroy(), resolve({ text, closed: false })), 2000);
      s.on('close', () => (clearTimeout(t), resolve({ text, closed: true })));
    });
  }

  it('answers its own refusals (upgrades and CONNECT too) with one request log line each, and a 1.0 request with Transfer-Encoding or two Host fields with a 400 and a close', async () => {
    const up = await upstream((_req, res) => res.end('ok'));
    cleanups.push(up.close);
    const logLines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(undefined, { routes: [{ prefix: '/v1', upstream: up.url }] }, { logLevel: 'info', logLines });
    const after = 'GET /v1/after HTTP/1.1\r\nHost: x\r\n\r\n'; // pipelined behind each: must not be forwarded
    const ws = 'Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n';
    const cases: [string, string, number, string][] = [
      ['no route', 'GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', 404, 'no_route'],
      ['dot segment', 'GET /v1/%2e%2e/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', 400, 'invalid_path'],
      ['gzip coding', 'POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n' + after, 501, 'unsupported_transfer_encoding'],
      ['TE in 1.0', 'POST /v1/x HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n' + after, 400, 'invalid_framing'],
      ['two hosts', 'GET /v1/x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n' + after, 400, 'invalid_host'],
      ['no Host in 1.1', 'GET /v1/x HTTP/1.1\r\nX-A: 1\r\n\r\n' + after, 400, 'invalid_host'],
      ['HTTP/2.0 on a request line', 'GET /v1/x HTTP/2.0\r\nHost: x\r\n\r\n', 505, 'http_version_not_supported'],
      // It would echo the request, credentials included (RFC 9110 §9.3.8; nginx: 405).
      ['TRACE', 'TRACE /v1/x HTTP/1.1\r\nHost: x\r\nMax-Forwards: 0\r\nAuthorization: Bearer sk-x\r\nConnection: close\r\n\r\n', 405, 'method_not_allowed'],
      // A credential in an absolute-form target (RFC 3986 §3.2.1) is never logged.
      ['userinfo', 'GET http://user:s3cret@h/nowhere HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n', 404, 'no_route'],
      ['upgrade, no route', `GET /nowhere HTTP/1.1\r\nHost: x\r\n${ws}\r\n`, 404, 'no_route'],
      // Not a WebSocket upgrade (served as HTTP/1.1); its log line keeps 100 characters of the
      // Upgrade field, not up to the head's 16 KiB.
      ['a long Upgrade field', `GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: ${'w'.repeat(8000)}\r\n\r\n`, 404, 'no_route'],
      ['upgrade, dot segment', `GET /v1/../x HTTP/1.1\r\nHost: x\r\n${ws}\r\n`, 400, 'invalid_path'],
      ['upgrade with a body', `GET /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n${ws}\r\n{}`, 400, 'invalid_upgrade'],
      ['upgrade, no Host', `GET /v1/x HTTP/1.1\r\n${ws}\r\n`, 400, 'invalid_host'],
      ['upgrade in HTTP/1.0', `GET /v1/x HTTP/1.0\r\n${ws}\r\n`, 400, 'invalid_upgrade'],
      // An opening handshake is a GET (RFC 6455 §4.1): a TRACE with upgrade headers is no way round the refusal.
      ['upgrade, TRACE', `TRACE /v1/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-x\r\n${ws}\r\n`, 405, 'method_not_allowed'],
      ['CONNECT', 'CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n', 405, 'method_not_allowed'],
      // Refused by the HTTP adapter before the router: a Host no URL can hold, a backslash in the path.
      ['unparsable Host', 'GET /v1/x HTTP/1.1\r\nHost: a b\r\n\r\n' + after, 400, 'invalid_request'],
      ['backslash', 'GET /v1\\x HTTP/1.1\r\nHost: x\r\n\r\n' + after, 400, 'invalid_request'],
    ];
    for (const [name, bytes, status, type] of cases) {
      const r = await exchange(proxy.proxyUrl, bytes);
      expect(r.text, name).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `));
      expect(r.text, name).toContain(`"type":"${type}"`);
      expect(r.closed, name).toBe(true);
      expect(r.text.match(/^HTTP\/1\.1 /gm), name).toHaveLength(1);
      if (status === 405) expect(r.text, name).toMatch(name.startsWith('upgrade') ? /\r\nallow: GET\r\n/i : /\r\nallow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS\r\n/i);
    }
    expect(up.seen).toEqual([]);
    for (let i = 0; i < 100 && logLines.length < cases.length + 5; i++) await sleep(20);
    const lines = logLines.filter((l) => l.msg === 'request');
    expect(lines.filter((l) => l.outcome === 'refused').map((l) => [l.status, l.errorType])).toEqual(cases.map(([, , status, type]) => [status, type]));
    expect(JSON.stringify(logLines)).not.toContain('s3cret');
    expect(lines.find((l) => l.errorType === 'no_route' && l.method === 'GET' && String(l.path).startsWith('http'))?.path).toBe('http://h/nowhere');
    expect(lines.filter((l) => l.upgrade === 'websocket').length).toBe(6);
    expect(lines.filter((l) => String(l.upgrade).startsWith('www')).map((l) => l.upgrade)).toEqual(['w'.repeat(100)]);
    // The requests pipelined behind a refusal that closes: logged as dropped unsent, never forwarded.
    expect(lines.filter((l) => l.outcome !== 'refused').map((l) => [l.path, l.outcome, l.status])).toEqual(Array(6).fill(['/after', 'cancelled', undefined]));
    // The metrics port keeps Node's own answer to an HTTP/1.1 request without Host.
    expect((await exchange(proxy.metricsUrl, 'GET /metrics HTTP/1.1\r\n\r\n')).text).toMatch(/^HTTP\/1\.1 400 /);
    // HTTP/1.0 had no Host field: such a request is forwarded (with the upstream's Host).
    const old = await exchange(proxy.proxyUrl, 'GET /v1/ten HTTP/1.0\r\n\r\n');
    expect(old.text).toMatch(/^HTTP\/1\.1 200 /);
    expect(up.seen.map((r) => [r.url, r.rawHeaders[r.rawHeaders.findIndex((n, i) => i % 2 === 0 && n.toLowerCase() === 'host') + 1]])).toEqual([['/ten', new URL(up.url).host]]); // the route's prefix is its own
    expect(lines.filter((l) => l.errorType === 'invalid_request').map((l) => [l.err, l.method, l.path, typeof l.reqId])).toEqual([
      ['Invalid URL', 'GET', '/v1/x', 'string'],
      ['Backslash in request path', 'GET', '/v1\\x', 'string'],
    ]);
  });

  it("what Node's parser refuses gets Node's status in the proxy's JSON and one log line, and nothing goes upstream", async () => {
    const up = await upstream((_req, res) => res.end('ok'));
    cleanups.push(up.close);
    const logLines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(undefined, { routes: [{ prefix: '/v1', upstream: up.url }] }, { logLevel: 'info', logLines });
    const after = 'GET /v1/after HTTP/1.1\r\nHost: x\r\n\r\n'; // behind each: never parsed, never forwarded
    const clientHello = Buffer.from('160301002c010000280303', 'hex').toString('latin1') + 'x'.repeat(40);
    const cases: [string, string, number, string, RegExp][] = [
      ['not HTTP', 'HELLO WORLD\r\n\r\n' + after, 400, 'invalid_http', /Invalid method/],
      ['TLS on the plain port', clientHello, 400, 'invalid_http', /TLS handshake/],
      ['two lengths', 'POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}' + after, 400, 'invalid_http', /Duplicate Content-Length/],
      ['head over 16 KiB', `GET /v1/x HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n` + after, 431, 'header_too_large', /16384 bytes/],
    ];
    for (const [name, bytes, status, type] of cases) {
      const r = await exchange(proxy.proxyUrl, bytes);
      expect(r.text, name).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `));
      expect(JSON.parse(r.text.slice(r.text.indexOf('\r\n\r\n') + 4)).error.type, name).toBe(type);
      expect(r.closed, name).toBe(true);
      expect(r.text.match(/^HTTP\/1\.1 /gm), name).toHaveLength(1);
    }
    // HTTP/2 with prior knowledge (Node's own HTTP/2 client, as httpx's http2=True): answered in
    // HTTP/2, a GOAWAY with HTTP_1_1_REQUIRED and the reason, which such a client can read.
    const goaway = await new Promise<{ code: number; reason: string }>((resolve, reject) => {
      const session = http2.connect(proxy!.proxyUrl);
      session.on('goaway', (code: number, _last: number, data?: Buffer) => resolve({ code, reason: data?.toString('latin1') ?? '' }));
      session.on('error', () => {});
      session.on('close', () => reject(new Error('closed without a GOAWAY')));
      session.request({ ':path': '/v1/x' }).on('error', () => {});
    });
    expect(goaway).toEqual({ code: http2.constants.NGHTTP2_HTTP_1_1_REQUIRED, reason: 'HTTP/2 with prior knowledge is not served: HTTP/1.1 only' });
    // A client that closes half-way through its head: nothing to answer, a cancelled line.
    const half = await new Promise<string>((resolve) => {
      const u = new URL(proxy!.proxyUrl);
      const s = net.connect(Number(u.port), u.hostname, () => s.end('GET /v1/x HTTP/1.1\r\nHost: x\r\n'));
      let text = '';
      s.on('data', (d: Buffer) => (text += d.toString('latin1')));
      s.on('error', () => {});
      s.on('close', () => resolve(text));
    });
    expect(half).toBe('');
    expect(up.seen).toEqual([]);
    for (let i = 0; i < 100 && logLines.filter((l) => l.msg === 'request').length < cases.length + 2; i++) await sleep(20);
    const lines = logLines.filter((l) => l.msg === 'request');
    expect(lines.map((l) => [l.status, l.outcome, l.errorType, l.answerCut])).toEqual([
      ...cases.map(([, , status, type]) => [status, 'refused', type, undefined]),
      [400, 'refused', 'invalid_http', undefined],
      [undefined, 'cancelled', 'client_cancelled', undefined],
    ]);
    expect(lines[cases.length]!.err).toMatch(/HTTP\/2 with prior knowledge/);
    cases.forEach(([name, , , , reason], i) => expect(lines[i]!.err, name).toMatch(reason));
  });

  it('a client that closes half-way through a body, or sends what is not HTTP behind a request, adds no line of its own to the request it cut; a refused body of a request in flight is told on its own line', async () => {
    // Answers as soon as the head is in (the test helper's upstream waits for the whole body).
    const early = http.createServer((req, res) => {
      req.resume();
      if (req.url!.startsWith('/early')) return void res.writeHead(413, { 'content-type': 'application/json' }).end('{"error":"too big"}');
      if (req.url!.startsWith('/stream')) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n');
      }
    });
    await new Promise<void>((r) => early.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise<void>((r) => { early.closeAllConnections(); early.close(() => r()); }));
    const up = { url: `http://127.0.0.1:${(early.address() as AddressInfo).port}` };
    const logLines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(undefined, { routes: [{ prefix: '/v1', upstream: up.url }] }, { logLevel: 'info', logLines });
    const u = new URL(proxy.proxyUrl);
    /** Writes `first`, then, once `ready(text)`, either half-closes (FIN) or writes `then`. */
    const session = (first: string, ready: (text: string) => boolean, then?: string) =>
      new Promise<string>((resolve) => {
        const s = net.connect(Number(u.port), u.hostname, () => s.write(first));
        let text = '';
        let sent = false;
        const check = () => {
          if (sent || !ready(text)) return;
          sent = true;
          if (then === undefined) s.end();
          else s.write(then);
        };
        s.on('data', (d: Buffer) => ((text += d.toString('latin1')), check()));
        s.on('error', () => {});
        s.on('close', () => resolve(text));
        setTimeout(check, 100);
        setTimeout(() => s.destroy(), 3000);
      });
    const upload = (path: string) => `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789`;
    // Refused (no route), then the client gives up the rest of its body.
    expect(await session(upload('/nowhere'), (t) => t.includes('no_route'))).toMatch(/^HTTP\/1\.1 404 /);
    // Answered early by the upstream (413), then the same.
    expect(await session(upload('/v1/early'), (t) => t.includes('too big'))).toMatch(/^HTTP\/1\.1 413 /);
    // The body stops while the upstream has the request: the request is cancelled, one line.
    await session(upload('/v1/hold'), () => true);
    // Bytes that are not HTTP behind a request whose answer has begun: that answer is cut.
    const cutText = await session('POST /v1/stream HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}', (t) => t.includes('"a"'), 'GARBAGE\r\n\r\n');
    expect(cutText).toMatch(/^HTTP\/1\.1 200 /);
    expect(cutText).not.toContain('invalid_http'); // never written into the answer
    // A chunked body that turns malformed once the upstream has the request: the refusal is that
    // request's own, told on its line (not as a second line, without a request id), with the 400
    // sent in its answer's place ...
    const chunked = (path: string) => `POST /v1/${path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n`;
    expect(await session(chunked('chunked'), () => true, 'ZZZ\r\n')).toMatch(/^HTTP\/1\.1 400 [^]*invalid_http/);
    // ... or the answer it cut.
    expect(await session(chunked('stream-chunked'), (t) => t.includes('"a"'), 'ZZZ\r\n')).toMatch(/^HTTP\/1\.1 200 [^]*"a"/);
    // Refused bytes that are not a forwarded request's body keep a line of their own: what is not
    // HTTP behind a whole request not yet answered (the 400 takes its answer's place) ...
    expect(await session('POST /v1/held HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}', () => true, 'GARBAGE\r\n\r\n')).toMatch(/^HTTP\/1\.1 400 /);
    // ... and the body of a request already answered (an early 413).
    expect(await session(chunked('early-chunked'), (t) => t.includes('too big'), 'ZZZ\r\n')).toMatch(/^HTTP\/1\.1 413 /);
    // ... and the body of a request pipelined behind one not yet answered (the 400 takes that one's place).
    const pipelined = 'POST /v1/held-ahead HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}' + chunked('queued');
    expect(await session(pipelined, () => true, 'ZZZ\r\n')).toMatch(/^HTTP\/1\.1 400 /);
    for (let i = 0; i < 100 && logLines.filter((l) => l.msg === 'request').length < 14; i++) await sleep(20);
    await sleep(100);
    const requestLines = logLines.filter((l) => l.msg === 'request');
    const lastThree = requestLines.splice(11).map((l) => [l.path, l.status, l.outcome, l.errorType, l.refusal]);
    expect(lastThree.sort((a, b) => String(a[0]).localeCompare(String(b[0])))).toEqual([
      ['/held-ahead', undefined, 'cancelled', 'client_cancelled', undefined],
      ['/queued', undefined, 'cancelled', 'client_cancelled', undefined],
      [undefined, 400, 'refused', 'invalid_http', undefined],
    ]);
    const lines = requestLines.map((l) => [l.path, l.status, l.outcome, l.errorType, l.answerCut, l.refusal]);
    expect(lines).toEqual([
      ['/nowhere', 404, 'refused', 'no_route', undefined, undefined],
      ['/early', 413, 'error', '413', undefined, undefined], // not an API the proxy reads: its error status, as for one it reads
      ['/hold', undefined, 'cancelled', 'client_cancelled', undefined, undefined],
      [undefined, 400, 'refused', 'invalid_http', true, undefined],
      ['/stream', 200, 'cancelled', 'client_cancelled', undefined, undefined],
      ['/chunked', 400, 'cancelled', 'client_cancelled', undefined, 'invalid_http'],
      ['/stream-chunked', 200, 'cancelled', 'client_cancelled', true, 'invalid_http'],
      [undefined, 400, 'refused', 'invalid_http', undefined, undefined],
      ['/held', undefined, 'cancelled', 'client_cancelled', undefined, undefined],
      ['/early-chunked', 413, 'error', '413', undefined, undefined],
      [undefined, 400, 'refused', 'invalid_http', undefined, undefined],
    ]);
    expect(requestLines.map((l) => l.err)).toEqual([
      ...[undefined, undefined, undefined, expect.stringMatching(/Invalid method/), undefined],
      ...[expect.stringMatching(/chunk size/), expect.stringMatching(/chunk size/), expect.stringMatching(/Invalid method/), undefined, undefined, expect.stringMatching(/chunk size/)],
    ]);
  });

  it('an Expect other than 100-continue gets a 417 with a line; 100 Continue is sent only to a request that is forwarded', async () => {
    const up = await upstream((_req, res) => res.end('ok'));
    cleanups.push(up.close);
    const logLines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(undefined, { routes: [{ prefix: '/v1', upstream: up.url }] }, { logLevel: 'info', logLines });
    const odd = await exchange(proxy.proxyUrl, 'POST /v1/x HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
    expect(odd.text).toMatch(/^HTTP\/1\.1 417 Expectation Failed\r\n/);
    expect(odd.text).toContain('"type":"expectation_failed"');
    // No route: refused at once, without first asking for a body it would throw away.
    const refused = await exchange(proxy.proxyUrl, 'POST /nowhere HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n');
    expect(refused.text).toMatch(/^HTTP\/1\.1 404 /);
    expect(refused.closed).toBe(true); // the body may or may not follow: Node closes
    // Forwarded: 100 Continue, then the body goes upstream.
    const u = new URL(proxy.proxyUrl);
    const forwarded = await new Promise<string>((resolve) => {
      const s = net.connect(Number(u.port), u.hostname, () => s.write('POST /v1/x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n'));
      let text = '';
      s.on('data', (d: Buffer) => {
        text += d.toString('latin1');
        if (text === 'HTTP/1.1 100 Continue\r\n\r\n') s.write('{}');
      });
      s.on('error', () => {});
      s.on('close', () => resolve(text));
    });
    expect(forwarded).toMatch(/^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 OK\r\n[^]*\r\n\r\nok$/);
    expect(up.seen.map((x) => [x.url, x.body.toString()])).toEqual([['/x', '{}']]);
    const lines = logLines.filter((l) => l.msg === 'request');
    expect(lines.map((l) => [l.method, l.path, l.status, l.errorType])).toEqual([
      ['POST', '/v1/x', 417, 'expectation_failed'],
      ['POST', '/nowhere', 404, 'no_route'],
      ['POST', '/x', 200, undefined],
    ]);
  });

  it('the upstream gets exactly one X-Request-Id, the one the proxy logs, whatever the client sent', async () => {
    const up = await upstream((_req, res) => res.end('ok'));
    cleanups.push(up.close);
    const logLines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(up.url, {}, { logLevel: 'info', logLines });
    const cases: [string, string][] = [
      ['usable', 'X-Request-Id: abc-1\r\n'],
      ['none', ''],
      ['empty', 'X-Request-Id: \r\n'],
      ['too long', `X-Request-Id: ${'r'.repeat(300)}\r\n`],
      ['two fields', 'X-Request-Id: one\r\nX-Request-Id: two\r\n'],
      ['named in Connection', 'Connection: keep-alive, x-request-id\r\nX-Request-Id: hop\r\n'],
    ];
    for (const [, fields] of cases) await exchange(proxy.proxyUrl, `GET /v1/models HTTP/1.1\r\nHost: x\r\n${fields}Connection: close\r\n\r\n`);
    for (let i = 0; i < 100 && logLines.length < cases.length; i++) await sleep(20);
    const logged = logLines.filter((l) => l.msg === 'request').map((l) => l.reqId);
    expect(logged).toHaveLength(cases.length);
    const sent = up.seen.map((x) => x.rawHeaders.filter((_, i) => i % 2 === 1 && x.rawHeaders[i - 1]!.toLowerCase() === 'x-request-id'));
    sent.forEach((ids, i) => expect(ids, cases[i]![0]).toEqual([logged[i]]));
    expect(logged[0]).toBe('abc-1');
    for (const i of [1, 2, 3, 4]) expect(logged[i], cases[i]![0]).toMatch(/^[0-9a-f-]{36}$/);
  });
});

describe('metrics port', () => {
  it('a scraper that stops reading is cut after timeouts.idle, not held with its exposition', async () => {
    // ~44 KB of exposition per model: 300 models make one larger than loopback's socket buffers.
    proxy = await startTestProxy(undefined, { timeouts: { idle: 1 }, metrics: { maxModelValues: 1000 }, simulator: { ttft: 0, itl: 0.0001, tokens: 3 } });
    const proxyUrl = proxy.proxyUrl;
    for (let i = 0; i < 300; i += 20) {
      await Promise.all(
        Array.from({ length: 20 }, (_, j) =>
          fetch(`${proxyUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: `model-${i + j}`, stream: true }) }).then((r) => r.text()),
        ),
      );
    }
    const full = (await (await fetch(`${proxy.metricsUrl}/metrics`)).arrayBuffer()).byteLength;
    expect(full).toBeGreaterThan(10 << 20);
    const { port } = new URL(proxy.metricsUrl);
    const s = net.connect(Number(port), '127.0.0.1');
    s.pause(); // reads nothing
    s.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n');
    await sleep(3000); // three times timeouts.idle
    let got = 0;
    let closed = false;
    s.on('data', (d: Buffer) => (got += d.length));
    s.on('close', () => (closed = true));
    s.on('error', () => {});
    s.resume();
    const end = performance.now() + 5000;
    while (!closed && got < full && performance.now() < end) await sleep(20);
    s.destroy();
    expect(closed).toBe(true);
    expect(got).toBeLessThan(full); // cut: what the buffers held, not the whole exposition
    expect((await fetch(`${proxy.metricsUrl}/metrics`)).status).toBe(200);
  });
});

describe('failures', () => {
  it('answers 502 with a JSON error when the upstream is unreachable, and stays up', async () => {
    const s = net.createServer();
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    const closedPort = (s.address() as AddressInfo).port;
    await new Promise<void>((r) => s.close(() => r()));
    proxy = await startTestProxy(`http://127.0.0.1:${closedPort}`);
    const r = await rawRequest(proxy.proxyUrl, '/v1/chat/completions', { method: 'POST', body: Buffer.from('{"model":"m"}') });
    expect(r.status).toBe(502);
    expect(JSON.parse(r.body.toString())).toMatchObject({ error: { type: 'upstream_unreachable' } });
    const samples = await scrape(proxy.metricsUrl);
    expect(hist(samples, 'gen_ai_client_operation_duration_seconds', { error_type: 'upstream_unreachable' }).count).toBe(1);
  });

  it('answers 504 when the upstream sends no response headers in time', async () => {
    const up = await upstream(() => undefined); // never answers
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url, { timeouts: { response: 0.3 } });
    const t = performance.now();
    const r = await rawRequest(proxy.proxyUrl, '/v1/chat/completions', { method: 'POST', body: Buffer.from('{}') });
    expect(r.status).toBe(504);
    expect(JSON.parse(r.body.toString())).toMatchObject({ error: { type: 'timeout' } });
    expect(performance.now() - t).toBeLessThan(5000);
  });

  it('names the connect phase when timeouts.response ends a TLS handshake that hangs', async () => {
    // A TCP server that never speaks TLS: the handshake hangs, and the response timer (shorter
    // than the connect timer here) fires while the connection is still being set up.
    let closed!: Promise<void>;
    const silent = net.createServer((s) => {
      s.resume(); // reads the ClientHello, never answers it
      closed = new Promise<void>((r) => s.once('close', () => r()));
    });
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise<void>((r) => silent.close(() => r())));
    proxy = await startTestProxy(`https://127.0.0.1:${(silent.address() as AddressInfo).port}`, { timeouts: { response: 0.3, connect: 30 } });
    const r = await rawRequest(proxy.proxyUrl, '/v1/chat/completions', { method: 'POST', body: Buffer.from('{}') });
    expect(r.status).toBe(504);
    expect(JSON.parse(r.body.toString())).toMatchObject({ error: { type: 'timeout', message: 'upstream connect timeout (the TLS handshake with the upstream did not finish)' } });
    await closed; // the half-open connection is closed, not kept until timeouts.connect
  });

  it('cuts the client response (no clean end) when the upstream dies mid-stream, and records upstream_reset', async () => {
    const up = await upstream((req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n');
      setTimeout(() => req.socket.destroy(), 50);
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const err = await rawRequest(proxy.proxyUrl, '/v1/chat/completions', { method: 'POST', body: Buffer.from('{}') }).then(
      () => undefined,
      (e: Error) => e,
    );
    expect(err).toBeInstanceOf(Error);
    await sleep(50);
    const samples = await scrape(proxy.metricsUrl);
    expect(hist(samples, 'gen_ai_client_operation_duration_seconds', { error_type: 'upstream_reset' }).count).toBe(1);
  });

  it('reads the request model from the body however it arrives: with the head, in pieces, chunked, after 5 MB of image', async () => {
    // The meter (and the body reader) is set up on the tick after the request head leaves;
    // body bytes forwarded before that must still be read.
    const up = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end('data: {"id":"c","object":"chat.completion.chunk","model":"served","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n');
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const port = Number(new URL(proxy.proxyUrl).port);
    const send = async (pieces: string[], gapMs: number) => {
      const sock = net.connect(port, '127.0.0.1');
      await new Promise<void>((r) => sock.once('connect', () => r()));
      const got: Buffer[] = [];
      sock.on('data', (d: Buffer) => got.push(d));
      for (const [k, p] of pieces.entries()) {
        if (k > 0) await sleep(gapMs);
        sock.write(p);
      }
      const deadline = performance.now() + 3000;
      while (!Buffer.concat(got).includes('[DONE]') && performance.now() < deadline) await sleep(5);
      sock.destroy();
      expect(Buffer.concat(got).toString()).toContain('data: [DONE]');
    };
    const body = (model: string) => `{"stream":true,"messages":[{"role":"user","content":"x"}],"model":"${model}"}`;
    const head = (len: number) => `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${len}\r\n\r\n`;
    const whole = body('m-whole');
    await send([head(whole.length) + whole], 0);
    const split = body('m-split');
    await send([head(split.length) + split.slice(0, 20), split.slice(20, 60), split.slice(60)], 40);
    const late = body('m-late');
    await send([head(late.length), late], 40);
    const chunkedBody = body('m-chunked');
    const chunk = (t: string) => `${t.length.toString(16)}\r\n${t}\r\n`;
    await send(
      [
        'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n' + chunk(chunkedBody.slice(0, 30)),
        chunk(chunkedBody.slice(30)) + '0\r\n\r\n',
      ],
      40,
    );
    // A vision request as the Python SDKs build it: `model` after 5 MB of base64 in `messages`.
    const big = `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,${'iVBO'.repeat(5 << 18)}"}}]}],"model":"m-after-5mb","stream":true}`;
    await send([head(big.length) + big], 0);
    await sleep(50);
    const samples = await scrape(proxy.metricsUrl);
    for (const model of ['m-whole', 'm-split', 'm-late', 'm-chunked', 'm-after-5mb']) {
      expect(total(samples, 'llm_proxy_streams_total', { gen_ai_request_model: model, outcome: 'ok' }), model).toBe(1);
      expect(hist(samples, 'gen_ai_client_operation_time_to_first_chunk_seconds', { gen_ai_request_model: model }).count, model).toBe(1);
    }
    expect(up.seen.map((x) => x.body.toString())).toEqual([whole, split, late, chunkedBody, big]);
  });


  it('label values with lone UTF-16 surrogates become one series per exposed value (Prometheus keeps one of two equal series)', async () => {
    // JSON allows "\ud800"; the exposition writes it as U+FFFD, so the three request models and the
    // two response models below are one exposed value each.
    const up = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const served = _req.url?.includes('b') ? 'served\\udc01' : 'served\\ud801';
      res.end(`data: {"id":"c","object":"chat.completion.chunk","model":"${served}","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n`);
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    for (const [path, model] of [['/v1/chat/completions?a', 'dup\\ud800x'], ['/v1/chat/completions?b', 'dup\\udc00x'], ['/v1/chat/completions?a', 'dup\\ufffdx']] as const) {
      const r = await rawRequest(proxy.proxyUrl, path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: Buffer.from(`{"stream":true,"model":"${model}"}`) });
      expect(r.body.toString()).toContain('[DONE]');
    }
    const text = await (await fetch(`${proxy.metricsUrl}/metrics`)).text();
    const keys = text.split('\n').filter((l) => l !== '' && !l.startsWith('#')).map((l) => l.slice(0, l.lastIndexOf(' ')));
    expect(keys.length).toBeGreaterThan(10);
    expect(keys.filter((k, i) => keys.indexOf(k) !== i)).toEqual([]);
    const samples = parseProm(text);
    expect(total(samples, 'llm_proxy_streams_total', { gen_ai_request_model: 'dup\ufffdx' })).toBe(3);
    expect(hist(samples, 'gen_ai_client_operation_duration_seconds', { gen_ai_request_model: 'dup\ufffdx', gen_ai_response_model: 'served\ufffd' }).count).toBe(3);
  });
  it('a measurement set-up that throws leaves the stream byte-identical and unmeasured, and the proxy up', async () => {
    // The set-up runs in a bare nextTick: an escaped throw would end the process.
    const payload = Buffer.from('data: {"id":"c","object":"chat.completion.chunk","model":"served","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n');
    const up = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(payload);
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const spy = vi.spyOn(API_BY_NAME['openai-chat']!, 'newAdapter').mockImplementationOnce(() => {
      throw new Error('adapter boom');
    });
    const escaped: unknown[] = [];
    const onUncaught = (e: unknown) => escaped.push(e);
    process.on('uncaughtException', onUncaught);
    try {
      const post = (model: string) =>
        rawRequest(proxy!.proxyUrl, '/v1/chat/completions', {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: Buffer.from(JSON.stringify({ model, stream: true })),
        });
      const first = await post('m-boom');
      expect(spy).toHaveBeenCalledTimes(1);
      expect(first.status).toBe(200);
      expect(sha(first.body)).toBe(sha(payload));
      // The next request is served and measured as usual.
      const second = await post('m-after');
      expect(sha(second.body)).toBe(sha(payload));
      await sleep(50);
      const samples = await scrape(proxy.metricsUrl);
      expect(hist(samples, 'gen_ai_client_operation_time_to_first_chunk_seconds', { gen_ai_request_model: 'm-boom' }).count).toBe(0);
      expect(hist(samples, 'gen_ai_client_operation_time_to_first_chunk_seconds', { gen_ai_request_model: 'm-after' }).count).toBe(1);
      expect(escaped).toEqual([]);
    } finally {
      process.off('uncaughtException', onUncaught);
      spy.mockRestore();
    }
  });

  it('records nothing for what is not a generation call on a generation path: CORS preflights, listings, a 405', async () => {
    const up = await upstream((req, res) => {
      if (req.method === 'OPTIONS') {
        res.writeHead(204, { 'access-control-allow-origin': '*', 'access-control-allow-methods': 'POST' });
        res.end();
      } else if (req.method === 'GET' && req.url?.startsWith('/v1/chat/completions?')) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"object":"list","data":[],"has_more":false}');
      } else if (req.method !== 'POST') {
        res.writeHead(405, { 'content-type': 'application/json' });
        res.end('{"error":{"message":"method not allowed"}}');
      } else {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end('data: {"choices":[{"index":0,"delta":{"content":"hi"}}],"model":"m"}\n\ndata: [DONE]\n\n');
      }
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const preflight = { origin: 'https://app.example', 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type' };
    for (const path of ['/v1/chat/completions', '/v1/messages', '/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse']) {
      expect((await rawRequest(proxy.proxyUrl, path, { method: 'OPTIONS', headers: preflight })).status).toBe(204);
    }
    expect((await rawRequest(proxy.proxyUrl, '/v1/chat/completions?limit=10')).status).toBe(200);
    expect((await rawRequest(proxy.proxyUrl, '/v1/messages')).status).toBe(405);
    let samples = await scrape(proxy.metricsUrl);
    expect(total(samples, 'llm_proxy_streams_total')).toBe(0);
    expect(hist(samples, 'gen_ai_client_operation_duration_seconds').count).toBe(0);
    // The generation call itself is measured.
    await rawRequest(proxy.proxyUrl, '/v1/chat/completions', { method: 'POST', body: Buffer.from('{"model":"m","stream":true}') });
    samples = await scrape(proxy.metricsUrl);
    expect(total(samples, 'llm_proxy_streams_total', { gen_ai_operation_name: 'chat', outcome: 'ok' })).toBe(1);
  });

  it('records a request the client abandons before any response as cancelled', async () => {
    const up = await upstream(() => undefined); // never answers: the client's close is all there is
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const port = Number(new URL(proxy.proxyUrl).port);
    const sock = net.connect(port, '127.0.0.1');
    await new Promise<void>((r) => sock.once('connect', () => r()));
    const b = '{"model":"m-gone","stream":true}';
    sock.end(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${b.length}\r\n\r\n${b}`);
    sock.destroy();
    let n = 0;
    for (const deadline = performance.now() + 3000; n === 0 && performance.now() < deadline; await sleep(20)) {
      n = hist(await scrape(proxy.metricsUrl), 'gen_ai_client_operation_duration_seconds', { error_type: 'client_cancelled' }).count;
    }
    expect(n).toBe(1);
  });

  it('counts a request as active from its arrival, also while the upstream has not answered, and not once its answer shows it is not measured', async () => {
    let release: (() => void) | undefined;
    const up = await upstream((req, res) => {
      if (req.url === '/v1/models') return void res.writeHead(200, { 'content-type': 'application/json' }).end('{"data":[]}');
      release = () => res.writeHead(200, { 'content-type': 'text/event-stream' }).end('data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n');
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const active = async () => total(await scrape(proxy!.metricsUrl), 'llm_proxy_streams_active');
    const answered = fetch(`${proxy.proxyUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"model":"m-hang","stream":true}',
    }).then((r) => r.text());
    for (let i = 0; i < 150 && release === undefined; i++) await sleep(20);
    let seen = 0;
    for (let i = 0; i < 50 && seen === 0; i++, await sleep(20)) seen = await active();
    expect(seen).toBe(1); // no response head yet: a provider that hangs shows here
    release!();
    expect(await answered).toContain('[DONE]');
    // A listing on a generation API's host: counted until its head shows a plain JSON answer.
    expect(await (await fetch(`${proxy.proxyUrl}/v1/models`)).text()).toBe('{"data":[]}');
    let left = -1;
    for (let i = 0; i < 50 && left !== 0; i++, await sleep(20)) left = await active();
    expect(left).toBe(0);
  });

  it('returns 404 JSON for a path no route covers', async () => {
    const up = await upstream((_req, res) => res.end('x'));
    cleanups.push(up.close);
    proxy = await startTestProxy(undefined, { routes: [{ prefix: '/openai', upstream: up.url }] });
    const r = await rawRequest(proxy.proxyUrl, '/other');
    expect(r.status).toBe(404);
    expect(JSON.parse(r.body.toString())).toMatchObject({ error: { type: 'no_route' } });
  });
});

describe('cancellation and backpressure', () => {
  it('a request pipelined behind a streaming one is dropped unsent when the client resets or half-closes the connection', async () => {
    // Node queues the second response; the upstream never gets its request.
    const upstreamClosed: number[] = [];
    const up = await upstream((req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const t = setInterval(() => res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n'), 5);
      req.socket.on('close', () => {
        upstreamClosed.push(performance.now());
        clearInterval(t);
      });
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url, { timeouts: { idle: 30 } });
    const port = Number(new URL(proxy.proxyUrl).port);
    const b = '{"model":"m-piped","stream":true}';
    const request = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${b.length}\r\n\r\n${b}`;
    for (const how of ['reset', 'half-close'] as const) {
      upstreamClosed.length = 0;
      const sock = net.connect(port, '127.0.0.1');
      sock.on('error', () => {});
      await new Promise<void>((r) => sock.once('connect', () => r()));
      sock.write(request + request);
      await new Promise<void>((r) => sock.once('data', () => r()));
      await sleep(30);
      if (how === 'reset') sock.resetAndDestroy();
      else sock.end(); // the proxy ends its side of a half-closed connection after the response in hand
      for (const deadline = performance.now() + 3000; upstreamClosed.length < 1 && performance.now() < deadline; ) await sleep(5);
      expect(upstreamClosed.length, how).toBe(1);
      sock.destroy();
    }
    await sleep(50);
    expect(up.seen.length).toBe(2); // one per connection: the pipelined requests were never sent
    const samples = await scrape(proxy.metricsUrl);
    const f = { gen_ai_request_model: 'm-piped' };
    expect(total(samples, 'llm_proxy_streams_total', { ...f, outcome: 'cancelled' })).toBe(2);
    expect(hist(samples, 'gen_ai_client_operation_duration_seconds', { ...f, error_type: 'client_cancelled' }).count).toBe(2);
    expect(total(samples, 'llm_proxy_streams_active')).toBe(0);
  });

  it('closes the upstream socket promptly when the client disconnects mid-stream', async () => {
    let upstreamClosedAt = 0;
    const up = await upstream((req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const t = setInterval(() => res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n'), 5);
      req.socket.on('close', () => {
        upstreamClosedAt = performance.now();
        clearInterval(t);
      });
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const port = Number(new URL(proxy.proxyUrl).port);
    const delays: number[] = [];
    for (let i = 0; i < 5; i++) {
      upstreamClosedAt = 0;
      const sock = net.connect(port, '127.0.0.1');
      await new Promise<void>((r) => sock.once('connect', () => r()));
      sock.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}');
      await new Promise<void>((r) => sock.once('data', () => r()));
      await sleep(30);
      const abortedAt = performance.now();
      sock.destroy();
      const deadline = performance.now() + 2000;
      while (upstreamClosedAt === 0 && performance.now() < deadline) await sleep(1);
      expect(upstreamClosedAt).toBeGreaterThan(0);
      delays.push(upstreamClosedAt - abortedAt);
    }
    // Target is 50 ms (measured in the benchmark); the test allows for a loaded 2-core machine:
    // the median of five within 250 ms, and none beyond 2 s (one stall is not a leak).
    expect([...delays].sort((a, b) => a - b)[2]).toBeLessThan(250);
    expect(Math.max(...delays)).toBeLessThan(2000);
    await sleep(20);
    const samples = await scrape(proxy.metricsUrl);
    expect(total(samples, 'llm_proxy_streams_total', { outcome: 'cancelled' })).toBe(5);
    expect(hist(samples, 'gen_ai_client_operation_duration_seconds', { error_type: 'client_cancelled' }).count).toBe(5);
    expect(total(samples, 'llm_proxy_streams_active')).toBe(0);
  });

  it('a slow client slows the upstream: the proxy does not buffer the stream', async () => {
    const total = 64 * 1024 * 1024;
    const block = Buffer.alloc(64 * 1024, 0x61);
    let written = 0;
    let finished = false;
    const up = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      const pump = () => {
        while (written < total) {
          written += block.length;
          if (!res.write(block)) {
            res.once('drain', pump);
            return;
          }
        }
        finished = true;
        res.end();
      };
      pump();
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const { port } = new URL(proxy.proxyUrl);
    const sock = net.connect(Number(port), '127.0.0.1');
    await new Promise<void>((r) => sock.once('connect', () => r()));
    sock.write('GET /blob HTTP/1.1\r\nHost: x\r\n\r\n');
    let received = 0;
    sock.once('data', (d) => {
      received += d.length;
      sock.pause(); // a client that stops reading
    });
    await sleep(1500);
    // Only socket buffers and one high-water mark per hop may be in flight, not the 64 MiB.
    expect(finished).toBe(false);
    expect(written).toBeLessThan(24 * 1024 * 1024);
    const heldBefore = written;
    await sleep(500);
    expect(written - heldBefore).toBeLessThan(1024 * 1024);
    // Resume: everything arrives.
    sock.on('data', (d) => (received += d.length));
    sock.resume();
    const deadline = performance.now() + 30_000;
    while (received < total && performance.now() < deadline) await sleep(20);
    expect(received).toBeGreaterThanOrEqual(total);
    sock.destroy();
  });
  it('counts a stream its client held back (the upstream read paused by backpressure), and logs for how long', async () => {
    // m-paced: 800 events of 50 KiB (40 MiB, more than the sockets on the way hold). Read by fast
    // clients: m-fast, 50 small events; m-first, a 40 KiB first event; m-last, a 40 KiB last event
    // in the read that ends the body; m-json, a 100 KB JSON answer with a Content-Length (each a
    // write of over 16 KiB to a corked client socket, which returns false without any client pacing).
    // A name may carry an attempt's suffix (`m-fast~2`, below).
    const content = 'a'.repeat(50 * 1024);
    const chunk = (text: string) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: text } }] })}\n\n`;
    const up = await upstream((_req, res, body) => {
      const model = /"model":"([^"]+)"/.exec(body.toString())![1]!;
      const kind = model.replace(/~\d+$/, '');
      if (kind === 'm-json') {
        const json = JSON.stringify({ object: 'chat.completion', model, choices: [{ index: 0, message: { role: 'assistant', content: 'b'.repeat(100_000) }, finish_reason: 'stop' }] });
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) }).end(json);
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      if (kind === 'm-short') {
        // 10 MiB at once (more than the sockets on the way hold), then, once the client has
        // caught up, 20 small events.
        let n = 0;
        const small = () => {
          for (let i = 0; i < 20; i++) res.write(chunk('s'));
          res.end('data: [DONE]\n\n');
        };
        const big = () => {
          while (n < 200) {
            n++;
            if (!res.write(chunk(content))) return void res.once('drain', big);
          }
          setTimeout(small, 300);
        };
        big();
        return;
      }
      if (kind === 'm-first') res.write(chunk('c'.repeat(40 * 1024)));
      if (kind === 'm-last') {
        for (let i = 0; i < 20; i++) res.write(chunk('a'));
        setTimeout(() => res.end(chunk('d'.repeat(40 * 1024)) + 'data: [DONE]\n\n'), 20);
        return;
      }
      let n = 0;
      const pump = () => {
        while (n < (kind === 'm-paced' ? 800 : 50)) {
          n++;
          if (!res.write(chunk(kind === 'm-paced' ? content : 'a'))) return void res.once('drain', pump);
        }
        res.end('data: [DONE]\n\n');
      };
      setTimeout(pump, kind === 'm-first' ? 20 : 0);
    });
    cleanups.push(up.close);
    const lines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(up.url, {}, { logLevel: 'info', logLines: lines });
    const running = proxy;
    // A client that reads the head, then nothing until the proxy has paused its upstream read (the
    // sockets on the way are full) and for `pauseMs` after that, then the rest.
    const port = Number(new URL(proxy.proxyUrl).port);
    const pausingClient = async (model: string, pauseMs: number, events: number) => {
      const sock = net.connect(port, '127.0.0.1');
      await new Promise<void>((r) => sock.once('connect', () => r()));
      const b = `{"model":"${model}","stream":true}`;
      sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${b.length}\r\n\r\n${b}`);
      let tail = '';
      let received = 0;
      sock.once('data', (d: Buffer) => ((received += d.length), sock.pause()));
      const paused = () => [...running.forwarder.inFlight].some((f) => (f as unknown as { paused?: boolean }).paused === true);
      for (const deadline = performance.now() + 10_000; !paused() && performance.now() < deadline; ) await sleep(1);
      expect(paused(), model).toBe(true);
      await sleep(pauseMs);
      sock.on('data', (d: Buffer) => ((received += d.length), (tail = (tail + d.toString('latin1')).slice(-64))));
      sock.resume();
      for (const deadline = performance.now() + 30_000; !tail.endsWith('0\r\n\r\n') && performance.now() < deadline; ) await sleep(20);
      expect(tail, model).toContain('data: [DONE]');
      expect(received, model).toBeGreaterThan(events * content.length);
      sock.destroy();
    };
    const line = async (model: string) => {
      for (let i = 0; i < 100 && !lines.some((l) => l.msg === 'request' && l.model === model); i++) await sleep(20);
      return lines.find((l) => l.msg === 'request' && l.model === model)!;
    };

    await pausingClient('m-paced', 1000, 800);

    // The fast clients, and m-short: a client that stops reading while 10 MiB arrive, and reads
    // again 30 ms after the sockets filled and the proxy paused, less than CLIENT_HELD_MS (100 ms):
    // a fast client's network draining a burst, not a client that paces its reading. Upstream, proxy and
    // clients share this process's event loop, so a stall of the loop (a loaded machine
    // descheduling it) lengthens their pauses alike. An attempt during which the loop was late by
    // 40 ms or more is inconclusive and runs again under new names, up to three times.
    const fastKinds = ['m-fast', 'm-first', 'm-last', 'm-json', 'm-short'];
    let names: Record<string, string> | undefined;
    const lateness: number[] = [];
    for (let attempt = 1; attempt <= 3 && names === undefined; attempt++) {
      const tried = Object.fromEntries(fastKinds.map((k) => [k, attempt === 1 ? k : `${k}~${attempt}`]));
      let last = performance.now();
      let late = 0;
      const watch = setInterval(() => {
        const now = performance.now();
        late = Math.max(late, now - last - 5);
        last = now;
      }, 5);
      try {
        for (const kind of fastKinds.slice(0, 4)) {
          const fast = await fetch(`${running.proxyUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: `{"model":"${tried[kind]}","stream":${kind !== 'm-json'}}` });
          const text = await fast.text();
          expect(kind === 'm-json' ? text.length > 100_000 : text.endsWith('data: [DONE]\n\n'), kind).toBe(true);
        }
        await pausingClient(tried['m-short']!, 30, 200);
      } finally {
        clearInterval(watch);
      }
      lateness.push(Math.round(Math.max(late, performance.now() - last - 5)));
      if (lateness[lateness.length - 1]! < 40) names = tried;
    }
    expect(names, `the event loop was late by ${lateness.join(', ')} ms in the three attempts: too loaded to judge 30 ms pauses against 100 ms`).toBeDefined();
    const fast = names!;

    const paced = await line('m-paced');
    expect(paced.outcome).toBe('ok');
    // Held from some time after the first bytes until the client read again, within the request.
    expect(paced.clientPausedMs as number).toBeGreaterThan(0);
    expect(paced.clientPausedMs as number).toBeLessThanOrEqual(paced.durationMs as number);
    expect(paced.durationMs as number).toBeGreaterThan(1000 - 50);
    const samples = await scrape(proxy.metricsUrl);
    for (const kind of fastKinds) {
      const fastLine = await line(fast[kind]!);
      expect(fastLine.outcome, kind).toBe('ok');
      expect(fastLine, kind).not.toHaveProperty('clientPausedMs');
      expect(total(samples, 'llm_proxy_streams_client_paced_total', { gen_ai_request_model: fast[kind]! }), kind).toBe(0);
    }
    expect(total(samples, 'llm_proxy_streams_client_paced_total', { gen_ai_request_model: 'm-paced' })).toBe(1);
    // The fast clients' streams are timed whole: every gap, and TPOT.
    const gaps = (model: string) => hist(samples, 'gen_ai_client_operation_time_per_output_chunk_seconds', { gen_ai_request_model: model }).count;
    const tpots = (model: string) => hist(samples, 'gen_ai_server_time_per_output_token_seconds', { gen_ai_request_model: model }).count;
    expect(gaps(fast['m-fast']!)).toBe(49);
    expect(tpots(fast['m-fast']!)).toBe(1);
    expect(gaps(fast['m-first']!)).toBe(50);
    expect(gaps(fast['m-last']!)).toBe(20);
    expect(gaps(fast['m-short']!)).toBe(219);
    expect(tpots(fast['m-short']!)).toBe(1);
    // The held stream: counted and finished, but from the pause on its times were the client's,
    // and they are left out. It was held after its first bytes (the client read the head and
    // some events), long before its 800th event, so some gaps were recorded and most were not.
    expect(total(samples, 'llm_proxy_streams_total', { gen_ai_request_model: 'm-paced', outcome: 'ok' })).toBe(1);
    expect(hist(samples, 'gen_ai_client_operation_time_to_first_chunk_seconds', { gen_ai_request_model: 'm-paced' }).count).toBe(1);
    expect(gaps('m-paced')).toBeGreaterThan(0);
    expect(gaps('m-paced')).toBeLessThan(400);
    expect(tpots('m-paced')).toBe(0);
    expect(hist(samples, 'gen_ai_client_token_usage', { gen_ai_request_model: 'm-paced', gen_ai_token_type: 'output' })).toMatchObject({ count: 1, sum: 800 });
    // The longest gap in its log line is the pause's: the log keeps what the stream looked like.
    expect(paced.maxGapMs as number).toBeGreaterThan(500);
  });
});

describe('events over limits.maxEventBytes', () => {
  it('a Responses stream whose response.completed repeats a 1.5 MB image: forwarded whole, its usage and finish read, a client that leaves after it is ok', async () => {
    const image = 'iVBORw0KGgo'.padEnd(1_500_000, 'QUFB');
    const ev = (o: { type: string } & Record<string, unknown>) => `event: ${o.type}\ndata: ${JSON.stringify(o)}\n\n`;
    const response = { id: 'resp_1', object: 'response', status: 'completed', model: 'gpt-5-2025-08-07', output: [{ id: 'ig_1', type: 'image_generation_call', status: 'completed', result: image }], usage: { input_tokens: 11, output_tokens: 1290, total_tokens: 1301 }, metadata: {} };
    const body = Buffer.from(
      ev({ type: 'response.created', sequence_number: 0, response: { ...response, status: 'in_progress', output: [], usage: null } }) +
        ['A', ' cat', '.'].map((delta, i) => ev({ type: 'response.output_text.delta', sequence_number: i + 1, delta })).join('') +
        ev({ type: 'response.completed', sequence_number: 4, response }),
    );
    const up = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(body);
      setTimeout(() => res.end(), 300); // the body ends after the client has left
    });
    cleanups.push(up.close);
    const lines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(up.url, {}, { logLevel: 'info', logLines: lines });
    const r = await fetch(`${proxy.proxyUrl}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model":"gpt-5","stream":true,"tools":[{"type":"image_generation"}]}' });
    const reader = r.body!.getReader();
    const parts: Buffer[] = [];
    let got = 0;
    while (got < body.length) {
      const { value, done } = await reader.read();
      if (done) break;
      parts.push(Buffer.from(value));
      got += value.length;
    }
    await reader.cancel(); // leaves once it has response.completed, before the body's end
    expect(sha(Buffer.concat(parts))).toBe(sha(body));
    let line: Record<string, unknown> | undefined;
    for (let i = 0; i < 100 && !(line = lines.find((l) => l.msg === 'request')); i++) await sleep(20);
    expect(line).toMatchObject({ outcome: 'ok', outputTokens: 1290, tokenSource: 'usage', finishReasons: ['completed'] });
    const samples = await scrapeOnceRecorded(proxy.metricsUrl, 'gpt-5');
    expect(hist(samples, 'gen_ai_client_token_usage', { gen_ai_request_model: 'gpt-5', gen_ai_token_type: 'output' })).toMatchObject({ count: 1, sum: 1290 });
    expect(hist(samples, 'gen_ai_client_token_usage', { gen_ai_request_model: 'gpt-5', gen_ai_token_type: 'input' })).toMatchObject({ count: 1, sum: 11 });
    expect(hist(samples, 'gen_ai_client_operation_time_per_output_chunk_seconds', { gen_ai_request_model: 'gpt-5' }).count).toBe(2);
  });

  it('a Gemini streamed array whose last element is a 1.5 MB image: forwarded whole, the image counted as output, its usage and finish read', async () => {
    const image = 'iVBORw0KGgo'.padEnd(1_500_000, 'QUFB');
    const chunk = (parts: unknown[], extra: Record<string, unknown> = {}, usageMetadata: Record<string, unknown> = { promptTokenCount: 9, totalTokenCount: 9 }) => ({ candidates: [{ content: { parts, role: 'model' }, ...extra, index: 0 }], usageMetadata, modelVersion: 'gemini-2.5-flash-image' });
    const elements = [
      chunk([{ text: 'Here is a cat:' }]),
      chunk([{ inlineData: { mimeType: 'image/png', data: image } }], { finishReason: 'STOP' }, { promptTokenCount: 9, candidatesTokenCount: 1295, totalTokenCount: 1304 }),
    ];
    // As the API writes its array (no `alt=sse`): pretty-printed elements, `,\r\n` between them.
    const body = Buffer.from(`[${elements.map((e) => JSON.stringify(e, null, 2)).join(',\r\n')}]`);
    const up = await upstream(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json; charset=UTF-8' });
      const cut = body.indexOf('"inlineData"') + 500_000;
      res.write(body.subarray(0, cut));
      await sleep(30); // the image arrives in two reads at least
      res.end(body.subarray(cut));
    });
    cleanups.push(up.close);
    const lines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(up.url, {}, { logLevel: 'info', logLines: lines });
    const r = await fetch(`${proxy.proxyUrl}/v1beta/models/gemini-2.5-flash-image:streamGenerateContent`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"contents":[{"parts":[{"text":"a cat"}]}]}' });
    expect(sha(Buffer.from(await r.arrayBuffer()))).toBe(sha(body));
    let line: Record<string, unknown> | undefined;
    for (let i = 0; i < 100 && !(line = lines.find((l) => l.msg === 'request')); i++) await sleep(20);
    expect(line).toMatchObject({ outcome: 'ok', outputTokens: 1295, tokenSource: 'usage', finishReasons: ['STOP'] });
    const model = { gen_ai_request_model: 'gemini-2.5-flash-image' };
    const samples = await scrapeOnceRecorded(proxy.metricsUrl, 'gemini-2.5-flash-image');
    expect(hist(samples, 'gen_ai_client_token_usage', { ...model, gen_ai_token_type: 'output' })).toMatchObject({ count: 1, sum: 1295 });
    // Two output chunks, the text and the image: one gap between them.
    expect(hist(samples, 'gen_ai_client_operation_time_per_output_chunk_seconds', model)).toMatchObject({ count: 1 });
  });
});

describe('limits.maxBufferedBytes', () => {
  it('a large event that would take all streams past the limit is read from its edges (usage, finish), forwarded whole, and logged', async () => {
    const ev = (o: { type: string } & Record<string, unknown>) => `event: ${o.type}\ndata: ${JSON.stringify(o)}\n\n`;
    const body = (image: string) => {
      const response = { id: 'resp_1', object: 'response', status: 'completed', model: 'gpt-5', output: [{ id: 'ig_1', type: 'image_generation_call', status: 'completed', result: image }], usage: { input_tokens: 11, output_tokens: 1290, total_tokens: 1301 }, metadata: {} };
      return Buffer.from(ev({ type: 'response.created', sequence_number: 0, response: { ...response, status: 'in_progress', output: [], usage: null } }) + ev({ type: 'response.output_text.delta', sequence_number: 1, delta: 'A cat.' }) + ev({ type: 'response.completed', sequence_number: 2, response }));
    };
    const bodies = { a: body('iVBORw0KGgo'.padEnd(300_000, 'QUFB')), b: body('iVBORw0KGgo'.padEnd(600_000, 'QkJC')) };
    let releaseA!: () => void;
    const aMayEnd = new Promise<void>((r) => (releaseA = r));
    const up = await upstream(async (_req, res, reqBody) => {
      const which = (JSON.parse(reqBody.toString()) as { model: string }).model as 'a' | 'b';
      const b = bodies[which];
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      // A: 280 KB of its event, held until B is done; B: its event in two writes 50 ms apart (two reads at least).
      const cut = which === 'a' ? b.indexOf('"result"') + 280_000 : b.indexOf('"result"') + 100_000;
      res.write(b.subarray(0, cut));
      if (which === 'a') await aMayEnd;
      else await sleep(50);
      res.end(b.subarray(cut));
    });
    cleanups.push(up.close);
    const lines: Record<string, unknown>[] = [];
    // A alone fits however its reads come (its buffer is under twice its ~300 KB); A's 280 KB and
    // B's 600 KB together never do.
    proxy = await startTestProxy(up.url, { limits: { maxBufferedBytes: 700_000 } }, { logLevel: 'info', logLines: lines });
    const get = (model: string) =>
      fetch(`${proxy!.proxyUrl}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, stream: true }) }).then(async (r) => Buffer.from(await r.arrayBuffer()));
    const a = get('a');
    const budget = proxy.forwarder.buffered;
    for (let i = 0; i < 250 && budget.used < 280_000; i++) await sleep(20);
    expect(budget.used).toBeGreaterThanOrEqual(280_000);
    expect(sha(await get('b'))).toBe(sha(bodies.b));
    releaseA();
    expect(sha(await a)).toBe(sha(bodies.a));
    let done: Record<string, unknown>[] = [];
    for (let i = 0; i < 100 && (done = lines.filter((l) => l.msg === 'request')).length < 2; i++) await sleep(20);
    expect(done.map((l) => l.model).sort()).toEqual(['a', 'b']);
    for (const l of done) expect(l).toMatchObject({ outcome: 'ok', outputTokens: 1290, tokenSource: 'usage', finishReasons: ['completed'] });
    expect(lines.filter((l) => String(l.msg).startsWith('buffer limit reached'))).toEqual([expect.objectContaining({ level: 40, maxBufferedBytes: 700_000, refused: 1 })]);
    expect(budget.used).toBe(0);
  });
});

describe('graceful shutdown', () => {
  /** A raw keep-alive connection: everything it receives, and when it closed. */
  function rawConnection(url: string) {
    const u = new URL(url);
    const s = net.connect(Number(u.port), u.hostname);
    const state = { text: '', closed: false };
    s.on('data', (d: Buffer) => (state.text += d.toString('latin1')));
    s.on('error', () => {});
    const closed = new Promise<void>((r) => s.on('close', () => ((state.closed = true), r())));
    return { s, state, closed };
  }
  const post = (path: string) => `POST ${path} HTTP/1.1\r\nHost: h\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}`;
  async function until(cond: () => boolean) {
    for (let i = 0; i < 200 && !cond(); i++) await sleep(10);
    expect(cond()).toBe(true);
  }
  /** A proxy, logging to an array, in front of an upstream whose streams never end. */
  async function endlessStreamProxy() {
    const up = await upstream(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const t = setInterval(() => res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n'), 20);
      res.once('close', () => clearInterval(t));
    });
    cleanups.push(up.close);
    const logLines: Record<string, unknown>[] = [];
    const p = (proxy = await startTestProxy(up.url, {}, { logLevel: 'info', logLines }));
    return { up, logLines, p };
  }
  /** "path outcome" of each request log line, sorted. */
  const outcomes = (logLines: Record<string, unknown>[]) =>
    logLines.filter((l) => l.msg === 'request').map((l) => `${l.path as string} ${l.outcome as string}`).sort();

  it.each([
    ['', post('/queued')],
    // Node no longer sends its automatic 100 Continue at parse time: no 100 ahead of the 503.
    [' (one that expects 100 Continue gets none)', 'POST /queued HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\ncontent-length: 2\r\n\r\n'],
  ])('a request queued behind a stream when the shutdown begins is answered 503 draining when its turn comes, never sent%s', async (_name, queued) => {
    const up = await upstream(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (let k = 0; k < 4; k++) {
        res.write(`data: {"choices":[{"delta":{"content":"t${k}"}}]}\n\n`);
        await sleep(60);
      }
      res.end('data: [DONE]\n\n');
    });
    cleanups.push(up.close);
    const logLines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(up.url, {}, { logLevel: 'info', logLines });
    const p = proxy;
    const one = rawConnection(p.proxyUrl);
    one.s.write(post('/stream') + queued);
    await until(() => one.state.text.includes('t0'));
    const stopped = p.shutdown(20);
    await Promise.all([stopped, one.closed]);
    proxy = undefined;
    const [first, second, ...more] = one.state.text.split(/(?=HTTP\/1\.1 )/);
    expect(first).toMatch(/^HTTP\/1\.1 200 [^]*data: \[DONE\]\n\n\r\n0\r\n\r\n$/);
    expect(second).toMatch(/^HTTP\/1\.1 503 [^]*\r\nconnection: close\r\n/i);
    expect(more).toEqual([]);
    expect(up.seen.map((x) => x.url)).toEqual(['/stream']);
    expect(outcomes(logLines)).toEqual(['/queued refused', '/stream ok']);
  });

  it('at the drain deadline, a request queued behind the cut stream is logged as cancelled and not counted as cut', async () => {
    const { up, logLines, p } = await endlessStreamProxy();
    const one = rawConnection(p.proxyUrl);
    one.s.write(post('/stream') + post('/queued'));
    await until(() => one.state.text.includes('data:'));
    await p.shutdown(0.3);
    proxy = undefined;
    expect(logLines.find((l) => l.msg === 'drain deadline reached: cut streams')).toMatchObject({ cut: 1, unsent: 1 });
    for (let i = 0; i < 50 && logLines.filter((l) => l.msg === 'request').length < 2; i++) await sleep(20);
    expect(outcomes(logLines)).toEqual(['/queued cancelled', '/stream error']);
    expect(up.seen.map((x) => x.url)).toEqual(['/stream']);
  });

  it('a request queued behind a stream on a connection handed to an upgrade is cancelled, and holds no shutdown', async () => {
    const { up, logLines, p } = await endlessStreamProxy();
    for (const last of ['GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n', 'CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n']) {
      const c = rawConnection(p.proxyUrl);
      c.s.write(post('/stream') + post('/queued') + last);
      await c.closed; // the proxy closes a connection handed over behind an unfinished answer
      // ... and writes no answer of its own into the stream's body (a CONNECT's 405 did).
      expect(c.state.text, last).not.toMatch(/HTTP\/1\.1 [45]\d\d/);
    }
    expect(logLines.filter((l) => String(l.msg).endsWith('pipelined behind an unfinished answer: connection closed')).map((l) => l.method)).toEqual(['GET', 'CONNECT']);
    const t0 = performance.now();
    await p.shutdown(20);
    proxy = undefined;
    expect(performance.now() - t0).toBeLessThan(5000); // nothing left in flight to wait for
    const queued = logLines.filter((l) => l.msg === 'request' && l.path === '/queued');
    expect(queued.map((l) => l.outcome)).toEqual(['cancelled', 'cancelled']);
    expect(up.seen.map((x) => x.url)).not.toContain('/queued');
  });

  it('finishes streams in flight, answers new requests on open connections 503 with a close, and does not wait for the deadline', async () => {
    const up = await upstream(async (req, res) => {
      if (req.url === '/late-head') await sleep(1000);
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (let k = 1; k <= 3; k++) {
        res.write(`data: {"choices":[{"index":0,"delta":{"content":"t${k}"}}]}\n\n`);
        await sleep(100);
      }
      res.end('data: [DONE]\n\n');
    });
    cleanups.push(up.close);
    proxy = await startTestProxy(up.url);
    const p = proxy;
    // 1: its head leaves before the shutdown; a request pipelined behind it comes during the drain.
    const one = rawConnection(p.proxyUrl);
    one.s.write(post('/stream'));
    await until(() => one.state.text.includes('t1'));
    // 2: its head leaves after the shutdown began.
    const two = rawConnection(p.proxyUrl);
    two.s.write(post('/late-head'));
    // In flight before the shutdown (the upstream has it), its head held back for 1 s: no fixed
    // sleep, which a loaded machine could outlast.
    await until(() => up.seen.length === 2);
    const t0 = performance.now();
    const stopped = p.shutdown(20);
    one.s.write(post('/stream'));
    await stopped;
    const took = performance.now() - t0;
    proxy = undefined;
    await Promise.all([one.closed, two.closed]);
    // Both streams complete, by their last chunk; the drain ended with them, not at 20 s.
    expect(took).toBeLessThan(5000);
    const [first, second] = one.state.text.split(/(?=HTTP\/1\.1 )/);
    expect(first).toMatch(/^HTTP\/1\.1 200 [^]*data: \[DONE\]\n\n\r\n0\r\n\r\n$/);
    expect(second).toMatch(/^HTTP\/1\.1 503 [^]*\r\nconnection: close\r\n/i);
    expect(second).toContain('"type":"draining"');
    expect(two.state.text).toMatch(/^HTTP\/1\.1 200 [^]*\r\nconnection: close\r\n[^]*data: \[DONE\]\n\n\r\n0\r\n\r\n$/i);
    expect(up.seen.map((s) => s.url)).toEqual(['/stream', '/late-head']);
  });
});
