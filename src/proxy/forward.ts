import { randomUUID } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import { performance } from 'node:perf_hooks';
import type { Config } from '../config.js';
import type { Logger } from '../log.js';
import { RequestMeter, type MeterSummary, type RequestLabels } from '../measure/request-meter.js';
import type { Instruments } from '../metrics/instruments.js';
import { CardinalityLimiter } from '../metrics/labels.js';
import { ERROR_TYPE } from '../metrics/semconv.js';
import { detectApi } from '../providers/detect.js';
import { endToEndHeaders, rawHeader, REQUEST_DROP } from './headers.js';
import { RequestBodyTap } from './request-info.js';
import { Router, type RouteMatch } from './routes.js';

export interface ForwarderDeps {
  config: Config;
  log: Logger;
  /** Undefined when metrics are disabled: bytes are forwarded and nothing is parsed. */
  instruments: Instruments | undefined;
}

class UpstreamTimeout extends Error {
  constructor(readonly phase: 'connect' | 'response' | 'idle') {
    super(`upstream ${phase} timeout`);
  }
}

/**
 * The data path: one upstream request per client request, raw bytes both ways
 * (node:http never decompresses), backpressure from the client to the upstream
 * read, and a meter that sees each chunk only after it was written.
 */
export class Forwarder {
  private readonly router: Router;
  private readonly agents = {
    http: new http.Agent({ keepAlive: true, scheduling: 'lifo' }),
    https: new https.Agent({ keepAlive: true, scheduling: 'lifo' }),
  };
  private readonly models: CardinalityLimiter;
  /** Streams in flight, for graceful shutdown. */
  readonly inFlight = new Set<InFlight>();

  constructor(private readonly deps: ForwarderDeps) {
    this.router = new Router(deps.config.routes);
    this.models = new CardinalityLimiter(deps.config.metrics.maxModelValues);
  }

  handle(req: IncomingMessage, res: ServerResponse): void {
    const start = performance.now();
    const match = this.router.match(req.url ?? '');
    if (!match) {
      sendError(res, 404, 'no_route', `no route for ${safePath(req.url)}`);
      req.resume();
      return;
    }
    new InFlight(this, this.deps, match, req, res, start).run();
  }

  limitModel(model: string | undefined): string | undefined {
    return model === undefined ? undefined : this.models.limit(model);
  }

  agentFor(url: URL): http.Agent {
    return url.protocol === 'https:' ? this.agents.https : this.agents.http;
  }

  close(): void {
    this.agents.http.destroy();
    this.agents.https.destroy();
  }
}

