import type { Attributes } from '@opentelemetry/api';
import type { Instruments } from '../metrics/instruments.js';
import { ATTR, ERROR_TYPE, TOKEN_TYPE } from '../metrics/semconv.js';
import { EventKind, type ResponseAdapter, type TokenCountSource } from '../providers/types.js';
import type { BudgetShare, ByteBudget } from '../sse/byte-budget.js';
import { EventStreamDecoder } from '../sse/eventstream.js';
import { JsonArrayParser } from '../sse/json-array.js';
import { NdjsonParser } from '../sse/ndjson.js';
import { PendingBytes } from '../sse/pending-bytes.js';
import { SseParser, type SseEvent, type SseLane } from '../sse/parser.js';
import { StreamClock } from '../timing/stream-clock.js';

export interface RequestLabels {
  provider: string;
  operation: string;
  requestModel: string | undefined;
  /** The upstream host (an IPv6 address without brackets). */
  serverAddress: string;
  serverPort?: number;
}

export interface MeterOptions {
  maxEventBytes: number;
  /** Largest non-streamed JSON body kept for usage parsing. */
  maxBodyBytes: number;
  /**
   * What all requests together may hold of events being read and of bodies kept
   * (`limits.maxBufferedBytes`); the request's part is given back at `finish()` or `discard()`.
   * Default: not bounded across requests.
   */
  budget?: ByteBudget;
  /**
   * Runs the once-per-request instrument calls of the stream's start (TTFB,
   * TTFT) and the queued events; the proxy passes `afterIo`. Default: at once.
   * A caller that defers must defer `finish()` through the same queue too (the
   * proxy does), so that they come before the end's records.
   */
  defer?: (fn: () => void) => void;
  /** Caps the distinct values of `gen_ai.response.model` (the upstream controls it). Default: none. */
  limitResponseModel?: (model: string) => string;
  /** Caps the distinct values of `error.type` (statuses and in-band types come from the upstream). Default: none. */
  limitErrorType?: (errorType: string) => string;
  /**
   * The request's start is not known (a WebSocket turn that no message began, see
   * ws/session.ts): `start` is only a placeholder, and neither TTFT nor duration is recorded.
   */
  unknownStart?: boolean;
}

const runNow = (fn: () => void): void => fn();
/** In the queue of events waiting for their measurement: a content event found from its bytes. */
const CONTENT = 0;

/** `buf[start, end)`: the buffer itself when that is all of it, else a view. */
const piece = (buf: Buffer, start: number, end: number): Buffer => (start === 0 && end === buf.length ? buf : buf.subarray(start, end));

/** What a finished request looked like; used for the log line and tests. */
export interface MeterSummary {
  status: number;
  streamed: boolean;
  ttftMs: number | undefined;
  tpotMs: number | undefined;
  /**
   * The longest gap between two content events; for a stream cancelled or failed after its
   * first, also the time from its last content event to its end. Undefined before a gap.
   */
  maxGapMs: number | undefined;
  /** Undefined when the start was not known. */
  durationMs: number | undefined;
  contentEvents: number;
  outputTokens: number | undefined;
  inputTokens: number | undefined;
  tokenCountSource: TokenCountSource;
  responseModel: string | undefined;
  errorType: string | undefined;
  /** Why the model stopped, per choice, as the API says it; undefined when it said nothing. */
  finishReasons: (string | null)[] | undefined;
  outcome: 'ok' | 'error' | 'cancelled';
}

type Framing = 'sse' | 'ndjson' | 'eventstream' | 'json' | 'jsonarray' | 'messages' | 'none';
type StreamKind = 'sse' | 'ndjson' | 'eventstream';

/** Largest number of per-token ITL samples one event may add (a guard, not a expected size). */
const MAX_TOKENS_PER_EVENT = 65536;

/** The streaming framing a response content type announces, if any. */
export function streamKindOf(contentType: string | undefined): StreamKind | undefined {
  const ct = (contentType ?? '').trimStart().toLowerCase();
  if (ct.startsWith('text/event-stream')) return 'sse';
  if (
    ct.startsWith('application/x-ndjson') ||
    ct.startsWith('application/ndjson') ||
    ct.startsWith('application/jsonl') ||
    ct.startsWith('application/x-jsonlines') ||
    ct.startsWith('application/stream+json') // another name for the same (Spring WebFlux and others)
  ) {
    return 'ndjson';
  }
  if (ct.startsWith('application/vnd.amazon.eventstream')) return 'eventstream';
  return undefined;
}

