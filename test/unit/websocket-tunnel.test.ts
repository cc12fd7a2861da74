import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net, { type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket, WebSocketServer, type RawData } from 'ws';
import type { RunningProxy } from '../../src/main.js';
import { afterHead, pump, type Progress } from '../helpers/flood.js';
import { startForwardProxy } from '../helpers/forward-proxy.js';
import { hist, scrape } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';
import { selfSignedCert } from '../helpers/tls.js';
import { Receiver } from '../helpers/ws-frames.js';
import { buildConfig } from '../../src/config.js';
import { createLogger } from '../../src/log.js';
import { startProxy } from '../../src/main.js';
import { upstreamTlsContext } from '../../src/proxy/tls-context.js';
import { FRAME_FINISH_MS } from '../../src/proxy/tunnel.js';

// WebSocket upgrades (OpenAI's Realtime API, Gemini's Live API) pass through as a byte tunnel;
// every other Upgrade (h2c, which Java's HttpClient asks for over http://) stays a plain
// HTTP/1.1 request. On Node 20 the proxy's server decides through its request class, on
// Node 22.21+/24.9+ through `shouldUpgradeCallback`: CI runs this file on both lines.
// Both ends here are the `ws` library (handshake, masking, permessage-deflate, close codes).

let upstream: http.Server;
let upstreamUrl: string;
let proxy: RunningProxy;
let wsBase: string;
/** When the upstream last sent its greeting: the idle test's lower bound counts from it. */
let greetedAt = 0;
/** Upgrade requests as they reached the upstream. */
const upgrades: http.IncomingMessage[] = [];
/** Plain requests as they reached the upstream. */
const plain: { method: string; url: string; headers: http.IncomingHttpHeaders; body: string }[] = [];
const wss = new WebSocketServer({ noServer: true, perMessageDeflate: true });
const serverClose: Promise<{ code: number; reason: string }>[] = [];
/** What raw upstreams read from the client after they had ended their half. */
const afterUpstreamEnd: string[] = [];
/** What each `/partial` upstream read, to its connection's close, when its first read came, and the error that closed it. */
const partialEnds: Promise<{ read: Buffer; firstAt: number | undefined; error: string | undefined }>[] = [];
/** Per /partial upstream, when its first bytes came from the proxy (its Close, in the idle test). */
const partialFirst: Promise<void>[] = [];
const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
/** The `/partial` upstream's 100-byte text frame, of which it first sends 12 bytes (head and 10 of payload), and a frame after it. */
const DOWN_FRAME = Buffer.concat([Buffer.from([0x81, 100]), Buffer.alloc(100, 0x61)]);
const NEXT_FRAME = Buffer.concat([Buffer.from([0x81, 4]), Buffer.from('next')]);
/** `/partial?down-big`'s binary frame: 12 MiB, more than the socket buffers on the way hold; its last BIG_REST bytes come after the proxy's Close. */
const BIG_REST = 1000;
const BIG_FRAME = (() => {
  const len = 12 * 1024 * 1024;
  const head = Buffer.from([0x82, 127, 0, 0, 0, 0, 0, 0, 0, 0]);
  head.writeUInt32BE(len, 6);
  return Buffer.concat([head, randomBytes(len)]);
})();

