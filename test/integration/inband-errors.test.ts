import Anthropic from '@anthropic-ai/sdk';
import { createHash } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { fixture } from '../helpers/fixtures.js';
import { hist, scrape, total } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';

// In-band errors end the measurement with error_type set, and the bytes reach the client unchanged.
const BODIES: Record<string, { body: Buffer; type: string }> = {
  '/v1/messages': { body: fixture('anthropic-error.sse'), type: 'text/event-stream' },
  '/v1/chat/completions': {
    body: Buffer.from(
      'data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n' +
        'data: {"error":{"message":"upstream model crashed","type":"server_error","code":"internal"}}\n\n',
    ),
    type: 'text/event-stream',
  },
  '/v1/responses': {
    body: Buffer.from(
      'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"Hi"}\n\n' +
        'event: response.failed\ndata: {"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"boom"}}}\n\n',
    ),
    type: 'text/event-stream',
  },
};

let up: http.Server;
let proxy: RunningProxy;
beforeAll(async () => {
  up = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const b = BODIES[req.url ?? '']!;
      res.writeHead(200, { 'content-type': b.type });
      res.end(b.body);
    });
  });
  await new Promise<void>((r) => up.listen(0, '127.0.0.1', r));
  proxy = await startTestProxy(`http://127.0.0.1:${(up.address() as AddressInfo).port}`);
});
afterAll(async () => {
  await proxy?.close();
  await new Promise<void>((r) => up.close(() => r()));
});

const sha = (b: Buffer | ArrayBuffer) => createHash('sha256').update(Buffer.from(b as ArrayBuffer)).digest('hex');

describe('in-band errors through the proxy', () => {
  it.each([
    ['/v1/messages', 'anthropic', 'overloaded_error'],
    ['/v1/chat/completions', 'openai', 'server_error'],
    ['/v1/responses', 'openai', 'server_error'],
  ])('%s: bytes unchanged, duration recorded with error_type', async (path, provider, errorType) => {
    const model = `err${path.replace(/\//g, '-')}`;
    const r = await fetch(`${proxy.proxyUrl}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, stream: true }) });
    expect(r.status).toBe(200);
    expect(sha(await r.arrayBuffer())).toBe(sha(BODIES[path]!.body));
    const s = await scrape(proxy.metricsUrl);
    const f = { gen_ai_request_model: model, gen_ai_provider_name: provider };
    expect(hist(s, 'gen_ai_client_operation_duration_seconds', { ...f, error_type: errorType }).count).toBe(1);
    expect(total(s, 'llm_proxy_streams_total', { ...f, outcome: 'error' })).toBe(1);
    // The content before the error was measured.
    expect(hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', f).count).toBe(1);
  });
});

describe('an upstream error the official SDKs hang up on before the answer ends', () => {
  // The OpenAI and Anthropic SDKs abort a stream as soon as they parse an error event, and
  // cancel the body of a 429/5xx they retry: the proxy then sees the client go away. What failed
  // is the upstream, and that is what is recorded (not a cancellation).
  let slow: http.Server;
  let p: RunningProxy;
  beforeAll(async () => {
    slow = http.createServer((req, res) => {
      let body = '';
      req.on('data', (d: Buffer) => (body += d.toString()));
      req.on('end', () => {
        const model = (JSON.parse(body) as { model: string }).model;
        if (model === 'rate-limited') {
          res.writeHead(429, { 'content-type': 'application/json', 'retry-after-ms': '10' });
          res.write(''); // the head now, the body later
          setTimeout(() => res.end('{"error":{"type":"rate_limit_exceeded","message":"slow down"}}'), 150);
          return;
        }
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(req.url!.endsWith('/messages') ? BODIES['/v1/messages']!.body : BODIES['/v1/chat/completions']!.body);
        setTimeout(() => res.end(), 300); // the error event has been sent; the answer ends later
      });
    });
    await new Promise<void>((r) => slow.listen(0, '127.0.0.1', r));
    p = await startTestProxy(`http://127.0.0.1:${(slow.address() as AddressInfo).port}`);
  });
  afterAll(async () => {
    await p?.close();
    await new Promise<void>((r) => slow.close(() => r()));
  });

  const outcomes = async (model: string) => {
    const s = await scrape(p.metricsUrl);
    return s
      .filter((x) => x.name === 'gen_ai_client_operation_duration_seconds_count' && x.labels.gen_ai_request_model === model)
      .map((x) => `${x.labels.error_type}×${x.value}`)
      .sort();
  };
  const settle = async (model: string, n: number) => {
    for (let i = 0; i < 100; i++) {
      const s = await scrape(p.metricsUrl);
      if (total(s, 'llm_proxy_streams_total', { gen_ai_request_model: model }) >= n) return;
      await new Promise((r) => setTimeout(r, 20));
    }
  };

  it('OpenAI SDK: an in-band error event, and a 429 retried once', async () => {
    const client = new OpenAI({ apiKey: 'k', baseURL: `${p.proxyUrl}/v1`, maxRetries: 1 });
    const stream = await client.chat.completions.create({ model: 'inband', messages: [{ role: 'user', content: 'x' }], stream: true });
    await expect(async () => {
      for await (const _ of stream);
    }).rejects.toThrow(/upstream model crashed/);
    await expect(client.chat.completions.create({ model: 'rate-limited', messages: [{ role: 'user', content: 'x' }], stream: true })).rejects.toMatchObject({ status: 429 });
    await settle('inband', 1);
    await settle('rate-limited', 2);
    expect(await outcomes('inband')).toEqual(['server_error×1']);
    expect(await outcomes('rate-limited')).toEqual(['429×2']);
    const s = await scrape(p.metricsUrl);
    expect(total(s, 'llm_proxy_streams_total', { outcome: 'cancelled' })).toBe(0);
  });

  it('Anthropic SDK: an overloaded_error event', async () => {
    const client = new Anthropic({ apiKey: 'k', baseURL: p.proxyUrl, maxRetries: 0 });
    const stream = client.messages.stream({ model: 'inband-anthropic', max_tokens: 10, messages: [{ role: 'user', content: 'x' }] });
    await expect(stream.finalMessage()).rejects.toThrow(/overloaded/i);
    await settle('inband-anthropic', 1);
    expect(await outcomes('inband-anthropic')).toEqual(['overloaded_error×1']);
  });
});
