import type { RouteConfig } from '../config.js';
import { providerNameForHost } from '../providers/detect.js';
import { egressFor, NO_EGRESS, type EgressSettings } from './egress.js';
import { serverName } from './lookup.js';
import type { Origin } from './upstream.js';

export interface ResolvedRoute {
  readonly route: RouteConfig;
  readonly upstream: URL;
  /** Upstream base path without a trailing slash ("" for "/"). */
  readonly basePath: string;
  /** `gen_ai.provider.name` from the route or the upstream host, when either says; else the API's default. */
  readonly providerName: string | undefined;
  /**
   * The provider names the route gives (its `providerName`, and the one its upstream host
   * implies): what picks the API on a path several APIs use (`detectApi`).
   */
  readonly providerNames: readonly string[];
  /** Where the upstream client connects. */
  readonly origin: Origin;
  /** The `server.address` label: the host, without a fully qualified name's trailing dot. */
  readonly serverAddress: string;
}

export interface RouteMatch {
  readonly resolved: ResolvedRoute;
  /** Path and query to request from the upstream. */
  readonly upstreamPath: string;
}

/**
 * Longest-prefix routing on path-segment boundaries. The destination is always
 * a configured upstream: nothing in the request (Host, absolute-form target)
 * can choose it.
 */
export class Router {
  /** Longest prefix first. */
  readonly routes: readonly ResolvedRoute[];

  constructor(routes: readonly RouteConfig[], egress: EgressSettings = NO_EGRESS) {
    this.routes = routes
      .map((route) => {
        const upstream = new URL(route.upstream);
        const origin = upstreamOrigin(upstream, egress);
        const serverAddress = serverName(origin.host) ?? origin.host;
        const hostName = providerNameForHost(serverAddress);
        return {
          route,
          upstream,
          basePath: upstream.pathname.replace(/\/+$/, ''),
          providerName: route.providerName ?? hostName,
          providerNames: [route.providerName, hostName].filter((n): n is string => n !== undefined),
          origin,
          serverAddress,
        };
      })
      .sort((a, b) => b.route.prefix.length - a.route.prefix.length);
  }

  /** `target` is the request target as received (origin-form or absolute-form). */
  match(target: string): RouteMatch | undefined {
    const pathAndQuery = originForm(target);
    if (pathAndQuery === undefined) return undefined;
    const q = pathAndQuery.indexOf('?');
    const path = q === -1 ? pathAndQuery : pathAndQuery.slice(0, q);
    const query = q === -1 ? '' : pathAndQuery.slice(q);
    for (const r of this.routes) {
      const prefix = r.route.prefix;
      let rest: string;
      if (prefix === '/') rest = path;
      else if (path === prefix) rest = '';
      else if (path.startsWith(prefix) && path.charCodeAt(prefix.length) === 47 /* / */) rest = path.slice(prefix.length);
      else continue;
      const forwarded = r.route.stripPrefix ? rest : path;
      const joined = r.basePath + (forwarded.startsWith('/') || forwarded === '' ? forwarded : `/${forwarded}`);
      return { resolved: r, upstreamPath: (joined === '' ? '/' : joined) + query };
    }
    return undefined;
  }
}

/** Where the upstream client connects for an upstream URL, and through which egress proxy. */
export function upstreamOrigin(upstream: URL, egress: EgressSettings): Origin {
  const host = upstream.hostname.replace(/^\[|\]$/g, '');
  const port = upstream.port === '' ? (upstream.protocol === 'https:' ? 443 : 80) : Number(upstream.port);
  return { protocol: upstream.protocol, host, port, via: egressFor(egress, upstream.protocol, host, port) };
}

/** Path and query of a request target; undefined for `*` or garbage (an empty host too). */
export function originForm(target: string): string | undefined {
  // A fragment is not part of a request target (RFC 9112 §3.2): never sent on.
  if (target.startsWith('/')) return target.includes('#') ? target.slice(0, target.indexOf('#')) : target;
  const authority = /^https?:\/\/[^/?#]*/i.exec(target);
  // An empty host (`http:///v1/...`) is invalid (RFC 9110 §4.2.1); URL would read `v1` as one.
  if (authority !== null && targetAuthority(target) !== undefined) {
    try {
      new URL(target); // a valid URL, but its path and query are taken as sent: URL would re-encode them
    } catch {
      return undefined;
    }
    let rest = target.slice(authority[0].length);
    if (rest.includes('#')) rest = rest.slice(0, rest.indexOf('#'));
    return rest.startsWith('/') ? rest : `/${rest}`;
  }
  return undefined;
}

/**
 * The authority of an absolute-form target (`POST http://host:port/v1/...`, as a client that takes
 * the proxy for a forward proxy sends), without its userinfo; undefined for origin-form. RFC 9112
 * §3.2.2: it, not the Host field, is the host the client asked for. Not a check of the target:
 * the router's (`originForm`) has judged it by then.
 */
export function targetAuthority(target: string): string | undefined {
  const m = /^https?:\/\/([^/?#]*)/i.exec(target);
  if (m === null) return undefined;
  const authority = m[1]!.slice(m[1]!.lastIndexOf('@') + 1);
  return authority === '' ? undefined : authority;
}

/**
 * The target without its query string, for logs: queries can carry keys (`?key=` for Gemini),
 * and without the userinfo of an absolute-form target (`http://user:key@host/...`, RFC 3986
 * §3.2.1), a credential too.
 */
export function safePath(target: string | undefined): string {
  let t = target ?? '';
  if (!t.startsWith('/')) t = t.replace(/^([^/?#]*\/\/)?[^/?#]*@/, '$1');
  const q = t.indexOf('?');
  return (q === -1 ? t : t.slice(0, q)).slice(0, 512);
}
