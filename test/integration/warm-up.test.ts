// The start-up warm-up (src/proxy/warm-up.ts): a first request would otherwise carry Node's
// first-use connect and TLS work and the resolver's start (bench/README.md). What it may do is
// narrow: connect only to a listener of its own on loopback, look up only the names the proxy
// itself resolves, leave nothing open, and never hold the start up.
import dns from 'node:dns';
import net, { type LookupFunction } from 'node:net';
import tls from 'node:tls';
import { afterEach, expect, it, vi } from 'vitest';
import type { ResolvedRoute } from '../../src/proxy/routes.js';
import type { EgressProxy } from '../../src/proxy/egress.js';
import type { Origin } from '../../src/proxy/upstream.js';
import { warmUp } from '../../src/proxy/warm-up.js';

afterEach(() => {
  vi.restoreAllMocks();
});

const route = (origin: Origin): ResolvedRoute => ({ origin }) as ResolvedRoute;
const egress = (protocol: 'http:' | 'https:', host: string): EgressProxy => ({ protocol, host, port: 3128, authorization: undefined, display: `${protocol}//${host}:3128` });

/** Records the names asked for; answers nothing (a warm-up does not wait for its lookups). */
function recordingLookup(): { lookup: LookupFunction; names: string[] } {
  const names: string[] = [];
  return { names, lookup: ((name: string) => names.push(name)) as unknown as LookupFunction };
}

/**
 * Every socket the warm-up opens (and the local port it connected from), every listener it
 * makes, and the remote port of every connection those listeners accepted.
 */
function watchSockets(): { connects: net.Socket[]; from: number[]; listeners: net.Server[]; accepted: number[] } {
  const connects: net.Socket[] = [];
  const from: number[] = [];
  const listeners: net.Server[] = [];
  const accepted: number[] = [];
  const connect = net.Socket.prototype.connect;
  vi.spyOn(net.Socket.prototype, 'connect').mockImplementation(function (this: net.Socket, ...args: unknown[]) {
    connects.push(this);
    this.once('connect', () => from.push(this.localPort!));
    return (connect as (...a: unknown[]) => net.Socket).apply(this, args);
  } as typeof net.Socket.prototype.connect);
  const createServer = net.createServer;
  vi.spyOn(net, 'createServer').mockImplementation(((...args: unknown[]) => {
    const s = (createServer as (...a: unknown[]) => net.Server)(...args);
    // Before the warm-up's own listener, which closes the connection (and forgets its address).
    s.prependListener('connection', (c: net.Socket) => accepted.push(c.remotePort!));
    listeners.push(s);
    return s;
  }) as typeof net.createServer);
  return { connects, from, listeners, accepted };
}

it('connects once, over TLS when a route uses it, to its own loopback listener, and leaves nothing open', async () => {
  const { connects, from, listeners, accepted } = watchSockets();
  const tlsConnects = vi.spyOn(tls, 'connect');
  const system = vi.spyOn(dns, 'lookup');
  const { lookup, names } = recordingLookup();
  await warmUp([route({ protocol: 'https:', host: '127.0.0.1', port: 9 })], { lookup });
  expect(tlsConnects).toHaveBeenCalledTimes(1);
  expect(connects).toHaveLength(1);
  expect(listeners).toHaveLength(1);
  // The one connection made was the one its own listener accepted.
  expect(from).toHaveLength(1);
  expect(accepted).toEqual(from);
  expect(connects[0]!.destroyed).toBe(true);
  expect(listeners[0]!.listening).toBe(false);
  // Its made-up name went to no resolver (listen passes its IP literal through dns.lookup, which
  // answers an IP itself); the route's IP literal needs no lookup.
  expect(system.mock.calls.map((c) => c[0]).filter((n) => net.isIP(n) === 0)).toEqual([]);
  expect(names).toEqual([]);
});

it('without TLS anywhere, the one connection is plain TCP', async () => {
  const { connects } = watchSockets();
  const tlsConnects = vi.spyOn(tls, 'connect');
  await warmUp([route({ protocol: 'http:', host: '127.0.0.1', port: 9 })], { lookup: recordingLookup().lookup });
  expect(tlsConnects).not.toHaveBeenCalled();
  expect(connects).toHaveLength(1);
  expect(connects[0]!.destroyed).toBe(true);
});

it('looks up each name the proxy itself resolves, once: upstreams direct, egress proxies, not what is behind them', async () => {
  watchSockets();
  const { lookup, names } = recordingLookup();
  await warmUp(
    [
      route({ protocol: 'https:', host: 'api.openai.com', port: 443 }),
      route({ protocol: 'https:', host: 'api.openai.com', port: 8443 }),
      route({ protocol: 'http:', host: 'vllm.internal', port: 8000 }),
      route({ protocol: 'https:', host: 'api.anthropic.com', port: 443, via: egress('http:', 'squid.corp') }),
      route({ protocol: 'http:', host: 'ollama.lan', port: 11434, via: egress('https:', 'squid.corp') }),
      route({ protocol: 'http:', host: '::1', port: 8000 }),
    ],
    { lookup },
  );
  expect(names.sort()).toEqual(['api.openai.com', 'squid.corp', 'vllm.internal']);
});

it('a listener that never comes up holds the start for limitMs at most', async () => {
  const listen = vi.spyOn(net.Server.prototype, 'listen').mockImplementation(function (this: net.Server) {
    return this;
  } as typeof net.Server.prototype.listen);
  const t0 = performance.now();
  await warmUp([route({ protocol: 'https:', host: '127.0.0.1', port: 9 })], { lookup: recordingLookup().lookup, limitMs: 50 });
  const waited = performance.now() - t0;
  expect(listen).toHaveBeenCalledTimes(1);
  // 50 ms, give or take a timer's lateness on a loaded machine; far below the 1 s default.
  expect(waited).toBeGreaterThanOrEqual(45);
  expect(waited).toBeLessThan(900);
});

it('a listener that cannot listen costs nothing more and throws nothing', async () => {
  vi.spyOn(net.Server.prototype, 'listen').mockImplementation(function (this: net.Server) {
    queueMicrotask(() => this.emit('error', Object.assign(new Error('listen EACCES'), { code: 'EACCES' })));
    return this;
  } as typeof net.Server.prototype.listen);
  const tlsConnects = vi.spyOn(tls, 'connect');
  await expect(warmUp([route({ protocol: 'https:', host: '127.0.0.1', port: 9 })], { lookup: recordingLookup().lookup })).resolves.toBeUndefined();
  expect(tlsConnects).not.toHaveBeenCalled();
});
