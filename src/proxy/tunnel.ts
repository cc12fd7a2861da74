import { STATUS_CODES, type IncomingMessage } from 'node:http';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import type { Logger } from '../log.js';
import { ERROR_TYPE } from '../metrics/semconv.js';
import { ChunkedDecoder } from './chunked.js';
import { endToEndHeaders, rawHeader } from './headers.js';
import { headEnd, HttpParseError, MAX_HEAD_BYTES, parseResponseHead, requestHead, responseFraming, type BodyFraming, type ResponseHead } from './http1.js';
import { ConnectStage } from './connect-stage.js';
import { lackMessage, lackOf } from './out-of-resources.js';
import { upstreamTlsContext } from './tls-context.js';
import { authority, openTunnel } from './egress.js';
import { safePath } from './routes.js';
import { serverName, upstreamLookup } from './lookup.js';
import { peerAddress, sharedRead, UpstreamTimeout, writeQueueSize, type Origin } from './upstream.js';
import { CLOSE_GOING_AWAY, closeFrame, FrameBounds } from '../ws/frame-bounds.js';
import type { WsSession } from '../ws/session.js';

/**
 * A WebSocket upgrade (OpenAI's Realtime API, Gemini's Live API), passed through as bytes: the
 * request head goes to the route's upstream on a connection of its own, and once the upstream
 * answers 101 both directions are piped unchanged until both have ended (half-closes passed
 * on) or either side fails. When the API is one ws/session.ts reads (OpenAI Realtime, Gemini
 * Live), its messages are measured from the bytes after they were forwarded. The client's bytes are held
 * until the 101: before it they could be requests of the client's own, which would reach the
 * upstream past the router if the upstream declined. A declined upgrade's answer (any other
 * final status) is forwarded with `Connection: close`, to the end of its framing, and the
 * connection closes.
 */
export interface TunnelOptions {
  readonly log: Logger;
  readonly requestId: string;
  readonly origin: Origin;
  readonly path: string;
  readonly connectTimeoutMs: number;
  readonly responseTimeoutMs: number;
  /**
   * Nothing came from the upstream (and, once open, went to it) for this long: each side is sent
   * a Close 1001 "idle timeout", after a frame in flight (FRAME_FINISH_MS at most).
   */
  readonly idleTimeoutMs: number;
  readonly onDone: (t: Tunnel) => void;
  /** Its line is written (after onDone, later when a side was let finish its frame). */
  readonly onLogged?: (t: Tunnel) => void;
  /** Called on the 101 with its `Sec-WebSocket-Extensions`: the measurement of the messages, if any. */
  readonly measure?: (extensions: string | undefined) => WsSession | undefined;
  /**
   * The upgrade did not open: the upstream declined it (its status), or the proxy answered for
   * an upstream it could not reach or read (a 5xx, with the error type). Since `start`.
   */
  readonly failed?: (status: number, errorType: string | undefined, start: number) => void;
  /** The upstream connection is up, `ms` after it was begun (the connect-duration metric). */
  readonly onConnected?: (origin: Origin, ms: number) => void;
}

/** Client bytes held before the 101 (a client should send none: RFC 6455 §4.1). */
const MAX_HELD_BYTES = 64 * 1024;

/**
 * How long a direction that is mid-frame at the shutdown deadline or the idle timeout gets to
 * finish that frame before its Close goes in; then it is cut. A frame in flight (a Realtime audio
 * delta of tens of KiB) ends within milliseconds unless its sender or its reader has stalled.
 */
export const FRAME_FINISH_MS = 1000;

type Direction = 'down' | 'up';

