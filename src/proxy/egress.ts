import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { headEnd, MAX_HEAD_BYTES, parseResponseHead } from './http1.js';
import { serverName, upstreamLookup } from './lookup.js';
import { upstreamTlsContext } from './tls-context.js';

/**
 * Egress (forward) proxies: how the proxy reaches upstreams from a network that only lets
 * HTTP out through one (`HTTPS_PROXY=http://proxy.corp:3128`). The variables are read as
 * undici's EnvHttpProxyAgent (Node's own fetch with NODE_USE_ENV_PROXY) reads them: lower
 * case first, an https upstream falls back to the http proxy. NO_PROXY entries (hosts,
 * optionally with a port, or `*`) match as curl matches them: a bare `example.com` covers its
 * subdomains too, where undici takes it as that name only. Added: IP ranges in CIDR form
 * (`10.0.0.0/8`), as curl and Python's requests accept them.
 *
 * An https upstream is reached through a CONNECT tunnel, and TLS runs end to end inside it;
 * a plain-http upstream gets absolute-form requests (`POST http://host/v1/...`), as curl and
 * Node's http client send them: proxies commonly refuse CONNECT to ports other than 443.
 */

export interface EgressProxy {
  readonly protocol: 'http:' | 'https:';
  /** IPv6 without brackets. */
  readonly host: string;
  readonly port: number;
  /** `Basic ...` from the URL's user:password, sent as Proxy-Authorization. */
  readonly authorization: string | undefined;
  /** The URL without its credentials, for logs and errors. */
  readonly display: string;
}

export interface EgressSettings {
  /** For http upstreams. */
  readonly http: EgressProxy | undefined;
  /** For https upstreams (and WebSocket upgrades to either). */
  readonly https: EgressProxy | undefined;
  /** NO_PROXY entries, as given. */
  readonly noProxy: readonly string[];
}

export const NO_EGRESS: EgressSettings = Object.freeze({ http: undefined, https: undefined, noProxy: Object.freeze([]) });

/** A proxy URL as curl and Python take it: the scheme may be left out (http). Throws a message. */
export function parseProxyUrl(value: string): EgressProxy {
  const text = value.trim();
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(text) ? text : `http://${text}`;
  let u: URL;
  try {
    u = new URL(withScheme);
  } catch {
    throw new Error('expected a proxy URL such as http://proxy.example:3128');
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') {
    throw new Error(`${u.protocol.slice(0, -1)} proxies are not supported (use an http:// or https:// proxy)`);
  }
  if (u.hostname === '') throw new Error('the proxy URL has no host');
  if ((u.pathname !== '/' && u.pathname !== '') || u.search !== '' || u.hash !== '') {
    throw new Error('a proxy URL has no path, query or fragment');
  }
  const host = u.hostname.replace(/^\[|\]$/g, '');
  const port = u.port === '' ? (u.protocol === 'https:' ? 443 : 80) : Number(u.port);
  if (port === 0) throw new Error('port 0 cannot be connected to');
  let authorization: string | undefined;
  if (u.username !== '' || u.password !== '') {
    const user = decodeURIComponent(u.username);
    const pass = decodeURIComponent(u.password);
    authorization = `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`;
  }
  return Object.freeze({ protocol: u.protocol, host, port, authorization, display: `${u.protocol}//${u.host}` });
}

/** NO_PROXY's entries (comma or white-space separated). */
export function splitNoProxy(value: string): string[] {
  return value.split(/[,\s]+/).filter((e) => e !== '');
}

const validPort = (p: string | undefined) => p === undefined || (/^\d{1,5}$/.test(p) && Number(p) <= 65535);

type NoProxyRule = { readonly range: readonly [string, number, 'ipv4' | 'ipv6'] } | HostRule;

/**
 * One NO_PROXY entry (not `*`) as curl reads it: a range, or a host with an optional port; or
 * what is wrong with it. The file's `noProxy` reports the problem; NoProxy skips the entry (as
 * undici does for the variable), since such an entry matches no host.
 */
