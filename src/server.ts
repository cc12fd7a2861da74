import { getRequestListener, RequestError, type HttpBindings } from '@hono/node-server';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { Hono } from 'hono';
import { createServer, IncomingMessage, type Server, type ServerOptions, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Telemetry } from './metrics/exporter.js';
import type { FinalScrape } from './metrics/final-scrape.js';
import type { Forwarder } from './proxy/forward.js';
import { deferContinue } from './proxy/server-answers.js';
import { CONNECT_ALLOW, CONNECT_REFUSAL, writeRawError } from './proxy/tunnel.js';

/**
 * The proxy app: one catch-all route. The forwarder works on Node's raw
 * request/response (through Hono's Node bindings) so bytes are piped with
 * backpressure and without a Web-stream hop per chunk.
 */
export function createProxyApp(forwarder: Forwarder): Hono<{ Bindings: HttpBindings }> {
  const app = new Hono<{ Bindings: HttpBindings }>();
  app.all('*', (c) => {
    forwarder.handle(c.env.incoming, c.env.outgoing);
    return RESPONSE_ALREADY_SENT;
  });
  return app;
}

export interface Health {
  ready(): boolean;
}

/** Scrapes collected or being sent at once; more get 503 (see createMetricsApp). */
export const MAX_SCRAPES_IN_FLIGHT = 4;
/** A scrape's connection is closed if its answer is not sent within this (Prometheus's scrape_timeout is 10 s by default). */
export const SCRAPE_DEADLINE_MS = 60_000;

/** Metrics and health on their own port; never forwarded upstream. */
export function createMetricsApp(
  telemetry: Telemetry | undefined,
  health: Health,
  { scrapeDeadlineMs = SCRAPE_DEADLINE_MS, finalScrape }: { scrapeDeadlineMs?: number; finalScrape?: FinalScrape } = {},
): Hono {
  const app = new Hono();
  // Each scrape holds its collected snapshot and unsent text until its client has read it: a
  // client that stops reading kept ~11-14 MB each at the series cap until timeouts.idle, and
  // nothing bounded how many (review 114). Prometheus scrapes one target at a time.
  let inFlight = 0;
  app.get('/metrics', async (c) => {
    if (!telemetry?.scrape) {
      return c.text('# metrics are disabled or pushed over OTLP only\n', 200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' });
    }
    if (inFlight >= MAX_SCRAPES_IN_FLIGHT) {
      return c.text(`# ${inFlight} scrapes are in flight (at most ${MAX_SCRAPES_IN_FLIGHT}); retry\n`, 503, { 'retry-after': '1' });
    }
    inFlight++;
    let held = true;
    let collecting = true;
    let gone = false;
    const release = () => {
      if (held) {
        held = false;
        inFlight--;
        clearTimeout(deadline);
      }
    };
    const outgoing = (c.env as Partial<HttpBindings> | undefined)?.outgoing;
    // Whatever ends the exchange (the body sent, the client gone, an error) lets the slot go, but
    // not before the collection is done: clients that connect and hang up must not start more.
    outgoing?.once('close', () => {
      gone = true;
      if (!collecting) release();
    });
    // A client that stops reading would keep its slot until timeouts.idle (590 s) and, with three
    // more, lock Prometheus out: a scrape gets scrapeDeadlineMs in all.
    const deadline = setTimeout(() => outgoing?.destroy(), scrapeDeadlineMs);
    deadline.unref();
    const collectedAt = performance.now();
    // Sent whole ('finish' comes only when the body's last byte was handed to the socket); not a
    // HEAD, which Hono routes here too and which sends no body.
    if (finalScrape !== undefined && c.req.method === 'GET') {
      const by = { address: outgoing?.socket?.remoteAddress, userAgent: c.req.header('user-agent') }; // the socket is detached by 'finish'
      outgoing?.once('finish', () => {
        if (outgoing.statusCode === 200) finalScrape.served(collectedAt, by);
      });
    }
    const pieces = telemetry.scrape();
    let first: IteratorResult<string>;
    try {
      first = await pieces.next();
    } catch (e) {
      release();
      return c.text(`# collection failed: ${(e as Error).message}\n`, 500);
    } finally {
      collecting = false;
    }
    if (gone) {
      release();
      await pieces.return(undefined);
      return c.body(null, 499 as never);
    }
    // Each piece goes out as it is written (see prometheus-text.ts): a large exposition is
    // neither one string nor one event-loop turn.
    const utf8 = new TextEncoder();
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        if (first.done) {
          release();
          controller.close();
        } else controller.enqueue(utf8.encode(first.value));
      },
      async pull(controller) {
        let next: IteratorResult<string>;
        try {
          next = await pieces.next();
        } catch (e) {
          release();
          throw e;
        }
        if (next.done) {
          release();
          controller.close();
        } else controller.enqueue(utf8.encode(next.value));
      },
      async cancel() {
        release();
        await pieces.return(undefined);
      },
    });
    return c.body(body, 200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' });
  });
  app.get('/healthz', (c) => c.json({ status: 'ok' }));
  app.get('/readyz', (c) => (health.ready() ? c.json({ status: 'ready' }) : c.json({ status: 'draining' }, 503)));
  app.notFound((c) => c.json({ error: 'not found', endpoints: ['/metrics', '/healthz', '/readyz'] }, 404));
  return app;
}

