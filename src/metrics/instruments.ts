import type { Attributes, Meter } from '@opentelemetry/api';
import { FastHistogram, FastSum, type FastMetricProducer } from './fast-metrics.js';
import { LabelSets } from './label-sets.js';
import { RuntimeMetrics } from './runtime.js';
import { CONNECT_BUCKETS, DEFAULT_BUCKETS, METRIC, type BucketName } from './semconv.js';

/** What the request path needs of a histogram. */
export interface Recorder {
  record(value: number, attributes?: Attributes): void;
}

/** A histogram that takes `n` equal samples in one call. */
export interface TimesRecorder {
  recordTimes(value: number, n: number, attributes?: Attributes): void;
}

/** What the request path needs of a counter or up-down counter. */
export interface Adder {
  add(value: number, attributes?: Attributes): void;
}

export type Buckets = Readonly<Record<BucketName, readonly number[]>>;

export interface InstrumentOptions {
  /** Record `llm_proxy.time_per_output_token` (config `metrics.perTokenItl`). */
  perTokenItl?: boolean;
  /**
   * Records without the SDK's per-call attribute hashing (see fast-metrics.ts);
   * must be registered with every reader. Without it every instrument is the SDK's.
   */
  fast?: FastMetricProducer;
  /**
   * The once-per-request histograms stay SDK instruments, so that a reader's
   * aggregation (OTLP exponential histograms) applies to them. The per-event
   * histograms and the counters are fast whenever `fast` is given.
   */
  sdkRequestHistograms?: boolean;
}

/**
 * Every instrument, created once at start-up. The request path only calls
 * `.record()` / `.add()` on these fields, with attribute objects from `labels`.
 */
export class Instruments {
  /** The attribute objects to record with (one per label combination). */
  readonly labels = new LabelSets();
  readonly ttft: Recorder;
  readonly chunkGap: Recorder;
  readonly tpot: Recorder;
  readonly duration: Recorder;
  readonly tokenUsage: Recorder;
  readonly timeToFirstByte: Recorder;
  readonly upstreamConnect: Recorder;
  /** Undefined unless per-token ITL was asked for. */
  readonly perTokenItl: TimesRecorder | undefined;
  readonly serverTtft: Recorder;
  readonly serverTpot: Recorder;
  readonly serverDuration: Recorder;
  readonly streams: Adder;
  readonly clientPacedStreams: Adder;
  readonly streamsActive: Adder;
  readonly connectionsOpen: Adder;
  readonly connectionsDropped: Adder;
  private readonly runtime: RuntimeMetrics;

