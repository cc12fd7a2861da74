/**
 * The little of HTTP/1.1 (RFC 9112) the upstream client needs: find and parse
 * a response head, decide how its body is delimited and whether the connection
 * may be reused, and write a request head. Strict where a proxy must be (no
 * obs-fold, no conflicting lengths, no control characters that Node would
 * refuse to forward); headers keep their case and order (Node's rawHeaders form).
 */
import { rawHeaderList } from './headers.js';

export class HttpParseError extends Error {}

export interface ResponseHead {
  /** 0 for HTTP/1.0, 1 for HTTP/1.1. */
  minor: number;
  status: number;
  statusText: string;
  rawHeaders: string[];
}

export type BodyFraming =
  | { readonly kind: 'none' }
  | { readonly kind: 'chunked' }
  | { readonly kind: 'length'; readonly length: number }
  | { readonly kind: 'close' };

/** Largest response head accepted (Node's default limit is 16 KiB). */
export const MAX_HEAD_BYTES = 64 * 1024;

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// What Node's own header validation refuses in a value (control characters but HTAB).
const BAD_VALUE = /[^\t\x20-\x7e\x80-\xff]/;
const STATUS_LINE = /^HTTP\/1\.([01]) ([0-9]{3})(?: ([^]*))?$/;

/** Offset just past the blank line that ends a head (CRLF CRLF, or bare LF LF), or -1. */
export function headEnd(buf: Buffer): number {
  let i = buf.indexOf(10);
  while (i !== -1) {
    const next = buf[i + 1];
    if (next === 10) return i + 2;
    if (next === 13 && buf[i + 2] === 10) return i + 3;
    i = buf.indexOf(10, i + 1);
  }
  return -1;
}

/** Parses a response head: the bytes up to and including its blank line. */
export function parseResponseHead(head: Buffer): ResponseHead {
  const lines = head.toString('latin1').split('\n');
  const clean = (l: string) => (l.endsWith('\r') ? l.slice(0, -1) : l);
  const m = STATUS_LINE.exec(clean(lines[0] ?? ''));
  if (!m) throw new HttpParseError('invalid status line');
  const statusText = m[3] ?? '';
  if (BAD_VALUE.test(statusText)) throw new HttpParseError('invalid character in the status line');
  const rawHeaders: string[] = [];
  for (let i = 1; i < lines.length; i++) {
    const line = clean(lines[i]!);
    if (line === '') continue; // the blank line (and the empty string after its LF)
    if (line.charCodeAt(0) === 32 || line.charCodeAt(0) === 9) throw new HttpParseError('obsolete line folding in a header');
    const colon = line.indexOf(':');
    if (colon <= 0) throw new HttpParseError('invalid header line');
    const name = line.slice(0, colon);
    if (!TOKEN.test(name)) throw new HttpParseError(`invalid header name`);
    // Optional whitespace is SP and HTAB only (RFC 9110 §5.5): trim() would also take 0xA0.
    const value = trimOws(line.slice(colon + 1));
    if (BAD_VALUE.test(value)) throw new HttpParseError(`invalid character in header ${name}`);
    rawHeaders.push(name, value);
  }
  const status = Number(m[2]);
  if (status < 100) throw new HttpParseError('invalid status code'); // RFC 9110 §15: 100–599 (Node answers up to 999)
  return { minor: Number(m[1]), status, statusText, rawHeaders };
}

function trimOws(s: string): string {
  let a = 0;
  let b = s.length;
  while (a < b && (s.charCodeAt(a) === 32 || s.charCodeAt(a) === 9)) a++;
  while (b > a && (s.charCodeAt(b - 1) === 32 || s.charCodeAt(b - 1) === 9)) b--;
  return a === 0 && b === s.length ? s : s.slice(a, b);
}

/** How the body of `head`, the answer to a `method` request, is delimited (RFC 9112 §6.3). */
export function responseFraming(head: ResponseHead, method: string): BodyFraming {
  const s = head.status;
  if (method === 'HEAD' || s === 204 || s === 304 || (s >= 100 && s < 200)) return { kind: 'none' };
  // A transfer coding decides over Content-Length: chunked if it is the last one, else read to close.
  const te = rawHeaderList(head.rawHeaders, 'transfer-encoding');
  if (te !== undefined) {
    // Only chunked, as nginx: the field is hop-by-hop, so another coding (gzip, chunked; or a
    // body read to the close) would reach the client coded with nothing saying so.
    if (te.trim().toLowerCase() !== 'chunked') throw new HttpParseError(`unsupported transfer-encoding "${te}"`);
    return { kind: 'chunked' };
  }
  const cl = rawHeaderList(head.rawHeaders, 'content-length');
  if (cl !== undefined) {
    const all = cl.split(',').map((v) => v.trim());
    if (!all.every((v) => /^[0-9]{1,15}$/.test(v)) || new Set(all).size !== 1) {
      throw new HttpParseError('invalid content-length');
    }
    return { kind: 'length', length: Number(all[0]) };
  }
  return { kind: 'close' };
}

/** Whether the connection may carry another request after this response. */
export function reusable(head: ResponseHead, framing: BodyFraming): boolean {
  if (framing.kind === 'close') return false;
  // Faulty framing, read as chunked but not trusted for the next message: Transfer-Encoding in
  // an HTTP/1.0 answer (RFC 9112 §6.1: close after it) or beside a Content-Length (§6.3: a
  // possible response-splitting attempt).
  if (rawHeaderList(head.rawHeaders, 'transfer-encoding') !== undefined && (head.minor === 0 || rawHeaderList(head.rawHeaders, 'content-length') !== undefined)) return false;
  const tokens = rawHeaderList(head.rawHeaders, 'connection')?.toLowerCase() ?? '';
  if (head.minor === 0) return /(^|,)\s*keep-alive\s*(,|$)/.test(tokens);
  return !/(^|,)\s*close\s*(,|$)/.test(tokens);
}

/** The server's `Keep-Alive: timeout=N` hint in ms, if any. */
export function keepAliveHintMs(head: ResponseHead): number | undefined {
  const v = rawHeaderList(head.rawHeaders, 'keep-alive');
  const m = v === undefined ? null : /(?:^|[,\s])timeout\s*=\s*([0-9]+)/i.exec(v);
  return m ? Number(m[1]) * 1000 : undefined;
}

/** A request head in wire form (latin1). Names and values come from Node's parser or the proxy itself. */
export function requestHead(method: string, target: string, rawHeaders: readonly string[]): string {
  let s = `${method} ${target} HTTP/1.1\r\n`;
  for (let i = 0; i < rawHeaders.length; i += 2) s += `${rawHeaders[i]}: ${rawHeaders[i + 1]}\r\n`;
  return `${s}\r\n`;
}
