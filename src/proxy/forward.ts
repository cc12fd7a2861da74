import { randomUUID } from 'node:crypto';
import { STATUS_CODES, type IncomingMessage, type OutgoingHttpHeaders, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { performance } from 'node:perf_hooks';
import type { Config } from '../config.js';
import { bufferLimitLog, type Logger, type Throttled } from '../log.js';
import { afterIo } from '../measure/after-io.js';
import { endError, RequestMeter, type MeterOptions, type MeterSummary, type RequestLabels } from '../measure/request-meter.js';
import type { Instruments } from '../metrics/instruments.js';
import { CardinalityLimiter } from '../metrics/labels.js';
import { ATTR, ERROR_TYPE } from '../metrics/semconv.js';
import { ByteBudget } from '../sse/byte-budget.js';
import { detectApi } from '../providers/detect.js';
import { genericStream } from '../providers/generic.js';
import type { ApiDescriptor } from '../providers/types.js';
import { countRaw, endToEndHeaders, isName, rawHeader, rawHeaderList, REQUEST_DROP } from './headers.js';
import { ChunkedError } from './chunked.js';
import { HttpParseError, type BodyFraming, type ResponseHead } from './http1.js';
import { lackMessage, lackOf } from './out-of-resources.js';
import { RequestBodyTap } from './request-info.js';
import { answerClientError, answerInProgress, sendDeferredContinue } from './server-answers.js';
import { Router, safePath, targetAuthority, type RouteMatch } from './routes.js';
import { CONNECT_ALLOW, CONNECT_REFUSAL, errorBody, Tunnel, writeRawError } from './tunnel.js';
import { deflateAccepted } from '../ws/messages.js';
import { detectWsApi, recordUnopened, REALTIME_OPERATION, WsSession, type WsApiMatch } from '../ws/session.js';
import { UpstreamClient, UpstreamTimeout, type Exchange, type ExchangeHandler, type Origin, type RequestBody } from './upstream.js';
import { warmUp } from './warm-up.js';

export interface ForwarderDeps {
  config: Config;
  log: Logger;
  /** Undefined when metrics are disabled: bytes are forwarded and nothing is parsed. */
  instruments: Instruments | undefined;
}

/**
 * A pause of the upstream read this long or longer, because the client had not taken what it was
 * sent, means the client held the stream back: from the pause on its arrival times are the
 * client's, and the meter leaves them out (RequestMeter.clientHeld). Shorter pauses are a fast
 * client's network draining a burst; they move one gap by less than this.
 */
export const CLIENT_HELD_MS = 100;

/**
 * The data path: one upstream request per client request, bytes never
 * decompressed or re-framed, backpressure from the client to the upstream
 * read, and a meter that sees each read only after it was written.
 *
 * A chunked upstream body is written to the client socket as the upstream
 * framed it (the client is on HTTP/1.1 and Node's server chunks the response
 * too, so the framing is valid as is); Node's ServerResponse writes the head
 * and the last chunk. Anything else goes through ServerResponse.write.
 */
export class Forwarder {
  private readonly router: Router;
  readonly upstream: UpstreamClient;
  private readonly models: CardinalityLimiter;
  private readonly responseModels: CardinalityLimiter;
  /** What all measured requests together keep of events and bodies being read (limits.maxBufferedBytes). */
  readonly buffered: ByteBudget;
  private readonly bufferLog: Throttled<void>;
  readonly limitResponseModel = (model: string): string => this.responseModels.limit(model);
  /** The proxy's own error types and HTTP statuses always; of in-band types, the first MAX_ERROR_TYPES. */
  private readonly errorTypes = new CardinalityLimiter(MAX_ERROR_TYPES);
  readonly limitErrorType = (t: string): string => (OWN_ERROR_TYPES.has(t) || HTTP_STATUS.test(t) ? t : this.errorTypes.limit(t));
  /** Streams and tunnels in flight, for graceful shutdown. */
  readonly inFlight = new Set<{ abort(errorType: string): void; readonly queued?: boolean }>();
  /** Tunnels closed (out of inFlight) whose line waits for a side to finish its frame. */
  private readonly finishing = new Set<Tunnel>();
  /** Shutting down: no new request is forwarded, no connection is kept after its answer. */
  draining = false;
  /** server.address and server.port of each route's origin, for the connect-duration metric. */
  private readonly connectLabels = new Map<Origin, Readonly<Record<string, string | number>>>();
  private readonly connected = (origin: Origin, ms: number): void => {
    const labels = this.connectLabels.get(origin);
    if (labels !== undefined) this.deps.instruments?.upstreamConnect.record(ms / 1000, labels);
  };

  constructor(private readonly deps: ForwarderDeps) {
    this.router = new Router(deps.config.routes, deps.config.egress);
    this.upstream = new UpstreamClient({
      connectTimeoutMs: deps.config.timeouts.connect * 1000,
      keepAliveMs: deps.config.timeouts.upstreamKeepAlive * 1000,
      keepAliveMaxMs: deps.config.timeouts.upstreamKeepAliveMax * 1000,
      maxAgeMs: deps.config.timeouts.upstreamConnectionMaxAge * 1000,
      onConnected: this.connected,
    });
    for (const r of this.router.routes) {
      this.connectLabels.set(r.origin, Object.freeze({ [ATTR.serverAddress]: r.serverAddress, [ATTR.serverPort]: r.origin.port }));
    }
    this.models = new CardinalityLimiter(deps.config.metrics.maxModelValues);
    this.responseModels = new CardinalityLimiter(deps.config.metrics.maxModelValues);
    const max = deps.config.limits.maxBufferedBytes;
    this.bufferLog = bufferLimitLog(deps.log, max);
    this.buffered = new ByteBudget(max, this.bufferLog);
  }

  /** Writes the counts of throttled log lines still waiting for their 10 s (at an exit). */
  flushCounts(): void {
    this.bufferLog.flush();
  }

  /** Start-up work a first request would otherwise wait for (warm-up.ts); before listening. */
  warmUp(): Promise<void> {
    return warmUp(this.router.routes);
  }

  handle(req: IncomingMessage, res: ServerResponse): void {
    const start = performance.now();
    if (this.draining) {
      // A request on a keep-alive connection opened before the shutdown: the client retries it
      // elsewhere (the SDKs retry a 503 by themselves), and is told to close the connection.
      res.shouldKeepAlive = false;
      return this.refuse(req, res, start, ...REFUSAL.draining);
    }
    if (hasDotSegment(req.url ?? '')) {
      // The upstream would resolve it, possibly out of the route's base path; no LLM API uses one.
      return this.refuse(req, res, start, ...REFUSAL.dotSegment);
    }
    if (req.httpVersionMajor !== 1) {
      // Node's parser takes `HTTP/2.0` (and 0.9) on a request line; no HTTP/1.x message (RFC 9110 §15.6.6; nginx: 505).
      res.shouldKeepAlive = false;
      return this.refuse(req, res, start, ...REFUSAL.version);
    }
    const te = req.headers['transfer-encoding'];
    if (te !== undefined && req.httpVersionMinor === 0) {
      // Faulty framing (RFC 9112 §6.1): a 1.0 recipient may read the body by its length or to
      // the close, and what follows as a request of the client's choosing (nginx: 400 too).
      res.shouldKeepAlive = false;
      return this.refuse(req, res, start, 400, 'invalid_framing', 'Transfer-Encoding in an HTTP/1.0 request');
    }
    if (te !== undefined && te.trim().toLowerCase() !== 'chunked') {
      // Node decoded the chunked framing; another coding (gzip) would reach the upstream with
      // nothing saying so, the field being hop-by-hop (nginx: 501 too).
      res.shouldKeepAlive = false;
      return this.refuse(req, res, start, 501, 'unsupported_transfer_encoding', `transfer-encoding "${te.slice(0, 100)}" is not supported; only chunked`);
    }
    const hosts = countRaw(req.rawHeaders, 'host');
    if (hosts > 1) {
      // RFC 9112 §3.2: a 400. Node keeps the first; X-Forwarded-Host would name it.
      res.shouldKeepAlive = false;
      return this.refuse(req, res, start, ...REFUSAL.twoHosts);
    }
    if (hosts === 0 && req.httpVersionMinor >= 1) {
      // RFC 9112 §3.2: a 400 too; the server lets it through (requireHostHeader) so that it gets
      // the proxy's own answer and log line rather than Node's bare one.
      res.shouldKeepAlive = false;
      return this.refuse(req, res, start, ...REFUSAL.noHost);
    }
    if (req.method === 'TRACE') {
      // It would echo the request, credentials included, back to a page (cross-site tracing);
      // no LLM API uses it (nginx: 405 too).
      res.setHeader('allow', TRACE_ALLOW);
      return this.refuse(req, res, start, ...REFUSAL.trace);
    }
    const match = this.router.match(req.url ?? '');
    if (!match) return this.refuse(req, res, start, 404, 'no_route', `no route for ${safePath(req.url)}`);
    const f = new InFlight(this, this.deps, match, req, res, start);
    // Pipelined behind an answer still being written: its upstream request waits until its own
    // answer has the connection (as nginx does), so one client connection holds at most one
    // upstream exchange, and a request behind an answer that never ends is never sent.
    if (res.socket === null) f.queue();
    else f.run();
  }

  /** The proxy's own answer to a request it does not forward: no measurement, one log line. */
  refuse(req: IncomingMessage, res: ServerResponse, start: number, status: number, type: string, message: string): void {
    sendError(res, status, type, message);
    req.resume();
    this.logRefusal(req, start, status, type);
  }

  /** The same for an upgrade or a CONNECT, answered on the raw socket, which then closes. */
  refuseRaw(req: IncomingMessage, socket: Duplex, start: number, status: number, type: string, message: string, extra?: string): void {
    writeRawError(socket, status, type, message, extra);
    this.logRefusal(req, start, status, type);
  }

  /** CONNECT: this is a reverse proxy, not a forward one; say so instead of dropping the connection. */
  refuseConnect(req: IncomingMessage, socket: Duplex): void {
    socket.on('error', ignore);
    if (this.pipelinedBehindAnswer(req, socket)) return;
    this.refuseRaw(req, socket, performance.now(), 405, 'method_not_allowed', CONNECT_REFUSAL, CONNECT_ALLOW);
  }

  /**
   * A request the HTTP adapter refused before the router saw it (a Host it cannot parse, a
   * backslash in the path): one line with the adapter's reason.
   */
  refuseUnparsed(err: Error, req: IncomingMessage | undefined): Response {
    const log = this.deps.log;
    if (log.isLevelEnabled('info')) {
      const which = req === undefined ? {} : { reqId: requestIdOf(req), method: req.method, path: safePath(req.url) };
      log.info({ ...which, status: 400, outcome: 'refused', errorType: 'invalid_request', err: err.message }, 'request');
    }
    return new Response(errorBody('invalid_request', err.message), { status: 400, headers: { 'content-type': 'application/json', connection: 'close' } });
  }

  /**
   * HTTP Node's parser refused (a head over 16 KiB, bytes that are not HTTP, a head that did not
   * arrive in time): answered with Node's status, the connection closed, one line. Nothing was
   * parsed, so the line has the reason but no method or path.
   */
  refuseClientError(err: Error, socket: Duplex): void {
    const current = answerInProgress(socket);
    // A request whose head Node had parsed and whose body had not all come: handed to the proxy,
    // which logs it (answered, refused or cancelled).
    const parser = (socket as { parser?: { incoming?: IncomingMessage | null } | null }).parser;
    const incoming = parser?.incoming?.complete === false ? parser.incoming : undefined;
    const handedOver = Boolean(current) || incoming !== undefined;
    const cut = current?.headersSent === true;
    // The body of a request still in flight, whose answer has the connection: the refusal is that
    // request's own (found before the answer below closes the socket, which completes it; its
    // line waits for afterIo). Refused bytes of anything else (a request pipelined behind it, a
    // request already answered) keep a line of their own.
    const owner = incoming === undefined ? undefined : IN_FLIGHT.get(incoming);
    const own = owner !== undefined && this.inFlight.has(owner) && owner.isAnsweredBy(current) ? owner : undefined;
    const answer = answerClientError(err, socket);
    if (answer === undefined) return;
    // A client that closes in the middle of such a request: that request's own line says so.
    if (answer.status === undefined && handedOver) return;
    if (own !== undefined) return own.refusedByServer(cut ? undefined : answer.status, answer.type, answer.message, cut);
    const log = this.deps.log;
    if (!log.isLevelEnabled('info')) return;
    const outcome = answer.status === undefined ? 'cancelled' : 'refused';
    log.info({ status: answer.status, outcome, errorType: answer.type, err: answer.message, answerCut: cut || undefined }, 'request');
  }

  /** An `Expect` other than `100-continue`: 417, as from Node, with a line. */
  refuseExpectation(req: IncomingMessage, res: ServerResponse): void {
    const expect = String(req.headers.expect ?? '').slice(0, 100);
    this.refuse(req, res, performance.now(), 417, 'expectation_failed', `Expect "${expect}" cannot be met; only 100-continue is`);
  }

  /**
   * An upgrade or CONNECT pipelined behind a request whose answer is still being written: an
   * answer of its own would land inside that one's body. No client does this; the connection
   * is closed (the answer ahead is cut with it).
   */
  private pipelinedBehindAnswer(req: IncomingMessage, socket: Duplex): boolean {
    if (!answerInProgress(socket)) return false;
    this.deps.log.warn({ method: req.method, path: safePath(req.url) }, `${req.method === 'CONNECT' ? 'CONNECT' : 'upgrade'} pipelined behind an unfinished answer: connection closed`);
    socket.destroy();
    return true;
  }

  private logRefusal(req: IncomingMessage, start: number, status: number, type: string): void {
    const log = this.deps.log;
    if (log.isLevelEnabled('info')) {
      log.info(
        { reqId: requestIdOf(req), method: req.method, path: safePath(req.url), upgrade: req.headers.upgrade?.slice(0, 100), status, outcome: 'refused', errorType: type, durationMs: round(performance.now() - start) },
        'request',
      );
    }
  }

  /**
   * A WebSocket upgrade (server.ts hands over only those): the same checks and routing as a
   * request, then a byte tunnel to the route's upstream (proxy/tunnel.ts), whose messages are
   * measured when the API is OpenAI Realtime or Gemini Live (ws/session.ts).
   */
  upgrade(req: IncomingMessage, socket: Duplex, early: Buffer): void {
    const start = performance.now();
    // Node's server dropped its own error listener when it handed the socket over.
    socket.on('error', ignore);
    if (this.pipelinedBehindAnswer(req, socket)) return;
    if (this.draining) return this.refuseRaw(req, socket, start, ...REFUSAL.draining);
    if (hasDotSegment(req.url ?? '')) return this.refuseRaw(req, socket, start, ...REFUSAL.dotSegment);
    if (req.httpVersionMajor !== 1) return this.refuseRaw(req, socket, start, ...REFUSAL.version);
    // A WebSocket opening handshake is a GET (RFC 6455 §4.1): a TRACE with upgrade headers is no bypass.
    if (req.method !== 'GET') {
      return this.refuseRaw(req, socket, start, 405, 'method_not_allowed', `an upgrade is a GET, not ${safeToken(req.method)}`, 'allow: GET\r\n');
    }
    // HTTP/1.0 has no upgrade (RFC 9110 §7.8: a server ignores the field); Node would hand it over.
    if (req.httpVersionMinor === 0) return this.refuseRaw(req, socket, start, 400, 'invalid_upgrade', 'an upgrade needs HTTP/1.1');
    const hosts = countRaw(req.rawHeaders, 'host');
    if (hosts > 1) return this.refuseRaw(req, socket, start, ...REFUSAL.twoHosts);
    if (hosts === 0) return this.refuseRaw(req, socket, start, ...REFUSAL.noHost); // HTTP/1.1 from here
    if (req.headers['transfer-encoding'] !== undefined || (req.headers['content-length'] ?? '0') !== '0') {
      // A WebSocket opening handshake is a GET without a body (RFC 6455 §4.1).
      return this.refuseRaw(req, socket, start, 400, 'invalid_upgrade', 'an upgrade request with a body is not forwarded');
    }
    const match = this.router.match(req.url ?? '');
    if (!match) return this.refuseRaw(req, socket, start, 404, 'no_route', `no route for ${safePath(req.url)}`);
    const requestId = requestIdOf(req);
    const headers = endToEndHeaders(req.rawHeaders, REQUEST_DROP, ['host', match.resolved.upstream.host]);
    headers.push('connection', 'upgrade', 'upgrade', rawHeader(req.rawHeaders, 'upgrade') ?? 'websocket');
    addProxyHeaders(headers, req, requestId, match.resolved.route.forwardedHeaders);
    const { timeouts } = this.deps.config;
    const tunnel = new Tunnel(
      {
        log: this.deps.log,
        requestId,
        origin: match.resolved.origin,
        path: match.upstreamPath,
        connectTimeoutMs: timeouts.connect * 1000,
        responseTimeoutMs: timeouts.response * 1000,
        idleTimeoutMs: timeouts.idle * 1000,
        onDone: (t) => {
          this.inFlight.delete(t);
          if (t.finishing) this.finishing.add(t);
        },
        onLogged: (t) => this.finishing.delete(t),
        measure: (ext) => this.measureTunnel(match, ext),
        failed: (status, errorType, start) => this.recordFailedUpgrade(match, status, errorType, start),
        onConnected: this.connected,
      },
      req,
      socket,
      early,
      headers,
    );
    this.inFlight.add(tunnel);
    tunnel.run();
  }

  /** The measurement of an open tunnel's messages, when metrics are on and the API is one it reads. */
  private measureTunnel(match: RouteMatch, extensions: string | undefined): WsSession | undefined {
    const ins = this.deps.instruments;
    const api = ins ? detectWsApi(match.upstreamPath) : undefined;
    if (api === undefined) return undefined;
    const deflate = deflateAccepted(extensions);
    if (deflate === null) return undefined; // an extension whose frames cannot be read
    return new WsSession(api, {
      instruments: ins!,
      // The URL's model takes its place with the first response, not at the 101 (see limitModel).
      labels: this.wsLabels(match, api, api.requestModel),
      // No deferral: every message is measured after its bytes were forwarded already.
      meter: this.wsMeterOptions(),
      deflate,
      limitModel: (m) => this.limitModel(m),
    });
  }

  /** A Realtime or Live connection that did not open is a failed request, as an HTTP one would be. */
  private recordFailedUpgrade(match: RouteMatch, status: number, errorType: string | undefined, start: number): void {
    const ins = this.deps.instruments;
    const api = ins ? detectWsApi(match.upstreamPath) : undefined;
    if (api === undefined) return;
    // `errorType` set: the proxy's own answer (unreachable, out of resources), not the upstream's.
    const labels = this.wsLabels(match, api, this.modelLabel(api.requestModel, errorType === undefined && status > 0 ? status : undefined));
    try {
      recordUnopened(ins!, labels, start, status, errorType, this.wsMeterOptions());
    } catch (e) {
      this.deps.log.error({ err: (e as Error).message }, 'measurement failed');
    }
  }

  private wsMeterOptions(): MeterOptions {
    return { ...this.deps.config.limits, limitResponseModel: this.limitResponseModel, limitErrorType: this.limitErrorType };
  }

  private wsLabels(match: RouteMatch, api: WsApiMatch, requestModel: string | undefined): RequestLabels {
    return {
      provider: match.resolved.providerName ?? api.defaultProviderName,
      operation: REALTIME_OPERATION,
      requestModel,
      serverAddress: match.resolved.serverAddress,
      serverPort: match.resolved.origin.port,
    };
  }

  /** An empty model is no model: Prometheus reads a label with an empty value as no label. */
  limitModel(model: string | undefined): string | undefined {
    return model === undefined || model === '' ? undefined : this.models.limit(model);
  }

  /**
   * A request model's label once the upstream's answer is known (`status`; undefined when none
   * came: the proxy's own answer, a client that left first). A new name takes a place under the
   * cap only when the upstream answered it, and not as providers answer a name they do not serve
   * or a request they did not authenticate (NOT_ADMITTED), so names a provider rejects cannot
   * fill the cap: until a request of theirs is answered otherwise they have no model label.
   */
  modelLabel(model: string | undefined, status: number | undefined): string | undefined {
    if (model === undefined || model === '') return undefined;
    return status !== undefined && !NOT_ADMITTED.has(status) ? this.models.limit(model) : this.models.known(model);
  }

  /**
   * Ends every tunnel as at the shutdown deadline (`Tunnel.abort`: an open one's sides get a Close
   * where one can go in, after a frame in flight for up to FRAME_FINISH_MS): Node's server cannot
   * close the sockets it handed over.
   */
  cutTunnels(errorType: string): void {
    for (const f of [...this.inFlight]) if (f instanceof Tunnel) f.abort(errorType);
  }

  /**
   * For an exit that cannot wait (a second signal, a crash): each open tunnel is ended as at the
   * drain deadline, but a side mid-frame is cut at once rather than let finish (the process would
   * end first), so that every tunnel's line is written before the exit. One that throws does not
   * keep the others from their Close; what it threw is logged.
   */
  endTunnelsNow(errorType: string): void {
    const failed = (step: string, e: unknown): void => {
      try {
        this.deps.log.error({ step, err: e instanceof Error ? e.message : String(e) }, 'a tunnel could not be ended at a forced exit');
      } catch {
        /* the exit goes on */
      }
    };
    // Those closed already (an idle timeout, the drain deadline) whose side still finishes its frame too.
    for (const f of [...this.inFlight, ...this.finishing]) {
      if (!(f instanceof Tunnel)) continue;
      try {
        f.abort(errorType);
      } catch (e) {
        failed('abort', e);
      }
      try {
        f.finishNow();
      } catch (e) {
        failed('finishNow', e);
      }
    }
  }

  close(): void {
    this.upstream.close();
  }
}

/** One proxied request, from arrival to the last byte. */
class InFlight implements ExchangeHandler {
  private exchange: Exchange | undefined;
  private upstreamStatus: number | undefined;
  private meter: RequestMeter | undefined;
  private labels: RequestLabels | undefined;
  /** The request's model (body or path), as the client named it. */
  private model: string | undefined;
  private modelFixed = false;
  /** The API, when it had to be known before the request left (to ask for identity encoding). */
  private api: ApiDescriptor | undefined;
  /** Reads the model name from the request body, once the meter is set up. */
  private tap: RequestBodyTap | undefined;
  /** Body chunks forwarded before the meter was set up (references; Node does not reuse them). */
  private bodySeen: Buffer[] | undefined;
  private done = false;
  private readonly requestId: string;
  private timer: NodeJS.Timeout | undefined;
  /** Upload progress that re-armed the response timeout (see responseDue). */
  private uploadMoves = 0;
  /** The client socket when the body is forwarded verbatim, else undefined (ServerResponse.write). */
  private raw: Socket | undefined;
  private paused = false;
  /** When the client's backpressure last paused the upstream read, and the time held pauses took before. */
  private pausedSince: number | undefined;
  private pausedMs: number | undefined;
  private bodyFraming: RequestBody = 'none';
  /** The client's body waits for the upstream to take what was written (backpressure). */
  private bodyHeld = false;
  /** When the request's last byte arrived (the log's `uploadMs`: TTFT counts from the head). */
  private uploadEnd: number | undefined;
  /** Waiting for the answer ahead on its connection; never sent upstream while set. */
  queued = false;
  /** Node's parser refused this request's body (Forwarder.refuseClientError). */
  private refusal: { status: number | undefined; type: string; reason: string; cut: boolean } | undefined;
  private readonly resume = (): void => {
    this.paused = false;
    this.endPause(performance.now());
    this.exchange?.resume();
  };

  /**
   * A pause of the upstream read ended (the client took what it was sent, or the request ended).
   * Only a pause of `CLIENT_HELD_MS` or more counts as the client holding the stream back: a fast
   * client's socket whose send buffer a large write filled (a burst, a 200 KiB `response.completed`)
   * drains within a round trip or two, while a client that paces its reading (speech playback) or
   * a slow link holds it for seconds. The verdict comes before any later read is measured: the
   * upstream is not read while paused.
   */
  private endPause(now: number): void {
    const since = this.pausedSince;
    if (since === undefined) return;
    this.pausedSince = undefined;
    if (now - since < CLIENT_HELD_MS) return;
    this.pausedMs = (this.pausedMs ?? 0) + (now - since);
    this.meter?.clientHeld(since);
  }

  constructor(
    private readonly fwd: Forwarder,
    private readonly deps: ForwarderDeps,
    private readonly match: RouteMatch,
    private readonly req: IncomingMessage,
    private readonly res: ServerResponse,
    private start: number,
  ) {
    this.requestId = requestIdOf(req);
    IN_FLIGHT.set(req, this);
  }

  isAnsweredBy(res: unknown): boolean {
    return this.res === res;
  }

  /**
   * Node's parser refused this request's body: the status sent in its answer's place (none when
   * its answer had begun, and was cut), read when the line is written, after the socket closed.
   */
  refusedByServer(status: number | undefined, type: string, reason: string, cut: boolean): void {
    this.refusal = { status, type, reason, cut };
  }

  /**
   * Waits for the answer ahead on the connection. Its own clock starts when it is sent: the wait
   * is the client's, not the provider's. If the connection goes first, Node destroys the
   * request (abortIncoming): a cancellation with a log line and no measurement, as no provider
   * ever had it.
   */
  queue(): void {
    this.fwd.inFlight.add(this);
    this.queued = true;
    const gone = (): void => this.cancel();
    this.req.once('close', gone);
    // When the connection is handed over (an upgrade or CONNECT behind it) Node destroys no
    // queued request: the socket's own 'close', one listener per connection, stands for it.
    const socket = this.req.socket;
    let waiting = QUEUED.get(socket);
    if (waiting === undefined) {
      const set = (waiting = new Set<InFlight>());
      QUEUED.set(socket, set);
      socket.once('close', () => {
        for (const f of set) f.cancel();
        set.clear();
      });
    }
    waiting.add(this);
    this.res.once('socket', () => {
      this.req.removeListener('close', gone);
      waiting.delete(this);
      if (this.done) return;
      if (this.fwd.draining) {
        // Its turn came during a shutdown: never sent, so refused as a new request would be,
        // and the client retries it elsewhere.
        this.done = true;
        this.fwd.inFlight.delete(this);
        this.res.shouldKeepAlive = false;
        this.fwd.refuse(this.req, this.res, this.start, ...REFUSAL.draining);
        return;
      }
      this.queued = false;
      this.start = performance.now();
      this.run();
    });
  }

  run(): void {
    const { req, res, match, deps } = this;
    const { upstream } = match.resolved;
    this.fwd.inFlight.add(this);

    if (deps.instruments) this.bodySeen = [];
    // Host and the body's framing first: a server that keeps only so many fields (Node: 1,000)
    // still gets them when a client sends that many.
    const headers = ['host', upstream.host];
    // The body's framing is the proxy's own, from what Node's parser framed it by: it keeps its
    // length, or is chunked again (Node decoded it). Never copied: a client that lists
    // Content-Length in Connection would otherwise send unframed body bytes upstream, which the
    // upstream reads as a request of the client's choosing on a connection others reuse.
    let body: RequestBody = 'none';
    const length = req.headers['content-length'];
    if (req.headers['transfer-encoding'] !== undefined) {
      body = 'chunked';
      headers.push('transfer-encoding', 'chunked');
    } else if (length !== undefined) {
      body = 'length';
      headers.push('content-length', length);
    }
    this.bodyFraming = body;
    endToEndHeaders(req.rawHeaders, REQUEST_DROP, headers);
    addProxyHeaders(headers, req, this.requestId, match.resolved.route.forwardedHeaders);
    if (deps.instruments && deps.config.metrics.identityEncoding && (req.method === 'POST' || req.method === 'GET') && req.headers['accept-encoding'] !== undefined) this.askIdentity(headers);

    // Client body -> upstream, with backpressure; the model name is read as it passes.
    // Listening first puts the body's first read (on resume's tick) ahead of the
    // uncork of the request head, so head and a small body leave in one write.
    const resumeReq = () => {
      this.bodyHeld = false;
      req.resume();
    };
    req.on('data', (c: Buffer) => {
      if (this.bodyFraming === 'none') {
        // Bytes with no framing to forward them in (cannot happen with Node's parser as
        // configured): never written upstream, where they would be read as a request.
        this.abort(ERROR_TYPE.clientCancelled);
        return;
      }
      const ex = this.exchange!;
      if (!ex.write(c)) {
        this.bodyHeld = true;
        req.pause();
        ex.whenDrained(resumeReq);
      }
      // An upload that moves puts the response timeout back; one the upstream stopped taking
      // (backpressure, no drain) lets it fire.
      this.uploadMoved();
      if (this.tap !== undefined) this.tap.push(c);
      else this.bodySeen?.push(c);
    });
    req.once('end', () => {
      this.uploadEnd = performance.now();
      this.exchange!.end();
      this.takeModel();
      // The response timeout counts from the request's last byte (as nginx's proxy_read_timeout
      // does), so a large upload on a slow link is not cut. An upstream that answered early
      // (a 413) has its head in already, and its timer is cleared.
      this.uploadMoved();
    });
    this.timer = setTimeout(this.responseDue, deps.config.timeouts.response * 1000);
    this.exchange = this.fwd.upstream.request(match.resolved.origin, req.method ?? 'GET', match.upstreamPath, headers, body, this);
    req.on('error', () => this.cancel());

    // The client went away before we finished: cancel the upstream at once.
    res.once('close', () => {
      if (!res.writableFinished) this.cancel();
    });
    // The request head (and a body already read) leaves on a tick queued above;
    // what only measurement needs is set up after this loop iteration's I/O
    // callbacks, so that in a burst of new requests every head leaves first.
    // Whatever needs the meter earlier (the response head, the end) sets it up
    // then: `bodySeen` stands for "not set up yet".
    if (deps.instruments) afterIo(() => this.setUpMeter());
    // Only a request that is forwarded asks the client for its body.
    sendDeferredContinue(res);
  }

  /**
   * A compressed stream can only be timed, not read (Anthropic gzips SSE for clients that
   * accept it, as Node's fetch does): a generation call (a POST, or a GET resuming a stream) to a recognised LLM API is
   * asked for identity encoding. Every client accepts identity unless it refuses it
   * (`identity;q=0`, `*;q=0`), which none of the LLM clients does. A request whose signature
   * covers the header (AWS SigV4) keeps it: changing it would fail the signature.
   */
  private askIdentity(headers: string[]): void {
    const api = (this.api = detectApi(this.match.upstreamPath, this.match.resolved.route.provider, this.match.resolved.providerNames, this.req.method));
    if (api === undefined || api === genericStream || signsAcceptEncoding(this.req)) return;
    replaceRaw(headers, 'accept-encoding', 'identity');
  }

  /** Idempotent: `bodySeen` is undefined once set up (or without instruments). */
  private setUpMeter(): void {
    if (this.bodySeen === undefined) return;
    const seen = this.bodySeen;
    this.bodySeen = undefined;
    try {
      this.measure(seen);
    } catch (e) {
      // Measurement only: a throw must not end the process (afterIo) or fail the request (onHead).
      // The request goes on unmeasured.
      this.meter?.discard();
      this.meter = undefined;
      this.tap = undefined;
      this.deps.log.error({ reqId: this.requestId, err: (e as Error).message }, 'measurement set-up failed');
    }
  }

  private measure(seen: Buffer[] | undefined): void {
    const { match, deps } = this;
    const api = this.api ?? detectApi(match.upstreamPath, match.resolved.route.provider, match.resolved.providerNames, this.req.method);
    if (api === undefined) return;
    const pathModel = (this.model = api.modelFromPath?.(match.upstreamPath));
    this.labels = {
      provider: match.resolved.providerName ?? api.defaultProviderName,
      operation: api.operation,
      requestModel: undefined, // set once the upstream's answer (or its absence) is known: modelLabel()
      serverAddress: match.resolved.serverAddress,
      serverPort: match.resolved.origin.port,
    };
    // Also when the request already failed or was cancelled: record() runs later and reads it.
    this.meter = new RequestMeter(deps.instruments!, api.newAdapter(), this.labels, this.start, {
      ...deps.config.limits,
      budget: this.fwd.buffered,
      defer: afterIo,
      limitResponseModel: this.fwd.limitResponseModel,
      limitErrorType: this.fwd.limitErrorType,
    });
    // The body is read for its model, or (Azure's deployment paths) only for a prediction.
    if (pathModel !== undefined && api.predictedOutputs !== true) return;
    const tap = (this.tap = new RequestBodyTap(deps.config.limits.maxRequestScanBytes));
    if (seen !== undefined) for (const c of seen) tap.push(c);
    this.takeModel(); // the body's end may have come first
  }

  /** The body ended and was read by the tap: its model is the request's, unless the path named it. */
  private takeModel(): void {
    if (!this.req.readableEnded || this.tap === undefined) return;
    this.model ??= this.tap.model(); // a model the path named stays
    if (this.tap.prediction()) this.meter?.predictedOutput();
  }

  /** The model label, once: at the upstream's response head, else at the end (no answer came). */
  private fixModelLabel(status: number | undefined): void {
    if (this.labels !== undefined && !this.modelFixed) {
      this.modelFixed = true;
      this.labels.requestModel = this.fwd.modelLabel(this.model, status);
    }
  }

  onHead(head: ResponseHead, framing: BodyFraming): void {
    clearTimeout(this.timer);
    this.setUpMeter();
    const { res, meter } = this;
    if (this.done) return;
    this.upstreamStatus = head.status;
    this.fixModelLabel(head.status);
    const headers = endToEndHeaders(head.rawHeaders);
    // The transfer coding wins over a Content-Length (RFC 9112 §6.3): never pass both on.
    if (framing.kind === 'chunked') removeRaw(headers, 'content-length');
    // Repeated equal lengths (`5`, `5` or `5, 5`) become one (RFC 9110 §8.6): clients refuse the
    // list. Also without a body (HEAD, 204, 304), where the length was not checked.
    else if (repeatedLength(headers)) {
      const one = framing.kind === 'length' ? String(framing.length) : singleLength(headers);
      if (one !== undefined) replaceRaw(headers, 'content-length', one);
    }
    if (this.fwd.draining) res.shouldKeepAlive = false; // Connection: close, and closed after the answer
    // The head and whatever body came in the same read leave in one write.
    this.corkClient();
    try {
      res.writeHead(head.status, head.statusText || undefined, headers as unknown as OutgoingHttpHeaders);
      // Headers go out now, not with the first body chunk: the client's clock starts here too.
      // Not flushHeaders(): it writes the head as UTF-8, which re-encodes the bytes 0x80–0xFF a
      // header value or reason phrase may hold (obs-text, parsed as latin1); an empty latin1
      // write sends the head as latin1. Without a body (HEAD, 204, 304) it waits for end().
      res.write('', 'latin1');
    } catch (e) {
      // Valid to our parser but not to Node's (a status Node refuses): not HTTP it can answer with.
      this.exchange?.destroy(new HttpParseError(`response head not forwardable: ${(e as Error).message}`));
      return;
    }
    const socket = res.socket;
    if (framing.kind === 'chunked' && res.chunkedEncoding && socket && !socket.destroyed) this.raw = socket;
    meter?.responseStart(head.status, rawHeader(head.rawHeaders, 'content-type'), rawHeaderList(head.rawHeaders, 'content-encoding'));
    this.exchange?.setIdleTimeout(this.deps.config.timeouts.idle * 1000);
  }

  onData(wire: Buffer, body: Buffer, ranges: readonly number[], arrival: number, last: boolean): void {
    if (this.done) return;
    const raw = this.raw;
    // The last bytes and the terminating chunk that res.end() writes: one write.
    if (last && raw !== undefined) this.corkClient();
    if (raw !== undefined) {
      if (wire.length > 0 && !raw.write(wire) && !this.paused) this.waitFor(raw);
    } else {
      for (let i = 0; i < ranges.length; i += 2) {
        const s = ranges[i]!;
        const e = ranges[i + 1]!;
        if (!this.res.write(s === 0 && e === body.length ? body : body.subarray(s, e)) && !this.paused) this.waitFor(this.res);
      }
    }
    // Forward first, then measure: the bytes leave before the meter runs.
    if (last) this.res.end();
    else if (this.corked) this.uncork();
    const meter = this.meter;
    if (meter !== undefined) for (let i = 0; i < ranges.length; i += 2) meter.chunk(body, arrival, ranges[i], ranges[i + 1]);
  }

  private corked = false;
  private readonly uncork = (): void => {
    if (!this.corked) return;
    this.corked = false;
    this.res.socket?.uncork();
  };

  /** Batches this tick's writes to the client socket into one (uncorked on the next tick, as ServerResponse does). */
  private corkClient(): void {
    const socket = this.res.socket;
    if (this.corked || !socket || socket.destroyed) return;
    this.corked = true;
    socket.cork();
    process.nextTick(this.uncork);
  }

  private waitFor(sink: { once(ev: 'drain', cb: () => void): unknown }): void {
    this.paused = true;
    // A write to a corked socket (the response head's turn, the last read, every ServerResponse
    // write) returns false from 16 KiB on, and a fast client's socket takes it when it is uncorked
    // in the same turn; a large write fills a fast client's send buffer for a round trip. Whether
    // the client held the stream back is judged by the pause's length, when it ends (endPause).
    this.pausedSince = performance.now();
    this.exchange?.pause();
    sink.once('drain', this.resume);
  }

  private uploadMoved(): void {
    if (this.done || this.upstreamStatus !== undefined) return;
    this.uploadMoves++;
    this.timer?.refresh(); // refresh() re-arms a timer that has fired
  }

  /**
   * Timers run before the loop reads its sockets: after a stall of this process as long as the
   * timeout, the timer fires before a head or body bytes that arrived meanwhile are read. Judge
   * after this turn's reads, which clear the timer (a head) or re-arm it (an upload that moved).
   */
  private readonly responseDue = (): void => {
    const moves = this.uploadMoves;
    setImmediate(() => {
      if (!this.done && this.upstreamStatus === undefined && this.uploadMoves === moves) this.responseTimedOut();
    });
  };

  /**
   * No response head within timeouts.response of the request's last progress. While the client
   * still owes body bytes and the upstream is taking them, the silence is the client's: it gets
   * a 408, recorded as a cancellation (it abandoned the request), not the upstream's timeout.
   */
  private responseTimedOut(): void {
    if (this.done) return;
    if (this.req.readableEnded || this.bodyHeld || this.res.headersSent) {
      // With timeouts.response below timeouts.connect, a connect (or TLS handshake) that hangs
      // ends here: name the phase it was in.
      const ex = this.exchange;
      ex?.destroy(ex.connected ? new UpstreamTimeout('response') : new UpstreamTimeout('connect', ex.connectDetail()));
      return;
    }
    this.deps.log.warn({ reqId: this.requestId, timeoutSeconds: this.deps.config.timeouts.response }, 'client stopped sending its request body');
    this.res.shouldKeepAlive = false; // the rest of that body may still come: do not read it as a request
    sendError(this.res, 408, 'request_body_timeout', `no request body byte for ${this.deps.config.timeouts.response} s`);
    this.cancel(ERROR_TYPE.clientCancelled);
  }

  onEnd(): void {
    if (this.done) return;
    if (!this.res.writableEnded) this.res.end(); // a response that ended with its head
    this.complete(undefined);
  }

  onError(err: Error): void {
    if (this.done) return;
    clearTimeout(this.timer);
    const timeout = err instanceof UpstreamTimeout;
    const protocol = err instanceof HttpParseError || err instanceof ChunkedError;
    if (!this.res.headersSent) {
      // Nothing reached the client yet: answer for the upstream.
      const code = (err as NodeJS.ErrnoException).code;
      // Out of file descriptors or buffers: the proxy's own state, not the provider's (a 503, as
      // for any server that cannot take more now).
      const lack = this.exchange?.connected !== true ? lackOf(err) : undefined;
      const exhausted = lack !== undefined;
      const status = timeout ? 504 : exhausted ? 503 : 502;
      // A connection that was up and then closed or reset (a pooled one the server dropped, too) is
      // a reset; one that never came up is unreachable.
      const reset = !timeout && !protocol && !exhausted && this.exchange?.connected === true;
      const type = timeout ? ERROR_TYPE.timeout : protocol ? ERROR_TYPE.protocol : exhausted ? ERROR_TYPE.outOfResources : reset ? ERROR_TYPE.upstreamReset : ERROR_TYPE.unreachable;
      const detail = errorWords(err);
      // Through an egress proxy the error names the proxy with the cause's code; the cause's
      // own words (a handshake the upstream ended, a certificate it refused) go in `cause`.
      const inner = err.cause instanceof Error ? (err.cause as NodeJS.ErrnoException) : undefined;
      const causeWords = inner === undefined ? '' : errorWords(inner);
      const cause = causeWords !== '' && !detail.includes(causeWords) ? causeWords : undefined;
      this.deps.log.warn({ reqId: this.requestId, upstream: this.match.resolved.upstream.origin, err: detail, cause, code: code ?? lack?.code ?? inner?.code }, 'upstream request failed');
      if (this.fwd.draining) this.res.shouldKeepAlive = false;
      const message = timeout
        ? err.message
        : protocol
          ? `invalid upstream response: ${err.message}`
          : exhausted
            ? lackMessage(lack)
            : reset
              ? (err as NodeJS.ErrnoException).syscall === 'write'
                ? `upstream closed the connection while the request body was being sent (${code ?? err.message})`
                : `upstream closed the connection before responding (${code ?? err.message})`
              : `upstream unreachable: ${code ?? err.message}`;
      sendError(this.res, status, type, message);
      this.complete(type);
      this.req.resume();
      return;
    }
    // Mid-body: the client must see a truncated response, not a clean end.
    if (timeout && this.paused) {
      // The upstream was silent because the proxy stopped reading it: the client has not taken
      // what it was sent for timeouts.idle. Still cut (it holds an upstream connection), but
      // not blamed on the upstream.
      this.deps.log.warn({ reqId: this.requestId, idleSeconds: this.deps.config.timeouts.idle }, 'client stopped reading: stream cut after timeouts.idle');
    } else {
      this.deps.log.warn({ reqId: this.requestId, err: err.message }, 'upstream stream failed mid-body');
    }
    this.complete(timeout ? ERROR_TYPE.timeout : protocol ? ERROR_TYPE.protocol : ERROR_TYPE.upstreamReset);
    this.res.destroy();
  }

  cancel(errorType: string = ERROR_TYPE.clientCancelled): void {
    if (this.done) return;
    this.complete(errorType);
    this.exchange?.destroy();
  }

  /** Cut at a shutdown deadline: record it, then close both sides. */
  abort(errorType: string): void {
    this.cancel(errorType);
    this.res.destroy();
  }

  private complete(errorType: string | undefined): void {
    if (this.done) return;
    const end = performance.now();
    this.done = true;
    this.endPause(end);
    // An answer that came before the whole request body (a 413, a 401): the rest of the body is
    // read and dropped, as Node does for unread bodies, so the connection can serve the next
    // request; it may have been paused by backpressure from an upstream socket now gone.
    if (!this.req.readableEnded) this.req.resume();
    clearTimeout(this.timer);
    this.fwd.inFlight.delete(this);
    // The recording and the log line wait until this loop iteration's reads are forwarded.
    afterIo(() => this.record(end, errorType));
  }

  private record(end: number, errorType: string | undefined): void {
    this.setUpMeter();
    this.fixModelLabel(undefined);
    let summary: MeterSummary | undefined;
    try {
      summary = this.meter?.finish(end, errorType);
    } catch (e) {
      this.deps.log.error({ err: (e as Error).message }, 'measurement failed');
    }
    const log = this.deps.log;
    // Unmeasured (an API the proxy does not know, or metrics off): the upstream's error status is
    // the error, as the meter has it for a measured request, also when the client then left.
    const status = this.upstreamStatus;
    const err = summary ? summary.errorType : endError(errorType, status !== undefined && status >= 400 ? String(status) : undefined, false);
    // A stream cut at the shutdown deadline is lost output: at warn, so a production log level
    // (warn, deploy/kubernetes) still records it.
    const level = (summary?.errorType ?? errorType) === ERROR_TYPE.shutdownDeadline ? 'warn' : 'info';
    if (log.isLevelEnabled(level)) {
      log[level](
        {
          reqId: this.requestId,
          route: this.match.resolved.route.prefix,
          method: this.req.method,
          path: safePath(this.match.upstreamPath),
          // Only for requests that were measured as an LLM API call.
          provider: summary ? this.labels?.provider : undefined,
          // As the client named it: the label may be `_OTHER`, or none for a name not admitted.
          model: summary ? this.model || undefined : undefined,
          // The meter says 0 when no response head came: then the proxy's own answer, or none at all
          // (a cancel or a shutdown cut before the upstream answered; not Node's default 200).
          status: this.refusal?.status || summary?.status || this.upstreamStatus || (this.res.headersSent ? this.res.statusCode : undefined),
          // A request never sent upstream (queued behind another answer) was cancelled, whatever ended it.
          outcome: summary?.outcome ?? (err === undefined ? 'ok' : err === ERROR_TYPE.clientCancelled || this.queued ? 'cancelled' : 'error'),
          // The meter's verdict when it measured: a hang-up after the API's last event is no error.
          errorType: err,
          // Node's parser refused the request's body (malformed): its error type, why, and whether
          // the answer it cut had begun.
          refusal: this.refusal?.type,
          err: this.refusal?.reason,
          answerCut: this.refusal?.cut || undefined,
          finishReasons: summary?.finishReasons,
          ttftMs: round(summary?.ttftMs),
          tpotMs: round(summary?.tpotMs),
          maxGapMs: round(summary?.maxGapMs),
          // A request queued behind another answer starts its clock when sent: its body may be in already.
          uploadMs: this.uploadEnd === undefined ? undefined : round(Math.max(0, this.uploadEnd - this.start)),
          outputTokens: summary?.outputTokens,
          tokenSource: summary?.tokenCountSource,
          durationMs: round(end - this.start),
          // How long the client's backpressure held the upstream read: absent when it never did.
          clientPausedMs: round(this.pausedMs),
          // A new upstream connection's set-up (inside TTFT), absent when a pooled one was reused.
          upstreamConnectMs: round(this.exchange?.connectMs),
          upstreamAddr: this.exchange?.remote,
        },
        'request',
      );
    }
  }
}

function ignore(): void {}

/**
 * Answers that give a new model name no place under the cap: an unknown model (OpenAI, Anthropic,
 * Gemini, Ollama, vLLM: 404; LiteLLM, Bedrock: 400; a retired one: 410), a request a validation
 * refused (400, 422), no valid key (401, 403: nothing said of the name). A real model's first
 * request refused so (a prompt over its context) waits for an answer of another kind; a 429 or a
 * 5xx is about a served name (or one the server did not check).
 */
const NOT_ADMITTED = new Set([400, 401, 403, 404, 410, 422]);

/** The forwarded (or queued) request of each request head, for a refusal of its body. */
const IN_FLIGHT = new WeakMap<IncomingMessage, InFlight>();

/** Requests queued behind an answer on a connection, per client socket. */
const QUEUED = new WeakMap<Socket, Set<InFlight>>();

/** The client's `X-Request-Id` when it is usable (one field, 1-200 characters), else a new one. */
function requestIdOf(req: IncomingMessage): string {
  const id = req.headers['x-request-id'];
  return typeof id === 'string' && id !== '' && id.length <= 200 && !id.includes(',') ? id : randomUUID();
}

/**
 * `X-Forwarded-For/-Proto/-Host` unless the route turns them off, and `X-Request-Id`: the upstream
 * gets the id the proxy logs, the client's when usable, else the proxy's in its place (`Host`
 * leads the head, set by the caller). `-Host` is the absolute-form target's authority where the
 * request has one, as RFC 9112 §3.2.2 has a server take it over `Host`.
 */
function addProxyHeaders(headers: string[], req: IncomingMessage, requestId: string, forwarded: boolean): void {
  if (req.headers['x-request-id'] !== requestId || countRaw(headers, 'x-request-id') !== 1) replaceRaw(headers, 'x-request-id', requestId);
  if (!forwarded) return;
  const xff = req.headers['x-forwarded-for'];
  // An IPv4 client of a dual-stack (`::`) listener as IPv4 (`::ffff:10.0.0.1` is 10.0.0.1), as
  // nginx and Envoy write it: upstream allow-lists and rate limits key on that form.
  let peer = req.socket.remoteAddress ?? '';
  if (peer.startsWith('::ffff:') && peer.includes('.')) peer = peer.slice(7);
  if (xff === undefined) headers.push('x-forwarded-for', peer);
  else replaceRaw(headers, 'x-forwarded-for', `${Array.isArray(xff) ? xff.join(', ') : xff}, ${peer}`);
  headers.push('x-forwarded-proto', 'http');
  const host = targetAuthority(req.url ?? '') ?? req.headers.host;
  if (host) headers.push('x-forwarded-host', host);
}

/** The proxy's own refusals that a request and an upgrade share: status, error type, message. */
const REFUSAL = {
  draining: [503, 'draining', 'the proxy is shutting down; retry the request'],
  dotSegment: [400, 'invalid_path', 'a path with a "." or ".." segment is not forwarded'],
  twoHosts: [400, 'invalid_host', 'more than one Host field'],
  noHost: [400, 'invalid_host', 'an HTTP/1.1 request without a Host field'],
  version: [505, 'http_version_not_supported', 'only HTTP/1.0 and HTTP/1.1 are served'],
  trace: [405, 'method_not_allowed', 'TRACE is not forwarded'],
} as const;

const TRACE_ALLOW = 'GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS';

/** A method for a message: Node's parser admits only its known methods, but no reliance on that. */
function safeToken(method: string | undefined): string {
  return /^[A-Z-]{1,20}$/.test(method ?? '') ? method! : 'this method';
}

function round(v: number | undefined): number | undefined {
  return v === undefined ? undefined : Math.round(v * 1000) / 1000;
}

/**
 * Distinct in-band error types (an upstream's own `error.type` strings) before the rest are
 * recorded as `_OTHER`: an upstream can send any string, and each one multiplies the duration
 * histogram's series by every model and route label set. HTTP statuses are bounded and are what
 * alerts match (`429`, `503`), so they never share this budget.
 */
const MAX_ERROR_TYPES = 50;
const OWN_ERROR_TYPES: ReadonlySet<string> = new Set(Object.values(ERROR_TYPE));
/** Three digits, as forwarded: 600-999 are invalid (RFC 9110 §15) but a bounded set, and not the in-band budget's. */
const HTTP_STATUS = /^[1-9]\d\d$/;

/** A `.` or `..` path segment, also percent-encoded (`%2e`), or with a `;` parameter (`..;x`). */
const DOT_SEGMENT = /(?:^|\/)(?:\.|%2e){1,2}(?:;[^/]*)?(?:\/|$)/i;
/** What some upstreams take for a slash before they route: `%2F` (nginx decodes it), `%5C`. */
const SLASH_LIKE = /%2f|%5c/i;
const SLASHES_LIKE = new RegExp(SLASH_LIKE.source, 'gi');

/** An error's words for the log: every address of a name refused is an AggregateError, whose own message is empty. */
function errorWords(e: Error): string {
  return e.message || ((e as Partial<AggregateError>).errors ?? []).map((x: Error) => x.message).join('; ');
}

function hasDotSegment(target: string): boolean {
  const end = target.search(/[?#]/);
  const path = end === -1 ? target : target.slice(0, end);
  // An encoded slash is kept as sent (Bedrock's inference-profile ARNs hold one); only a dot
  // segment it would make is refused.
  return DOT_SEGMENT.test(path) || (SLASH_LIKE.test(path) && DOT_SEGMENT.test(path.replace(SLASHES_LIKE, '/')));
}

/** AWS SigV4 (header or presigned query) lists `accept-encoding` among the signed headers. */
function signsAcceptEncoding(req: IncomingMessage): boolean {
  const auth = req.headers.authorization;
  const signed = /\bSignedHeaders=([^,\s]*)/i.exec(typeof auth === 'string' && /^AWS4-/i.test(auth) ? auth : '')?.[1] ?? /[?&]X-Amz-SignedHeaders=([^&]*)/i.exec(req.url ?? '')?.[1];
  return signed !== undefined && signed.replace(/%3B/gi, ';').toLowerCase().split(';').includes('accept-encoding');
}

/** More than one Content-Length field, or a list in one. */
function repeatedLength(raw: readonly string[]): boolean {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) if (isName(raw[i]!, 'content-length') && (++n > 1 || raw[i + 1]!.includes(','))) return true;
  return false;
}

/** The one value of repeated Content-Length fields that all say the same, else undefined. */
function singleLength(raw: readonly string[]): string | undefined {
  const all = new Set<string>();
  for (let i = 0; i < raw.length; i += 2) if (isName(raw[i]!, 'content-length')) for (const v of raw[i + 1]!.split(',')) all.add(v.trim());
  const [v] = all;
  return all.size === 1 && /^[0-9]{1,15}$/.test(v!) ? v : undefined;
}

function removeRaw(raw: string[], lowerName: string): void {
  for (let i = raw.length - 2; i >= 0; i -= 2) if (isName(raw[i]!, lowerName)) raw.splice(i, 2);
}

/** The field's value in place (its name as the client wrote it, its position kept); repeats removed; appended when absent. */
function replaceRaw(raw: string[], lowerName: string, value: string): void {
  let first = -1;
  for (let i = 0; i < raw.length; i += 2) {
    if (!isName(raw[i]!, lowerName)) continue;
    if (first < 0) first = i;
    else {
      raw.splice(i, 2);
      i -= 2;
    }
  }
  if (first < 0) raw.push(lowerName, value);
  else raw[first + 1] = value;
}

export function sendError(res: ServerResponse, status: number, type: string, message: string): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = errorBody(type, message);
  try {
    // The standard reason phrase: one left by a failed writeHead (onHead) would fail again.
    res.writeHead(status, STATUS_CODES[status] ?? 'Error', { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  } catch {
    res.destroy(); // no answer Node can write: a close, and the caller still completes the request
  }
}