/**
 * Measures one proxied LLM request. The proxy calls `chunk()` only after the
 * bytes were handed to the client, with the arrival time it took before
 * writing; nothing here can delay or alter the forwarded bytes, and nothing
 * here throws into the forwarding path.
 */
export class RequestMeter {
  private readonly clock: StreamClock;
  private framing: Framing = 'none';
  /** The incremental parser for the framing (SSE, NDJSON, event-stream or a streamed JSON array). */
  private parser: SseParser | NdjsonParser | EventStreamDecoder | JsonArrayParser | undefined;
  /** A JSON body of an API that may stream it as an array: looks at its first bytes. */
  private jsonArray: JsonArrayParser | undefined;
  /** The response was announced as a stream (by its content type). */
  private streamed = false;
  /** Unknown API and not a stream: nothing is recorded for this request. */
  private disabled = false;
  private firstByteSeen = false;
  /** Cumulative output tokens at the previous content event (per-token ITL). */
  private prevCumulative: number | undefined;
  /** A non-streamed JSON body, copied into one buffer up to maxBodyBytes (not a view per chunk: 1-byte chunks). */
  private body: PendingBytes | undefined;
  /** This request's part of `budget`, once the answer is read (closed when the request ends). */
  private share: BudgetShare | undefined;
  private status = 0;
  private labels: Attributes | undefined;
  private activeLabels: Attributes | undefined;
  private now = 0;
  private inbandError: string | undefined;
  private finished = false;
  /**
   * When the client first held the stream back (`clientHeld`): content that arrived from then
   * on times the client, not the provider, and is not recorded. Infinity while it kept up.
   */
  private heldFrom = Infinity;
  private predicted = false;
  private readonly defer: (fn: () => void) => void;
  /**
   * Events that need a full parse (a stream's first events, and any the byte path is not sure
   * of), queued with their arrival times when the caller defers (the proxy: after the loop
   * iteration's I/O), flat: [event, arrival, ...]; `CONTENT` stands for a content event found
   * from its bytes while others wait, so that a stream's events are measured in order. In a
   * burst of new streams, each stream's parsing and prefix learning then no longer runs between
   * two streams' forwarding.
   */
  private pending: (SseEvent | typeof CONTENT | number)[] = [];
  private readonly flushPending = (): void => this.flush();
  private readonly onSseEvent = (ev: SseEvent): void => {
    if (this.defer === runNow) this.event(ev);
    else this.enqueue(ev);
  };
  /** SSE data offered as bytes: plain content deltas are counted without decoding them. */
  private readonly onSseData = (buf: Buffer, start: number, end: number, type: string): boolean => {
    if (this.inbandError !== undefined) return true;
    if (type !== '' || !this.adapter.quickContent!(buf, start, end)) return false;
    this.contentNowOrQueued();
    return true;
  };

  constructor(
    private readonly ins: Instruments,
    private readonly adapter: ResponseAdapter,
    private readonly requestLabels: RequestLabels,
    start: number,
    private readonly opts: MeterOptions,
  ) {
    this.clock = new StreamClock(start);
    this.defer = opts.defer ?? runNow;
    // Active from the request on, so that requests waiting for a response head (a provider that
    // hangs) are counted too.
    const l = requestLabels;
    const active = (this.activeLabels = ins.labels.of(ATTR.provider, l.provider, ATTR.operation, l.operation, ATTR.serverAddress, l.serverAddress, ATTR.serverPort, l.serverPort));
    ins.streamsActive.add(1, active);
  }

  /** Dropped without a record (its set-up failed): no longer active. */
  discard(): void {
    this.finished = true;
    this.share?.close();
    this.inactive();
  }

  /** No longer counted as active (finished, or found not to be measured). */
  private inactive(): void {
    if (this.activeLabels === undefined) return;
    this.ins.streamsActive.add(-1, this.activeLabels);
    this.activeLabels = undefined;
  }

