import type { SseEvent } from '../sse/parser.js';
import { FinishReasons } from './finish-reasons.js';
import { errorTypeOf } from './openai-chat.js';
import { EventKind, nonEmpty, count, countUpdate, obj, parseObject, sent, sumDefined, vertexRawPredictModel, type ApiDescriptor, type ResponseAdapter, type Usage } from './types.js';

/**
 * Anthropic Messages streams (`POST /v1/messages`), also reused for Bedrock
 * InvokeModelWithResponseStream chunks and Vertex AI `:streamRawPredict`.
 *
 * Content-bearing: `content_block_delta` whose delta is a `text_delta`,
 * `thinking_delta`, `input_json_delta` or `compaction_delta` with non-empty
 * text, and a `redacted_thinking` block (it arrives whole in its start). Not content:
 * `message_start`, `content_block_start/stop` (but a text block's start with text, which a
 * compatible server may send and the SDKs keep), `ping`, `signature_delta`,
 * `citations_delta`, an empty `thinking_delta` or `partial_json:""`,
 * `message_delta`, `message_stop`. One event usually carries several tokens.
 *
 * Usage: `message_start.message.usage` (input, cache, an initial output count)
 * and `message_delta.usage` (cumulative; the last one is the final count;
 * with `usage.iterations`, their sum, advisor passes left out);
 * `output_tokens_details.thinking_tokens` is the reasoning in it. A `fallback` block
 * start (server-side fallback) names the model that answers.
 * Finish reason: `message_delta.delta.stop_reason` (`end_turn`, `max_tokens`, `tool_use`, ...).
 * In-band error: `event: error` with `{"type":"error","error":{"type":...}}`.
 */
export class AnthropicAdapter implements ResponseAdapter {
  readonly multiTokenEvents = true;
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  responseModel: string | undefined;
  errorType: string | undefined;
  complete = false;
  /**
   * Whether the thinking fell inside the span TPOT divides: a non-empty `thinking_delta` was
   * streamed, or a thinking block began after the first content event (thinking between tool
   * uses, streamed or not). Otherwise the thinking (`display: "omitted"` streams only its
   * signature; redacted thinking arrives whole after it was generated) came before the first
   * streamed token, and its tokens are left out of TPOT (see RequestMeter.finish).
   */
  reasoningStreamed = false;
  /** A thinking block (not displayed, or redacted) began before the first content event and streamed no thinking. */
  private reasoningBeforeContent = false;
  /** A thinking block began after the first content event (between tool uses). */
  private reasoningAfterContent = false;
  private contentSeen = false;
  readonly finishReasons = new FinishReasons();
  /** Raw usage fields as last reported (BAD: sent, but no count); `usage` is derived from them. */
  private input: number | undefined;
  private cacheCreation: number | undefined;
  private cacheRead: number | undefined;

