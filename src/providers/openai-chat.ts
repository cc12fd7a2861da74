import type { SseEvent } from '../sse/parser.js';
import { ContentPrefix } from './content-prefix.js';
import { FinishReasons } from './finish-reasons.js';
import { SequenceCounts, sequenceCount } from './sequence-counts.js';
import { EventKind, modelInPath, nonEmpty, nonEmptyObject, addParts, count, countUpdate, num, numPart, obj, parseObject, sent, type ApiDescriptor, type ResponseAdapter, sanitizeErrorType, type ServerTimings, type Usage, vertexRawPredictModel } from './types.js';

/**
 * Finish reasons that say the generation failed: Mistral's `error` (OpenRouter's comes with an
 * `error` object too), DeepSeek's `insufficient_system_resource` (cut for lack of capacity).
 */
const ERROR_FINISH_REASONS = new Set(['error', 'insufficient_system_resource']);

/**
 * Response models whose chunks carry several tokens, in the forms providers and gateways name
 * them: `claude-…`, `anthropic/claude-…` (OpenRouter), `anthropic.claude-…` and
 * `us.anthropic.claude-…` (Bedrock ids), `gemini-…`, `google/gemini-…`, `models/gemini-…`,
 * `vertex_ai/…`, `bedrock/converse/…`, `openrouter/anthropic/…`, `azure_ai/…` (LiteLLM, whose
 * proxy puts the name the client asked for on every chunk), a Bedrock ARN. Not a name that only
 * contains one (`org/claude-distill-8b`, an OpenAI fine-tune `ft:…:claude-…`): those are other
 * models, streamed a token an event.
 */
const MULTI_TOKEN_MODEL =
  /^(?:(?:openrouter|litellm_proxy|bedrock|converse|invoke|vertex_ai(?:_beta)?|azure_ai|~?anthropic|~?google|gemini|models|publishers\/(?:google|anthropic)\/models)\/)*(?:arn:aws[\w-]*:bedrock:[^/]*\/)?(?:(?:us|eu|apac|global|jp|au|us-gov)\.)?(?:anthropic\.)?(?:claude|gemini)-/i;

const NONE = Symbol('no usage beside a choice yet');
const MANY = Symbol('usage beside several choices');

/**
 * OpenAI Chat Completions (and legacy Completions) streams, and the
 * OpenAI-compatible servers: vLLM, llama.cpp, TGI, SGLang, DeepSeek, Groq...
 *
 * Content-bearing: a choice whose delta carries non-empty `content` (a
 * string, or Mistral's list of text/thinking parts), `reasoning_content`,
 * `reasoning`, `refusal`, tool-call `arguments` or custom-tool `input`,
 * legacy `function_call.arguments`, or `audio` (transcript or data); or a
 * legacy completion choice with non-empty `text`. Not content: the role-only
 * first chunk, the finish chunk with an empty delta, the `choices: []` usage
 * chunk, `[DONE]`.
 *
 * Usage: the last `usage.completion_tokens` seen (final usage chunk, DeepSeek's
 * usage on the finish chunk, vLLM's cumulative usage on every chunk; Groq's
 * `x_groq.usage` where there is no `usage`; Moonshot's inside the finishing choice).
 * In-band errors: a chunk with `error` (typed by its `type`/`code`, or TGI's
 * `error_type` beside a message), an `event: error`, and llama.cpp's `error:`
 * field (see SseParser).
 * Server timings: llama.cpp's `timings` object (`prompt_ms`,
 * `predicted_per_token_ms`), on the final chunk or on every chunk; Groq's
 * `prompt_time`, `completion_time`, `total_time` in its usage.
 * llama.cpp's native completion chunks (`{"content", "stop", "tokens_predicted"}`,
 * no `choices`) are read here too: `/completions` without `/v1` is native there;
 * and Cloudflare Workers AI's (`{"response"}`).
 */
