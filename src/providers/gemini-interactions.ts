import type { SseEvent } from '../sse/parser.js';
import { FinishReasons } from './finish-reasons.js';
import { objectFromEdges } from './json-edges.js';
import { EventKind, firstString, nonEmpty, nonEmptyObject, addParts, count, countPart, obj, sent, parseObject, type ApiDescriptor, type ResponseAdapter, sanitizeErrorType, type Usage, countUpdate } from './types.js';

/**
 * Gemini Interactions API (`POST /v1beta/interactions` with `stream: true`),
 * the interface Google now recommends over `generateContent`. SSE with
 * `event:` names equal to the payload's `event_type` (the SDK's types in
 * `@google/genai`: `InteractionSSEEvent`).
 *
 * Content-bearing: a `step.delta` whose `delta` the model generated: `text`,
 * a `thought_summary` with text, `arguments_delta` with arguments, generated
 * `image` / `audio` / `video` / `document` data, `code_execution_call` or
 * other tool-call (`*_call`) arguments; and a `step.start` whose step
 * already holds generated output (model output, a tool call's arguments, a
 * thought summary). Not content: signatures, annotations, tool results, the
 * interaction's lifecycle events. Events carry several tokens each. The
 * legacy event names (`content.delta`, `interaction.start`,
 * `interaction.complete`, when steps are disabled) are read the same way.
 *
 * Usage: `interaction.usage` on `interaction.completed`, or the running
 * `metadata.total_usage` of a delta: output = `total_output_tokens` +
 * `total_thought_tokens` (as with `generateContent`, thoughts are reported
 * apart). In-band errors: `error` (`error.code`, a URI: its last segment),
 * an interaction that ends `failed`, `cancelled` or `budget_exceeded`, a
 * model-output step with an `error` (its `google.rpc.Code` by name). Finish reason: the
 * status of an interaction that stopped without failing (`completed`, `incomplete`,
 * `requires_action`, `requires_continuation`).
 * An event over `limits.maxEventBytes` (a generated image's data) is read as far as its edges
 * show it (json-edges.ts).
 */
export class GeminiInteractionsAdapter implements ResponseAdapter {
  readonly multiTokenEvents = true;
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  responseModel: string | undefined;
  errorType: string | undefined;
  /**
   * Whether the thoughts fell inside the span TPOT divides: a thought summary was streamed, or
   * a thought step began after the first content event (thinking between tool calls). Otherwise
   * (`thinking_summaries: "none"`, a thought step that holds only its signature) they came
   * before the first streamed token, and are left out of TPOT (see RequestMeter.finish).
   */
  reasoningStreamed = false;
  private contentSeen = false;
  readonly finishReasons = new FinishReasons();
  /** `interaction.complete(d)` was read (not a failed status): the answer is whole. */
  complete = false;

  /**
   * @param tpotUnknown a GET that resumes an interaction's stream: it replays what was generated
   * before in a burst, or starts after it (`last_event_id`), while the usage counts the whole
   * interaction, so its span is not the generation's (no TPOT).
   */
  constructor(readonly tpotUnknown = false) {}