  /** Response headers arrived. */
  responseStart(status: number, contentType: string | undefined, contentEncoding: string | undefined): void {
    this.status = status;
    const kind = streamKindOf(contentType);
    if ((this.adapter.generic === true || this.adapter.streamsOnly === true) && kind === undefined) {
      // Not an LLM API we know (or a path that also serves other models), and not a stream:
      // no gen_ai metrics (e.g. GET /v1/models).
      this.disabled = true;
      this.inactive();
      return;
    }
    this.streamed = kind !== undefined;
    this.startRecording();
    if (this.adapter.generic === true) return; // timed only: duration and first byte

    // Compressed bodies are forwarded as they are and only timed, not parsed.
    // Codings are case-insensitive (RFC 9110 §8.4.1); `none`, not a coding, is what some hosts send
    // to keep a CDN from compressing an event stream: the bytes are plain. A list (one field or
    // several, joined) is plain only when every coding in it is.
    if (contentEncoding !== undefined && !contentEncoding.split(',').every(plainCoding)) return;
    const max = this.opts.maxEventBytes;
    // Not after finish(), which closes it (nothing is read then anyway).
    const share = (this.share = this.finished ? undefined : this.opts.budget?.share());
    if (kind === 'sse') {
      this.framing = 'sse';
      const adapter = this.adapter;
      this.parser = new SseParser(this.onSseEvent, {
        maxEventBytes: max,
        share,
        onData: adapter.quickContent !== undefined ? this.onSseData : undefined,
        lane: adapter.quickContentFrom !== undefined ? this.lane() : undefined,
      });
    } else if (kind === 'ndjson') {
      this.framing = 'ndjson';
      this.parser = new NdjsonParser(this.onSseEvent, { maxEventBytes: max, share });
    } else if (kind === 'eventstream') {
      this.framing = 'eventstream';
      this.parser = new EventStreamDecoder(this.onSseEvent, { maxFrameBytes: max, share });
    } else if ((contentType ?? '').toLowerCase().includes('json') && this.adapter.onBody) {
      this.framing = 'json';
      this.body = new PendingBytes(this.opts.maxBodyBytes, false, share);
      // An error answer is not a stream, even as an array (Gemini's `[{"error":…}]`): its status stays its error type.
      if (this.adapter.streamsJsonArray === true && status < 300) this.jsonArray = new JsonArrayParser(this.onSseEvent, { maxEventBytes: max, share });
    }
  }

  /**
   * A response made of WebSocket messages (ws/session.ts) began: the caller reads the messages
   * and reports content with `contentAt()` and usage, model and errors through the adapter.
   */
  messagesStart(): void {
    this.status = 101;
    this.streamed = true;
    this.framing = 'messages';
    this.startRecording();
  }

  /** The request's labels are fixed. */
  private startRecording(): void {
    this.labels = this.requestOnlyLabels();
  }

  /** A content message arrived at `arrival` (ms): TTFT or a gap. */
  contentAt(arrival: number): void {
    if (this.finished || this.framing !== 'messages') return;
    this.now = arrival;
    this.content(undefined);
  }

  /**
   * Body bytes `buf[start, end)` that were already written to the client, with
   * their arrival time (ms). A range, not a view: one read of a chunked body
   * holds many events, and the parser keeps working on the read's own buffer.
   */
  chunk(buf: Buffer, arrival: number, start = 0, end = buf.length): void {
    if (this.finished || this.disabled) return;
    this.now = arrival;
    if (!this.firstByteSeen) {
      this.firstByteSeen = true;
      const ttfb = (arrival - this.clock.start) / 1000;
      this.defer(() => this.ins.timeToFirstByte.record(ttfb, this.labels));
    }
    try {
      const parser = this.parser;
      if (parser instanceof SseParser) {
        parser.push(buf, start, end);
      } else if (parser !== undefined) {
        parser.push(piece(buf, start, end));
      } else if (this.framing === 'json') {
        const arr = this.jsonArray;
        if (arr !== undefined && this.jsonArrayFound(arr, piece(buf, start, end))) return;
        if (this.body!.add(buf, start, end)) {
          this.framing = 'none';
          this.body = undefined;
        }
      }
    } catch {
      // A parser bug or a corrupt event-stream frame must never break
      // forwarding: stop measuring this body (duration is still recorded).
      this.stopReading();
    }
  }

