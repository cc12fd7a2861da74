import { describe, expect, it } from 'vitest';
import { HttpParseError, keepAliveHintMs, parseResponseHead, responseFraming, reusable } from '../../src/proxy/http1.js';

const head = (lines: string[], status = 'HTTP/1.1 200 OK') => parseResponseHead(Buffer.from(`${status}\r\n${lines.map((l) => `${l}\r\n`).join('')}\r\n`, 'latin1'));

describe('response head: fields as they were sent, without the optional white space around values', () => {
  it('trims spaces and tabs on both sides of a value (RFC 9112 §5: OWS), and nothing else: not a no-break space, not inner white space', () => {
    const h = head(['X-A:  one \t', 'x-b:\ttwo', 'X-C: \u00a0three\u00a0 ', 'X-D: a \t b', 'X-Empty: \t ', 'X-Last:four'], 'HTTP/1.1 200 Very  OK');
    expect(h.rawHeaders).toEqual(['X-A', 'one', 'x-b', 'two', 'X-C', '\u00a0three\u00a0', 'X-D', 'a \t b', 'X-Empty', '', 'X-Last', 'four']);
    expect([h.minor, h.status, h.statusText]).toEqual([1, 200, 'Very  OK']);
  });
});

describe('response head: framing and reuse read repeated fields as one list, names in any case', () => {
  it('Transfer-Encoding: chunked alone is accepted (any case, any field count of one); any other coding is an error', () => {
    expect(responseFraming(head(['Transfer-Encoding: chunked']), 'POST')).toEqual({ kind: 'chunked' });
    expect(responseFraming(head(['transfer-encoding:  Chunked ']), 'POST')).toEqual({ kind: 'chunked' });
    // The field is hop-by-hop: a coding other than chunked would reach the client unlabelled (nginx: 502).
    for (const te of [['TRANSFER-ENCODING: gzip', 'transfer-encoding: Chunked'], ['Transfer-Encoding: gzip, chunked'], ['Transfer-Encoding: chunked, gzip'], ['Transfer-Encoding: chunked', 'Transfer-Encoding: chunked'], ['Transfer-Encoding: gzip'], ['Transfer-Encoding: identity']]) {
      expect(() => responseFraming(head(te), 'POST'), te.join(' | ')).toThrow(HttpParseError);
    }
    // The transfer coding wins over a Content-Length, even an empty one (which is refused as a coding).
    expect(responseFraming(head(['Content-Length: 5', 'Transfer-Encoding: chunked']), 'POST')).toEqual({ kind: 'chunked' });
    expect(() => responseFraming(head(['Transfer-Encoding:', 'Content-Length: 5']), 'POST')).toThrow(HttpParseError);
  });

  it('Content-Length: repeated equal values are one length, different ones are an error', () => {
    expect(responseFraming(head(['Content-Length: 5']), 'POST')).toEqual({ kind: 'length', length: 5 });
    expect(responseFraming(head(['content-length: 5', 'CONTENT-LENGTH: 5, 5']), 'POST')).toEqual({ kind: 'length', length: 5 });
    expect(() => responseFraming(head(['Content-Length: 5', 'Content-Length: 6']), 'POST')).toThrow(HttpParseError);
    expect(() => responseFraming(head(['Content-Length: -1']), 'POST')).toThrow(HttpParseError);
    expect(() => responseFraming(head(['Content-Length:']), 'POST')).toThrow(HttpParseError); // present but empty
    expect(responseFraming(head([]), 'POST')).toEqual({ kind: 'close' });
  });

  it('Connection: close in any field or case ends reuse; HTTP/1.0 needs keep-alive', () => {
    const chunked = { kind: 'chunked' } as const;
    expect(reusable(head(['Transfer-Encoding: chunked']), chunked)).toBe(true);
    expect(reusable(head(['Connection: Keep-Alive', 'connection: X-Foo, Close']), chunked)).toBe(false);
    expect(reusable(head(['Connection: closed']), chunked)).toBe(true); // a different token
    expect(reusable(head([], 'HTTP/1.0 200 OK'), { kind: 'length', length: 0 })).toBe(false);
    expect(reusable(head(['CONNECTION: keep-alive'], 'HTTP/1.0 200 OK'), { kind: 'length', length: 0 })).toBe(true);
  });

  it('faulty framing ends reuse: Transfer-Encoding in HTTP/1.0, or beside a Content-Length', () => {
    const chunked = { kind: 'chunked' } as const;
    expect(reusable(head(['Connection: keep-alive', 'Transfer-Encoding: chunked'], 'HTTP/1.0 200 OK'), chunked)).toBe(false);
    expect(reusable(head(['Content-Length: 3', 'Transfer-Encoding: chunked']), chunked)).toBe(false);
    expect(reusable(head(['transfer-encoding: chunked', 'Keep-Alive: timeout=5']), chunked)).toBe(true);
  });

  it('Keep-Alive timeout hint, from any of repeated fields', () => {
    expect(keepAliveHintMs(head(['Keep-Alive: timeout=5']))).toBe(5000);
    expect(keepAliveHintMs(head(['keep-alive: max=100', 'KEEP-ALIVE: Timeout=60']))).toBe(60000);
    expect(keepAliveHintMs(head(['Keep-Alive: max=100']))).toBeUndefined();
    expect(keepAliveHintMs(head([]))).toBeUndefined();
  });
});