  onEvent(ev: SseEvent): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    // An event too large to keep (a generated image's data) as far as its edges show it.
    const o = ev.oversize !== undefined ? objectFromEdges(ev.oversize.head, ev.oversize.tail) : parseObject(ev.data);
    if (!o) return ev.type === 'error' ? this.fail('error') : EventKind.None;
    const type = ev.type !== '' && ev.type !== 'message' ? ev.type : typeof o.event_type === 'string' ? o.event_type : '';
    switch (type) {
      case 'step.delta':
      case 'content.delta': {
        const u = obj(obj(o.metadata)?.total_usage);
        if (u) this.readUsage(u);
        const d = obj(o.delta);
        if (!deltaHasContent(d)) return EventKind.None;
        if (d!.type === 'thought_summary') this.reasoningStreamed = true;
        this.contentSeen = true;
        return EventKind.Content;
      }
      case 'step.start': {
        const step = obj(o.step);
        const failed = obj(step?.error);
        if (failed) return this.fail(rpcCodeName(failed.code) ?? 'model_output_error');
        if (step?.type === 'thought' && this.contentSeen) this.reasoningStreamed = true;
        if (!step || !stepHasContent(step)) return EventKind.None;
        if (step.type === 'thought') this.reasoningStreamed = true;
        this.contentSeen = true;
        return EventKind.Content;
      }
      case 'step.stop':
      case 'interaction.status_update': {
        const u = obj(o.usage);
        if (u) this.readUsage(u);
        if (type === 'interaction.status_update') this.readStatus(o.status);
        return typeof o.status === 'string' && FAILED.has(o.status) ? this.fail(`interaction_${o.status}`) : EventKind.None;
      }
      case 'interaction.created':
      case 'interaction.start':
      case 'interaction.completed':
      case 'interaction.complete': {
        const i = obj(o.interaction);
        if (i) this.readInteraction(i);
        if (typeof i?.status === 'string' && FAILED.has(i.status)) return this.fail(`interaction_${i.status}`);
        // The stream's last event: a client that hangs up after it had the whole answer.
        if (type === 'interaction.completed' || type === 'interaction.complete') this.complete = true;
        return EventKind.None;
      }
      case 'error':
        return this.fail(errorCode(obj(o.error)?.code) ?? 'error');
      default:
        return EventKind.None;
    }
  }

  /** A whole interaction (`stream: false`, or a retrieval). */
  onBody(body: string): void {
    const o = parseObject(body);
    if (!o) return;
    const e = obj(o.error);
    if (e) this.errorType = sanitizeErrorType(firstString(e.status, e.code) ?? 'error');
    else if (typeof o.status === 'string' && FAILED.has(o.status)) this.errorType = `interaction_${o.status}`;
    this.readInteraction(o);
  }

  private fail(type: string): EventKind {
    this.errorType = sanitizeErrorType(type);
    return EventKind.Error;
  }

  /** An interaction's status once it stopped without failing (a failure is its error type). */
  private readStatus(status: unknown): void {
    if (typeof status === 'string' && STOPPED.has(status)) this.finishReasons.set(0, status);
  }

  private readInteraction(i: Record<string, unknown>): void {
    this.readStatus(i.status);
    // An agent interaction (Deep Research) names an agent and no model.
    if (typeof i.model === 'string' && i.model !== '') this.responseModel = i.model;
    else if (typeof i.agent === 'string' && i.agent !== '' && this.responseModel === undefined) this.responseModel = i.agent;
    const u = obj(i.usage);
    if (u) this.readUsage(u);
  }

  /**
   * Usage arithmetic: input = `total_input_tokens` (+ `total_tool_use_tokens`),
   * cached = `total_cached_tokens` (part of the input); output =
   * `total_output_tokens` + `total_thought_tokens`, as `generateContent`
   * reports thoughts apart, unless `total_tokens` says the output already
   * holds them (total = input + tool use + output). An absent part is 0 (the input count is
   * always there); one that is there but bad makes its sum unreported, also after an earlier
   * event's.
   */
  private readUsage(u: Record<string, unknown>): void {
    const input = count(u.total_input_tokens);
    const toolUse = countPart(u.total_tool_use_tokens);
    const allInput = addParts(input, toolUse);
    if (sent(u.total_input_tokens) || sent(u.total_tool_use_tokens)) this.usage.inputTokens = allInput;
    this.usage.cachedInputTokens = countUpdate(this.usage.cachedInputTokens, u.total_cached_tokens);
    this.usage.reasoningTokens = countUpdate(this.usage.reasoningTokens, u.total_thought_tokens);
    if (sent(u.total_output_tokens) || sent(u.total_thought_tokens)) {
      const out = countPart(u.total_output_tokens);
      const thought = countPart(u.total_thought_tokens);
      const included = thought !== undefined && thought > 0 && out !== undefined && allInput !== undefined && count(u.total_tokens) === allInput + out;
      const total = addParts(out, included ? 0 : thought);
      this.usage.outputTokens = total;
      this.cumulativeOutputTokens = total;
    }
  }
}

