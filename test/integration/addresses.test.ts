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
});
