import { createHash } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
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
