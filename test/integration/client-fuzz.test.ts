// What any client may send: requests of every shape the proxy serves (Content-Length and
// chunked bodies, pipelined requests, HTTP/1.0, Expect: 100-continue, a WebSocket upgrade),
// with bytes replaced, inserted, deleted or repeated, written in pieces, and then half-closed,
// reset or left open. The proxy must never throw (vitest fails the run on an uncaught error in
// this process), must answer only in HTTP/1.1, must never send upstream a request that Node's
// parser refuses or one it did not log (a smuggled request), nor a hop-by-hop field of the
// client's (RFC 9110 §7.6.1: only a tunnel's own Connection and Upgrade), and must go on serving.
import http, { type IncomingMessage } from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { chunked, mutationArb, mutate, writeInPieces } from '../helpers/byte-mutations.js';
import { HOP_BY_HOP } from '../helpers/http.js';
import { settledLoad, startTestProxy } from '../helpers/proxy.js';

const BODY = '{"model":"fuzz","stream":true,"messages":[{"role":"user","content":"hi"}]}';
const SSE = ['{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', '{"choices":[{"index":0,"delta":{"content":"a"}}]}', '{"choices":[{"index":0,"delta":{"content":"b"}}]}']
  .map((d) => `data: ${d}\n\n`)
  .join('') + 'data: [DONE]\n\n';
const WS_HEAD = 'Connection: Upgrade\r\nUpgrade: websocket\r\nKeep-Alive: timeout=77\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n';

/** Hop-by-hop fields a client may send, none of which is passed on. */
const HOPS = 'Connection: X-Trace\r\nKeep-Alive: timeout=77\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nProxy-Authorization: Basic eDp5\r\n';

const request: fc.Arbitrary<string> = fc.oneof(
  fc.constant(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n${HOPS}Content-Type: application/json\r\nContent-Length: ${BODY.length}\r\n\r\n${BODY}`),
  fc.array(fc.nat(), { maxLength: 4 }).map((cuts) => `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTrailer: X-T\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\n\r\n${chunked(BODY, cuts)}`),
  fc.constant('GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n'),
  fc.constant(`POST /v1/chat/completions HTTP/1.0\r\nContent-Length: ${BODY.length}\r\n\r\n${BODY}`),
  fc.constant(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: ${BODY.length}\r\n\r\n${BODY}`),
  // A masked text frame after the upgrade's head.
  fc.constant(`GET /v1/realtime?model=m HTTP/1.1\r\nHost: x\r\n${WS_HEAD}\r\n\x81\x82\x00\x00\x00\x00hi`),
);

/** Bytes that change how HTTP/1.1 is read. */
const NASTY = ['\r', '\n', '\r\n', '\0', ' ', '\t', ':', '0', 'ffffffffffffffff', ';ext=1', '\x80', '\xff', 'HTTP/1.1', '\r\n\r\n',
  'Transfer-Encoding: chunked\r\n', 'Content-Length: 5\r\n', 'Content-Length: -1\r\n', 'Transfer-Encoding: gzip\r\n', 'Connection: close\r\n', 'Host: y\r\n', 'x'.repeat(70_000)];

interface Script {
  bytes: Buffer;
  cuts: number[];
  end: 'end' | 'destroy' | 'open';
}
const script: fc.Arbitrary<Script> = fc
  .record({
    requests: fc.array(request, { minLength: 1, maxLength: 3 }),
    mutations: fc.array(mutationArb(NASTY), { maxLength: 3 }),
    cuts: fc.array(fc.nat(), { maxLength: 3 }),
    end: fc.constantFrom('end', 'destroy', 'open'),
  })
  .map(({ requests, mutations, cuts, end }) => ({ bytes: Buffer.from(mutations.reduce(mutate, requests.join('')), 'latin1'), cuts, end }) as Script);

/** Plays a script on a new connection; what came back, once the proxy closed or went quiet for 100 ms. */
function play(port: number, s: Script): Promise<string> {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let text = '';
    let quiet: NodeJS.Timeout | undefined;
    const finish = () => {
      clearTimeout(quiet);
      sock.destroy();
      resolve(text);
    };
    const settle = () => {
      clearTimeout(quiet);
      quiet = setTimeout(finish, 100);
    };
    sock.on('data', (d: Buffer) => {
      text += d.toString('latin1');
      settle();
    });
    sock.on('error', () => {});
    sock.on('close', finish);
    sock.on('connect', async () => {
      if (!(await writeInPieces(sock, s.bytes, s.cuts))) return;
      if (s.end === 'end') sock.end();
      else if (s.end === 'destroy') sock.resetAndDestroy();
      settle();
    });
  });
}

let up: http.Server;
let proxy: RunningProxy;
const seen: { method: string; url: string; id: unknown }[] = [];
/** The bodies of the well-formed probes, as the upstream got them. */
const probeBodies: string[] = [];
const parseErrors: string[] = [];
/** Hop-by-hop fields the upstream got: none may come but a tunnel's own Connection and Upgrade. */
const hopLeaks: string[] = [];
function leaks(req: IncomingMessage, tunnel: boolean): string[] {
  const out: string[] = [];
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const n = req.rawHeaders[i]!.toLowerCase();
    const v = req.rawHeaders[i + 1]!;
    if (!HOP_BY_HOP.has(n) || n === 'transfer-encoding') continue; // the proxy frames the body it sends
    if (tunnel && ((n === 'connection' && v.toLowerCase() === 'upgrade') || n === 'upgrade')) continue; // the client's protocol, as it named it
    out.push(`${req.method} ${req.url} ${n}: ${v}`);
  }
  return out;
}
const logLines: Record<string, unknown>[] = [];
const upSockets = new Set<net.Socket>();

