import { sanitizeErrorType } from './types.js';

/** Choices or candidates kept; OpenAI allows `n` up to 128, a log line needs no more. */
const MAX_CHOICES = 16;

/**
 * Why the model stopped, as the API says it (`stop`, `length`, `tool_calls`, `end_turn`,
 * `MAX_TOKENS`, ...), per choice or candidate: the semantic conventions'
 * `gen_ai.response.finish_reasons`, for the request's log line. Bounded: at most 16
 * choices, each reason cleaned as an error type is (64 characters of `[A-Za-z0-9_.-]`).
 * Written only from events an adapter parses anyway: no cost on the byte path.
 */
export class FinishReasons {
  private byIndex: (string | undefined)[] | undefined;

  /** `reason` of choice `index` (not a small integer: 0); ignored unless a non-empty string. */
  set(index: unknown, reason: unknown): void {
    if (typeof reason !== 'string' || reason === '') return;
    const i = typeof index === 'number' && Number.isInteger(index) && index >= 0 ? index : 0;
    if (i >= MAX_CHOICES) return;
    (this.byIndex ??= [])[i] = sanitizeErrorType(reason);
  }

  /**
   * The reasons in choice order, null for a choice before the last one read that has none (n > 1,
   * cut before it finished: the others keep their places); undefined when none was read (a cut
   * stream, an API that says none).
   */
  list(): (string | null)[] | undefined {
    const r = this.byIndex;
    return r === undefined ? undefined : Array.from(r, (v) => v ?? null);
  }
}
