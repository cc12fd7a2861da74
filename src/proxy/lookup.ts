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

type Waiter = { all: boolean; cb: Callback };

export class SharedLookup {
  private readonly pending = new Map<string, Waiter[]>();

  constructor(private readonly resolve: Resolve = dns.lookup as unknown as Resolve) {}

  /** A `lookup` for net.connect / tls.connect. */
  readonly lookup: LookupFunction = (hostname, options, callback) => {
    const family = typeof options.family === 'number' ? options.family : options.family === 'IPv6' ? 6 : options.family === 'IPv4' ? 4 : 0;
    const hints = options.hints ?? 0;
    // Every address is looked up once for all waiters; each gets the form it asked for.
    const key = `${hostname}\n${family}\n${hints}`;
    const waiter: Waiter = { all: options.all === true, cb: callback as Callback };
    const waiting = this.pending.get(key);
    if (waiting !== undefined) {
      waiting.push(waiter);
      return;
    }
    const list = [waiter];
    this.pending.set(key, list);
    let answered = false;
    let waiterThrew: { e: unknown } | undefined;
    const answer = (err: NodeJS.ErrnoException | null | undefined, addresses: dns.LookupAddress[] | undefined) => {
      // A resolver that calls back twice (or throws after calling back) is heard once.
      if (answered) return;
      answered = true;
      if (this.pending.get(key) === list) this.pending.delete(key);
      err ??= null;
      if (err === null && (addresses === undefined || addresses.length === 0)) {
        err = Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND', hostname });
      }
      // A waiter that throws does not keep the others from their answer; its error is rethrown after.
      for (const w of list) {
        try {
          if (err !== null) w.cb(err, w.all ? [] : '', undefined);
          else if (w.all) w.cb(null, addresses!);
          else w.cb(null, addresses![0]!.address, addresses![0]!.family);
        } catch (e) {
          waiterThrew ??= { e };
        }
      }
      if (waiterThrew !== undefined) throw waiterThrew.e;
    };
    try {
      // No `verbatim`/`order`: the process default applies (--dns-result-order, dns.setDefaultResultOrder).
      this.resolve(hostname, { all: true, family, hints } as dns.LookupAllOptions, answer);
    } catch (e) {
      // A waiter's own error (from an answer given synchronously) goes on; the resolver's is the
      // waiters' answer, unless it threw after answering: then it is dropped, as its second answer would be.
      if (waiterThrew !== undefined && e === waiterThrew.e) throw e;
      answer(e as NodeJS.ErrnoException, undefined);
    }
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
