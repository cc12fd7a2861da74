import type { EventStreamEvent } from '../sse/eventstream.js';
import type { SseEvent } from '../sse/parser.js';
import { AnthropicAdapter } from './anthropic.js';
import { FinishReasons } from './finish-reasons.js';
import { choiceHasContent } from './openai-chat.js';
import { EventKind, modelInPath, nonEmpty, nonEmptyObject, addParts, count, countPart, num, obj, parseObject, sent, type ApiDescriptor, type ResponseAdapter, sanitizeErrorType, type ServerTimings, type Usage, countUpdate } from './types.js';

/**
 * AWS Bedrock Runtime streams (`application/vnd.amazon.eventstream`), one
 * event per decoded frame (see src/sse/eventstream.ts).
 *
 * ConverseStream (`/model/{id}/converse-stream`): content-bearing
 * `contentBlockDelta` frames with non-empty `delta.text`,
 * `delta.reasoningContent.text` or `delta.toolUse.input`, or a
 * `delta.image` (several tokens each). Usage: the `metadata` frame's
 * `usage`; `metrics.latencyMs` is the server-side duration.
 *
 * InvokeModelWithResponseStream (`/model/{id}/invoke-with-response-stream`):
 * `chunk` frames whose payload `{"bytes": base64}` wraps the model's own
 * event. Anthropic events (they have a `type`) go through the Anthropic
 * adapter's logic; other model families count as content when they carry
 * text (`generation`, `outputText`, `completion`, `text`, `outputs[].text`,
 * `generations[].text`, `choices[].delta.content`, Nova's
 * `contentBlockDelta.delta`). The last chunk's
 * `amazon-bedrock-invocationMetrics` gives token counts (used when the model's
 * own usage is missing) and `firstByteLatency` / `invocationLatency`.
 *
 * Finish reason: Converse's `messageStop.stopReason`; in an invoke stream the model's own
 * (Anthropic's `stop_reason`, Llama's `stop_reason`, Titan's `completionReason`, Nova's
 * `messageStop.stopReason`, `outputs` / `generations` / `choices` entries' reason), in a
 * stream or a whole InvokeModel answer (Titan's there in `results[].completionReason`).
 *
 * In-band errors: frames with `:message-type: exception` (type =
 * `:exception-type`, e.g. `throttlingException`) or `error` (`:error-code`).
 */
export class BedrockAdapter implements ResponseAdapter {
  readonly multiTokenEvents = true;
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  errorType: string | undefined;
  serverTimings: ServerTimings | undefined;
  private modelFromStream: string | undefined;
  /** Created on the first Anthropic event inside an invoke `chunk`. */
  private anthropic: AnthropicAdapter | undefined;
  /** Counts from `amazon-bedrock-invocationMetrics`, used when the model's own usage is missing. */
  private metricsOutput: number | undefined;
  private metricsInput: number | undefined;

  get responseModel(): string | undefined {
    return this.anthropic?.responseModel ?? this.modelFromStream;
  }

  /** A Claude model's (invoke): whether its thinking was streamed; not tracked for the others. */
  get reasoningStreamed(): boolean | undefined {
    return this.anthropic?.reasoningStreamed;
  }

  /**
   * A Claude model's (invoke), or Converse's: a reasoning block that streamed no text (its
   * signature, or redacted content) before the first content event. Converse never counts
   * reasoning, so its share of the output count is unknown.
   */
  get tpotUnknown(): boolean {
    return this.anthropic?.tpotUnknown ?? this.converseHiddenReasoning;
  }
  private converseHiddenReasoning = false;
  private converseContentSeen = false;

  /** Converse's last frame (`metadata`, after `messageStop`), or an Anthropic model's `message_stop` chunk. */
  get complete(): boolean {
    return this.converseEnded || this.anthropic?.complete === true;
  }
  private converseEnded = false;

  /** An Anthropic model's own, when it said one; else Converse's or another model family's. */
  get finishReasons(): FinishReasons {
    const a = this.anthropic?.finishReasons;
    return a !== undefined && a.list() !== undefined ? a : this.finish;
  }
  private readonly finish = new FinishReasons();

