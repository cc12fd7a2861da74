import { randomUUID } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { performance } from 'node:perf_hooks';
import { anthropicFormat } from './formats/anthropic.js';
import { bedrockFormat } from './formats/bedrock.js';
import { geminiFormat } from './formats/gemini.js';
import { ollamaFormat } from './formats/ollama.js';
import { openaiChatFormat } from './formats/openai-chat.js';
import { openaiResponsesFormat } from './formats/openai-responses.js';
import type { WireFormat } from './formats/types.js';
import { handleRealtimeUpgrade } from './realtime.js';
import { PLAN_KEYS, planValueError, rng, scheduleError, tokenTimes, type Plan } from './schedule.js';

export interface SimulatorOptions extends Plan {
  seed?: number;
  /** Wire formats to serve; all of DEFAULT_FORMATS by default. */
  formats?: readonly WireFormat[];
}

export interface Simulator {
  readonly server: http.Server;
  readonly plan: Plan;
  listen(port: number, host: string): Promise<string>;
  close(): Promise<void>;
}

const MAX_BODY = 8 * 1024 * 1024;

/** Every wire format the simulator speaks, at the provider's own paths. */
export const DEFAULT_FORMATS: readonly WireFormat[] = [
  openaiChatFormat,
  openaiResponsesFormat,
  anthropicFormat,
  geminiFormat,
  ollamaFormat,
  bedrockFormat,
];

/**
 * A ground-truth LLM upstream: it emits content events at t0 + ttft + k·itl
 * (plus seeded jitter), so what the proxy measures can be checked against
 * what was scheduled. `GET|PUT /_sim/config` reads or changes the plan.
 */
