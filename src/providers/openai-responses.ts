import type { SseEvent } from '../sse/parser.js';
import { FinishReasons } from './finish-reasons.js';
import { objectFromEdges } from './json-edges.js';
import { EventKind, firstString, nonEmpty, count, obj, parseObject, type ApiDescriptor, type ResponseAdapter, sanitizeErrorType, type Usage, countUpdate, sent } from './types.js';

/** Delta events that carry generated output (non-empty `delta`). */
const CONTENT_EVENTS = new Set([
  'response.output_text.delta',
  'response.refusal.delta',
  'response.reasoning_summary_text.delta',
  'response.reasoning_text.delta',
  'response.function_call_arguments.delta',
  'response.custom_tool_call_input.delta',
  'response.mcp_call_arguments.delta',
  'response.code_interpreter_call_code.delta',
  'response.audio.transcript.delta',
  'response.audio.delta',
  'response.shell_call_command.delta',
  'response.apply_patch_call_operation_diff.delta',
]);

const REASONING_EVENTS = new Set(['response.reasoning_summary_text.delta', 'response.reasoning_text.delta']);

/**
 * The `.done` events that repeat a part's whole text, and the field holding it: the output of a
 * stream that sends no deltas (gateways that relay only final events).
 */
const DONE_EVENTS = new Map([
  ['response.output_text.done', 'text'],
  ['response.refusal.done', 'refusal'],
  ['response.reasoning_summary_text.done', 'text'],
  ['response.reasoning_text.done', 'text'],
  ['response.function_call_arguments.done', 'arguments'],
  ['response.custom_tool_call_input.done', 'input'],
  ['response.mcp_call_arguments.done', 'arguments'],
  ['response.code_interpreter_call_code.done', 'code'],
]);

/** Events whose payload we read; every other event is classified by its name alone. */
const READ_EVENTS = new Set(['response.created', 'response.completed', 'response.incomplete', 'response.failed', 'error']);

/**
 * OpenAI Responses API streams (`POST /v1/responses`): `event:` + `data:`.
 *
 * Content-bearing: the `*.delta` events in CONTENT_EVENTS with a non-empty
 * `delta` (answer text, refusal, reasoning summary / text, tool-call
 * arguments and inputs, shell commands, patch diffs, audio). About one token
 * per event, except audio: a `response.audio.delta` carries many (see multiTokenEvents).
 * A stream that sends no deltas (some gateways relay only final events) has its output in the
 * `.done` events of DONE_EVENTS, one content event each (a part's whole text: not one token).
 * Usage: `response.completed` (or `response.incomplete`) → `response.usage`; as far as its edges
 * show it when it is over `limits.maxEventBytes` (it repeats the output: a generated image's base64).
 * Finish reason: `incomplete_details.reason` of an incomplete response (`max_output_tokens`,
 * `content_filter`), else its `status` (`completed`).
 * In-band errors: `response.failed` (`response.error.code`) and `error`
 * (`code`, else `type`), also a `{"error":{…}}` payload without `event:`.
 * Also `GET /v1/responses/{id}?stream=true` (resuming a background response).
 */
export class OpenAIResponsesAdapter implements ResponseAdapter {
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  responseModel: string | undefined;
  errorType: string | undefined;
  complete = false;
  /**
   * Whether reasoning fell inside the span TPOT divides: a reasoning summary or text was
   * streamed, or a reasoning item began after the first content event. Otherwise the
   * reasoning came before the first streamed token (see RequestMeter.finish).
   */
  reasoningStreamed = false;
  private contentSeen = false;
  /** A delta event came: the `.done` events repeat what was streamed, and are not content. */
  private deltaSeen = false;
  /** Set by the first audio delta, as in Chat, or a `.done` event's whole text: many tokens each. */
  multiTokenEvents = false;
  /** Whole parts came instead of deltas: their span is not the generation's. */
  private wholeParts = false;
  /** Reasoning items (by output index) that began before the first content event and streamed no summary or text. */
  private hiddenBeforeContent: Set<string> | undefined;

  /**
   * Whole parts; or reasoning before the first streamed token, hidden, with no count of it or a
   * count that also holds streamed reasoning or reasoning inside the span (an item between tool
   * calls, another item's summary): TPOT cannot be had (see ResponseAdapter).
   */
  get tpotUnknown(): boolean {
    const hidden = this.hiddenBeforeContent !== undefined && this.hiddenBeforeContent.size > 0;
    return this.resumed || this.wholeParts || (hidden && (this.usage.reasoningTokens === undefined || this.reasoningStreamed));
  }

  /**
   * @param resumed a GET that resumes a background response's stream: it replays what was
   * generated before in a burst, or starts after it (`starting_after`), while the usage counts
   * the whole response, so its span is not the generation's.
   */
  constructor(private readonly resumed = false) {}
  readonly finishReasons = new FinishReasons();

