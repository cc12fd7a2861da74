// Upstreams reached through an egress (forward) proxy: HTTPS_PROXY / HTTP_PROXY / NO_PROXY, or
// the config's egressProxy. The proxy in the middle is a real HTTP proxy on loopback
// (helpers/forward-proxy.ts) that records what it was asked.
import fs from 'node:fs';
import path from 'node:path';
import http from 'node:http';
import https from 'node:https';
import net, { type AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { egressAgentFactory, parseProxyUrl } from '../../src/proxy/egress.js';
import { startForwardProxy, type ForwardProxy } from '../helpers/forward-proxy.js';
import { spawnCli, type Spawned } from '../helpers/process.js';
import { hist, scrape } from '../helpers/prom.js';
import { selfSignedCert } from '../helpers/tls.js';
import { Receiver } from '../helpers/ws-frames.js';

const sse = (k: number) => `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"tok ${k}"},"finish_reason":null}]}\n\n`;
const STREAM = [sse(1), sse(2), sse(3), 'data: [DONE]\n\n'];

let spawned: Spawned | undefined;
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  await spawned?.stop();
  spawned = undefined;
  for (const c of cleanups.splice(0)) await c();
});

/** The environment the CLI starts with: these proxy variables only (none inherited), plus `extra`. */
function proxyEnv(vars: Record<string, string>, extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...extra };
  for (const n of ['http_proxy', 'https_proxy', 'no_proxy', 'HTTP_PROXY', 'HTTPS_PROXY', 'NO_PROXY', 'NODE_USE_ENV_PROXY', 'LLM_PROXY_EGRESS_PROXY']) env[n] = undefined;
  return { ...env, ...vars };
}

/** An SSE upstream (https when given a certificate) that records each request's first line. */
async function sseUpstream(tlsFiles?: { key: string; cert: string }) {
  const seen: string[] = [];
  const handler = (req: http.IncomingMessage, res: http.ServerResponse) => {
    seen.push(`${req.method} ${req.url} ${req.headers.host ?? ''}`);
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      let k = 0;
      const t = setInterval(() => {
        if (k < STREAM.length) res.write(STREAM[k++]);
        else {
          clearInterval(t);
          res.end();
        }
      }, 5);
    });
  };
  const server = tlsFiles ? https.createServer({ key: fs.readFileSync(tlsFiles.key), cert: fs.readFileSync(tlsFiles.cert) }, handler) : http.createServer(handler);
  // A WebSocket-style upgrade: 101, then echo.
  server.on('upgrade', (_req: http.IncomingMessage, socket: net.Socket) => {
    socket.on('error', () => {});
    socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
    socket.on('data', (b: Buffer) => socket.write(b));
    socket.on('end', () => socket.end());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanups.push(() => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }));
  return { port: (server.address() as AddressInfo).port, seen };
}

async function forwardProxy(opts: Parameters<typeof startForwardProxy>[0] = {}): Promise<ForwardProxy> {
  const p = await startForwardProxy(opts);
  cleanups.push(() => p.close());
  return p;
}

async function start(upstream: string, env: NodeJS.ProcessEnv, args: string[] = []): Promise<string> {
  spawned = spawnCli(['--upstream', upstream, '--host', '127.0.0.1', '--port', '0', '--metrics-port', '0', '--log-level', 'info', ...args], env);
  return (await spawned.waitFor((l) => l.msg === 'listening')).proxyUrl as string;
}

