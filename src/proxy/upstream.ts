import net from 'node:net';
import { performance } from 'node:perf_hooks';
import tls from 'node:tls';
import { ChunkedDecoder } from './chunked.js';
import { authority, EgressProxyError, openTunnel, type EgressProxy } from './egress.js';
import { ConnectStage } from './connect-stage.js';
import { upstreamTlsContext } from './tls-context.js';
import { serverName, upstreamLookup } from './lookup.js';
import {
  headEnd,
  keepAliveHintMs,
  MAX_HEAD_BYTES,
  parseResponseHead,
  requestHead,
  responseFraming,
  reusable,
  HttpParseError,
  type BodyFraming,
  type ResponseHead,
} from './http1.js';

/**
 * A small HTTP/1.1 client for the upstream side of the proxy, with its own
 * keep-alive pool. Why not node:http: per streamed event, Node's client costs
 * an llhttp callback, an IncomingMessage push and a 'data' emit; here a read
 * is one `onread` callback into a shared buffer, and a chunked body comes out
 * as the upstream's own framing, ready to be written to the client verbatim
 * (see bench/README.md for the measurements). TLS upstreams use the same code
 * over tls.connect, whose decrypted reads take the same `onread` path.
 */

export class UpstreamTimeout extends Error {
  constructor(
    readonly phase: 'connect' | 'response' | 'idle',
    detail?: string,
  ) {
    super(`upstream ${phase} timeout${detail === undefined ? '' : ` (${detail})`}`);
  }
}

export class UpstreamClosed extends Error {
  readonly code = 'ECONNRESET';
  constructor(message = 'upstream closed the connection') {
    super(message);
  }
}

/** The fields of a socket's stream states that the functions below read and set (Node internals). */
interface StreamStates {
  _writableState?: { autoDestroy: boolean };
  _readableState?: { autoDestroy: boolean; errored: Error | null };
}
const streamStates = (socket: net.Socket): StreamStates => socket as unknown as StreamStates;

/**
 * Node destroys a socket whose write fails, at once: an answer the upstream sent before it reset
 * the connection (a 413 from the request head, then a close with the body unread) is still in
 * the kernel's receive queue, and would be lost with the socket. While a request body is being
 * sent, the exchange decides instead (`uploadFailed`). `autoDestroy` of both sides is what
 * Node's stream internals read for that (net.Socket sets it, and has no option for it).
 */
function destroyOnWriteError(socket: net.Socket, on: boolean): void {
  const s = streamStates(socket);
  if (s._writableState !== undefined) s._writableState.autoDestroy = on;
  if (s._readableState !== undefined) s._readableState.autoDestroy = on;
}

/**
 * After a failed write was held (above): the read side is made to end and fail as usual again.
 * Node marks the reading side errored too, which would keep its end from being heard.
 */
function readOnAfterWriteError(socket: net.Socket): void {
  destroyOnWriteError(socket, true);
  const r = streamStates(socket)._readableState;
  if (r !== undefined) r.errored = null;
}

/**
 * Whether this Node lets those fields be set and read back (accessors over one bit field in
 * Node 20.20 and 24). Where it does not, a failed body write ends the exchange at once, as before.
 */
const canHoldWriteErrors = ((): boolean => {
  try {
    const { _writableState: w, _readableState: r } = streamStates(new net.Socket());
    if (w === undefined || r === undefined) return false;
    w.autoDestroy = false;
    r.autoDestroy = false;
    r.errored = new Error('probe');
    r.errored = null;
    return w.autoDestroy === false && r.autoDestroy === false && r.errored === null;
  } catch {
    return false;
  }
})();

/** How long an exchange whose upload failed waits for the answer the upstream may have sent first. */
const UPLOAD_FAILED_GRACE_MS = 100;

export interface Origin {
  readonly protocol: string;
  /** Host to connect to (IPv6 without brackets); also the TLS server name. */
  readonly host: string;
  readonly port: number;
  /** The egress proxy the upstream is reached through, if any. */
  readonly via?: EgressProxy | undefined;
}

