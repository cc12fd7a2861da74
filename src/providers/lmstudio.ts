import type { SseEvent } from '../sse/parser.js';
import { errorTypeOf } from './openai-chat.js';
import { EventKind, nonEmpty, addParts, count, num, numPart, obj, parseObject, type ApiDescriptor, type ResponseAdapter, type ServerTimings, type Usage, countUpdate, sent } from './types.js';

/**
 * LM Studio's own REST API (`POST /api/v1/chat`, 0.4+): SSE events named by
 * their JSON `type`, from `chat.start` to `chat.end`.
 *
 * Content-bearing: `message.delta` and `reasoning.delta` with non-empty
 * `content`, `tool_call.arguments` with arguments (a whole object, once per
 * call). Not content: the start/end markers, model load and prompt progress,
 * tool results. Usage and server timings: `chat.end.result.stats`
 * (`input_tokens`, `total_output_tokens`, `reasoning_output_tokens`,
 * `time_to_first_token_seconds`, `tokens_per_second`). Model:
 * `model_instance_id`. In-band error: an `error` event (`error.type`); its
 * `chat.end` still follows. Tool calls on this API are MCP or plugin tools the
 * server runs itself, so their run time is inside the gaps and TPOT.
 */
export class LmStudioAdapter implements ResponseAdapter {
  readonly usage: Usage = {};
  cumulativeOutputTokens: number | undefined;
  responseModel: string | undefined;
  errorType: string | undefined;
  serverTimings: ServerTimings | undefined;

  onEvent(ev: SseEvent): EventKind {
    this.cumulativeOutputTokens = undefined; // a count of this event's, or none
    const o = parseObject(ev.data);
    const type = typeof o?.type === 'string' ? o.type : ev.type;
    if (type === 'error') {
      // Not an Error kind: `chat.end` follows with the usage of what was generated, and the
      // meter stops reading at an Error. The meter takes `errorType` at the end.
      this.errorType = errorTypeOf(o?.error);
      return EventKind.None;
    }
    if (!o) return EventKind.None;
    switch (type) {
      case 'message.delta':
      case 'reasoning.delta':
        return nonEmpty(o.content) ? EventKind.Content : EventKind.None;
      case 'tool_call.arguments': // the whole arguments object, once a call (even `{}`)
        return EventKind.Content;
      case 'chat.start':
        if (nonEmpty(o.model_instance_id)) this.responseModel = o.model_instance_id as string;
        return EventKind.None;
      case 'chat.end':
        this.readResult(obj(o.result));
        return EventKind.None;
      default:
        return EventKind.None;
    }
  }

  /** A non-streamed answer carries the same `stats`. */
  onBody(body: string): void {
    this.readResult(parseObject(body));
  }

  /** Usage arithmetic: output = `total_output_tokens` (reasoning included), input = `input_tokens`. */
  private readResult(r: Record<string, unknown> | undefined): void {
    if (!r) return;
    if (nonEmpty(r.model_instance_id)) this.responseModel = r.model_instance_id as string;
    const s = obj(r.stats);
    if (!s) return;
    if (sent(s.total_output_tokens)) this.usage.outputTokens = this.cumulativeOutputTokens = count(s.total_output_tokens);
    this.usage.inputTokens = countUpdate(this.usage.inputTokens, s.input_tokens);
    this.usage.reasoningTokens = countUpdate(this.usage.reasoningTokens, s.reasoning_output_tokens);
    const st: ServerTimings = {};
    const ttft = num(s.time_to_first_token_seconds);
    const first = addParts(ttft, numPart(s.model_load_time_seconds)); // as Ollama's load time
    if (first !== undefined) st.timeToFirstToken = first;
    const tps = num(s.tokens_per_second);
    const perToken = tps !== undefined && tps > 0 ? num(1 / tps) : undefined; // a tiny rate is no time
    if (perToken !== undefined) st.timePerOutputToken = perToken;
    this.serverTimings = st;
  }
}

export const lmstudioChat: ApiDescriptor = {
  api: 'lmstudio-chat',
  operation: 'chat',
  defaultProviderName: 'lmstudio',
  newAdapter: () => new LmStudioAdapter(),
};