beforeAll(async () => {
  upstream = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      plain.push({ method: req.method!, url: req.url!, headers: req.headers, body });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ ok: true, url: req.url }));
    });
  });
  upstream.on('upgrade', (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => {
    upgrades.push(req);
    if (req.url!.startsWith('/decline')) {
      // What a server without WebSocket support on that path answers (keep-alive on purpose),
      // a moment later; whatever else arrives on the connection is recorded.
      if (head.length > 0) plain.push({ method: 'AFTER-DECLINE', url: '', headers: {}, body: head.toString() });
      socket.on('data', (b: Buffer) => plain.push({ method: 'AFTER-DECLINE', url: '', headers: {}, body: b.toString() }));
      socket.on('end', () => socket.end()); // the server's sockets are half-open ones
      setTimeout(() => socket.write('HTTP/1.1 426 Upgrade Required\r\nContent-Type: text/plain\r\nContent-Length: 12\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\nno websocket'), 150);
      return;
    }
    if (req.url!.startsWith('/stall')) {
      // A declined answer that never ends: 5 of its 100 bytes.
      socket.on('error', () => {});
      socket.write('HTTP/1.1 403 Forbidden\r\nContent-Length: 100\r\n\r\nhello');
      return;
    }
    if (req.url!.startsWith('/bad101')) {
      socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n');
      socket.on('error', () => {});
      return;
    }
    if (req.url!.startsWith('/halfup') || req.url!.startsWith('/reset')) {
      // Raw: a 101, a last word, then this side's end (or a reset); what the client sends after is kept.
      socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nbye');
      if (req.url!.startsWith('/reset')) return setTimeout(() => socket.resetAndDestroy(), 50);
      socket.end();
      let got = '';
      socket.on('data', (b: Buffer) => (got += b.toString()));
      socket.on('end', () => afterUpstreamEnd.push(got));
      return;
    }
    if (req.url!.startsWith('/hops')) {
      // Heads with hop-by-hop fields: a 103, then a 101 and a last word; or a declined answer.
      socket.on('error', () => {});
      if (req.url!.startsWith('/hops-declined')) {
        return void socket.end('HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nProxy-Authenticate: Basic realm="up"\r\nUpgrade: h2c\r\nTE: trailers\r\nConnection: X-Hop\r\nX-Hop: 1\r\nTrailer: X-T\r\nKeep-Alive: timeout=9\r\nContent-Length: 2\r\n\r\nno');
      }
      socket.write('HTTP/1.1 103 Early Hints\r\nLink: </a>\r\nConnection: X-Hop, keep-alive\r\nX-Hop: internal\r\nKeep-Alive: timeout=9\r\n\r\n');
      socket.end('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade, X-Also\r\nX-Also: hop\r\nKeep-Alive: timeout=9\r\nSec-WebSocket-Accept: abc\r\n\r\nbye');
      return;
    }
    if (req.url!.startsWith('/partial')) {
      // A 101 and, with ?down, 10 bytes of a 100-byte text frame: the tunnel stays mid-frame
      // towards the client. With ?down-finish, once anything comes (the proxy's Close), the
      // frame's other 90 bytes and a next frame, in one write, as a server finishing its frame
      // before it answers a Close would (with ?down-big, all of BIG_FRAME but its last BIG_REST
      // bytes first, and those after the Close); with ?down-end, its half's end instead; with ?down-bad,
      // only the frame head's first byte, and then the rest of a head that breaks the protocol. What the upstream reads, and how its connection ended, are kept.
      const accept = createHash('sha1').update(`${req.headers['sec-websocket-key']}${GUID}`).digest('base64');
      const head = `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`;
      const down = req.url!.includes('down-bad')
        ? DOWN_FRAME.subarray(0, 1)
        : req.url!.includes('down-big')
          ? BIG_FRAME.subarray(0, BIG_FRAME.length - BIG_REST)
          : req.url!.includes('down')
            ? DOWN_FRAME.subarray(0, 12)
            : Buffer.alloc(0);
      socket.write(Buffer.concat([Buffer.from(head, 'latin1'), down])); // one write: the proxy has it all with the 101
      const got: Buffer[] = [];
      let error: string | undefined;
      if (req.url!.includes('down-finish')) socket.once('data', () => socket.write(Buffer.concat([DOWN_FRAME.subarray(12), NEXT_FRAME])));
      if (req.url!.includes('down-big')) socket.once('data', () => socket.write(Buffer.concat([BIG_FRAME.subarray(BIG_FRAME.length - BIG_REST), NEXT_FRAME])));
      if (req.url!.includes('down-end')) socket.once('data', () => socket.end()); // its half ends, the frame unfinished
      if (req.url!.includes('down-bad')) socket.once('data', () => socket.write(Buffer.from([0x85, 1, 2, 3, 4]))); // a masked server frame: a protocol break
      let firstAt: number | undefined;
      partialFirst.push(new Promise((r) => socket.once('data', () => r())));
      socket.on('data', (b: Buffer) => {
        firstAt ??= performance.now();
        got.push(b);
      });
      socket.on('error', (e: NodeJS.ErrnoException) => (error = e.code));
      partialEnds.push(
        new Promise((r) => {
          socket.once('end', () => socket.end()); // the server's sockets are half-open ones
          socket.once('close', () => r({ read: Buffer.concat(got), firstAt, error }));
        }),
      );
      return;
    }
    if (req.url!.startsWith('/silent')) return socket.destroy(); // accepts the TCP connection, never answers
    if (req.url!.startsWith('/hang')) return void socket.on('error', () => {}); // reads the upgrade, never answers
    if (req.url!.startsWith('/flood')) return flood(socket);
    if (req.url!.startsWith('/sink')) return sink(socket);
    if (req.url!.startsWith('/pattern')) return pattern(socket, Number(new URL(req.url!, 'http://x').searchParams.get('id')));
    wss.handleUpgrade(req, socket, head, (ws) => {
      let closed!: (c: { code: number; reason: string }) => void;
      serverClose.push(new Promise((r) => (closed = r)));
      ws.on('close', (code, reason) => closed({ code, reason: reason.toString() }));
      ws.on('message', (data: RawData, isBinary: boolean) => {
        const text = isBinary ? '' : data.toString();
        if (text === 'close-4001') return ws.close(4001, 'server says bye');
        ws.send(data, { binary: isBinary });
      });
      greetedAt = performance.now();
      ws.send('hello from upstream');
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  proxy = await startTestProxy(upstreamUrl);
  wsBase = proxy.proxyUrl.replace(/^http/, 'ws');
});

/** Bytes a flooding peer sends through the tunnel (far more than every socket buffer on the way holds). */
const FLOOD_BYTES = 64 * 1024 * 1024;
const floodChunk = randomBytes(256 * 1024);
/** The raw upstreams of the backpressure test: how far they got. */
const floods: Progress[] = [];
const sinks: { read: number; socket: net.Socket }[] = [];
const SWITCHED = 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n';

/** A proxy to the upstream here whose log lines (at `warn`, the production level) are kept, parsed. */
async function loggedProxy(file: Parameters<typeof buildConfig>[0] = {}, level = 'warn'): Promise<{ p: RunningProxy; lines: Record<string, unknown>[] }> {
  const lines: Record<string, unknown>[] = [];
  const config = buildConfig(file, { upstream: upstreamUrl, port: 0, metricsPort: 0, logLevel: level });
  const p = await startProxy(config, createLogger(level, { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) }));
  return { p, lines };
}

/** The proxy's Close 1001 at the shutdown deadline, and at the idle timeout, as a client reads them (unmasked). */
const CLOSE = Buffer.concat([Buffer.from([0x88, 21, 0x03, 0xe9]), Buffer.from('proxy shutting down')]);
const IDLE_CLOSE = Buffer.concat([Buffer.from([0x88, 14, 0x03, 0xe9]), Buffer.from('idle timeout')]);

/** A masked client text frame with `payload` (under 126 bytes). */
function clientFrame(payload: Buffer, mask = randomBytes(4)): Buffer {
  return Buffer.concat([Buffer.from([0x81, 0x80 | payload.length]), mask, payload.map((b, i) => b ^ mask[i % 4]!)]);
}

/**
 * A raw client's upgrade (with `extra` bytes in the same write, held by the proxy until the 101)
 * through `p`, read to its close (`toldAt`: when the proxy's Close, `told`, had come); `onClose`:
 * written once it has come ('end': this half's end then). Raw, not ws: a ws peer reports 1006 for a reset and for a Close
 * pushed into a frame's payload alike; a raw one tells a reset (ECONNRESET) from bytes that came.
 */
function rawClient(p: RunningProxy, path: string, extra: Buffer = Buffer.alloc(0), onClose?: Buffer | 'end', told: Buffer = CLOSE) {
  const key = randomBytes(16).toString('base64');
  const url = new URL(p.proxyUrl);
  const c = net.connect(Number(url.port), url.hostname);
  const chunks: Buffer[] = [];
  let error: string | undefined;
  let then = onClose;
  let toldAt: number | undefined;
  let opening!: () => void;
  const opened = new Promise<void>((r) => (opening = r));
  // What is searched: each read with the bytes before it that a match ending in it could start
  // in (searching all that came at each read took seconds for a frame of megabytes).
  let tail = Buffer.alloc(0);
  c.on('data', (b: Buffer) => {
    chunks.push(b);
    const scan = Buffer.concat([tail, b]);
    tail = scan.subarray(Math.max(0, scan.length - Math.max(told.length, 4) + 1));
    if (scan.includes('\r\n\r\n')) opening();
    if (toldAt !== undefined || !scan.includes(told)) return;
    toldAt = performance.now();
    if (then === 'end') c.end();
    else if (then !== undefined) c.write(then);
    then = undefined;
  });
  c.on('error', (e: NodeJS.ErrnoException) => (error = e.code));
  const closed = new Promise<{ read: Buffer; error: string | undefined; at: number; toldAt: number | undefined }>((r) =>
    c.once('close', () => r({ read: Buffer.concat(chunks), error, at: performance.now(), toldAt })),
  );
  c.write(Buffer.concat([Buffer.from(`GET ${path} HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${key}\r\n\r\n`, 'latin1'), extra]));
  return { opened, closed, socket: c };
}

/** The Close (code and reason) a WebSocket server reads in what the upstream got, after any frames before it. */
function decode(bytes: Buffer): unknown {
  let told: unknown = `no Close in the ${bytes.length} bytes`;
  const r = new Receiver({ isServer: true });
  r.on('conclude', (code: number, reason: Buffer) => (told = { code, reason: reason.toString() }));
  r.on('error', (e: Error) => (told = e.message));
  r.write(bytes);
  return told;
}

/** A raw upstream that answers 101, then floods the tunnel. */
function flood(socket: net.Socket): void {
  socket.on('error', () => {});
  socket.resume(); // reads (and drops) whatever comes, to see the client's end
  socket.on('end', () => socket.end()); // the server's sockets are half-open ones
  socket.write(SWITCHED);
  floods.push(pump(socket, FLOOD_BYTES, () => floodChunk));
}

/** A raw upstream that answers 101 and reads nothing until told to (its reads are counted). */
function sink(socket: net.Socket): void {
  socket.on('error', () => {});
  socket.pause();
  const state = { read: 0, socket };
  sinks.push(state);
  socket.on('data', (b: Buffer) => (state.read += b.length));
  socket.on('end', () => socket.end());
  socket.write(SWITCHED);
}

/** Byte `o` of tunnel `id`'s stream: no period that a read or a buffer size could line up with. */
const patternByte = (id: number, o: number): number => (o * 31 + id * 101 + (o >>> 13) * 7 + (o >>> 17)) & 0xff;
const PATTERN_BYTES = 8 * 1024 * 1024;

/** A raw upstream that answers 101, then streams its pattern (reads and drops what comes). */
function pattern(socket: net.Socket, id: number): void {
  socket.on('error', () => {});
  socket.resume();
  socket.on('end', () => socket.end());
  socket.write(SWITCHED);
  const pieceAt = (o: number) => {
    const b = Buffer.allocUnsafe(Math.min(50_000, PATTERN_BYTES - o)); // no multiple of any buffer size
    for (let j = 0; j < b.length; j++) b[j] = patternByte(id, o + j);
    return b;
  };
  pump(socket, PATTERN_BYTES, pieceAt, undefined, true);
}

/** A client's opening handshake for `path` (with `extra` header lines), as raw bytes. */
const handshake = (path: string, extra = '') =>
  `GET ${path} HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n${extra}\r\n`;

afterAll(async () => {
  await proxy?.close();
  wss.close();
  upstream?.closeAllConnections();
  await new Promise((r) => upstream?.close(r));
});

function open(url: string, options: ConstructorParameters<typeof WebSocket>[2] = {}): Promise<{ ws: WebSocket; first: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, options);
    ws.once('message', (d) => resolve({ ws, first: d.toString() }));
    ws.once('error', reject);
    ws.once('unexpected-response', (_req, res) => reject(new Error(`unexpected ${res.statusCode}`)));
  });
}

/** Sends every message and collects as many echoes, in order; fails at once if the tunnel closes first. */
function echo(ws: WebSocket, messages: (Buffer | string)[]): Promise<(Buffer | string)[]> {
  return new Promise((resolve, reject) => {
    const got: (Buffer | string)[] = [];
    ws.once('close', (code) => reject(new Error(`closed (${code}) after ${got.length} of ${messages.length} echoes`)));
    ws.on('message', (d: RawData, isBinary: boolean) => {
      got.push(isBinary ? Buffer.from(d as Buffer) : d.toString());
      if (got.length === messages.length) resolve(got);
    });
    for (const m of messages) ws.send(m, { binary: typeof m !== 'string' });
  });
}

