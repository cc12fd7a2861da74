import { RequestMeter, type MeterOptions, type MeterSummary, type RequestLabels } from '../measure/request-meter.js';
import type { Instruments } from '../metrics/instruments.js';
import { ERROR_TYPE } from '../metrics/semconv.js';
import { firstString, nonEmpty, num, obj, parseObject, type ResponseAdapter, type Usage, EventKind } from '../providers/types.js';
import { MessageReader } from './messages.js';

/**
 * Measures the responses inside a WebSocket tunnel: OpenAI's Realtime API and Gemini's Live
 * API. Each response (a Realtime `response`, a Live model turn) is measured like a streamed
 * HTTP request, by a RequestMeter of its own:
 *  - start: the message that asked for it (see each API below); TTFT counts from its arrival;
 *  - content: each output delta (text, audio, tool-call arguments), one gap per message;
 *  - end: the message that closes it (`response.done`, `turnComplete`), with its usage.
 * `gen_ai.operation.name` is `realtime` for both, so voice turns do not mix with HTTP chat.
 * The tunnel hands over the bytes after forwarding them; nothing here can delay or alter them.
 */
export type WsApi = 'openai-realtime' | 'gemini-live';

export interface WsApiMatch {
  readonly api: WsApi;
  readonly defaultProviderName: string;
  /** From the URL: Realtime's `model` (or Azure's `deployment`) query parameter. */
  readonly requestModel: string | undefined;
}

export const REALTIME_OPERATION = 'realtime';

/** Which API an upgrade's upstream path speaks, if one this measures. */
export function detectWsApi(path: string): WsApiMatch | undefined {
  const q = path.indexOf('?');
  const p = q === -1 ? path : path.slice(0, q);
  if (/[./]BidiGenerateContent(?:Constrained)?$/.test(p)) {
    // Vertex AI's Live API is `google.cloud.aiplatform.…LlmBidiService/BidiGenerateContent`.
    return { api: 'gemini-live', defaultProviderName: /aiplatform/i.test(p) ? 'gcp.vertex_ai' : 'gcp.gemini', requestModel: undefined };
  }
  if (/\/realtime\/?$/.test(p)) {
    const params = new URLSearchParams(q === -1 ? '' : path.slice(q + 1));
    const azure = /^\/openai\//.test(p);
    return {
      api: 'openai-realtime',
      defaultProviderName: azure ? 'azure.ai.openai' : 'openai',
      requestModel: params.get('model') ?? params.get('deployment') ?? undefined,
    };
  }
  return undefined;
}

export interface WsSessionDeps {
  readonly instruments: Instruments;
  readonly labels: RequestLabels;
  readonly meter: MeterOptions;
  /** permessage-deflate was accepted by the upstream's 101. */
  readonly deflate: boolean;
  /** Caps `gen_ai.request.model` values (the client picks them). */
  readonly limitModel: (model: string | undefined) => string | undefined;
  /** Each finished response, for the log. */
  readonly onResponse?: (s: MeterSummary) => void;
}

/** At most this many responses are open at once (a misbehaving peer cannot grow the map). */
const MAX_OPEN = 64;
/** `response.create`s remembered while waiting for their `response.created`. */
const MAX_WAITING = 16;

/** Usage, model and error of one response, set from its messages; the meter reads them at the end. */
class MessagesAdapter implements ResponseAdapter {
  usage: Usage = {};
  responseModel: string | undefined;
  errorType: string | undefined;
  readonly cumulativeOutputTokens = undefined;
  /** An audio delta holds many tokens: without usage, the number of messages is no count. */
  readonly multiTokenEvents = true;
  onEvent(): EventKind {
    return EventKind.None;
  }
}

interface Turn {
  readonly meter: RequestMeter;
  readonly adapter: MessagesAdapter;
}

export class WsSession {
  private readonly up: MessageReader;
  private readonly down: MessageReader;
  private readonly tracker: OpenAiRealtime | GeminiLive;
  private failed = false;
  responses = 0;

  constructor(match: WsApiMatch, private readonly deps: WsSessionDeps) {
    const opts = { maxMessageBytes: deps.meter.maxEventBytes, deflate: deps.deflate };
    this.up = new MessageReader((d, t) => this.guard(() => this.tracker.client(d, t)), opts);
    this.down = new MessageReader((d, t) => this.guard(() => this.tracker.server(d, t)), opts);
    const open: Open = (start, at, model) => this.open(start, at, model);
    this.tracker = match.api === 'openai-realtime' ? new OpenAiRealtime(open) : new GeminiLive(open);
  }

  /** Client bytes, after they were forwarded. */
  fromClient(buf: Buffer, arrival: number): void {
    if (!this.failed) this.guard(() => this.up.push(buf, arrival));
  }

  /** Upstream bytes (after the 101's head), after they were forwarded. */
  fromUpstream(buf: Buffer, arrival: number): void {
    if (!this.failed) this.guard(() => this.down.push(buf, arrival));
  }