  onEvent(ev: SseEvent): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    // `message` is SSE's name for an event without one: the payload's `type` says which it is.
    const t = ev.type === 'message' ? '' : ev.type;
    // The SSE event name equals the payload's `type`: skip parsing what we do not need.
    if (t === 'message_stop') {
      this.complete = true;
      return EventKind.None;
    }
    if (t === 'ping' || t === 'content_block_stop') return EventKind.None;
    // A block start is read only for a server-side fallback's hand-over (beta), thinking, or text
    // in a text block's start (the API's is empty; a compatible server may put the first text there).
    if (t === 'content_block_start' && !ev.data.includes('"fallback"') && !ev.data.includes('thinking"') && !startText(ev.data)) return EventKind.None;
    const o = parseObject(ev.data);
    if (!o) return t === 'error' ? this.fail(undefined) : EventKind.None;
    return this.onObject(t !== '' ? t : typeof o.type === 'string' ? o.type : '', o);
  }

  /** One decoded Anthropic event (also from a Bedrock `chunk`). */
  onObject(type: string, o: Record<string, unknown>): EventKind {
    const kind = this.read(type, o);
    if (kind === EventKind.Content) this.contentSeen = true;
    return kind;
  }

  private read(type: string, o: Record<string, unknown>): EventKind {
    switch (type) {
      case 'message_stop': // without an `event:` name, or in a Bedrock chunk
        this.complete = true;
        return EventKind.None;
      case 'content_block_delta': {
        const d = obj(o.delta);
        if (!deltaHasContent(d)) return EventKind.None;
        if (d!.type === 'thinking_delta') {
          this.reasoningStreamed = true;
          if (!this.contentSeen) this.reasoningBeforeContent = false; // displayed: its thinking is in the span
        }
        return EventKind.Content;
      }
      case 'content_block_start': {
        const b = obj(o.content_block);
        if (b?.type === 'thinking' || b?.type === 'redacted_thinking') {
          if (this.contentSeen) this.reasoningStreamed = this.reasoningAfterContent = true;
          else this.reasoningBeforeContent = true;
        }
        // Thinking the safety systems encrypted arrives whole here, with no deltas: it is output.
        if (b?.type === 'redacted_thinking') return nonEmpty(b.data) ? EventKind.Content : EventKind.None;
        // The SDKs take a text block's start text as the message's first text.
        if (b?.type === 'text') return nonEmpty(b.text) ? EventKind.Content : EventKind.None;
        // Server-side fallback: the block names the model that answers from here on.
        const to = b?.type === 'fallback' ? obj(b.to)?.model : undefined;
        if (typeof to === 'string' && to !== '') this.responseModel = to;
        return EventKind.None;
      }
      case 'message_start': {
        const m = obj(o.message);
        if (m) {
          if (typeof m.model === 'string' && m.model !== '') this.responseModel = m.model;
          const u = obj(m.usage);
          if (u) this.readUsage(u, false);
        }
        return EventKind.None;
      }
      case 'message_delta': {
        const u = obj(o.usage);
        if (u) this.readUsage(u, true);
        this.finishReasons.set(0, obj(o.delta)?.stop_reason);
        return EventKind.None;
      }
      case 'error':
        return this.fail(o.error);
      default:
        return EventKind.None;
    }
  }

  onBody(body: string): void {
    const o = parseObject(body);
    if (!o) return;
    if (o.type === 'error' || (o.error !== undefined && o.error !== null)) {
      this.errorType = errorTypeOf(o.error);
      return;
    }
    if (typeof o.model === 'string' && o.model !== '') this.responseModel = o.model;
    const u = obj(o.usage);
    if (u) this.readUsage(u, true);
    this.finishReasons.set(0, o.stop_reason);
  }

  private fail(err: unknown): EventKind {
    this.errorType = errorTypeOf(err);
    return EventKind.Error;
  }

  /**
   * Usage arithmetic: input = input_tokens + cache_creation_input_tokens +
   * cache_read_input_tokens (Anthropic reports the three apart); output is
   * `output_tokens`, which includes thinking. `final`: from `message_delta`
   * (cumulative) or a whole body. `message_start`'s output count is a
   * placeholder (1-4) and is ignored: a stream cut before `message_delta`
   * has no output count (events carry several tokens each, see multiTokenEvents).
   */
  private readUsage(u: Record<string, unknown>, final: boolean): void {
    this.input = field(u.input_tokens, this.input);
    this.cacheCreation = field(u.cache_creation_input_tokens, this.cacheCreation);
    this.cacheRead = field(u.cache_read_input_tokens, this.cacheRead);
    const parts = [this.input, this.cacheCreation, this.cacheRead];
    // A bad part leaves the input unreported (not the other parts alone) until a later event fixes it.
    if (this.inputSent) this.usage.inputTokens = parts.includes(BAD) ? undefined : count(sumDefined(...parts));
    if (this.cacheRead !== undefined) this.usage.cachedInputTokens = this.cacheRead === BAD ? undefined : this.cacheRead;
    if (this.cacheCreation !== undefined) this.usage.cacheCreationInputTokens = this.cacheCreation === BAD ? undefined : this.cacheCreation;
    if (!final) return;
    const details = obj(u.output_tokens_details);
    if (details !== undefined) this.usage.reasoningTokens = countUpdate(this.usage.reasoningTokens, details.thinking_tokens);
    if (Array.isArray(u.iterations) && u.iterations.length > 0) {
      // Sent iterations are the count: one unusable leaves it unreported, since output_tokens
      // leaves the compaction passes out.
      this.usage.outputTokens = this.cumulativeOutputTokens = iterationsOutput(u.iterations);
      this.outputSent = true;
      return;
    }
    if (sent(u.output_tokens)) {
      this.usage.outputTokens = this.cumulativeOutputTokens = count(u.output_tokens);
      this.outputSent = true;
    }
  }

  /**
   * Thinking generated before the first streamed token and not streamed, with no count of it
   * (`output_tokens_details` is null for some models), or with a count that also holds thinking
   * inside the span (a block between tool uses): how much of the output count lies outside TPOT's
   * span is unknown.
   */
  get tpotUnknown(): boolean {
    return this.reasoningBeforeContent && (this.usage.reasoningTokens === undefined || this.reasoningAfterContent);
  }

  /** Whether a final output count was sent, usable or not (Bedrock invoke's metrics stand in otherwise). */
  outputSent = false;

  /** Whether any part of the input count was sent (Bedrock invoke's metrics stand in otherwise). */
  get inputSent(): boolean {
    return this.input !== undefined || this.cacheCreation !== undefined || this.cacheRead !== undefined;
  }
}

