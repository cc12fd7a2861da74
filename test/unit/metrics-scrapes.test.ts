import http from 'node:http';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import type { Telemetry } from '../../src/metrics/exporter.js';
import { FinalScrape } from '../../src/metrics/final-scrape.js';
import { createMetricsApp, listen, MAX_SCRAPES_IN_FLIGHT } from '../../src/server.js';

// A scrape holds its snapshot until its client has read it; the metrics port lets only a few be
// in flight. The telemetry here makes its first `held` scrapes wait on a gate before their first
// piece, so that they stay in flight as long as the test wants.
function gated(held: number) {
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  let calls = 0;
  const telemetry = {
    scrape: () =>
      (async function* (wait: boolean) {
        if (wait) await gate;
        yield '# TYPE x gauge\n';
        yield 'x 1\n';
      })(++calls <= held),
  } as unknown as Telemetry;
  return { telemetry, open: () => open(), calls: () => calls };
}

/** 24 pieces of 1 MiB: more than the socket buffers hold, so a client that does not read stalls it. */
function large() {
  const big = 'x'.repeat(1 << 20) + '\n';
  let calls = 0;
  const telemetry = {
    scrape: async function* () {
      calls++;
      for (let i = 0; i < 24; i++) yield big;
    },
  } as unknown as Telemetry;
  return { telemetry, calls: () => calls, size: 24 * big.length };
}

const servers: http.Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
});

async function serve(telemetry: Telemetry, scrapeDeadlineMs?: number, finalScrape?: FinalScrape): Promise<string> {
  const { server, url } = await listen(createMetricsApp(telemetry, { ready: () => true }, { ...(scrapeDeadlineMs ? { scrapeDeadlineMs } : {}), ...(finalScrape ? { finalScrape } : {}) }), 0, '127.0.0.1');
  servers.push(server);
  return url;
}

/** GET /metrics; resolves with the status and body, and gives a way to hang up before. */
function get(url: string) {
  let req!: http.ClientRequest;
  const done = new Promise<{ status: number; body: string; retryAfter?: string }>((resolve, reject) => {
    req = http.get(`${url}/metrics`, { agent: false }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      // 'close', not 'end': a body cut by the deadline ends no other way.
      res.on('close', () => resolve({ status: res.statusCode!, body, ...(res.headers['retry-after'] ? { retryAfter: res.headers['retry-after'] } : {}) }));
    });
    req.on('error', reject);
  });
  return { done, hangUp: () => req.destroy() };
}

async function until(cond: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !cond(); i++) await sleep(10);
  expect(cond()).toBe(true);
}