  onEvent(ev: SseEvent): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    const messageType = (ev as Partial<EventStreamEvent>).messageType;
    if (messageType !== undefined && messageType !== 'event') {
      this.errorType = sanitizeErrorType(ev.type !== '' ? ev.type : messageType);
      return EventKind.Error;
    }
    switch (ev.type) {
      case 'contentBlockDelta': {
        const d = obj(parseObject(ev.data)?.delta);
        if (!d) return EventKind.None;
        if (converseDeltaHasContent(d)) {
          this.converseContentSeen = true;
          return EventKind.Content;
        }
        const r = obj(d.reasoningContent);
        if (!this.converseContentSeen && r !== undefined && (sent(r.signature) || sent(r.redactedContent))) this.converseHiddenReasoning = true;
        return EventKind.None;
      }
      case 'metadata': {
        const o = parseObject(ev.data);
        if (o) this.readConverseMetadata(o);
        this.converseEnded = true;
        return EventKind.None;
      }
      case 'messageStop':
        this.finish.set(0, parseObject(ev.data)?.stopReason);
        return EventKind.None;
      case 'chunk':
        return this.onChunk(ev.data);
      default:
        // messageStart, contentBlockStart/Stop: not output.
        return EventKind.None;
    }
  }

  onBody(body: string): void {
    const o = parseObject(body);
    if (!o) return;
    if (obj(o.usage) && ('output' in o || 'stopReason' in o)) {
      this.readConverseMetadata(o); // Converse (non-streamed)
      this.finish.set(0, o.stopReason);
      return;
    }
    (this.anthropic ??= new AnthropicAdapter()).onBody(body); // InvokeModel with an Anthropic body
    if (o.type !== 'message') readOtherModelFinish(o, this.finish); // another model family's body
    this.sync();
  }

  private onChunk(data: string): EventKind {
    const bytes = parseObject(data)?.bytes;
    if (typeof bytes !== 'string') return EventKind.None;
    const inner = parseObject(Buffer.from(bytes, 'base64').toString('utf8'));
    if (!inner) return EventKind.None;
    const m = obj(inner['amazon-bedrock-invocationMetrics']);
    if (m) this.readInvocationMetrics(m);
    let kind: EventKind;
    if (typeof inner.type === 'string') {
      kind = (this.anthropic ??= new AnthropicAdapter()).onObject(inner.type, inner);
      if (kind === EventKind.Error) this.errorType = this.anthropic.errorType;
    } else {
      kind = otherModelHasContent(inner) ? EventKind.Content : EventKind.None;
      readOtherModelFinish(inner, this.finish);
    }
    this.sync();
    return kind;
  }

  /** Usage arithmetic for the wrapped model: its own usage first, Bedrock's invocation metrics otherwise. */
  private sync(): void {
    const a = this.anthropic?.usage;
    const u = this.usage;
    // The model's own counts once it sent them (unreported when bad: the metrics' input may leave
    // the cache out, and a second source stands in only for one not sent); the invocation
    // metrics otherwise.
    u.inputTokens = this.anthropic?.inputSent === true ? a!.inputTokens : this.metricsInput;
    const own = this.anthropic?.outputSent === true;
    u.outputTokens = own ? a!.outputTokens : this.metricsOutput;
    u.cachedInputTokens = a?.cachedInputTokens;
    u.cacheCreationInputTokens = a?.cacheCreationInputTokens;
    u.reasoningTokens = a?.reasoningTokens;
    this.cumulativeOutputTokens = own ? this.anthropic!.cumulativeOutputTokens : this.metricsOutput;
  }

  private readInvocationMetrics(m: Record<string, unknown>): void {
    this.metricsInput = countUpdate(this.metricsInput, m.inputTokenCount);
    this.metricsOutput = countUpdate(this.metricsOutput, m.outputTokenCount);
    const st: ServerTimings = (this.serverTimings ??= {});
    if (sent(m.firstByteLatency)) st.timeToFirstToken = msToS(num(m.firstByteLatency));
    if (sent(m.invocationLatency)) st.duration = msToS(num(m.invocationLatency));
  }

  /**
   * Usage arithmetic (Converse): Bedrock reports `inputTokens` apart from
   * `cacheReadInputTokens` and `cacheWriteInputTokens`, so input is their sum (absent parts
   * 0; a part that is there but bad leaves it unreported, not the cache counts alone).
   */
  private readConverseMetadata(o: Record<string, unknown>): void {
    const u = obj(o.usage);
    if (u) {
      const any = sent(u.inputTokens) || sent(u.cacheReadInputTokens) || sent(u.cacheWriteInputTokens);
      if (any) this.usage.inputTokens = addParts(countPart(u.inputTokens), countPart(u.cacheReadInputTokens), countPart(u.cacheWriteInputTokens));
      this.usage.cachedInputTokens = countUpdate(this.usage.cachedInputTokens, u.cacheReadInputTokens);
      this.usage.cacheCreationInputTokens = countUpdate(this.usage.cacheCreationInputTokens, u.cacheWriteInputTokens);
      if (sent(u.outputTokens)) this.usage.outputTokens = this.cumulativeOutputTokens = count(u.outputTokens);
    }
    const latency = obj(o.metrics)?.latencyMs;
    if (sent(latency)) (this.serverTimings ??= {}).duration = msToS(num(latency));
  }
}

