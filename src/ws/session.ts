import { performance } from 'node:perf_hooks';
import { RequestMeter, type MeterOptions, type MeterSummary, type RequestLabels } from '../measure/request-meter.js';
import type { Instruments } from '../metrics/instruments.js';
import { ERROR_TYPE } from '../metrics/semconv.js';
import { addParts, countPart, countUpdate, firstString, nonEmpty, count, obj, sent, parseObject, type ResponseAdapter, type Usage, EventKind } from '../providers/types.js';
import { sanitizeErrorType } from '../providers/types.js';
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
  /** `requestModel`: the URL's, as the client named it (`limitModel` gives its label at each response). */
  readonly labels: RequestLabels;
  readonly meter: MeterOptions;
  /** permessage-deflate was accepted by the upstream's 101. */
  readonly deflate: boolean;
  /**
   * Caps `gen_ai.request.model` values (the client picks them). Called when a response begins: a
   * session that never answers (OpenAI closes one for an unknown model with an error) takes no place.
   */
  readonly limitModel: (model: string | undefined) => string | undefined;
  /** Each finished response, for the log. */
  readonly onResponse?: (s: MeterSummary) => void;
}

/** At most this many responses are open at once (a misbehaving peer cannot grow the map). */
const MAX_OPEN = 64;
/** `response.create`s remembered while waiting for their `response.created`. */
const MAX_WAITING = 16;
/** A `response.create` unanswered this long was refused in a way we did not see (ms); a commit this old began nothing. */
const STALE_CREATE_MS = 10_000;
/** Realtime error codes about a message other than `response.create` (seen from real servers). */
const OTHER_MESSAGE_ERRORS: ReadonlySet<string> = new Set(['input_audio_buffer_commit_empty', 'response_cancel_not_active']);
/** A Live turn end older than this when the model starts answering began something else (ms). */
const STALE_TRIGGER_MS = 60_000;

/** Usage, model and error of one response, set from its messages; the meter reads them at the end. */
class MessagesAdapter implements ResponseAdapter {
  usage: Usage = {};
  responseModel: string | undefined;
  errorType: string | undefined;
  readonly cumulativeOutputTokens = undefined;
  /** An audio delta holds many tokens: without usage, the number of messages is no count. */
  readonly multiTokenEvents = true;
  /**
   * Live: whether the turn streamed a thought part. Gemini Live models think by default without
   * streaming the thoughts, which its usage counts as output; they came before the first streamed
   * token (RequestMeter.finish leaves them out of TPOT, as for generateContent). Realtime: untracked.
   */
  reasoningStreamed: boolean | undefined;
  onEvent(): EventKind {
    return EventKind.None;
  }
}

/**
 * A connection whose upgrade did not open (declined with `status`, or answered by the proxy for
 * an upstream it could not reach): one failed request, with its duration and error type (the
 * status of a declined one, as for HTTP), so an outage or a 429 on connect shows.
 */
export function recordUnopened(ins: Instruments, labels: RequestLabels, start: number, status: number, errorType: string | undefined, meter: MeterOptions): void {
  const m = new RequestMeter(ins, new MessagesAdapter(), labels, start, meter);
  m.responseStart(status, undefined, undefined);
  // A status of 400 and above is its own error type; a 200 or a 302 answer is no open socket either.
  m.finish(performance.now(), errorType ?? (status >= 400 ? undefined : ERROR_TYPE.upgradeDeclined));
}

/** One response being measured; `finish` ends it (and counts it for the log line). */
interface Turn {
  readonly meter: RequestMeter;
  readonly adapter: MessagesAdapter;
  finish(end: number, errorType?: string): void;
}

/** How long a closing tunnel waits for messages still in zlib (a `response.done`, say). */
const CLOSE_WAIT_MS = 200;

/** Sessions whose tunnel has closed and whose last responses are not recorded yet (at most CLOSE_WAIT_MS). */
const closingSessions = new Set<object>();

/** How many sessions are between their tunnel's close and their last records: a final scrape waits for them. */
export function sessionsClosing(): number {
  return closingSessions.size;
}

/** What a held message costs beyond its bytes, counted against the bound. */
const HELD_OVERHEAD = 96;

