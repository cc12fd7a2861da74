import type { SseEvent } from '../sse/parser.js';
import { FinishReasons } from './finish-reasons.js';
import { objectFromEdges } from './json-edges.js';
import { errorTypeOf } from './openai-chat.js';
import { EventKind, modelInPath, nonEmpty, nonEmptyObject, addParts, count, countPart, obj, sent, parseObject, type ApiDescriptor, type ResponseAdapter, sanitizeErrorType, type Usage, countUpdate } from './types.js';

/**
 * Google Gemini `:streamGenerateContent?alt=sse` (Gemini API and Vertex AI):
 * `data:` events, CRLF-separated, no terminator.
 *
 * Content-bearing: a chunk whose candidates have a part the model generated:
 * non-empty `text` (`thought: true` parts are reasoning, still output), a
 * `functionCall` with a name, arguments or a streamed argument value (Vertex's
 * `partialArgs`; the empty `functionCall: {}` that ends one is not content),
 * `executableCode.code`, or `inlineData.data` (generated images). Not
 * content: a `thoughtSignature` on an empty text, `codeExecutionResult` (the
 * tool's output, not the model's). Chunks carry many tokens each.
 * Usage: `usageMetadata` on the chunks; `candidatesTokenCount` is cumulative
 * where present (it may only appear on the last chunk), `thoughtsTokenCount`
 * is not included in it. In-band error: a `{"error":{...}}` event, and a
 * prompt the API blocked (`promptFeedback.blockReason`, with HTTP 200 and no
 * candidates; Google's SDKs raise on it): typed by its reason. Finish reason: each
 * candidate's `finishReason` (`STOP`, `MAX_TOKENS`, `SAFETY`, ...), on its last chunk.
 * A chunk over `limits.maxEventBytes` (a generated image's base64, which may come with the
 * finish reason and usage) is read as far as its edges show it (json-edges.ts: the finish,
 * index and usage after the image, the part's key before it; output that follows a long part
 * that is not, such as a `thoughtSignature` over 1 KiB, is not seen).
 *
 * Without `alt=sse` (or with `alt=json`) the API streams one JSON array
 * (`application/json`), element by element: each element is an event, as with
 * SSE. A non-array JSON body (`:generateContent`) is read whole at the end.
 */
export class GeminiAdapter implements ResponseAdapter {
  readonly multiTokenEvents = true;
  reasoningStreamed = false;
  readonly streamsJsonArray = true;
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  responseModel: string | undefined;
  errorType: string | undefined;
  readonly finishReasons = new FinishReasons();
  /**
   * Every candidate seen has its finish reason and the output count came with or after the last
   * of them (some streams send it in a usage-only chunk after): the answer is whole (the stream
   * has no last event of its own), so a client that hangs up now did not cancel it.
   */
  complete = false;
  /** Candidate indexes (below 31) seen, and those whose latest chunk finished them: bit masks. */
  private seen = 0;
  private finished = 0;
  /** An output count arrived since every candidate was last finished. */
  private countedSinceDone = false;

  onEvent(ev: SseEvent): EventKind {
    const o = ev.oversize !== undefined ? objectFromEdges(ev.oversize.head, ev.oversize.tail) : parseObject(ev.data);
    if (!o) return EventKind.None;
    return this.onChunk(o);
  }

