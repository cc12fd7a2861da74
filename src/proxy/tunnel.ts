import type { IncomingMessage } from 'node:http';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import type { Logger } from '../log.js';
import { ERROR_TYPE } from '../metrics/semconv.js';
import { ChunkedDecoder } from './chunked.js';
import { headEnd, HttpParseError, MAX_HEAD_BYTES, parseResponseHead, requestHead, responseFraming, type BodyFraming } from './http1.js';
import type { Origin } from './upstream.js';

/**
 * A WebSocket upgrade (OpenAI's Realtime API, Gemini's Live API), passed through as bytes: the
 * request head goes to the route's upstream on a connection of its own, and once the upstream
 * answers 101 both directions are piped unchanged until either side closes. Nothing in the
 * tunnel is measured. An upstream that declines (any other final status) has its answer
 * forwarded as it came, and then the connection closes: after a declined upgrade the client's
 * bytes are not forwarded, so a connection cannot carry requests past the router.
 */
export interface TunnelOptions {
  readonly log: Logger;
  readonly requestId: string;
  readonly origin: Origin;
  readonly path: string;
  readonly connectTimeoutMs: number;
  readonly responseTimeoutMs: number;
  /** Neither side sent a byte for this long: both are closed. */
  readonly idleTimeoutMs: number;
  readonly onDone: (t: Tunnel) => void;
}

export class Tunnel {
  private upstream: net.Socket | undefined;
  private connected = false;
  private timer: NodeJS.Timeout | undefined;
  /** Upstream bytes until the end of a final response head. */
  private head: Buffer[] = [];
  private status: number | undefined;
  /** Set once a declined upgrade's answer is being forwarded: where it ends. */
  private declined: { framing: BodyFraming; left: number; chunked: ChunkedDecoder | undefined } | undefined;
  private done = false;
  private readonly start = performance.now();
  private bytesUp = 0;
  private bytesDown = 0;
  /** Waiting for the other side's 'drain' (backpressure), per direction. */
  private upPaused = false;
  private downPaused = false;

  constructor(
    private readonly opts: TunnelOptions,
    private readonly req: IncomingMessage,
    private readonly client: Duplex,
    private readonly early: Buffer,
    private readonly headers: string[],
  ) {}