function readNoProxyEntry(entry: string): NoProxyRule | string {
  if (entry.includes('://')) return 'a host, not a URL (example.com, example.com:8443)';
  if (entry.includes('/')) {
    const cidr = /^([0-9a-f:.]+)\/(\d{1,3})$/i.exec(entry);
    const family = cidr === null ? 0 : net.isIP(cidr[1]!);
    const bits = Number(cidr?.[2]);
    if (family === 0 || bits > (family === 4 ? 32 : 128)) return 'a range is an IP address, "/" and a prefix length of at most 32 (IPv4) or 128 (IPv6), such as 10.0.0.0/8';
    return { range: [cidr![1]!, bits, family === 4 ? 'ipv4' : 'ipv6'] };
  }
  let host: string;
  let port: string | undefined;
  if (entry.startsWith('[')) {
    const v6 = /^\[([^\]]+)\](?::(\d+))?$/.exec(entry);
    if (v6 === null || !net.isIPv6(v6[1]!) || !validPort(v6[2])) return 'a bracketed IPv6 address, with an optional port: [::1] or [::1]:8000';
    [host, port] = [v6[1]!, v6[2]];
  } else {
    const colons = (entry.match(/:/g) ?? []).length;
    if (colons > 1 && !net.isIPv6(entry)) return 'not an IPv6 address (with a port, write [::1]:8000)';
    [host, port] = colons === 1 ? (entry.split(':') as [string, string]) : [entry, undefined];
    if (!validPort(port)) return 'a port is a number from 0 to 65535';
    if (colons <= 1 && !/^(\*\.|\.)?[\p{L}\p{N}_-]+(\.[\p{L}\p{N}_-]+)*\.?$/u.test(host)) return 'a host name, .domain, *.domain, IP address or range';
  }
  host = host.replace(/^\*?\./, '').replace(/^(.+)\.$/, '$1').toLowerCase();
  // An IPv6 address as URLs write it (`0:0::1` is `::1`), as the upstream's host is.
  if (net.isIPv6(host)) host = new URL(`http://[${host}]`).hostname.slice(1, -1);
  return { host, port: port === undefined ? 0 : Number(port) };
}

/** What is wrong with an entry of the file's `noProxy` (`alone`: the list's only one), if anything. */
export function noProxyEntryProblem(entry: string, alone: boolean): string | undefined {
  if (entry === '*') return alone ? undefined : '"*" means every host only as the whole value; in a list it matches none';
  const r = readNoProxyEntry(entry);
  return typeof r === 'string' ? r : undefined;
}

interface HostRule {
  readonly host: string;
  readonly port: number;
}

/** Whether NO_PROXY's entries exempt a host (IPv6 without brackets) and port. */
export class NoProxy {
  private readonly all: boolean;
  private readonly hosts: HostRule[] = [];
  private readonly ranges = new net.BlockList();
  private hasRanges = false;

  constructor(entries: readonly string[]) {
    // `*` as the whole value, as undici and Node 24 take it (in a list it matches no host).
    this.all = entries.length === 1 && entries[0] === '*';
    for (const entry of entries) {
      const r = entry === '*' ? undefined : readNoProxyEntry(entry);
      if (r === undefined || typeof r === 'string') continue;
      if ('range' in r) {
        this.ranges.addSubnet(...r.range);
        this.hasRanges = true;
      } else this.hosts.push(r);
    }
  }

  matches(hostname: string, port: number): boolean {
    if (this.all) return true;
    let host = hostname.toLowerCase();
    if (host.length > 1 && host.endsWith('.')) host = host.slice(0, -1);
    for (const r of this.hosts) {
      if (r.port !== 0 && r.port !== port) continue;
      if (host === r.host || host.endsWith(`.${r.host}`)) return true;
    }
    if (this.hasRanges) {
      const family = net.isIP(host);
      if (family !== 0 && this.ranges.check(host, family === 4 ? 'ipv4' : 'ipv6')) return true;
    }
    return false;
  }
}

/** The proxy an upstream is reached through, if any. Decided once per route, at start. */
export function egressFor(settings: EgressSettings, protocol: string, host: string, port: number): EgressProxy | undefined {
  const proxy = protocol === 'https:' ? settings.https : settings.http;
  if (proxy === undefined) return undefined;
  return new NoProxy(settings.noProxy).matches(host, port) ? undefined : proxy;
}

/** A failure to reach an upstream through the egress proxy; it says which proxy and why. */
export class EgressProxyError extends Error {
  override name = 'EgressProxyError';
}

/** `host:port` as a CONNECT target and Host field take it. */
export function authority(host: string, port: number): string {
  return net.isIPv6(host) ? `[${host}]:${port}` : `${host}:${port}`;
}

/**
 * Connects to the proxy and asks it for a tunnel to host:port. `done` is called once: with
 * an error (the caller destroys the socket), or with none when the tunnel is open; the socket
 * is then paused, its own listeners removed, ready to carry TLS or the upstream's bytes.
 */