/** A held message; its direction is the queue it waits in. */
interface Held {
  readonly data: Buffer | undefined;
  readonly at: number;
  /** Order of holding: of two messages that arrived at the same time, the first held goes first. */
  readonly seq: number;
}

/**
 * One direction's held messages: in arrival order, as its reader delivers them, so the oldest
 * held is one of two heads (review 119: a scan of one list per message took seconds for 40,000
 * tiny frames, all within the bound).
 */
class HeldQueue {
  private items: Held[] = [];
  private head = 0;
  get size(): number {
    return this.items.length - this.head;
  }
  peek(): Held | undefined {
    return this.items[this.head];
  }
  push(h: Held): void {
    this.items.push(h);
  }
  shift(): void {
    this.head++;
    if (this.head === this.items.length) this.clear();
    else if (this.head >= 1024 && 2 * this.head >= this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
  }
  clear(): void {
    this.items = [];
    this.head = 0;
  }
}

export class WsSession {
  private readonly up: MessageReader;
  private readonly down: MessageReader;
  private readonly tracker: OpenAiRealtime | GeminiLive;
  /** Measurement gave up on this connection (see `stop`): nothing more is read. */
  private stoppedEarly = false;
  /** Messages waiting for an older one of the other direction that is still being inflated. */
  private readonly heldFromClient = new HeldQueue();
  private readonly heldFromUpstream = new HeldQueue();
  private heldBytes = 0;
  private heldSeq = 0;
  private closing: { end: number; errorType: string | undefined; upstreamFirst: boolean; timer: NodeJS.Timeout } | undefined;
  /** The sides that sent a close frame, in order: the first one's doing cuts the open responses. */
  private readonly closeFrames = new Set<'client' | 'upstream'>();
  private finalizing = false;
  private finalized = false;
  responses = 0;

  constructor(match: WsApiMatch, private readonly deps: WsSessionDeps) {
    const opts = { maxMessageBytes: deps.meter.maxEventBytes, deflate: deps.deflate, onBroken: () => this.stop() };
    const closeFrom = (side: 'client' | 'upstream') => (opcode: number) => {
      if (opcode === 8) this.closeFrames.add(side);
    };
    this.up = new MessageReader((d, t) => this.message(true, d, t), { ...opts, onControl: closeFrom('client') });
    this.down = new MessageReader((d, t) => this.message(false, d, t), { ...opts, onControl: closeFrom('upstream') });
    const open: Open = (start, at, model) => this.open(start, at, model);
    this.tracker = match.api === 'openai-realtime' ? new OpenAiRealtime(open) : new GeminiLive(open);
  }

  /** The measurement of this connection stopped before its end: for the log line. */
  get stopped(): boolean {
    return this.stoppedEarly;
  }

  private get done(): boolean {
    return this.stoppedEarly || this.finalized;
  }

  /** Client bytes, after they were forwarded. */
  fromClient(buf: Buffer, arrival: number): void {
    if (this.done || this.closing !== undefined) return;
    try {
      this.up.push(buf, arrival);
    } catch {
      this.stop();
    }
  }

  /** Upstream bytes (after the 101's head), after they were forwarded. */
  fromUpstream(buf: Buffer, arrival: number): void {
    if (this.done || this.closing !== undefined) return;
    try {
      this.down.push(buf, arrival);
    } catch {
      this.stop();
    }
  }

  /**
   * The tunnel closed at `end`: responses still open end there, as cut (`errorType`), or, on a
   * clean close, as the doing of the side that closed first (its close frame, else its end of
   * the connection): the client's is a cancellation, the upstream's a reset. That happens once
   * the messages that arrived before the close are read (at most CLOSE_WAIT_MS later: they may
   * still be in zlib).
   */
  close(end: number, errorType: string | undefined, upstreamFirst = false): void {
    if (this.closing !== undefined || this.done) return;
    const timer = setTimeout(() => this.finalize(), CLOSE_WAIT_MS);
    timer.unref();
    this.closing = { end, errorType, upstreamFirst, timer };
    closingSessions.add(this);
    if (this.pending() === undefined) this.finalize();
  }

  private pending(): number | undefined {
    const a = this.up.oldestPending;
    const b = this.down.oldestPending;
    return a === undefined ? b : b === undefined ? a : Math.min(a, b);
  }

