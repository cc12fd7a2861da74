/**
 * Errors that are the proxy's own state, not the provider's: a connection it could not open for
 * want of file descriptors, buffers or memory. Answered 503 `proxy_out_of_resources` (as any
 * server that cannot take more now), where `upstream_unreachable` would blame the upstream.
 */
const OUT_OF_RESOURCES: ReadonlyMap<string, string> = new Map([
  ['EMFILE', 'file descriptors'],
  ['ENFILE', 'file descriptors'],
  ['ENOBUFS', 'buffer space'],
  ['ENOMEM', 'memory'],
]);

/**
 * What the proxy ran out of when `err` (or the error it wraps: an egress proxy's failure keeps the
 * socket's as its `cause`) says so; undefined for any other error. With the system code.
 */
export function lackOf(err: unknown): Lack | undefined {
  // The connection that failed was to the egress proxy when an egress error wraps the code.
  const hop = (err as Error | undefined)?.name === 'EgressProxyError' ? 'the egress proxy' : 'the upstream';
  for (let e = err as { code?: unknown; cause?: unknown } | undefined, depth = 0; e !== undefined && e !== null && depth < 3; e = e.cause as typeof e, depth++) {
    const lacking = typeof e.code === 'string' ? OUT_OF_RESOURCES.get(e.code) : undefined;
    if (lacking !== undefined) return { code: e.code as string, lacking, hop };
  }
  return undefined;
}

export interface Lack {
  code: string;
  lacking: string;
  /** Where the connection was to be opened. */
  hop: string;
}

/** The proxy's own 503 message for it. */
export function lackMessage(lack: Lack): string {
  return `the proxy could not open a connection to ${lack.hop}: ${lack.code} (out of ${lack.lacking})`;
}