export function createSimulator(opts: SimulatorOptions): Simulator {
  const plan: Plan = { ttft: opts.ttft, itl: opts.itl, tokens: opts.tokens, jitter: opts.jitter };
  const random = rng(opts.seed ?? (Date.now() & 0xffffffff));
  const formats = opts.formats ?? DEFAULT_FORMATS;

  const server = http.createServer((req, res) => {
    const t0 = performance.now();
    // A page on any origin may call the model APIs (the demo from a browser), as vLLM's default
    // allows; not `/_sim/config`, which a page should not be able to read or PUT.
    if (!(req.url ?? '').startsWith('/_sim/')) res.setHeader('access-control-allow-origin', '*');
    if (req.method === 'OPTIONS' && res.hasHeader('access-control-allow-origin')) {
      req.resume();
      res.writeHead(204, {
        'access-control-allow-methods': 'GET, POST, PUT, OPTIONS',
        'access-control-allow-headers': req.headers['access-control-request-headers'] ?? '*',
        'access-control-max-age': '600',
      });
      res.end();
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size <= MAX_BODY) chunks.push(c);
    });
    req.on('end', () => {
      try {
        route(req, res, t0, size > MAX_BODY ? undefined : Buffer.concat(chunks).toString('utf8'));
      } catch (e) {
        json(res, 500, { error: { type: 'simulator_error', message: (e as Error).message } });
      }
    });
    req.on('error', () => res.destroy());
  });

  // Realtime and Live over WebSocket; their sockets leave the server's tracking, so close() ends them itself.
  const upgraded = new Set<Duplex>();
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    upgraded.add(socket);
    socket.once('close', () => upgraded.delete(socket));
    handleRealtimeUpgrade(req, socket, head, () => plan, random);
  });

  function route(req: IncomingMessage, res: ServerResponse, t0: number, text: string | undefined): void {
    const url = new URL(req.url ?? '/', 'http://sim');
    const method = req.method ?? 'GET';
    if (url.pathname === '/_sim/config') {
      if (method === 'PUT' || method === 'POST') {
        const patch = parseJson(text);
        if (patch === undefined) {
          json(res, 400, { error: { type: 'invalid_request', message: 'expected a JSON object such as {"itl": 0.002}' } });
          return;
        }
        // A misspelt key ("itll") would otherwise change nothing and still answer 200.
        const unknown = Object.keys(patch).filter((k) => !(PLAN_KEYS as readonly string[]).includes(k));
        if (unknown.length > 0) {
          json(res, 400, { error: { type: 'invalid_request', message: `unknown key ${unknown.join(', ')} (known: ${PLAN_KEYS.join(', ')})` } });
          return;
        }
        const next: Plan = { ...plan };
        for (const k of PLAN_KEYS) {
          const v = patch?.[k];
          if (v === undefined) continue;
          const bad = typeof v === 'number' ? planValueError(k, v) : 'expected a number';
          if (bad !== undefined) {
            json(res, 400, { error: { type: 'invalid_request', message: `${k}: ${bad}` } });
            return;
          }
          next[k] = v as number;
        }
        const tooLong = scheduleError(next);
        if (tooLong !== undefined) {
          json(res, 400, { error: { type: 'invalid_request', message: tooLong } });
          return;
        }
        Object.assign(plan, next);
      }
      json(res, 200, plan);
      return;
    }
    if (method === 'GET' && /(?:^|\/)models$/.test(url.pathname)) {
      json(res, 200, { object: 'list', data: [{ id: 'sim-model', object: 'model', created: 0, owned_by: 'llm-latency-proxy' }] });
      return;
    }
    const format = formats.find((f) => f.matches(method, url.pathname));
    if (!format) {
      json(res, 404, { error: { type: 'not_found', message: `the simulator does not serve ${method} ${url.pathname}` } });
      return;
    }
    if (text === undefined) {
      json(res, 413, { error: { type: 'invalid_request', message: 'body too large' } });
      return;
    }
    const body = parseJson(text);
    if (body === undefined) {
      json(res, 400, { error: { type: 'invalid_request_error', message: 'body is not a JSON object' } });
      return;
    }
    const p: Plan = { ...plan };
    // A typo in a test's header must not go unnoticed as the global plan.
    const bad =
      overrideFromHeader(req, 'x-sim-ttft', 'ttft', (v) => (p.ttft = v)) ??
      overrideFromHeader(req, 'x-sim-itl', 'itl', (v) => (p.itl = v)) ??
      overrideFromHeader(req, 'x-sim-tokens', 'tokens', (v) => (p.tokens = v)) ??
      scheduleError(p);
    if (bad !== undefined) {
      json(res, 400, { error: { type: 'invalid_request_error', message: bad } });
      return;
    }
    const cap = format.maxTokens?.(body);
    if (cap !== undefined) p.tokens = Math.min(p.tokens, cap);
    const requestId = randomUUID().replace(/-/g, '').slice(0, 24);
    const capped = cap !== undefined && p.tokens >= cap;
    format.serve({ req, res, path: url.pathname, query: url.searchParams, body, plan: p, times: tokenTimes(p, random), t0, requestId, capped });
  }

  return {
    server,
    plan,
    listen(port, host) {
      return new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => {
          const a = server.address() as AddressInfo;
          resolve(`http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`);
        });
      });
    },
    close() {
      return new Promise((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
        for (const s of upgraded) s.destroy();
      });
    },
  };
}

/** Sets a plan value from a request header; says what is wrong with it, if anything. */
function overrideFromHeader(req: IncomingMessage, name: string, key: (typeof PLAN_KEYS)[number], set: (v: number) => void): string | undefined {
  const v = req.headers[name];
  if (typeof v !== 'string') return undefined;
  const n = v.trim() === '' ? NaN : Number(v);
  const bad = planValueError(key, n);
  if (bad !== undefined) return `${name}: ${bad} (got "${v}")`;
  set(n);
  return undefined;
}

function parseJson(text: string | undefined): Record<string, unknown> | undefined {
  if (text === undefined || text.trim() === '') return {};
  try {
    const v = JSON.parse(text) as unknown;
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

function json(res: ServerResponse, status: number, value: unknown): void {
  const body = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}
