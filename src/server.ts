import { serve, type HttpBindings } from '@hono/node-server';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { Hono } from 'hono';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Telemetry } from './metrics/exporter.js';
import type { Forwarder } from './proxy/forward.js';

/**
 * The proxy app: one catch-all route. The forwarder works on Node's raw
 * request/response (through Hono's Node bindings) so bytes are piped with
 * backpressure and without a Web-stream hop per chunk.
 */
export function createProxyApp(forwarder: Forwarder): Hono<{ Bindings: HttpBindings }> {
  const app = new Hono<{ Bindings: HttpBindings }>();
  app.all('*', (c) => {
    forwarder.handle(c.env.incoming, c.env.outgoing);
    return RESPONSE_ALREADY_SENT;
  });
  return app;
}

export interface Health {
  ready(): boolean;
}

/** Metrics and health on their own port; never forwarded upstream. */
export function createMetricsApp(telemetry: Telemetry | undefined, health: Health): Hono {
  const app = new Hono();
  app.get('/metrics', async (c) => {
    if (!telemetry?.scrape) {
      return c.text('# metrics are disabled or pushed over OTLP only\n', 200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' });
    }
    try {
      const text = await telemetry.scrape();
      return c.body(text, 200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' });
    } catch (e) {
      return c.text(`# collection failed: ${(e as Error).message}\n`, 500);
    }
  });
  app.get('/healthz', (c) => c.json({ status: 'ok' }));
  app.get('/readyz', (c) => (health.ready() ? c.json({ status: 'ready' }) : c.json({ status: 'draining' }, 503)));
  app.notFound((c) => c.json({ error: 'not found', endpoints: ['/metrics', '/healthz', '/readyz'] }, 404));
  return app;
}

/** Starts a Hono app on Node; resolves with the server and its URL once listening. */
export function listen(
  app: { fetch: (req: Request, env: HttpBindings) => Response | Promise<Response> },
  port: number,
  host: string,
  keepAliveSeconds?: number,
): Promise<{ server: Server; url: string }> {
  return new Promise((resolve, reject) => {
    const server = serve(
      { fetch: app.fetch as never, port, hostname: host, autoCleanupIncoming: false, overrideGlobalObjects: false },
      (info: AddressInfo) => {
        const h = info.family === 'IPv6' ? `[${info.address}]` : info.address;
        resolve({ server: server as Server, url: `http://${h}:${info.port}` });
      },
    ) as Server;
    // Node closes idle keep-alive connections after 5 s, so a client reusing one at
    // that moment gets ECONNRESET; the proxy keeps them longer than clients do.
    if (keepAliveSeconds !== undefined) server.keepAliveTimeout = keepAliveSeconds * 1000;
    // Node keeps only the first 2,000 rawHeaders entries (1,000 fields) but frames the body by
    // a Content-Length or Transfer-Encoding it dropped: a forwarded request would then lose its
    // framing. No count limit; the 16 KiB head size limit still bounds the fields.
    server.maxHeadersCount = 0;
    server.once('error', reject);
  });
}