export class Tunnel {
  private upstream: net.Socket | undefined;
  private connected = false;
  private timer: NodeJS.Timeout | undefined;
  /** Upstream bytes until the end of a final response head. */
  private head: Buffer[] = [];
  private status: number | undefined;
  /** The proxy's own answer, when it answered for the upstream (fail). */
  private ownStatus: number | undefined;
  /** Client bytes that came before the 101. */
  private held: Buffer[] = [];
  /** Arrival of each held buffer. */
  private heldAt: number[] = [];
  private heldBytes = 0;
  private session: WsSession | undefined;
  /** Set once a declined upgrade's answer is being forwarded: where it ends. */
  private declined: { framing: BodyFraming; left: number; chunked: ChunkedDecoder | undefined } | undefined;
  private clientEnded = false;
  private upstreamEnded = false;
  /** The upstream ended its half before the client did. */
  private upstreamFirst = false;
  /** The upgrade's failure was recorded (see `failed`). */
  private recorded = false;
  private done = false;
  private readonly start = performance.now();
  private bytesUp = 0;
  private bytesDown = 0;
  /** Waiting for the other side's 'drain' (backpressure), per direction. */
  private upPaused = false;
  private downPaused = false;
  private connectStart = 0;
  /** The upstream connection's set-up and address, for the log. */
  private connectMs: number | undefined;
  private upstreamAddr: string | undefined;
  /** Reads from and writes to the upstream socket, and its resumes: what puts its idle timeout back. */
  private upstreamMoves = 0;
  /** Frame boundaries of what went to the client and to the upstream since the 101 (a shutdown's Close frames). */
  private readonly downFrames = new FrameBounds(false);
  private readonly upFrames = new FrameBounds(true);
  /** Which sides were sent a Close 1001 at the shutdown deadline or the idle timeout (for the log). */
  private goingAway: string[] | undefined;
  /** The Close 1001's reason: the shutdown's, or the idle timeout's. */
  private goAwayReason = '';
  /**
   * At the shutdown deadline or the idle timeout, the directions whose frame under way is let
   * finish before their Close.
   */
  private finishDown = false;
  private finishUp = false;
  private finishTimer: NodeJS.Timeout | undefined;
  /** What the tunnel closed with, for its log line, written once no frame is being let finish. */
  private closedWith: string | undefined;
  /**
   * Sides sent their Close whose end waits for the frame they owe the other side: a peer may
   * take our end (EOF) as the whole connection's and stop sending the rest of that frame.
   */
  private endClientLater = false;
  private endUpstreamLater = false;

  constructor(
    private readonly opts: TunnelOptions,
    private readonly req: IncomingMessage,
    private readonly client: Duplex,
    private readonly early: Buffer,
    private readonly headers: string[],
  ) {}

  run(): void {
    if (this.early.length > 0) this.hold(this.early, performance.now());
    if (this.done) return; // too many early bytes: answered 400
    const { origin } = this.opts;
    this.connectStart = performance.now();
    let stage: ConnectStage | undefined;
    this.timer = setTimeout(() => this.fail(504, ERROR_TYPE.timeout, new UpstreamTimeout('connect', stage?.detail()).message), this.opts.connectTimeoutMs);
    const via = origin.via;
    if (via === undefined) {
      // Half-open, so an upstream that ends its half can still be sent the client's (without it
      // a TLS socket ends its own half at once, and a client frame then meets EPIPE).
      const onread = sharedRead((b, at) => this.fromUpstream(b, at));
      const secure = origin.protocol === 'https:';
      this.attach(
        secure
          ? tls.connect({ host: origin.host, port: origin.port, secureContext: upstreamTlsContext(), servername: serverName(origin.host), ALPNProtocols: ['http/1.1'], allowHalfOpen: true, onread, lookup: upstreamLookup } as tls.ConnectionOptions)
          : net.connect({ host: origin.host, port: origin.port, allowHalfOpen: true, onread, lookup: upstreamLookup }),
        secure ? 'secureConnect' : 'connect',
      );
      stage = new ConnectStage(this.upstream!, origin.host, undefined, undefined, secure);
    } else {
      // Through the egress proxy: a CONNECT tunnel for ws: and wss: alike, as browsers open
      // one (proxies do not pass an upgrade in an absolute-form request on). TLS over a given
      // socket ignores `onread`: reads come as 'data' events.
      const raw = openTunnel(via, origin.host, origin.port, (err) => {
        if (this.done) return; // closed meanwhile; close() destroyed the socket
        if (err !== undefined) {
          this.connectFailed(err, err.message, err.message);
          return;
        }
        const secure = origin.protocol === 'https:';
        stage!.tunnelOpened(secure);
        const up = secure
          ? tls.connect({ socket: raw, host: origin.host, secureContext: upstreamTlsContext(), servername: serverName(origin.host), ALPNProtocols: ['http/1.1'], allowHalfOpen: true } as tls.ConnectionOptions)
          : raw;
        raw.allowHalfOpen = true;
        up.on('data', (b: Buffer) => this.fromUpstream(b, performance.now()));
        this.attach(up, secure ? 'secureConnect' : undefined, raw);
        if (!secure) raw.resume();
      });
      this.upstream = raw;
      stage = new ConnectStage(raw, via.host, via, authority(origin.host, origin.port), origin.protocol === 'https:');
    }
    this.client.on('data', (b: Buffer) => this.fromClient(b));
    this.client.on('end', () => this.clientEnd());
    this.client.on('error', () => this.clientGone());
    this.client.on('close', () => this.clientGone());
    this.client.resume();
  }