beforeAll(async () => {
  up = http.createServer((req: IncomingMessage, res) => {
    seen.push({ method: req.method!, url: req.url!, id: req.headers['x-request-id'] });
    hopLeaks.push(...leaks(req, false));
    const parts: Buffer[] = [];
    req.on('data', (d: Buffer) => parts.push(d));
    req.on('end', () => {
      if (req.url!.endsWith('?probe')) probeBodies.push(Buffer.concat(parts).toString('latin1'));
      if (req.method === 'POST') {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(SSE);
      } else res.end('{"data":[]}');
    });
  });
  // A parse error is a malformed request the proxy sent. A reset is not, nor a close in the
  // middle of a request (HPE_INVALID_EOF_STATE): the proxy cancels the upstream request when the
  // client leaves, as it does on a half-close (Node's server, like nginx, takes a FIN as leaving).
  up.on('clientError', (err: NodeJS.ErrnoException, socket) => {
    if (err.code?.startsWith('HPE_') && err.code !== 'HPE_INVALID_EOF_STATE') parseErrors.push(`${err.code}: ${err.message}`);
    socket.destroy();
  });
  up.on('upgrade', (req: IncomingMessage, socket: net.Socket) => {
    seen.push({ method: req.method!, url: req.url!, id: req.headers['x-request-id'] });
    hopLeaks.push(...leaks(req, true));
    socket.on('error', () => {});
    // An upgraded socket is not read unless resumed: without it the proxy's FIN is never seen.
    socket.on('end', () => socket.destroy());
    socket.resume();
    socket.end('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n');
  });
  up.on('connection', (s) => {
    upSockets.add(s);
    s.on('close', () => upSockets.delete(s));
  });
  await new Promise<void>((r) => up.listen(0, '127.0.0.1', r));
  proxy = await startTestProxy(`http://127.0.0.1:${(up.address() as AddressInfo).port}`, {}, { logLevel: 'info', logLines });
});

afterAll(async () => {
  await proxy?.close();
  up?.closeAllConnections();
  await new Promise<void>((r) => (up ? up.close(() => r()) : r()));
});

/** A well-formed streamed request on a new connection: its status and body. */
async function healthy(): Promise<{ status: number; body: string }> {
  const res = await fetch(`${proxy.proxyUrl}/v1/chat/completions?probe`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: BODY });
  return { status: res.status, body: await res.text() };
}

describe('any bytes from a client', () => {
  it('mutated requests of every shape, in pieces, half-closed, reset or left open: no throw, HTTP/1.1 answers only, nothing malformed or unlogged upstream, and the proxy serves on', async () => {
    const port = Number(new URL(proxy.proxyUrl).port);
    let runs = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(script, { minLength: 1, maxLength: 3 }), async (scripts) => {
        runs++;
        const errorsBefore = parseErrors.length;
        const answers = await Promise.all(scripts.map((s) => play(port, s)));
        answers.forEach((a, i) => {
          if (a !== '') expect(a.startsWith('HTTP/1.1 '), JSON.stringify(scripts[i]!.bytes.toString('latin1').slice(0, 400))).toBe(true);
        });
        expect(parseErrors.slice(errorsBefore)).toEqual([]);
        expect(await healthy()).toEqual({ status: 200, body: SSE });
        expect(probeBodies.at(-1)).toBe(BODY); // and the upstream got its body unchanged
      }),
      { numRuns: 150 },
    );
    expect(runs).toBe(150);
    expect(parseErrors).toEqual([]);
    expect(hopLeaks).toEqual([]);

    // Every request the upstream got is one the proxy logged, by its X-Request-Id (a request's
    // line or a tunnel's), with the same method and path, once: however the client's bytes were
    // cut, nothing reached the upstream that the proxy did not read as that request.
    const lines = () => logLines.filter((l) => l.msg === 'request' || l.msg === 'tunnel');
    const byId = () => new Map(lines().map((l) => [l.reqId, l]));
    for (let i = 0; i < 100 && seen.some((s) => !byId().has(s.id)); i++) await sleep(20);
    const logged = byId();
    expect(new Set(seen.map((s) => s.id)).size).toBe(seen.length);
    for (const s of seen) {
      const l = logged.get(s.id);
      expect(l && [l.method, l.path], `${s.method} ${s.url}`).toEqual([s.method, s.url.split('?')[0]]); // the log's path has no query
    }
    // The generator reached the upstream with streamed requests, and the proxy refused others.
    expect(seen.filter((s) => s.method === 'POST' && !s.url.endsWith('?probe')).length).toBeGreaterThan(20);
    expect(logLines.filter((l) => l.msg === 'request' && l.outcome === 'refused').length).toBeGreaterThan(5);
    expect(logLines.filter((l) => l.msg === 'tunnel' && l.status === 101).length).toBeGreaterThan(0);

    // Once the clients are gone, no request is left active, nor in flight (tunnels too).
    expect(await settledLoad(proxy)).toEqual({ active: 0, inFlight: 0 });
  });
});