export type RequestBody = 'none' | 'length' | 'chunked';

/** What the caller hears about one exchange. Called at most once each, except onData. */
export interface ExchangeHandler {
  onHead(head: ResponseHead, framing: BodyFraming): void;
  /**
   * Body bytes that arrived at `arrival` (ms, performance.now()). `wire`: the
   * bytes as they may be forwarded verbatim (for a chunked body, its chunk
   * framing, less a size line still incomplete and less the last chunk);
   * the payload in them is `ranges` of `body` (flat start/end pairs);
   * `last`: the response is complete with these. `ranges` is reused: valid
   * during the call only.
   */
  onData(wire: Buffer, body: Buffer, ranges: readonly number[], arrival: number, last: boolean): void;
  onEnd(): void;
  onError(err: Error): void;
}

export interface UpstreamOptions {
  connectTimeoutMs: number;
  /** Idle connections kept per origin. */
  maxIdlePerOrigin?: number;
  /** How long an idle connection is kept when the server gives no Keep-Alive hint. */
  keepAliveMs?: number;
  /** The most a server's Keep-Alive hint can make the proxy keep an idle connection. */
  keepAliveMaxMs?: number;
  /** A connection older than this is not reused (closed when its exchange ends). */
  maxAgeMs?: number;
  /** A new connection is up, `ms` after it was begun (the connect-duration metric). */
  onConnected?: (origin: Origin, ms: number) => void;
}

// One read buffer for every plain-TCP upstream socket: reads are handled
// synchronously, and whatever is kept beyond the callback is copied out.
const READ_BUFFER = Buffer.allocUnsafe(64 * 1024);
const CRLF = Buffer.from('\r\n');
const LAST_CHUNK = Buffer.from('0\r\n\r\n');

/**
 * `onread` options for a socket (net.connect, and tls.connect for the decrypted bytes): every
 * read lands in READ_BUFFER and reaches `onRead` as a copy of its own, stamped on arrival (every
 * socket shares the buffer, and a write may still hold the bytes after the callback). A read
 * costs one callback instead of a Readable push and a 'data' emit. pause() stops the reads; a
 * TLS socket still delivers what it already decrypted from the network read in hand (tens of
 * KiB at most).
 */
export function sharedRead(onRead: (b: Buffer, arrival: number) => void): net.OnReadOpts {
  return {
    buffer: READ_BUFFER,
    callback: (n: number) => {
      const arrival = performance.now();
      const copy = Buffer.allocUnsafe(n);
      READ_BUFFER.copy(copy, 0, 0, n);
      onRead(copy, arrival);
      return true;
    },
  };
}

function originKey(o: Origin): string {
  const key = `${o.protocol}//${o.host}:${o.port}`;
  return o.via === undefined ? key : `${key} via ${o.via.display}`;
}

export class UpstreamClient {
  private readonly idle = new Map<string, Connection[]>();
  private readonly tlsSessions = new Map<string, Buffer>();
  private readonly maxIdle: number;
  private readonly keepAliveMs: number;
  private readonly keepAliveMaxMs: number;
  private readonly maxAgeMs: number;
  private closed = false;

  constructor(private readonly opts: UpstreamOptions) {
    this.maxIdle = opts.maxIdlePerOrigin ?? 256;
    this.keepAliveMs = opts.keepAliveMs ?? 4000;
    this.keepAliveMaxMs = opts.keepAliveMaxMs ?? 600_000;
    this.maxAgeMs = opts.maxAgeMs ?? 3_600_000;
  }

  /** Starts a request: the head is written at once, the body with write()/end(). */
  request(origin: Origin, method: string, target: string, rawHeaders: string[], body: RequestBody, handler: ExchangeHandler): Exchange {
    const conn = this.acquire(origin);
    const ex = new Exchange(conn, method, body, handler);
    const via = origin.via;
    if (via !== undefined && origin.protocol === 'http:') {
      // Plain http through the egress proxy: absolute-form, the proxy's credentials added.
      target = `http://${authority(origin.host, origin.port)}${target}`;
      if (via.authorization !== undefined) rawHeaders = [...rawHeaders, 'Proxy-Authorization', via.authorization];
    }
    conn.begin(ex, requestHead(method, target, rawHeaders));
    return ex;
  }

