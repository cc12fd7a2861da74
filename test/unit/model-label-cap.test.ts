import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket, WebSocketServer } from 'ws';
import type { RunningProxy } from '../../src/main.js';
import { startTestProxy } from '../helpers/proxy.js';
import { hist, scrape, type Sample } from '../helpers/prom.js';

// An upstream that answers by model name: `ok-*` with a stream, and `junk-*`, `busy-*` and
// `down-*` with the status their name ends in: providers answer a name they do not serve (or a
// request without a valid key) with 400, 401, 403, 404, 410 or 422. `slow-*` answers after 2 s.
// WebSocket upgrades get the same statuses, but `rt-*`: a Realtime session (101) that answers a
// response (`rt-ok-*`) or, as OpenAI does for a model it does not serve, sends an error and closes.
const statusOf = (model: string): number => (/^(junk|busy|down)-/.test(model) ? Number(model.slice(-3)) : 200);
const realtime = new WebSocketServer({ noServer: true });
realtime.on('connection', (ws, req) => {
  const model = new URL(req.url!, 'http://x').searchParams.get('model') ?? '';
  if (!model.startsWith('rt-ok-')) {
    ws.send(JSON.stringify({ type: 'error', error: { type: 'invalid_request_error', code: 'invalid_model', message: 'no' } }));
    return void ws.close(4000, 'invalid_request_error.invalid_model');
  }
  ws.send(JSON.stringify({ type: 'session.created', session: { model } }));
  ws.on('message', () => {
    ws.send(JSON.stringify({ type: 'response.created', response: { id: 'r1' } }));
    ws.send(JSON.stringify({ type: 'response.output_text.delta', response_id: 'r1', delta: 'a' }));
    ws.send(JSON.stringify({ type: 'response.done', response: { id: 'r1', status: 'completed', usage: { output_tokens: 1 } } }));
  });
});
let upstream: Server;
let proxy: RunningProxy;
const logLines: Record<string, unknown>[] = [];

beforeAll(async () => {
  upstream = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      const model = (JSON.parse(body) as { model: string }).model;
      if (model.startsWith('slow-')) return void setTimeout(() => res.destroyed || res.writeHead(200).end(), 2000);
      const status = statusOf(model);
      if (status !== 200) return void res.writeHead(status, { 'content-type': 'application/json' }).end('{"error":{"message":"no"}}');
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(`data: {"model":"${model}","choices":[{"index":0,"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n`);
    });
  });
  upstream.on('upgrade', (req, socket: net.Socket, head: Buffer) => {
    if (req.url!.includes('model=rt-')) return realtime.handleUpgrade(req, socket, head, (ws) => realtime.emit('connection', ws, req));
    const status = statusOf(new URL(req.url!, 'http://x').searchParams.get('model') ?? '');
    socket.end(`HTTP/1.1 ${status} No\r\nContent-Length: 0\r\n\r\n`);
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  proxy = await startTestProxy(
    undefined,
    {
      routes: [
        { prefix: '/dead', upstream: 'http://127.0.0.1:1' },
        { prefix: '/', upstream: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}` },
      ],
      metrics: { maxModelValues: 4 },
    },
    { logLevel: 'info', logLines },
  );
});

afterAll(async () => {
  await proxy?.close();
  realtime.close();
  await new Promise((r) => upstream.close(r));
});

async function post(model: string, prefix = ''): Promise<number> {
  const res = await fetch(`${proxy.proxyUrl}${prefix}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, stream: true, messages: [] }),
  });
  await res.arrayBuffer();
  return res.status;
}

/** A Realtime upgrade; the status line's code (0 when none came). */
function upgrade(model: string, prefix = ''): Promise<number> {
  return new Promise((resolve) => {
    const s = net.connect(Number(new URL(proxy.proxyUrl).port), '127.0.0.1', () =>
      s.write(`GET ${prefix}/v1/realtime?model=${model} HTTP/1.1\r\nHost: p\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`),
    );
    let t = '';
    s.on('data', (b: Buffer) => (t += b.toString('latin1')));
    s.on('error', () => {});
    s.on('close', () => resolve(Number(/^HTTP\/1\.1 (\d+)/.exec(t)?.[1] ?? 0)));
  });
}

