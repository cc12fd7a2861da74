import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SseParser, type SseEvent } from '../../src/sse/parser.js';

export const FIXTURE_DIR = join(__dirname, '../fixtures/sse');

export function fixture(name: string): Buffer {
  return readFileSync(join(FIXTURE_DIR, name));
}

/** Events of a fixture, fed in the given chunks. */
export function sseEvents(chunks: Buffer[]): SseEvent[] {
  const out: SseEvent[] = [];
  const p = new SseParser((e) => out.push(e));
  for (const c of chunks) p.push(c);
  p.end();
  return out;
}

/**
 * gemini.sse's chunks as the same API streams them without `alt=sse`: one
 * pretty-printed JSON array with CRLF line ends, `\r\n,\r\n` between elements.
 */
export function geminiArray(): { bytes: Buffer; chunks: unknown[]; pieces: Buffer[] } {
  const chunks = fixture('gemini.sse')
    .toString('utf8')
    .split('\r\n\r\n')
    .filter((b) => b.startsWith('data: '))
    .map((b) => JSON.parse(b.slice(6)) as unknown);
  const pieces = chunks.map((c, i) => Buffer.from((i === 0 ? '[' : '\r\n,\r\n') + JSON.stringify(c, null, 2).replace(/\n/g, '\r\n')));
  pieces.push(Buffer.from('\r\n]'));
  return { bytes: Buffer.concat(pieces), chunks, pieces };
}