/**
 * A ConverseStream `delta` (also Nova's own invoke events): text, reasoning, tool input, or a
 * generated image's source (an image delta may carry only the `error` of one that failed).
 */
function converseDeltaHasContent(d: Record<string, unknown>): boolean {
  return nonEmpty(d.text) || nonEmpty(obj(d.reasoningContent)?.text) || nonEmpty(obj(d.toolUse)?.input) || nonEmptyObject(obj(d.image)?.source);
}

function otherModelHasContent(o: Record<string, unknown>): boolean {
  // Llama `generation`, Titan `outputText`, legacy Claude `completion`.
  if (nonEmpty(o.generation) || nonEmpty(o.outputText) || nonEmpty(o.completion)) return true;
  // Cohere Command R: `text-generation` events; its `tool-calls-generation` repeats the plan at the end.
  if (nonEmpty(o.text) && (o.event_type === undefined || o.event_type === 'text-generation')) return true;
  const outputs = o.outputs; // Mistral
  if (Array.isArray(outputs) && outputs.some((x) => nonEmpty(obj(x)?.text))) return true;
  const generations = o.generations; // Cohere Command
  if (Array.isArray(generations) && generations.some((x) => nonEmpty(obj(x)?.text))) return true;
  const nova = obj(obj(o.contentBlockDelta)?.delta); // Amazon Nova
  if (nova && converseDeltaHasContent(nova)) return true;
  const choices = o.choices;
  // OpenAI-shaped models (gpt-oss, Jamba): a Chat `delta` (text, reasoning, tool-call arguments);
  // DeepSeek-R1: completion-style `text`.
  return Array.isArray(choices) && choices.some(choiceHasContent);
}

/** Why another model family's invoke stream stopped (null on the chunks before its last). */
function readOtherModelFinish(o: Record<string, unknown>, f: FinishReasons): void {
  f.set(0, o.stop_reason ?? o.completionReason ?? o.finish_reason); // Llama, DeepSeek, Titan, Cohere Command R
  f.set(0, obj(o.messageStop)?.stopReason); // Nova
  // Mistral, Cohere Command, OpenAI-shaped and DeepSeek, Titan's whole answer (`results`).
  for (const list of [o.outputs, o.generations, o.choices, o.results]) {
    if (!Array.isArray(list)) continue;
    list.forEach((x, i) => {
      const e = obj(x);
      if (e) f.set(e.index ?? i, e.stop_reason ?? e.finish_reason ?? e.completionReason);
    });
  }
}

const MODEL_IN_PATH = /\/model\/([^/]+)\/(?:converse-stream|converse|invoke-with-response-stream|invoke)$/;

const bedrockModel = modelInPath(MODEL_IN_PATH);

export const bedrockConverse: ApiDescriptor = {
  api: 'bedrock-converse',
  operation: 'chat',
  defaultProviderName: 'aws.bedrock',
  newAdapter: () => new BedrockAdapter(),
  modelFromPath: bedrockModel,
};

export const bedrockInvoke: ApiDescriptor = {
  api: 'bedrock-invoke',
  operation: 'chat',
  defaultProviderName: 'aws.bedrock',
  newAdapter: () => new BedrockAdapter(),
  modelFromPath: bedrockModel,
};

/** Milliseconds on the wire as seconds (none stays none). */
function msToS(ms: number | undefined): number | undefined {
  return ms === undefined ? undefined : ms / 1000;
}
