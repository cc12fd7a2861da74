import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect } from 'vitest';

/**
 * `actual` within `rel` of `expected`: for values a provider reports in-band, which no stall on
 * this machine moves. What the proxy times is bounded by what its client saw (`streamBounds`).
 */
export function within(actual: number, expected: number, opts: { rel?: number; what?: string } = {}): void {
  const { rel = 0.1, what = '' } = opts;
  const tol = expected * rel;
  const msg = `${what ? `${what}: ` : ''}${actual} vs ${expected} ± ${tol}`;
  expect(actual, msg).toBeGreaterThanOrEqual(expected - tol);
  expect(actual, msg).toBeLessThanOrEqual(expected + tol);
}

/** The ClientTimes whose request has not gone to a stamping transport yet. */
let awaitingSend: ClientTimes | undefined;

/**
 * What the application saw of one stream: when its request went out, and when it got its first
 * and last content events (performance.now(), ms). Create it just before the request; call
 * `content()` as each content event reaches the application. `sent` is taken at creation, then
 * once more, as the first request after it goes to a stamping transport (`stampingFetch`,
 * `hashingFetch`, `requestSent`) while it has no content yet. That leaves the client library's
 * own work before its request (10-40 ms on a file's first one) out of the window. Sound as long
 * as that first stamping request is not sent after this stream's own: an SDK's earlier request
 * only widens the bounds, and a stream whose request goes around the stamping transports must
 * see no other stamping request before its first content (the tests run their streams one after
 * another).
 */
export class ClientTimes {
  /** Written again only by `requestSent`. */
  sent = performance.now();
  first = NaN;
  last = NaN;
  /**
   * When `hashingFetch`'s copy of the response body to the request that stamped `sent` read its
   * end (so after the body's last byte reached the client's fetch), or NaN.
   */
  bodyEnd = NaN;
  constructor() {
    awaitingSend = this;
  }
  content(): void {
    const t = performance.now();
    if (Number.isNaN(this.first)) this.first = t;
    this.last = t;
  }
}

/**
 * Stamps `sent` on the ClientTimes awaiting its request: call as a request goes to the client's
 * transport. Returns that ClientTimes, if any.
 */
export function requestSent(): ClientTimes | undefined {
  const t = awaitingSend;
  awaitingSend = undefined;
  if (t && Number.isNaN(t.first)) t.sent = performance.now();
  return t;
}

/** A fetch (over `base`, the global one by default) that stamps `sent` on the ClientTimes awaiting its request. */
export function stampingFetch(base: typeof fetch = fetch): typeof fetch {
  return (input, init) => {
    requestSent();
    return base(input, init);
  };
}

/**
 * Two requests through `base` to a throwaway loopback server, each on a new connection. Node
 * loads its fetch (undici) on first use: ~45 ms from the call to the request reaching a server,
 * ~3 ms the second time, ~2 ms on a new connection after. Called before a file's timed
 * requests, so that this stays out of the client's window.
 */
export async function warmFetch(base: typeof fetch = fetch): Promise<void> {
  const server = http.createServer((_req, res) => {
    res.shouldKeepAlive = false;
    res.end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  try {
    for (let i = 0; i < 2; i++) await (await base(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`, { method: 'POST', body: '{}' })).arrayBuffer();
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
}

/** The earliest due times (s after arrival) of a simulator plan's first and last tokens: jitter moves each by up to ±jitter/2 ITL. */
export function earliestDue(plan: { ttft: number; itl: number; tokens: number; jitter: number }): { first: number; last: number } {
  const early = (plan.jitter * plan.itl) / 2;
  return { first: plan.ttft - early, last: plan.ttft + plan.itl * (plan.tokens - 1) - early };
}

/** Floating-point error in seconds computed from ms on both sides. */
const EPS_S = 1e-6;

/**
 * Resolves once performance.now() has reached t0 + s seconds, never before: a timer alone can fire
 * a millisecond or two early on this clock (Node truncates both its start time and the delay).
 * Upstreams written in the tests send on it, so a content event is never written before its due time.
 */
export async function sleepUntil(t0: number, s: number): Promise<void> {
  const due = t0 + s * 1000;
  for (let left = due - performance.now(); left > 0; left = due - performance.now()) {
    await new Promise((r) => setTimeout(r, Math.ceil(left)));
  }
}

/**
 * Bounds (s) on the proxy's TTFT and span (first to last content event: the sum of its gaps)
 * for one stream, from the order of events rather than an allowance for stalls: the proxy starts
 * its clock after the client sent the request and before the upstream has it; it stamps a chunk
 * after the upstream wrote it and before the application reads it; the upstream writes content
 * event k no earlier than its arrival + its due time (the simulator's schedule and `sleepUntil`
 * never send early). `firstDue` / `lastDue`: the earliest due times (s after arrival) of the first
 * and the last content events. A stall anywhere widens the client's window as much as the proxy's,
 * so the bounds hold on a loaded machine, and on an idle one they are within a few ms of the
 * schedule. Only durations are compared, so the proxy or the upstream may run in another process:
 * each process's performance.now() counts from its own origin, but on the one monotonic clock,
 * at the same rate (never compare absolute stamps across processes). Given several streams,
 * bounds the sums of their TTFTs and of their spans. Asserts that the application got a content
 * event in each.
 */
export function streamBounds(c: ClientTimes | readonly ClientTimes[], firstDue: number, lastDue: number): { ttft: Range; span: Range } {
  let ttftLo = 0;
  let ttftHi = 0;
  let spanLo = 0;
  let spanHi = 0;
  for (const t of Array.isArray(c) ? c : [c]) {
    expect(t.first, 'the application got no content event').not.toBeNaN();
    const first = (t.first - t.sent) / 1000;
    const last = (t.last - t.sent) / 1000;
    ttftLo += firstDue - EPS_S;
    ttftHi += first + EPS_S;
    spanLo += lastDue - first - EPS_S;
    spanHi += last - firstDue + EPS_S;
  }
  return { ttft: [ttftLo, ttftHi], span: [spanLo, spanHi] };
}

export type Range = readonly [lo: number, hi: number];

/** `actual` within [lo, hi]; `over` divides both (a mean over that many intervals). */
export function between(actual: number, [lo, hi]: Range, what: string, over = 1): void {
  const msg = `${what}: ${actual} vs [${lo / over}, ${hi / over}]`;
  expect(actual, msg).toBeGreaterThanOrEqual(lo / over);
  expect(actual, msg).toBeLessThanOrEqual(hi / over);
}