  /** The upstream socket: the upgrade request is written (it waits for the connection), listeners set. */
  private attach(up: net.Socket, connectEvent: 'connect' | 'secureConnect' | undefined, hop: net.Socket = up): void {
    this.upstream = up;
    up.setNoDelay(true);
    // Written at once: the socket holds it until connected. latin1: header bytes as received.
    up.write(requestHead(this.req.method ?? 'GET', this.opts.path, this.headers), 'latin1');
    const connected = () => {
      this.connected = true;
      this.connectMs = performance.now() - this.connectStart;
      this.upstreamAddr = peerAddress(hop);
      this.opts.onConnected?.(this.opts.origin, this.connectMs);
      clearTimeout(this.timer);
      // Judged after this turn's reads, for a head that came in while the process stalled (upstream.ts).
      const late = () => {
        if (this.status === undefined) this.fail(504, ERROR_TYPE.timeout, 'upstream response timeout');
      };
      this.timer = setTimeout(() => setImmediate(late), this.opts.responseTimeoutMs);
    };
    if (connectEvent === undefined) connected();
    else up.once(connectEvent, connected);
    up.on('end', () => this.upstreamEnd());
    up.on('error', (err: NodeJS.ErrnoException) => this.upstreamFailed(err));
    up.on('close', () => this.upstreamFailed(undefined));
  }

  /**
   * The upstream socket's idle timeout, judged after this turn's reads, as the proxy's upstream
   * connections judge theirs (upstream.ts): after a stall of the process the timer fires before
   * what arrived meanwhile is read. When the tunnel moved (the upstream taking a part of a pending
   * write counts), the idle period starts again.
   */
  private readonly idleDue = (): void => {
    const moves = this.upstreamMoves;
    const queued = writeQueueSize(this.upstream!);
    setImmediate(() => {
      if (this.done) return;
      if (this.upstreamMoves === moves && writeQueueSize(this.upstream!) === queued) {
        // An open tunnel's sides are told, as at the shutdown deadline; a declined answer is cut.
        this.close(ERROR_TYPE.timeout, false, 'idle timeout');
      } else if (!this.upstream!.destroyed) this.upstream!.setTimeout(this.opts.idleTimeoutMs);
    });
  };

  private fromClient(b: Buffer): void {
    if (this.done) {
      if (this.finishUp) this.finishFrame('up', b);
      return;
    }
    const arrival = performance.now();
    if (this.status === 101) {
      this.forwardUp(b);
      this.upFrames.push(b);
      this.session?.fromClient(b, arrival);
    }
    // After a declined upgrade, dropped: they would be requests the router never saw.
    else if (this.declined === undefined) this.hold(b, arrival);
  }

  private hold(b: Buffer, arrival: number): void {
    this.held.push(b);
    this.heldAt.push(arrival);
    this.heldBytes += b.length;
    if (this.heldBytes > MAX_HELD_BYTES) this.fail(400, 'invalid_upgrade', 'the client sent more than 64 KiB before the upgrade was answered');
  }

  private forwardUp(b: Buffer): void {
    this.upstreamMoves++;
    this.bytesUp += b.length;
    if (!this.upstream!.write(b) && !this.upPaused) {
      this.upPaused = true;
      this.client.pause();
      this.upstream!.once('drain', () => {
        this.upPaused = false;
        this.upstreamMoves++;
        this.client.resume();
      });
    }
  }

  private clientEnd(): void {
    this.clientEnded = true;
    if (this.finishUp) this.settle('up', false); // the rest of its frame will not come
    // Before the 101 it is remembered; after a declined one the answer still goes out.
    if (this.status !== 101 || this.done) return;
    this.upstream!.end();
    this.finishIfBothEnded();
  }