/** A usage field that was sent but is no count. */
const BAD = -1;

/** A usage field's new value: the last one when not sent (absent or null), BAD when sent and bad. */
function field(v: unknown, last: number | undefined): number | undefined {
  if (!sent(v)) return last;
  return count(v) ?? BAD;
}

/**
 * With compaction, server-side tool loops or a fallback (betas), `usage.iterations` lists every
 * sampling pass of the response, and the top-level `output_tokens` leaves the compaction passes
 * out, although their summary is streamed (`compaction_delta`): the streamed output is the sum
 * (undefined when one pass has no count, or the sum passes 2^53 − 1). An advisor pass (another
 * model consulted mid-answer) is not: its result arrives whole in a block of its own, and its
 * tokens are that model's.
 */
function iterationsOutput(v: unknown[]): number | undefined {
  let sum = 0;
  for (const it of v) {
    if (obj(it)?.type === 'advisor_message') continue;
    const n = count(obj(it)?.output_tokens);
    if (n === undefined) return undefined;
    sum += n;
  }
  return count(sum);
}

/** Whether a block start may hold text: anything but the API's own empty `"text":""`. */
function startText(data: string): boolean {
  return data.includes('"text"') && !data.includes('"text":""');
}

function deltaHasContent(d: Record<string, unknown> | undefined): boolean {
  if (!d) return false;
  switch (d.type) {
    case 'text_delta':
      return nonEmpty(d.text);
    case 'thinking_delta':
      return nonEmpty(d.thinking);
    case 'input_json_delta':
      return nonEmpty(d.partial_json);
    case 'compaction_delta': // the summary of a compaction (beta), generated like text
      return nonEmpty(d.content);
    default:
      return false;
  }
}

export const anthropicMessages: ApiDescriptor = {
  api: 'anthropic',
  operation: 'chat',
  defaultProviderName: 'anthropic',
  newAdapter: () => new AnthropicAdapter(),
};

/** Claude on Vertex AI: Anthropic events, model in the path. */
export const anthropicVertex: ApiDescriptor = {
  api: 'anthropic-vertex',
  operation: 'chat',
  defaultProviderName: 'gcp.vertex_ai',
  newAdapter: () => new AnthropicAdapter(),
  modelFromPath: vertexRawPredictModel,
};