describe('/metrics scrapes in flight', () => {
  it(`answers a scrape beyond ${MAX_SCRAPES_IN_FLIGHT} in flight with 503 and Retry-After, and takes scrapes again once those end`, async () => {
    const t = gated(MAX_SCRAPES_IN_FLIGHT);
    const url = await serve(t.telemetry);
    const held = Array.from({ length: MAX_SCRAPES_IN_FLIGHT }, () => get(url));
    await until(() => t.calls() === MAX_SCRAPES_IN_FLIGHT);
    const refused = await get(url).done;
    expect(refused.status).toBe(503);
    expect(refused.retryAfter).toBe('1');
    expect(t.calls()).toBe(MAX_SCRAPES_IN_FLIGHT); // refused before collecting anything
    t.open();
    for (const h of held) expect(await h.done).toEqual({ status: 200, body: '# TYPE x gauge\nx 1\n' });
    for (let i = 0; i < MAX_SCRAPES_IN_FLIGHT + 2; i++) expect((await get(url).done).status).toBe(200);
  });

  it('lets the slot of a client that hung up go once its collection is done, not before (hang-ups start no more collections)', async () => {
    const t = gated(MAX_SCRAPES_IN_FLIGHT);
    const url = await serve(t.telemetry);
    const held = Array.from({ length: MAX_SCRAPES_IN_FLIGHT }, () => get(url));
    for (const h of held) h.done.catch(() => undefined);
    await until(() => t.calls() === MAX_SCRAPES_IN_FLIGHT);
    for (const h of held) h.hangUp();
    await sleep(100);
    expect((await get(url).done).status).toBe(503);
    expect(t.calls()).toBe(MAX_SCRAPES_IN_FLIGHT);
    t.open();
    let status = 0;
    for (let i = 0; i < 200 && status !== 200; i++) {
      status = (await get(url).done).status;
      if (status !== 200) await sleep(10);
    }
    expect(status).toBe(200);
  });

  it('closes a scrape whose client stopped reading at the deadline, freeing its slot', async () => {
    const { telemetry, calls } = large();
    const url = await serve(telemetry, 1000);
    const { port } = new URL(url);
    const sockets = Array.from({ length: MAX_SCRAPES_IN_FLIGHT }, () => {
      const s = net.connect(Number(port), '127.0.0.1', () => s.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n'));
      s.pause(); // never reads
      s.on('error', () => undefined);
      return s;
    });
    await until(() => calls() === MAX_SCRAPES_IN_FLIGHT);
    expect((await get(url).done).status).toBe(503);
    // The proxy cuts them at the deadline (their own ends, paused, do not notice).
    let status = 0;
    for (let i = 0; i < 500 && status !== 200; i++) {
      status = (await get(url).done).status;
      if (status !== 200) await sleep(10);
    }
    expect(status).toBe(200);
    for (const s of sockets) s.destroy();
  });
});

describe('a listener error once listening', () => {
  it('is told to onServerError, every time, and the server serves on (the listen promise\'s one-off handler is gone)', async () => {
    const seen: string[] = [];
    const { server, url } = await listen(createMetricsApp(gated(0).telemetry, { ready: () => true }), 0, '127.0.0.1', { onServerError: (e) => seen.push(e.message) });
    servers.push(server);
    expect(server.listenerCount('error')).toBe(1);
    // As libuv passes an accept failure up (EMFILE past its reserve descriptor, ENOBUFS).
    for (const code of ['EMFILE', 'ENOBUFS']) server.emit('error', Object.assign(new Error(`accept ${code}`), { code }));
    expect(seen).toEqual(['accept EMFILE', 'accept ENOBUFS']);
    expect(await get(url).done).toMatchObject({ status: 200, body: '# TYPE x gauge\nx 1\n' });
  });
});

describe('the final scrape after a drain (metrics.finalScrapeWait)', () => {
  /** Whether `p` has settled within `ms`, and how. */
  const settled = <T>(p: Promise<T>, ms: number) => Promise.race([p, sleep(ms).then(() => 'pending' as const)]);
  /** A raw request that never reads its answer; `destroy()` hangs up. */
  const unread = (url: string, method = 'GET') => {
    const s = net.connect(Number(new URL(url).port), '127.0.0.1', () => s.write(`${method} /metrics HTTP/1.1\r\nHost: x\r\n\r\n`));
    s.pause();
    s.on('error', () => undefined);
    return s;
  };

  it('is a GET collected after the drain ended and sent whole, named by its client; one collected before it does not count, even when sent after', async () => {
    const fs = new FinalScrape();
    const t = gated(1);
    const url = await serve(t.telemetry, undefined, fs);
    const early = get(url); // its collection begins before the drain's end, and waits on the gate
    await until(() => t.calls() === 1);
    await sleep(5);
    const waiting = fs.wait(performance.now(), 20_000);
    t.open();
    expect(await early.done).toEqual({ status: 200, body: '# TYPE x gauge\nx 1\n' });
    expect(await settled(waiting, 200)).toBe('pending');
    const res = await fetch(`${url}/metrics`, { headers: { 'user-agent': 'Prometheus/3.5.0' } });
    expect(await res.text()).toBe('# TYPE x gauge\nx 1\n');
    expect(await settled(waiting, 5000)).toEqual({ address: '127.0.0.1', userAgent: 'Prometheus/3.5.0' });
  });

  it('is not a HEAD, nor a collection that failed (500)', async () => {
    const fs = new FinalScrape();
    let fail = true;
    const telemetry = {
      scrape: async function* () {
        if (fail) throw new Error('collector broke');
        yield 'x 1\n';
      },
    } as unknown as Telemetry;
    const url = await serve(telemetry, undefined, fs);
    const waiting = fs.wait(performance.now(), 20_000);
    expect((await fetch(`${url}/metrics`)).status).toBe(500);
    fail = false;
    const head = await fetch(`${url}/metrics`, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(await settled(waiting, 300)).toBe('pending');
    expect((await fetch(`${url}/metrics`)).status).toBe(200);
    expect(await settled(waiting, 5000)).toMatchObject({ address: '127.0.0.1' });
  });

  it('is not a scrape whose client hung up, nor one cut because its client stopped reading', async () => {
    const fs = new FinalScrape();
    const { telemetry, calls, size } = large();
    const url = await serve(telemetry, 500, fs);
    const waiting = fs.wait(performance.now(), 20_000);
    const gone = unread(url); // 24 MiB cannot be sent whole to a client that does not read
    await until(() => calls() === 1);
    gone.destroy();
    const stalled = unread(url); // cut at the 500 ms deadline
    await until(() => calls() === 2);
    expect(await settled(waiting, 1500)).toBe('pending');
    stalled.destroy();
    // The whole one from a second app sharing the wait, whose deadline a loaded machine cannot
    // reach: 24 MiB to a reader in this same process took over 500 ms beside the whole suite.
    const whole = await get(await serve(telemetry, 20_000, fs)).done;
    expect(whole.status).toBe(200);
    expect(whole.body.length).toBe(size);
    expect(await settled(waiting, 5000)).toMatchObject({ address: '127.0.0.1' });
  });

  it('ends undefined when no scrape comes within the wait, or at once when cancelled', async () => {
    const fs = new FinalScrape();
    const t0 = performance.now();
    expect(await fs.wait(t0, 150)).toBeUndefined();
    expect(performance.now() - t0).toBeGreaterThanOrEqual(140);
    const waiting = fs.wait(performance.now(), 20_000);
    fs.cancel();
    expect(await settled(waiting, 1000)).toBeUndefined();
    fs.served(performance.now(), { address: undefined, userAgent: undefined }); // nothing waits: no effect, no throw
  });
});
