/**
 * Caps the number of distinct values a client-controlled label (the model
 * name) may take, so a client cannot blow up the time-series count. Values
 * past the cap are recorded as `_OTHER`; values that are not well-formed
 * UTF-16 as they will be exposed (lone surrogates as U+FFFD). `limit` admits
 * a value (takes a place); `known` only reads whether one was admitted.
 */
export const OTHER = '_OTHER';
const MAX_VALUE_LENGTH = 128;

export class CardinalityLimiter {
  private readonly seen = new Set<string>();

  constructor(private readonly maxValues: number) {}

  limit(value: string): string {
    if (this.seen.has(value)) return value;
    // A lone UTF-16 surrogate (JSON allows "\ud800") is written as U+FFFD, so two such
    // values would be two series with one exposed name, and Prometheus keeps only one.
    if (!value.isWellFormed()) return this.limit(value.toWellFormed());
    if (value.length > MAX_VALUE_LENGTH || this.seen.size >= this.maxValues) return OTHER;
    this.seen.add(value);
    return value;
  }

  /** `value` as `limit` would give it if it was admitted already, else undefined (no place taken). */
  known(value: string): string | undefined {
    if (this.seen.has(value)) return value;
    return value.isWellFormed() ? undefined : this.known(value.toWellFormed());
  }
}
