/**
 * Metric and attribute names in one place. Instrument names and units follow
 * the OpenTelemetry GenAI semantic conventions; the Prometheus names they turn
 * into are pinned in docs/interfaces.md and by test/integration/cli-acceptance.test.ts.
 */
export const METRIC = {
  /** Request arrival at the proxy -> first content-bearing event. */
  ttft: 'gen_ai.client.operation.time_to_first_chunk',
  /** Content event k-1 -> content event k: one sample per gap (per-gap ITL). */
  chunkGap: 'gen_ai.client.operation.time_per_output_chunk',
  /** (last - first content event) / (output tokens - 1): per-request ITL. */
  tpot: 'gen_ai.server.time_per_output_token',
  /** Request arrival -> last byte (or failure/cancel). */
  duration: 'gen_ai.client.operation.duration',
  tokenUsage: 'gen_ai.client.token.usage',
  /** Request arrival -> first response body byte, for every measured request (also unknown stream formats). */
  timeToFirstByte: 'llm_proxy.upstream.time_to_first_byte',
  /** A new upstream connection: start of connecting -> up (lookup, TCP, egress tunnel, TLS); one per connection. */
  upstreamConnect: 'llm_proxy.upstream.connect_duration',
  /**
   * Opt-in (`metrics.perTokenItl`): per-token ITL. A content event's gap divided
   * by the tokens it carried, recorded once per token; only where the stream
   * reports cumulative output tokens per event (vLLM continuous usage, Gemini).
   */
  perTokenItl: 'llm_proxy.time_per_output_token',
  /** What the server says about itself: time to first token / prompt processing. */
  serverTtft: 'llm_proxy.server.time_to_first_token',
  /** What the server says about itself: time per output token. */
  serverTpot: 'llm_proxy.server.time_per_output_token',
  /** What the server says about itself: request duration. */
  serverDuration: 'llm_proxy.server.duration',
  streams: 'llm_proxy.streams',
  /** Measured requests whose upstream read was paused by their client's backpressure at least once. */
  clientPacedStreams: 'llm_proxy.streams.client_paced',
  streamsActive: 'llm_proxy.streams.active',
  /** Client connections open on the proxy's port (idle keep-alive ones and tunnels included). */
  connectionsOpen: 'llm_proxy.connections.open',
  /** Client connections the proxy's port closed unread at `listen.maxConnections`. */
  connectionsDropped: 'llm_proxy.connections.dropped',
  eventLoopDelayP50: 'nodejs.eventloop.delay.p50',
  eventLoopDelayP99: 'nodejs.eventloop.delay.p99',
  eventLoopDelayMax: 'nodejs.eventloop.delay.max',
  eventLoopTime: 'nodejs.eventloop.time',
  processCpuTime: 'process.cpu.time',
  processMemoryUsage: 'process.memory.usage',
  heapUsed: 'v8js.memory.heap.used',
  heapSpaceSize: 'v8js.memory.heap.space.size',
  gcDuration: 'v8js.gc.duration',
} as const;

export const ATTR = {
  provider: 'gen_ai.provider.name',
  operation: 'gen_ai.operation.name',
  requestModel: 'gen_ai.request.model',
  responseModel: 'gen_ai.response.model',
  tokenType: 'gen_ai.token.type',
  serverAddress: 'server.address',
  /** The upstream's port (the scheme's default when its URL names none): semconv requires it with `server.address`. */
  serverPort: 'server.port',
  errorType: 'error.type',
  outcome: 'outcome',
  tokenCountSource: 'token_count_source',
} as const;

/**
 * `gen_ai.token.type` values. `input` and `output` are the semantic-convention
 * values; the others are subsets of them, recorded only where the provider
 * reports them (so `input` + `output` still sum to the total).
 */
export const TOKEN_TYPE = {
  input: 'input',
  output: 'output',
  cachedInput: 'cached_input',
  cacheCreationInput: 'cache_creation_input',
  reasoning: 'reasoning',
} as const;

export const ERROR_TYPE = {
  clientCancelled: 'client_cancelled',
  upstreamReset: 'upstream_reset',
  timeout: 'timeout',
  unreachable: 'upstream_unreachable',
  /** No upstream connection could be opened for want of the proxy's own resources (EMFILE, ENFILE, ENOBUFS, ENOMEM): a 503. */
  outOfResources: 'proxy_out_of_resources',
  /** The upstream's answer was not valid HTTP/1.1 (status line, header, length or chunk framing). */
  protocol: 'upstream_protocol_error',
  shutdownDeadline: 'shutdown_deadline',
  /** A WebSocket session's messages could no longer be read (ws/session.ts): its open responses end there. */
  measurementStopped: 'measurement_stopped',
  /** A WebSocket upgrade the upstream answered with a 1xx-3xx status other than 101 (4xx/5xx are the status). */
  upgradeDeclined: 'upgrade_declined',
} as const;

/** Default bucket boundaries in seconds (see README: why these). */
export const DEFAULT_BUCKETS = {
  // 0.25 ms .. 2.5 s, dense where the fastest providers stream (1-3 ms) so that
  // 1.4 ms and 2.3 ms land in different buckets, and 10-20 % apart from 15 to 60 ms, where
  // typical providers stream: a p95 read from a bucket is off by up to its width, and at
  // 20-50 % apart a +50 % regression of a 25 ms/token model paged or not by where it sat.
  itl: [
    0.00025, 0.0005, 0.00075, 0.001, 0.00125, 0.0015, 0.00175, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.0075, 0.01,
    0.015, 0.0175, 0.02, 0.0225, 0.025, 0.0275, 0.03, 0.035, 0.04, 0.045, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 0.75, 1, 1.5, 2.5,
  ],
  // 10 ms .. 600 s: reasoning models can think for minutes before their first token; past the
  // last finite bucket histogram_quantile() can only answer that bucket (and the response
  // timeout, 590 s by default, is inside the last one).
  ttft: [
    0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 60,
    120, 300, 600,
  ],
  duration: [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92, 163.84, 327.68, 655.36,
  ],
  tokens: [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304],
} as const;

/**
 * GC pause buckets, seconds. The convention advises 0.01, 0.1, 1, 10, which would put
 * nearly every pause of this process (scavenges of 0.2-3 ms, the odd mark-compact
 * of 5-50 ms) in the first bucket; these keep those boundaries and resolve the
 * milliseconds that show in the ITL of the fastest providers.
 */
export const GC_DURATION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 10] as const;

/**
 * Upstream connection set-up buckets, seconds: a connection on the same host or network takes
 * well under a millisecond, a TLS handshake with a provider across a region 20-300 ms; the top
 * buckets hold set-ups that came up just inside a long `timeouts.connect` (ones that time out
 * record nothing).
 */
export const CONNECT_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5, 10] as const;

export type BucketName = keyof typeof DEFAULT_BUCKETS;

/**
 * The gap the shipped stall alert counts (grafana/params.yaml `alerts.stalls.gapSeconds`): it reads
 * the per-gap histogram's bucket at this boundary, so custom ITL buckets without it silence it.
 */
export const STALL_GAP_SECONDS = 1;

/**
 * The event-loop-delay sampling period. Each sample is a timer wake-up of an
 * otherwise idle process: at 10 ms or 13 ms (Node's and prom-client's default
 * is 10) those wake-ups added ~0.25 ms to the median TTFT of sequential streams
 * in the bench; at 50 ms the cost was below the bench's spread (bench/README.md).
 */
export const DEFAULT_LOOP_RESOLUTION_MS = 50;
