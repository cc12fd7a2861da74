// One TLS client context for every upstream connection, made at start: tls.connect otherwise
// builds one per connection on the event loop (~0.7 ms), the first loading the CA store (~2 ms)
// inside a first request's TTFT. The start-up warm-up (warm-up.test.ts) connects with it too.
import fs from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import tls from 'node:tls';
import { afterEach, expect, it, vi } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { startTestProxy } from '../helpers/proxy.js';
import { selfSignedCert } from '../helpers/tls.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

it('builds the upstream TLS context once, at start, and gives it to every new connection, the warm-up\'s too', async () => {
  const cert = selfSignedCert();
  cleanups.push(cert.remove);
  // Connection: close, so that every request opens a new TLS connection.
  const server = https.createServer({ key: fs.readFileSync(cert.key), cert: fs.readFileSync(cert.cert) }, (_req, res) => res.writeHead(200, { connection: 'close' }).end('ok'));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanups.push(() => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }));
  const contexts = vi.spyOn(tls, 'createSecureContext');
  const real = tls.connect.bind(tls) as (o: tls.ConnectionOptions) => tls.TLSSocket;
  const given: tls.ConnectionOptions[] = [];
  const made: tls.TLSSocket[] = [];
  // The test's self-signed certificate accepted; what the proxy passed recorded.
  const connects = vi.spyOn(tls, 'connect').mockImplementation(((o: tls.ConnectionOptions) => {
    given.push(o);
    made.push(real({ ...o, rejectUnauthorized: false }));
    return made.at(-1);
  }) as typeof tls.connect);
  cleanups.push(() => {
    connects.mockRestore();
    contexts.mockRestore();
  });
  const proxy: RunningProxy = await startTestProxy(`https://localhost:${(server.address() as AddressInfo).port}`);
  cleanups.push(() => proxy.close());
  const atStart = contexts.mock.calls.length;
  expect(atStart).toBe(1);
  // The warm-up's connection to its own listener, already closed.
  expect(given.map((o) => o.host)).toEqual(['warm-up.invalid']);
  expect(made[0]!.destroyed).toBe(true);
  for (let i = 0; i < 3; i++) {
    const r = await fetch(`${proxy.proxyUrl}/v1/models`);
    expect([r.status, await r.text()]).toEqual([200, 'ok']);
  }
  expect(given).toHaveLength(4);
  expect(given.slice(1).map((o) => o.host)).toEqual(['localhost', 'localhost', 'localhost']);
  expect(given[0]!.secureContext).toBeInstanceOf(Object);
  expect(new Set(given.map((o) => o.secureContext)).size).toBe(1);
  expect(contexts.mock.calls.length).toBe(atStart);
});

it('makes no TLS context and no TLS connection when no route uses TLS', async () => {
  // A fresh module graph: the test above left the shared context built in this one.
  vi.resetModules();
  const fresh = (await import('../helpers/proxy.js')) as typeof import('../helpers/proxy.js');
  const contexts = vi.spyOn(tls, 'createSecureContext');
  const connects = vi.spyOn(tls, 'connect');
  cleanups.push(() => {
    connects.mockRestore();
    contexts.mockRestore();
  });
  const proxy: RunningProxy = await fresh.startTestProxy('http://127.0.0.1:9');
  cleanups.push(() => proxy.close());
  expect([contexts.mock.calls.length, connects.mock.calls.length]).toEqual([0, 0]);
});
