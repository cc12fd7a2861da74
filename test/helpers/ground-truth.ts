import { createHash } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';

/**
 * An OpenAI-compatible upstream written independently of src/simulate: it
 * emits `tokens` content chunks at t0 + ttft + k·itl (absolute schedule),
 * and records the exact bytes and the send times of every response, so tests
 * compare what the proxy measured with what was really sent.
 */
export interface GroundTruthOptions {
  ttftMs: number;
  itlMs: number;
  tokens: number;
  /** Send a usage chunk even when the client did not ask for it. */
  alwaysUsage?: boolean;
  /**
   * Report this many rejected prediction tokens (OpenAI's Predicted Outputs: counted in
   * `completion_tokens`, never streamed) in the usage chunk.
   */
  rejectedPredictionTokens?: number;
  /**
   * Answer CORS as vLLM's default does: `OPTIONS` with 204 and the requested method and headers,
   * `Access-Control-Allow-Origin: *` on every answer (for pages on another origin).
   */
  cors?: boolean;
}

export interface SentStream {
  sha256: string;
  bytes: number;
  contentSendTimes: number[];
  t0: number;
  /** Bytes of the request body it answered. */
  requestBytes: number;
}

/** A stream whose connection closed before its last byte was written (performance.now(), ms). */
export interface CutStream {
  t0: number;
  contentSendTimes: number[];
  closedAt: number;
}

export async function startGroundTruth(opts: GroundTruthOptions) {
  const sent: SentStream[] = [];
  const cut: CutStream[] = [];
  /** The request headers of each CORS preflight answered (with `cors`). */
  const preflights: http.IncomingHttpHeaders[] = [];
  const server = http.createServer((req, res) => {
    const t0 = performance.now();
    if (opts.cors) {
      res.setHeader('Access-Control-Allow-Origin', '*');
      if (req.method === 'OPTIONS') {
        preflights.push(req.headers);
        res.writeHead(204, {
          'Access-Control-Allow-Methods': req.headers['access-control-request-method'] ?? 'POST',
          'Access-Control-Allow-Headers': req.headers['access-control-request-headers'] ?? '',
          'Access-Control-Max-Age': '600',
        });
        res.end();
        return;
      }
    }
    let body = '';
    let requestBytes = 0;
    req.on('data', (d: Buffer) => {
      requestBytes += d.length;
      body += d.toString();
    });
    req.on('end', () => {
      const parsed = JSON.parse(body || '{}') as { stream?: boolean; model?: string; stream_options?: { include_usage?: boolean } };
      const hash = createHash('sha256');
      let bytes = 0;
      const times: number[] = [];
      const write = (s: string) => {
        hash.update(s);
        bytes += Buffer.byteLength(s);
        res.write(s);
      };
      res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', 'X-Ground-Truth': '1' });
      const frame = (delta: object, finish: string | null = null) =>
        `data: ${JSON.stringify({ id: 'gt-1', object: 'chat.completion.chunk', created: 1, model: parsed.model ?? 'gt', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
      write(frame({ role: 'assistant', content: '' }));
      let k = 0;
      let timer: NodeJS.Timeout | undefined;
      let ended = false;
      const step = () => {
        const now = performance.now();
        while (k < opts.tokens && t0 + opts.ttftMs + k * opts.itlMs <= now) {
          times.push(performance.now());
          write(frame({ content: `w${k} ` }));
          k++;
        }
        if (k < opts.tokens) {
          timer = setTimeout(step, Math.max(0, t0 + opts.ttftMs + k * opts.itlMs - performance.now()));
          return;
        }
        write(frame({}, 'stop'));
        if (opts.alwaysUsage || parsed.stream_options?.include_usage) {
          const rejected = opts.rejectedPredictionTokens;
          const completion = opts.tokens + (rejected ?? 0);
          const details = rejected === undefined ? {} : { completion_tokens_details: { accepted_prediction_tokens: 0, rejected_prediction_tokens: rejected } };
          write(`data: ${JSON.stringify({ id: 'gt-1', object: 'chat.completion.chunk', created: 1, model: parsed.model ?? 'gt', choices: [], usage: { prompt_tokens: 3, completion_tokens: completion, total_tokens: completion + 3, ...details } })}\n\n`);
        }
        write('data: [DONE]\n\n');
        res.end();
        ended = true;
        sent.push({ sha256: hash.digest('hex'), bytes, contentSendTimes: times, t0, requestBytes });
      };
      timer = setTimeout(step, opts.ttftMs);
      res.on('close', () => {
        clearTimeout(timer);
        if (!ended) cut.push({ t0, contentSendTimes: times, closedAt: performance.now() });
      });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    sent,
    cut,
    preflights,
    close: () => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}
