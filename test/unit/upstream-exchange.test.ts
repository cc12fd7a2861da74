// The proxy's upstream client over a real loopback socket, for generated responses cut at
// generated points: every framing (length, chunked, to the close, none), interim answers, HEAD,
// Connection: close beside a framing, a second exchange on a kept connection; and bytes that
// are not HTTP, which must end each exchange once, with no exception escaping.
import fc from 'fast-check';
import net, { type AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { UpstreamClient } from '../../src/proxy/upstream.js';
import { splitAt, views } from '../helpers/ranges.js';

/** What the upstream sends for the next request it reads: pieces, written 1 ms apart; `end` closes after them. */
let script: { pieces: Buffer[]; end: boolean }[] = [];
/** Resolves once the upstream has written its latest answer whole. */
let answered: Promise<void> = Promise.resolve();
/** The server-side socket of each request, in order. */
const served: net.Socket[] = [];
const sockets = new Set<net.Socket>();
let server: net.Server;
let client: UpstreamClient;
/**
 * Exceptions thrown in a socket callback: vitest would fail the run for them, but after the
 * property passed, with no counterexample; each run asserts there were none.
 */
const escaped: unknown[] = [];
const onEscape = (err: unknown) => void escaped.push(err);
let origin: { protocol: string; host: string; port: number };

beforeAll(async () => {
  process.on('uncaughtException', onEscape);
  // TCP_NODELAY, as real upstreams set it (Node's http servers do by default): with Nagle, a piece
  // written while the last is unacknowledged waits for the client's delayed ACK. Stray bytes
  // written 1 ms after a head then reached the client 24 ms later, after it had reused the
  // connection, and the next exchange failed (`invalid header line`, now and then under load).
  server = net.createServer({ noDelay: true }, (sock) => {
    sockets.add(sock);
    sock.on('close', () => sockets.delete(sock));
    sock.on('error', () => {});
    let buf = '';
    sock.on('data', async (d: Buffer) => {
      buf += d.toString('latin1');
      for (let at = buf.indexOf('\r\n\r\n'); at >= 0; at = buf.indexOf('\r\n\r\n')) {
        buf = buf.slice(at + 4); // the requests here have no body
        served.push(sock);
        const next = script.shift();
        if (next === undefined) return void sock.destroy();
        let done!: () => void;
        answered = new Promise((r) => (done = r));
        for (const [j, p] of next.pieces.entries()) {
          if (sock.destroyed) break;
          if (j > 0) await sleep(1); // most often a read of its own
          sock.write(p);
        }
        if (next.end && !sock.destroyed) sock.end();
        done();
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  origin = { protocol: 'http:', host: '127.0.0.1', port: (server.address() as AddressInfo).port };
  client = new UpstreamClient({ connectTimeoutMs: 2000 });
});
afterAll(async () => {
  process.off('uncaughtException', onEscape);
  client.close();
  for (const s of sockets) s.destroy();
  await new Promise((r) => server.close(r));
});

interface Outcome {
  heads: number[];
  wire: Buffer;
  body: Buffer;
  lastFlags: boolean[];
  ends: number;
  errors: Error[];
}

/** One exchange; resolves when it ended or failed, and 20 ms more, so that a second outcome would show. */
function exchange(method: string): Promise<Outcome> {
  const o: Outcome = { heads: [], wire: Buffer.alloc(0), body: Buffer.alloc(0), lastFlags: [], ends: 0, errors: [] };
  return new Promise((resolve, reject) => {
    const settle = () => setTimeout(() => resolve(o), 20);
    const guard = setTimeout(() => reject(new Error('the exchange neither ended nor failed within 5 s')), 5000);
    client.request(origin, method, '/', ['host', 'x'], 'none', {
      onHead: (h) => o.heads.push(h.status),
      onData: (wire, data, ranges, _t, last) => {
        o.wire = Buffer.concat([o.wire, wire]);
        o.body = Buffer.concat([o.body, ...views(data, ranges)]);
        o.lastFlags.push(last);
      },
      onEnd: () => {
        o.ends++;
        clearTimeout(guard);
        settle();
      },
      onError: (err) => {
        o.errors.push(err);
        clearTimeout(guard);
        settle();
      },
    });
  });
}

const chunkArb = fc.record({
  data: fc.uint8Array({ minLength: 1, maxLength: 300 }),
  hex: fc.constantFrom('lower', 'upper', 'zero-padded'),
  ext: fc.constantFrom('', ';a=b', ';name="quoted"'),
});

const responseArb = fc.record({
  method: fc.constantFrom('GET', 'HEAD'),
  interim: fc.array(fc.constantFrom('HTTP/1.1 100 Continue\r\n\r\n', 'HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n'), { maxLength: 2 }),
  status: fc.constantFrom(200, 201, 204, 304),
  framing: fc.constantFrom('length', 'chunked', 'close'),
  headerCase: fc.constantFrom('lower', 'Title', 'UPPER'),
  chunks: fc.array(chunkArb, { maxLength: 6 }),
  trailer: fc.constantFrom('', 'x-trailer: 1\r\n'),
  cuts: fc.array(fc.nat(), { maxLength: 10 }),
  /** Connection: close beside a length or chunked framing: the body is framed, the connection not kept. */
  close: fc.boolean(),
  /** Bytes after the response: the connection is out of sync, and must not serve another exchange. */
  stray: fc.boolean(),
});
type Response = typeof responseArb extends fc.Arbitrary<infer T> ? T : never;

function render(r: Response): { bytes: Buffer; payload: Buffer; wire: Buffer; bodiless: boolean; keep: boolean } {
  const name = (n: string) => (r.headerCase === 'lower' ? n.toLowerCase() : r.headerCase === 'UPPER' ? n.toUpperCase() : n);
  const payload = Buffer.concat(r.chunks.map((c) => Buffer.from(c.data)));
  const bodiless = r.method === 'HEAD' || r.status === 204 || r.status === 304;
  const fields = [`${name('Content-Type')}: text/event-stream`];
  let body = Buffer.alloc(0);
  let wire = Buffer.alloc(0);
  if (r.framing === 'length') {
    fields.push(`${name('Content-Length')}: ${payload.length}`);
    body = wire = payload;
  } else if (r.framing === 'chunked') {
    fields.push(`${name('Transfer-Encoding')}: chunked`);
    wire = Buffer.concat(
      r.chunks.map((c) => {
        const n = c.data.length.toString(16);
        const hex = c.hex === 'upper' ? n.toUpperCase() : c.hex === 'zero-padded' ? `00${n}` : n;
        return Buffer.concat([Buffer.from(`${hex}${c.ext}\r\n`), Buffer.from(c.data), Buffer.from('\r\n')]);
      }),
    );
    body = Buffer.concat([wire, Buffer.from(`0\r\n${r.trailer}\r\n`)]);
  } else {
    fields.push(`${name('Connection')}: close`);
    body = wire = payload;
  }
  if (r.close && r.framing !== 'close') fields.push(`${name('Connection')}: close`);
  if (bodiless) body = Buffer.alloc(0);
  const stray = r.stray && r.framing !== 'close'; // after a close-delimited body they would be body
  if (stray) body = Buffer.concat([body, Buffer.from('HTTP/1.1 200 OK\r\n')]);
  const head = `${r.interim.join('')}HTTP/1.1 ${r.status} X\r\n${fields.join('\r\n')}\r\n\r\n`;
  return {
    bytes: Buffer.concat([Buffer.from(head, 'latin1'), body]),
    payload: bodiless ? Buffer.alloc(0) : payload,
    wire: bodiless ? Buffer.alloc(0) : wire,
    bodiless,
    keep: r.framing !== 'close' && !r.close && !stray,
  };
}

describe('the upstream client, for every framing and split of a response', () => {
  it('delivers the payload exact and the framing verbatim, ends once, and keeps the connection in sync for the next exchange', async () => {
    await fc.assert(
      fc.asyncProperty(responseArb, async (r) => {
        escaped.length = 0;
        const want = render(r);
        const second = Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
        // A close-delimited answer is ended by the upstream's close; a bodiless one needs no end.
        script = [{ pieces: splitAt(want.bytes, r.cuts), end: r.framing === 'close' && !want.bodiless }, { pieces: [second], end: false }];
        const at = served.length;
        const got = await exchange(r.method);
        expect(got.errors).toEqual([]);
        expect(got.ends).toBe(1);
        expect(got.heads).toEqual([r.status]); // interim answers are not the response
        expect(got.body.equals(want.payload)).toBe(true);
        expect(got.wire.equals(want.wire)).toBe(true);
        // `last` only on the read that completes a length or chunked body.
        expect(got.lastFlags.slice(0, -1).every((l) => !l)).toBe(true);
        if (want.bodiless || r.framing === 'close') expect(got.lastFlags.every((l) => !l)).toBe(true);
        // A chunked body always ends in a read (its last chunk); a length body unless it is empty.
        else if (r.framing === 'chunked' || want.payload.length > 0) expect(got.lastFlags.at(-1)).toBe(true);
        else expect(got.lastFlags).toEqual([]);
        // Bytes after the answer reach the pool before the next exchange asks it for a connection:
        // one loop turn's reads at least (the 20 ms settle alone did not hold that on a busy loop).
        await answered;
        await sleep(5);
        // The next exchange reuses the connection when the answer allowed it and nothing
        // followed it (a bodiless answer whose framing said close still asked for the close),
        // else opens one.
        const next = await exchange('GET');
        expect(next.errors).toEqual([]);
        expect(next.body.toString()).toBe('ok');
        expect(served.length).toBe(at + 2);
        expect(served[at + 1] === served[at]).toBe(want.keep);
        expect(escaped).toEqual([]);
        script = [];
      }),
      { numRuns: 100 },
    );
  });

  it('ends an exchange once, with no exception escaping, whatever bytes come instead of a response', async () => {
    const valid = responseArb.map((r) => render(r).bytes);
    const bytesArb = fc.oneof(
      fc.uint8Array({ maxLength: 400 }).map((a) => Buffer.from(a)),
      // A response with one byte changed, cut short, or followed by more bytes.
      fc.tuple(valid, fc.nat(), fc.integer({ min: 0, max: 255 })).map(([b, i, v]) => {
        const c = Buffer.from(b);
        c[i % c.length] = v;
        return c;
      }),
      fc.tuple(valid, fc.nat()).map(([b, i]) => b.subarray(0, i % (b.length + 1))),
      fc.tuple(valid, fc.uint8Array({ minLength: 1, maxLength: 50 })).map(([b, extra]) => Buffer.concat([b, Buffer.from(extra)])),
    );
    await fc.assert(
      fc.asyncProperty(bytesArb, fc.array(fc.nat(), { maxLength: 8 }), fc.constantFrom('GET', 'HEAD'), async (bytes, cuts, method) => {
        escaped.length = 0;
        script = [{ pieces: splitAt(bytes, cuts), end: true }];
        const got = await exchange(method);
        expect(got.ends + got.errors.length).toBe(1);
        expect(escaped).toEqual([]);
        // The close reaches a pooled connection before the next run asks for one.
        await answered;
        await sleep(5);
        script = [];
      }),
      { numRuns: 120 },
    );
  });
});