  private acquire(origin: Origin): Connection {
    const key = originKey(origin);
    const list = this.idle.get(key);
    while (list !== undefined && list.length > 0) {
      const c = list.pop()!; // LIFO: the warmest connection
      if (c.usable() && !this.tooOld(c)) return c;
      c.socket.destroy();
    }
    return this.connect(origin, key);
  }

  private connect(origin: Origin, key: string): Connection {
    // Before tls.connect, which works before it returns (10-14 ms for a process's first, Node's
    // first-use costs, now paid at start by warm-up.ts; a context of its own cost ~0.7 ms more
    // before tls-context.ts): the request waits for that inside its TTFT too (review Y).
    const born = performance.now();
    if (origin.via !== undefined && origin.protocol === 'https:') return this.connectThroughTunnel(origin, origin.via, key, born);
    // Plain http through an egress proxy: a connection to the proxy, which takes absolute-form requests.
    const to = origin.via === undefined ? origin : { protocol: origin.via.protocol, host: origin.via.host, port: origin.via.port };
    let conn!: Connection;
    let socket: net.Socket;
    if (to.protocol === 'https:') {
      const session = this.tlsSessions.get(key);
      const s = tls.connect({
        host: to.host,
        port: to.port,
        secureContext: upstreamTlsContext(),
        servername: serverName(to.host),
        session,
        lookup: upstreamLookup,
        // HTTP/1.1 is all this client speaks: an h2-only server then fails the handshake (a clear
        // 502) instead of answering a 403 of its own that would read as the provider's refusal.
        ALPNProtocols: ['http/1.1'],
        // Supported by tls.connect since Node 15 (decrypted bytes); @types/node omits it.
        onread: sharedRead((b, arrival) => conn.onRead(b, arrival)),
      } as tls.ConnectionOptions);
      s.on('session', (sess: Buffer) => this.tlsSessions.set(key, sess));
      socket = s;
    } else {
      socket = net.connect({
        host: to.host,
        port: to.port,
        lookup: upstreamLookup,
        onread: sharedRead((b, arrival) => conn.onRead(b, arrival)),
      });
    }
    socket.setNoDelay(true);
    socket.setKeepAlive(true, 1000);
    conn = new Connection(this, key, socket, born, origin.via);
    conn.stage = new ConnectStage(socket, to.host, origin.via, undefined, origin.protocol === 'https:');
    const timer = setTimeout(() => conn.connectTimedOut(), this.opts.connectTimeoutMs);
    socket.once(to.protocol === 'https:' ? 'secureConnect' : 'connect', () => {
      clearTimeout(timer);
      conn.establish(socket);
      this.opts.onConnected?.(origin, conn.connectMs!);
    });
    socket.once('close', () => clearTimeout(timer));
    return conn;
  }

