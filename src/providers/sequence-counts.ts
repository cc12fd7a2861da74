import type { Usage } from './types.js';

/** One sequence's last reported counts. */
interface Counts {
  input?: number;
  output?: number;
  cached?: number;
  reasoning?: number;
}

/**
 * Running token counts of a stream that interleaves several sequences, told apart by their
 * `index` (a batch or `n` > 1 on llama.cpp's and SGLang's own APIs). Each sequence reports
 * its own running count; the request's usage is the sum over the sequences.
 */
export class SequenceCounts {
  private readonly seqs = new Map<unknown, Counts>();

  /**
   * Takes one sequence's counts (undefined: not reported this time) into `usage`. Returns the
   * new output sum and whether this sequence's output count grew (undefined: no count given).
   */
  update(index: unknown, c: Counts, usage: Usage): { total: number | undefined; grew: boolean | undefined } {
    let seq = this.seqs.get(index);
    if (!seq) this.seqs.set(index, (seq = {}));
    const before = seq.output;
    if (c.input !== undefined) seq.input = c.input;
    if (c.cached !== undefined) seq.cached = c.cached;
    if (c.reasoning !== undefined) seq.reasoning = c.reasoning;
    if (c.output !== undefined) seq.output = c.output;
    const input = this.sum('input');
    if (input !== undefined) usage.inputTokens = input;
    const cached = this.sum('cached');
    if (cached !== undefined) usage.cachedInputTokens = cached;
    const reasoning = this.sum('reasoning');
    if (reasoning !== undefined) usage.reasoningTokens = reasoning;
    const total = this.sum('output');
    if (total !== undefined) usage.outputTokens = total;
    return { total, grew: c.output === undefined ? undefined : c.output > (before ?? 0) };
  }

  private sum(k: keyof Counts): number | undefined {
    let total: number | undefined;
    for (const c of this.seqs.values()) {
      const v = c[k];
      if (v !== undefined) total = (total ?? 0) + v;
    }
    return total;
  }
}
