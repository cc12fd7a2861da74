import type { SseEvent } from '../sse/parser.js';
import { FinishReasons } from './finish-reasons.js';
import { objectFromEdges } from './json-edges.js';
import { EventKind, nonEmpty, addParts, count, num, numPart, obj, parseObject, type ApiDescriptor, type ResponseAdapter, sanitizeErrorType, type ServerTimings, type Usage, countUpdate, sent } from './types.js';

/**
 * Ollama native API (`/api/chat`, `/api/generate`): NDJSON, one object a line.
 *
 * Content-bearing: a line with non-empty `message.content`,
 * `message.thinking`, `message.tool_calls`, or (generate) `response` /
 * `thinking`. About one token per line.
 * Usage: the final `done:true` line: `prompt_eval_count` (input) and
 * `eval_count` (output, includes the end-of-sequence token).
 * Server timings (nanoseconds on the wire): `eval_duration / eval_count`,
 * `load_duration + prompt_eval_duration`, `total_duration`.
 * Finish reason: the final line's `done_reason` (`stop`, `length`, `load`, `unload`).
 * In-band error: `{"error":"..."}` (a message string, so the type is `ollama_error`).
 */
export class OllamaAdapter implements ResponseAdapter {
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  responseModel: string | undefined;
  errorType: string | undefined;
  complete = false;
  serverTimings: ServerTimings | undefined;
  readonly finishReasons = new FinishReasons();

  onEvent(ev: SseEvent): EventKind {
    // A line too large to keep (`/api/generate`'s last line, long by its `context`; a tool call's
    // arguments) as far as its edges show it: the members before and after the long value.
    const o = ev.oversize !== undefined ? objectFromEdges(ev.oversize.head, ev.oversize.tail) : parseObject(ev.data);
    if (!o) return EventKind.None;
    return this.onLine(o);
  }

  private onLine(o: Record<string, unknown>): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    if (o.error !== undefined && o.error !== null) {
      const e = obj(o.error);
      this.errorType = sanitizeErrorType(typeof e?.type === 'string' ? e.type : 'ollama_error');
      return EventKind.Error;
    }
    if (this.responseModel === undefined && typeof o.model === 'string' && o.model !== '') this.responseModel = o.model;
    if (o.done === true) {
      this.readFinal(o);
      this.finishReasons.set(0, o.done_reason);
      this.complete = true;
    }
    const m = obj(o.message);
    if (m) {
      if (nonEmpty(m.content) || nonEmpty(m.thinking)) return EventKind.Content;
      if (Array.isArray(m.tool_calls) && m.tool_calls.length > 0) return EventKind.Content;
    }
    return nonEmpty(o.response) || nonEmpty(o.thinking) ? EventKind.Content : EventKind.None;
  }

  onBody(body: string): void {
    const o = parseObject(body);
    if (o) this.onLine(o);
  }

  /** Usage arithmetic: input = prompt_eval_count, output = eval_count; durations ns → s. */
  private readFinal(o: Record<string, unknown>): void {
    const output = count(o.eval_count);
    this.usage.inputTokens = countUpdate(this.usage.inputTokens, o.prompt_eval_count);
    if (sent(o.eval_count)) this.usage.outputTokens = this.cumulativeOutputTokens = output;
    const st: ServerTimings = {};
    const evalNs = num(o.eval_duration);
    if (evalNs !== undefined && output !== undefined && output > 0) st.timePerOutputToken = evalNs / output / 1e9;
    const promptNs = num(o.prompt_eval_duration);
    const firstNs = addParts(promptNs, numPart(o.load_duration)); // a bad load time: no TTFT
    if (firstNs !== undefined) st.timeToFirstToken = firstNs / 1e9;
    const totalNs = num(o.total_duration);
    if (totalNs !== undefined) st.duration = totalNs / 1e9;
    this.serverTimings = st;
  }
}

export const ollamaChat: ApiDescriptor = {
  api: 'ollama-chat',
  operation: 'chat',
  defaultProviderName: 'ollama',
  newAdapter: () => new OllamaAdapter(),
};

export const ollamaGenerate: ApiDescriptor = {
  api: 'ollama-generate',
  operation: 'text_completion',
  defaultProviderName: 'ollama',
  newAdapter: () => new OllamaAdapter(),
};