  /**
   * Both directions are measured in arrival order: a message waits while the other direction
   * still inflates one that arrived before it (a compressed `response.create` and the
   * uncompressed `response.created` that answers it, read in one loop iteration).
   */
  private message(fromClient: boolean, data: Buffer | undefined, at: number): void {
    if (this.done) return;
    if (this.heldFromClient.size + this.heldFromUpstream.size === 0 && this.closing === undefined) {
      // The usual case (nothing inflating in the other direction): measured at once.
      const other = (fromClient ? this.down : this.up).oldestPending;
      if (other === undefined || other > at) return this.measure(fromClient, data, at);
    }
    (fromClient ? this.heldFromClient : this.heldFromUpstream).push({ data, at, seq: this.heldSeq++ });
    this.heldBytes += (data?.length ?? 0) + HELD_OVERHEAD;
    this.drain();
    // zlib's thread pool stalled (other work holds it): the session gives up, not the memory.
    // Judged after the drain: the inflated message that frees the held ones is not waiting.
    if (this.heldBytes > 4 * this.deps.meter.maxEventBytes) this.stop();
  }

  private drain(): void {
    while (!this.done) {
      const c = this.heldFromClient.peek();
      const u = this.heldFromUpstream.peek();
      const fromClient = c !== undefined && (u === undefined || c.at < u.at || (c.at === u.at && c.seq < u.seq));
      const h = fromClient ? c : u;
      if (h === undefined) break;
      const other = (fromClient ? this.down : this.up).oldestPending;
      if (other !== undefined && other <= h.at) return;
      (fromClient ? this.heldFromClient : this.heldFromUpstream).shift();
      this.heldBytes -= (h.data?.length ?? 0) + HELD_OVERHEAD;
      this.measure(fromClient, h.data, h.at);
    }
    if (this.closing !== undefined && !this.done && !this.finalizing && this.pending() === undefined) this.finalize();
  }

  /** The close's end: what was read is measured in order, then the open responses end. */
  private finalize(): void {
    const c = this.closing;
    if (c === undefined || this.done || this.finalizing) return;
    this.finalizing = true;
    clearTimeout(c.timer);
    closingSessions.delete(this);
    this.up.close(); // messages still in zlib are dropped: nothing waits for them below
    this.down.close();
    this.drain();
    if (this.done) return; // a throw while draining stopped the session
    this.finalized = true;
    const [firstClose] = this.closeFrames;
    const byUpstream = firstClose === 'upstream' || (firstClose === undefined && c.upstreamFirst);
    const bySide = byUpstream ? ERROR_TYPE.upstreamReset : ERROR_TYPE.clientCancelled;
    // After a complete closing handshake a socket error (a reset after the echo) changes nothing:
    // the side that closed first did it. A timeout or the shutdown deadline still wins.
    const socketLevel = c.errorType === undefined || c.errorType === ERROR_TYPE.upstreamReset || c.errorType === ERROR_TYPE.clientCancelled;
    this.endOpen(c.end, this.closeFrames.size === 2 && socketLevel ? bySide : (c.errorType ?? bySide));
  }

  /**
   * The messages can no longer be read (a reader broke, a bound was passed, a bug threw): the
   * open responses end now as `measurement_stopped`, and nothing more is measured.
   */
  private stop(): void {
    if (this.done) return;
    this.stoppedEarly = true;
    if (this.closing !== undefined) clearTimeout(this.closing.timer);
    closingSessions.delete(this);
    this.up.close();
    this.down.close();
    this.heldFromClient.clear();
    this.heldFromUpstream.clear();
    this.heldBytes = 0;
    this.endOpen(this.closing?.end ?? performance.now(), ERROR_TYPE.measurementStopped);
  }

  private endOpen(end: number, errorType: string): void {
    const turns: Turn[] = [];
    try {
      this.tracker.closeAll((t) => turns.push(t));
    } catch {
      /* the turns collected so far still end */
    }
    for (const t of turns) {
      try {
        this.finish(t, end, errorType);
      } catch {
        /* measurement only */
      }
    }
  }