export class OpenAIChatAdapter implements ResponseAdapter {
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  responseModel: string | undefined;
  errorType: string | undefined;
  complete = false;
  serverTimings: ServerTimings | undefined;
  /** Set by an audio delta (`gpt-4o-audio`): it holds many tokens, so events are no count. */
  multiTokenEvents = false;
  reasoningStreamed = false;
  readonly finishReasons = new FinishReasons();
  private readonly prefix = new ContentPrefix();
  /** llama.cpp native chunks only. */
  private sequences: SequenceCounts | undefined;
  /**
   * The choice whose chunks carried usage (vLLM's `continuous_usage_stats`: each chunk's usage
   * is that choice's own running count); MANY once chunks of two choices did, whose counts are
   * then no request total until the final `choices: []` usage chunk gives one.
   */
  private usageChoice: unknown = NONE;

  /** `native`: the chunk shape without `choices` this path may also carry, if any. */
  constructor(private readonly native?: 'llama.cpp' | 'workers-ai') {}

  /**
   * Most events of a long stream are plain deltas that, once the model is
   * known, carry nothing else the adapter reads: recognised from their bytes
   * (see ContentPrefix). False: not sure, `onEvent` decides.
   */
  quickContent(buf: Buffer, start: number, end: number): boolean {
    return this.responseModel !== undefined && this.prefix.match(buf, start, end);
  }

  quickContentFrom(buf: Buffer, start: number, limit: number): number {
    return this.responseModel !== undefined ? this.prefix.matchFrom(buf, start, limit) : -1;
  }

