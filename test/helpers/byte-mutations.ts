import type { Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import { splitAt } from './ranges.js';

// Mutations of a peer's bytes for the fuzz tests: a byte string with bytes replaced,
// inserted, deleted or repeated, the inserted ones drawn from the bytes that change how HTTP/1.1
// and its payloads are read (`nasty`) or any.

export type Mutation = { op: 'replace' | 'insert' | 'delete' | 'repeat'; at: number; len: number; s: string };

export function mutationArb(nasty: string[]): fc.Arbitrary<Mutation> {
  return fc.record({
    op: fc.constantFrom('replace', 'insert', 'delete', 'repeat'),
    at: fc.nat(),
    len: fc.integer({ min: 1, max: 40 }),
    s: fc.oneof(fc.constantFrom(...nasty), fc.string({ unit: 'binary-ascii', minLength: 1, maxLength: 4 })),
  });
}

/** `text` (latin1: one char per byte) with the mutation applied at `at` modulo its length. */
export function mutate(text: string, m: Mutation): string {
  const at = m.at % (text.length + 1);
  switch (m.op) {
    case 'replace':
      return text.slice(0, at) + m.s + text.slice(at + m.s.length);
    case 'insert':
      return text.slice(0, at) + m.s + text.slice(at);
    case 'delete':
      return text.slice(0, at) + text.slice(at + m.len);
    case 'repeat':
      return text.slice(0, at + m.len) + text.slice(at, at + m.len) + text.slice(at + m.len);
  }
}

/** `body` in chunked framing, cut at the given points (each taken modulo its length). */
export function chunked(body: string, cuts: number[]): string {
  const at = [...new Set(cuts.map((c) => c % Math.max(body.length, 1)))].sort((a, b) => a - b);
  let out = '';
  let from = 0;
  for (const to of [...at, body.length]) {
    if (to === from) continue;
    out += `${(to - from).toString(16)}\r\n${body.slice(from, to)}\r\n`;
    from = to;
  }
  return out + '0\r\n\r\n';
}

/** Writes `bytes` to the socket in the pieces `cuts` makes, 1 ms apart; false if the socket went away first. */
export async function writeInPieces(sock: Socket, bytes: Buffer, cuts: number[]): Promise<boolean> {
  for (const p of splitAt(bytes, cuts, true)) {
    if (sock.destroyed) return false;
    sock.write(p);
    await sleep(1);
  }
  return true;
}