  /**
   * An https upstream through an egress proxy: CONNECT, then TLS inside the tunnel. The
   * connection exists at once and holds what the exchange writes until TLS is up. TLS over
   * a given socket ignores `onread`, so its reads come as 'data' events.
   */
  private connectThroughTunnel(origin: Origin, via: EgressProxy, key: string, born: number): Connection {
    const raw = openTunnel(via, origin.host, origin.port, (err) => {
      if (err !== undefined) {
        clearTimeout(timer);
        conn.tunnelFailed(err);
        return;
      }
      if (conn.socket.destroyed) {
        clearTimeout(timer);
        return;
      }
      const s = tls.connect({
        socket: raw,
        // The name (or IP) the certificate must hold: without it, Node checks the certificate of
        // an IP-literal upstream (no SNI) against the socket's host, the egress proxy's name.
        host: origin.host,
        secureContext: upstreamTlsContext(),
        servername: serverName(origin.host),
        session: this.tlsSessions.get(key),
        ALPNProtocols: ['http/1.1'],
      });
      s.on('session', (sess: Buffer) => this.tlsSessions.set(key, sess));
      s.on('data', (b: Buffer) => conn.onRead(b, performance.now()));
      s.once('secureConnect', () => {
        clearTimeout(timer);
        conn.establish(raw);
        this.opts.onConnected?.(origin, conn.connectMs!);
      });
      s.once('close', () => clearTimeout(timer));
      s.setKeepAlive(true, 1000);
      conn.stage!.tunnelOpened(true);
      conn.tunnelOpened(s);
    });
    const conn = new Connection(this, key, raw, born, via, true);
    conn.stage = new ConnectStage(raw, via.host, via, authority(origin.host, origin.port), true);
    const timer = setTimeout(() => conn.connectTimedOut(), this.opts.connectTimeoutMs);
    return conn;
  }

  /** A connection finished an exchange cleanly: keep it, or close it. */
  release(conn: Connection, hintMs: number | undefined): void {
    // A server's hint wins over the default, less 1 s for the time a request takes to
    // reach it (undici's policy; its margin is 2 s in recent versions): peers that keep
    // connections long spare new handshakes. upstreamKeepAliveMax caps hints only.
    const keepMs = hintMs === undefined ? this.keepAliveMs : Math.min(hintMs - 1000, this.keepAliveMaxMs);
    let list = this.idle.get(conn.key);
    if (this.closed || this.tooOld(conn) || keepMs <= 0 || !conn.usable() || (list !== undefined && list.length >= this.maxIdle)) {
      conn.socket.destroy();
      return;
    }
    if (list === undefined) this.idle.set(conn.key, (list = []));
    conn.socket.setTimeout(keepMs);
    list.push(conn);
  }

  /** Past timeouts.upstreamConnectionMaxAge: not reused, so a busy pool follows the name's DNS. */
  private tooOld(conn: Connection): boolean {
    return performance.now() - conn.born >= this.maxAgeMs;
  }

  forget(conn: Connection): void {
    const list = this.idle.get(conn.key);
    const i = list?.indexOf(conn) ?? -1;
    if (i >= 0) list!.splice(i, 1);
  }

  /** Closes every idle connection; exchanges in flight are closed by their owners. */
  close(): void {
    this.closed = true;
    for (const list of this.idle.values()) for (const c of list) c.socket.destroy();
    this.idle.clear();
  }
}

interface QueueHandle {
  writeQueueSize?: number;
  /** A TLS handle's: the stream handle it writes its encrypted output to. */
  _parent?: QueueHandle;
}

/**
 * Bytes the socket's handle still has to write, as Node's own socket timeout reads them: a large
 * request-body write shrinks it as the upstream reads. Over TLS that count holds the encrypted
 * output until the TCP write under it completes whole, so the TCP handle's count is added: each
 * only shrinks as the upstream takes bytes (TLS hands bytes on to TCP once TCP's previous write
 * is done), so the sum changes whenever either moved.
 */
export function writeQueueSize(socket: net.Socket): number | undefined {
  const h = (socket as unknown as { _handle?: QueueHandle | null })._handle;
  return h == null ? undefined : (h.writeQueueSize ?? 0) + (h._parent?.writeQueueSize ?? 0);
}

