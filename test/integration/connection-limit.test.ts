import Anthropic from '@anthropic-ai/sdk';
import net from 'node:net';
import OpenAI from 'openai';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { RunningProxy } from '../../src/main.js';
import { createSimulator, type Simulator } from '../../src/simulate/server.js';
import { openFileLimit } from '../../src/start-failure.js';
import { parseProm, scrape } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';

const BODY = '{"model":"cap","stream":true,"max_tokens":3,"messages":[]}';
const REQUEST = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(BODY)}\r\n\r\n${BODY}`;
const LIMIT_LINE = 'connection limit reached: new connections closed';

let sim: Simulator | undefined;
let proxy: RunningProxy | undefined;
let upstreamRequests = 0;
const sockets: net.Socket[] = [];

afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  await proxy?.close();
  await sim?.close();
  proxy = sim = undefined;
});

async function start(file: Parameters<typeof startTestProxy>[1], lines: Record<string, unknown>[]): Promise<RunningProxy> {
  sim = createSimulator({ ttft: 0.005, itl: 0.001, tokens: 3, jitter: 0, seed: 1 });
  upstreamRequests = 0;
  sim.server.on('request', () => upstreamRequests++);
  proxy = await startTestProxy(await sim.listen(0, '127.0.0.1'), file, { logLevel: 'info', logLines: lines });
  return proxy;
}

/**
 * A new connection that sends one streamed request: `answered` when the whole chunked answer came
 * (the connection is then kept alive), or the bytes it got before the proxy closed it.
 */
function ask(url: string): Promise<{ answered: boolean; bytes: string }> {
  return new Promise((resolve) => {
    const s = net.connect(Number(new URL(url).port), '127.0.0.1', () => s.write(REQUEST));
    sockets.push(s);
    let bytes = '';
    const done = (answered: boolean) => {
      s.removeAllListeners('data');
      resolve({ answered, bytes });
    };
    s.on('data', (d) => {
      bytes += d.toString('latin1');
      if (bytes.startsWith('HTTP/1.1 200') && bytes.endsWith('data: [DONE]\n\n\r\n0\r\n\r\n')) done(true);
    });
    s.on('error', () => undefined); // a reset is a closed connection too
    s.on('close', () => done(false));
  });
}

/** The one series of a metric with no labels of its own (undefined when it has none). */
const single = async (p: RunningProxy, name: string) => {
  const series = (await scrape(p.metricsUrl)).filter((s) => s.name === name);
  expect(series.length).toBeLessThanOrEqual(1);
  return series[0]?.value;
};
const dropped = (p: RunningProxy) => single(p, 'llm_proxy_connections_dropped_total');
const open = (p: RunningProxy) => single(p, 'llm_proxy_connections_open');

describe('listen.maxConnections', () => {
  it('closes a connection past the cap unread, counts and logs it, and takes new ones once a held one closes; a WebSocket tunnel holds one', async () => {
    const lines: Record<string, unknown>[] = [];
    const p = await start({ listen: { maxConnections: 2 } }, lines);
    expect(lines.find((l) => l.msg === 'listening')).toMatchObject({ maxConnections: 2 });
    expect(await dropped(p)).toBe(0); // there from the start, so that rate() sees the first drop
    expect(await open(p)).toBe(0);
    expect(lines.filter((l) => /file descriptors/.test(String(l.msg)))).toEqual([]); // 2 fit any nofile limit

    // One keep-alive connection that was served and stays open, one Realtime session. Clients on
    // Node's fetch (the OpenAI and Anthropic SDKs) keep it idle for what the proxy announces, less 2 s.
    const first = await ask(p.proxyUrl);
    expect(first).toMatchObject({ answered: true });
    expect(first.bytes).toMatch(/\r\nKeep-Alive: timeout=65\r\n/i);
    const ws = new WebSocket(`${p.proxyUrl.replace('http', 'ws')}/v1/realtime?model=cap`);
    await new Promise((resolve, reject) => ws.once('open', resolve).once('error', reject));
    expect(await open(p)).toBe(2);

    // The third: closed with no answer; the upstream never sees its request.
    const before = upstreamRequests;
    expect(await ask(p.proxyUrl)).toEqual({ answered: false, bytes: '' });
    expect(await ask(p.proxyUrl)).toEqual({ answered: false, bytes: '' });
    expect(upstreamRequests).toBe(before);
    expect(await dropped(p)).toBe(2);
    expect(await open(p)).toBe(2); // those closed at the cap were never open
    // One line for the first; the second falls within its 10 s.
    expect(lines.filter((l) => l.msg === LIMIT_LINE)).toEqual([expect.objectContaining({ level: 40, listener: 'proxy', maxConnections: 2, dropped: 1 })]);
    // Neither is a request: no request line, no stream series.
    expect(lines.filter((l) => l.msg === 'request')).toHaveLength(1);

    // The session ends: once its connection has closed, a new one is served. Every attempt
    // refused meanwhile is counted too.
    ws.close();
    await new Promise((resolve) => ws.once('close', resolve));
    let refused = 0;
    let served = false;
    for (const until = Date.now() + 5000; !served && Date.now() < until; ) {
      served = (await ask(p.proxyUrl)).answered;
      if (!served) {
        refused++;
        await sleep(20);
      }
    }
    expect(served).toBe(true);
    expect(await dropped(p)).toBe(2 + refused);
    expect(await open(p)).toBe(2);
    expect(lines.filter((l) => l.msg === 'request')).toHaveLength(2);

    // At close, the drops still waiting for their 10 s are logged: every drop is in a line.
    await p.close();
    const told = lines.filter((l) => l.msg === LIMIT_LINE);
    expect(told.length).toBeGreaterThanOrEqual(2);
    expect(told.reduce((sum, l) => sum + (l.dropped as number), 0)).toBe(2 + refused);
  });

  it('the official SDKs see a closed connection, retry it, and each attempt is counted', async () => {
    const lines: Record<string, unknown>[] = [];
    const p = await start({ listen: { maxConnections: 1 } }, lines);
    expect(await ask(p.proxyUrl)).toMatchObject({ answered: true }); // holds the one connection
    // Their default retries: two, after ~0.5 and ~1 s.
    const openai = new OpenAI({ baseURL: `${p.proxyUrl}/v1`, apiKey: 'sk-sim', timeout: 10_000 });
    const a = await openai.chat.completions.create({ model: 'cap', messages: [{ role: 'user', content: 'hi' }], stream: true }).catch((e: unknown) => e);
    expect(a).toBeInstanceOf(OpenAI.APIConnectionError);
    expect(await dropped(p)).toBe(3); // the first attempt and two retries
    const anthropic = new Anthropic({ baseURL: p.proxyUrl, apiKey: 'sk-ant-sim', timeout: 10_000 });
    const b = await anthropic.messages.create({ model: 'claude-cap', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }], stream: true }).catch((e: unknown) => e);
    expect(b).toBeInstanceOf(Anthropic.APIConnectionError);
    expect(await dropped(p)).toBe(6);
    expect(upstreamRequests).toBe(1);
  });

  it('above what the process\'s descriptors allow, is said at start, with the cap that would fit (three descriptors a stream with the built-in simulator)', async () => {
    const files = openFileLimit();
    // The limit itself: over it with either count, whatever the hard limit Node raised it to.
    const cap = files ?? 10_000_000;
    const file = { listen: { maxConnections: cap } };
    const lines: Record<string, unknown>[] = [];
    await start(file, lines);
    await proxy!.close();
    const simLines: Record<string, unknown>[] = [];
    proxy = await startTestProxy(undefined, file, { logLevel: 'info', logLines: simLines });
    expect(proxy.simulator).toBeDefined();
    for (const [logged, perStream] of [[lines, 2], [simLines, 3]] as const) {
      const warned = logged.filter((l) => /file descriptors/.test(String(l.msg)));
      if (files === undefined) expect(warned).toEqual([]); // not Linux, or no limit
      else {
        expect(warned).toEqual([expect.objectContaining({ level: 40, maxConnections: cap, openFileLimit: files })]);
        expect(String(warned[0]!.msg)).toContain(`needs ~${perStream * cap + 100} file descriptors (${perStream === 2 ? 'two' : 'three'} per stream`);
        expect(String(warned[0]!.msg)).toContain(`lower the cap to ${Math.floor((files - 100) / perStream)} or less`);
      }
    }
  });

  it('is off by default: no cap, no counter series', async () => {
    const lines: Record<string, unknown>[] = [];
    const p = await start({}, lines);
    expect(lines.find((l) => l.msg === 'listening')).not.toHaveProperty('maxConnections');
    const answers = await Promise.all(Array.from({ length: 20 }, () => ask(p.proxyUrl)));
    expect(answers.every((a) => a.answered)).toBe(true);
    expect(await open(p)).toBe(20); // kept alive, each
    for (const s of sockets.splice(0)) s.destroy();
    await expect.poll(() => open(p), { timeout: 5000 }).toBe(0);
    const text = await (await fetch(`${p.metricsUrl}/metrics`)).text();
    // Its HELP and TYPE lines, as every instrument has, but no series.
    expect(text).toContain('# TYPE llm_proxy_connections_dropped_total counter');
    expect(parseProm(text).filter((s) => s.name.startsWith('llm_proxy_connections_dropped'))).toEqual([]);
  });
});
