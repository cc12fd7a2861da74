// Addresses as real networks give them: a dual-stack listener.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { startTestProxy } from '../helpers/proxy.js';

let proxy: RunningProxy | undefined;
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
  for (const c of cleanups.splice(0)) await c();
});

async function serve(server: http.Server): Promise<number> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanups.push(() => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }));
  return (server.address() as AddressInfo).port;
}

describe('addresses', () => {
  it('an IPv4 client of a dual-stack (::) listener reaches the upstream in X-Forwarded-For as IPv4, not ::ffff:127.0.0.1', async () => {
    const xff: (string | undefined)[] = [];
    const port = await serve(http.createServer((req, res) => { xff.push(req.headers['x-forwarded-for'] as string | undefined); res.end('ok'); }));
    proxy = await startTestProxy(`http://127.0.0.1:${port}`, { listen: { host: '::' } });
    const p = new URL(proxy.proxyUrl).port;
    for (const headers of [{}, { 'x-forwarded-for': '10.0.0.1' }] as Record<string, string>[]) {
      const res = await fetch(`http://127.0.0.1:${p}/v1/models`, { headers });
      expect(await res.text()).toBe('ok');
    }
    expect(xff).toEqual(['127.0.0.1', '10.0.0.1, 127.0.0.1']);
  });

  it('X-Forwarded-Host names an absolute-form target\'s authority (a client that takes the proxy for a forward proxy), not its Host, on requests and upgrades', async () => {
    const seen: [string | undefined, string | undefined][] = [];
    const server = http.createServer((req, res) => { seen.push([req.url, req.headers['x-forwarded-host'] as string | undefined]); res.end('ok'); });
    // A WebSocket upgrade gets the same fields; the upstream declines it, which the client gets.
    server.on('upgrade', (req, socket) => { seen.push([req.url, req.headers['x-forwarded-host'] as string | undefined]); socket.end('HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n'); });
    const port = await serve(server);
    proxy = await startTestProxy(`http://127.0.0.1:${port}`);
    const p = Number(new URL(proxy.proxyUrl).port);
    // As Node's http client sends a request through an HTTP proxy: the whole URL as the target.
    const ask = (path: string, host: string, upgrade = false) =>
      new Promise<number | undefined>((resolve) => {
        const extra = upgrade ? { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': 'dGhlIHNhbXBsZSBub25jZQ==' } : {};
        const r = http.request({ host: '127.0.0.1', port: p, path, headers: { host, ...extra }, agent: false }, (res) => (res.resume(), res.on('end', () => resolve(res.statusCode))));
        r.on('upgrade', (_res, socket) => (socket.destroy(), resolve(101)));
        r.on('error', () => resolve(undefined));
        r.end();
      });
    expect(await ask('http://api.example:8443/v1/models?x=1', 'api.example:8443')).toBe(200);
    expect(await ask('http://user:key@API.example/v1/models', 'other.example')).toBe(200); // RFC 9112 §3.2.2: the target's, not Host's
    expect(await ask('/v1/models', 'origin.example:1')).toBe(200);
    expect(await ask('http://ws.example:9/v1/realtime', 'other.example', true)).toBe(403);
    expect(seen).toEqual([
      ['/v1/models?x=1', 'api.example:8443'],
      ['/v1/models', 'API.example'],
      ['/v1/models', 'origin.example:1'],
      ['/v1/realtime', 'ws.example:9'],
    ]);
  });

  it('a route with forwardedHeaders: false adds no X-Forwarded-* (requests and WebSocket upgrades); what a client sent passes as sent; X-Request-Id stays', async () => {
    const seen: http.IncomingHttpHeaders[] = [];
    const server = http.createServer((req, res) => { seen.push(req.headers); res.end('ok'); });
    server.on('upgrade', (req, socket) => { seen.push(req.headers); socket.end('HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n'); });
    const port = await serve(server);
    const upstream = `http://127.0.0.1:${port}`;
    proxy = await startTestProxy(undefined, { routes: [{ prefix: '/private', upstream, forwardedHeaders: false }, { prefix: '/', upstream }] });
    const base = proxy.proxyUrl;
    await (await fetch(`${base}/private/v1/models`)).text();
    await (await fetch(`${base}/private/v1/models`, { headers: { 'x-forwarded-for': '10.0.0.1' } })).text();
    await (await fetch(`${base}/v1/models`)).text();
    // An upgrade (fetch cannot send one): the upstream declines it, which the client gets.
    const status = await new Promise<number | undefined>((resolve) => {
      const r = http.request(`${base}/private/v1/realtime`, { headers: { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': 'dGhlIHNhbXBsZSBub25jZQ==' } });
      r.on('response', (res) => (res.resume(), res.on('end', () => resolve(res.statusCode))));
      r.on('upgrade', (_res, socket) => (socket.destroy(), resolve(101)));
      r.on('error', () => resolve(undefined));
      r.end();
    });
    expect(status).toBe(403);
    const fwd = (h: http.IncomingHttpHeaders) => [h['x-forwarded-for'], h['x-forwarded-proto'], h['x-forwarded-host']];
    expect(seen).toHaveLength(4);
    expect(fwd(seen[0]!)).toEqual([undefined, undefined, undefined]);
    expect(fwd(seen[1]!)).toEqual(['10.0.0.1', undefined, undefined]);
    expect(fwd(seen[2]!)).toEqual(['127.0.0.1', 'http', new URL(base).host]);
    expect(fwd(seen[3]!)).toEqual([undefined, undefined, undefined]); // the upgrade
    expect(seen[3]!.upgrade).toBe('websocket');
    for (const h of seen) expect(h['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
  });
});