  onEvent(ev: SseEvent): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    if (ev.type === 'error') {
      // `event: error`, or llama.cpp's `error:` field (builds before 2025-09), with the error object itself as data.
      const o = parseObject(ev.data);
      this.errorType = o && o.error !== undefined && o.error !== null ? errorTypeOf(o.error, o.error_type) : errorTypeOf(o);
      return EventKind.Error;
    }
    const kind = this.classify(ev.data);
    if (kind === EventKind.Content) this.prefix.learn(ev.data);
    return kind;
  }

  private classify(data: string): EventKind {
    const chunk = parseObject(data); // `[DONE]`, keep-alives, non-JSON: undefined
    if (!chunk) {
      if (data === '[DONE]') this.complete = true;
      return EventKind.None;
    }
    if (chunk.error !== undefined && chunk.error !== null) {
      this.errorType = errorTypeOf(chunk.error, chunk.error_type);
      return EventKind.Error;
    }
    if (this.responseModel === undefined && typeof chunk.model === 'string' && chunk.model !== '') {
      this.responseModel = chunk.model;
      // A gateway relaying Claude or Gemini (LiteLLM, OpenRouter, their own compatible endpoints)
      // passes on their chunks of several tokens each: events are then no count.
      if (MULTI_TOKEN_MODEL.test(chunk.model)) this.multiTokenEvents = true;
    }
    if (chunk.usage && typeof chunk.usage === 'object') {
      this.readUsage(chunk.usage as Record<string, unknown>);
      this.perChoiceUsage(chunk.choices);
    } else {
      const groq = chunk.x_groq as Record<string, unknown> | null | undefined; // Groq before it sent `usage` too
      if (groq && typeof groq === 'object' && groq.usage && typeof groq.usage === 'object') this.readUsage(groq.usage as Record<string, unknown>);
      else this.choiceUsage(chunk.choices);
    }
    if (chunk.timings && typeof chunk.timings === 'object') this.readTimings(chunk.timings as Record<string, unknown>);
    const choices = chunk.choices;
    if (!Array.isArray(choices)) {
      // A server's own chunk shape, read only on that server's paths (see the descriptors).
      if (this.native === 'llama.cpp') return this.llamacppNative(chunk);
      if (this.native === 'workers-ai') return workersAiNative(chunk);
      return EventKind.None;
    }
    this.readFinishReasons(choices);
    for (const choice of choices) {
      if (choiceHasContent(choice)) {
        if (!this.multiTokenEvents && choices.some(hasAudioData)) this.multiTokenEvents = true;
        // A reasoning chunk always reaches this parse: the byte fast path learns its prefix from a
        // parsed chunk, and a reasoning delta after an answer's has another prefix.
        if (!this.reasoningStreamed && choices.some(hasReasoning)) this.reasoningStreamed = true;
        return EventKind.Content;
      }
    }
    return EventKind.None;
  }

  /** `finish_reason` of each choice that has one (null until its last chunk). */
  private readFinishReasons(choices: unknown[]): void {
    for (const c of choices) {
      const o = obj(c);
      if (!o || o.finish_reason === null || o.finish_reason === undefined) continue;
      this.finishReasons.set(o.index, o.finish_reason);
      // A generation that failed, not one that stopped; the usage that may follow is still read.
      if (typeof o.finish_reason === 'string' && ERROR_FINISH_REASONS.has(o.finish_reason)) this.errorType ??= o.finish_reason;
    }
  }

  /**
   * llama.cpp's own completion format (`/completion`, `/completions`, `/infill`): one chunk
   * a token, `content` and `stop` at the top level. `tokens_predicted` is the sequence's
   * running count on every chunk of newer servers, and on the final `stop: true` chunk of
   * all; several prompts (or `n` > 1) interleave sequences told apart by `index`.
   */
  private llamacppNative(chunk: Record<string, unknown>): EventKind {
    if (typeof chunk.stop !== 'boolean') return EventKind.None;
    const { total, grew } = (this.sequences ??= new SequenceCounts()).update(
      chunk.index,
      { output: sequenceCount(chunk.tokens_predicted), input: sequenceCount(chunk.tokens_evaluated) },
      this.usage,
    );
    if (grew !== undefined) this.cumulativeOutputTokens = total; // this chunk reported a count
    if (chunk.stop === true) this.finishReasons.set(chunk.index, llamacppStopType(chunk));
    return nonEmpty(chunk.content) ? EventKind.Content : EventKind.None;
  }

  onBody(body: string): void {
    const r = parseObject(body);
    if (!r) return;
    if (r.error !== undefined && r.error !== null) this.errorType = errorTypeOf(r.error, r.error_type);
    if (typeof r.model === 'string' && r.model !== '') this.responseModel = r.model;
    if (r.usage && typeof r.usage === 'object') this.readUsage(r.usage as Record<string, unknown>);
    if (r.timings && typeof r.timings === 'object') this.readTimings(r.timings as Record<string, unknown>);
    if (Array.isArray(r.choices)) this.readFinishReasons(r.choices);
    else if (this.native === 'llama.cpp') this.llamacppNative(r);
  }

  /** llama.cpp server timings (milliseconds on the wire). */
  private readTimings(t: Record<string, unknown>): void {
    const st: ServerTimings = (this.serverTimings ??= {});
    const perToken = num(t.predicted_per_token_ms);
    // Per token only over a count of tokens: llama.cpp sends predicted_n beside it.
    if (sent(t.predicted_per_token_ms)) st.timePerOutputToken = perToken !== undefined && (count(t.predicted_n) ?? 0) > 0 ? perToken / 1000 : undefined;
    const prompt = num(t.prompt_ms);
    if (sent(t.prompt_ms)) st.timeToFirstToken = prompt === undefined ? undefined : prompt / 1000;
  }

  /**
   * Moonshot (Kimi) sends no top-level `usage`: its finish chunk carries it inside the choice
   * (`choices[0].usage`). Read as usage beside that choice: with several choices reporting, no
   * request total is taken from them (see perChoiceUsage).
   */
  private choiceUsage(choices: unknown): void {
    if (!Array.isArray(choices)) return;
    for (const c of choices) {
      const u = obj(c)?.usage;
      if (!u || typeof u !== 'object') continue;
      this.readUsage(u as Record<string, unknown>);
      this.perChoiceUsage([c]);
    }
  }

  /** After a chunk's usage was read: a count beside one choice of several is that choice's only. */
  private perChoiceUsage(choices: unknown): void {
    if (!Array.isArray(choices) || choices.length === 0) return; // the request's total
    const index = obj(choices[0])?.index;
    if (this.usageChoice === NONE) this.usageChoice = index;
    else if (this.usageChoice !== index) this.usageChoice = MANY;
    if (this.usageChoice === MANY) this.usage.outputTokens = this.cumulativeOutputTokens = undefined;
  }

  private readUsage(u: Record<string, unknown>): void {
    const details = obj(u.completion_tokens_details);
    // Perplexity reports reasoning at the top level of its usage, and streams it in `content`
    // (`<think>…`): it is in the span TPOT divides, not hidden before it.
    const topLevel = !sent(details?.reasoning_tokens) && sent(u.reasoning_tokens);
    if (topLevel) this.reasoningStreamed = true;
    const reasoningSent = topLevel ? u.reasoning_tokens : details?.reasoning_tokens;
    const reasoning = count(reasoningSent);
    this.usage.reasoningTokens = countUpdate(this.usage.reasoningTokens, reasoningSent);
    // Predicted Outputs: the prediction's tokens the model did not keep are in completion_tokens
    // (billed) but not in the stream (RequestMeter takes them out only if the request asked for one).
    this.usage.rejectedPredictionTokens = countUpdate(this.usage.rejectedPredictionTokens, details?.rejected_prediction_tokens);
    const completion = count(u.completion_tokens);
    const prompt = count(u.prompt_tokens);
    if (completion === undefined) {
      // A bad running count (vLLM's continuous usage) leaves the output unreported, not the last good one.
      if (sent(u.completion_tokens)) this.usage.outputTokens = this.cumulativeOutputTokens = undefined;
    } else {
      // OpenAI's completion_tokens include the reasoning tokens; xAI's do not (its total is
      // prompt + completion + reasoning): output is both then, as billed. A reasoning count
      // that is there but bad decides nothing: the output is unreported unless the total says
      // the completion holds the reasoning.
      const badReasoning = reasoning === undefined && sent(reasoningSent);
      const separate = reasoning !== undefined && reasoning > 0 && prompt !== undefined && u.total_tokens === prompt + completion + reasoning;
      const out = badReasoning ? (prompt !== undefined && u.total_tokens === prompt + completion ? completion : undefined) : separate ? addParts(completion, reasoning) : completion;
      this.usage.outputTokens = out;
      this.cumulativeOutputTokens = out;
    }
    this.usage.inputTokens = countUpdate(this.usage.inputTokens, u.prompt_tokens);
    // OpenAI's cached count, else DeepSeek's prompt_cache_hit_tokens, else Moonshot's cached_tokens.
    const promptDetails = obj(u.prompt_tokens_details);
    const cached = promptDetails?.cached_tokens;
    this.usage.cachedInputTokens = countUpdate(this.usage.cachedInputTokens, sent(cached) ? cached : sent(u.prompt_cache_hit_tokens) ? u.prompt_cache_hit_tokens : u.cached_tokens);
    // OpenRouter's prompt-cache writes (part of `prompt_tokens`, as the cached reads are).
    this.usage.cacheCreationInputTokens = countUpdate(this.usage.cacheCreationInputTokens, promptDetails?.cache_write_tokens);
    this.readGroqTimings(u);
  }

  /**
   * Groq's usage also says how long it took (seconds): `queue_time`, `prompt_time`,
   * `completion_time` and `total_time` (prompt + completion). The server's time to first token
   * and duration include the queueing, as Ollama's include loading the model.
   */
  private readGroqTimings(u: Record<string, unknown>): void {
    const prompt = num(u.prompt_time);
    const completion = num(u.completion_time);
    const total = num(u.total_time);
    if (!sent(u.prompt_time) && !sent(u.completion_time) && !sent(u.total_time) && !sent(u.queue_time)) return;
    const queue = numPart(u.queue_time); // a bad one: no TTFT or duration, rather than short ones
    const st: ServerTimings = (this.serverTimings ??= {});
    const out = count(u.completion_tokens);
    if (sent(u.completion_time)) st.timePerOutputToken = completion !== undefined && out !== undefined && out > 0 ? completion / out : undefined;
    if (sent(u.prompt_time) || sent(u.queue_time)) st.timeToFirstToken = addParts(queue, prompt);
    if (sent(u.total_time) || sent(u.queue_time)) st.duration = addParts(queue, total);
  }
}