  run(): void {
    const { origin } = this.opts;
    const up =
      origin.protocol === 'https:'
        ? tls.connect({ host: origin.host, port: origin.port, servername: net.isIP(origin.host) ? undefined : origin.host, ALPNProtocols: ['http/1.1'] })
        : net.connect({ host: origin.host, port: origin.port });
    this.upstream = up;
    up.setNoDelay(true);
    // Written at once (the socket holds it until connected), so it leaves ahead of any client bytes.
    up.write(requestHead(this.req.method ?? 'GET', this.opts.path, this.headers));
    if (this.early.length > 0) this.forwardUp(this.early);
    this.timer = setTimeout(() => this.fail(504, ERROR_TYPE.timeout, 'upstream connect timeout'), this.opts.connectTimeoutMs);
    up.once(origin.protocol === 'https:' ? 'secureConnect' : 'connect', () => {
      this.connected = true;
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.fail(504, ERROR_TYPE.timeout, 'upstream response timeout'), this.opts.responseTimeoutMs);
    });
    up.on('data', (b: Buffer) => this.fromUpstream(b));
    up.on('error', (err: NodeJS.ErrnoException) => this.upstreamFailed(err));
    up.on('close', () => this.upstreamFailed(undefined));
    // Until the upgrade is answered the client has nothing to say (RFC 6455 §4.1); bytes it
    // sends anyway follow the request head.
    this.client.on('data', (b: Buffer) => this.forwardUp(b));
    this.client.on('error', () => this.close(ERROR_TYPE.clientCancelled));
    this.client.on('close', () => this.close(this.status === 101 ? undefined : ERROR_TYPE.clientCancelled));
    this.client.resume();
  }

  private forwardUp(b: Buffer): void {
    // After a declined upgrade the client's bytes are dropped: they would be requests the router never saw.
    if (this.done || this.declined !== undefined) return;
    this.bytesUp += b.length;
    if (!this.upstream!.write(b) && !this.upPaused) {
      this.upPaused = true;
      this.client.pause();
      this.upstream!.once('drain', () => {
        this.upPaused = false;
        this.client.resume();
      });
    }
  }

  private fromUpstream(b: Buffer): void {
    if (this.done) return;
    if (this.status === 101) return this.writeDown(b);
    if (this.declined !== undefined) return this.declinedBody(b);
    this.head.push(b);
    let buf = this.head.length === 1 ? b : Buffer.concat(this.head);
    // Interim answers (a 103) go on to the client; the final one decides.
    for (;;) {
      const end = headEnd(buf);
      if (end === -1) {
        if (buf.length > MAX_HEAD_BYTES) this.fail(502, ERROR_TYPE.protocol, 'invalid upstream response: head too large');
        else this.head = [buf];
        return;
      }
      let framing: BodyFraming;
      let status: number;
      try {
        const head = parseResponseHead(buf.subarray(0, end));
        status = head.status;
        framing = responseFraming(head, this.req.method ?? 'GET');
      } catch (e) {
        this.fail(502, ERROR_TYPE.protocol, `invalid upstream response: ${(e as HttpParseError).message}`);
        return;
      }
      if (status < 200 && status !== 101) {
        this.writeDown(buf.subarray(0, end));
        buf = buf.subarray(end);
        this.head = buf.length === 0 ? [] : [buf];
        if (buf.length === 0) return;
        continue;
      }
      clearTimeout(this.timer);
      this.status = status;
      this.head = [];
      if (status === 101) {
        this.writeDown(buf);
        this.open();
        return;
      }
      this.declined = { framing, left: framing.kind === 'length' ? framing.length : 0, chunked: framing.kind === 'chunked' ? new ChunkedDecoder() : undefined };
      this.writeDown(buf.subarray(0, end));
      if (framing.kind === 'none' || (framing.kind === 'length' && framing.length === 0)) this.finishDeclined();
      else if (buf.length > end) this.declinedBody(buf.subarray(end));
      return;
    }
  }

  /** A declined upgrade's answer body: forwarded up to its end, then the connection closes. */
  private declinedBody(b: Buffer): void {
    const d = this.declined!;
    let end = b.length;
    let complete = false;
    if (d.framing.kind === 'length') {
      end = Math.min(b.length, d.left);
      d.left -= end;
      complete = d.left === 0;
    } else if (d.chunked !== undefined) {
      d.chunked.push(b);
      if (d.chunked.done) {
        if (d.chunked.messageEnd !== -1) end = d.chunked.messageEnd;
        complete = true;
      }
      // Broken framing: forwarded as it came, and the close ends it.
      complete ||= d.chunked.error !== undefined;
    }
    if (end > 0) this.writeDown(b.subarray(0, end));
    if (complete) this.finishDeclined();
  }

  private writeDown(b: Buffer): void {
    this.bytesDown += b.length;
    if (!this.client.write(b) && !this.downPaused) {
      this.downPaused = true;
      this.upstream!.pause();
      this.client.once('drain', () => {
        this.downPaused = false;
        this.upstream!.resume();
      });
    }
  }

  /** Switched: both directions are piped until either side closes, or both are quiet too long. */
  private open(): void {
    const up = this.upstream!;
    // Any byte either way passes through the upstream socket, so its idle timer covers both.
    up.setTimeout(this.opts.idleTimeoutMs, () => this.close(ERROR_TYPE.timeout));
    // A side that ends its half ends the other's (a WebSocket closes with a close frame, then FIN).
    up.once('end', () => endSocket(this.client));
    this.client.once('end', () => up.end());
  }

  private finishDeclined(): void {
    if (this.done) return;
    // The client has the whole answer: closing tells it the connection is not reused.
    this.close(undefined);
  }

  private upstreamFailed(err: NodeJS.ErrnoException | undefined): void {
    if (this.done) return;
    if (this.status === undefined) {
      const code = err?.code;
      if (this.connected) this.fail(502, ERROR_TYPE.upstreamReset, `upstream closed the connection before responding (${code ?? err?.message ?? 'closed'})`);
      else this.fail(502, ERROR_TYPE.unreachable, `upstream unreachable: ${code ?? err?.message ?? 'closed'}`);
      return;
    }
    if (this.declined?.framing.kind === 'close' && err === undefined) {
      this.finishDeclined();
      return;
    }
    if (err === undefined && this.status === 101) {
      // A clean close after a clean end: the client's half was ended on 'end'.
      this.close(undefined);
      return;
    }
    this.close(ERROR_TYPE.upstreamReset);
  }

  /** Before any upstream answer reached the client: answer for the upstream, then close. */
  private fail(status: number, errorType: string, message: string): void {
    if (this.done) return;
    if (this.status !== undefined || this.bytesDown > 0) {
      this.close(errorType);
      return;
    }
    this.opts.log.warn({ reqId: this.opts.requestId, err: message }, 'upstream upgrade failed');
    writeRawError(this.client, status, errorType, message);
    this.close(errorType, true);
  }

  /** Cut at a shutdown deadline. */
  abort(errorType: string): void {
    this.close(errorType);
  }

  private close(errorType: string | undefined, clientEnding = false): void {
    if (this.done) return;
    this.done = true;
    clearTimeout(this.timer);
    this.upstream?.destroy();
    if (!clientEnding) {
      // Flush what was written (a clean end), or cut (an error).
      if (errorType === undefined) endSocket(this.client);
      else this.client.destroy();
    }
    this.opts.onDone(this);
    this.opts.log.info(
      {
        reqId: this.opts.requestId,
        method: this.req.method,
        path: safeTarget(this.opts.path),
        upgrade: this.req.headers.upgrade,
        status: this.status,
        outcome: errorType === undefined ? 'ok' : errorType === ERROR_TYPE.clientCancelled ? 'cancelled' : 'error',
        errorType,
        bytesUp: this.bytesUp,
        bytesDown: this.bytesDown,
        durationMs: Math.round((performance.now() - this.start) * 1000) / 1000,
      },
      'tunnel',
    );
  }
}

function safeTarget(target: string): string {
  const q = target.indexOf('?');
  return (q === -1 ? target : target.slice(0, q)).slice(0, 512);
}

const REASONS: Record<number, string> = { 400: 'Bad Request', 404: 'Not Found', 405: 'Method Not Allowed', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout' };

/**
 * Ends our half of a socket Node's HTTP server handed over. Its sockets allow half-open
 * connections, so one whose peer never closes its half would stay open (and hold up the
 * server's close): it is destroyed a moment later.
 */
export function endSocket(socket: Duplex, data?: string): void {
  if (socket.destroyed) return;
  if (!socket.writableEnded) socket.end(data);
  const t = setTimeout(() => socket.destroy(), 2000);
  socket.once('close', () => clearTimeout(t));
}

/** A JSON error answer on a socket that Node's HTTP server handed over (upgrade, CONNECT). */
export function writeRawError(socket: Duplex, status: number, type: string, message: string, extra = ''): void {
  if (socket.destroyed || socket.writableEnded) return;
  const body = JSON.stringify({ error: { type, message, source: 'llm-latency-proxy' } });
  endSocket(
    socket,
    `HTTP/1.1 ${status} ${REASONS[status] ?? 'Error'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${extra}connection: close\r\n\r\n${body}`,
  );
}