  private open(start: number | undefined, at: number, model: string | undefined): Turn {
    const d = this.deps;
    const adapter = new MessagesAdapter();
    const labels: RequestLabels = { ...d.labels, requestModel: d.limitModel(d.labels.requestModel ?? model) };
    const meter = new RequestMeter(d.instruments, adapter, labels, start ?? at, { ...d.meter, unknownStart: start === undefined });
    meter.messagesStart();
    const turn: Turn = { meter, adapter, finish: (end: number, err?: string) => this.finish(turn, end, err) };
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
  private measure(fromClient: boolean, data: Buffer | undefined, at: number): void {
    try {
      if (fromClient) this.tracker.client(data, at);
      else this.tracker.server(data, at);
    } catch {
      this.stop();
    }
  }
}

/** Opens a response: `start` undefined when no message began it; `at` is now. */
type Open = (start: number | undefined, at: number, model: string | undefined) => Turn;

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
const LIVE_CLIENT_KEYS = ['"setup"', '"text"', '"turnComplete"', '"turn_complete"', '"activityEnd"', '"activity_end"', '"audioStreamEnd"', '"audio_stream_end"', '"toolResponse"', '"tool_response"'];

/** Output deltas of the Realtime API (GA names, and the beta's). Transcripts of audio are not output of their own. */
const REALTIME_CONTENT = new Set([
  'response.output_text.delta',
  'response.output_audio.delta',
  'response.function_call_arguments.delta',
  'response.mcp_call_arguments.delta',
  'response.text.delta',
  'response.audio.delta',
]);

const DELTA_PREFIXES = [...REALTIME_CONTENT].map((t) => Buffer.from(`{"type":"${t}",`));
const RESPONSE_ID = Buffer.from('"response_id":"');
const TYPE_KEY = Buffer.from('"type":');
const DELTA = Buffer.from('"delta":"');

/**
 * The response id of an output delta read from its bytes, without JSON.parse (an audio delta
 * is kilobytes of base64), for a message in the API's own shape: it starts with the delta's
 * `type`, flat keys with plain values (no backslash, no nested object) up to a non-empty
 * `delta` string that is the last key, one `response_id` among them. Before the delta's value
 * every quote is then a key's or a value's, so the keys found are the object's own. Anything
 * else (undefined) gets the full parse. Not checked, so counted where JSON.parse would refuse:
 * a malformed value (a number such as `0x`) among those keys; no server sends it.
 */
export function quickDelta(b: Buffer): string | undefined {
  const n = b.length;
  if (n < 40 || b[n - 1] !== 0x7d || b[n - 2] !== 0x22) return undefined; // ends `"}`
  let from = -1;
  for (const p of DELTA_PREFIXES) {
    if (n > p.length && b.compare(p, 0, p.length, 0, p.length) === 0) {
      from = p.length;
      break;
    }
  }
  if (from < 0) return undefined;
  const d = b.indexOf(DELTA, from);
  if (d < 0 || b[d + DELTA.length] === 0x22) return undefined; // no delta, or an empty one: the parse decides
  // Plain keys and values before the delta: no escape, no nesting, no second `type`.
  for (let i = from; i < d; i++) {
    const c = b[i];
    if (c === 0x5c || c === 0x7b || c === 0x5b) return undefined;
  }
  const type = b.indexOf(TYPE_KEY, from);
  if (type !== -1 && type < d) return undefined;
  const r = b.indexOf(RESPONSE_ID, from);
  if (r < 0 || r > d) return undefined;
  const start = r + RESPONSE_ID.length;
  const end = b.indexOf(0x22, start);
  if (end <= start || end > d) return undefined;
  const again = b.indexOf(RESPONSE_ID, end);
  if (again !== -1 && again < d) return undefined;
  // The delta's value must run to the quote before `}`: every quote inside it escaped.
  for (let q = b.indexOf(0x22, d + DELTA.length); ; q = b.indexOf(0x22, q + 1)) {
    let slashes = 0;
    while (b[q - 1 - slashes] === 0x5c) slashes++;
    if (slashes % 2 === 1) continue; // an escaped quote, inside the value
    if (q !== n - 2) return undefined; // the value ends early: more keys follow it
    break;
  }
  return b.toString('utf8', start, end);
}

/**
 * OpenAI Realtime (`/v1/realtime`, Azure's `/openai/realtime`). A response starts at the
 * client's `response.create` (matched in order to the server's `response.created`), or, when
 * the server made it by itself (voice activity detection), at its `input_audio_buffer.committed`.
 * A `response.create` the server rejects gets an `error` and no response: the one the error
 * names by `event_id`, or else the newest waiting, is dropped (not for an error whose code
 * names another message's failure: an empty commit, a cancel with nothing to cancel), and any
 * waiting longer than STALE_CREATE_MS is too. Content: non-empty `delta`s of text, audio and tool-call (and MCP
 * call) arguments, by `response_id`. End: `response.done`, with `usage` (output tokens include
 * audio tokens) and `status`: `cancelled` (the user spoke over it, or the client cancelled) is
 * recorded as cancelled, `failed` as an error with `status_details.error`'s code or type.
 */
class OpenAiRealtime {
  private readonly waiting: { at: number; id: string | undefined }[] = [];
  private committed: number | undefined;
  private readonly open = new Map<string, Turn>();
  private model: string | undefined;

