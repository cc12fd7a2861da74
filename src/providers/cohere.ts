import type { SseEvent } from '../sse/parser.js';
import { FinishReasons } from './finish-reasons.js';
import { EventKind, nonEmpty, count, obj, parseObject, type ApiDescriptor, type ResponseAdapter, sanitizeErrorType, type Usage, countUpdate, sent } from './types.js';

/**
 * Cohere Chat streams: v2 (`POST /v2/chat`, SSE, the event's JSON `type`) and
 * v1 (`POST /v1/chat`, newline-delimited JSON, `event_type`). Cohere documents
 * one token per content delta.
 *
 * Content-bearing (v2): `content-delta` with non-empty `delta.message.content.text`
 * or `.thinking`, `tool-plan-delta` with a non-empty `delta.message.tool_plan`,
 * `tool-call-start`/`tool-call-delta` with non-empty
 * `delta.message.tool_calls.function.arguments`. (v1): `text-generation` with
 * non-empty `text`, `tool-calls-chunk` with non-empty `text`,
 * `tool_call_delta.parameters` or `tool_call_delta.text` (the tool plan). Not content: message/content/tool-call
 * start and end markers, citations, `debug`, v1's search events.
 * Usage: `message-end.delta.usage` (v1: `stream-end.response.meta`): `tokens`
 * (what the model read and produced) for TPOT, `billed_units` for token usage
 * (each the other's fallback); `cached_tokens`.
 * The stream names no model. Finish reason: that final `finish_reason` (`COMPLETE`,
 * `MAX_TOKENS`, ...); an in-band error when it is `ERROR` or `TIMEOUT`.
 */
export class CohereAdapter implements ResponseAdapter {
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  readonly responseModel = undefined;
  errorType: string | undefined;
  readonly finishReasons = new FinishReasons();

  onEvent(ev: SseEvent): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    const o = parseObject(ev.data);
    if (!o) return EventKind.None;
    const type = typeof o.type === 'string' ? o.type : typeof o.event_type === 'string' ? o.event_type : ev.type;
    const m = obj(obj(o.delta)?.message);
    switch (type) {
      case 'content-delta': {
        const c = obj(m?.content);
        return nonEmpty(c?.text) || nonEmpty(c?.thinking) ? EventKind.Content : EventKind.None;
      }
      case 'tool-plan-delta':
        return nonEmpty(m?.tool_plan) ? EventKind.Content : EventKind.None;
      case 'tool-call-start':
      case 'tool-call-delta':
        return nonEmpty(obj(obj(m?.tool_calls)?.function)?.arguments) ? EventKind.Content : EventKind.None;
      case 'message-end': {
        const d = obj(o.delta);
        this.readUsage(obj(d?.usage));
        return this.finishReason(d?.finish_reason);
      }
      // v1
      case 'text-generation':
        return nonEmpty(o.text) ? EventKind.Content : EventKind.None;
      case 'tool-calls-chunk':
        return nonEmpty(o.text) || nonEmpty(obj(o.tool_call_delta)?.parameters) || nonEmpty(obj(o.tool_call_delta)?.text)
          ? EventKind.Content
          : EventKind.None;
      case 'stream-end': {
        const r = obj(o.response);
        this.readUsage(obj(r?.meta));
        return this.finishReason(o.finish_reason ?? r?.finish_reason);
      }
      default:
        return EventKind.None;
    }
  }

  /**
   * A non-streamed answer: v2 `usage`, v1 `meta`. A stream sent with a plain JSON content
   * type (its lines then arrive here as one body) still gives its usage and its error.
   */
  onBody(body: string): void {
    const o = parseObject(body);
    if (o) {
      this.readUsage(obj(o.usage) ?? obj(o.meta));
      this.finishReasons.set(0, o.finish_reason);
      return;
    }
    for (const line of body.split('\n')) if (line.trim() !== '') this.onEvent({ type: '', data: line, id: undefined });
  }

  private finishReason(reason: unknown): EventKind {
    this.finishReasons.set(0, reason);
    if (typeof reason !== 'string' || !ERROR_REASONS.has(reason)) return EventKind.None;
    this.errorType = sanitizeErrorType(reason.toLowerCase());
    return EventKind.Error;
  }

  /**
   * Usage arithmetic: `tokens.{input,output}_tokens` (what the model read and produced: TPOT),
   * else `billed_units`; `billed_units` also as the billable counts (token usage); `cached_tokens` of the input.
   */
  private readUsage(u: Record<string, unknown> | undefined): void {
    if (!u) return;
    const tokens = obj(u.tokens);
    const billed = obj(u.billed_units);
    // The billed counts stand in for the model's only when those are not sent.
    const out = sent(tokens?.output_tokens) ? tokens!.output_tokens : billed?.output_tokens;
    if (sent(out)) this.usage.outputTokens = this.cumulativeOutputTokens = count(out);
    this.usage.inputTokens = countUpdate(this.usage.inputTokens, sent(tokens?.input_tokens) ? tokens!.input_tokens : billed?.input_tokens);
    this.usage.billedOutputTokens = countUpdate(this.usage.billedOutputTokens, billed?.output_tokens);
    this.usage.billedInputTokens = countUpdate(this.usage.billedInputTokens, billed?.input_tokens);
    this.usage.cachedInputTokens = countUpdate(this.usage.cachedInputTokens, u.cached_tokens);
  }
}

/**
 * Finish reasons that are failures. Not v1's `ERROR_LIMIT` (the context length cut the reply)
 * nor `ERROR_TOXIC` (a filtered reply): stops, as OpenAI's `length` and `content_filter` are.
 */
const ERROR_REASONS = new Set(['ERROR', 'TIMEOUT']);

export const cohereChat: ApiDescriptor = {
  api: 'cohere-chat',
  operation: 'chat',
  defaultProviderName: 'cohere',
  newAdapter: () => new CohereAdapter(),
};
