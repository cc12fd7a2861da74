// An empty model is no model. Prometheus reads a label whose value is empty as no label, so a
// series with gen_ai_request_model="" and one without it would be one series to it: it keeps
// one sample of the two and says nothing (review 114 saw 2 of 3 requests vanish).
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { scrape, total } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';

let upstream: Server;
let proxy: RunningProxy;

beforeAll(async () => {
  // Answers with the model the request named, "" included, as servers echo it.
  upstream = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      const model = (JSON.parse(body) as { model?: string }).model ?? '';
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (delta: object, finish: string | null) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', model, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
      res.end(chunk({ content: 'a' }, null) + chunk({ content: 'b' }, null) + chunk({}, 'stop') + 'data: [DONE]\n\n');
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  proxy = await startTestProxy(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`);
});

afterAll(async () => {
  await proxy?.close();
  await new Promise((r) => upstream?.close(r));
});

describe('model labels', () => {
  it('a request and a response model of "" are no model: one series with the request that named none, no empty label', async () => {
    for (const model of [undefined, '', '']) {
      const res = await fetch(`${proxy.proxyUrl}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...(model === undefined ? {} : { model }), stream: true, messages: [] }),
      });
      expect(res.status).toBe(200);
      await res.text();
    }
    const text = await (await fetch(`${proxy.metricsUrl}/metrics`)).text();
    expect(text).not.toMatch(/=""/);
    const samples = await scrape(proxy.metricsUrl);
    const streams = samples.filter((s) => s.name === 'llm_proxy_streams_total');
    expect(streams).toHaveLength(1);
    expect(streams[0]!.labels.gen_ai_request_model).toBeUndefined();
    expect(streams[0]!.labels.gen_ai_response_model).toBeUndefined();
    expect(total(samples, 'llm_proxy_streams_total', { outcome: 'ok' })).toBe(3);
    expect(total(samples, 'gen_ai_client_operation_time_to_first_chunk_seconds_count')).toBe(3);
  });
});
