import type { SseEvent } from '../sse/parser.js';
import type { FinishReasons } from './finish-reasons.js';

/** What one streamed event means for measurement. */
export const enum EventKind {
  /** Framing, metadata, usage, keep-alive: not output. */
  None = 0,
  /** Carries output (text, reasoning or tool-call arguments). */
  Content = 1,
  /** An in-band error: ends the measurement with `errorType`. */
  Error = 2,
}

export type TokenCountSource = 'usage' | 'events' | 'none';

/**
 * Token usage as the provider reports it; undefined fields were not reported.
 * Each adapter fills it in one small function (its "usage arithmetic"):
 * `inputTokens` is the whole prompt (cached and cache-written tokens included),
 * `outputTokens` everything generated (reasoning included when the provider
 * bills it as output). The detail fields are subsets of those two.
 */
export interface Usage {
  inputTokens?: number;
  outputTokens?: number;
  /** Of `outputTokens`: reasoning / thinking tokens. */
  reasoningTokens?: number;
  /**
   * Of `outputTokens`: a predicted output's rejected tokens (OpenAI's `rejected_prediction_tokens`),
   * billed but never streamed. Only a request that asked for a prediction has them: the SGLang
   * gateway (smg) reports speculative decoding's rejected drafts in the same field, outside the count.
   */
  rejectedPredictionTokens?: number;
  /** Of `inputTokens`: tokens read from the prompt cache. */
  cachedInputTokens?: number;
  /** Of `inputTokens`: tokens written to the prompt cache (Anthropic, Bedrock). */
  cacheCreationInputTokens?: number;
  /**
   * Billable counts, where the provider reports them beside what the model read and produced
   * (Cohere's `billed_units`): the token-usage histogram records these, as the semantic
   * conventions require; TPOT keeps `outputTokens`, the tokens that were streamed.
   */
  billedInputTokens?: number;
  billedOutputTokens?: number;
}

/**
 * Timings the server reports about itself (seconds), exported next to what the
 * proxy observes so the two can be compared. Undefined: not reported.
 */
export interface ServerTimings {
  /** Server-side time to first token (Bedrock `firstByteLatency`) or prompt processing time (Ollama, llama.cpp). */
  timeToFirstToken?: number;
  /** Server-side time per output token (Ollama `eval_duration / eval_count`, llama.cpp `predicted_per_token_ms`). */
  timePerOutputToken?: number;
  /** Server-side request duration (Ollama `total_duration`, Bedrock `invocationLatency` / `latencyMs`). */
  duration?: number;
}

/**
 * One adapter instance per response. It reads events and keeps what it learns
 * (usage, response model, error) as plain fields the meter reads at the end.
 */