/** One upstream socket; carries one exchange at a time. */
class Connection {
  exchange: Exchange | undefined;
  /** Connected (TLS: handshake done): a failure now is the upstream's doing, not unreachability. */
  established = false;
  /** From `born` to established: lookup, TCP, the egress tunnel, TLS (the log's `upstreamConnectMs`). */
  connectMs: number | undefined;
  /** `ip:port` of the first hop (the egress proxy's through one), once established. */
  remote: string | undefined;
  /** Exchanges begun on it: the first one paid for its set-up. */
  uses = 0;
  /** How far the connection got, until it is established (the connect timeout's detail). */
  stage: ConnectStage | undefined;
  /** While an egress tunnel opens: what the exchange wrote, for the TLS socket to come. */
  private pending: Array<string | Buffer> | undefined;
  private pendingBytes = 0;
  private pausedEarly = false;
  /**
   * Reads, request bytes written and drained, and resumes after backpressure: an idle timeout is
   * dropped when one came after it fired, or when the upstream took a part of a pending write
   * (Node's socket timer counts both as activity too).
   */
  private moves = 0;

  constructor(
    private readonly client: UpstreamClient,
    readonly key: string,
    /** The upstream socket; while a tunnel opens, the socket to the egress proxy. */
    public socket: net.Socket,
    /** When connecting began (before the socket was made): its set-up time and age count from here. */
    readonly born: number,
    /** The egress proxy the connection goes through, if any. */
    private readonly via: EgressProxy | undefined = undefined,
    private readonly tunnelling = false,
  ) {
    if (tunnelling) this.pending = [];
    else this.listen();
  }

  private listen(): void {
    const socket = this.socket;
    socket.on('error', (err: NodeJS.ErrnoException) => {
      // A reset, met by a body write on a connection that was up: an answer may be waiting in
      // the read queue. Any other write failure ends the exchange at once, as before.
      const ex = this.exchange;
      if (err.syscall === 'write' && (err.code === 'ECONNRESET' || err.code === 'EPIPE') && this.established && ex !== undefined && ex.uploading) {
        readOnAfterWriteError(socket);
        ex.uploadFailed(err);
        return;
      }
      // A timeout stays a timeout (504); its detail already names the proxy.
      this.exchange?.fail(this.established || err instanceof UpstreamTimeout ? err : this.throughVia(err));
    });
    // A close before the connection was up (a TLS handshake the server ended) is no answer cut short.
    socket.on('end', () => (this.established ? this.exchange?.eof() : this.exchange?.fail(this.closedBeforeUp())));
    socket.on('close', () => {
      this.client.forget(this);
      this.exchange?.fail(this.established ? new UpstreamClosed() : this.closedBeforeUp());
    });
    socket.on('timeout', () => {
      const ex = this.exchange;
      if (ex === undefined) {
        socket.destroy(); // idle in the pool for too long
        return;
      }
      // Timers run before the loop reads its sockets: after a stall of this process (a long GC,
      // a starved CPU) as long as the timeout, the timer fires before the bytes that arrived
      // meanwhile are read. Judge after this turn's reads.
      const moves = this.moves;
      const queued = writeQueueSize(socket);
      setImmediate(() => {
        if (this.exchange !== ex || socket.destroyed) return;
        // A write the upstream takes a part of at a time shrinks libuv's queue with no event.
        if (this.moves === moves && writeQueueSize(socket) === queued) {
          ex.fail(new UpstreamTimeout('idle'));
          return;
        }
        // It moved: the idle period starts again. Set anew, as not every move re-arms the fired
        // timer (a resume, or bytes a paused 'data' socket had buffered).
        if (socket.timeout) socket.setTimeout(socket.timeout);
      });
    });
    socket.on('drain', () => {
      this.moves++;
      this.exchange?.drained();
    });
  }

  /** Request bytes: held while a tunnel opens (false past 64 KiB, as a connecting socket does). */
  write(data: string | Buffer): boolean {
    const held = this.pending;
    if (held === undefined) {
      this.moves++;
      return typeof data === 'string' ? this.socket.write(data, 'latin1') : this.socket.write(data);
    }
    held.push(data);
    this.pendingBytes += data.length;
    return this.pendingBytes < 65536;
  }

  pause(): void {
    if (this.pending === undefined) this.socket.pause();
    else this.pausedEarly = true;
  }

  resume(): void {
    this.moves++; // the client took what it was sent: the silence was not the upstream's
    if (this.pending === undefined) this.socket.resume();
    else this.pausedEarly = false;
  }

