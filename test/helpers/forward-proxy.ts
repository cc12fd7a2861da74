import http from 'node:http';
import https from 'node:https';
import net, { type AddressInfo } from 'node:net';

/**
 * A forward (egress) proxy on loopback, as a corporate proxy behaves: CONNECT tunnels and
 * absolute-form requests, optional Basic authentication (407 without it), and a record of what
 * it was asked. `tls` makes it an https:// proxy (TLS to the proxy itself).
 */
export interface ForwardProxy {
  readonly url: string;
  /** CONNECT targets (`host:port`), in order. */
  readonly connects: string[];
  /** Absolute-form request lines (`POST http://... HTTP/1.1`), in order. */
  readonly requests: string[];
  /** Proxy-Authorization of each CONNECT or request (undefined when absent). */
  readonly auths: (string | undefined)[];
  /** Request heads of the absolute-form requests, as received (raw header pairs). */
  readonly heads: string[][];
  /** Connections open now (clients' and the proxy's own to upstreams). */
  readonly open: number;
  close(): Promise<void>;
}

export interface ForwardProxyOptions {
  /** user:password the proxy demands (407 otherwise). */
  credentials?: string;
  /** Answer every CONNECT with this status instead of tunnelling. */
  refuseConnect?: number;
  /** Accept CONNECTs and never answer them. */
  silent?: boolean;
  /** Answer a CONNECT this long after the upstream connection is up (a slow proxy). */
  connectDelayMs?: number;
  tls?: { key: Buffer; cert: Buffer };
}

export async function startForwardProxy(opts: ForwardProxyOptions = {}): Promise<ForwardProxy> {
  const connects: string[] = [];
  const requests: string[] = [];
  const auths: (string | undefined)[] = [];
  const heads: string[][] = [];
  const sockets = new Set<net.Socket>();
  const expected = opts.credentials === undefined ? undefined : `Basic ${Buffer.from(opts.credentials).toString('base64')}`;
  const handler = (req: http.IncomingMessage, res: http.ServerResponse) => {
    requests.push(`${req.method} ${req.url} HTTP/${req.httpVersion}`);
    auths.push(req.headers['proxy-authorization']);
    heads.push(req.rawHeaders);
    if (expected !== undefined && req.headers['proxy-authorization'] !== expected) {
      res.writeHead(407, { 'proxy-authenticate': 'Basic realm="test"' }).end();
      return;
    }
    const target = new URL(req.url ?? '');
    const headers = { ...req.headers };
    delete headers['proxy-authorization'];
    delete headers['proxy-connection'];
    const up = http.request({ host: target.hostname, port: target.port, method: req.method, path: target.pathname + target.search, headers }, (r) => {
      res.writeHead(r.statusCode ?? 502, r.headers);
      r.pipe(res);
    });
    up.on('error', () => res.destroy());
    req.pipe(up);
  };
  const server = opts.tls ? https.createServer({ key: opts.tls.key, cert: opts.tls.cert }, handler) : http.createServer(handler);
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.on('secureConnection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.on('connect', (req: http.IncomingMessage, client: net.Socket, early: Buffer) => {
    connects.push(req.url ?? '');
    auths.push(req.headers['proxy-authorization']);
    client.on('error', () => {});
    if (opts.silent) {
      client.resume(); // reads nothing it answers, but sees the client leave
      client.on('end', () => client.destroy()); // the server is allowHalfOpen
      return;
    }
    if (expected !== undefined && req.headers['proxy-authorization'] !== expected) {
      client.end('HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\n\r\n');
      return;
    }
    if (opts.refuseConnect !== undefined) {
      client.end(`HTTP/1.1 ${opts.refuseConnect} ${http.STATUS_CODES[opts.refuseConnect] ?? 'No'}\r\nContent-Length: 0\r\n\r\n`);
      return;
    }
    const m = /^\[?([^\]]+)\]?:(\d+)$/.exec(req.url ?? '');
    if (m === null) {
      client.end('HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n');
      return;
    }
    const up = net.connect({ host: m[1], port: Number(m[2]) }, () => {
      const open = () => {
        if (client.destroyed) return;
        client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        if (early.length > 0) up.write(early);
        up.pipe(client);
        client.pipe(up);
      };
      if (opts.connectDelayMs === undefined) open();
      else setTimeout(open, opts.connectDelayMs);
    });
    sockets.add(up);
    up.on('close', () => {
      sockets.delete(up);
      client.destroy();
    });
    client.on('close', () => up.destroy());
    up.on('error', () => client.destroy());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `${opts.tls ? 'https' : 'http'}://127.0.0.1:${port}`,
    connects,
    requests,
    auths,
    heads,
    get open() {
      return sockets.size;
    },
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}
