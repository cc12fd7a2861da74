import { createHash, type Hash } from 'node:crypto';
import type { Server, ServerResponse } from 'node:http';
import { requestSent } from './bands.js';

/** Hashes every response body a Node server writes (before transfer coding), in order of completion. */
export function recordResponses(server: Server): string[] {
  const hashes: string[] = [];
  server.prependListener('request', (_req, res: ServerResponse) => {
    const h: Hash = createHash('sha256');
    const write = res.write.bind(res) as (...a: unknown[]) => boolean;
    const end = res.end.bind(res) as (...a: unknown[]) => ServerResponse;
    const feed = (chunk: unknown) => {
      if (typeof chunk === 'string') h.update(chunk, 'utf8');
      else if (chunk instanceof Uint8Array) h.update(chunk);
    };
    (res as { write: unknown }).write = (chunk: unknown, ...rest: unknown[]) => {
      feed(chunk);
      return write(chunk, ...rest);
    };
    (res as { end: unknown }).end = (chunk?: unknown, ...rest: unknown[]) => {
      if (chunk !== undefined && typeof chunk !== 'function') feed(chunk);
      hashes.push(h.digest('hex'));
      return end(chunk, ...rest);
    };
  });
  return hashes;
}

/**
 * A fetch (over `base`, the global one by default) that hashes each response body as the client
 * reads it. Like `stampingFetch`, it stamps when a request went to it, and it stamps that
 * ClientTimes' `bodyEnd` when the body has ended.
 */
export function hashingFetch(hashes: Promise<string>[], base: typeof fetch = fetch): typeof fetch {
  return async (input, init) => {
    const times = requestSent();
    const res = await base(input, init);
    if (!res.body) return res;
    const [a, b] = res.body.tee();
    hashes.push(
      (async () => {
        const h = createHash('sha256');
        const reader = b.getReader();
        try {
          for (;;) {
            const { done, value } = await reader.read();
            if (done) {
              if (times) times.bodyEnd = performance.now();
              break;
            }
            h.update(value);
          }
        } catch {
          return 'aborted';
        }
        return h.digest('hex');
      })(),
    );
    return new Response(a, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}