async function chat(proxyUrl: string, headers: Record<string, string> = {}) {
  return fetch(`${proxyUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: '{"model":"m","stream":true}' });
}

const requestLines = async (n: number) => {
  for (let i = 0; i < 200 && spawned!.lines.filter((l) => l.msg === 'request').length < n; i++) await new Promise((r) => setTimeout(r, 20));
  return spawned!.lines.filter((l) => l.msg === 'request');
};

describe('egress proxy', () => {
  it('reaches an https upstream through a CONNECT tunnel (HTTPS_PROXY with credentials), TLS end to end, the tunnel reused, the stream measured', async () => {
    const cert = selfSignedCert();
    cleanups.push(cert.remove);
    const up = await sseUpstream(cert);
    const fp = await forwardProxy({ credentials: 'alice:s3cr%t', connectDelayMs: 150 });
    const proxyUrl = await start(`https://localhost:${up.port}`, proxyEnv({ https_proxy: `${fp.url.replace('//', '//alice:s3cr%25t@')}`, NODE_USE_ENV_PROXY: '1' }, { NODE_EXTRA_CA_CERTS: cert.cert }));
    for (let i = 0; i < 2; i++) {
      const res = await chat(proxyUrl);
      expect(res.status).toBe(200);
      expect(await res.text()).toBe(STREAM.join(''));
    }
    expect(fp.connects).toEqual([`localhost:${up.port}`]); // one tunnel, kept alive for the second request
    expect(fp.auths).toEqual([`Basic ${Buffer.from('alice:s3cr%t').toString('base64')}`]);
    expect(up.seen).toEqual([`POST /v1/chat/completions localhost:${up.port}`, `POST /v1/chat/completions localhost:${up.port}`]);
    const lines = await requestLines(2);
    expect(lines.map((l) => [l.status, l.outcome, l.outputTokens])).toEqual([[200, 'ok', 3], [200, 'ok', 3]]);
    // The first request paid for the tunnel (the proxy's 150 ms CONNECT answer, then TLS), inside
    // its TTFT; the second reused it. The address is the first hop's: the egress proxy's.
    const fpAddr = new URL(fp.url).host;
    expect(lines[0]).toMatchObject({ upstreamAddr: fpAddr });
    expect(lines[0]!.upstreamConnectMs as number).toBeGreaterThanOrEqual(150);
    expect(lines[0]!.ttftMs as number).toBeGreaterThanOrEqual(lines[0]!.upstreamConnectMs as number);
    expect(lines[1]).toMatchObject({ upstreamAddr: fpAddr });
    expect(lines[1]).not.toHaveProperty('upstreamConnectMs');
    // One connection opened (labelled by the upstream, not the egress proxy), its set-up in the histogram.
    const metricsUrl = spawned!.lines.find((l) => l.msg === 'listening')!.metricsUrl as string;
    const connects = hist(await scrape(metricsUrl), 'llm_proxy_upstream_connect_duration_seconds', { server_address: 'localhost', server_port: String(up.port) });
    expect(connects.count).toBe(1);
    expect(connects.sum).toBeGreaterThanOrEqual(0.15);
    // The credentials never reach a log line.
    expect(JSON.stringify(spawned!.lines)).not.toContain('s3cr');
  });

  it('sends a plain-http upstream absolute-form requests through the proxy (HTTP_PROXY), its credentials added and the client\'s own not forwarded', async () => {
    const up = await sseUpstream();
    const fp = await forwardProxy({ credentials: 'bob:pw' });
    const proxyUrl = await start(`http://127.0.0.1:${up.port}/base`, proxyEnv({ LLM_PROXY_EGRESS_PROXY: 'env', HTTP_PROXY: fp.url.replace('//', '//bob:pw@') }));
    const res = await chat(proxyUrl, { 'proxy-authorization': 'Basic Y2xpZW50OnNlY3JldA==' });
    expect(res.status).toBe(200);
    expect(await res.text()).toBe(STREAM.join(''));
    expect(fp.connects).toEqual([]);
    expect(fp.requests).toEqual([`POST http://127.0.0.1:${up.port}/base/v1/chat/completions HTTP/1.1`]);
    expect(fp.auths).toEqual([`Basic ${Buffer.from('bob:pw').toString('base64')}`]);
    expect(up.seen).toEqual([`POST /base/v1/chat/completions 127.0.0.1:${up.port}`]);
    expect((await requestLines(1))[0]).toMatchObject({ status: 200, outcome: 'ok', outputTokens: 3 });
  });

  it('goes direct to a host NO_PROXY names (with a port, or a CIDR range), and through the proxy otherwise', async () => {
    const up = await sseUpstream();
    const fp = await forwardProxy();
    for (const noProxy of [`example.com,127.0.0.1:${up.port}`, '10.0.0.0/8 127.0.0.0/8', '*']) {
      const proxyUrl = await start(`http://127.0.0.1:${up.port}`, proxyEnv({ NODE_USE_ENV_PROXY: '1', http_proxy: fp.url, no_proxy: noProxy }));
      expect(await (await chat(proxyUrl)).text()).toBe(STREAM.join(''));
      // The start line says which routes go through which proxy.
      expect(spawned!.lines.find((l) => l.msg === 'listening')!.routes).toEqual([{ prefix: '/', upstream: `http://127.0.0.1:${up.port}` }]);
      await spawned!.stop();
    }
    expect(fp.requests).toEqual([]);
    // A port that does not match is proxied.
    const proxyUrl = await start(`http://127.0.0.1:${up.port}`, proxyEnv({ NODE_USE_ENV_PROXY: '1', http_proxy: fp.url.replace('//', '//u:secret@'), no_proxy: '127.0.0.1:1' }));
    expect(spawned!.lines.find((l) => l.msg === 'listening')!.routes).toEqual([{ prefix: '/', upstream: `http://127.0.0.1:${up.port}`, via: fp.url }]);
    expect(await (await chat(proxyUrl)).text()).toBe(STREAM.join(''));
    expect(fp.requests).toHaveLength(1);
  });

  it('never sends the built-in simulator (on this host\'s loopback) through the egress proxy', async () => {
    const fp = await forwardProxy();
    spawned = spawnCli(['--host', '127.0.0.1', '--port', '0', '--metrics-port', '0', '--log-level', 'info'], proxyEnv({ NODE_USE_ENV_PROXY: '1', http_proxy: fp.url }));
    const proxyUrl = (await spawned.waitFor((l) => l.msg === 'listening')).proxyUrl as string;
    const res = await chat(proxyUrl);
    expect(res.status).toBe(200);
    expect(await res.text()).toContain('data: [DONE]');
    expect(fp.requests).toEqual([]);
    expect(fp.connects).toEqual([]);
  });

  it('says at start, at warn, when env was asked for and no variable names a proxy, then goes direct', async () => {
    const up = await sseUpstream();
    const proxyUrl = await start(`http://127.0.0.1:${up.port}`, proxyEnv({ LLM_PROXY_EGRESS_PROXY: 'env', HTTPS_PROXY: '' }));
    const at = spawned!.lines.findIndex((l) => l.level === 40 && String(l.msg).startsWith('LLM_PROXY_EGRESS_PROXY=env, but none of'));
    expect(at).toBeGreaterThanOrEqual(0);
    expect(at).toBeLessThan(spawned!.lines.findIndex((l) => l.msg === 'listening'));
    expect(await (await chat(proxyUrl)).text()).toBe(STREAM.join(''));
  });

  it('ignores the proxy variables unless told to use them (as Node does), and a config file can name the proxy itself', async () => {
    const up = await sseUpstream();
    const fp = await forwardProxy();
    let proxyUrl = await start(`http://127.0.0.1:${up.port}`, proxyEnv({ HTTP_PROXY: fp.url, http_proxy: fp.url }));
    expect(await (await chat(proxyUrl)).text()).toBe(STREAM.join(''));
    expect(fp.requests).toEqual([]);
    await spawned!.stop();
    const dir = fs.mkdtempSync('/tmp/llp-egress-');
    cleanups.push(async () => fs.rmSync(dir, { recursive: true, force: true }));
    fs.writeFileSync(`${dir}/c.yaml`, `egressProxy: ${fp.url}\nnoProxy: [example.com]\n`);
    proxyUrl = await start(`http://127.0.0.1:${up.port}`, proxyEnv({}), ['--config', `${dir}/c.yaml`]);
    expect(await (await chat(proxyUrl)).text()).toBe(STREAM.join(''));
    expect(fp.requests).toHaveLength(1);
  });

  it('a proxy that refuses the tunnel (407) or cannot be reached is a 502 that names the proxy, recorded as upstream_unreachable', async () => {
    const fp = await forwardProxy({ credentials: 'alice:right' });
    let proxyUrl = await start('https://api.example.test', proxyEnv({ NODE_USE_ENV_PROXY: '1', HTTPS_PROXY: fp.url.replace('//', '//alice:wrong@') }));
    let res = await chat(proxyUrl);
    expect(res.status).toBe(502);
    expect(((await res.json()) as { error: { message: string } }).error.message).toBe(`upstream unreachable: egress proxy ${fp.url} answered CONNECT api.example.test:443 with 407 Proxy Authentication Required`);
    expect((await requestLines(1))[0]).toMatchObject({ status: 502, outcome: 'error', errorType: 'upstream_unreachable' });
    expect(fp.connects).toEqual(['api.example.test:443']);
    await spawned!.stop();

    const closed = net.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const deadPort = (closed.address() as AddressInfo).port;
    await new Promise<void>((r) => closed.close(() => r()));
    // The proxy named for an https upstream (CONNECT) and for a plain-http one (absolute-form) alike.
    for (const upstream of ['https://api.example.test', 'http://api.example.test']) {
      await spawned!.stop();
      proxyUrl = await start(upstream, proxyEnv({ NODE_USE_ENV_PROXY: '1', HTTP_PROXY: `http://127.0.0.1:${deadPort}` }));
      res = await chat(proxyUrl);
      expect(res.status).toBe(502);
      expect(((await res.json()) as { error: { message: string } }).error.message).toBe(`upstream unreachable: egress proxy http://127.0.0.1:${deadPort}: ECONNREFUSED`);
      // The log's line keeps Node's own words beside the code, once.
      await requestLines(1);
      const warn = spawned!.lines.find((l) => l.msg === 'upstream request failed');
      expect(warn).toMatchObject({ err: `egress proxy http://127.0.0.1:${deadPort}: ECONNREFUSED`, cause: `connect ECONNREFUSED 127.0.0.1:${deadPort}`, code: 'ECONNREFUSED' });
    }
  });

  it('a proxy that never answers the CONNECT is the connect timeout (504)', async () => {
    const fp = await forwardProxy({ silent: true });
    const dir = fs.mkdtempSync('/tmp/llp-egress-');
    cleanups.push(async () => fs.rmSync(dir, { recursive: true, force: true }));
    fs.writeFileSync(`${dir}/c.yaml`, `egressProxy: ${fp.url}\ntimeouts: { connect: 0.3 }\n`);
    const proxyUrl = await start('https://api.example.test', proxyEnv({}), ['--config', `${dir}/c.yaml`]);
    const res = await chat(proxyUrl);
    expect(res.status).toBe(504);
    expect(((await res.json()) as { error: { message: string } }).error.message).toBe(
      `upstream connect timeout (the egress proxy did not answer CONNECT api.example.test:443; through egress proxy ${fp.url})`,
    );
    expect((await requestLines(1))[0]).toMatchObject({ status: 504, outcome: 'error', errorType: 'timeout' });
  });

  it('an upstream that never finishes TLS inside an open tunnel is the connect timeout (504), not the proxy\'s failure (502)', async () => {
    const accepted = new Set<net.Socket>();
    const mute = net.createServer((s) => { // accepts, never answers the ClientHello
      accepted.add(s);
      s.on('error', () => {});
    });
    await new Promise<void>((r) => mute.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise<void>((r) => { for (const s of accepted) s.destroy(); mute.close(() => r()); }));
    const fp = await forwardProxy();
    const dir = fs.mkdtempSync('/tmp/llp-egress-');
    cleanups.push(async () => fs.rmSync(dir, { recursive: true, force: true }));
    fs.writeFileSync(`${dir}/c.yaml`, `egressProxy: ${fp.url}\ntimeouts: { connect: 0.3 }\n`);
    const proxyUrl = await start(`https://127.0.0.1:${(mute.address() as AddressInfo).port}`, proxyEnv({}), ['--config', `${dir}/c.yaml`]);
    const res = await chat(proxyUrl);
    expect(res.status).toBe(504);
    expect(((await res.json()) as { error: { message: string } }).error.message).toBe(`upstream connect timeout (the TLS handshake with the upstream did not finish; through egress proxy ${fp.url})`);
    expect((await requestLines(1))[0]).toMatchObject({ status: 504, outcome: 'error', errorType: 'timeout' });
  });

  it('an upstream that ends the TLS handshake is unreachable (502), told as a handshake closed, not as an answer cut short; inside a tunnel the proxy is named', async () => {
    const accepted = new Set<net.Socket>();
    // Reads the ClientHello, then: a FIN; a reset; half a ServerHello record and a FIN.
    const enders: Record<string, (s: net.Socket) => void> = { fin: (s) => s.end(), reset: (s) => s.resetAndDestroy(), partial: (s) => s.end(Buffer.from([0x16, 3, 3, 0, 80, 2, 0, 0])) };
    const servers: Record<string, number> = {};
    for (const [name, end] of Object.entries(enders)) {
      const server = net.createServer((s) => {
        accepted.add(s);
        s.on('error', () => {});
        s.once('data', () => end(s));
      });
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      cleanups.push(() => new Promise<void>((r) => { for (const s of accepted) s.destroy(); server.close(() => r()); }));
      servers[name] = (server.address() as AddressInfo).port;
    }
    const fp = await forwardProxy();
    const dir = fs.mkdtempSync('/tmp/llp-egress-');
    cleanups.push(async () => fs.rmSync(dir, { recursive: true, force: true }));
    fs.writeFileSync(`${dir}/c.yaml`, `egressProxy: ${fp.url}\n`);
    for (const through of [false, true]) {
      for (const [name, port] of Object.entries(servers)) {
        await spawned?.stop();
        const proxyUrl = await start(`https://127.0.0.1:${port}`, proxyEnv({}), through ? ['--config', `${dir}/c.yaml`] : []);
        const res = await chat(proxyUrl);
        expect(res.status, `${name}, through the egress proxy: ${through}`).toBe(502);
        const message = ((await res.json()) as { error: { message: string } }).error.message;
        expect(message, name).toBe(`upstream unreachable: ECONNRESET${through ? ` (through egress proxy ${fp.url})` : ''}`);
        expect((await requestLines(1))[0], name).toMatchObject({ status: 502, outcome: 'error', errorType: 'upstream_unreachable' });
        const warn = spawned!.lines.find((l) => l.msg === 'upstream request failed');
        // A reset is read as Node's error (`read ECONNRESET`); a close, as a handshake the server ended.
        if (name === 'reset') expect(String(warn?.err), name).toMatch(/ECONNRESET/);
        else {
          expect(warn?.err, name).toBe(through ? `ECONNRESET (through egress proxy ${fp.url})` : 'upstream closed the connection during the TLS handshake');
          // Through the egress proxy the words come with it, as the cause.
          expect(warn?.cause, name).toBe(through ? 'upstream closed the connection during the TLS handshake' : undefined);
        }
      }
    }
  });

  it('a connect timeout through the egress proxy says how far it got, for requests (also when timeouts.response fires first) and WebSocket upgrades', async () => {
    const cert = selfSignedCert();
    cleanups.push(cert.remove);
    // An https:// proxy that accepts TCP and never answers TLS.
    const accepted = new Set<net.Socket>();
    const mute = net.createServer((s) => {
      accepted.add(s);
      s.on('error', () => {});
    });
    await new Promise<void>((r) => mute.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise<void>((r) => { for (const s of accepted) s.destroy(); mute.close(() => r()); }));
    const muteUrl = `https://127.0.0.1:${(mute.address() as AddressInfo).port}`;
    const silent = await forwardProxy({ silent: true });
    const hang = 'http://proxy.hang.test:3128';
    const dir = fs.mkdtempSync('/tmp/llp-egress-');
    cleanups.push(async () => fs.rmSync(dir, { recursive: true, force: true }));
    const env = proxyEnv({}, { NODE_OPTIONS: `--require ${new URL('../helpers/hang-lookup.cjs', import.meta.url).pathname}` });
    const cases = [
      { upstream: 'http://api.example.test', proxy: hang, timeouts: '{ connect: 0.3 }', expect: `the name lookup of proxy.hang.test did not finish; through egress proxy ${hang}` },
      { upstream: 'https://api.example.test', proxy: hang, timeouts: '{ connect: 0.3 }', expect: `the name lookup of proxy.hang.test did not finish; through egress proxy ${hang}` },
      { upstream: 'https://api.example.test', proxy: muteUrl, timeouts: '{ connect: 0.3 }', expect: `the TLS handshake with the egress proxy did not finish; through egress proxy ${muteUrl}` },
      { upstream: 'https://api.example.test', proxy: silent.url, timeouts: '{ connect: 30, response: 0.3 }', expect: `the egress proxy did not answer CONNECT api.example.test:443; through egress proxy ${silent.url}` },
    ];
    for (const [i, c] of cases.entries()) {
      fs.writeFileSync(`${dir}/c${i}.yaml`, `egressProxy: ${c.proxy}\ntimeouts: ${c.timeouts}\n`);
      const proxyUrl = await start(c.upstream, env, ['--config', `${dir}/c${i}.yaml`]);
      const res = await chat(proxyUrl);
      expect([i, res.status, ((await res.json()) as { error: { message: string } }).error.message]).toEqual([i, 504, `upstream connect timeout (${c.expect})`]);
      if (i === 1) {
        // The same stage for a WebSocket upgrade (its own connection code).
        const u = new URL(proxyUrl);
        const answer = await new Promise<string>((resolve, reject) => {
          const ws = net.connect({ port: Number(u.port), host: u.hostname }, () =>
            ws.write('GET /v1/realtime HTTP/1.1\r\nHost: p\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n'),
          );
          let t = '';
          ws.on('data', (b: Buffer) => (t += b.toString()));
          ws.on('close', () => resolve(t));
          ws.on('error', reject);
        });
        expect(answer).toMatch(/^HTTP\/1\.1 504 /);
        expect(answer).toContain(`upstream connect timeout (${c.expect})`);
      }
      await spawned!.stop();
      spawned = undefined;
    }
  });

  it('an HTTP agent (the OTLP exporter\'s) gives up on a proxy that never answers CONNECT, and closes the connection to it', async () => {
    const fp = await forwardProxy({ silent: true });
    const agent = egressAgentFactory({ http: parseProxyUrl(fp.url), https: undefined, noProxy: [] }, 300)('http:');
    cleanups.push(async () => agent.destroy());
    const outcome = new Promise<string>((resolve) => {
      const req = http.get({ host: 'collector.example.test', port: 4318, path: '/v1/metrics', agent }, () => resolve('answered'));
      req.on('error', (err) => resolve(err.message));
    });
    expect(await Promise.race([outcome, new Promise((r) => setTimeout(() => r('still waiting after 5 s'), 5000))])).toBe(
      `egress proxy ${fp.url} did not open the tunnel to collector.example.test:4318 within 0.3 s`,
    );
    expect(fp.connects).toEqual(['collector.example.test:4318']);
    for (let i = 0; i < 100 && fp.open > 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(fp.open).toBe(0);
  });

  it('checks an IP-literal https upstream\'s certificate against its IP inside the tunnel, not against the egress proxy\'s name (requests, WebSocket upgrades, OTLP pushes)', async () => {
    // Certificates for the name "localhost" only, and for the IP 127.0.0.1; the egress proxy is
    // reached as localhost. An IP-literal upstream sends no SNI: its certificate must hold the IP.
    const byName = selfSignedCert('DNS:localhost');
    const byIp = selfSignedCert('IP:127.0.0.1');
    cleanups.push(byName.remove, byIp.remove);
    const cas = path.join(path.dirname(byName.cert), 'both.pem');
    fs.writeFileSync(cas, fs.readFileSync(byName.cert, 'utf8') + fs.readFileSync(byIp.cert, 'utf8'));
    const fp = await forwardProxy();
    const via = fp.url.replace('127.0.0.1', 'localhost');
    const upgrade = async (proxyUrl: string) => {
      const u = new URL(proxyUrl);
      return new Promise<string>((resolve) => {
        const c = net.connect({ port: Number(u.port), host: u.hostname }, () => {
          c.write('GET /v1/realtime HTTP/1.1\r\nHost: p\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n');
        });
        let t = '';
        c.on('data', (b: Buffer) => {
          t += b.toString();
          if (t.includes('\r\n\r\n')) c.destroy();
        });
        c.on('close', () => resolve(t.split('\r\n')[0]!));
        c.on('error', () => {});
      });
    };
    for (const [cert, ok] of [[byName, false], [byIp, true]] as const) {
      const up = await sseUpstream(cert);
      const proxyUrl = await start(`https://127.0.0.1:${up.port}`, proxyEnv({ NODE_USE_ENV_PROXY: '1', https_proxy: via }, { NODE_EXTRA_CA_CERTS: cas }));
      const res = await chat(proxyUrl);
      expect(res.status, cert === byName ? 'a certificate for localhost only' : 'a certificate for 127.0.0.1').toBe(ok ? 200 : 502);
      expect(await res.text()).toMatch(ok ? /\[DONE\]/ : /ERR_TLS_CERT_ALTNAME_INVALID/);
      expect(await upgrade(proxyUrl)).toMatch(ok ? /^HTTP\/1\.1 101 / : /^HTTP\/1\.1 502 /);
      expect(fp.connects.at(-1)).toBe(`127.0.0.1:${up.port}`);
      await spawned!.stop();
      spawned = undefined;
      // The OTLP exporter's agent, the same way.
      const agent = egressAgentFactory({ http: undefined, https: parseProxyUrl(via), noProxy: [] })('https:');
      cleanups.push(async () => agent.destroy());
      const pushed = await new Promise<string>((resolve) => {
        const req = https.get({ host: '127.0.0.1', port: up.port, path: '/v1/metrics', agent, ca: fs.readFileSync(cas) }, (r) => (r.resume(), resolve(String(r.statusCode))));
        req.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
      });
      expect(pushed).toBe(ok ? '200' : 'ERR_TLS_CERT_ALTNAME_INVALID');
    }
  });

  it('reaches an upstream through an https:// proxy (TLS to the proxy, and TLS inside the tunnel)', async () => {
    const cert = selfSignedCert();
    cleanups.push(cert.remove);
    const up = await sseUpstream(cert);
    const fp = await forwardProxy({ tls: { key: fs.readFileSync(cert.key), cert: fs.readFileSync(cert.cert) } });
    const proxyUrl = await start(`https://localhost:${up.port}`, proxyEnv({ NODE_USE_ENV_PROXY: '1', https_proxy: fp.url.replace('127.0.0.1', 'localhost') }, { NODE_EXTRA_CA_CERTS: cert.cert }));
    expect(await (await chat(proxyUrl)).text()).toBe(STREAM.join(''));
    expect(fp.connects).toEqual([`localhost:${up.port}`]);
  });

  it.each(['http', 'https'])('tunnels a WebSocket upgrade to an %s upstream through CONNECT, bytes both ways', async (scheme) => {
    const cert = selfSignedCert();
    cleanups.push(cert.remove);
    const up = await sseUpstream(scheme === 'https' ? cert : undefined);
    const fp = await forwardProxy({ connectDelayMs: 100 });
    const proxyUrl = await start(`${scheme}://localhost:${up.port}`, proxyEnv({ NODE_USE_ENV_PROXY: '1', http_proxy: fp.url }, { NODE_EXTRA_CA_CERTS: cert.cert }));
    const u = new URL(proxyUrl);
    const got = await new Promise<string>((resolve, reject) => {
      const c = net.connect({ port: Number(u.port), host: u.hostname }, () => {
        c.write('GET /v1/realtime HTTP/1.1\r\nHost: p\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n');
      });
      let t = '';
      c.on('data', (b: Buffer) => {
        t += b.toString();
        if (t.endsWith('\r\n\r\n')) c.write('ping-1');
        if (t.endsWith('ping-1')) {
          c.end();
          resolve(t);
        }
      });
      c.on('error', reject);
    });
    expect(got).toMatch(/^HTTP\/1\.1 101 [^]*\r\n\r\nping-1$/);
    expect(fp.connects).toEqual([`localhost:${up.port}`]);
    for (let i = 0; i < 200 && !spawned!.lines.some((l) => l.msg === 'tunnel'); i++) await new Promise((r) => setTimeout(r, 20));
    const line = spawned!.lines.find((l) => l.msg === 'tunnel')!;
    expect(line).toMatchObject({ status: 101, outcome: 'ok', upstreamAddr: new URL(fp.url).host });
    expect(line.upstreamConnectMs as number).toBeGreaterThanOrEqual(100);
    const metricsUrl = spawned!.lines.find((l) => l.msg === 'listening')!.metricsUrl as string;
    const connects = hist(await scrape(metricsUrl), 'llm_proxy_upstream_connect_duration_seconds', { server_address: 'localhost', server_port: String(up.port) });
    expect([connects.count, connects.sum >= 0.1]).toEqual([1, true]);
  });

  it.each(['https', 'http'])('pushes OTLP to an %s collector through the egress proxy (CONNECT), and directly to one NO_PROXY names', async (scheme) => {
    const cert = selfSignedCert();
    cleanups.push(cert.remove);
    let posts = 0;
    const handler = (req: http.IncomingMessage, res: http.ServerResponse) => {
      req.resume();
      req.on('end', () => {
        if (req.url === '/v1/metrics') posts++;
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      });
    };
    const collector = scheme === 'https' ? https.createServer({ key: fs.readFileSync(cert.key), cert: fs.readFileSync(cert.cert) }, handler) : http.createServer(handler);
    await new Promise<void>((r) => collector.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise<void>((r) => { collector.closeAllConnections(); collector.close(() => r()); }));
    const port = (collector.address() as AddressInfo).port;
    const fp = await forwardProxy();
    const otlp = { OTEL_METRICS_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: `${scheme}://localhost:${port}/v1/metrics`, OTEL_METRIC_EXPORT_INTERVAL: '300', NODE_EXTRA_CA_CERTS: cert.cert };
    let tunnels = 0;
    for (const noProxy of ['', `localhost:${port}`]) {
      posts = 0;
      await start('http://127.0.0.1:9', proxyEnv({ LLM_PROXY_EGRESS_PROXY: 'env', http_proxy: fp.url, no_proxy: noProxy }, otlp));
      for (let i = 0; i < 100 && posts < 2; i++) await new Promise((r) => setTimeout(r, 50));
      expect(posts).toBeGreaterThanOrEqual(2);
      await spawned!.stop();
      spawned = undefined;
      // Through the proxy: tunnels to the collector, kept alive (fewer than the pushes; a push
      // that outlives its 300 ms export timeout on a loaded machine costs its tunnel); with
      // NO_PROXY naming the collector: no new one.
      if (noProxy === '') {
        expect(fp.connects.length).toBeGreaterThanOrEqual(1);
        expect(fp.connects.length).toBeLessThan(posts);
        expect(new Set(fp.connects)).toEqual(new Set([`localhost:${port}`]));
        tunnels = fp.connects.length;
      } else {
        expect(fp.connects).toHaveLength(tunnels);
      }
    }
  });

  it.each([
    ['directly', false],
    ['through CONNECT', true],
  ])('at the drain deadline, a tunnel to a wss: upstream reached %s gets the rest of a frame in flight, then a Close 1001 each way', async (_how, viaConnect) => {
    // The upstream's reads come from TLS: through CONNECT as 'data' events on a TLS socket over
    // the tunnel, directly through `onread`. It sends the 101 with 12 bytes of a 102-byte frame;
    // once the proxy's Close comes, the frame's rest and a next frame, in one write.
    const FRAME = Buffer.concat([Buffer.from([0x81, 100]), Buffer.alloc(100, 0x62)]);
    const NEXT = Buffer.concat([Buffer.from([0x81, 4]), Buffer.from('next')]);
    const CLOSE = Buffer.concat([Buffer.from([0x88, 21, 0x03, 0xe9]), Buffer.from('proxy shutting down')]);
    const cert = selfSignedCert();
    cleanups.push(cert.remove);
    let upstreamRead!: Promise<Buffer>;
    const server = https.createServer({ key: fs.readFileSync(cert.key), cert: fs.readFileSync(cert.cert) });
    server.on('upgrade', (_req: http.IncomingMessage, socket: net.Socket) => {
      socket.on('error', () => {});
      socket.write(Buffer.concat([Buffer.from('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n', 'latin1'), FRAME.subarray(0, 12)]));
      const got: Buffer[] = [];
      socket.once('data', () => socket.write(Buffer.concat([FRAME.subarray(12), NEXT])));
      socket.on('data', (b: Buffer) => got.push(b));
      // Also on a reset (a regression), which would otherwise leave the test waiting.
      upstreamRead = new Promise((r) => {
        socket.once('end', () => socket.end());
        socket.once('close', () => r(Buffer.concat(got)));
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    cleanups.push(
      () =>
        new Promise<void>((r) => {
          server.closeAllConnections();
          server.close(() => r());
        }),
    );
    const port = (server.address() as AddressInfo).port;
    const fp = viaConnect ? await forwardProxy() : undefined;
    const proxyUrl = await start(`https://localhost:${port}`, proxyEnv(fp ? { NODE_USE_ENV_PROXY: '1', https_proxy: fp.url } : {}, { NODE_EXTRA_CA_CERTS: cert.cert }), ['--drain-timeout', '0.2']);
    const u = new URL(proxyUrl);
    const c = net.connect({ port: Number(u.port), host: u.hostname });
    cleanups.push(async () => void c.destroy());
    const chunks: Buffer[] = [];
    let error: string | undefined;
    c.on('error', (e: NodeJS.ErrnoException) => (error = e.code));
    c.on('data', (b: Buffer) => chunks.push(b));
    // The 101 and the frame's first 12 bytes have come through.
    const opened = new Promise<void>((r) => c.on('data', () => Buffer.concat(chunks).includes(FRAME.subarray(0, 12)) && r()));
    const closed = new Promise<Buffer>((r) => c.once('close', () => r(Buffer.concat(chunks))));
    c.write('GET /v1/realtime HTTP/1.1\r\nHost: p\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n');
    await opened;
    const exited = spawned!.stop();
    const read = await closed;
    expect(error).toBeUndefined();
    expect(read.subarray(read.length - FRAME.length - CLOSE.length).equals(Buffer.concat([FRAME, CLOSE]))).toBe(true);
    expect(read.includes(NEXT)).toBe(false);
    // The upstream, a WebSocket server, reads the proxy's masked Close.
    let told: unknown = 'no Close';
    const r = new Receiver({ isServer: true });
    r.on('conclude', (code: number, reason: Buffer) => (told = { code, reason: reason.toString() }));
    r.on('error', (e: Error) => (told = e.message));
    r.write(await upstreamRead);
    expect(told).toEqual({ code: 1001, reason: 'proxy shutting down' });
    expect(await exited).toBe(0);
    expect(spawned!.lines.find((l) => l.msg === 'tunnel')).toMatchObject({ errorType: 'shutdown_deadline', goingAway: ['client', 'upstream'] });
    expect(spawned!.lines.find((l) => l.msg === 'drain deadline reached: closed tunnels')).toMatchObject({ cut: 0, tunnels: 1 });
    if (fp) expect(fp.connects).toEqual([`localhost:${port}`]);
  });
});
