import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { startTestProxy } from '../helpers/proxy.js';
import { hist, scrape, type Sample } from '../helpers/prom.js';

// An upstream that answers by model name: `ok-*` with a stream, and `junk-*`, `busy-*` and
// `down-*` with the status their name ends in: providers answer a name they do not serve (or a
// request without a valid key) with 400, 401, 403, 404, 410 or 422. WebSocket upgrades get the same.
const statusOf = (model: string): number => (/^(junk|busy|down)-/.test(model) ? Number(model.slice(-3)) : 200);
let upstream: Server;
let proxy: RunningProxy;
const logLines: Record<string, unknown>[] = [];

beforeAll(async () => {
  upstream = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      const model = (JSON.parse(body) as { model: string }).model;
      const status = statusOf(model);
      if (status !== 200) return void res.writeHead(status, { 'content-type': 'application/json' }).end('{"error":{"message":"no"}}');
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(`data: {"model":"${model}","choices":[{"index":0,"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n`);
    });
  });
  upstream.on('upgrade', (req, socket: net.Socket) => {
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
      metrics: { maxModelValues: 3 },
    },
    { logLevel: 'info', logLines },
  );
});

afterAll(async () => {
  await proxy?.close();
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
    // The proxy's own answer (no upstream answered) and a client that left: no place either.
    expect(await post('lost-1', '/dead')).toBe(502);
    expect(await upgrade('lost-2', '/dead')).toBe(502);
    let m = await scrape(proxy.metricsUrl);
    expect(byModel(m)).toEqual({ '(none)': 10 });
    expect(hist(m, 'gen_ai_client_operation_duration_seconds', { error_type: '404' }).count).toBe(3);

    // The three places go to names an upstream answered otherwise: a 5xx (an outage of a real
    // model must show under its name) and a 429 included; the fourth such name is past the cap.
    expect(await post('down-1-503')).toBe(503);
    expect(await post('busy-2-429')).toBe(429);
    expect(await upgrade('ok-3')).toBe(200); // declined, but answered
    expect(await post('ok-4')).toBe(200);
    // Names that took a place keep it whatever later answers say; new rejected names past the cap
    // are no `_OTHER` (that stays "served names past the cap", what LLMProxyModelCapReached reads).
    expect(await post('down-1-503', '/dead')).toBe(502);
    expect(await post('junk-g-404')).toBe(404);
    m = await scrape(proxy.metricsUrl);
    expect(byModel(m)).toEqual({ '(none)': 11, 'down-1-503': 2, 'busy-2-429': 1, 'ok-3': 1, _OTHER: 1 });
    expect(hist(m, 'gen_ai_client_operation_duration_seconds', { gen_ai_request_model: 'down-1-503', error_type: 'upstream_unreachable' }).count).toBe(1);
    expect(hist(m, 'gen_ai_client_operation_duration_seconds', { gen_ai_request_model: 'busy-2-429', error_type: '429' }).count).toBe(1);

    // The request line names the model as the client sent it, with or without a label.
    const logged = logLines.filter((l) => l.msg === 'request').map((l) => [l.model, l.status]);
    expect(logged).toEqual(
      expect.arrayContaining([
        ['junk-a-404', 404],
        ['lost-1', 502],
        ['ok-4', 200],
        ['junk-g-404', 404],
      ]),
    );
  });
});