  onEvent(ev: SseEvent): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    let type = ev.type;
    let o: Record<string, unknown> | undefined;
    if (ev.oversize !== undefined) {
      // An event too large to keep (`response.completed` repeating a generated image) as far as
      // its edges show it: the response's status before its output, its usage after.
      o = objectFromEdges(ev.oversize.head, ev.oversize.tail);
      if (!o) return type === 'error' ? this.fail('error') : EventKind.None;
    }
    if (type === '' || type === 'message') {
      // A server that omits `event:`: the payload's `type` says the same.
      o ??= parseObject(ev.data);
      if (!o) return EventKind.None;
      type = typeof o.type === 'string' ? o.type : '';
      // A chat-style error (`{"error":{…}}`, no `type`), as some gateways send one mid-stream.
      if (type === '' && obj(o.error)) type = 'error';
    }
    if (CONTENT_EVENTS.has(type)) {
      this.deltaSeen = true;
      o ??= parseObject(ev.data);
      if (!o || !nonEmpty(o.delta)) return EventKind.None;
      if (REASONING_EVENTS.has(type)) {
        this.reasoningStreamed = true;
        if (!this.contentSeen) this.hiddenBeforeContent?.delete(itemKey(o.output_index, o.item_id)); // summarised: in the span
      } else if (type === 'response.audio.delta') this.multiTokenEvents = true;
      this.contentSeen = true;
      return EventKind.Content;
    }
    const whole = this.deltaSeen ? undefined : DONE_EVENTS.get(type);
    if (whole !== undefined) {
      o ??= parseObject(ev.data);
      if (!o || !nonEmpty(o[whole])) return EventKind.None;
      if (type.startsWith('response.reasoning_')) this.reasoningStreamed = true;
      this.multiTokenEvents = this.wholeParts = true;
      this.contentSeen = true;
      return EventKind.Content;
    }
    // A reasoning item after the first content event (reasoning between tool calls): the
    // reasoning then lies inside the span TPOT divides, summarised or not. Before it: outside,
    // unless a summary of it is streamed.
    if (type === 'response.output_item.added' && (o !== undefined || ev.data.includes('"reasoning"'))) {
      o ??= parseObject(ev.data);
      const item = obj(o?.item);
      if (item?.type === 'reasoning') {
        if (this.contentSeen) this.reasoningStreamed = true;
        else (this.hiddenBeforeContent ??= new Set()).add(itemKey(o!.output_index, item.id));
      }
      return EventKind.None;
    }
    if (!READ_EVENTS.has(type)) return EventKind.None;
    o ??= parseObject(ev.data);
    if (!o) return type === 'error' ? this.fail('error') : EventKind.None;
    if (type === 'error') {
      // Flat (`{"type":"error","code":…}`) or nested (`{"type":"error","error":{"code":…}}`, as the
      // API sends a 429): the top-level `type` is "error" itself, the last resort.
      const e = obj(o.error);
      return this.fail(firstString(o.code, e?.code, e?.type, o.type !== 'error' ? o.type : undefined) ?? 'error');
    }
    const r = obj(o.response);
    if (r) this.readResponse(r);
    if (type === 'response.completed' || type === 'response.incomplete') {
      this.complete = true;
      if (r) this.readFinish(r);
    }
    if (type === 'response.failed') {
      const e = r ? obj(r.error) : undefined;
      return this.fail(firstString(e?.code, e?.type) ?? 'response_failed');
    }
    return EventKind.None;
  }

  onBody(body: string): void {
    const o = parseObject(body);
    if (!o) return;
    const e = obj(o.error);
    if (e) this.errorType = sanitizeErrorType(firstString(e.code, e.type) ?? 'error');
    this.readResponse(o);
    if (o.status === 'completed' || o.status === 'incomplete') this.readFinish(o);
  }

  /** A finished response: why it is incomplete, else its status. */
  private readFinish(r: Record<string, unknown>): void {
    this.finishReasons.set(0, obj(r.incomplete_details)?.reason ?? r.status);
  }

  private fail(type: string): EventKind {
    this.errorType = sanitizeErrorType(type);
    return EventKind.Error;
  }

  private readResponse(r: Record<string, unknown>): void {
    if (typeof r.model === 'string' && r.model !== '') this.responseModel = r.model;
    const u = obj(r.usage);
    if (u) this.readUsage(u);
  }

  /**
   * Usage arithmetic: `input_tokens` already includes the cached ones
   * (`input_tokens_details.cached_tokens`); `output_tokens` already includes
   * reasoning (`output_tokens_details.reasoning_tokens`).
   */
  private readUsage(u: Record<string, unknown>): void {
    this.usage.inputTokens = countUpdate(this.usage.inputTokens, u.input_tokens);
    if (sent(u.output_tokens)) this.usage.outputTokens = this.cumulativeOutputTokens = count(u.output_tokens);
    this.usage.cachedInputTokens = countUpdate(this.usage.cachedInputTokens, obj(u.input_tokens_details)?.cached_tokens);
    this.usage.reasoningTokens = countUpdate(this.usage.reasoningTokens, obj(u.output_tokens_details)?.reasoning_tokens);
  }
}

/** An output item's key across its events: its output index, else its id. */
function itemKey(index: unknown, id: unknown): string {
  return typeof index === 'number' ? `#${index}` : String(id);
}

export const openaiResponses: ApiDescriptor = {
  api: 'openai-responses',
  operation: 'chat',
  defaultProviderName: 'openai',
  newAdapter: () => new OpenAIResponsesAdapter(),
};

/** A resumed stream (`GET …/responses/resp_{id}?stream=true`): no TPOT (see the adapter). */
export const openaiResponsesResumed: ApiDescriptor = { ...openaiResponses, newAdapter: () => new OpenAIResponsesAdapter(true) };