  constructor(private readonly begin: Open) {}

  client(data: Buffer | undefined, at: number): void {
    const m = parseIfAny(data, REALTIME_CLIENT_KEYS);
    if (m?.type !== 'response.create') return;
    this.waiting.push({ at, id: typeof m.event_id === 'string' ? m.event_id : undefined });
    if (this.waiting.length > MAX_WAITING) this.waiting.shift();
  }

  server(data: Buffer | undefined, at: number): void {
    const quick = data === undefined ? undefined : quickDelta(data);
    if (quick !== undefined) {
      this.open.get(quick)?.meter.contentAt(at);
      return;
    }
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
        while (this.waiting.length > 0 && at - this.waiting[0]!.at > STALE_CREATE_MS) this.waiting.shift();
        const asked = this.waiting.shift();
        const committed = this.committed !== undefined && at - this.committed <= STALE_CREATE_MS ? this.committed : undefined;
        const start = asked?.at ?? committed;
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
            inputTokens: count(usage.input_tokens),
            outputTokens: count(usage.output_tokens),
            cachedInputTokens: count(obj(usage.input_token_details)?.cached_tokens),
          };
        }
        const status = r!.status;
        if (status === 'cancelled') return turn.finish(at, ERROR_TYPE.clientCancelled);
        if (status === 'failed') {
          const err = obj(obj(r!.status_details)?.error);
          turn.adapter.errorType = sanitizeErrorType(firstString(err?.code, err?.type) ?? 'failed');
        }
        return turn.finish(at);
      }
      case 'error': {
        // A rejected `response.create` gets no `response.created`: forget the one the error
        // names, or, when it names none (the SDKs send no event_id), the newest. At worst a
        // later response then has no TTFT, rather than one counted from a refused request.
        // Errors whose code names another message's failure forget nothing (a push-to-talk
        // tap commits an empty buffer, then asks for a response that does come).
        const err = obj(m.error);
        if (typeof err?.code === 'string' && OTHER_MESSAGE_ERRORS.has(err.code)) return;
        const id = err?.event_id;
        if (typeof id === 'string' && id !== '') {
          const i = this.waiting.findIndex((w) => w.id === id);
          if (i >= 0) this.waiting.splice(i, 1);
        } else {
          this.waiting.pop();
        }
        return;
      }
    }
  }

  closeAll(end: (t: Turn) => void): void {
    for (const t of this.open.values()) end(t);
    this.open.clear();
  }
}

/** The key in the two spellings proto3 JSON accepts (the Python SDK sends snake_case). */
function field(o: Record<string, unknown> | undefined, camel: string, snake: string): unknown {
  return o === undefined ? undefined : (o[camel] ?? o[snake]);
}

/** Turn-complete reasons of a normal end (the others: the model refused, or could not). */
const LIVE_OK_REASONS = new Set(['TURN_COMPLETE_REASON_UNSPECIFIED', 'NEED_MORE_INPUT']);