  private upstreamEnd(): void {
    this.upstreamEnded = true;
    if (!this.clientEnded) this.upstreamFirst = true;
    if (this.finishDown) this.settle('down', false); // the rest of its frame will not come
    if (this.done) return;
    if (this.status === 101) {
      this.client.end();
      this.finishIfBothEnded();
    } else if (this.declined?.framing.kind === 'close') {
      this.close(undefined); // the end of a close-delimited answer
    } else if (this.declined !== undefined) {
      this.close(ERROR_TYPE.upstreamReset); // the answer was cut
    } else {
      this.upstreamFailed(undefined);
    }
  }

  private finishIfBothEnded(): void {
    if (this.clientEnded && this.upstreamEnded) this.close(undefined);
  }

  private fromUpstream(b: Buffer, arrival: number): void {
    if (this.done) {
      if (this.finishDown) this.finishFrame('down', b);
      return;
    }
    this.upstreamMoves++;
    if (this.status === 101) {
      this.writeDown(b);
      this.downFrames.push(b);
      this.session?.fromUpstream(b, arrival);
      return;
    }
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
      let head: ResponseHead;
      let framing: BodyFraming;
      try {
        head = parseResponseHead(buf.subarray(0, end));
        framing = responseFraming(head, this.req.method ?? 'GET');
      } catch (e) {
        this.fail(502, ERROR_TYPE.protocol, `invalid upstream response: ${(e as HttpParseError).message}`);
        return;
      }
      if (head.status < 200 && head.status !== 101) {
        this.writeDown(passedHead(head, undefined, undefined));
        buf = buf.subarray(end);
        this.head = buf.length === 0 ? [] : [buf];
        if (buf.length === 0) return;
        continue;
      }
      if (head.status === 101 && !/^\s*websocket\s*$/i.test(rawHeader(head.rawHeaders, 'upgrade') ?? '')) {
        this.fail(502, ERROR_TYPE.protocol, 'invalid upstream response: 101 without Upgrade: websocket');
        return;
      }
      clearTimeout(this.timer);
      this.status = head.status;
      this.head = [];
      // From here on a quiet upstream (and, once open, a quiet tunnel) times out.
      this.upstream!.on('timeout', this.idleDue); // not setTimeout's callback: that one is a once listener
      this.upstream!.setTimeout(this.opts.idleTimeoutMs);
      if (head.status === 101) {
        const switched = passedHead(head, SWITCHING_KEEP, 'Upgrade');
        this.writeDown(buf.length > end ? Buffer.concat([switched, buf.subarray(end)]) : switched);
        if (buf.length > end) this.downFrames.push(buf.subarray(end));
        this.session = this.opts.measure?.(rawHeader(head.rawHeaders, 'sec-websocket-extensions'));
        if (buf.length > end) this.session?.fromUpstream(buf.subarray(end), arrival);
        this.open();
        return;
      }
      this.held = [];
      this.heldAt = [];
      this.recordFailure(head.status, undefined);
      this.declined = { framing, left: framing.kind === 'length' ? framing.length : 0, chunked: framing.kind === 'chunked' ? new ChunkedDecoder() : undefined };
      this.writeDown(passedHead(head, DECLINED_KEEP, 'close')); // the connection closes after it
      if (framing.kind === 'none' || (framing.kind === 'length' && framing.length === 0)) this.close(undefined);
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
    }
    if (end > 0) this.writeDown(b.subarray(0, end));
    if (d.chunked?.error !== undefined) this.close(ERROR_TYPE.protocol); // forwarded as it came, then cut
    else if (complete) this.close(undefined);
  }

  private writeDown(b: Buffer): void {
    this.bytesDown += b.length;
    if (!this.client.write(b) && !this.downPaused) {
      this.downPaused = true;
      this.upstream!.pause();
      this.client.once('drain', () => {
        this.downPaused = false;
        this.upstreamMoves++; // the client took what it was sent: the silence was not the upstream's
        this.upstream!.resume();
      });
    }
  }

  /** Switched: what the client sent meanwhile goes first, then both directions are piped. */
  private open(): void {
    const held = this.held;
    const at = this.heldAt;
    this.held = [];
    this.heldAt = [];
    for (let i = 0; i < held.length; i++) {
      this.forwardUp(held[i]!);
      this.upFrames.push(held[i]!);
      this.session?.fromClient(held[i]!, at[i]!);
    }
    if (this.clientEnded) this.upstream!.end();
    if (this.upstreamEnded) this.client.end();
    this.finishIfBothEnded();
  }

  private upstreamFailed(err: NodeJS.ErrnoException | undefined): void {
    if (this.done) {
      // Gone while a frame was being let finish: neither direction's can now.
      if (this.finishDown) this.settle('down', false);
      if (this.finishUp) this.settle('up', false);
      return;
    }
    if (this.status === undefined) {
      const code = err?.code;
      if (this.connected) this.fail(502, ERROR_TYPE.upstreamReset, `upstream closed the connection before responding (${code ?? err?.message ?? 'closed'})`);
      else this.connectFailed(err, code ?? err?.message ?? 'closed');
      return;
    }
    // After a clean end (a TLS socket over the egress proxy's tunnel closes on it when that tunnel
    // closes): the client's half ends too. Anything else is a cut.
    this.close(err === undefined && this.upstreamEnded && this.status === 101 ? undefined : ERROR_TYPE.upstreamReset);
  }

  /**
   * The upstream (or egress) connection never came up: the proxy's own 503 when it ran out of
   * descriptors or memory, else the upstream's 502 naming `what`. `detail`: what the log says.
   */
  private connectFailed(err: unknown, what: string, detail?: string): void {
    const lack = lackOf(err);
    if (lack !== undefined) this.fail(503, ERROR_TYPE.outOfResources, lackMessage(lack), detail);
    else this.fail(502, ERROR_TYPE.unreachable, `upstream unreachable: ${what}`);
  }

  /** Before any upstream answer reached the client: answer for the upstream, then close. `detail`: what the log says, if more. */
  private fail(status: number, errorType: string, message: string, detail = message): void {
    if (this.done) return;
    if (this.status !== undefined || this.bytesDown > 0) {
      this.close(errorType);
      return;
    }
    this.opts.log.warn({ reqId: this.opts.requestId, err: detail }, 'upstream upgrade failed');
    this.ownStatus = status;
    writeRawError(this.client, status, errorType, message);
    if (status >= 500) this.recordFailure(status, errorType); // not the client's own 400
    this.close(errorType, true);
  }

  /** Switched to WebSocket and not closed yet: a session, not a request waiting for its answer. */
  get isOpen(): boolean {
    return this.status === 101 && !this.done;
  }

  /**
   * Ended at a shutdown deadline: an open tunnel's sides are each sent a Close 1001 ("going
   * away", RFC 6455 §7.4.1) between two frames, then ended. A side mid-frame is first sent the
   * rest of that frame as it comes (FRAME_FINISH_MS at most, else it is cut); one whose frames
   * could not be followed is cut. A tunnel not open (no 101 yet, a declined answer) is cut.
   */
  abort(errorType: string): void {
    this.close(errorType, false, 'proxy shutting down');
  }

  private recordFailure(status: number, errorType: string | undefined): void {
    if (this.recorded) return;
    this.recorded = true;
    this.opts.failed?.(status, errorType, this.start);
  }

  /** `goAwayReason`: an open tunnel's sides are sent a Close 1001 with it rather than cut (see goAway). */
  private close(errorType: string | undefined, clientAnswered = false, goAwayReason?: string): void {
    if (this.done) return;
    // Ended before any final answer (the client gave up on a hung upstream, the shutdown
    // deadline, a failure after a 103): the upgrade failed too. The client's own 400 is not.
    if (this.status === undefined && errorType !== undefined && errorType !== 'invalid_upgrade') this.recordFailure(0, errorType);
    this.done = true;
    clearTimeout(this.timer);
    this.held = [];
    this.heldAt = [];
    this.session?.close(performance.now(), errorType, this.upstreamFirst);
    if (errorType === undefined) {
      // Both halves ended (or a declined answer is complete): what was written still goes out.
      if (this.status === 101) endSocket(this.upstream!);
      else this.upstream?.destroy();
      endSocket(this.client);
    } else if (goAwayReason !== undefined && this.status === 101) {
      this.goAwayReason = goAwayReason;
      this.goingAway = [];
      // Both known first: a side's end waits for the frame it still owes the other.
      this.finishDown = this.midFrame('down');
      this.finishUp = this.midFrame('up');
      this.goAway('down');
      this.goAway('up');
      if (this.finishDown || this.finishUp) this.finishTimer = setTimeout(this.finishDue, FRAME_FINISH_MS);
    } else {
      // A failure reaches each side as one (a reset), not as a clean end.
      if (this.upstream) cut(this.upstream);
      if (!clientAnswered) cut(this.client);
    }
    this.opts.onDone(this);
    this.closedWith = errorType;
    if (!this.finishDown && !this.finishUp) this.logLine(errorType);
  }

  private clientGone(): void {
    if (!this.done) return this.close(ERROR_TYPE.clientCancelled);
    // Gone while a frame was being let finish: neither direction's can now.
    if (this.finishUp) this.settle('up', false);
    if (this.finishDown) this.settle('down', false);
  }

  private sideOf(dir: Direction): { socket: Duplex; frames: FrameBounds } {
    return dir === 'down' ? { socket: this.client, frames: this.downFrames } : { socket: this.upstream!, frames: this.upFrames };
  }

  /** That side's last frame is incomplete, and the rest may still come and go to it. */
  private midFrame(dir: Direction): boolean {
    const { socket, frames } = this.sideOf(dir);
    return !socket.destroyed && !socket.writableEnded && !frames.broken && !frames.atBoundary;
  }

  /**
   * At the shutdown deadline or the idle timeout, one side of an open tunnel: a Close 1001 where
   * a frame can go in, then our half's end (once that side owes the other no rest of a frame).
   * After a Close has gone that way, or once our half has ended (an end passed on), only the end:
   * a reset could lose what that side has not read yet. A side whose frames could not be followed
   * is cut, as any failure; one mid-frame waits for its frame's end.
   */
  private goAway(dir: Direction): void {
    const { socket, frames } = this.sideOf(dir);
    if (socket.destroyed) return;
    if (socket.writableEnded) endSocket(socket);
    else if (frames.broken) cut(socket);
    else if (frames.atBoundary) this.tellGoingAway(dir);
  }

  private tellGoingAway(dir: Direction): void {
    const { socket, frames } = this.sideOf(dir);
    if (!frames.closeSeen) {
      socket.write(closeFrame(CLOSE_GOING_AWAY, this.goAwayReason, dir === 'up'));
      this.goingAway!.push(dir === 'down' ? 'client' : 'upstream');
    }
    // The client is the sender of the frame going up, the upstream of the one going down.
    if (dir === 'down' && this.finishUp) this.endClientLater = true;
    else if (dir === 'up' && this.finishDown) this.endUpstreamLater = true;
    else endSocket(socket);
  }

  /**
   * Bytes for a direction being let finish its frame: up to the frame's end, then the Close (what
   * follows is dropped). Up to a head that breaks the protocol, as every byte before the deadline
   * was, then the reset.
   */
  private finishFrame(dir: Direction, b: Buffer): void {
    const { frames } = this.sideOf(dir);
    const n = frames.untilBoundary(b);
    if (n > 0) {
      const part = n === b.length ? b : b.subarray(0, n);
      if (dir === 'down') this.writeDown(part);
      else this.forwardUp(part);
    }
    if (frames.atBoundary) this.settle(dir, true);
    else if (frames.broken) this.settle(dir, false);
  }

  /** A direction let finish its frame is done: told (its frame ended) or cut. The log line once both are. */
  private settle(dir: Direction, frameEnded: boolean): void {
    if (dir === 'down') this.finishDown = false;
    else this.finishUp = false;
    if (frameEnded) this.tellGoingAway(dir);
    else cut(this.sideOf(dir).socket);
    // The sender of that frame, told already, owes nothing more: its end goes now.
    if (dir === 'down' && this.endUpstreamLater) {
      this.endUpstreamLater = false;
      endSocket(this.upstream!);
    } else if (dir === 'up' && this.endClientLater) {
      this.endClientLater = false;
      endSocket(this.client);
    }
    if (this.finishDown || this.finishUp) return;
    clearTimeout(this.finishTimer);
    this.logLine(this.closedWith);
  }

  /** Closed, with a side still let finish its frame (its line waits for it). */
  get finishing(): boolean {
    return this.finishDown || this.finishUp;
  }

  /** A side still let finish its frame is cut now (an exit that cannot wait), and the line written. */
  finishNow(): void {
    if (this.finishing) this.finishDue();
  }

  private readonly finishDue = (): void => {
    if (this.finishDown) this.settle('down', false);
    if (this.finishUp) this.settle('up', false);
  };

  private logLine(errorType: string | undefined): void {
    // A declined upgrade is a failed request, as its metrics recorded when its head came
    // (recordUnopened): its status, or upgrade_declined for a 1xx-3xx, however it then ended.
    const declined = this.status !== undefined && this.status !== 101;
    const logged = declined ? (this.status! >= 400 ? String(this.status) : ERROR_TYPE.upgradeDeclined) : errorType;
    // A session cut at the shutdown deadline is lost output: at warn, as an HTTP request's line.
    this.opts.log[errorType === ERROR_TYPE.shutdownDeadline ? 'warn' : 'info'](
      {
        reqId: this.opts.requestId,
        method: this.req.method,
        path: safePath(this.opts.path),
        upgrade: this.req.headers.upgrade,
        status: this.status ?? this.ownStatus,
        outcome: logged === undefined ? 'ok' : logged === ERROR_TYPE.clientCancelled ? 'cancelled' : 'error',
        errorType: logged,
        bytesUp: this.bytesUp,
        bytesDown: this.bytesDown,
        responses: this.session?.responses,
        // The messages could not be read to the end (a protocol break, a bound): see the README.
        measurementStopped: this.session?.stopped || undefined,
        // The sides sent a Close 1001 at the shutdown deadline or the idle timeout. A side not
        // named was cut (its frame under way did not end: in time, or its sender ended, closed or
        // broke the protocol first; or its frames could not be followed), or only ended (a Close
        // had gone its way already, or its half had ended).
        goingAway: this.goingAway?.sort(),
        durationMs: Math.round((performance.now() - this.start) * 1000) / 1000,
        upstreamConnectMs: this.connectMs === undefined ? undefined : Math.round(this.connectMs * 1000) / 1000,
        upstreamAddr: this.upstreamAddr,
      },
      'tunnel',
    );
    this.opts.onLogged?.(this);
  }
}

