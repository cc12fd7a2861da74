import type { Attributes } from '@opentelemetry/api';
import type { Instruments } from '../metrics/instruments.js';
import { ATTR, ERROR_TYPE } from '../metrics/semconv.js';
import { EventKind, type ResponseAdapter, type TokenCountSource } from '../providers/types.js';
import { SseParser, type SseEvent } from '../sse/parser.js';
import { StreamClock } from '../timing/stream-clock.js';

export interface RequestLabels {
  provider: string;
  operation: string;
  requestModel: string | undefined;
  serverAddress: string;
}

export interface MeterOptions {
  maxEventBytes: number;
  /** Largest non-streamed JSON body kept for usage parsing. */
  maxBodyBytes: number;
}

/** What a finished request looked like; used for the log line and tests. */
export interface MeterSummary {
  status: number;
  streamed: boolean;
  ttftMs: number | undefined;
  tpotMs: number | undefined;
  durationMs: number;
  contentEvents: number;
  outputTokens: number | undefined;
  inputTokens: number | undefined;
  tokenCountSource: TokenCountSource;
  responseModel: string | undefined;
  errorType: string | undefined;
  outcome: 'ok' | 'error' | 'cancelled';
}

type Framing = 'sse' | 'json' | 'none';

/**
 * Measures one proxied LLM request. The proxy calls `chunk()` only after the
 * bytes were handed to the client, with the arrival time it took before
 * writing; nothing here can delay or alter the forwarded bytes, and nothing
 * here throws into the forwarding path.
 */
export class RequestMeter {
  private readonly clock: StreamClock;
  private framing: Framing = 'none';
  private sse: SseParser | undefined;
  private body: Buffer[] | undefined;
  private bodyBytes = 0;
  private status = 0;
  private labels: Attributes | undefined;
  private activeLabels: Attributes | undefined;
  private now = 0;
  private inbandError: string | undefined;
  private finished = false;
  private readonly onSseEvent = (ev: SseEvent): void => this.event(ev);

  constructor(
    private readonly ins: Instruments,
    private readonly adapter: ResponseAdapter,
    private readonly requestLabels: RequestLabels,
    start: number,
    private readonly opts: MeterOptions,
  ) {
    this.clock = new StreamClock(start);
  }

  /** Response headers arrived. */
  responseStart(status: number, contentType: string | undefined, contentEncoding: string | undefined): void {
    this.status = status;
    const l = this.requestLabels;
    this.labels = this.requestOnlyLabels();
    this.activeLabels = { [ATTR.provider]: l.provider, [ATTR.serverAddress]: l.serverAddress };
    this.ins.streamsActive.add(1, this.activeLabels);

    // Compressed bodies are forwarded as they are and only timed, not parsed.
    const identity = contentEncoding === undefined || contentEncoding === '' || contentEncoding === 'identity';
    const ct = (contentType ?? '').toLowerCase();
    if (identity && ct.startsWith('text/event-stream')) {
      this.framing = 'sse';
      this.sse = new SseParser(this.onSseEvent, { maxEventBytes: this.opts.maxEventBytes });
    } else if (identity && ct.includes('json') && this.adapter.onBody) {
      this.framing = 'json';
      this.body = [];
    }
  }

  /** A chunk that has already been written to the client, with its arrival time (ms). */
  chunk(buf: Buffer, arrival: number): void {
    if (this.finished) return;
    this.now = arrival;
    try {
      if (this.framing === 'sse') {
        this.sse!.push(buf);
      } else if (this.framing === 'json') {
        if (this.bodyBytes + buf.length <= this.opts.maxBodyBytes) {
          this.body!.push(buf);
          this.bodyBytes += buf.length;
        } else {
          this.framing = 'none';
          this.body = undefined;
        }
      }
    } catch {
      // A parser bug must never break forwarding: stop measuring this body.
      this.framing = 'none';
    }
  }

  private event(ev: SseEvent): void {
    if (this.inbandError !== undefined) return;
    const kind = this.adapter.onEvent(ev);
    if (kind === EventKind.Content) {
      const gap = this.clock.content(this.now);
      if (gap < 0) {
        this.ins.ttft.record(this.clock.ttftMs! / 1000, this.labels);
      } else {
        this.ins.chunkGap.record(gap / 1000, this.labels);
      }
    } else if (kind === EventKind.Error) {
      this.inbandError = this.adapter.errorType ?? 'error';
    }
  }

  /**
   * The request ended at `end` (ms): `errorType` undefined for a complete
   * response. Idempotent: only the first call records.
   */
  finish(end: number, errorType?: string): MeterSummary | undefined {
    if (this.finished) return undefined;
    this.finished = true;
    const adapter = this.adapter;
    if (this.framing === 'json' && this.body && errorType === undefined) {
      try {
        adapter.onBody!(Buffer.concat(this.body, this.bodyBytes).toString('utf8'));
      } catch {
        /* unparseable body: duration only */
      }
    }
    this.body = undefined;
    this.sse = undefined;

    const err =
      errorType ??
      this.inbandError ??
      (this.status >= 400 ? String(this.status) : undefined) ??
      (this.framing === 'json' ? adapter.errorType : undefined);
    const outcome = err === undefined ? 'ok' : err === ERROR_TYPE.clientCancelled ? 'cancelled' : 'error';

    const usage = adapter.usage;
    const streamed = this.framing === 'sse';
    let outputTokens = usage.outputTokens;
    let source: TokenCountSource = 'usage';
    if (outputTokens === undefined) {
      if (streamed && this.clock.contentEvents > 0) {
        outputTokens = this.clock.contentEvents;
        source = 'events';
      } else {
        source = 'none';
      }
    }

    const base = this.labels ?? this.requestOnlyLabels();
    const endLabels: Attributes = { ...base };
    if (adapter.responseModel !== undefined) endLabels[ATTR.responseModel] = adapter.responseModel;
    const tpot = outputTokens !== undefined ? this.clock.tpotMs(outputTokens) : undefined;
    if (tpot !== undefined) this.ins.tpot.record(tpot / 1000, endLabels);
    if (usage.inputTokens !== undefined) {
      this.ins.tokenUsage.record(usage.inputTokens, { ...endLabels, [ATTR.tokenType]: 'input' });
    }
    if (outputTokens !== undefined) {
      this.ins.tokenUsage.record(outputTokens, { ...endLabels, [ATTR.tokenType]: 'output' });
    }
    const durationLabels = err === undefined ? endLabels : { ...endLabels, [ATTR.errorType]: err };
    const durationMs = this.clock.durationMs(end);
    this.ins.duration.record(durationMs / 1000, durationLabels);
    this.ins.streams.add(1, { ...base, [ATTR.outcome]: outcome, [ATTR.tokenCountSource]: source });
    if (this.activeLabels) this.ins.streamsActive.add(-1, this.activeLabels);

    return {
      status: this.status,
      streamed,
      ttftMs: this.clock.ttftMs,
      tpotMs: tpot,
      durationMs,
      contentEvents: this.clock.contentEvents,
      outputTokens,
      inputTokens: usage.inputTokens,
      tokenCountSource: source,
      responseModel: adapter.responseModel,
      errorType: err,
      outcome,
    };
  }

  private requestOnlyLabels(): Attributes {
    const l = this.requestLabels;
    const labels: Attributes = {
      [ATTR.provider]: l.provider,
      [ATTR.operation]: l.operation,
      [ATTR.serverAddress]: l.serverAddress,
    };
    if (l.requestModel !== undefined) labels[ATTR.requestModel] = l.requestModel;
    return labels;
  }
}