  /** The tunnel closed: responses still open end here, as cut (`errorType`) or cancelled. */
  close(end: number, errorType: string | undefined): void {
    this.up.close();
    this.down.close();
    if (!this.failed) this.guard(() => this.tracker.closeAll((turn) => this.finish(turn, end, errorType ?? ERROR_TYPE.clientCancelled)));
    this.failed = true;
  }

  private open(start: number | undefined, at: number, model: string | undefined): OpenTurn {
    const d = this.deps;
    const adapter = new MessagesAdapter();
    const labels: RequestLabels = { ...d.labels, requestModel: d.labels.requestModel ?? d.limitModel(model) };
    const meter = new RequestMeter(d.instruments, adapter, labels, start ?? at, { ...d.meter, unknownStart: start === undefined });
    meter.messagesStart();
    const turn: OpenTurn = { meter, adapter, finish: (end: number, err?: string) => this.finish(turn, end, err) };
    return turn;
  }

  private finish(turn: Turn, end: number, errorType: string | undefined): void {
    const s = turn.meter.finish(end, errorType);
    if (s !== undefined) {
      this.responses++;
      this.deps.onResponse?.(s);
    }
  }

  /** Measurement must never break the tunnel: a throw stops it for this connection. */
  private guard(fn: () => void): void {
    try {
      fn();
    } catch {
      this.failed = true;
      this.up.close();
      this.down.close();
    }
  }
}

interface OpenTurn extends Turn {
  finish(end: number, errorType?: string): void;
}
/** Opens a response: `start` undefined when no message began it; `at` is now. */
type Open = (start: number | undefined, at: number, model: string | undefined) => OpenTurn;

function parse(data: Buffer | undefined): Record<string, unknown> | undefined {
  return data === undefined ? undefined : parseObject(data.toString('utf8'));
}

/**
 * Client messages are mostly audio (`input_audio_buffer.append`, `realtimeInput.audio`), tens
 * of KiB of base64 each, and only a few kinds matter: a large one is parsed only when one of
 * `keys` (quoted JSON strings, which base64 cannot contain) occurs in it.
 */
const SNIFF_ABOVE = 2048;
function parseIfAny(data: Buffer | undefined, keys: readonly string[]): Record<string, unknown> | undefined {
  if (data === undefined) return undefined;
  if (data.length > SNIFF_ABOVE && !keys.some((k) => data.includes(k))) return undefined;
  return parse(data);
}
const REALTIME_CLIENT_KEYS = ['"response.create"'];
const LIVE_CLIENT_KEYS = ['"setup"', '"turnComplete"', '"activityEnd"', '"audioStreamEnd"', '"toolResponse"'];

/** Output deltas of the Realtime API (GA names, and the beta's). Transcripts of audio are not output of their own. */
const REALTIME_CONTENT = new Set([
  'response.output_text.delta',
  'response.output_audio.delta',
  'response.function_call_arguments.delta',
  'response.text.delta',
  'response.audio.delta',
]);

/**
 * OpenAI Realtime (`/v1/realtime`, Azure's `/openai/realtime`). A response starts at the
 * client's `response.create` (matched in order to the server's `response.created`), or, when
 * the server made it by itself (voice activity detection), at its `input_audio_buffer.committed`.
 * Content: non-empty `delta`s of text, audio and tool-call arguments, by `response_id`. End:
 * `response.done`, with `usage` (output tokens include audio tokens) and `status`: `cancelled`
 * (the user spoke over it, or the client cancelled) is recorded as cancelled, `failed` as an
 * error with `status_details.error`'s type.
 */
class OpenAiRealtime {
  private readonly waiting: { at: number; id: string | undefined }[] = [];
  private committed: number | undefined;
  private readonly open = new Map<string, OpenTurn>();
  private model: string | undefined;

  constructor(private readonly begin: Open) {}

  client(data: Buffer | undefined, at: number): void {
    const m = parseIfAny(data, REALTIME_CLIENT_KEYS);
    if (m?.type !== 'response.create') return;
    this.waiting.push({ at, id: typeof m.event_id === 'string' ? m.event_id : undefined });
    if (this.waiting.length > MAX_WAITING) this.waiting.shift();
  }