export type UpgradeHandler = (req: IncomingMessage, socket: Duplex, head: Buffer) => void;

/** Only WebSocket upgrades are tunnelled; any other `Upgrade` (h2c) is served as HTTP/1.1. */
const isWebSocket = (req: IncomingMessage): boolean => /^\s*websocket\s*$/i.test(req.headers.upgrade ?? '');

// Node 22.21+/24.9+ ask `shouldUpgradeCallback` which upgrades to hand over. Before (Node 20),
// an 'upgrade' listener takes every request with an Upgrade header, h2c ones too (which Java's
// HttpClient sends by default over http://), and the server decides by reading `req.upgrade`
// after the parser set it: a request class whose `upgrade` reads false for anything but a
// WebSocket (or CONNECT) keeps those on the normal path, as with no listener at all.
const probe = (): boolean => true;
const NATIVE_UPGRADE_CHOICE = (createServer({ shouldUpgradeCallback: probe } as ServerOptions) as { shouldUpgradeCallback?: unknown }).shouldUpgradeCallback === probe;

class WebSocketUpgradeOnly extends IncomingMessage {
  private upgradeAsked = false;
  get upgrade(): boolean {
    return this.upgradeAsked && (this.method === 'CONNECT' || isWebSocket(this));
  }
  set upgrade(v: boolean) {
    this.upgradeAsked = v;
  }
}

const upgradeOptions: ServerOptions = NATIVE_UPGRADE_CHOICE
  ? ({ shouldUpgradeCallback: isWebSocket } as ServerOptions)
  : { IncomingMessage: WebSocketUpgradeOnly };

/** CONNECT: this is a reverse proxy, not a forward one; say so instead of dropping the connection. */
function refuseConnect(_req: IncomingMessage, socket: Duplex): void {
  socket.on('error', () => {});
  writeRawError(socket, 405, 'method_not_allowed', CONNECT_REFUSAL, CONNECT_ALLOW);
}

export interface ListenOptions {
  keepAliveSeconds?: number;
  /** WebSocket upgrades go here. */
  onUpgrade?: UpgradeHandler;
  /** Answers CONNECT (by default a 405). */
  onConnect?: (req: IncomingMessage, socket: Duplex) => void;
  /**
   * Answers a request the HTTP adapter refuses before the app sees it (a Host it cannot parse, a
   * backslash in the path: a `RequestError`); by default its empty 400.
   */
  onRequestError?: (err: Error, req: IncomingMessage | undefined) => Response;
  /** Takes over Node's answer to HTTP its parser refuses (and to a connection error). */
  onClientError?: (err: Error, socket: Duplex) => void;
  /** Answers an `Expect` other than `100-continue` (by default Node's empty 417). */
  onExpectation?: (req: IncomingMessage, res: ServerResponse) => void;
  /**
   * A request that expects `100 Continue` is handled without it; the handler sends it
   * (`sendDeferredContinue`) if it reads the body.
   */
  deferContinue?: boolean;
  /** HTTP/1.1 requests without Host reach the app, which must refuse them itself (otherwise Node's bare 400). */
  hostOptional?: boolean;
  /**
   * A server error once listening (an accept that failed: EMFILE past libuv's reserve, ENOBUFS):
   * told here, and the server serves on. Without a listener a second one would be uncaught.
   */
  onServerError?: (err: Error) => void;
  /** Open connections at most (Node's `maxConnections`): past it a new one is closed unread, and `onDrop` told. */
  maxConnections?: number;
  onDrop?: () => void;
  /** Each connection accepted (not those dropped at `maxConnections`). */
  onConnection?: (socket: Socket) => void;
}

