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