/** One proxied request, from arrival to the last byte. */
class InFlight {
  private upstreamReq: http.ClientRequest | undefined;
  private upstreamRes: IncomingMessage | undefined;
  private meter: RequestMeter | undefined;
  private labels: RequestLabels | undefined;
  private done = false;
  private readonly requestId: string;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly fwd: Forwarder,
    private readonly deps: ForwarderDeps,
    private readonly match: RouteMatch,
    private readonly req: IncomingMessage,
    private readonly res: ServerResponse,
    private readonly start: number,
  ) {
    const incomingId = req.headers['x-request-id'];
    this.requestId = typeof incomingId === 'string' && incomingId !== '' && incomingId.length <= 200 ? incomingId : randomUUID();
  }

  run(): void {
    const { req, res, match, deps } = this;
    const { upstream } = match.resolved;
    const route = match.resolved.route;
    this.fwd.inFlight.add(this);

    const api = deps.instruments ? detectApi(match.upstreamPath, route.provider) : undefined;
    let tap: RequestBodyTap | undefined;
    if (api) {
      const pathModel = api.modelFromPath?.(match.upstreamPath);
      this.labels = {
        provider: match.resolved.providerName ?? api.defaultProviderName,
        operation: api.operation,
        requestModel: this.fwd.limitModel(pathModel),
        serverAddress: upstream.hostname,
      };
      this.meter = new RequestMeter(deps.instruments!, api.newAdapter(), this.labels, this.start, deps.config.limits);
      if (pathModel === undefined) tap = new RequestBodyTap(deps.config.limits.maxBodyBytes);
    }

    const headers = endToEndHeaders(req.rawHeaders, REQUEST_DROP);
    headers.push('host', upstream.host);
    const xff = req.headers['x-forwarded-for'];
    const peer = req.socket.remoteAddress ?? '';
    if (xff === undefined) headers.push('x-forwarded-for', peer);
    else replaceRaw(headers, 'x-forwarded-for', `${Array.isArray(xff) ? xff.join(', ') : xff}, ${peer}`);
    headers.push('x-forwarded-proto', 'http');
    if (req.headers.host) headers.push('x-forwarded-host', req.headers.host);
    if (req.headers['x-request-id'] === undefined) headers.push('x-request-id', this.requestId);

    const t = deps.config.timeouts;
    const upstreamReq = (upstream.protocol === 'https:' ? https : http).request({
      protocol: upstream.protocol,
      hostname: match.resolved.connectHost,
      port: upstream.port || undefined,
      method: req.method,
      path: match.upstreamPath,
      headers: headers as unknown as http.OutgoingHttpHeaders,
      agent: this.fwd.agentFor(upstream),
      setHost: false,
    });
    this.upstreamReq = upstreamReq;

    upstreamReq.on('socket', (socket) => {
      if ((socket as { connecting?: boolean }).connecting) {
        const ct = setTimeout(() => upstreamReq.destroy(new UpstreamTimeout('connect')), t.connect * 1000);
        socket.once('connect', () => clearTimeout(ct));
        upstreamReq.once('close', () => clearTimeout(ct));
      }
    });
    this.timer = setTimeout(() => upstreamReq.destroy(new UpstreamTimeout('response')), t.response * 1000);
    upstreamReq.on('response', (upRes) => this.onResponse(upRes));
    upstreamReq.on('error', (err) => this.onUpstreamError(err));

    // Client body -> upstream, with backpressure; a bounded copy for the model name.
    if (tap) {
      req.on('data', (c: Buffer) => tap.push(c));
      req.once('end', () => {
        if (this.labels) this.labels.requestModel = this.fwd.limitModel(tap.model());
      });
    }
    req.pipe(upstreamReq);
    req.on('error', () => this.cancel());

    // The client went away before we finished: cancel the upstream at once.
    res.once('close', () => {
      if (!res.writableFinished) this.cancel();
    });
  }

  private onResponse(upRes: IncomingMessage): void {
    clearTimeout(this.timer);
    this.upstreamRes = upRes;
    const { res, meter } = this;
    if (this.done) {
      upRes.destroy();
      return;
    }
    const headers = endToEndHeaders(upRes.rawHeaders);
    res.writeHead(upRes.statusCode ?? 502, upRes.statusMessage, headers as unknown as http.OutgoingHttpHeaders);
    // Headers go out now, not with the first body chunk: the client's clock starts here too.
    res.flushHeaders();
    meter?.responseStart(
      upRes.statusCode ?? 502,
      rawHeader(upRes.rawHeaders, 'content-type'),
      rawHeader(upRes.rawHeaders, 'content-encoding'),
    );

    const idleMs = this.deps.config.timeouts.idle * 1000;
    upRes.setTimeout(idleMs, () => upRes.destroy(new UpstreamTimeout('idle')));
    const resume = () => upRes.resume();
    upRes.on('data', (chunk: Buffer) => {
      const arrival = performance.now();
      if (!res.write(chunk)) {
        upRes.pause();
        res.once('drain', resume);
      }
      meter?.chunk(chunk, arrival);
    });
    upRes.once('end', () => {
      if (this.done) return;
      res.end();
      this.complete(undefined);
    });
    upRes.once('error', (err) => this.onUpstreamError(err));
    upRes.once('aborted', () => this.onUpstreamError(new Error('upstream connection reset')));
  }

  private onUpstreamError(err: Error): void {
    if (this.done) return;
    clearTimeout(this.timer);
    const timeout = err instanceof UpstreamTimeout;
    if (!this.res.headersSent) {
      // Nothing reached the client yet: answer for the upstream.
      const status = timeout ? 504 : 502;
      const type = timeout ? ERROR_TYPE.timeout : ERROR_TYPE.unreachable;
      this.deps.log.warn(
        { reqId: this.requestId, upstream: this.match.resolved.upstream.origin, err: err.message, code: (err as NodeJS.ErrnoException).code },
        'upstream request failed',
      );
      sendError(this.res, status, type, timeout ? err.message : `upstream unreachable: ${(err as NodeJS.ErrnoException).code ?? err.message}`);
      this.complete(type);
      this.req.resume();
      return;
    }
    // Mid-body: the client must see a truncated response, not a clean end.
    this.deps.log.warn({ reqId: this.requestId, err: err.message }, 'upstream stream failed mid-body');
    this.complete(timeout ? ERROR_TYPE.timeout : ERROR_TYPE.upstreamReset);
    this.res.destroy();
    this.upstreamReq?.destroy();
  }

  cancel(errorType: string = ERROR_TYPE.clientCancelled): void {
    if (this.done) return;
    this.complete(errorType);
    this.upstreamReq?.destroy();
    this.upstreamRes?.destroy();
  }

  /** Cut at a shutdown deadline: record it, then close both sides. */
  abort(errorType: string): void {
    this.cancel(errorType);
    this.res.destroy();
  }

  private complete(errorType: string | undefined): void {
    if (this.done) return;
    this.done = true;
    clearTimeout(this.timer);
    this.fwd.inFlight.delete(this);
    const end = performance.now();
    let summary: MeterSummary | undefined;
    try {
      summary = this.meter?.finish(end, errorType);
    } catch (e) {
      this.deps.log.error({ err: (e as Error).message }, 'measurement failed');
    }
    const log = this.deps.log;
    if (log.isLevelEnabled('info')) {
      log.info(
        {
          reqId: this.requestId,
          route: this.match.resolved.route.prefix,
          method: this.req.method,
          path: safePath(this.match.upstreamPath),
          // Only for requests that were measured as an LLM API call.
          provider: summary ? this.labels?.provider : undefined,
          model: summary ? this.labels?.requestModel : undefined,
          status: summary?.status ?? this.upstreamRes?.statusCode ?? this.res.statusCode,
          outcome: summary?.outcome ?? (errorType === undefined ? 'ok' : errorType === ERROR_TYPE.clientCancelled ? 'cancelled' : 'error'),
          errorType: summary?.errorType ?? errorType,
          ttftMs: round(summary?.ttftMs),
          tpotMs: round(summary?.tpotMs),
          outputTokens: summary?.outputTokens,
          tokenSource: summary?.tokenCountSource,
          durationMs: round(end - this.start),
        },
        'request',
      );
    }
  }
}

function round(v: number | undefined): number | undefined {
  return v === undefined ? undefined : Math.round(v * 1000) / 1000;
}

/** The path without its query string: queries can carry keys (`?key=` for Gemini). */
function safePath(target: string | undefined): string {
  const t = target ?? '';
  const q = t.indexOf('?');
  return (q === -1 ? t : t.slice(0, q)).slice(0, 512);
}

function replaceRaw(raw: string[], lowerName: string, value: string): void {
  for (let i = raw.length - 2; i >= 0; i -= 2) if (raw[i]!.toLowerCase() === lowerName) raw.splice(i, 2);
  raw.push(lowerName, value);
}

export function sendError(res: ServerResponse, status: number, type: string, message: string): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = JSON.stringify({ error: { type, message, source: 'llm-latency-proxy' } });
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}
