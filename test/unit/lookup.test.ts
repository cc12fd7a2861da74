import type { LookupAddress, LookupAllOptions } from 'node:dns';
import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { serverName, SharedLookup } from '../../src/proxy/lookup.js';

type Done = (err: NodeJS.ErrnoException | null, addresses: LookupAddress[]) => void;

/** A resolver the test answers by hand, counting calls. */
function manualResolver() {
  const calls: { host: string; options: LookupAllOptions; done: Done }[] = [];
  return { calls, resolve: (host: string, options: LookupAllOptions, done: Done) => void calls.push({ host, options, done }) };
}

describe('shared name lookups', () => {
  it('runs one lookup per name while it is in flight; every waiter gets the answer in the form it asked for', () => {
    const r = manualResolver();
    const l = new SharedLookup(r.resolve);
    const got: unknown[] = [];
    for (let i = 0; i < 10; i++) l.lookup('api.example', { all: i % 2 === 0 }, (err, a, f) => got.push(err ? err.message : [a, f]));
    l.lookup('other.example', { all: true }, () => {});
    expect(r.calls.map((c) => c.host)).toEqual(['api.example', 'other.example']);
    r.calls[0]!.done(null, [{ address: '10.0.0.2', family: 4 }, { address: 'fd00::2', family: 6 }]);
    expect(got).toHaveLength(10);
    expect(got[0]).toEqual([[{ address: '10.0.0.2', family: 4 }, { address: 'fd00::2', family: 6 }], undefined]);
    expect(got[1]).toEqual(['10.0.0.2', 4]);
    expect(l.inFlight).toBe(1);
    // Nothing is cached: the next connection asks again.
    l.lookup('api.example', { all: true }, () => {});
    expect(r.calls).toHaveLength(3);
  });

  it('shares a failure with the waiters of the moment only, and keeps families apart', () => {
    const r = manualResolver();
    const l = new SharedLookup(r.resolve);
    const errs: string[] = [];
    l.lookup('gone.example', { all: true }, (err) => errs.push(err!.message));
    l.lookup('gone.example', {}, (err) => errs.push(err!.message));
    l.lookup('gone.example', { family: 6 }, () => {});
    expect(r.calls).toHaveLength(2);
    r.calls[0]!.done(Object.assign(new Error('getaddrinfo ENOTFOUND gone.example'), { code: 'ENOTFOUND' }), []);
    expect(errs).toEqual(['getaddrinfo ENOTFOUND gone.example', 'getaddrinfo ENOTFOUND gone.example']);
    l.lookup('gone.example', { all: true }, () => {});
    expect(r.calls).toHaveLength(3);
  });

  it('leaves the address order to the process default (--dns-result-order), not its own', () => {
    const r = manualResolver();
    new SharedLookup(r.resolve).lookup('api.example', { all: true }, () => {});
    // `verbatim` or `order` here would override dns.setDefaultResultOrder / --dns-result-order.
    expect(r.calls[0]!.options).not.toHaveProperty('verbatim');
    expect(r.calls[0]!.options).not.toHaveProperty('order');
  });

  it('answers every waiter once, whatever the resolver does: throws, calls back twice, returns no address', () => {
    const throwing = new SharedLookup(() => {
      throw Object.assign(new Error('bad hints'), { code: 'ERR_INVALID_ARG_VALUE' });
    });
    const errs: string[] = [];
    throwing.lookup('a.example', {}, (err) => errs.push(err!.message));
    expect(errs).toEqual(['bad hints']);
    expect(throwing.inFlight).toBe(0); // not left pending: the next connection asks again

    const r = manualResolver();
    const twice = new SharedLookup(r.resolve);
    const got: unknown[] = [];
    twice.lookup('b.example', {}, (err, a) => got.push(err ? err.message : a));
    twice.lookup('b.example', { all: true }, (err, a) => got.push(err ? err.message : a));
    r.calls[0]!.done(null, [{ address: '10.0.0.3', family: 4 }]);
    r.calls[0]!.done(null, [{ address: '10.0.0.4', family: 4 }]);
    expect(got).toEqual(['10.0.0.3', [{ address: '10.0.0.3', family: 4 }]]);
    // A later lookup of the same name is not answered by the stale second callback.
    const later: unknown[] = [];
    twice.lookup('b.example', {}, (err, a) => later.push(err ? err.message : a));
    r.calls[0]!.done(null, [{ address: '10.0.0.5', family: 4 }]);
    expect(later).toEqual([]);
    r.calls[1]!.done(null, [{ address: '10.0.0.6', family: 4 }]);
    expect(later).toEqual(['10.0.0.6']);

    // Throwing after answering: heard as the answer given, not thrown at the connection.
    const late = new SharedLookup((_h, _o, done) => {
      done(null, [{ address: '10.0.0.8', family: 4 }]);
      throw new Error('resolver bug after answer');
    });
    const lateGot: unknown[] = [];
    expect(() => late.lookup('e.example', {}, (err, a) => lateGot.push(err ? err.message : a))).not.toThrow();
    expect(lateGot).toEqual(['10.0.0.8']);

    // An undefined error with addresses (a loose resolver) is a success.
    const loose = new SharedLookup((_h, _o, done) => (done as unknown as (e: undefined, a: LookupAddress[]) => void)(undefined, [{ address: '10.0.0.9', family: 4 }]));
    const looseGot: unknown[] = [];
    loose.lookup('f.example', {}, (err, a) => looseGot.push(err ? err.message : a));
    expect(looseGot).toEqual(['10.0.0.9']);

    const none = manualResolver();
    const empty = new SharedLookup(none.resolve);
    const codes: unknown[] = [];
    empty.lookup('c.example', {}, (err) => codes.push(err?.code));
    empty.lookup('c.example', { all: true }, (err) => codes.push(err?.code));
    none.calls[0]!.done(null, []);
    expect(codes).toEqual(['ENOTFOUND', 'ENOTFOUND']);
  });

  it('a waiter that throws does not keep the others from their answer; its error is rethrown to the resolver', () => {
    const r = manualResolver();
    const l = new SharedLookup(r.resolve);
    const got: string[] = [];
    l.lookup('d.example', {}, () => {
      throw new Error('waiter failed');
    });
    l.lookup('d.example', {}, (_err, a) => got.push(a as string));
    expect(() => r.calls[0]!.done(null, [{ address: '10.0.0.7', family: 4 }])).toThrow('waiter failed');
    expect(got).toEqual(['10.0.0.7']);
    expect(l.inFlight).toBe(0);
  });

  it('serves net.connect (Node asks for every address when it tries both families)', async () => {
    const server = net.createServer((s) => s.end('hi'));
    await new Promise<void>((res) => server.listen(0, '127.0.0.1', res));
    const port = (server.address() as net.AddressInfo).port;
    const l = new SharedLookup();
    const text = await new Promise<string>((res, rej) => {
      const c = net.connect({ host: 'localhost', port, lookup: l.lookup, family: 4 });
      let t = '';
      c.on('data', (b: Buffer) => (t += b.toString()));
      c.on('end', () => res(t));
      c.on('error', rej);
    });
    server.close();
    expect(text).toBe('hi');
  });
});

describe('TLS server names', () => {
  it('are the host without a trailing dot, and none for an IP literal', () => {
    expect(serverName('api.openai.com.')).toBe('api.openai.com');
    expect(serverName('api.openai.com')).toBe('api.openai.com');
    expect(serverName('127.0.0.1')).toBeUndefined();
    expect(serverName('::1')).toBeUndefined();
  });
});