/** Delta types whose `data` (or `uri`) is generated media. */
const MEDIA = new Set(['image', 'audio', 'video', 'document']);

/** Interaction statuses that end it without its answer (`incomplete` and `requires_*` are normal stops). */
const FAILED = new Set(['failed', 'cancelled', 'budget_exceeded']);

/** The statuses of an interaction that stopped normally: its finish reason (not `queued`, `in_progress`). */
const STOPPED = new Set(['completed', 'incomplete', 'requires_action', 'requires_continuation']);

/** Text or media the model generated (`Content`: text, image, audio, video, document). */
function contentHasOutput(c: unknown): boolean {
  const o = obj(c);
  return o !== undefined && (nonEmpty(o.text) || nonEmpty(o.data) || nonEmpty(o.uri));
}

function deltaHasContent(d: Record<string, unknown> | undefined): boolean {
  if (!d) return false;
  const t = d.type;
  if (typeof t !== 'string') return false;
  if (t === 'text') return nonEmpty(d.text);
  if (t === 'arguments_delta') return nonEmpty(d.arguments);
  if (t === 'thought_summary') return contentHasOutput(d.content);
  if (MEDIA.has(t)) return nonEmpty(d.data) || nonEmpty(d.uri);
  // Tool calls the model writes (`code_execution_call`, `google_search_call`, `mcp_server_tool_call`, …);
  // a `*_result` is the tool's.
  if (t.endsWith('_call')) return callHasOutput(d);
  return false;
}

/** A tool call's arguments, or a function call's name (a function without parameters has `arguments: {}`). */
function callHasOutput(c: Record<string, unknown>): boolean {
  return nonEmptyObject(c.arguments) || (c.type === 'function_call' && nonEmpty(c.name));
}

function stepHasContent(s: Record<string, unknown>): boolean {
  const t = s.type;
  if (t === 'model_output') return Array.isArray(s.content) && s.content.some(contentHasOutput);
  if (t === 'thought') return Array.isArray(s.summary) && s.summary.some(contentHasOutput);
  return typeof t === 'string' && t.endsWith('_call') && callHasOutput(s);
}

/** google.rpc.Code numbers (a `Status.code`) by name. */
const RPC_CODES = ['OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED', 'NOT_FOUND', 'ALREADY_EXISTS', 'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED', 'FAILED_PRECONDITION', 'ABORTED', 'OUT_OF_RANGE', 'UNIMPLEMENTED', 'INTERNAL', 'UNAVAILABLE', 'DATA_LOSS', 'UNAUTHENTICATED'];

function rpcCodeName(code: unknown): string | undefined {
  return typeof code === 'number' ? (RPC_CODES[code] ?? String(code)) : firstString(code);
}

/** An `ErrorT.code`: "a URI that identifies the error type"; its last path segment names it. */
function errorCode(code: unknown): string | undefined {
  const c = firstString(code);
  if (c === undefined) return undefined;
  const seg = c.replace(/[/#]+$/, '').split(/[/#]/).pop();
  return seg !== undefined && seg !== '' ? seg : c;
}

export const geminiInteractions: ApiDescriptor = {
  api: 'gemini-interactions',
  operation: 'generate_content',
  defaultProviderName: 'gcp.gemini',
  newAdapter: () => new GeminiInteractionsAdapter(),
};

/** A resumed stream (`GET …/interactions/{id}?stream=true`): no TPOT (see the adapter). */
export const geminiInteractionsResumed: ApiDescriptor = { ...geminiInteractions, newAdapter: () => new GeminiInteractionsAdapter(true) };