/**
 * Why llama.cpp's native completion stopped: `stop_type` (`eos`, `limit`, `word`) on newer
 * servers, the `stopped_eos` / `stopped_limit` / `stopped_word` flags on older ones.
 */
function llamacppStopType(chunk: Record<string, unknown>): string | undefined {
  if (nonEmpty(chunk.stop_type) && chunk.stop_type !== 'none') return chunk.stop_type as string;
  if (chunk.stopped_eos === true) return 'eos';
  if (chunk.stopped_limit === true) return 'limit';
  if (chunk.stopped_word === true) return 'word';
  return undefined;
}

/**
 * Cloudflare Workers AI's own chunks (`/ai/run/{model}`): `{"response": "…"}` (a number on
 * some models), tool calls at the top level; usage as in OpenAI's. Newer models send
 * OpenAI-shaped chunks on the same path, which the rest of this adapter reads.
 */
function workersAiNative(chunk: Record<string, unknown>): EventKind {
  const r = chunk.response;
  if (nonEmpty(r) || typeof r === 'number') return EventKind.Content;
  const calls = chunk.tool_calls;
  if (Array.isArray(calls) && calls.some(toolCallHasArguments)) return EventKind.Content;
  return EventKind.None;
}

/** `{function: {arguments}}`, or flat `{name, arguments}` (a string or an object). */
function toolCallHasArguments(c: unknown): boolean {
  const args = obj(c)?.arguments;
  return nonEmpty(obj(obj(c)?.function)?.arguments) || nonEmpty(args) || nonEmptyObject(args);
}