/** A declined answer's body goes on with the upstream's framing, whatever Connection names. */
const DECLINED_KEEP = new Set(['content-length', 'transfer-encoding']);
/** A 101 says which protocol the tunnel now speaks. */
const SWITCHING_KEEP = new Set(['upgrade']);

/**
 * An upstream head as the tunnel passes it on (an interim answer, the 101, a declined answer):
 * its fields but the hop-by-hop ones and those its Connection names (RFC 9110 §7.6.1), except
 * `keep`, then the proxy's own Connection, if any.
 */
function passedHead(head: ResponseHead, keep: ReadonlySet<string> | undefined, connection: string | undefined): Buffer {
  const fields = endToEndHeaders(head.rawHeaders, undefined, [], keep);
  let s = `HTTP/1.${head.minor} ${head.status} ${head.statusText}\r\n`;
  for (let i = 0; i < fields.length; i += 2) s += `${fields[i]}: ${fields[i + 1]}\r\n`;
  if (connection !== undefined) s += `Connection: ${connection}\r\n`;
  return Buffer.from(`${s}\r\n`, 'latin1');
}

/**
 * Destroys a socket with a reset where it can (plain TCP), so the peer sees a failure, not an
 * end. Not on a socket still connecting (Node would wait for the connection, then reset) or
 * whose end is still being written (the reset fails with EINVAL and the fd stays open).
 */
