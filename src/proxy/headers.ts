/**
 * Header rewriting for a reverse proxy (RFC 9110 §7.6.1): hop-by-hop fields
 * and the fields named in `Connection` are not forwarded. Works on Node's flat
 * `rawHeaders` arrays so case, order and repeated fields (Set-Cookie) survive.
 */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/**
 * `name` equals `lower` (a lower-case field name) ignoring case. Most names differ in
 * length, so most comparisons allocate no lower-cased copy (Node's own servers send
 * `Transfer-Encoding`, `Keep-Alive`, ...: ~2 KiB of garbage per request before).
 */
export function isName(name: string, lower: string): boolean {
  return name.length === lower.length && (name === lower || name.toLowerCase() === lower);
}

/** The field names listed in `Connection` (lower-case), if any. */
export function connectionTokens(raw: readonly string[]): Set<string> | undefined {
  let tokens: Set<string> | undefined;
  for (let i = 0; i < raw.length; i += 2) {
    if (isName(raw[i]!, 'connection')) {
      for (const t of raw[i + 1]!.split(',')) {
        const n = t.trim().toLowerCase();
        if (n !== '') (tokens ??= new Set()).add(n);
      }
    }
  }
  return tokens;
}

/**
 * `raw` minus hop-by-hop fields and those Connection names, minus `drop` (lower-case names),
 * appended to `out` (returned). `keep` names fields kept even so (a tunnel's body framing, a
 * 101's Upgrade).
 */
export function endToEndHeaders(raw: readonly string[], drop?: ReadonlySet<string>, out: string[] = [], keep?: ReadonlySet<string>): string[] {
  const tokens = connectionTokens(raw);
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    const lower = name.toLowerCase();
    if ((HOP_BY_HOP.has(lower) || tokens?.has(lower) || drop?.has(lower)) && !keep?.has(lower)) continue;
    out.push(name, raw[i + 1]!);
  }
  return out;
}

/** How many fields of this name the head has. */
export function countRaw(raw: readonly string[], lowerName: string): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) if (isName(raw[i]!, lowerName)) n++;
  return n;
}

/** First value of a header in a flat raw array. */
export function rawHeader(raw: readonly string[], lowerName: string): string | undefined {
  for (let i = 0; i < raw.length; i += 2) if (isName(raw[i]!, lowerName)) return raw[i + 1];
  return undefined;
}

/**
 * A field's values as one list (RFC 9110 §5.3: repeated fields combine with commas), or
 * undefined when absent. A field sent once is returned as is, without a copy.
 */
export function rawHeaderList(raw: readonly string[], lowerName: string): string | undefined {
  let list: string | undefined;
  for (let i = 0; i < raw.length; i += 2) if (isName(raw[i]!, lowerName)) list = list === undefined ? raw[i + 1]! : `${list},${raw[i + 1]!}`;
  return list;
}

/** Request fields the proxy sets itself rather than copying. */
export const REQUEST_DROP = new Set(['host', 'expect', 'x-forwarded-host', 'x-forwarded-proto', 'content-length']);
