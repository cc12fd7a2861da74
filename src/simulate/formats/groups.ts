import type { ServerResponse } from 'node:http';
import { runSchedule } from '../schedule.js';
import { token } from '../text.js';

/** A run of consecutive tokens of one kind (one content block / output item). */
export interface Block {
  readonly kind: 'text' | 'reasoning' | 'tool';
  /** First token index (inclusive) and end (exclusive). */
  readonly start: number;
  readonly end: number;
}

/** One streamed event: tokens [start, end) of block `block`, sent when token `end - 1` is due. */
export interface Group {
  readonly block: number;
  readonly start: number;
  readonly end: number;
  readonly firstInBlock: boolean;
  readonly lastInBlock: boolean;
}

/** Group sizes of APIs that batch tokens (Anthropic, Gemini, Bedrock): 1, then 3, 4, 5, 3, 4, 5, ... */
const MULTI_SIZES = [3, 4, 5] as const;

/**
 * Splits the blocks into events. `multi`: the first event carries one token
 * (so TTFT is the scheduled first token), later ones 3-5 tokens, never
 * across a block boundary. Otherwise one token per event. Exported so tests
 * can compute the expected gap count from the same plan.
 */
export function planGroups(blocks: readonly Block[], multi: boolean): Group[] {
  const out: Group[] = [];
  let c = 0;
  blocks.forEach((b, bi) => {
    for (let s = b.start; s < b.end; ) {
      const size = !multi ? 1 : c === 0 ? 1 : MULTI_SIZES[(c - 1) % MULTI_SIZES.length]!;
      const e = Math.min(b.end, s + size);
      out.push({ block: bi, start: s, end: e, firstInBlock: s === b.start, lastInBlock: e === b.end });
      s = e;
      c++;
    }
  });
  return out;
}

/**
 * The blocks of a response of `n` tokens: optional reasoning first (half of
 * the tokens, at least one), then answer text or tool-call arguments.
 */
export function planBlocks(n: number, reasoning: boolean, tool: boolean): Block[] {
  const r = reasoning && n >= 2 ? Math.max(1, Math.floor(n / 2)) : 0;
  const blocks: Block[] = [];
  if (r > 0) blocks.push({ kind: 'reasoning', start: 0, end: r });
  blocks.push({ kind: tool ? 'tool' : 'text', start: r, end: n });
  return blocks;
}

/** Text of tokens [start, end). */
export function groupText(start: number, end: number): string {
  let s = '';
  for (let k = start; k < end; k++) s += token(k);
  return s;
}

/**
 * Tool-call argument fragments for tokens [start, end) of a block running
 * [bStart, bEnd): their concatenation over the block is `{"text":"..."}`.
 */
export function argumentsText(start: number, end: number, bStart: number, bEnd: number): string {
  let s = '';
  for (let k = start; k < end; k++) {
    if (k === bStart) s += '{"text":"';
    s += JSON.stringify(token(k)).slice(1, -1);
    if (k === bEnd - 1) s += '"}';
  }
  return s;
}

/** Emits each group when its last token is due; `done` after the last. Cancels when the client goes away. */
export function runGroups(
  res: ServerResponse,
  groups: readonly Group[],
  times: readonly number[],
  t0: number,
  emit: (g: Group, i: number) => void,
  done: () => void,
): void {
  const due = groups.map((g) => times[g.end - 1] ?? 0);
  const cancel = runSchedule(due, t0, (i) => emit(groups[i]!, i), done);
  res.once('close', cancel);
}

/** Sends `send()` when the whole schedule is over (non-streamed responses). */
export function afterAll(res: ServerResponse, times: readonly number[], t0: number, send: () => void): void {
  const cancel = runSchedule(times.length > 0 ? [times[times.length - 1]!] : [0], t0, () => undefined, send);
  res.once('close', cancel);
}

export function sendJson(res: ServerResponse, status: number, value: unknown, headers: Record<string, string> = {}): void {
  const body = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)), ...headers });
  res.end(body);
}

export function str(v: unknown, fallback: string): string {
  return typeof v === 'string' && v !== '' ? v : fallback;
}

export function objOf(v: unknown): Record<string, unknown> | undefined {
  return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

export function positiveInt(v: unknown): number | undefined {
  return typeof v === 'number' && v > 0 ? Math.floor(v) : undefined;
}