/**
 * Gemini Live (`…BidiGenerateContent`). A model turn starts at the client's message that ends
 * its own turn: `clientContent` with `turnComplete`, `realtimeInput` with `activityEnd` or
 * `audioStreamEnd`, or a `toolResponse` (either spelling of the keys). With automatic activity
 * detection no message says when the user stopped speaking: such a turn has no TTFT and no
 * duration, only its gaps, TPOT and usage; an `activityEnd` or `audioStreamEnd` while the model
 * answers (the microphone turned off) starts nothing. Content: `serverContent.modelTurn.parts`
 * with text, inline data (audio) or a call, and `toolCall`. End: `generationComplete` (the
 * model is done; `turnComplete` may follow after the client played the audio), read up to
 * `turnComplete` for its usage and `turnCompleteReason`; a `toolCall` (the client answers, and
 * the model goes on in a turn of its own); `interrupted` (cancelled, at that time). Content after
 * the end (its `turnComplete` not come) is the next turn's once an input came since, else the
 * same turn's, whose end moves to it.
 */
class GeminiLive {
  private trigger: number | undefined;
  private model: string | undefined;
  private turn: Turn | undefined;
  /** When the open turn's generation ended (`generationComplete`, `interrupted`): its end. */
  private ended: number | undefined;
  private interrupted = false;
  /** An `interrupted` came after generationComplete: the turn is whole, its turnComplete may not come. */
  private playbackCut = false;
  /** An `interrupted` came while no turn was open: the input that interrupted is `trigger`. */
  private triggerInterrupted = false;
  /** `trigger` replaced one still unanswered: an `interrupted` with no turn open is its doing. */
  private superseding = false;
  /**
   * Usage sent while no turn was open but an input awaited its answer (gemini-3.1-flash-live
   * sends the prompt's count before the first output of every turn): that input's turn's. It
   * lives as long as the input does: spent with it, replaced with it, stale with it.
   */
  private earlyUsage: Usage | undefined;
  /** When the server last transcribed the user's speech (an input without a client message). */
  private heard: number | undefined;

  constructor(private readonly begin: Open) {}