  private onChunk(o: Record<string, unknown>): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    if (o.error !== undefined && o.error !== null) {
      this.errorType = errorTypeOf(geminiError(o.error));
      return EventKind.Error;
    }
    if (typeof o.modelVersion === 'string' && o.modelVersion !== '') this.responseModel = o.modelVersion;
    const u = obj(o.usageMetadata);
    if (u) this.readUsage(u);
    const blocked = obj(o.promptFeedback)?.blockReason;
    if (nonEmpty(blocked)) {
      this.errorType = sanitizeErrorType(blocked as string);
      return EventKind.Error;
    }
    const counted = u !== undefined && (sent(u.candidatesTokenCount) || sent(u.thoughtsTokenCount));
    const cands = o.candidates;
    if (!Array.isArray(cands)) {
      this.updateComplete(counted); // a usage-only chunk after the last finish
      return EventKind.None;
    }
    let content = false;
    for (const c of cands) {
      const cand = obj(c);
      const bit = candidateBit(cand?.index);
      this.seen |= bit;
      if (cand?.finishReason !== undefined) this.finishReasons.set(cand.index, cand.finishReason);
      // A candidate's latest chunk decides: some gateways put STOP on an early empty chunk and stream on.
      if (nonEmpty(cand?.finishReason) && cand!.finishReason !== 'FINISH_REASON_UNSPECIFIED') this.finished |= bit;
      else this.finished &= ~bit;
      const parts = obj(cand?.content)?.parts;
      if (!Array.isArray(parts)) continue;
      for (const p of parts) {
        const part = obj(p);
        if (!part || !partHasContent(part)) continue;
        content = true;
        if (part.thought === true) this.reasoningStreamed = true;
      }
    }
    this.updateComplete(counted);
    return content ? EventKind.Content : EventKind.None;
  }

  private updateComplete(counted: boolean): void {
    if (this.finished === 0 || (this.seen & ~this.finished) !== 0) {
      this.complete = this.countedSinceDone = false;
      return;
    }
    if (counted) this.countedSinceDone = true;
    this.complete = this.countedSinceDone;
  }

  onBody(body: string): void {
    let v: unknown;
    try {
      v = JSON.parse(body);
    } catch {
      return;
    }
    const list = Array.isArray(v) ? v : [v];
    for (const item of list) {
      const o = obj(item);
      if (o) this.onChunk(o);
    }
  }

  /**
   * Usage arithmetic: output = candidatesTokenCount + thoughtsTokenCount
   * (thinking is billed as output but reported apart); input =
   * promptTokenCount (+ toolUsePromptTokenCount), which already includes
   * `cachedContentTokenCount`. Cumulative per chunk once candidates are counted.
   * proto3 JSON leaves a zero count out, so an absent part is 0 (the prompt count is always
   * there); a part that is there but bad makes the sum unreported, also after an earlier
   * chunk's (the thoughts alone are not the output).
   */
  private readUsage(u: Record<string, unknown>): void {
    if (sent(u.promptTokenCount) || sent(u.toolUsePromptTokenCount)) {
      this.usage.inputTokens = addParts(count(u.promptTokenCount), countPart(u.toolUsePromptTokenCount));
    }
    this.usage.cachedInputTokens = countUpdate(this.usage.cachedInputTokens, u.cachedContentTokenCount);
    this.usage.reasoningTokens = countUpdate(this.usage.reasoningTokens, u.thoughtsTokenCount);
    if (sent(u.candidatesTokenCount) || sent(u.thoughtsTokenCount)) {
      const out = addParts(countPart(u.candidatesTokenCount), countPart(u.thoughtsTokenCount));
      this.usage.outputTokens = out;
      this.cumulativeOutputTokens = out;
    }
  }
}

/** A candidate's bit (`index` absent is candidate 0; past 30 they share the last bit). */
function candidateBit(index: unknown): number {
  const i = typeof index === 'number' && Number.isInteger(index) && index > 0 ? Math.min(index, 30) : 0;
  return 1 << i;
}

function partHasContent(part: Record<string, unknown>): boolean {
  if (nonEmpty(part.text)) return true;
  const call = obj(part.functionCall);
  if (call) {
    if (nonEmpty(call.name)) return true;
    if (nonEmptyObject(call.args)) return true;
    const partial = call.partialArgs;
    if (Array.isArray(partial) && partial.some(partialArgHasValue)) return true;
  }
  return nonEmpty(obj(part.executableCode)?.code) || nonEmpty(obj(part.inlineData)?.data);
}

/** One streamed argument (`{jsonPath, stringValue | numberValue | boolValue | nullValue}`): content unless its value is an empty string. */
function partialArgHasValue(a: unknown): boolean {
  const o = obj(a);
  if (!o) return false;
  if (typeof o.stringValue === 'string') return o.stringValue !== '';
  return o.numberValue !== undefined || o.boolValue !== undefined || o.nullValue !== undefined;
}

/** Google errors: `{code: 503, message, status: "UNAVAILABLE"}`: the status is the type. */
function geminiError(e: unknown): unknown {
  const o = obj(e);
  if (o && typeof o.status === 'string' && o.status !== '') return { type: o.status };
  return e;
}

// A tuned model keeps its collection in the label (`tunedModels/x`): its id can be a base model's name.
const MODEL_IN_PATH = /\/(?:models\/|endpoints\/|(?=tunedModels\/))((?:tunedModels\/)?[^/:?]+):(?:streamGenerateContent|generateContent)$/;

const geminiModel = modelInPath(MODEL_IN_PATH);

export const geminiStream: ApiDescriptor = {
  api: 'gemini',
  operation: 'generate_content',
  defaultProviderName: 'gcp.gemini',
  newAdapter: () => new GeminiAdapter(),
  modelFromPath: geminiModel,
};