export interface ResponseAdapter {
  /** Classify one SSE event (or one NDJSON line as `{type:'', data}`, or one event-stream frame). */
  onEvent(ev: SseEvent): EventKind;
  /**
   * Optional fast path, offered an unnamed SSE event's data bytes
   * `buf[start, end)` before they are decoded: true when the event is
   * certainly content and carries nothing else the adapter reads (no
   * `onEvent` call follows); false when not sure (`onEvent` decides).
   */
  quickContent?(buf: Buffer, start: number, end: number): boolean;
  /**
   * The same, for a data value whose end is not known yet (it starts at
   * `buf[start]`; `limit` is the end of the read): the index just past the
   * value when it is certainly a content delta as above, else -1. No effect.
   */
  quickContentFrom?(buf: Buffer, start: number, limit: number): number;
  /** A non-streamed body (JSON), at most the capture cap. */
  onBody?(body: string): void;
  /**
   * The API may stream a JSON body as one array, element by element (Gemini
   * without `alt=sse`): each element is then offered to `onEvent` as it
   * completes, and `onBody` is not called.
   */
  readonly streamsJsonArray?: boolean;
  readonly usage: Usage;
  /**
   * The cumulative output token count the last event read reported, undefined when that event
   * reported none (per-token ITL skips the gaps on either side of such an event).
   */
  readonly cumulativeOutputTokens: number | undefined;
  readonly responseModel: string | undefined;
  readonly errorType: string | undefined;
  /** What the server says about its own latency, when it says anything. */
  readonly serverTimings?: ServerTimings;
  /**
   * True for the fallback adapter of unknown APIs: the meter then records
   * only streamed responses (duration and first byte), and nothing else.
   */
  readonly generic?: boolean;
  /**
   * True when one content event usually carries several tokens (Anthropic,
   * Gemini, Bedrock): a stream that ends without the provider's count
   * (cancelled, cut) then has no output count and no TPOT, since its number
   * of events would undercount the tokens and inflate TPOT.
   */
  readonly multiTokenEvents?: boolean;
  /**
   * Whether a reasoning event (reasoning text, a summary of it, a thought part) was streamed,
   * for the adapters that can tell (OpenAI Chat and Responses, Gemini): false until one is.
   * When the provider counts reasoning tokens and none was streamed, they were generated before
   * the first streamed token, outside the span TPOT divides (see RequestMeter.finish).
   * Undefined: not tracked.
   */
  readonly reasoningStreamed?: boolean;
  /**
   * True when the span from the first to the last content event is not where the counted output
   * was generated, so no TPOT is recorded: reasoning generated before the first streamed token
   * and not streamed that the provider did not count (Claude's thinking with no
   * `output_tokens_details`; Bedrock Converse's, which it never counts; a compatible Responses
   * server's), or counted together with reasoning inside the span (between tool uses, or another
   * item's streamed summary); or a stream that relayed whole parts instead of deltas (Responses'
   * `.done` events).
   */
  readonly tpotUnknown?: boolean;
  /**
   * True when the API's path also serves non-LLM models (Workers AI): only streamed
   * answers are measured; a JSON answer records nothing, as for an unknown API.
   */
  readonly streamsOnly?: boolean;
  /**
   * True once the API's own last event of a finished answer was read (OpenAI's `[DONE]`,
   * Anthropic's `message_stop`, Responses' `response.completed`/`incomplete`, Ollama's
   * `done: true`, Bedrock Converse's `metadata`, an Anthropic model's `message_stop` chunk,
   * the Interactions API's `interaction.complete`; Gemini: every candidate's latest chunk has its
   * finish reason and the output count came):
   * a client that hangs up after it had its whole answer did not cancel it. Undefined for the
   * APIs that do not track it.
   */
  readonly complete?: boolean;
  /** Why the model stopped, per choice, as the API says it. Undefined for the APIs that do not say. */
  readonly finishReasons?: FinishReasons;
}

/** The API family of a request: decides the adapter and the semconv names. */
export interface ApiDescriptor {
  /** Adapter id, e.g. `openai-chat`. */
  readonly api: string;
  /** `gen_ai.operation.name` value. */
  readonly operation: string;
  /** `gen_ai.provider.name` default for this API when the route does not say. */
  readonly defaultProviderName: string;
  newAdapter(): ResponseAdapter;
  /** The model when the API puts it in the path (Gemini, Bedrock); the JSON body's `model` otherwise. */
  modelFromPath?(path: string): string | undefined;
  /** Its request may ask for a predicted output (a root `prediction` object): the body is read for it. */
  readonly predictedOutputs?: boolean;
}

