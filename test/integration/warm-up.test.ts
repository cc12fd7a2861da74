// The start-up warm-up (src/proxy/warm-up.ts): a first request would otherwise carry Node's
// first-use connect and TLS work and the resolver's start (bench/README.md). What it may do is
// narrow: connect only to a listener of its own on loopback, look up no upstream's name (only
// localhost), leave nothing open, and never hold the start up.
import { spawnSync } from 'node:child_process';
import dns from 'node:dns';
import net, { type LookupFunction } from 'node:net';
import { join, resolve } from 'node:path';
import tls from 'node:tls';
import { afterEach, expect, it, vi } from 'vitest';
import type { ResolvedRoute } from '../../src/proxy/routes.js';
import type { EgressProxy } from '../../src/proxy/egress.js';
import { SharedLookup } from '../../src/proxy/lookup.js';
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

it('looks up localhost once when the proxy resolves any name itself, never an upstream\'s name (which could hang)', async () => {
  watchSockets();
  const asked = async (routes: ResolvedRoute[]) => {
    const { lookup, names } = recordingLookup();
    await warmUp(routes, { lookup });
    return names;
  };
  const direct = route({ protocol: 'https:', host: 'api.openai.com', port: 443 });
  const other = route({ protocol: 'http:', host: 'vllm.internal', port: 8000 });
  const behindLiteral = route({ protocol: 'https:', host: 'api.anthropic.com', port: 443, via: egress('http:', '10.0.0.3') });
  const behindName = route({ protocol: 'https:', host: '10.0.0.9', port: 443, via: egress('http:', 'squid.corp') });
  const literal = route({ protocol: 'http:', host: '::1', port: 8000 });
  expect(await asked([literal, direct, other])).toEqual(['localhost']);
  expect(await asked([literal, behindName])).toEqual(['localhost']);
  // Behind an egress proxy the proxy resolves the upstream's name: nothing to warm here.
  expect(await asked([literal, behindLiteral, route({ protocol: 'http:', host: '10.0.0.7', port: 8000 })])).toEqual([]);
});

it('a request to a localhost upstream while that lookup runs shares it instead of taking a second resolver slot', async () => {
  watchSockets();
  const resolving: string[] = [];
  // A resolver that never answers, so the lookup is still running when the request comes.
  const shared = new SharedLookup(((name: string) => resolving.push(name)) as unknown as ConstructorParameters<typeof SharedLookup>[0]);
  await warmUp([route({ protocol: 'http:', host: 'localhost', port: 8000 })], { lookup: shared.lookup });
  expect([resolving, shared.inFlight]).toEqual([['localhost'], 1]);
  vi.restoreAllMocks();
  const request = net.connect({ host: 'localhost', port: 8000, lookup: shared.lookup });
  request.on('error', () => {});
  await new Promise((r) => setImmediate(r));
  request.destroy();
  expect([resolving, shared.inFlight]).toEqual([['localhost'], 1]);
});

it('a lookup that throws is not the start\'s failure', async () => {
  watchSockets();
  const lookup = (() => {
    throw new Error('resolver broke');
  }) as unknown as LookupFunction;
  await expect(warmUp([route({ protocol: 'https:', host: 'api.openai.com', port: 443 })], { lookup })).resolves.toBeUndefined();
});

it('a connection still not done at limitMs is dropped, with its listener', async () => {
  const held: net.Socket[] = [];
  const createServer = net.createServer;
  const listeners: net.Server[] = [];
  // A listener that accepts and then says nothing: a TLS client waits for the server's answer.
  vi.spyOn(net, 'createServer').mockImplementation((() => {
    const s = (createServer as (h: (c: net.Socket) => void) => net.Server)((c) => held.push(c));
    listeners.push(s);
    return s;
  }) as typeof net.createServer);
  const made: tls.TLSSocket[] = [];
  const real = tls.connect.bind(tls) as (o: tls.ConnectionOptions) => tls.TLSSocket;
  vi.spyOn(tls, 'connect').mockImplementation(((o: tls.ConnectionOptions) => made[made.push(real(o)) - 1]) as typeof tls.connect);
  await warmUp([route({ protocol: 'https:', host: '127.0.0.1', port: 9 })], { lookup: recordingLookup().lookup, limitMs: 100 });
  expect(held).toHaveLength(1);
  expect([made.length, made[0]!.destroyed, listeners[0]!.listening]).toEqual([1, true, false]);
  for (const c of held) c.destroy();
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

it('keeps a process with nothing else open alive until it is done (its listener and socket stay referenced)', () => {
  // As at start-up with an IP-only upstream: no lookup, no other handle. Were either unref'd, the
  // process would exit 0 halfway, before the proxy listens (the built module, as the CLI runs it).
  const warmUpModule = join(resolve(import.meta.dirname, '../..'), 'dist/proxy/warm-up.js');
  for (const protocol of ['http:', 'https:']) {
    const script = `import(${JSON.stringify(warmUpModule)}).then(({ warmUp }) => warmUp([{ origin: { protocol: '${protocol}', host: '127.0.0.1', port: 9 } }]).then(() => console.log('warmed')))`;
    const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 30_000 });
    expect(r.stderr, protocol).toBe('');
    expect(r.status, protocol).toBe(0);
    expect(r.stdout, protocol).toBe('warmed\n');
  }
});