  /**
   * Offers a JSON body's bytes to the array framing until its first byte decides: an array
   * is then a stream of events (as SSE would be), anything else is read whole at the end.
   */
  private jsonArrayFound(arr: JsonArrayParser, bytes: Buffer): boolean {
    arr.push(bytes);
    if (arr.kind === 'unknown') return false;
    this.jsonArray = undefined;
    if (arr.kind === 'other') return false;
    this.framing = 'jsonarray';
    this.parser = arr;
    this.streamed = true;
    this.body?.clear(); // what it held goes back to the budget now, not at the end
    this.body = undefined;
    return true;
  }

  /** Nothing more of this body is read: what its reader held goes back to the budget now, not at the end. */
  private stopReading(): void {
    this.framing = 'none';
    this.parser = undefined;
    this.jsonArray = undefined;
    this.body = undefined;
    this.share?.close();
  }

  private event(ev: SseEvent): void {
    if (this.inbandError !== undefined) return;
    const kind = this.adapter.onEvent(ev);
    if (kind === EventKind.Content) {
      this.content(this.adapter.cumulativeOutputTokens);
    } else if (kind === EventKind.Error) {
      this.inbandError = this.adapter.errorType ?? 'error';
    }
  }

  /** One-line content deltas found from their bytes, without locating the line's end first. */
  private lane(): SseLane {
    const adapter = this.adapter;
    return {
      find: (buf, start, limit) => (this.inbandError === undefined ? adapter.quickContentFrom!(buf, start, limit) : -1),
      taken: () => this.contentNowOrQueued(),
    };
  }

  private enqueue(ev: SseEvent | typeof CONTENT): void {
    const q = this.pending;
    q.push(ev, this.now);
    if (q.length === 2) this.defer(this.flushPending);
  }

  /** A content event found from its bytes: measured now, unless events before it still wait. */
  private contentNowOrQueued(): void {
    if (this.pending.length === 0) this.content(undefined);
    else this.enqueue(CONTENT);
  }

  /** Measures the queued events in arrival order, each at its own arrival time. */
  private flush(): void {
    const q = this.pending;
    if (q.length === 0) return;
    try {
      for (let i = 0; i < q.length; i += 2) {
        this.now = q[i + 1] as number;
        const ev = q[i] as SseEvent | typeof CONTENT;
        if (ev === CONTENT) {
          if (this.inbandError === undefined) this.content(undefined);
        } else {
          this.event(ev);
        }
      }
    } catch {
      // As in chunk(): a failure stops measuring this body, never anything else.
      this.stopReading();
    } finally {
      q.length = 0; // `now` is left at the last event's: every chunk() sets its own
    }
  }

  /**
   * A content event arrived (at `this.now`): TTFT or a gap, and per-token ITL. `cum`: the
   * cumulative output count the event reported (none for events classified from their bytes).
   */
  private content(cum: number | undefined): void {
    const gap = this.clock.content(this.now);
    // Still counted (the log's figures, the output count): only the records wait for a provider's pace.
    if (this.now >= this.heldFrom) return;
    if (gap < 0) {
      if (this.opts.unknownStart === true) return;
      const ttft = this.clock.ttftMs! / 1000;
      this.defer(() => this.ins.ttft.record(ttft, this.labels));
    } else {
      this.ins.chunkGap.record(gap / 1000, this.labels);
    }
    const perToken = this.ins.perTokenItl;
    if (perToken !== undefined) {
      // Spread the gap over the tokens this event carried, when the stream says how many.
      const prev = this.prevCumulative;
      if (gap >= 0 && cum !== undefined && prev !== undefined && cum > prev) {
        // Whole samples summing to the gap (the adapters give whole counts: ceil is a guard).
        const n = Math.min(Math.ceil(cum - prev), MAX_TOKENS_PER_EVENT);
        const each = gap / n / 1000;
        perToken.recordTimes(each, n, this.labels);
      }
      this.prevCumulative = cum;
    }
  }

  /**
   * The proxy stopped reading the upstream at `since` (ms) because the client had not taken what
   * it was sent, for long enough to count (forward.ts, CLIENT_HELD_MS). From then on the stream's
   * arrival times follow the client: content arriving at or after `since` is no longer recorded
   * (TTFT, gaps, per-token ITL), nor is the stream's TPOT when its span holds the pause. What
   * arrived before is the provider's and stays recorded, also when its measurement was deferred
   * past this call.
   */
  clientHeld(since: number): void {
    if (since < this.heldFrom) this.heldFrom = since;
  }

