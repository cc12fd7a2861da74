import dns from 'node:dns';
import net, { type LookupFunction } from 'node:net';
import tls from 'node:tls';
import { upstreamLookup } from './lookup.js';
import type { ResolvedRoute } from './routes.js';
import { upstreamTlsContext } from './tls-context.js';

const WARM_UP_HOST = 'warm-up.invalid';

/**
 * What net.connect and tls.connect pass to their `lookup` on this platform (Node's
 * lookupAndConnect: ADDRCONFIG unless on Windows; `all` with family auto-selection), so that a
 * request to a `localhost` upstream while the warm-up's lookup runs shares it (lookup.ts keys
 * on them).
 */
const CONNECT_LOOKUP_OPTIONS = { all: true, hints: process.platform === 'win32' ? 0 : dns.ADDRCONFIG } as const;

/**
 * Work a process does once, on first use, done at start so that the first request's TTFT does
 * not carry it (bench/README.md, "The first connection of a process"): it took the first https
 * request's `upstreamConnectMs` from 14-18 to 10-12 ms on loopback, mostly from before
 * tls.connect returned.
 * - One connection to a listener of its own on 127.0.0.1, made as an upstream connection is
 *   (a name given to a lookup, TLS with the shared context when a route or its egress proxy
 *   uses it), which the listener closes once accepted: Node's connect code and the client side
 *   of TLS up to its first flight run once. The made-up name reaches no resolver.
 * - One lookup of `localhost`, when the proxy resolves any name itself (an upstream's, or its
 *   egress proxy's): it starts libuv's thread pool and the system resolver, which a first
 *   lookup of any name pays. Not an upstream's name: Node runs two lookups at a time, and at a
 *   restart during a DNS outage a warm-up lookup of a hanging name nobody asked for would hold
 *   one of the two while requests for another hanging name held the other, and a healthy
 *   upstream's lookup waited for the resolver to give up (review Z2). `localhost` comes from
 *   the hosts file. The answer is not kept and a failure not reported.
 * At most `limitMs`: a connection still not done then is dropped with its listener (no
 * loopback, a listener that never comes up), so nothing of it outlives the warm-up.
 */
export async function warmUp(routes: readonly ResolvedRoute[], { lookup = upstreamLookup, limitMs = 1000 }: { lookup?: LookupFunction; limitMs?: number } = {}): Promise<void> {
  if (routes.some(({ origin }) => net.isIP(origin.via?.host ?? origin.host) === 0)) {
    try {
      lookup('localhost', CONNECT_LOOKUP_OPTIONS, () => {});
    } catch {
      // A resolver that throws is a request's to report, not the start's.
    }
  }
  const useTls = routes.some((r) => r.origin.protocol === 'https:' || r.origin.via?.protocol === 'https:');
  // Its CA store (~2 ms), even when the connection below cannot be made.
  if (useTls) upstreamTlsContext();
  const self = connectToSelf(useTls);
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    self.done,
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, limitMs);
      timer.unref();
    }),
  ]);
  clearTimeout(timer);
  self.drop();
}

function connectToSelf(useTls: boolean): { done: Promise<void>; drop: () => void } {
  const listener = net.createServer((c) => c.destroy());
  // Both stay referenced: while start-up awaits them they may be all that keeps the process up.
  listener.on('error', () => {});
  let socket: net.Socket | undefined;
  const drop = () => {
    socket?.destroy();
    listener.close();
  };
  const done = (async () => {
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
      const s = useTls
        ? tls.connect({ host: WARM_UP_HOST, port, lookup, secureContext: upstreamTlsContext(), servername: WARM_UP_HOST, ALPNProtocols: ['http/1.1'] })
        : net.connect({ host: WARM_UP_HOST, port, lookup });
      socket = s;
      s.on('error', () => {});
      await new Promise<void>((resolve) => s.once('close', () => resolve()));
    } catch {
      // No loopback to listen on: nothing warmed, nothing else changes.
    } finally {
      drop();
    }
  })();
  return { done, drop };
}
