import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { rawRequest } from '../helpers/http.js';
import { startTestProxy } from '../helpers/proxy.js';

// An upstream that answers `/s/N` with status N and `/t/NAME` with a 200 stream carrying the
// in-band error type NAME: the two ways an upstream chooses the `error.type` label.
let upstream: Server;
let proxy: RunningProxy;

beforeAll(async () => {
  upstream = createServer((req, res) => {
    req.resume();
    const [, kind, value] = req.url!.split('/');
    if (kind === 's') {
      res.writeHead(Number(value), { 'content-type': 'application/json' }).end('{"error":{"type":"x"}}');
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end(`data: {"error":{"type":"${value}","message":"m"}}\n\n`);
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  proxy = await startTestProxy(undefined, {
    routes: [
      { prefix: '/dead', upstream: 'http://127.0.0.1:1' },
      { prefix: '/', upstream: base },
    ],
  });
});

afterAll(async () => {
  await proxy.close();
  await new Promise((r) => upstream.close(r));
});

async function post(path: string): Promise<number> {
  const res = await fetch(`${proxy.proxyUrl}${path}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: '{"model":"m","stream":true,"messages":[]}',
  });
  await res.arrayBuffer();
  return res.status;
}

/** The status as sent (fetch refuses a status outside 200-599). */
async function rawPost(path: string): Promise<number> {
  const r = await rawRequest(proxy.proxyUrl, `${path}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: Buffer.from('{"model":"m","stream":true,"messages":[]}') });
  return r.status;
}

describe('error.type label cap', () => {
  it('keeps the first 50 in-band error types and records the rest as _OTHER; statuses and its own types always', async () => {
    for (let i = 0; i < 60; i++) expect(await post(`/t/type_${i}`)).toBe(200);
    // After the cap: statuses (what alerts match) and the proxy's own types still get their own series.
    for (let i = 0; i < 30; i++) expect(await post(`/s/${500 + i}`)).toBe(500 + i);
    // Statuses outside 100-599 are invalid, yet forwarded and kept as statuses: they must not
    // use up the in-band types' budget (an upstream could fill it with them).
    for (const status of [600, 799, 999]) expect(await rawPost(`/s/${status}`)).toBe(status);
    expect(await post('/dead')).toBe(502);

    const text = await (await fetch(`${proxy.metricsUrl}/metrics`)).text();
    const types = new Map<string, number>();
    for (const m of text.matchAll(/^gen_ai_client_operation_duration_seconds_count\{[^}]*error_type="([^"]*)"[^}]*\} (\d+)$/gm)) {
      types.set(m[1]!, (types.get(m[1]!) ?? 0) + Number(m[2]));
    }
    const expected = new Map<string, number>();
    for (let i = 0; i < 50; i++) expected.set(`type_${i}`, 1);
    expected.set('_OTHER', 10);
    for (let i = 0; i < 30; i++) expected.set(String(500 + i), 1);
    for (const status of [600, 799, 999]) expected.set(String(status), 1);
    expected.set('upstream_unreachable', 1);
    expect(types).toEqual(expected);
  });
});