  /** The request asked for a predicted output: its rejected tokens, if reported, were never streamed. */
  predictedOutput(): void {
    this.predicted = true;
  }

  /**
   * The request ended at `end` (ms): `errorType` undefined for a complete
   * response. Idempotent: only the first call records. A stream its client held back
   * (`clientHeld`) is counted, so that a share of client-paced streams can be told apart from a
   * slower provider.
   */
  finish(end: number, errorType?: string): MeterSummary | undefined {
    if (this.finished) return undefined;
    this.finished = true;
    // First, so that nothing below can keep the request's part: its bytes are read once more here, then let go.
    this.share?.close();
    this.inactive();
    if (this.disabled || (this.adapter.generic === true && !this.streamed)) return undefined;
    const adapter = this.adapter;
    if (this.framing === 'ndjson' && errorType === undefined) {
      // A complete body whose last line has no newline: that line still counts.
      try {
        (this.parser as NdjsonParser).end();
      } catch {
        /* measurement only */
      }
    }
    this.flush(); // events still queued (and the NDJSON body's last line) come before the end
    if (this.framing === 'json' && this.body && errorType === undefined) {
      try {
        adapter.onBody!(this.body.bytes().toString('utf8'));
      } catch {
        /* unparseable body: duration only */
      }
    }
    this.body = undefined;
    this.parser = undefined;

    // An error status wins over the body's own error type, however the body is framed: a 429
    // is "429" whether its body is JSON or an SSE error event. The adapter's own `errorType`
    // last: a JSON body's, or an error a stream reported before its final usage (LM Studio).
    const upstreamErr = (this.status >= 400 ? String(this.status) : undefined) ?? this.inbandError ?? adapter.errorType;
    // A client that hangs up after the upstream reported an error did not cancel a working
    // request: the OpenAI and Anthropic SDKs abort on an in-band error event, and cancel a
    // 429/5xx body before they retry. The upstream's error is what happened.
    // Nor did one that hangs up after the API's last event ([DONE], message_stop) reached it:
    // clients that stop reading there would otherwise count as cancellations whenever the
    // server's end of body comes a few ms later.
    const err = endError(errorType, upstreamErr, adapter.complete === true);
    const outcome = err === undefined ? 'ok' : err === ERROR_TYPE.clientCancelled ? 'cancelled' : 'error';

    const usage = adapter.usage;
    const streamed = this.streamed;
    let outputTokens = usage.outputTokens;
    let source: TokenCountSource = 'usage';
    if (outputTokens === undefined) {
      // About one token per event (OpenAI, Responses, Ollama): count them; several (Anthropic,
      // Gemini, Bedrock): unknown, rather than a count that would inflate TPOT.
      if (streamed && this.clock.contentEvents > 0 && adapter.multiTokenEvents !== true) {
        outputTokens = this.clock.contentEvents;
        source = 'events';
      } else {
        source = 'none';
      }
    }

    const sets = this.ins.labels;
    const base = this.labels ?? this.requestOnlyLabels();
    const responseModel = adapter.responseModel;
    const limit = this.opts.limitResponseModel;
    const endLabels =
      responseModel === undefined || responseModel === '' ? base : sets.with(base, ATTR.responseModel, limit === undefined ? responseModel : limit(responseModel));
    // Reasoning the provider counted but did not stream came before the first streamed token:
    // it is not in the span TPOT divides (300 hidden of 306 tokens made TPOT 60 times too low).
    // Nor are the rejected tokens of a prediction the request asked for, never streamed at all.
    // Only when the rest still holds every content event (each carries a token at least): a
    // server that counts reasoning outside the output, or streams it inside `content`, keeps
    // the whole count.
    const hiddenReasoning = adapter.reasoningStreamed === false ? (usage.reasoningTokens ?? 0) : 0;
    const rejected = this.predicted ? (usage.rejectedPredictionTokens ?? 0) : 0;
    const hidden = source === 'usage' ? hiddenReasoning + rejected : 0;
    const spanTokens =
      adapter.tpotUnknown === true
        ? undefined
        : outputTokens !== undefined && hidden > 0 && this.clock.contentEvents <= outputTokens - hidden
          ? outputTokens - hidden
          : outputTokens;
    const tpot = spanTokens !== undefined ? this.clock.tpotMs(spanTokens) : undefined;
    // `gen_ai.server.time_per_output_token` is defined for successful responses; the gaps of a
    // cancelled or failed stream are still in the per-gap histogram. A stream its client held
    // back before its last content event has the client's pace in its span (the log still gives
    // the TPOT it saw); held only after it (a long final event), the span is the provider's.
    const lastContent = this.clock.lastContentAt;
    const spanHeld = lastContent !== undefined && lastContent >= this.heldFrom;
    if (tpot !== undefined && outcome === 'ok' && !spanHeld) this.ins.tpot.record(tpot / 1000, endLabels);
    const tokens = (type: string, n: number | undefined) => {
      if (n !== undefined) this.ins.tokenUsage.record(n, sets.with(endLabels, ATTR.tokenType, type));
    };
    // Billable counts where the provider reports both (semantic conventions: MUST).
    tokens(TOKEN_TYPE.input, usage.billedInputTokens ?? usage.inputTokens);
    tokens(TOKEN_TYPE.output, usage.billedOutputTokens ?? outputTokens);
    tokens(TOKEN_TYPE.cachedInput, usage.cachedInputTokens);
    tokens(TOKEN_TYPE.cacheCreationInput, usage.cacheCreationInputTokens);
    tokens(TOKEN_TYPE.reasoning, usage.reasoningTokens);
    const st = adapter.serverTimings;
    if (st !== undefined) {
      if (st.timeToFirstToken !== undefined) this.ins.serverTtft.record(st.timeToFirstToken, endLabels);
      if (st.timePerOutputToken !== undefined) this.ins.serverTpot.record(st.timePerOutputToken, endLabels);
      if (st.duration !== undefined) this.ins.serverDuration.record(st.duration, endLabels);
    }
    const limitErr = this.opts.limitErrorType;
    const durationLabels = err === undefined ? endLabels : sets.with(endLabels, ATTR.errorType, limitErr === undefined ? err : limitErr(err));
    const durationMs = this.opts.unknownStart === true ? undefined : this.clock.durationMs(end);
    if (durationMs !== undefined) this.ins.duration.record(durationMs / 1000, durationLabels);
    this.ins.streams.add(1, sets.with(sets.with(base, ATTR.outcome, outcome), ATTR.tokenCountSource, source));
    if (this.heldFrom !== Infinity) this.ins.clientPacedStreams.add(1, base);

    return {
      status: this.status,
      streamed,
      ttftMs: this.opts.unknownStart === true ? undefined : this.clock.ttftMs,
      tpotMs: tpot,
      maxGapMs: outcome === 'ok' ? this.clock.maxGapMs : this.clock.maxGapOpenMs(end),
      durationMs,
      contentEvents: this.clock.contentEvents,
      outputTokens,
      inputTokens: usage.inputTokens,
      tokenCountSource: source,
      responseModel: adapter.responseModel,
      errorType: err,
      finishReasons: adapter.finishReasons?.list(),
      outcome,
    };
  }

  private requestOnlyLabels(): Attributes {
    const l = this.requestLabels;
    return this.ins.labels.of(
      ATTR.provider,
      l.provider,
      ATTR.operation,
      l.operation,
      ATTR.serverAddress,
      l.serverAddress,
      ATTR.serverPort,
      l.serverPort,
      ATTR.requestModel,
      l.requestModel,
    );
  }
}

/**
 * A request's error type at its end: the proxy's own (`errorType`: a reset, a timeout) wins over
 * the upstream's (`upstreamErr`: an error status, an in-band error), except a client's hang-up,
 * which the upstream's error wins over; a hang-up after the API's last event (`complete`) is no
 * error. Shared by measured and unmeasured requests, so the log says the same for both.
 */
export function endError(errorType: string | undefined, upstreamErr: string | undefined, complete: boolean): string | undefined {
  if (errorType === ERROR_TYPE.clientCancelled) return upstreamErr ?? (complete ? undefined : errorType);
  return errorType ?? upstreamErr;
}

/** A content coding that leaves the bytes as they are (an empty list element counts as none). */
function plainCoding(coding: string): boolean {
  const c = coding.trim().toLowerCase();
  return c === '' || c === 'identity' || c === 'none';
}