/** A Chat choice (or a completions one) that carries output; also read in Bedrock invoke chunks of OpenAI-shaped models. */
export function choiceHasContent(choice: unknown): boolean {
  if (!choice || typeof choice !== 'object') return false;
  const c = choice as Record<string, unknown>;
  if (nonEmpty(c.text)) return true; // legacy /v1/completions
  const delta = c.delta as Record<string, unknown> | null | undefined;
  if (!delta || typeof delta !== 'object') return false;
  if (nonEmpty(delta.content) || nonEmpty(delta.reasoning_content) || nonEmpty(delta.reasoning) || nonEmpty(delta.refusal)) {
    return true;
  }
  if (Array.isArray(delta.content) && delta.content.some(contentPartHasText)) return true; // Mistral
  const calls = delta.tool_calls;
  if (Array.isArray(calls)) {
    for (const call of calls) {
      if (!call || typeof call !== 'object') continue;
      const c = call as Record<string, unknown>;
      if (nonEmpty(obj(c.function)?.arguments) || nonEmpty(obj(c.custom)?.input)) return true;
    }
  }
  if (nonEmpty(obj(delta.function_call)?.arguments)) return true; // the deprecated `functions` API
  return nonEmpty(obj(delta.audio)?.transcript) || nonEmpty(obj(delta.audio)?.data);
}

function hasReasoning(choice: unknown): boolean {
  const delta = obj(obj(choice)?.delta);
  if (!delta) return false;
  if (nonEmpty(delta.reasoning_content) || nonEmpty(delta.reasoning)) return true;
  return Array.isArray(delta.content) && delta.content.some((p) => Array.isArray(obj(p)?.thinking)); // Mistral
}

function hasAudioData(choice: unknown): boolean {
  return nonEmpty(obj(obj(obj(choice)?.delta)?.audio)?.data);
}

/** Mistral's content as a list of parts: `{type:"text", text}` or `{type:"thinking", thinking:[{type:"text", text}]}`. */
function contentPartHasText(p: unknown): boolean {
  if (nonEmpty(obj(p)?.text)) return true;
  const thinking = obj(p)?.thinking;
  return Array.isArray(thinking) && thinking.some((t) => nonEmpty(obj(t)?.text));
}

