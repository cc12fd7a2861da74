import type { SseEvent } from '../sse/parser.js';
import { FinishReasons } from './finish-reasons.js';
import { errorTypeOf } from './openai-chat.js';
import { SequenceCounts, sequenceCount } from './sequence-counts.js';
import { readTgiDetails } from './tgi.js';
import { EventKind, nonEmpty, obj, parseObject, type ApiDescriptor, type ResponseAdapter, sanitizeErrorType, type Usage } from './types.js';

/**
 * SGLang's own `/generate` (`"stream": true`): SSE `data:` events
 * `{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
 * "completion_tokens", "cached_tokens", …}}`, then `data: [DONE]`. `text` is the
 * whole output so far (or, with the server's `--incremental-streaming-output`, the
 * new part), and one event may carry several tokens; `completion_tokens` is the
 * running count on every event. A batch request interleaves sequences told apart
 * by `index`.
 *
 * Content-bearing: an event with non-empty `text` whose sequence's `completion_tokens`
 * grew from its last good one (or that reports no usable count), as SGLang's `bench_serving` counts chunks: a first
 * token with no visible text yet does not stop TTFT. Usage: the running counts (summed over a batch's
 * sequences). In-band errors: `{"error":{"message"}}`, and a final
 * `finish_reason` of type `abort` (typed by its `err_type`). Finish reason: each sequence's
 * `meta_info.finish_reason.type` (`stop`, `length`, `abort`), null until its last event.
 * A non-streamed answer on this path may also be TGI's `/generate`
 * (`{"generated_text", "details": {"generated_tokens"}}`); its usage is read too.
 */
export class SglangGenerateAdapter implements ResponseAdapter {
  readonly multiTokenEvents = true;
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  readonly responseModel = undefined;
  errorType: string | undefined;
  readonly finishReasons = new FinishReasons();
  private readonly sequences = new SequenceCounts();

  onEvent(ev: SseEvent): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    const o = parseObject(ev.data); // `[DONE]`: undefined
    if (!o) return EventKind.None;
    if (o.error !== undefined && o.error !== null) {
      this.errorType = errorTypeOf(o.error);
      return EventKind.Error;
    }
    const meta = obj(o.meta_info);
    const grew = meta ? this.readMeta(o.index, meta) : undefined;
    const fr = obj(meta?.finish_reason);
    if (fr) this.finishReasons.set(o.index, fr.type);
    if (fr?.type === 'abort') {
      this.errorType = sanitizeErrorType(typeof fr.err_type === 'string' && fr.err_type !== '' ? fr.err_type : 'abort');
      return EventKind.Error;
    }
    // As SGLang's own benchmark: a chunk with text (cumulative text is non-empty from the first
    // visible token on), here only when its sequence's count grew.
    return nonEmpty(o.text) && grew !== false ? EventKind.Content : EventKind.None;
  }

  onBody(body: string): void {
    const o = parseObject(body);
    if (!o) return;
    const meta = obj(o.meta_info);
    if (meta) {
      this.readMeta(o.index, meta);
      this.finishReasons.set(o.index, obj(meta.finish_reason)?.type);
    }
    readTgiDetails(o, this.usage, this.finishReasons); // TGI's non-streamed `/generate` answer
  }

  /** Usage arithmetic (summed over a batch's sequences); whether this sequence's count grew. */
  private readMeta(index: unknown, m: Record<string, unknown>): boolean | undefined {
    const { total, grew } = this.sequences.update(
      index,
      { input: sequenceCount(m.prompt_tokens), output: sequenceCount(m.completion_tokens), cached: sequenceCount(m.cached_tokens), reasoning: sequenceCount(m.reasoning_tokens) },
      this.usage,
    );
    if (grew !== undefined) this.cumulativeOutputTokens = total;
    return grew;
  }
}

export const sglangGenerate: ApiDescriptor = {
  api: 'sglang-generate',
  operation: 'text_completion',
  defaultProviderName: 'sglang',
  newAdapter: () => new SglangGenerateAdapter(),
};