  client(data: Buffer | undefined, at: number): void {
    const m = parseIfAny(data, LIVE_CLIENT_KEYS);
    if (m === undefined) return;
    const model = obj(m.setup)?.model;
    if (typeof model === 'string' && model !== '') this.model = model.slice(model.lastIndexOf('models/') + (model.includes('models/') ? 7 : 0));
    const ri = obj(field(m, 'realtimeInput', 'realtime_input'));
    // realtimeInput.text always asks for an answer (models that refuse clientContent mid-session
    // take text this way), as a completed clientContent turn does.
    const explicit =
      field(obj(field(m, 'clientContent', 'client_content')), 'turnComplete', 'turn_complete') === true ||
      field(m, 'toolResponse', 'tool_response') !== undefined ||
      (ri !== undefined && nonEmpty(ri.text));
    const audioEnd = ri !== undefined && (field(ri, 'activityEnd', 'activity_end') !== undefined || field(ri, 'audioStreamEnd', 'audio_stream_end') === true);
    if (explicit || (audioEnd && (this.turn === undefined || this.ended !== undefined))) {
      this.superseding = this.turn === undefined && this.trigger !== undefined;
      if (this.turn === undefined) this.earlyUsage = undefined; // sent for the input this one replaces
      this.trigger = at;
      this.triggerInterrupted = false;
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
    if (this.trigger !== undefined && at - this.trigger > STALE_TRIGGER_MS) this.trigger = undefined;
    if (this.heard !== undefined && at - this.heard > STALE_TRIGGER_MS) this.heard = undefined;
    // Early usage is an awaited input's: with none awaited (spent by a turn that ended without
    // output, stale, or none since the last turn began: usage sent after its turn's turnComplete)
    // it is no turn's.
    if (this.trigger === undefined && this.heard === undefined) this.earlyUsage = undefined;
    if (obj(sc?.inputTranscription) !== undefined) this.heard = at;
    // Content after the open turn's generation ended (generationComplete, an interruption) whose
    // turnComplete did not come: the next turn's when it was interrupted or an input came since
    // that end, and that turn ends first (at its end); else the generation went on (trailing audio
    // some servers send after generationComplete), and its end moves to this content.
    if (content && this.turn !== undefined && this.ended !== undefined) {
      if (this.interrupted || this.playbackCut || (this.trigger !== undefined && this.trigger >= this.ended)) this.end();
      else this.ended = at;
    }
    const reason = sc?.turnCompleteReason;
    const failed = typeof reason === 'string' && !LIVE_OK_REASONS.has(reason);
    if (content || (failed && this.turn === undefined && this.trigger !== undefined)) {
      if (this.turn === undefined) {
        this.turn = this.begin(this.trigger, at, this.model);
        this.turn.adapter.responseModel = this.model;
        this.turn.adapter.reasoningStreamed = false;
        this.trigger = undefined;
        // The turn's usage is empty yet: what the early messages made of one is what it would have.
        if (this.earlyUsage !== undefined) Object.assign(this.turn.adapter.usage, this.earlyUsage);
        this.earlyUsage = undefined;
        this.heard = undefined;
        this.superseding = false; // the input that replaced another is being answered
      }
      if (content) this.turn.meter.contentAt(at);
      if (Array.isArray(parts) && parts.some((p) => obj(p)?.thought === true)) this.turn.adapter.reasoningStreamed = true;
    }
    const turn = this.turn;
    const u = obj(m.usageMetadata);
    if (turn === undefined) {
      // A turn interrupted before any output: the input that interrupted it (a second message
      // 5 ms after the first) is the latest trigger and begins the next turn, so it is kept,
      // also through the turnComplete that may close the interrupted turn. Otherwise a turn
      // that ended without output spent what began it, and with it the usage sent for it.
      if (sc?.interrupted === true) {
        // Kept only when a later input replaced an unanswered one; speech (automatic activity
        // detection) sets no trigger, and then the interrupted turn's own trigger is spent.
        if (this.superseding) this.triggerInterrupted = true;
        else this.spendInput();
        this.superseding = false;
      } else if (sc?.turnComplete === true) {
        if (this.triggerInterrupted) this.triggerInterrupted = false;
        else this.spendInput();
      } else if (u !== undefined) {
        liveUsage((this.earlyUsage ??= {}), u);
      }
      return;
    }
    if (u !== undefined) liveUsage(turn.adapter.usage, u);
    if (failed) turn.adapter.errorType = sanitizeErrorType(reason.toLowerCase());
    if (sc?.interrupted === true) {
      // After generationComplete the answer was whole: the user spoke over its playback (the
      // client's buffered audio), which OpenAI's Realtime records as a completed response too.
      if (this.ended === undefined) {
        this.interrupted = true;
        this.ended = at;
      } else this.playbackCut = true;
    }
    if (sc?.generationComplete === true) this.ended ??= at;
    if (sc?.turnComplete === true || call !== undefined) {
      this.ended ??= at;
      this.end();
    }
  }

  /** The input awaiting an answer got none: a turn ended without output (its usage goes at the next message). */
  private spendInput(): void {
    this.trigger = undefined;
    this.heard = undefined;
  }

  private end(): void {
    const turn = this.turn!;
    const end = this.ended!;
    const interrupted = this.interrupted;
    this.turn = undefined;
    this.ended = undefined;
    this.interrupted = false;
    this.playbackCut = false;
    turn.finish(end, interrupted ? ERROR_TYPE.clientCancelled : undefined);
  }

  closeAll(end: (t: Turn) => void): void {
    if (this.turn !== undefined) {
      if (this.ended !== undefined) this.end();
      else end(this.turn);
    }
    this.turn = undefined;
    this.earlyUsage = undefined;
  }
}

/**
 * A Live message's `usageMetadata` into its turn's usage, as generateContent's: a later message's
 * usage updates the turn's, a sum when it sends any of its parts, a count when it sends it.
 * Absent thoughts are 0 (proto3 leaves zeros out); bad ones leave the output unreported.
 */
function liveUsage(usage: Usage, u: Record<string, unknown>): void {
  const response = sent(u.responseTokenCount) ? u.responseTokenCount : u.candidatesTokenCount;
  if (sent(u.promptTokenCount) || sent(u.toolUsePromptTokenCount)) usage.inputTokens = addParts(count(u.promptTokenCount), countPart(u.toolUsePromptTokenCount));
  if (sent(response) || sent(u.thoughtsTokenCount)) usage.outputTokens = addParts(count(response), countPart(u.thoughtsTokenCount));
  usage.reasoningTokens = countUpdate(usage.reasoningTokens, u.thoughtsTokenCount);
  usage.cachedInputTokens = countUpdate(usage.cachedInputTokens, u.cachedContentTokenCount);
}
