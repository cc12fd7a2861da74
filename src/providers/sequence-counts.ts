import { count, sent, type Usage } from './types.js';

/** One sequence's last reported counts (NaN: the last one sent was bad). */
interface Counts {
  input?: number;
  output?: number;
  cached?: number;
  reasoning?: number;
}

/** A sequence: its last counts, and its last good output count (what a new one grew from). */
interface Sequence extends Counts {
  goodOutput?: number;
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
  private readonly seqs = new Map<unknown, Sequence>();
  /** Sums of the good last counts. */
  private readonly totals: Counts = {};
  /** Sequences whose last count is bad, per key: the total is unreported while any is. */
  private readonly bad = { input: 0, output: 0, cached: 0, reasoning: 0 };
  /** Totals past 2^53 − 1, summed anew on each update. */
  private readonly wide = new Set<keyof Counts>();

  private sum(k: keyof Counts): number {
    let s = 0;
    for (const seq of this.seqs.values()) {
      const v = seq[k];
      if (v !== undefined && !Number.isNaN(v)) s += v;
    }
    return s;
  }

  /** A key's total as reported: none while a sequence's last count is bad, or past 2^53 − 1. */
  private reported(k: keyof Counts): number | undefined {
    return this.bad[k] > 0 ? undefined : count(this.totals[k]);
  }

  /**
   * Takes one sequence's counts (undefined: not sent this time; NaN: sent but bad) into `usage`.
   * Returns the new output sum and whether this sequence's output count grew from its last good
   * one (undefined: no good count given). Each update costs the same however many sequences
   * came before, a bad count too: the totals are kept over the good counts.
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
    const before = seq.goodOutput;
    const totals = this.totals;
    for (const k of KEYS) {
      const v = c[k];
      if (v === undefined) continue;
      const was = seq[k];
      seq[k] = v;
      const wasBad = was !== undefined && Number.isNaN(was);
      const isBad = Number.isNaN(v);
      this.bad[k] += (isBad ? 1 : 0) - (wasBad ? 1 : 0);
      // Past 2^53 − 1 a running total loses precision, which a later decrease would carry back
      // into range: while out of range it is summed anew (exact once the true sum is back in
      // range, the counts being whole and non-negative). Only a broken upstream gets there.
      const t = this.wide.has(k) ? this.sum(k) : (totals[k] ?? 0) - (wasBad ? 0 : (was ?? 0)) + (isBad ? 0 : v);
      if (t > Number.MAX_SAFE_INTEGER) this.wide.add(k);
      else this.wide.delete(k);
      totals[k] = t;
    }
    // Sums past 2^53 − 1 (thousands of sequences near it) are no count.
    if (totals.input !== undefined) usage.inputTokens = this.reported('input');
    if (totals.cached !== undefined) usage.cachedInputTokens = this.reported('cached');
    if (totals.reasoning !== undefined) usage.reasoningTokens = this.reported('reasoning');
    const total = this.reported('output');
    if (totals.output !== undefined) usage.outputTokens = total;
    const out = c.output;
    if (out === undefined || Number.isNaN(out)) return { total, grew: undefined };
    seq.goodOutput = out;
    return { total, grew: out > (before ?? 0) };
  }
}