  constructor(meter: Meter, buckets: Buckets = DEFAULT_BUCKETS, opts: InstrumentOptions = {}) {
    const sdkHist = (name: string, unit: string, description: string, b: readonly number[]) =>
      meter.createHistogram(name, { unit, description, advice: { explicitBucketBoundaries: [...b] } });
    const fast = opts.fast;
    const perEvent = (name: string, unit: string, description: string, b: readonly number[]): Recorder =>
      fast ? fast.add(new FastHistogram(name, unit, description, b)) : sdkHist(name, unit, description, b);
    const hist = opts.sdkRequestHistograms ? sdkHist : perEvent;
    this.ttft = hist(
      METRIC.ttft,
      's',
      'Time to first token: arrival at the proxy of the first content-bearing event minus arrival of the request.',
      buckets.ttft,
    );
    this.chunkGap = perEvent(
      METRIC.chunkGap,
      's',
      'Per-gap inter-token latency: arrival of content-bearing event k minus arrival of event k-1; one sample per gap.',
      buckets.itl,
    );
    this.tpot = hist(
      METRIC.tpot,
      's',
      'Per-request inter-token latency (TPOT): (last content event - first content event) / (output tokens - 1), for successful requests with output tokens >= 2 and >= 2 content events; reasoning tokens the stream did not carry are left out of the output tokens.',
      buckets.itl,
    );
    this.duration = hist(
      METRIC.duration,
      's',
      'Request duration: last byte (or failure, or cancellation) minus request arrival at the proxy.',
      buckets.duration,
    );
    this.tokenUsage = hist(
      METRIC.tokenUsage,
      '{token}',
      'Input and output tokens per request, as reported by the provider (output counted from events when not reported).',
      buckets.tokens,
    );
    this.timeToFirstByte = hist(
      METRIC.timeToFirstByte,
      's',
      'Time to first byte: arrival at the proxy of the first response body byte minus arrival of the request (any format, also unknown ones).',
      buckets.ttft,
    );
    // Once per new connection, not per event: a fast histogram whenever the others are.
    this.upstreamConnect = perEvent(
      METRIC.upstreamConnect,
      's',
      'New upstream connections: start of connecting (name lookup, TCP, the egress proxy tunnel, TLS) until the connection is up; one sample per connection that came up (failed attempts record none), so its count is the connections opened.',
      CONNECT_BUCKETS,
    );
    const perToken = opts.perTokenItl
      ? perEvent(
          METRIC.perTokenItl,
          's',
          'Per-token inter-token latency: the gap before a content event divided by the output tokens it carried, recorded once per token; only for streams that report cumulative usage per event.',
          buckets.itl,
        )
      : undefined;
    // The fast histogram takes n samples in one update; the SDK's, one at a time.
    this.perTokenItl =
      perToken === undefined || perToken instanceof FastHistogram ? perToken : { recordTimes: (v, n, a) => { for (let i = 0; i < n; i++) perToken.record(v, a); } };
    this.serverTtft = hist(
      METRIC.serverTtft,
      's',
      'Server-reported time to first token or prompt processing time (Bedrock firstByteLatency, Ollama load + prompt_eval_duration, llama.cpp prompt_ms, Groq queue + prompt time, LM Studio time_to_first_token).',
      buckets.ttft,
    );
    this.serverTpot = hist(
      METRIC.serverTpot,
      's',
      'Server-reported time per output token (Ollama eval_duration / eval_count, llama.cpp predicted_per_token_ms, Groq completion_time / completion_tokens, LM Studio 1 / tokens_per_second).',
      buckets.itl,
    );
    this.serverDuration = hist(
      METRIC.serverDuration,
      's',
      'Server-reported request duration (Ollama total_duration, Bedrock invocationLatency / metrics.latencyMs, Groq queue + total time).',
      buckets.duration,
    );
    const sum = (name: string, unit: string, description: string, monotonic: boolean): Adder => {
      if (fast) return fast.add(new FastSum(name, unit, description, monotonic));
      return monotonic ? meter.createCounter(name, { unit, description }) : meter.createUpDownCounter(name, { unit, description });
    };
    this.streams = sum(METRIC.streams, '{stream}', 'Measured requests that finished, by outcome and by where the output token count came from.', true);
    this.clientPacedStreams = sum(
      METRIC.clientPacedStreams,
      '{stream}',
      'Measured requests whose client held them back: the proxy paused reading the upstream for 100 ms or more because the client had not taken the bytes already sent (backpressure). From that pause on their arrival times show the client\'s pace: content from then on is left out of the TTFT, gap and TPOT histograms (what came before the pause is kept).',
      true,
    );
    this.streamsActive = sum(METRIC.streamsActive, '{stream}', 'HTTP requests in flight, from their arrival (an API the proxy does not recognise under operation _OTHER), and Realtime or Live responses being answered.', false);

    this.connectionsOpen = sum(
      METRIC.connectionsOpen,
      '{connection}',
      'Client connections open on the proxy\'s port: with a request in flight, idle between requests (keep-alive), or carrying a WebSocket tunnel. listen.maxConnections caps them.',
      false,
    );
    this.connectionsDropped = sum(
      METRIC.connectionsDropped,
      '{connection}',
      'Client connections the proxy closed unread because it already held listen.maxConnections open (their clients see the connection closed, with no HTTP answer).',
      true,
    );

    this.runtime = new RuntimeMetrics(meter);
  }

  shutdown(): void {
    this.runtime.shutdown();
  }
}

export type { Attributes };
