import type { SseEvent } from '../sse/parser.js';
import { FinishReasons } from './finish-reasons.js';
import { errorTypeOf } from './openai-chat.js';
import { EventKind, count, obj, parseObject, type ApiDescriptor, type ResponseAdapter, type Usage, countUpdate, sent } from './types.js';

/**
 * Hugging Face text-generation-inference's own API (`/generate_stream`, and
 * `/generate` for one JSON answer). One SSE `data:` event a generated token:
 * `{"index":n,"token":{"id","text","logprob","special"},"generated_text":null,"details":null}`;
 * the last token's event carries `generated_text` and, when the request asked for
 * `details`, `details.generated_tokens` (and `input_length` or `prompt_tokens`).
 *
 * Content-bearing: every event with a `token`, special tokens included (the
 * end-of-sequence token is a decode step of its own, and `generated_tokens`
 * counts it), so the events count the tokens exactly when `details` is off.
 * `index` is the running token count (newer servers). Finish reason: `details.finish_reason`
 * (`length`, `eos_token`, `stop_sequence`), with `details`.
 * In-band error: `{"error":"…","error_type":"…"}`.
 */
export class TgiGenerateAdapter implements ResponseAdapter {
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  readonly responseModel = undefined;
  errorType: string | undefined;
  readonly finishReasons = new FinishReasons();

  onEvent(ev: SseEvent): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    const o = parseObject(ev.data);
    if (ev.type === 'error' || (o && o.error !== undefined && o.error !== null)) {
      this.errorType = errorTypeOf(o?.error, o?.error_type);
      return EventKind.Error;
    }
    if (!o) return EventKind.None;
    readTgiDetails(o, this.usage, this.finishReasons);
    if (!obj(o.token)) return EventKind.None;
    // `index` counts every response of the stream; `generated_tokens` is not compared with it.
    this.cumulativeOutputTokens = count(o.index);
    return EventKind.Content;
  }

  /** `/generate` (or a stream without `stream: true`): one JSON answer. */
  onBody(body: string): void {
    const o = parseObject(body);
    if (!o) return;
    if (o.error !== undefined && o.error !== null) this.errorType = errorTypeOf(o.error, o.error_type);
    else readTgiDetails(o, this.usage, this.finishReasons);
  }
}

/**
 * TGI's usage arithmetic (also for a non-streamed `/generate` answer read by the SGLang
 * adapter): output = `details.generated_tokens`; input = `input_length` or `prompt_tokens`.
 */
export function readTgiDetails(o: Record<string, unknown>, usage: Usage, finish: FinishReasons): void {
  const d = obj(o.details);
  if (!d) return;
  finish.set(0, d.finish_reason);
  usage.outputTokens = countUpdate(usage.outputTokens, d.generated_tokens);
  usage.inputTokens = countUpdate(usage.inputTokens, sent(d.input_length) ? d.input_length : d.prompt_tokens);
}

export const tgiGenerate: ApiDescriptor = {
  api: 'tgi-generate',
  operation: 'text_completion',
  defaultProviderName: 'tgi',
  newAdapter: () => new TgiGenerateAdapter(),
};