  server(data: Buffer | undefined, at: number): void {
    const m = parse(data);
    if (m === undefined) return;
    const type = m.type;
    if (typeof type !== 'string') return;
    if (REALTIME_CONTENT.has(type)) {
      if (nonEmpty(m.delta) && typeof m.response_id === 'string') this.open.get(m.response_id)?.meter.contentAt(at);
      return;
    }
    switch (type) {
      case 'session.created':
      case 'session.updated': {
        const model = obj(m.session)?.model;
        if (typeof model === 'string' && model !== '') this.model = model;
        return;
      }
      case 'input_audio_buffer.committed':
        this.committed = at;
        return;
      case 'response.created': {
        const id = obj(m.response)?.id;
        if (typeof id !== 'string' || this.open.has(id) || this.open.size >= MAX_OPEN) return;
        const asked = this.waiting.shift();
        const start = asked?.at ?? this.committed;
        this.committed = undefined;
        const turn = this.begin(start, at, this.model);
        turn.adapter.responseModel = this.model;
        this.open.set(id, turn);
        return;
      }
      case 'response.done': {
        const r = obj(m.response);
        const id = r?.id;
        const turn = typeof id === 'string' ? this.open.get(id) : undefined;
        if (turn === undefined) return;
        this.open.delete(id as string);
        const usage = obj(r!.usage);
        if (usage !== undefined) {
          turn.adapter.usage = {
            inputTokens: num(usage.input_tokens),
            outputTokens: num(usage.output_tokens),
            cachedInputTokens: num(obj(usage.input_token_details)?.cached_tokens),
          };
        }
        const status = r!.status;
        if (status === 'cancelled') return turn.finish(at, ERROR_TYPE.clientCancelled);
        if (status === 'failed') {
          const err = obj(obj(r!.status_details)?.error);
          turn.adapter.errorType = firstString(err?.type, err?.code) ?? 'failed';
        }
        return turn.finish(at);
      }
      case 'error': {
        // A rejected `response.create` gets no `response.created`: forget it, if it had an id.
        const id = obj(m.error)?.event_id;
        const i = typeof id === 'string' ? this.waiting.findIndex((w) => w.id === id) : -1;
        if (i >= 0) this.waiting.splice(i, 1);
        return;
      }
    }
  }

  closeAll(end: (t: OpenTurn) => void): void {
    for (const t of this.open.values()) end(t);
    this.open.clear();
  }
}

/**
 * Gemini Live (`…BidiGenerateContent`). A model turn starts at the client's message that ends
 * its own turn: `clientContent` with `turnComplete`, `realtimeInput` with `activityEnd` or
 * `audioStreamEnd`, or a `toolResponse`. With automatic activity detection no message says
 * when the user stopped speaking: such a turn has no TTFT and no duration, only its gaps,
 * TPOT and usage. Content: `serverContent.modelTurn.parts` with text, inline data (audio) or a
 * call, and `toolCall`. End: `turnComplete` (usage is read up to it), a `toolCall` (the client
 * answers, and the model goes on in a turn of its own), or `interrupted` (cancelled).
 */
class GeminiLive {
  private trigger: number | undefined;
  private model: string | undefined;
  private turn: OpenTurn | undefined;

  constructor(private readonly begin: Open) {}

  client(data: Buffer | undefined, at: number): void {
    const m = parseIfAny(data, LIVE_CLIENT_KEYS);
    if (m === undefined) return;
    const model = obj(m.setup)?.model;
    if (typeof model === 'string' && model !== '') this.model = model.slice(model.lastIndexOf('models/') + (model.includes('models/') ? 7 : 0));
    const ri = obj(m.realtimeInput);
    if (obj(m.clientContent)?.turnComplete === true || (ri !== undefined && (ri.activityEnd !== undefined || ri.audioStreamEnd === true)) || m.toolResponse !== undefined) {
      this.trigger = at;
    }
  }

  server(data: Buffer | undefined, at: number): void {
    const m = parse(data);
    if (m === undefined) return;
    const sc = obj(m.serverContent);
    const call = obj(m.toolCall);
    const parts = obj(sc?.modelTurn)?.parts;
    let content = call !== undefined && Array.isArray(call.functionCalls) && call.functionCalls.length > 0;
    if (!content && Array.isArray(parts)) {
      for (const p of parts) {
        const part = obj(p);
        if (part !== undefined && (nonEmpty(part.text) || nonEmpty(obj(part.inlineData)?.data) || part.functionCall !== undefined || part.executableCode !== undefined)) {
          content = true;
          break;
        }
      }
    }
    if (content) {
      if (this.turn === undefined) {
        this.turn = this.begin(this.trigger, at, this.model);
        this.turn.adapter.responseModel = this.model;
        this.trigger = undefined;
      }
      this.turn.meter.contentAt(at);
    }
    const turn = this.turn;
    if (turn === undefined) return;
    const u = obj(m.usageMetadata);
    if (u !== undefined) {
      const response = num(u.responseTokenCount) ?? num(u.candidatesTokenCount);
      const thoughts = num(u.thoughtsTokenCount);
      turn.adapter.usage = {
        inputTokens: num(u.promptTokenCount),
        outputTokens: response === undefined ? undefined : response + (thoughts ?? 0),
        reasoningTokens: thoughts,
        cachedInputTokens: num(u.cachedContentTokenCount),
      };
    }
    if (sc?.interrupted === true) {
      this.turn = undefined;
      turn.finish(at, ERROR_TYPE.clientCancelled);
    } else if (sc?.turnComplete === true || call !== undefined) {
      this.turn = undefined;
      turn.finish(at);
    }
  }

  closeAll(end: (t: OpenTurn) => void): void {
    if (this.turn !== undefined) end(this.turn);
    this.turn = undefined;
  }
}