  /** The tunnel is open and TLS started over it: the connection is `socket` from now on. */
  tunnelOpened(socket: net.Socket): void {
    const held = this.pending!;
    this.pending = undefined;
    this.socket = socket;
    this.listen();
    if (this.exchange?.uploading === true) destroyOnWriteError(socket, false);
    if (this.pausedEarly) socket.pause();
    socket.cork();
    let more = true;
    for (const d of held) more = this.write(d);
    socket.uncork();
    if (more && this.pendingBytes >= 65536) this.exchange?.drained();
    this.pendingBytes = 0;
  }

  /** Before the upstream answered its connect: which egress proxy, if any, the failure came through. */
  private throughVia(err: NodeJS.ErrnoException): Error {
    const via = this.via;
    if (via === undefined) return err;
    const what = err.code ?? err.message;
    return new EgressProxyError(this.tunnelling ? `${what} (through egress proxy ${via.display})` : `egress proxy ${via.display}: ${what}`, { cause: err });
  }

  private closedBeforeUp(): Error {
    return this.throughVia(new UpstreamClosed(`upstream closed the connection ${this.socket instanceof tls.TLSSocket ? 'during the TLS handshake' : 'before it was up'}`));
  }

  tunnelFailed(err: Error): void {
    this.pending = undefined;
    this.socket.destroy();
    this.exchange?.fail(err);
  }

  /** The connect timeout: while the tunnel opens, the exchange hears it as such. */
  connectTimedOut(): void {
    const err = new UpstreamTimeout('connect', this.stage?.detail());
    if (this.pending !== undefined) this.tunnelFailed(err);
    else this.socket.destroy(err);
  }

  /** Connected (TLS up, through the tunnel when there is one); `hop` is the socket to the first hop. */
  establish(hop: net.Socket): void {
    this.established = true;
    this.connectMs = performance.now() - this.born;
    this.remote = peerAddress(hop);
  }

  usable(): boolean {
    const s = this.socket;
    return !s.destroyed && s.writable && !s.readableEnded;
  }

  begin(ex: Exchange, head: string): void {
    this.exchange = ex;
    this.uses++;
    const s = this.socket;
    s.setTimeout(0);
    // Not the socket to the egress proxy while a tunnel opens: the exchange writes to the TLS one.
    if (ex.uploading && this.pending === undefined) destroyOnWriteError(s, false);
    if (this.pending !== undefined) {
      this.write(head);
      return;
    }
    // Head and a body that arrives in the same tick leave in one segment.
    s.cork();
    s.write(head, 'latin1');
    process.nextTick(() => s.uncork());
  }

  onRead(buf: Buffer, arrival: number): void {
    this.moves++;
    const ex = this.exchange;
    if (ex === undefined) {
      this.socket.destroy(); // bytes nobody asked for: the connection is out of sync
      return;
    }
    ex.read(buf, arrival);
  }

  /** The exchange ended; `keep` when the connection is in sync for another one. */
  detach(keep: boolean, hintMs: number | undefined): void {
    this.exchange = undefined;
    if (!keep) {
      this.socket.destroy();
      return;
    }
    destroyOnWriteError(this.socket, true);
    // The exchange may have paused reading (client backpressure on its last read):
    // an idle connection must read, to notice the server closing it.
    this.socket.resume();
    this.client.release(this, hintMs);
  }
}

/** One request/response on a connection. */
export class Exchange {
  private head: ResponseHead | undefined;
  private framing: BodyFraming | undefined;
  private headBuf: Buffer | undefined;
  private chunked: ChunkedDecoder | undefined;
  private remaining = 0;
  private finished = false;
  private requestDone = false;
  /** A request body write failed: the rest of the body is dropped, the answer still read. */
  private uploadError: Error | undefined;
  private onDrain: (() => void) | undefined;
  private readonly one: number[] = [0, 0];
  /** On a connection opened for it, not taken from the pool. */
  private readonly opened: boolean;

