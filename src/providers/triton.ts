import type { SseEvent } from '../sse/parser.js';
import { FinishReasons } from './finish-reasons.js';
import { errorTypeOf } from './openai-chat.js';
import { EventKind, addParts, modelInPath, nonEmpty, count, parseObject, sent, type ApiDescriptor, type ResponseAdapter, type Usage, countUpdate } from './types.js';

/**
 * NVIDIA Triton's generate extension (`POST /v2/models/{model}[/versions/{v}]/generate_stream`,
 * and `/generate` for one JSON answer), as TensorRT-LLM and vLLM backends serve it:
 * SSE `data:` events `{"model_name", "model_version", "text_output", …}`, one a step.
 *
 * Content-bearing: non-empty `text_output` (a string, or with several sequences an
 * array of them). Usage: the sum of `num_output_tokens` (with several sequences, an array of
 * one count each) and `num_input_tokens`, which vLLM's backend adds on request; otherwise output
 * tokens are the content events. Finish reason: `finish_reason` (vLLM's backend with
 * `return_finish_reason`; the string "None" until the last response; one per sequence in a list).
 * In-band error: `{"error":"…"}`.
 */
export class TritonGenerateAdapter implements ResponseAdapter {
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  responseModel: string | undefined;
  errorType: string | undefined;
  readonly finishReasons = new FinishReasons();
  private sumLost = false;

  onEvent(ev: SseEvent): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    const o = parseObject(ev.data);
    if (ev.type === 'error' || (o && o.error !== undefined && o.error !== null)) {
      this.errorType = errorTypeOf(o?.error);
      return EventKind.Error;
    }
    if (!o) return EventKind.None;
    if (this.responseModel === undefined && nonEmpty(o.model_name)) this.responseModel = o.model_name as string;
    this.readCounts(o);
    this.readFinish(o.finish_reason);
    const text = o.text_output;
    return nonEmpty(text) || (Array.isArray(text) && text.some(nonEmpty)) ? EventKind.Content : EventKind.None;
  }

  /**
   * vLLM's Triton backend (`return_num_input_tokens`, `return_num_output_tokens`): the prompt
   * length, and the tokens this response added (not a running count), summed here.
   */
  private readCounts(o: Record<string, unknown>): void {
    this.usage.inputTokens = countUpdate(this.usage.inputTokens, o.num_input_tokens);
    if (!sent(o.num_output_tokens) || this.sumLost) return;
    // One bad response's count makes the running sum wrong for good: no output count then.
    const sum = addParts(this.usage.outputTokens ?? 0, outputCount(o.num_output_tokens));
    this.usage.outputTokens = sum;
    this.cumulativeOutputTokens = sum;
    if (sum === undefined) this.sumLost = true;
  }

  onBody(body: string): void {
    const o = parseObject(body);
    if (!o) return;
    if (o.error !== undefined && o.error !== null) this.errorType = errorTypeOf(o.error);
    if (nonEmpty(o.model_name)) this.responseModel = o.model_name as string;
    this.readCounts(o);
    this.readFinish(o.finish_reason);
  }

  /** vLLM's backend sends Python's `str(None)` until a sequence stops. Read on every event: no array made for one. */
  private readFinish(v: unknown): void {
    if (!Array.isArray(v)) return this.setFinish(0, v);
    for (let i = 0; i < v.length; i++) this.setFinish(i, v[i]);
  }

  private setFinish(index: number, reason: unknown): void {
    if (nonEmpty(reason) && reason !== 'None') this.finishReasons.set(index, reason);
  }
}

/** A response's added tokens: a count, or one per sequence (vLLM's backend with `n` > 1); undefined when one is bad. */
function outputCount(v: unknown): number | undefined {
  if (!Array.isArray(v)) return count(v);
  let sum: number | undefined = 0;
  for (const n of v) sum = addParts(sum, count(n));
  return v.length > 0 ? sum : undefined;
}

const TRITON_MODEL = /\/v2\/models\/([^/]+)\//;

export const tritonGenerate: ApiDescriptor = {
  api: 'triton-generate',
  operation: 'text_completion',
  defaultProviderName: 'triton',
  newAdapter: () => new TritonGenerateAdapter(),
  modelFromPath: modelInPath(TRITON_MODEL),
};