export function openTunnel(proxy: EgressProxy, host: string, port: number, done: (err: EgressProxyError | undefined) => void, timeoutMs?: number): net.Socket {
  const target = authority(host, port);
  const socket =
    proxy.protocol === 'https:'
      ? tls.connect({ host: proxy.host, port: proxy.port, secureContext: upstreamTlsContext(), servername: serverName(proxy.host), ALPNProtocols: ['http/1.1'], lookup: upstreamLookup })
      : net.connect({ host: proxy.host, port: proxy.port, lookup: upstreamLookup });
  socket.setNoDelay(true);
  // An error after the tunnel's owner took over reaches its listeners too; this one only keeps
  // an error racing a destroy from being unhandled.
  socket.on('error', ignore);
  let head = `CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n`;
  if (proxy.authorization !== undefined) head += `Proxy-Authorization: ${proxy.authorization}\r\n`;
  socket.write(`${head}\r\n`, 'latin1');

  let settled = false;
  let received: Buffer | undefined;
  let timer: NodeJS.Timeout | undefined;
  const settle = (err: EgressProxyError | undefined) => {
    if (settled) return;
    settled = true;
    clearTimeout(timer);
    socket.off('data', onData);
    socket.off('error', onError);
    socket.off('end', onEnd);
    socket.off('close', onEnd);
    if (err === undefined) socket.pause();
    done(err);
  };
  const onData = (b: Buffer) => {
    let data = received === undefined ? b : Buffer.concat([received, b]);
    for (;;) {
      const end = headEnd(data);
      if (end === -1) {
        if (data.length > MAX_HEAD_BYTES) settle(new EgressProxyError(`egress proxy ${proxy.display} sent an oversized answer to CONNECT ${target}`));
        received = data;
        return;
      }
      let status: number;
      let reason: string;
      try {
        const h = parseResponseHead(data.subarray(0, end));
        status = h.status;
        reason = h.statusText;
      } catch {
        settle(new EgressProxyError(`egress proxy ${proxy.display} sent an invalid answer to CONNECT ${target}`));
        return;
      }
      data = data.subarray(end);
      if (status >= 100 && status < 200) continue;
      if (status < 200 || status >= 300) {
        settle(new EgressProxyError(`egress proxy ${proxy.display} answered CONNECT ${target} with ${status}${reason ? ` ${reason.slice(0, 64)}` : ''}`));
      } else if (data.length > 0) {
        // Nothing was sent through the tunnel yet: bytes now are the proxy's, not the upstream's.
        settle(new EgressProxyError(`egress proxy ${proxy.display} sent bytes after opening the tunnel to ${target}`));
      } else {
        settle(undefined);
      }
      return;
    }
  };
  const onError = (err: NodeJS.ErrnoException) => settle(new EgressProxyError(`egress proxy ${proxy.display}: ${err.code ?? err.message}`, { cause: err }));
  const onEnd = () => settle(new EgressProxyError(`egress proxy ${proxy.display} closed the connection before the tunnel to ${target} was open`));
  socket.on('data', onData);
  socket.on('error', onError);
  socket.on('end', onEnd);
  socket.on('close', onEnd);
  // Callers without a timer of their own (an HTTP agent) give up on a silent proxy here.
  if (timeoutMs !== undefined) {
    timer = setTimeout(() => {
      settle(new EgressProxyError(`egress proxy ${proxy.display} did not open the tunnel to ${target} within ${timeoutMs / 1000} s`));
      socket.destroy();
    }, timeoutMs);
  }
  return socket;
}

/**
 * Agents for Node's HTTP client (the OTLP exporter's `httpAgentOptions` factory) that reach a
 * host through the egress proxy its settings give it, else directly: a CONNECT tunnel for http
 * and https alike (a client's agent cannot turn its requests into absolute-form), TLS inside.
 */
export function egressAgentFactory(settings: EgressSettings, tunnelTimeoutMs = 10_000): (protocol: string) => http.Agent {
  return (protocol) => {
    const secure = protocol === 'https:';
    const agent = secure ? new https.Agent({ keepAlive: true }) : new http.Agent({ keepAlive: true });
    const direct = agent.createConnection.bind(agent) as (o: http.ClientRequestArgs, cb?: (err: Error | null, s: Duplex) => void) => Duplex | null | undefined;
    agent.createConnection = (options: http.ClientRequestArgs, cb?: (err: Error | null, s: Duplex) => void) => {
      const host = (options.host ?? options.hostname ?? 'localhost').replace(/^\[|\]$/g, '');
      const port = Number(options.port ?? (secure ? 443 : 80));
      const via = egressFor(settings, protocol, host, port);
      if (via === undefined || cb === undefined) return direct(options, cb);
      const raw = openTunnel(via, host, port, (err) => {
        if (err !== undefined) {
          raw.destroy();
          cb(err, raw);
          return;
        }
        if (!secure) {
          raw.resume();
          cb(null, raw);
          return;
        }
        const servername = (options as tls.ConnectionOptions).servername ?? serverName(host);
        // `host` is the name (or IP) the certificate is checked against; left out, Node takes the
        // socket's, the egress proxy's.
        cb(null, tls.connect({ ...(options as tls.ConnectionOptions), host, port: undefined, path: undefined, socket: raw, servername } as tls.ConnectionOptions));
      }, tunnelTimeoutMs);
      return undefined;
    };
    return agent;
  };
}

function ignore(): void {}