  constructor(
    private readonly conn: Connection,
    private readonly method: string,
    private readonly body: RequestBody,
    private readonly handler: ExchangeHandler,
  ) {
    if (body === 'none') this.requestDone = true;
    this.opened = conn.uses === 0;
  }

  /** Set-up time of a connection opened for this exchange, once it is up; none for a pooled one. */
  get connectMs(): number | undefined {
    return this.opened ? this.conn.connectMs : undefined;
  }

  /** Where the connection went (`ip:port`; the egress proxy's through one), once it is up. */
  get remote(): string | undefined {
    return this.conn.remote;
  }

  /** The connection was up when the exchange failed, or is now. */
  get connected(): boolean {
    return this.conn.established;
  }

  /** While not connected: how far the connection got (for a timeout the caller raises). */
  connectDetail(): string | undefined {
    return this.conn.established ? undefined : this.conn.stage?.detail();
  }

  /** A request body is being sent: a write that fails does not end the exchange by itself. */
  get uploading(): boolean {
    return canHoldWriteErrors && !this.finished && this.body !== 'none' && this.uploadError === undefined;
  }

  /**
   * A request body write failed (the upstream closed or reset the connection): an upstream that
   * answers from the head (a 413, a 401) and closes without reading the body does so. The answer
   * came before the close, so it is in the read queue: read it. The rest of the body is dropped;
   * with no answer by the time the reads are done, the exchange fails with this error.
   */
  uploadFailed(err: Error): void {
    if (this.finished) return;
    this.uploadError = err;
    this.drained(); // a caller waiting to send more sends it here, to be dropped
    if (this.head !== undefined) return; // answered already: the response goes on
    const judge = (): void => {
      if (!this.finished && this.head === undefined) this.fail(err);
    };
    // Timers run before the loop reads its sockets: judge after a turn's reads.
    setTimeout(() => setImmediate(judge), UPLOAD_FAILED_GRACE_MS).unref();
  }

  /** Request body bytes; false when the caller should wait for `whenDrained`. */
  write(chunk: Buffer): boolean {
    if (this.finished || chunk.length === 0 || this.uploadError !== undefined) return true;
    const c = this.conn;
    if (this.body === 'chunked') {
      c.write(`${chunk.length.toString(16)}\r\n`);
      c.write(chunk);
      return c.write(CRLF);
    }
    return c.write(chunk);
  }

  end(): void {
    if (this.finished || this.requestDone) return;
    this.requestDone = true;
    if (this.body === 'chunked' && this.uploadError === undefined) this.conn.write(LAST_CHUNK);
  }

  whenDrained(cb: () => void): void {
    this.onDrain = cb;
  }

  drained(): void {
    const cb = this.onDrain;
    this.onDrain = undefined;
    cb?.();
  }

  /** Stops reading the response until resume() (backpressure from the client). */
  pause(): void {
    if (!this.finished) this.conn.pause();
  }

  resume(): void {
    if (!this.finished) this.conn.resume();
  }

  /** Limits the silence between response reads, once the head is in. */
  setIdleTimeout(ms: number): void {
    if (!this.finished) this.conn.socket.setTimeout(ms);
  }

  /** Abandons the exchange and its connection; `err` is reported to the handler when given. */
  destroy(err?: Error): void {
    if (this.finished) return;
    if (err) {
      this.fail(err);
      return;
    }
    this.finished = true;
    this.conn.detach(false, undefined);
  }

  read(buf: Buffer, arrival: number): void {
    if (this.finished) return;
    try {
      if (this.framing === undefined) {
        const rest = this.readHead(buf);
        if (rest === undefined || this.finished) return;
        buf = rest;
        if (this.framing!.kind === 'none') {
          this.complete(buf.length === 0);
          return;
        }
        if (buf.length === 0) return;
      }
      this.readBody(buf, arrival);
    } catch (e) {
      this.fail(e instanceof Error ? e : new Error(String(e)));
    }
  }

