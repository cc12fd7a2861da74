import { count, sent, type Usage } from './types.js';

/** One sequence's last reported counts (NaN: the last one sent was bad). */
interface Counts {
  input?: number;
  output?: number;
  cached?: number;
  reasoning?: number;
}

const KEYS = ['input', 'output', 'cached', 'reasoning'] as const;

/**
 * Sequences told apart before the rest share one entry: an upstream can send a new `index`
 * on every event, and each costs a map entry for the stream's life.
 */
export const MAX_SEQUENCES = 4096;
const OTHER = Symbol('other sequences');

/**
 * A sequence's count as `update` takes it: undefined when not sent (absent or null), NaN when
 * sent but bad, so that the totals are unreported until that sequence sends a good one again.
 */
export function sequenceCount(v: unknown): number | undefined {
  return sent(v) ? (count(v) ?? NaN) : undefined;
}

/**
 * Running token counts of a stream that interleaves several sequences, told apart by their
 * `index` (a batch or `n` > 1 on llama.cpp's and SGLang's own APIs). Each sequence reports
 * its own running count; the request's usage is the sum over the sequences, kept as running
 * totals so that an event costs the same however many sequences came before it.
 */
export class SequenceCounts {
  private readonly seqs = new Map<unknown, Counts>();
  private readonly totals: Counts = {};
  /** Totals past 2^53 − 1, summed anew on each update. */
  private readonly wide = new Set<keyof Counts>();

  private sum(k: keyof Counts): number {
    let s = 0;
    for (const seq of this.seqs.values()) s += seq[k] ?? 0;
    return s;
  }

  /**
   * Takes one sequence's counts (undefined: not sent this time; NaN: sent but bad) into `usage`. Returns the
   * new output sum and whether this sequence's output count grew (undefined: no count given).
   */
  update(index: unknown, c: Counts, usage: Usage): { total: number | undefined; grew: boolean | undefined } {
    // A number or a string names a sequence; anything else (an object is a new key by identity
    // on every event) is one sequence, as a missing index is.
    const key = typeof index === 'number' || typeof index === 'string' ? index : undefined;
    let seq = this.seqs.get(key);
    if (!seq) {
      const k = this.seqs.size < MAX_SEQUENCES ? key : OTHER;
      seq = this.seqs.get(k);
      if (!seq) this.seqs.set(k, (seq = {}));
    }
    const before = seq.output;
    const totals = this.totals;
    for (const k of KEYS) {
      const v = c[k];
      if (v === undefined) continue;
      const was = seq[k];
      seq[k] = v;
      // Past 2^53 − 1 a running total loses precision, which a later decrease would carry back
      // into range: while out of range it is summed anew (exact once the true sum is back in
      // range, the counts being whole and non-negative). Only a broken upstream gets there.
      // A bad count (NaN) makes the total NaN, summed anew until no sequence holds one.
      const t = this.wide.has(k) || Number.isNaN(totals[k]) ? this.sum(k) : (totals[k] ?? 0) - (was ?? 0) + v;
      if (t > Number.MAX_SAFE_INTEGER) this.wide.add(k);
      else this.wide.delete(k);
      totals[k] = t;
    }
    // count(): sums past 2^53 − 1 (thousands of sequences near it) are no count.
    if (totals.input !== undefined) usage.inputTokens = count(totals.input);
    if (totals.cached !== undefined) usage.cachedInputTokens = count(totals.cached);
    if (totals.reasoning !== undefined) usage.reasoningTokens = count(totals.reasoning);
    const total = count(totals.output);
    if (totals.output !== undefined) usage.outputTokens = total;
    // Against a bad count, or with one, whether it grew is not known.
    const known = c.output !== undefined && !Number.isNaN(c.output) && !Number.isNaN(before);
    return { total, grew: known ? c.output! > (before ?? 0) : undefined };
  }
}