/** A Realtime session through the proxy: asks for one response; the close code. */
function session(model: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${proxy.proxyUrl.replace('http', 'ws')}/v1/realtime?model=${model}`);
    ws.on('open', () => ws.send(JSON.stringify({ type: 'response.create' })));
    ws.on('message', (d) => (JSON.parse(d.toString()) as { type: string }).type === 'response.done' && ws.close(1000));
    ws.on('close', (code) => resolve(code));
    ws.on('error', reject);
  });
}

/** A POST the client gives up on after 100 ms, before the upstream answers. */
async function abandoned(model: string): Promise<string> {
  const body = JSON.stringify({ model, stream: true, messages: [] });
  return fetch(`${proxy.proxyUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, signal: AbortSignal.timeout(100) }).then(
    () => 'answered',
    (e: Error) => e.name,
  );
}

/** The scrape once `n` requests are recorded (a cancel is recorded after its turn of the loop). */
async function scrapeWhen(n: number): Promise<Sample[]> {
  for (let i = 0; ; i++) {
    const m = await scrape(proxy.metricsUrl);
    if (hist(m, 'gen_ai_client_operation_duration_seconds').count >= n || i >= 100) return m;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Requests (the duration histogram's count) by model label, `(none)` for none. */
function byModel(m: Sample[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const s of m) {
    if (s.name !== 'gen_ai_client_operation_duration_seconds_count') continue;
    const k = s.labels.gen_ai_request_model ?? '(none)';
    out[k] = (out[k] ?? 0) + s.value;
  }
  return out;
}

describe('request model label cap', () => {
  it('a name takes a place only once an upstream answers it other than as a name it does not serve: rejected names never fill the cap', async () => {
    // Junk first, more names than the cap holds: none takes a place.
    for (const model of ['junk-a-404', 'junk-b-400', 'junk-c-401', 'junk-d-403', 'junk-e-422', 'junk-h-410', 'junk-i-404']) expect(await post(model)).toBe(statusOf(model));
    expect(await upgrade('junk-f-404')).toBe(404);
    // The proxy's own answer (no upstream answered) and a client that left first: no place either.
    expect(await post('lost-1', '/dead')).toBe(502);
    expect(await upgrade('lost-2', '/dead')).toBe(502);
    expect(await abandoned('slow-3')).toBe('TimeoutError');
    // A Realtime session for a model the upstream does not serve: opened, then closed with an
    // error before any response (nothing is recorded for it, and it takes no place).
    expect(await session('rt-junk-4')).toBe(4000);
    let m = await scrapeWhen(11);
    expect(byModel(m)).toEqual({ '(none)': 11 });
    expect(hist(m, 'gen_ai_client_operation_duration_seconds', { error_type: '404' }).count).toBe(3);

    // The four places go to names an upstream answered otherwise: a 5xx (an outage of a real
    // model must show under its name), a 429 and a Realtime response included; the fifth such
    // name is past the cap.
    expect(await post('down-1-503')).toBe(503);
    expect(await post('busy-2-429')).toBe(429);
    expect(await upgrade('ok-3')).toBe(200); // declined, but answered
    expect(await session('rt-ok-5')).toBe(1000);
    expect(await post('ok-4')).toBe(200);
    // Names that took a place keep it whatever later answers say; new rejected names past the cap
    // are no `_OTHER` (that stays "served names past the cap", what LLMProxyModelCapReached reads).
    expect(await post('down-1-503', '/dead')).toBe(502);
    expect(await post('junk-g-404')).toBe(404);
    m = await scrapeWhen(18);
    expect(byModel(m)).toEqual({ '(none)': 12, 'down-1-503': 2, 'busy-2-429': 1, 'ok-3': 1, 'rt-ok-5': 1, _OTHER: 1 });
    expect(hist(m, 'gen_ai_client_operation_duration_seconds', { gen_ai_request_model: 'down-1-503', error_type: 'upstream_unreachable' }).count).toBe(1);
    expect(hist(m, 'gen_ai_client_operation_duration_seconds', { gen_ai_request_model: 'busy-2-429', error_type: '429' }).count).toBe(1);

    // The request line names the model as the client sent it, with or without a label.
    const logged = logLines.filter((l) => l.msg === 'request').map((l) => [l.model, l.status]);
    expect(logged).toEqual(
      expect.arrayContaining([
        ['junk-a-404', 404],
        ['lost-1', 502],
        ['slow-3', undefined],
        ['ok-4', 200],
        ['junk-g-404', 404],
      ]),
    );
  });
});
