import dns from 'node:dns';
import net, { type LookupFunction } from 'node:net';

/**
 * Name lookups for upstream connections, one at a time per name. Node resolves a name with
 * getaddrinfo on its thread pool, which runs at most two lookups at once (of four threads)
 * for the whole process, and a lookup cannot be cancelled: a burst of new connections to one
 * provider queued its lookups two by two, and a name whose resolver hangs held a slot per
 * request, so healthy named upstreams timed out behind it (review U). Requests that need the
 * same name while a lookup runs now share it. Nothing is cached after it returns: the system
 * resolver (nscd, systemd-resolved, the cluster's DNS) owns caching and TTLs, and a pooled
 * connection needs no lookup at all.
 */
type Callback = (err: NodeJS.ErrnoException | null, address: string | dns.LookupAddress[], family?: number) => void;
type Resolve = (hostname: string, options: dns.LookupAllOptions, callback: (err: NodeJS.ErrnoException | null, addresses: dns.LookupAddress[]) => void) => void;

export class SharedLookup {
  private readonly pending = new Map<string, Array<{ all: boolean; family: number; cb: Callback }>>();

  constructor(private readonly resolve: Resolve = dns.lookup as unknown as Resolve) {}

  /** A `lookup` for net.connect / tls.connect. */
  readonly lookup: LookupFunction = (hostname, options, callback) => {
    const family = typeof options.family === 'number' ? options.family : options.family === 'IPv6' ? 6 : options.family === 'IPv4' ? 4 : 0;
    const hints = options.hints ?? 0;
    // Every address is looked up once for all waiters; each gets the form it asked for.
    const key = `${hostname}\n${family}\n${hints}`;
    const waiter = { all: options.all === true, family, cb: callback as Callback };
    const waiting = this.pending.get(key);
    if (waiting !== undefined) {
      waiting.push(waiter);
      return;
    }
    this.pending.set(key, [waiter]);
    this.resolve(hostname, { all: true, family, hints, verbatim: true } as dns.LookupAllOptions, (err, addresses) => {
      const list = this.pending.get(key) ?? [];
      this.pending.delete(key);
      for (const w of list) {
        if (err) w.cb(err, w.all ? [] : '', undefined);
        else if (w.all) w.cb(null, addresses);
        else if (addresses.length === 0) w.cb(Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND', hostname }), '', undefined);
        else w.cb(null, addresses[0]!.address, addresses[0]!.family);
      }
    });
  };

  /** Names being looked up now (tests). */
  get inFlight(): number {
    return this.pending.size;
  }
}

/** The process's shared lookup for upstream and egress-proxy connections. */
export const upstreamLookup = new SharedLookup().lookup;

/**
 * The TLS server name for a host: none for an IP literal (RFC 6066 §3), and a fully qualified
 * name without its trailing dot (`api.openai.com.` is sent as `api.openai.com`, as curl does).
 */
export function serverName(host: string): string | undefined {
  if (net.isIP(host) !== 0) return undefined;
  return host.length > 1 && host.endsWith('.') ? host.slice(0, -1) : host;
}

/** What a connect timeout says when the upstream's name never resolved. */
export function lookupUnfinished(host: string): string {
  return `the name lookup of ${host} did not finish`;
}