/**
 * A short, bounded error type from an error payload: never the message text.
 * `fallback`: a type given beside an error that is only a message (TGI's `error_type`).
 */
export function errorTypeOf(err: unknown, fallback?: unknown): string {
  if (typeof fallback === 'string' && fallback !== '' && (typeof err === 'string' || !err || typeof err !== 'object')) {
    return sanitizeErrorType(fallback);
  }
  if (err && typeof err === 'object') {
    const e = err as Record<string, unknown>;
    for (const k of ['type', 'code', 'status']) {
      const v = e[k];
      if (typeof v === 'string' && v !== '') return sanitizeErrorType(v);
      if (typeof v === 'number') {
        // OpenRouter's mid-stream error: `code` the HTTP-like status, `metadata.error_type` what
        // happened (`provider_unavailable`), which a status-typed 502 could not be told from.
        const named = obj(e.metadata)?.error_type;
        return sanitizeErrorType(typeof named === 'string' && named !== '' ? named : String(v));
      }
    }
  }
  return 'error';
}

export const openaiChat: ApiDescriptor = {
  api: 'openai-chat',
  operation: 'chat',
  defaultProviderName: 'openai',
  newAdapter: () => new OpenAIChatAdapter(),
  predictedOutputs: true,
};

const AZURE_DEPLOYMENT = /\/openai\/deployments\/([^/?]+)\//;

/** Azure OpenAI's deployment paths: the deployment name stands for the model (the body usually has none). */
export const azureOpenaiChat: ApiDescriptor = { ...openaiChat, defaultProviderName: 'azure.ai.openai', modelFromPath: modelInPath(AZURE_DEPLOYMENT) };

/**
 * Vertex AI's partner models other than Claude on `:rawPredict` / `:streamRawPredict` (Mistral,
 * AI21 Jamba): their own APIs, OpenAI-shaped Chat chunks; the model is in the path.
 */
export const vertexPartnerChat: ApiDescriptor = { ...openaiChat, defaultProviderName: 'gcp.vertex_ai', modelFromPath: vertexRawPredictModel };

/** Azure's legacy Completions on a deployment path: the same, as a text completion. */
export const azureOpenaiCompletions: ApiDescriptor = { ...azureOpenaiChat, api: 'openai-completions', operation: 'text_completion' };

const WORKERS_AI_MODEL = /\/(?:ai\/run|workers-ai(?:\/run)?)\/((?:@|%40)[^?]+)/;

/**
 * Workers AI serves every model on one path: embeddings, images and speech too. Only its
 * streams (text generation) are measured; a JSON answer records nothing, as for an unknown API.
 */
class WorkersAiAdapter extends OpenAIChatAdapter {
  readonly streamsOnly = true;
  constructor() {
    super('workers-ai');
  }
}

/**
 * Cloudflare Workers AI (`…/ai/run/@cf/…`; AI Gateway `…/workers-ai/@cf/…` and
 * `…/workers-ai/run/@cf/…`): the model is the rest of the path.
 */
export const workersAi: ApiDescriptor = {
  api: 'workers-ai',
  operation: 'chat',
  defaultProviderName: 'cloudflare.workers_ai',
  newAdapter: () => new WorkersAiAdapter(),
  modelFromPath: modelInPath(WORKERS_AI_MODEL),
};

/** llama.cpp's native `/completion` and `/infill` (see `llamacppNative`). */
export const llamacppCompletion: ApiDescriptor = {
  api: 'llama.cpp-completion',
  operation: 'text_completion',
  defaultProviderName: 'llama.cpp',
  newAdapter: () => new OpenAIChatAdapter('llama.cpp'),
};

export const openaiCompletions: ApiDescriptor = {
  api: 'openai-completions',
  operation: 'text_completion',
  defaultProviderName: 'openai',
  newAdapter: () => new OpenAIChatAdapter('llama.cpp'), // `/completions` without `/v1` is native on llama.cpp
};