/** Helpers shared by the adapters. */
export function obj(v: unknown): Record<string, unknown> | undefined {
  return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

/**
 * A duration or a rate as the wire gives it: a number from 0 to 2^53 − 1, else undefined (not
 * reported). A negative value, or one JSON.parse read as Infinity (`1e400`), is no time; bounded,
 * sums of a few stay finite.
 */
export function num(v: unknown): number | undefined {
  return typeof v === 'number' && v >= 0 && v <= Number.MAX_SAFE_INTEGER ? v : undefined;
}

/**
 * A token count as the wire gives it: an integer from 0 to 2^53 − 1, else undefined (not
 * reported). A fraction is no count, and a tiny one would make a server timing divided by it
 * (Ollama's, Groq's) huge.
 */
export function count(v: unknown): number | undefined {
  return Number.isSafeInteger(v) && (v as number) >= 0 ? (v as number) : undefined;
}

export function nonEmpty(v: unknown): boolean {
  return typeof v === 'string' && v.length > 0;
}

/** An object with at least one key (a tool call's arguments, a generated image's source). */
export function nonEmptyObject(v: unknown): boolean {
  const o = obj(v);
  return o !== undefined && Object.keys(o).length > 0;
}

/** The first non-empty string or number among `vs`, as a string (an error code, say). */
export function firstString(...vs: unknown[]): string | undefined {
  for (const v of vs) if ((typeof v === 'string' && v !== '') || typeof v === 'number') return String(v);
  return undefined;
}

/** JSON.parse that returns an object or undefined, never throws. */
export function parseObject(data: string): Record<string, unknown> | undefined {
  if (data.length === 0 || data.charCodeAt(0) !== 0x7b /* { */) {
    // Tolerate leading whitespace; anything else is not an object.
    const t = data.trimStart();
    if (t.length === 0 || t.charCodeAt(0) !== 0x7b) return undefined;
  }
  try {
    return obj(JSON.parse(data));
  } catch {
    return undefined;
  }
}

/** A short, bounded label value from a provider's string (an error type, a finish reason). */
export function sanitizeErrorType(s: string): string {
  const clean = s.replace(/[^A-Za-z0-9_.-]/g, '_').slice(0, 64);
  return clean === '' ? 'error' : clean;
}

/**
 * A part of a sum that an API leaves out when it is zero (proto3 JSON omits zero fields; a
 * cache or queue time may be missing): 0 when absent or null, else `count(v)`, so a part that is
 * there but bad (−1, 3.5, "7") is undefined and `addParts` reports no sum.
 */
export function countPart(v: unknown): number | undefined {
  return sent(v) ? count(v) : 0;
}

/** As `countPart`, for a duration (`num`). */
export function numPart(v: unknown): number | undefined {
  return sent(v) ? num(v) : 0;
}

/**
 * A figure as a later message updates it: the earlier figure (`last`) when the field is not
 * sent (absent or null), else `count(v)`, so one that is there but bad leaves the figure
 * unreported rather than the earlier, lower running count standing as the final one.
 */
export function countUpdate(last: number | undefined, v: unknown): number | undefined {
  return sent(v) ? count(v) : last;
}

/** Whether a field was sent with a value (null is how some servers say "none"). */
export function sent(v: unknown): boolean {
  return v !== undefined && v !== null;
}

/**
 * The sum of the parts, or undefined when one is undefined (a required part missing, or a part
 * that is bad) or the sum passes 2^53 − 1: a count or time with a bad part is not reported,
 * rather than reported short.
 */
export function addParts(...vs: (number | undefined)[]): number | undefined {
  let s = 0;
  for (const v of vs) {
    if (v === undefined) return undefined;
    s += v;
  }
  return s <= Number.MAX_SAFE_INTEGER ? s : undefined;
}

/** Sum of the defined numbers, or undefined when none is defined. */
export function sumDefined(...vs: (number | undefined)[]): number | undefined {
  let s: number | undefined;
  for (const v of vs) if (v !== undefined) s = (s ?? 0) + v;
  return s;
}

/**
 * The model an API names in its path: the first group of `re` in the path without its
 * query, URL-decoded (for `ApiDescriptor.modelFromPath`).
 */
export function modelInPath(re: RegExp): (path: string) => string | undefined {
  return (path) => {
    const q = path.indexOf('?');
    const m = re.exec(q === -1 ? path : path.slice(0, q));
    return m ? safeDecode(m[1]!) : undefined;
  };
}

/** The model of a Vertex AI partner model's `…/models/{model}:rawPredict` or `:streamRawPredict` path (Claude, Mistral, AI21). */
export const vertexRawPredictModel = modelInPath(/\/models\/([^/:?]+):(?:stream)?[rR]awPredict$/);

/** A path segment URL-decoded; as it is when it is not valid percent-encoding. */
function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}