  /** Accumulates the head; returns the bytes after it once it is complete. */
  private readHead(buf: Buffer): Buffer | undefined {
    let data = this.headBuf === undefined ? buf : Buffer.concat([this.headBuf, buf]);
    for (;;) {
      const end = headEnd(data);
      if (end > MAX_HEAD_BYTES) throw new HttpParseError('response head too large');
      if (end === -1) {
        if (data.length > MAX_HEAD_BYTES) throw new HttpParseError('response head too large');
        this.headBuf = data === buf ? Buffer.from(buf) : data;
        return undefined;
      }
      this.headBuf = undefined;
      const head = parseResponseHead(data.subarray(0, end));
      data = data.subarray(end);
      if (head.status >= 100 && head.status < 200) {
        if (head.status === 101) throw new HttpParseError('unexpected protocol switch (101)');
        continue; // 100 Continue, 103 Early Hints: not forwarded
      }
      const framing = responseFraming(head, this.method);
      this.head = head;
      this.framing = framing;
      if (framing.kind === 'chunked') this.chunked = new ChunkedDecoder();
      else if (framing.kind === 'length') this.remaining = framing.length;
      this.handler.onHead(head, framing);
      if (framing.kind === 'length' && framing.length === 0 && !this.finished) {
        this.complete(data.length === 0);
        return undefined;
      }
      return data;
    }
  }

  private readBody(buf: Buffer, arrival: number): void {
    const kind = this.framing!.kind;
    if (kind === 'chunked') {
      const dec = this.chunked!;
      const wire = dec.push(buf);
      // Bytes before a framing fault are forwarded (and measured) first.
      this.handler.onData(wire, buf, dec.ranges, arrival, dec.done);
      if (dec.error !== undefined) this.fail(dec.error);
      else if (dec.done && !this.finished) this.complete(dec.messageEnd === buf.length);
      return;
    }
    let slice = buf;
    if (kind === 'length') {
      if (buf.length > this.remaining) slice = buf.subarray(0, this.remaining);
      this.remaining -= slice.length;
    }
    this.one[1] = slice.length;
    this.handler.onData(slice, slice, this.one, arrival, kind === 'length' && this.remaining === 0);
    if (kind === 'length' && this.remaining === 0 && !this.finished) this.complete(slice.length === buf.length);
  }

  /** The response is complete; `inSync` when no stray bytes followed it. */
  private complete(inSync: boolean): void {
    this.finished = true;
    const keep = inSync && this.requestDone && this.uploadError === undefined && reusable(this.head!, this.framing!);
    this.conn.detach(keep, keep ? keepAliveHintMs(this.head!) : undefined);
    this.handler.onEnd();
  }

  /** The upstream half-closed: the end of a close-delimited body, else a truncation. */
  eof(): void {
    if (this.finished) return;
    if (this.framing?.kind === 'close') {
      this.finished = true;
      this.conn.detach(false, undefined);
      this.handler.onEnd();
      return;
    }
    if (this.headBuf !== undefined && this.headBuf.length > 0) {
      // Bytes came, but never a whole response head: not HTTP, or a head cut short.
      this.fail(new HttpParseError('upstream closed the connection inside its response head'));
      return;
    }
    this.fail(new UpstreamClosed(this.head === undefined ? 'upstream closed the connection before responding' : 'upstream closed the connection mid-body'));
  }

  fail(err: Error): void {
    if (this.finished) return;
    // The connection's close after a failed upload: the write's error says more.
    if (err instanceof UpstreamClosed && this.uploadError !== undefined && this.head === undefined) err = this.uploadError;
    this.finished = true;
    this.conn.detach(false, undefined);
    this.handler.onError(err);
  }
}

/** `ip:port` of a connected socket's peer, IPv6 in brackets (as nginx's $upstream_addr). */
export function peerAddress(socket: net.Socket): string | undefined {
  const a = socket.remoteAddress;
  return a === undefined ? undefined : authority(a, socket.remotePort!);
}