/** A raw exchange: writes `request`, reads until the proxy closes or `ms` pass. */
function raw(request: string | Buffer, ms = 2000, then?: (s: net.Socket) => void): Promise<{ text: string; closed: boolean }> {
  return new Promise((resolve) => {
    const url = new URL(proxy.proxyUrl);
    const s = net.connect(Number(url.port), url.hostname, () => {
      s.write(request);
      then?.(s);
    });
    const chunks: Buffer[] = [];
    s.on('data', (b: Buffer) => chunks.push(b));
    s.on('error', () => {});
    const t = setTimeout(() => {
      s.destroy();
      resolve({ text: Buffer.concat(chunks).toString('latin1'), closed: false });
    }, ms);
    s.on('close', () => {
      clearTimeout(t);
      resolve({ text: Buffer.concat(chunks).toString('latin1'), closed: true });
    });
  });
}

const inFlightOf = async (p: RunningProxy, n: number) => {
  for (let i = 0; i < 100 && p.forwarder.inFlight.size !== n; i++) await new Promise((r) => setTimeout(r, 20));
  return p.forwarder.inFlight.size;
};
const inFlight = (n: number) => inFlightOf(proxy, n);

describe('WebSocket upgrades', () => {
  it('tunnel both ways, every message intact and in order, with the request headers a proxy adds', async () => {
    const { ws, first } = await open(`${wsBase}/v1/realtime?model=gpt-realtime`, { headers: { authorization: 'Bearer sk-test', 'openai-beta': 'realtime=v1', 'x-name': 'caf\xe9' } });
    expect(first).toBe('hello from upstream');
    // permessage-deflate was negotiated end to end: the proxy passed the extension header both ways.
    expect(ws.extensions).toContain('permessage-deflate');
    const req = upgrades.at(-1)!;
    expect(req.url).toBe('/v1/realtime?model=gpt-realtime');
    expect(req.headers.upgrade).toBe('websocket');
    expect(req.headers.connection?.toLowerCase()).toBe('upgrade');
    expect(req.headers.authorization).toBe('Bearer sk-test');
    expect(req.headers['openai-beta']).toBe('realtime=v1');
    expect(req.headers['x-name']).toBe('caf\xe9'); // the byte 0xE9 as sent, not re-encoded as UTF-8
    expect(req.headers.host).toBe(new URL(upstreamUrl).host);
    expect(req.headers['x-forwarded-for']).toBe('127.0.0.1');
    expect(req.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);

    // Sizes across frame-length encodings (7-bit, 16-bit, 64-bit) and the TCP buffer sizes.
    const sizes = [0, 1, 125, 126, 127, 65_535, 65_536, 70_000, 300_000, 3, 4_096];
    const messages: (Buffer | string)[] = sizes.flatMap((n, i) => [randomBytes(n), `text ${i} ${'é'.repeat(n % 1000)}`]);
    const got = await echo(ws, messages);
    expect(got.length).toBe(messages.length);
    got.forEach((g, i) => expect(g).toEqual(messages[i]));
    expect(proxy.forwarder.inFlight.size).toBe(1);

    const closedAt = serverClose.at(-1)!;
    const clientClosed = new Promise<number>((r) => ws.once('close', (code) => r(code)));
    ws.close(1000, 'client done');
    expect(await closedAt).toEqual({ code: 1000, reason: 'client done' });
    expect(await clientClosed).toBe(1000);
    expect(await inFlight(0)).toBe(0);
  });

  it('pass the upstream close code and reason to the client', async () => {
    const { ws } = await open(`${wsBase}/v1/realtime`);
    const closed = new Promise<[number, string]>((r) => ws.once('close', (code, reason) => r([code, reason.toString()])));
    ws.send('close-4001');
    expect(await closed).toEqual([4001, 'server says bye']);
    expect(await inFlight(0)).toBe(0);
  });

  it('record a Realtime upgrade that did not open as a failed request: declined (429, 302), or given up on before any answer', async () => {
    const answers: Record<string, string | undefined> = {
      '429': 'HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}',
      '302': 'HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n',
      hang: undefined, // never answers: the client gives up
      // declined, and the client goes away while the 429's body is still coming
      '429cut': 'HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"error":',
    };
    const up = net.createServer((s) => {
      s.on('error', () => {});
      s.once('data', (d: Buffer) => {
        const which = /model=(\w+)/.exec(d.toString('latin1'))?.[1] ?? '';
        const a = answers[which];
        if (a !== undefined) (which === '429cut' ? s.write(a) : s.end(a));
      });
    });
    await new Promise<void>((r) => up.listen(0, '127.0.0.1', r));
    const logLines: Record<string, unknown>[] = [];
    const p = await startTestProxy(`http://127.0.0.1:${(up.address() as AddressInfo).port}`, {}, { logLevel: 'info', logLines });
    try {
      const port = Number(new URL(p.proxyUrl).port);
      // The client gives up (a reset: a FIN alone is a half-close the tunnel waits out) after
      // `giveUp` ms, or once it has the answer's head (within 5 s, or the test fails).
      const connect = (model: string, giveUp?: number | 'at-head') =>
        new Promise<string>((resolve) => {
          const s = net.connect(port, '127.0.0.1', () =>
            s.write(`GET /v1/realtime?model=${model} HTTP/1.1\r\nHost: p\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`),
          );
          let t = '';
          s.on('data', (b: Buffer) => {
            t += b.toString();
            if (giveUp === 'at-head' && t.includes('\r\n\r\n')) s.resetAndDestroy();
          });
          const timer = giveUp === undefined ? undefined : setTimeout(() => s.resetAndDestroy(), giveUp === 'at-head' ? 5000 : giveUp);
          s.on('close', () => {
            clearTimeout(timer);
            resolve(t);
          });
        });
      expect(await connect('429')).toMatch(/^HTTP\/1\.1 429 /);
      expect(await connect('302')).toMatch(/^HTTP\/1\.1 302 /);
      expect(await connect('hang', 100)).toBe('');
      expect(await connect('429cut', 'at-head')).toMatch(/^HTTP\/1\.1 429 /);
      await new Promise((r) => setTimeout(r, 50));
      const m = await scrape(p.metricsUrl);
      // By model label (undefined: none). A name no answer came for takes no place under the
      // model cap: the given-up upgrade has no model label.
      const failed = (model: string | undefined, error_type: string) =>
        m
          .filter((x) => x.name === 'gen_ai_client_operation_duration_seconds_count' && x.labels.gen_ai_operation_name === 'realtime')
          .filter((x) => x.labels.gen_ai_request_model === model && x.labels.error_type === error_type)
          .reduce((a, x) => a + x.value, 0);
      expect([failed('429', '429'), failed('302', 'upgrade_declined'), failed(undefined, 'client_cancelled'), failed('429cut', '429')]).toEqual([1, 1, 1, 1]);
      expect(hist(m, 'gen_ai_client_operation_duration_seconds').count).toBe(4);
      expect(hist(m, 'gen_ai_client_operation_time_to_first_chunk_seconds').count).toBe(0);
      // The log lines say what the metrics say.
      const tunnels = logLines.filter((l) => l.msg === 'tunnel').map((l) => [l.status, l.outcome, l.errorType]);
      expect(tunnels).toEqual([
        [429, 'error', '429'],
        [302, 'error', 'upgrade_declined'],
        [undefined, 'cancelled', 'client_cancelled'],
        [429, 'error', '429'],
      ]);
    } finally {
      await p.close();
      await new Promise((r) => up.close(r));
    }
  });

  it('forward a declined upgrade with Connection: close, and nothing the client sent before or after it', async () => {
    const key = randomBytes(16).toString('base64');
    const head = `GET /decline HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${key}\r\n\r\n`;
    const before = plain.length;
    // A request pipelined in the handshake's write, and one sent before the upstream answers:
    // forwarded, they would reach the upstream past the router (any path, any Host).
    const smuggled = 'POST /admin/secret HTTP/1.1\r\nHost: internal\r\nContent-Length: 0\r\n\r\n';
    const r = await raw(head + smuggled, 3000, (s) => setTimeout(() => s.write(smuggled), 30));
    expect(r.text).toBe('HTTP/1.1 426 Upgrade Required\r\nContent-Type: text/plain\r\nContent-Length: 12\r\nConnection: close\r\n\r\nno websocket');
    expect(r.closed).toBe(true);
    await new Promise((res) => setTimeout(res, 100));
    expect(plain.slice(before)).toEqual([]);
    expect(await inFlight(0)).toBe(0);
  });

  it('pass on no hop-by-hop field of the upstream, nor one its Connection names, in an interim answer, the 101 or a declined answer', async () => {
    const key = randomBytes(16).toString('base64');
    const upgrade = (path: string) => `GET ${path} HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${key}\r\n\r\n`;
    const opened = await raw(upgrade('/hops'), 1000);
    expect(opened.text).toBe('HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: abc\r\nConnection: Upgrade\r\n\r\nbye');
    const declined = await raw(upgrade('/hops-declined'), 3000);
    expect(declined.text).toBe('HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno');
    expect(declined.closed).toBe(true);
  });

  it('hold what the client sends before the 101 and pass it on after it, its half-close too', async () => {
    // A masked text frame "early" in the handshake's write, then the client's FIN at once.
    const payload = Buffer.from('early');
    const mask = randomBytes(4);
    const frame = Buffer.concat([Buffer.from([0x81, 0x80 | payload.length]), mask, Buffer.from(payload.map((b, i) => b ^ mask[i % 4]!))]);
    const key = randomBytes(16).toString('base64');
    const hs = `GET /v1/realtime HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${key}\r\n\r\n`;
    const n = serverClose.length;
    const t0 = performance.now();
    const r = await raw(Buffer.concat([Buffer.from(hs), frame]), 5000, (s) => s.end());
    // The upstream echoed the early frame after its greeting, and closed when the client's end reached it.
    expect(r.text).toMatch(/^HTTP\/1\.1 101 Switching Protocols\r\n/);
    expect(r.text).toContain('\x81\x13hello from upstream\x81\x05early');
    expect(r.closed).toBe(true);
    expect(performance.now() - t0).toBeLessThan(4000); // not the idle timeout (590 s)
    expect((await serverClose[n])!.code).toBe(1006); // a TCP end without a close frame
    expect(await inFlight(0)).toBe(0);
  });

  it('stop a flooding side while the other does not read, and deliver every byte once it does', async () => {
    // Without backpressure the proxy would take the whole flood into its memory at once.
    const port = Number(new URL(proxy.proxyUrl).port);
    const bound = FLOOD_BYTES / 2; // every socket buffer on the way (a few MiB each) and the proxy's own
    const settle = () => new Promise((r) => setTimeout(r, 600));

    // Upstream → client: the client reads the 101, then stops reading.
    const n = floods.length;
    const c = net.connect(port, '127.0.0.1', () => c.write(handshake('/flood')));
    let got = 0;
    await new Promise<void>((resolve) =>
      afterHead(
        c,
        (head) => {
          expect(head).toMatch(/^HTTP\/1\.1 101 /);
          c.pause();
          resolve();
        },
        (b) => (got += b.length),
      ),
    );
    await settle();
    expect(floods[n]!.done).toBe(false);
    expect(floods[n]!.written).toBeLessThan(bound);
    c.resume();
    for (let i = 0; i < 500 && got < FLOOD_BYTES; i++) await new Promise((r) => setTimeout(r, 20));
    expect(got).toBe(FLOOD_BYTES);
    expect(floods[n]!.done).toBe(true);
    c.destroy();

    // Client → upstream: the upstream reads nothing until told to.
    const m = sinks.length;
    const d = net.connect(port, '127.0.0.1', () => d.write(handshake('/sink')));
    d.on('error', () => {});
    await new Promise<void>((resolve) => d.once('data', () => resolve()));
    const sent = pump(d, FLOOD_BYTES, () => floodChunk);
    await settle();
    expect(sent.done).toBe(false);
    expect(sent.written).toBeLessThan(bound);
    sinks[m]!.socket.resume();
    for (let i = 0; i < 500 && sinks[m]!.read < FLOOD_BYTES; i++) await new Promise((r) => setTimeout(r, 20));
    expect(sinks[m]!.read).toBe(FLOOD_BYTES);
    expect(sent.done).toBe(true);
    d.destroy();
    expect(await inFlight(0)).toBe(0);
  });

  it('keep every byte of two tunnels whose clients read slowly at once (the reads share one buffer)', async () => {
    // A tunnel whose client lags holds writes in flight while the other tunnel's upstream reads
    // into the same buffer: only a copy per read keeps each stream its own.
    const port = Number(new URL(proxy.proxyUrl).port);
    const one = (id: number) =>
      new Promise<{ bytes: number; bad: number }>((resolve) => {
        const c = net.connect(port, '127.0.0.1', () => c.write(handshake(`/pattern?id=${id}`)));
        let o = 0;
        let bad = 0;
        let sincePause = 0;
        afterHead(
          c,
          () => {},
          (b) => {
            for (let j = 0; j < b.length; j++) if (b[j] !== patternByte(id, o + j)) bad++;
            o += b.length;
            sincePause += b.length;
            if (sincePause > 256 * 1024) {
              sincePause = 0;
              c.pause(); // the proxy's writes to this client back up meanwhile
              setTimeout(() => c.resume(), 15);
            }
          },
        );
        c.on('error', () => {});
        c.on('close', () => resolve({ bytes: o, bad }));
      });
    const [a, b] = await Promise.all([one(1), one(2)]);
    expect(a).toEqual({ bytes: PATTERN_BYTES, bad: 0 });
    expect(b).toEqual({ bytes: PATTERN_BYTES, bad: 0 });
    expect(await inFlight(0)).toBe(0);
  });

  it('pass the upstream half-close on (the client can still send), and a reset as a reset', async () => {
    const port = Number(new URL(proxy.proxyUrl).port);
    const n = afterUpstreamEnd.length;
    const half = await new Promise<string>((resolve) => {
      const c = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true }, () => c.write(handshake('/halfup')));
      let t = '';
      c.on('data', (b: Buffer) => (t += b.toString()));
      c.on('end', () => c.end('reply-after-fin')); // the upstream ended its half: answer, then end ours
      c.on('close', () => resolve(t));
    });
    expect(half).toMatch(/\r\n\r\nbye$/);
    for (let i = 0; i < 50 && afterUpstreamEnd.length === n; i++) await new Promise((r) => setTimeout(r, 20));
    expect(afterUpstreamEnd[n]).toBe('reply-after-fin');

    const reset = await new Promise<string | undefined>((resolve) => {
      const c = net.connect(port, '127.0.0.1', () => c.write(handshake('/reset')));
      let code: string | undefined;
      c.on('error', (e: NodeJS.ErrnoException) => (code = e.code));
      c.on('close', () => resolve(code));
    });
    expect(reset).toBe('ECONNRESET');
    expect(await inFlight(0)).toBe(0);
  });

  it('over TLS to the upstream, direct or through the egress proxy, pass its clean end on as an end, not a cut (a TLS socket may close on it), and a reset as a reset', async () => {
    // Through the egress proxy, the upstream's close_notify and the egress proxy's close of the
    // CONNECT tunnel close the TLS socket with no error, before the client has ended its half.
    // That is the end of the tunnel, as a plain upstream's half-close followed by the client's
    // would be: the client gets the last bytes and a FIN (no reset when it then ends its half),
    // and the line says ok. Direct, the half-open TLS socket stays open until the client ends.
    const cert = selfSignedCert();
    const tlsUp = https.createServer({ key: fs.readFileSync(cert.key), cert: fs.readFileSync(cert.cert) });
    tlsUp.on('upgrade', (req: http.IncomingMessage, socket: net.Socket) => {
      socket.on('error', () => {});
      socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nbye');
      // A TCP reset under TLS: the TLS socket's own resetAndDestroy refuses its handle type. (A close
      // without close_notify is an end to Node, as a plain upstream's FIN is.)
      if (req.url!.startsWith('/reset')) setTimeout(() => (socket as net.Socket & { _parent: net.Socket })._parent.resetAndDestroy(), 50);
      else socket.end();
    });
    await new Promise<void>((r) => tlsUp.listen(0, '127.0.0.1', r));
    // As NODE_EXTRA_CA_CERTS would; the shared context keeps it for the rest of this file (a CA of
    // its own certificate only: no other test's upstream is affected).
    upstreamTlsContext().context.addCACert(fs.readFileSync(cert.cert));
    const egress = await startForwardProxy();
    const lines: Record<string, unknown>[] = [];
    const up = `https://localhost:${(tlsUp.address() as AddressInfo).port}`;
    // Direct, and through the egress proxy (TLS over its CONNECT tunnel's socket).
    const proxies = [await startTestProxy(up, {}, { logLevel: 'info', logLines: lines }), await startTestProxy(up, { egressProxy: egress.url }, { logLevel: 'info', logLines: lines })];
    try {
      for (const [i, p] of proxies.entries()) {
        const port = Number(new URL(p.proxyUrl).port);
        const run = (path: string) =>
          new Promise<{ text: string; ended: boolean; error?: string }>((resolve) => {
            const c = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true }, () => c.write(handshake(path)));
            let text = '';
            let ended = false;
            let error: string | undefined;
            c.on('data', (b: Buffer) => (text += b.toString()));
            c.on('end', () => {
              ended = true;
              // Not at once: by then the upstream's TLS socket may have closed, and its close decides.
              setTimeout(() => c.end(), 200);
            });
            c.on('error', (e: NodeJS.ErrnoException) => (error = e.code));
            c.on('close', () => resolve({ text, ended, error }));
          });
        const how = i === 0 ? 'direct' : 'through the egress proxy';
        const clean = await run(`/clean-${i}`);
        expect(clean, how).toMatchObject({ ended: true, error: undefined });
        expect(clean.text, how).toMatch(/^HTTP\/1\.1 101 [^]*\r\n\r\nbye$/);
        // Behind the egress proxy an upstream's reset arrives as the egress proxy's close (this
        // one's, as Squid's), which TLS without close_notify does not tell from an end: direct only.
        if (i === 1) continue;
        const cut = await run(`/reset-${i}`);
        expect(cut.text, how).toMatch(/\r\n\r\nbye$/);
        expect(cut.error, how).toBe('ECONNRESET');
      }
      for (let i = 0; i < 100 && lines.filter((l) => l.msg === 'tunnel').length < 3; i++) await new Promise((r) => setTimeout(r, 20));
      const tunnels = lines.filter((l) => l.msg === 'tunnel');
      expect(tunnels.map((l) => [l.path, l.status, l.outcome, l.errorType])).toEqual([
        ['/clean-0', 101, 'ok', undefined],
        ['/reset-0', 101, 'error', 'upstream_reset'],
        ['/clean-1', 101, 'ok', undefined],
      ]);
      expect(egress.connects).toHaveLength(1);
    } finally {
      for (const p of proxies) await p.close();
      await egress.close();
      tlsUp.closeAllConnections();
      await new Promise<void>((r) => tlsUp.close(() => r()));
      await cert.remove();
    }
  });

  it('close a connection whose upgrade is pipelined behind an unfinished answer (the answers would mix)', async () => {
    const key = randomBytes(16).toString('base64');
    const hs = `GET /v1/realtime HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${key}\r\n\r\n`;
    const n = upgrades.length;
    const r = await raw(`POST /v1/slow HTTP/1.1\r\nHost: proxy\r\nContent-Length: 0\r\n\r\n${hs}`, 3000);
    expect(r.closed).toBe(true);
    expect(r.text).not.toContain('101 Switching Protocols');
    expect(upgrades.length).toBe(n);
  });

  it('keep h2c and other upgrades on the normal HTTP/1.1 path (Java HttpClient over http://)', async () => {
    const body = '{"model":"m","messages":[]}';
    const req = (path: string) =>
      `POST ${path} HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAEAAEAAAAIAAAAA\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
    const before = plain.length;
    const r = await raw(req('/v1/chat/completions'), 1500, (s) => setTimeout(() => s.write(req('/v1/second')), 300));
    expect(r.text.match(/^HTTP\/1\.1 200 OK/gm)?.length).toBe(2);
    expect(r.text).toContain('{"ok":true,"url":"/v1/second"}');
    const seen = plain.slice(before);
    expect(seen.map((p) => p.url)).toEqual(['/v1/chat/completions', '/v1/second']);
    for (const p of seen) {
      expect(p.body).toBe(body);
      expect(p.headers.upgrade).toBeUndefined();
      expect(p.headers['http2-settings']).toBeUndefined();
    }
  });

  it('answer CONNECT with 405 instead of dropping the connection', async () => {
    const r = await raw('CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n');
    expect(r.text).toMatch(/^HTTP\/1\.1 405 Method Not Allowed\r\n/);
    expect(r.text).toContain('"type":"method_not_allowed"');
    expect(r.closed).toBe(true);
  });

  it('refuse what a request would be refused for, and answer for an upstream that fails', async () => {
    const dot = await raw(handshake('/v1/../admin'));
    expect(dot.text).toMatch(/^HTTP\/1\.1 400 /);
    expect(dot.text).toContain('"type":"invalid_path"');
    const withBody = await raw(`${handshake('/v1/realtime', 'Content-Length: 3\r\n')}abc`);
    expect(withBody.text).toMatch(/^HTTP\/1\.1 400 /);
    expect(withBody.text).toContain('"type":"invalid_upgrade"');
    const bad101 = await raw(handshake('/bad101'));
    expect(bad101.text).toMatch(/^HTTP\/1\.1 502 /);
    expect(bad101.text).toContain('101 without Upgrade: websocket');
    const silent = await raw(handshake('/silent'));
    expect(silent.text).toMatch(/^HTTP\/1\.1 502 /);
    expect(silent.text).toContain('"type":"upstream_reset"');
    expect(silent.closed).toBe(true);

    // A route to a port nobody listens on, and a route table without this path.
    const dead = net.createServer();
    await new Promise<void>((r) => dead.listen(0, '127.0.0.1', r));
    const deadPort = (dead.address() as AddressInfo).port;
    await new Promise((r) => dead.close(r));
    const logLines: Record<string, unknown>[] = [];
    const other = await startTestProxy(undefined, { routes: [{ prefix: '/dead', upstream: `http://127.0.0.1:${deadPort}` }] }, { logLevel: 'info', logLines });
    try {
      const port = Number(new URL(other.proxyUrl).port);
      const ask = (path: string) =>
        new Promise<string>((resolve) => {
          const s = net.connect(port, '127.0.0.1', () => s.write(handshake(path)));
          let t = '';
          s.on('data', (b: Buffer) => (t += b.toString()));
          s.on('close', () => resolve(t));
        });
      const unreachable = await ask('/dead/v1/realtime');
      expect(unreachable).toMatch(/^HTTP\/1\.1 502 /);
      expect(unreachable).toContain('"type":"upstream_unreachable"');
      const noRoute = await ask('/elsewhere');
      expect(noRoute).toMatch(/^HTTP\/1\.1 404 /);
      expect(noRoute).toContain('"type":"no_route"');
      expect(other.forwarder.inFlight.size).toBe(0);
      // A Realtime connection that could not open is a failed request on the dashboard.
      await new Promise((r) => setTimeout(r, 50));
      const m = await scrape(other.metricsUrl);
      expect(hist(m, 'gen_ai_client_operation_duration_seconds', { gen_ai_operation_name: 'realtime', error_type: 'upstream_unreachable' }).count).toBe(1);
      expect(hist(m, 'gen_ai_client_operation_duration_seconds').count).toBe(1); // the 404 is the client's: not recorded
      // Each has its log line, with the status the client got.
      expect(logLines.filter((l) => l.msg === 'tunnel').map((l) => [l.status, l.outcome, l.errorType])).toEqual([[502, 'error', 'upstream_unreachable']]);
      expect(logLines.filter((l) => l.msg === 'request').map((l) => [l.status, l.outcome, l.errorType, l.upgrade])).toEqual([[404, 'refused', 'no_route', 'websocket']]);
    } finally {
      await other.close();
    }
  });

  it('close a quiet tunnel after timeouts.idle with a Close 1001 to each side, and cut open tunnels at the shutdown deadline', async () => {
    // Lower bounds count from a moment before the tunnel's last traffic (the upstream's greeting, the
    // stalled request's start), so load cannot break them; counting from when the client had read the
    // greeting did (240 ms against 250 on a loaded machine). 10 ms allows for timers firing early.
    const p = await startTestProxy(upstreamUrl, { timeouts: { idle: 0.5 } });
    const p2 = await startTestProxy(upstreamUrl, { timeouts: { idle: 1.5 } });
    try {
      const base = p.proxyUrl.replace(/^http/, 'ws');
      const { ws } = await open(`${base}/v1/realtime`);
      const greeted = greetedAt;
      const n = serverClose.length;
      const closed = await new Promise<{ code: number; reason: string }>((r) => ws.once('close', (code, reason) => r({ code, reason: reason.toString() })));
      const waited = performance.now() - greeted;
      // Told, as at the shutdown deadline (an abnormal closure, 1006, before): each side a Close 1001.
      expect(closed).toEqual({ code: 1001, reason: 'idle timeout' });
      expect(await serverClose[n - 1]).toEqual({ code: 1001, reason: 'idle timeout' }); // masked: ws took it
      expect(waited).toBeGreaterThanOrEqual(490);
      expect(waited).toBeLessThan(5000);

      // A declined answer that stalls is cut by the same timeout.
      const port = Number(new URL(p.proxyUrl).port);
      const s0 = performance.now();
      const stalled = await new Promise<string>((resolve) => {
        const c = net.connect(port, '127.0.0.1', () =>
          c.write(`GET /stall HTTP/1.1\r\nHost: p\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`),
        );
        let t = '';
        c.on('data', (b: Buffer) => (t += b.toString()));
        c.on('error', () => {});
        c.on('close', () => resolve(t));
      });
      expect(stalled).toBe('HTTP/1.1 403 Forbidden\r\nContent-Length: 100\r\nConnection: close\r\n\r\nhello');
      expect(performance.now() - s0).toBeGreaterThanOrEqual(490);
      expect(p.forwarder.inFlight.size).toBe(0);

      // Traffic keeps it open past the idle timeout: ~1.8 s of pings 100 ms apart through a proxy
      // with a 1.5 s one. The pings come from this process, so a stall of it is silence on the
      // tunnel: one of up to 1.4 s on a loaded machine is still not idle (with 0.5 s, a 0.6 s
      // pause of the test process cut the tunnel, rightly: its client was quiet that long).
      const { ws: busy } = await open(`${p2.proxyUrl.replace(/^http/, 'ws')}/v1/realtime`);
      for (let i = 0; i < 18; i++) {
        await echo(busy, [`ping ${i}`]);
        busy.removeAllListeners('message');
        busy.removeAllListeners('close');
        await new Promise((r) => setTimeout(r, 100));
      }
      expect(busy.readyState).toBe(WebSocket.OPEN);
      const cut = new Promise<number>((r) => busy.once('close', (c) => r(c)));
      const d0 = performance.now();
      await p2.shutdown(0.2);
      expect(await cut).toBe(1001); // told "going away", not reset
      expect(performance.now() - d0).toBeGreaterThanOrEqual(150);
      expect(p2.forwarder.inFlight.size).toBe(0);
    } finally {
      await p.close();
      await p2.close();
    }
  });

  it('a tunnel cut at the shutdown deadline: each side is sent a Close 1001, and it is logged at warn (the production level keeps it)', async () => {
    const { p, lines } = await loggedProxy();
    try {
      // permessage-deflate on: the Close is a control frame, never compressed.
      const { ws } = await open(`${p.proxyUrl.replace(/^http/, 'ws')}/v1/realtime`, { perMessageDeflate: true });
      expect(ws.extensions).toContain('permessage-deflate');
      await echo(ws, ['x'.repeat(1000), Buffer.alloc(70_000, 7)]); // frames of each length encoding, each way
      const n = serverClose.length;
      const cut = new Promise<{ code: number; reason: string }>((r) => ws.once('close', (code, reason) => r({ code, reason: reason.toString() })));
      await p.shutdown(0.2);
      expect(await cut).toEqual({ code: 1001, reason: 'proxy shutting down' });
      // The upstream (ws, which rejects an unmasked client frame with 1002) read the proxy's masked Close.
      expect(await serverClose[n - 1]).toEqual({ code: 1001, reason: 'proxy shutting down' });
      expect(lines.find((l) => l.msg === 'tunnel')).toMatchObject({ level: 40, errorType: 'shutdown_deadline', goingAway: ['client', 'upstream'] });
      // Not counted as a cut stream: the tunnel's own line says what each side got.
      expect(lines.find((l) => l.msg === 'drain deadline reached: closed tunnels')).toMatchObject({ level: 40, cut: 0, tunnels: 1 });
      expect(lines.some((l) => l.msg === 'drain deadline reached: cut streams')).toBe(false);
    } finally {
      await p.close();
    }
  });

  it('count an upgrade still unanswered, or a declined answer still being forwarded, at the shutdown deadline as a cut request, not as a tunnel', async () => {
    const { p, lines } = await loggedProxy();
    try {
      const port = Number(new URL(p.proxyUrl).port);
      const upgrade = (path: string) => {
        const c = net.connect(port, '127.0.0.1');
        c.on('error', () => {});
        c.write(`GET ${path} HTTP/1.1\r\nHost: p\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`);
        return c;
      };
      // /stall: a declined answer (403) that never ends; its head comes through first.
      const stalled = upgrade('/stall');
      await new Promise<void>((r) => stalled.once('data', () => r()));
      // /hang: an upgrade the upstream got and never answers.
      upgrade('/hang');
      for (let i = 0; i < 300 && !upgrades.some((r) => r.url === '/hang'); i++) await new Promise((r) => setTimeout(r, 10));
      expect(upgrades.some((r) => r.url === '/hang')).toBe(true);
      await p.shutdown(0.2);
      expect(lines.find((l) => l.msg === 'drain deadline reached: cut streams')).toMatchObject({ level: 40, cut: 2 });
      expect(lines.find((l) => l.msg === 'drain deadline reached: cut streams')).not.toHaveProperty('tunnels');
      expect(lines.some((l) => l.msg === 'drain deadline reached: closed tunnels')).toBe(false);
    } finally {
      await p.close();
    }
  });

  it('at the shutdown deadline, let a side mid-frame finish that frame, then send its Close 1001 (what follows is dropped); cut it if the frame does not end within FRAME_FINISH_MS', async () => {
    const proxies: RunningProxy[] = [];
    const logs: Record<string, unknown>[][] = [];
    /** The tunnel lines of every proxy of this test, in order. */
    const tunnelLines = () => logs.flat().filter((l) => l.msg === 'tunnel');
    const proxyWithLog = async () => {
      const { p, lines } = await loggedProxy();
      proxies.push(p);
      logs.push(lines);
      return p;
    };
    /** The tunnel line of the scenario just run: exactly one per tunnel, written once both sides are settled. */
    const lineOf = (k: number) => {
      const all = tunnelLines();
      expect(all).toHaveLength(k);
      return all[k - 1];
    };
    const mask = randomBytes(4);
    const whole = clientFrame(Buffer.alloc(100, 0x61), mask); // 6 + 100 bytes; 16 of them sent first
    /**
     * A reset that an end, a close or a protocol break caused comes at once (~200-250 ms after the
     * drain began), not when FRAME_FINISH_MS ends the wait (1,200 ms): a bound 300 ms short of the
     * wait, which leaves ~650 ms for the test process's own lateness.
     */
    const soon = 200 + FRAME_FINISH_MS - 300;
    try {
      // 1. Mid-frame towards the client; the upstream, told first (its end held back: it still
      // owes the frame's rest), finishes the frame and sends another in the same write: the
      // client reads the whole frame, then the Close, then the end (no reset), and not the frame after it.
      let p = await proxyWithLog();
      let n = partialEnds.length;
      const one = rawClient(p, '/partial?down-finish', Buffer.alloc(0));
      await one.opened;
      await p.shutdown(0.2);
      const c1 = await one.closed;
      expect(c1.error).toBeUndefined();
      expect(c1.read.subarray(c1.read.length - DOWN_FRAME.length - CLOSE.length).equals(Buffer.concat([DOWN_FRAME, CLOSE]))).toBe(true);
      expect(c1.read.includes(NEXT_FRAME)).toBe(false);
      const u1 = await partialEnds[n]!;
      expect(u1.error).toBeUndefined();
      expect(decode(u1.read)).toEqual({ code: 1001, reason: 'proxy shutting down' });
      expect(lineOf(1)).toMatchObject({ errorType: 'shutdown_deadline', goingAway: ['client', 'upstream'] });

      // 2. Mid-frame towards the client, and the rest never comes: the client is reset once
      // FRAME_FINISH_MS has passed since the deadline, with no Close; the upstream, between
      // frames, read its masked Close (which ws's frame reader accepts), then the end.
      p = await proxyWithLog();
      n = partialEnds.length;
      const two = rawClient(p, '/partial?down', Buffer.alloc(0));
      await two.opened;
      const d2 = performance.now();
      await p.shutdown(0.2);
      const c2 = await two.closed;
      expect(c2.error).toBe('ECONNRESET');
      expect(c2.at - d2).toBeGreaterThanOrEqual(200 + FRAME_FINISH_MS - 10);
      expect(c2.read.includes(CLOSE)).toBe(false);
      expect(c2.read.subarray(c2.read.length - 12).equals(DOWN_FRAME.subarray(0, 12))).toBe(true);
      const u2 = await partialEnds[n]!;
      expect(u2.error).toBeUndefined();
      expect(decode(u2.read)).toEqual({ code: 1001, reason: 'proxy shutting down' });
      expect(lineOf(2)).toMatchObject({ errorType: 'shutdown_deadline', goingAway: ['upstream'] });

      // 2b. The same, but the upstream ends its half on reading the Close: the frame cannot end,
      // and the client is reset then.
      p = await proxyWithLog();
      n = partialEnds.length;
      const twoB = rawClient(p, '/partial?down-end', Buffer.alloc(0));
      await twoB.opened;
      const d2b = performance.now();
      await p.shutdown(0.2);
      const c2b = await twoB.closed;
      expect(c2b.error).toBe('ECONNRESET');
      expect(c2b.at - d2b).toBeLessThan(soon);
      expect(c2b.read.includes(CLOSE)).toBe(false);
      expect((await partialEnds[n]!).error).toBeUndefined();
      expect(lineOf(3)).toMatchObject({ goingAway: ['upstream'] });

      // 2c. Mid-head towards the client, and the head's rest breaks the protocol (a masked
      // server frame): the frame cannot be followed to its end, and the client is reset then.
      p = await proxyWithLog();
      const twoC = rawClient(p, '/partial?down-bad', Buffer.alloc(0));
      await twoC.opened;
      const d2c = performance.now();
      await p.shutdown(0.2);
      const c2c = await twoC.closed;
      // Reset right after the bytes it forwarded: a Linux peer reads that reset as an end (no
      // ECONNRESET) when it comes with data still unread, so only the missing Close tells here.
      expect(c2c.at - d2c).toBeLessThan(soon);
      expect(c2c.read.includes(CLOSE)).toBe(false);
      expect(lineOf(4)).toMatchObject({ goingAway: ['upstream'] });

      // 3. Mid-frame towards the upstream (a client frame announcing 100 bytes, 10 sent); the
      // client, told first, sends the other 90 and a next frame: the upstream reads the whole
      // frame, then the masked Close, not the next frame, and no reset.
      p = await proxyWithLog();
      n = partialEnds.length;
      const three = rawClient(p, '/partial', whole.subarray(0, 16), Buffer.concat([whole.subarray(16), clientFrame(Buffer.from('next'))]));
      await three.opened;
      await p.shutdown(0.2);
      const c3 = await three.closed;
      expect(c3.error).toBeUndefined();
      expect(c3.read.subarray(c3.read.length - CLOSE.length).equals(CLOSE)).toBe(true);
      const u3 = await partialEnds[n]!;
      expect(u3.error).toBeUndefined();
      expect(u3.read.subarray(0, whole.length).equals(whole)).toBe(true);
      expect(u3.read.length).toBe(whole.length + 6 + CLOSE.length - 2); // the Close's 4-byte mask key, and its 2-byte head as the unmasked one's
      expect(decode(u3.read)).toEqual({ code: 1001, reason: 'proxy shutting down' });
      expect(lineOf(5)).toMatchObject({ goingAway: ['client', 'upstream'] });

      // 4. Mid-frame towards the upstream, and the rest never comes: the upstream is reset after
      // exactly the partial frame, once FRAME_FINISH_MS has passed; the client reads the Close, then the end.
      p = await proxyWithLog();
      n = partialEnds.length;
      const four = rawClient(p, '/partial', whole.subarray(0, 16));
      await four.opened;
      await p.shutdown(0.2);
      const c4 = await four.closed;
      expect(c4.error).toBeUndefined();
      expect(c4.read.subarray(c4.read.length - CLOSE.length).equals(CLOSE)).toBe(true);
      const u4 = await partialEnds[n]!;
      expect(u4.error).toBe('ECONNRESET');
      expect(u4.read.equals(whole.subarray(0, 16))).toBe(true);
      expect(lineOf(6)).toMatchObject({ goingAway: ['client'] });

      // 4b. The same, but the client ends its half on reading the Close: the upstream is reset then.
      p = await proxyWithLog();
      n = partialEnds.length;
      const fourB = rawClient(p, '/partial', whole.subarray(0, 16), 'end');
      await fourB.opened;
      const d4b = performance.now();
      await p.shutdown(0.2);
      const u4b = await partialEnds[n]!;
      expect(u4b.error).toBe('ECONNRESET');
      expect(performance.now() - d4b).toBeLessThan(soon);
      expect((await fourB.closed).error).toBeUndefined();
      expect(lineOf(7)).toMatchObject({ goingAway: ['client'] });

      // 5. Mid-frame both ways, neither frame ever finishing, both peers keeping their halves
      // open: only FRAME_FINISH_MS ends it (no Close could go either way, so no other timer
      // runs). Each side is reset, no sooner than that after the deadline.
      p = await proxyWithLog();
      n = partialEnds.length;
      const five = rawClient(p, '/partial?down', whole.subarray(0, 16));
      await five.opened;
      const d5 = performance.now();
      await p.shutdown(0.2);
      const c5 = await five.closed;
      expect(c5.error).toBe('ECONNRESET');
      expect(c5.at - d5).toBeGreaterThanOrEqual(200 + FRAME_FINISH_MS - 10);
      expect(c5.read.includes(CLOSE)).toBe(false);
      const u5 = await partialEnds[n]!;
      expect(u5.error).toBe('ECONNRESET');
      expect(u5.read.equals(whole.subarray(0, 16))).toBe(true);
      expect(lineOf(8)).toMatchObject({ goingAway: [] });
    } finally {
      for (const p of proxies) await p.close();
    }
  });

  it('at the shutdown deadline, finish a frame in flight towards a client that reads slowly (backpressure holds the upstream back), then send the Close', async () => {
    const { p, lines } = await loggedProxy();
    try {
      const n = partialFirst.length;
      const big = rawClient(p, '/partial?down-big');
      await big.opened;
      big.socket.pause(); // reads nothing until the frame has to be finished
      expect(p.forwarder.inFlight.size).toBe(1);
      const tunnel = [...p.forwarder.inFlight][0] as unknown as { downPaused: boolean; client: net.Socket };
      // Before the drain, with no clock running: the client's buffers fill, and the proxy stops
      // reading the upstream rather than hold the frame (under 1 MiB held, around its 16 KiB mark).
      await expect.poll(() => tunnel.downPaused, { timeout: 10_000, interval: 5 }).toBe(true);
      await new Promise((r) => setTimeout(r, 50));
      expect(tunnel.client.writableLength).toBeLessThan(1024 * 1024);
      // The deadline: the upstream is told (its Close), and sends the frame's last bytes and a frame
      // after it, while the proxy still holds it back. The client reads again only then: the
      // frame must be finished under backpressure, within FRAME_FINISH_MS.
      const done = p.shutdown(0.2);
      await partialFirst[n];
      expect(tunnel.downPaused).toBe(true);
      big.socket.resume();
      const c = await big.closed;
      await done;
      expect(c.error).toBeUndefined();
      // The frame whole, then the Close; not the frame the upstream sent after it.
      const tail = c.read.subarray(c.read.length - BIG_FRAME.length - CLOSE.length);
      expect(tail.subarray(0, BIG_FRAME.length).equals(BIG_FRAME)).toBe(true);
      expect(tail.subarray(BIG_FRAME.length).equals(CLOSE)).toBe(true);
      expect(c.read.length).toBe(c.read.indexOf('\r\n\r\n') + 4 + BIG_FRAME.length + CLOSE.length);
      expect(lines.filter((l) => l.msg === 'tunnel')).toEqual([expect.objectContaining({ errorType: 'shutdown_deadline', goingAway: ['client', 'upstream'] })]);
    } finally {
      await p.close();
    }
  });

  it('at an exit that cannot wait, a tunnel that throws as it is ended is logged, and the others still get their Close', async () => {
    const { p, lines } = await loggedProxy();
    try {
      const a = rawClient(p, '/partial');
      const b = rawClient(p, '/partial');
      await Promise.all([a.opened, b.opened]);
      expect(await inFlightOf(p, 2)).toBe(2);
      const [first, second] = [...p.forwarder.inFlight] as unknown as { abort?: () => void; finishNow?: () => void }[];
      first!.abort = () => {
        throw new Error('boom');
      };
      // After its Close: what a throw there costs is only its own end.
      second!.finishNow = () => {
        throw new Error('bang');
      };
      p.beforeForcedExit();
      delete first!.abort; // their own again, for the close below
      delete second!.finishNow;
      // The other one (whichever came second) got its Close 1001 and its line.
      const closed = await Promise.race([a.closed, b.closed]);
      expect(closed.read.subarray(closed.read.length - CLOSE.length).equals(CLOSE)).toBe(true);
      await expect.poll(() => lines.filter((l) => l.msg === 'tunnel'), { timeout: 2000 }).toHaveLength(1);
      expect(lines.filter((l) => l.msg === 'a tunnel could not be ended at a forced exit')).toEqual([
        expect.objectContaining({ level: 50, step: 'abort', err: 'boom' }),
        expect.objectContaining({ level: 50, step: 'finishNow', err: 'bang' }),
      ]);
    } finally {
      await p.close();
    }
  });

  it('at timeouts.idle, let a frame in flight finish before the Close 1001, as at the shutdown deadline; reset the side whose frame does not end within FRAME_FINISH_MS', async () => {
    const { p, lines } = await loggedProxy({ timeouts: { idle: 0.5 } }, 'info');
    const tunnels = () => lines.filter((l) => l.msg === 'tunnel');
    try {
      // Mid-frame towards the client when the tunnel has been quiet for 0.5 s: the upstream, told
      // first, finishes the frame (and sends another): the client reads the whole frame, then the
      // Close, then the end, and not the frame after it. Bounds count from before the upgrade.
      let n = partialEnds.length;
      let t0 = performance.now();
      const finished = await rawClient(p, '/partial?down-finish').closed;
      expect(finished.error).toBeUndefined();
      expect(finished.read.subarray(finished.read.length - DOWN_FRAME.length - IDLE_CLOSE.length).equals(Buffer.concat([DOWN_FRAME, IDLE_CLOSE]))).toBe(true);
      expect(finished.read.includes(NEXT_FRAME)).toBe(false);
      expect(finished.at - t0).toBeGreaterThanOrEqual(490);
      // At once, not when FRAME_FINISH_MS would have cut it (~650 ms left for this process's lateness).
      expect(finished.at - t0).toBeLessThan(500 + FRAME_FINISH_MS - 300);
      const u1 = await partialEnds[n]!;
      expect(u1.error).toBeUndefined();
      expect(decode(u1.read)).toEqual({ code: 1001, reason: 'idle timeout' });
      await expect.poll(tunnels, { timeout: 5000 }).toHaveLength(1);
      expect(tunnels()[0]).toMatchObject({ level: 30, errorType: 'timeout', goingAway: ['client', 'upstream'] });

      // The frame's rest never comes: the client is reset FRAME_FINISH_MS after the idle timeout,
      // with no Close; the upstream, between frames, reads its Close.
      n = partialEnds.length;
      t0 = performance.now();
      const cut = await rawClient(p, '/partial?down').closed;
      expect(cut.error).toBe('ECONNRESET');
      expect(cut.at - t0).toBeGreaterThanOrEqual(500 + FRAME_FINISH_MS - 10);
      expect(cut.read.includes(IDLE_CLOSE)).toBe(false);
      expect(cut.read.subarray(cut.read.length - 12).equals(DOWN_FRAME.subarray(0, 12))).toBe(true);
      const u2 = await partialEnds[n]!;
      expect(u2.error).toBeUndefined();
      expect(decode(u2.read)).toEqual({ code: 1001, reason: 'idle timeout' });
      // Told at the idle timeout, not when the client's side was cut FRAME_FINISH_MS later.
      expect(u2.firstAt!).toBeLessThan(cut.at - FRAME_FINISH_MS / 2);
      await expect.poll(tunnels, { timeout: 5000 }).toHaveLength(2);
      expect(tunnels()[1]).toMatchObject({ level: 30, errorType: 'timeout', goingAway: ['upstream'] });

      // Mid-frame towards the upstream (a client frame announcing 100 bytes, 10 sent, forwarded
      // after the 101): the client, told first, sends the other 90 and a next frame; the upstream
      // reads the whole frame, then its masked Close, not the next frame, and no reset.
      n = partialEnds.length;
      const whole = clientFrame(Buffer.alloc(100, 0x61));
      const next = clientFrame(Buffer.from('next'));
      const sent = await rawClient(p, '/partial', whole.subarray(0, 16), Buffer.concat([whole.subarray(16), next]), IDLE_CLOSE).closed;
      expect(sent.error).toBeUndefined();
      expect(sent.read.subarray(sent.read.length - IDLE_CLOSE.length).equals(IDLE_CLOSE)).toBe(true);
      const u3 = await partialEnds[n]!;
      expect(u3.error).toBeUndefined();
      expect(u3.read.subarray(0, whole.length).equals(whole)).toBe(true);
      expect(u3.read.includes(next)).toBe(false);
      expect(decode(u3.read)).toEqual({ code: 1001, reason: 'idle timeout' });
      await expect.poll(tunnels, { timeout: 5000 }).toHaveLength(3);
      expect(tunnels()[2]).toMatchObject({ level: 30, errorType: 'timeout', goingAway: ['client', 'upstream'] });

      // Mid-frame towards the upstream, and the rest never comes: the client reads its Close at
      // once, then the end once FRAME_FINISH_MS has passed; the upstream is reset after exactly the partial
      // frame, with no Close (none can go inside a frame).
      n = partialEnds.length;
      t0 = performance.now();
      const owed = await rawClient(p, '/partial', whole.subarray(0, 16), undefined, IDLE_CLOSE).closed;
      expect(owed.error).toBeUndefined();
      expect(owed.read.subarray(owed.read.length - IDLE_CLOSE.length).equals(IDLE_CLOSE)).toBe(true);
      expect(owed.at - t0).toBeGreaterThanOrEqual(500 + FRAME_FINISH_MS - 10);
      // Told at the idle timeout, not when the upstream's side was cut FRAME_FINISH_MS later.
      expect(owed.toldAt!).toBeLessThan(owed.at - FRAME_FINISH_MS / 2);
      const u4 = await partialEnds[n]!;
      expect(u4.error).toBe('ECONNRESET');
      expect(u4.read.equals(whole.subarray(0, 16))).toBe(true);
      await expect.poll(tunnels, { timeout: 5000 }).toHaveLength(4);
      expect(tunnels()[3]).toMatchObject({ level: 30, errorType: 'timeout', goingAway: ['client'] });

      // An exit that cannot wait while the client's side still finishes its frame (the upstream
      // told, the tunnel closed): that side is cut at once and the line written before the exit,
      // not FRAME_FINISH_MS later, which the process would not live to see.
      n = partialEnds.length;
      const held = rawClient(p, '/partial?down', undefined, undefined, IDLE_CLOSE);
      await held.opened; // the upstream has answered: its entry is there
      await partialFirst[n];
      expect(tunnels()).toHaveLength(4); // its line waits for the frame
      const forced = performance.now();
      p.beforeForcedExit();
      await expect.poll(tunnels, { timeout: FRAME_FINISH_MS / 2 }).toHaveLength(5); // written at the next turn of the logger
      expect(tunnels()[4]).toMatchObject({ errorType: 'timeout', goingAway: ['upstream'] });
      const h = await held.closed;
      expect(h.error).toBe('ECONNRESET');
      expect(h.at - forced).toBeLessThan(FRAME_FINISH_MS / 2);
      expect(decode((await partialEnds[n]!).read)).toEqual({ code: 1001, reason: 'idle timeout' });
    } finally {
      await p.close();
    }
  });
});