/** Starts a Hono app on Node; resolves with the server and its URL once listening. */
export function listen(
  app: { fetch: (req: Request, env: HttpBindings) => Response | Promise<Response> },
  port: number,
  host: string,
  { keepAliveSeconds, onUpgrade, onConnect = refuseConnect, onRequestError, onClientError, onExpectation, deferContinue: defer, hostOptional = false, onServerError = () => {}, maxConnections, onDrop, onConnection }: ListenOptions = {},
): Promise<{ server: Server; url: string }> {
  return new Promise((resolve, reject) => {
    // What @hono/node-server's serve() does, plus the adapter's error handler, which serve() does
    // not pass on.
    // The adapter calls its error handler with the error only, and for a request it refuses
    // (a RequestError) before its first await: the request being handled is the current one.
    let current: IncomingMessage | undefined;
    const adapter = getRequestListener(app.fetch as never, {
      hostname: host,
      autoCleanupIncoming: false,
      overrideGlobalObjects: false,
      // Only the adapter's own refusals: the app's errors keep the adapter's answer (a 500).
      ...(onRequestError ? { errorHandler: (e: unknown) => (e instanceof RequestError ? onRequestError(e, current) : new Response(null, { status: 500 })) } : {}),
    });
    const listener = (req: IncomingMessage, res: ServerResponse): Promise<void> => {
      // RFC 9112 §6.1: no Transfer-Encoding in an answer to HTTP/1.0. Node chunks one for a 1.0
      // request that offers `TE: chunked` (RFC 2616's reading); a body of unknown length then
      // ends at the close, as for any other 1.0 client.
      if (req.httpVersionMajor < 1 || req.httpVersionMinor < 1) res.useChunkedEncodingByDefault = false; // Node's own test for a 1.0 client
      current = req;
      try {
        return adapter(req, res);
      } finally {
        current = undefined;
      }
    };
    const server = createServer({ ...(onUpgrade ? upgradeOptions : {}), requireHostHeader: !hostOptional }, listener);
    // Node closes idle keep-alive connections after 5 s, so a client reusing one at
    // that moment gets ECONNRESET; the proxy keeps them longer than clients do.
    if (keepAliveSeconds !== undefined) server.keepAliveTimeout = keepAliveSeconds * 1000;
    // Node keeps only the first 2,000 rawHeaders entries (1,000 fields) but frames the body by
    // a Content-Length or Transfer-Encoding it dropped: a forwarded request would then lose its
    // framing. No count limit; the 16 KiB head size limit still bounds the fields.
    server.maxHeadersCount = 0;
    // Node cuts a request still arriving after 300 s with a bare 408 (requestTimeout), which
    // would cut a slow upload that moves, and be recorded as the client's cancellation. The
    // proxy's own response timer (forward.ts) handles a body that stops; headersTimeout (60 s)
    // still bounds a head that never completes.
    server.requestTimeout = 0;
    if (maxConnections !== undefined) server.maxConnections = maxConnections;
    if (onDrop) server.on('drop', onDrop);
    if (onConnection) server.on('connection', onConnection);
    if (onUpgrade) server.on('upgrade', onUpgrade);
    server.on('connect', onConnect);
    if (onClientError) server.on('clientError', onClientError);
    if (onExpectation) server.on('checkExpectation', onExpectation);
    if (defer) {
      server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => {
        deferContinue(res);
        void listener(req, res);
      });
    }
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      server.on('error', onServerError);
      const info = server.address() as AddressInfo;
      const h = info.family === 'IPv6' ? `[${info.address}]` : info.address;
      resolve({ server, url: `http://${h}:${info.port}` });
    });
  });
}
