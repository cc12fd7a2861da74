import net, { type LookupFunction } from 'node:net';
import tls from 'node:tls';
import { upstreamLookup } from './lookup.js';
import type { ResolvedRoute } from './routes.js';
import { upstreamTlsContext } from './tls-context.js';

const WARM_UP_HOST = 'warm-up.invalid';

/**
 * Work a process does once, on first use, done at start so that the first request's TTFT does
 * not carry it (bench/README.md, "The first connection of a process"): it took the first https
 * request's `upstreamConnectMs` from 14-17 to 10-11 ms on loopback, mostly from before
 * tls.connect returned.
 * - One connection to a listener of its own on 127.0.0.1, made as an upstream connection is
 *   (a name given to a lookup, TLS with the shared context when a route or its egress proxy
 *   uses it) and closed by the listener after accepting it: Node's connect and TLS code run
 *   once. The name never reaches a resolver.
 * - One lookup of every name the proxy itself resolves (an upstream's, or its egress proxy's),
 *   which starts libuv's thread pool and the system resolver; nginx resolves its upstreams'
 *   names at start too. The answers are not kept and a failure is not reported: a request
 *   looks its name up again and says why it failed.
 * A warm-up that fails or hangs (no loopback) costs at most `limitMs` and is otherwise ignored.
 */
export async function warmUp(routes: readonly ResolvedRoute[], { lookup = upstreamLookup, limitMs = 1000 }: { lookup?: LookupFunction; limitMs?: number } = {}): Promise<void> {
  const names = new Set<string>();
  for (const { origin } of routes) {
    // Behind an egress proxy the proxy resolves the upstream's name.
    const host = origin.via?.host ?? origin.host;
    if (net.isIP(host) === 0) names.add(host);
  }
  for (const name of names) lookup(name, { all: true }, () => {});
  const useTls = routes.some((r) => r.origin.protocol === 'https:' || r.origin.via?.protocol === 'https:');
  // Its CA store (~2 ms), even when the connection below cannot be made.
  if (useTls) upstreamTlsContext();
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    connectToSelf(useTls),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, limitMs);
      timer.unref();
    }),
  ]);
  clearTimeout(timer);
}

async function connectToSelf(useTls: boolean): Promise<void> {
  const listener = net.createServer((c) => c.destroy());
  let socket: net.Socket | undefined;
  try {
    await new Promise<void>((resolve, reject) => {
      listener.once('error', reject);
      listener.listen(0, '127.0.0.1', resolve);
    });
    const port = (listener.address() as net.AddressInfo).port;
    const lookup: LookupFunction = (_name, options, callback) => {
      if (options.all === true) callback(null, [{ address: '127.0.0.1', family: 4 }]);
      else callback(null, '127.0.0.1', 4);
    };
    socket = useTls
      ? tls.connect({ host: WARM_UP_HOST, port, lookup, secureContext: upstreamTlsContext(), servername: WARM_UP_HOST, ALPNProtocols: ['http/1.1'] })
      : net.connect({ host: WARM_UP_HOST, port, lookup });
    const s = socket;
    await new Promise<void>((resolve) => {
      s.once('close', () => resolve());
      s.on('error', () => {});
    });
  } catch {
    // No loopback to listen on: nothing warmed, nothing else changes.
  } finally {
    socket?.destroy();
    listener.close();
  }
}
