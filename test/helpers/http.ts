import http, { type IncomingMessage } from 'node:http';

/**
 * Hop-by-hop fields (RFC 9110 §7.6.1, and the obsolete Keep-Alive and Proxy-Connection), kept
 * here apart from the proxy's own list so that the tests do not judge it by itself.
 */
export const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/** A raw HTTP/1.1 exchange, so nothing (no fetch, no decompression) stands between the test and the bytes. */
export function rawRequest(url: string, path: string, opts: { method?: string; headers?: Record<string, string>; body?: Buffer } = {}) {
  return new Promise<{ status: number; rawHeaders: string[]; body: Buffer; res: IncomingMessage }>((resolve, reject) => {
    const req = http.request(url + path, { method: opts.method ?? 'GET', headers: opts.headers, agent: false }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (d: Buffer) => parts.push(d));
      res.on('end', () => resolve({ status: res.statusCode!, rawHeaders: res.rawHeaders, body: Buffer.concat(parts), res }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(opts.body);
  });
}