function cut(s: Duplex): void {
  if (s.destroyed) return;
  const sock = s as net.Socket;
  const resettable =
    typeof sock.resetAndDestroy === 'function' && !(s instanceof tls.TLSSocket) && !sock.connecting && !(s.writableEnded && !s.writableFinished);
  try {
    if (resettable) sock.resetAndDestroy();
    else s.destroy();
  } catch {
    s.destroy();
  }
}

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

/** The body of the proxy's own error answers. */
export function errorBody(type: string, message: string): string {
  return JSON.stringify({ error: { type, message, source: 'llm-latency-proxy' } });
}

/** The answer to CONNECT, a forward proxy's method. */
export const CONNECT_REFUSAL = 'CONNECT is not supported: this is a reverse proxy';
export const CONNECT_ALLOW = 'allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS\r\n';

/** The proxy's JSON error answer as raw HTTP/1.1, for a socket no ServerResponse writes to; `extra` is header lines. */
export function rawErrorResponse(status: number, type: string, message: string, extra = ''): string {
  const body = errorBody(type, message);
  return `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Error'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${extra}connection: close\r\n\r\n${body}`;
}

/** A JSON error answer on a socket that Node's HTTP server handed over (upgrade, CONNECT). */
export function writeRawError(socket: Duplex, status: number, type: string, message: string, extra = ''): void {
  if (socket.destroyed || socket.writableEnded) return;
  endSocket(socket, rawErrorResponse(status, type, message, extra));
}
