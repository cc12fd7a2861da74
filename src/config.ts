import { readFileSync } from 'node:fs';
import { parseDocument } from 'yaml';
import { z } from 'zod';
import { DEFAULT_BUCKETS, DEFAULT_LOOP_RESOLUTION_MS, STALL_GAP_SECONDS } from './metrics/semconv.js';
import { API_BY_NAME } from './providers/detect.js';
import { NO_EGRESS, noProxyEntryProblem, parseProxyUrl, splitNoProxy, type EgressProxy, type EgressSettings } from './proxy/egress.js';
import { PLAN_KEYS, planValueError, scheduleError } from './simulate/schedule.js';
import {
  ConfigError,
  DEFAULT_METRICS_HOST,
  DEFAULT_METRICS_PORT,
  envOverrides,
  httpUrlProblem,
  listenHostProblem,
  LOG_LEVELS,
  logLevelOf,
  MAX_TIMER_SECONDS,
  unbracket,
  upstreamOf,
  maskedUrl,
  type Overrides,
} from './config-values.js';

export * from './config-values.js';

const httpUrl = z.string().superRefine((s, ctx) => {
  const problem = httpUrlProblem(s);
  if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
});
const TIMER_LIMIT = `must be at most ${MAX_TIMER_SECONDS} s (~24.8 days; Node timers cannot be longer)`;
const seconds = z.number().positive().max(MAX_TIMER_SECONDS, TIMER_LIMIT);
const port = z.number().int().min(0).max(65535);
/** A listen address; blank would mean every interface, or fail later as a name lookup. */
const listenHost = z
  .string()
  .superRefine((v, ctx) => {
    const problem = listenHostProblem(v);
    if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
  })
  .transform(unbracket);
const boundaries = z
  .array(z.number().positive())
  .min(1)
  .refine((a) => a.every((v, i) => i === 0 || v > a[i - 1]!), 'must be strictly increasing');

const routeSchema = z
  .object({
    // Matched against the request's path as it arrives: a query, a fragment, white space or a
    // glob would make a route no request reaches.
    prefix: z
      .string()
      .startsWith('/', 'must start with "/"')
      .refine((p) => !/[?#*\s]|[^\x21-\x7e]/.test(p), 'a path prefix without "?", "#", "*", white space or characters outside ASCII (it is matched against the path as sent, percent-encoded, without wildcards)'),
    upstream: httpUrl,
    /**
     * Forces the wire format / adapter (e.g. `openai`) on every path of the route, instead of
     * detecting it from the path. A misspelt name is an error, not a silent fallback.
     */
    provider: z
      .string()
      .refine((v) => Object.hasOwn(API_BY_NAME, v), { error: (i) => `unknown provider ${JSON.stringify(i.input)} (one of: ${Object.keys(API_BY_NAME).join(', ')})` })
      .optional(),
    /** Overrides the `gen_ai_provider_name` label; on `/v1/chat` and `/api/v1/chat` it also picks the API (Cohere, LM Studio). */
    providerName: z.string().min(1).optional(),
    /** Remove the prefix before forwarding (default true). */
    stripPrefix: z.boolean().default(true),
    /**
     * Add `X-Forwarded-For` (the client's address), `-Proto` and `-Host` (default true). false for a
     * third-party provider that need not learn the clients' addresses: it sees the proxy alone
     * (fields a client sent itself still pass, as every end-to-end field does).
     */
    forwardedHeaders: z.boolean().default(true),
  })
  .strict();

/** A simulator plan value, checked as the simulator's own `/_sim/config` checks it. */
const planValue = (key: (typeof PLAN_KEYS)[number], fallback: number) =>
  z
    .number()
    .superRefine((v, ctx) => {
      const problem = planValueError(key, v);
      if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
    })
    .default(fallback);

const simulatorSchema = z
  .object({
    ttft: planValue('ttft', 0.25),
    itl: planValue('itl', 0.0014),
    tokens: planValue('tokens', 200),
    jitter: planValue('jitter', 0.1),
    seed: z.number().int().optional(),
  })
  .strict()
  .superRefine((p, ctx) => {
    // The plan as a whole, once each value is one the simulator keeps.
    if (PLAN_KEYS.some((k) => planValueError(k, p[k]) !== undefined)) return;
    const problem = scheduleError(p);
    if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
  });

const fileSchema = z
  .object({
    upstream: httpUrl.optional(),
    routes: z.array(routeSchema).optional(),
    listen: z
      .object({
        host: listenHost.optional(),
        port: port.optional(),
        /** Open client connections the proxy's port takes at most; past it, new ones are closed unread. */
        maxConnections: z.number().int().min(1).optional(),
      })
      .strict()
      .optional(),
    metrics: z
      .object({
        enabled: z.boolean().optional(),
        host: listenHost.optional(),
        port: port.optional(),
        maxModelValues: z.number().int().min(1).optional(),
        /** Also record per-token ITL (`llm_proxy_time_per_output_token_seconds`) where a stream reports cumulative usage. */
        perTokenItl: z.boolean().optional(),
        /** Ask recognised LLM APIs for uncompressed responses (`Accept-Encoding: identity`), so they can be measured. */
        identityEncoding: z.boolean().optional(),
        /**
         * Event-loop-delay sampling period in ms: finer catches shorter stalls, and every sample
         * wakes the process. A collection whose window held fewer than two samples repeats the
         * previous values, so the period must stay well below the scrape or export interval.
         */
        loopDelayResolutionMs: z.number().int().min(1).max(1000).optional(),
        /** Seconds the metrics port stays open after a drain for one more scrape (0: not at all). */
        finalScrapeWait: z.number().min(0).max(MAX_TIMER_SECONDS, TIMER_LIMIT).optional(),
        buckets: z
          .object({
            itl: boundaries.optional(),
            ttft: boundaries.optional(),
            duration: boundaries.optional(),
            tokens: boundaries.optional(),
          })
          .strict()
          .optional(),
      })
      .strict()
      .optional(),
    timeouts: z
      .object({
        connect: seconds.optional(),
        response: seconds.optional(),
        idle: seconds.optional(),
        // Node's server times an idle connection out 1 s after keepAliveTimeout: one second less.
        keepAlive: z.number().positive().max(MAX_TIMER_SECONDS - 1, `must be at most ${MAX_TIMER_SECONDS - 1} s (Node waits 1 s more, and its timers cannot be longer than ${MAX_TIMER_SECONDS} s)`).optional(),
        upstreamKeepAlive: seconds.max(3600).optional(),
        upstreamKeepAliveMax: seconds.max(3600).optional(),
        upstreamConnectionMaxAge: seconds.optional(),
      })
      .strict()
      .optional(),
    limits: z
      .object({
        maxEventBytes: z.number().int().min(1024).optional(),
        maxBodyBytes: z.number().int().min(0).optional(),
        maxBufferedBytes: z.number().int().min(0).optional(),
        maxRequestScanBytes: z.number().int().min(0).optional(),
      })
      .strict()
      .optional(),
    log: z.object({ level: z.enum(LOG_LEVELS).optional() }).strict().optional(),
    drainTimeout: z.number().min(0).max(MAX_TIMER_SECONDS, TIMER_LIMIT).optional(),
    otlp: z
      .object({
        enabled: z.boolean().optional(),
        /** Full metrics URL, e.g. http://collector:4318/v1/metrics (else the OTEL_EXPORTER_OTLP_* variables). */
        endpoint: httpUrl.optional(),
        // Below 0.1 s each push times out before it is sent, and the log fills with the warnings.
        intervalSeconds: z.number().min(0.1, 'must be at least 0.1 s').max(MAX_TIMER_SECONDS, TIMER_LIMIT).optional(),
        /** Base-2 exponential histograms over OTLP (they become Prometheus native histograms). */
        exponentialHistograms: z.boolean().optional(),
      })
      .strict()
      .optional(),
    simulator: simulatorSchema.optional(),
    /** How upstreams are reached: `none` (direct, the default), `env` (HTTPS_PROXY, HTTP_PROXY, NO_PROXY) or a proxy URL. */
    egressProxy: z.string().min(1).optional(),
    /** Hosts reached directly despite egressProxy (else NO_PROXY's list): names (with subdomains), host:port, IPs, CIDR ranges, `*`. */
    noProxy: z
      .union([z.string(), z.array(z.string().min(1))], { error: 'expected a list of hosts, or one string of them separated by commas' })
      .superRefine((v, ctx) => {
        const entries = typeof v === 'string' ? splitNoProxy(v) : v;
        entries.forEach((e, i) => {
          const problem = noProxyEntryProblem(e, entries.length === 1);
          if (problem !== undefined) ctx.addIssue({ code: 'custom', message: `${problem} (got "${e}")`, path: typeof v === 'string' ? [] : [i] });
        });
      })
      .optional(),
  })
  .strict();

export type RouteConfig = z.output<typeof routeSchema>;

/** The "/" route to `upstream` with every setting at its default (--upstream, the simulator). */
export function rootRoute(upstream: string): RouteConfig {
  return { prefix: '/', upstream, stripPrefix: true, forwardedHeaders: true };
}
export type SimulatorConfig = z.output<typeof simulatorSchema>;
export type FileConfig = z.input<typeof fileSchema>;

export interface Config {
  readonly routes: readonly RouteConfig[];
  /** The egress proxies upstreams are reached through (none by default). */
  readonly egress: EgressSettings;
  /** True when no upstream was configured and the built-in simulator serves "/". */
  readonly useSimulator: boolean;
  readonly simulator: SimulatorConfig;
  readonly host: string;
  readonly port: number;
  /**
   * Client connections the proxy's port holds open at most (idle keep-alive ones and WebSocket
   * tunnels included); a new one past it is closed at once, unread. None: no cap.
   */
  readonly maxConnections: number | undefined;
  readonly metrics: {
    readonly enabled: boolean;
    readonly host: string;
    readonly port: number;
    readonly maxModelValues: number;
    readonly perTokenItl: boolean;
    readonly identityEncoding: boolean;
    readonly loopDelayResolutionMs: number;
    /**
     * Seconds the metrics port stays open after the drain, until one scrape collected after it
     * has been sent (0: closed with the proxy's port, as before).
     */
    readonly finalScrapeWait: number;
    readonly buckets: { readonly itl: number[]; readonly ttft: number[]; readonly duration: number[]; readonly tokens: number[] };
  };
  /**
   * Seconds. keepAlive: how long an idle client connection is kept open;
   * upstreamKeepAlive: how long an idle upstream connection is kept for reuse
   * when the upstream sends no `Keep-Alive: timeout` hint; with a hint, the hint
   * minus 1 s, at most upstreamKeepAliveMax (undici's policy, with a 1 s margin
   * where recent undici uses 2 s). upstreamKeepAliveMax caps hints only, not
   * upstreamKeepAlive. upstreamConnectionMaxAge: a pooled upstream connection older than this
   * is closed when its exchange ends, not reused (nginx's keepalive_time), so a busy
   * connection does not keep an address the upstream's name no longer gives.
   */
  readonly timeouts: {
    readonly connect: number;
    readonly response: number;
    readonly idle: number;
    readonly keepAlive: number;
    readonly upstreamKeepAlive: number;
    readonly upstreamKeepAliveMax: number;
    readonly upstreamConnectionMaxAge: number;
  };
  /**
   * maxBodyBytes: a non-streamed response body read whole (kept in memory); maxBufferedBytes: what
   * all requests together keep of events and bodies being read (see sse/byte-budget.ts);
   * maxRequestScanBytes: how far a request body is scanned for its `model` and `prediction` (streamed through, nothing kept).
   */
  readonly limits: { readonly maxEventBytes: number; readonly maxBodyBytes: number; readonly maxBufferedBytes: number; readonly maxRequestScanBytes: number };
  readonly logLevel: string;
  /** Seconds to let in-flight streams finish on SIGTERM. */
  readonly drainTimeout: number;
  /** Pull endpoint on the metrics port (`OTEL_METRICS_EXPORTER` contains `prometheus`, the default). */
  readonly prometheus: boolean;
  readonly otlp: {
    readonly enabled: boolean;
    readonly endpoint: string | undefined;
    readonly intervalMs: number;
    readonly exponentialHistograms: boolean;
  };
  /** Said at start, at warn: settings that were taken but will not do what they seem to ask. */
  readonly warnings?: readonly string[];
}


/** One step of a key path: `.name`, `[0]`, or a quoted `[""]` for a key a reader could not see or tell apart (empty, spaces, dots, control or zero-width characters, escaped). */
function keyStep(k: PropertyKey): string {
  if (typeof k === 'number') return `[${k}]`;
  const s = String(k);
  if (/^[A-Za-z_$][\w$-]*$/.test(s)) return `.${s}`;
  // JSON.stringify leaves format and separator characters as they are (a zero-width space looks like nothing).
  return `[${JSON.stringify(s).replace(/[\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)}]`;
}

function formatIssues(issues: readonly z.core.$ZodIssue[], source: string): string {
  const lines = issues.flatMap((i) => {
    const path = i.path.map(keyStep).join('');
    const named = (p: string) => p.replace(/^\./, '');
    if (i.code === 'unrecognized_keys') return i.keys.map((k) => `${named(path + keyStep(k))}: unknown key`);
    // zod says "Invalid input: expected string, received undefined" for a key left out.
    // (`input` is there because the parse asks for `reportInput`.)
    if (i.code === 'invalid_type' && i.input === undefined) return [`${named(path) || '(root)'}: required (${i.expected})`];
    return [`${named(path) || '(root)'}: ${i.message}`];
  });
  return `invalid configuration in ${source}:\n  ${lines.join('\n  ')}`;
}

export function loadFile(path: string): FileConfig {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new ConfigError(`cannot read config file ${path}: ${(e as Error).message}`);
  }
  return (yamlValue(text, path) as FileConfig | null) ?? {};
}

/**
 * The YAML's value, or one line on what is wrong with it (line and column, without the
 * excerpt). A tag the proxy cannot take is an error, not a warning on stderr: YAML 1.1's
 * `!!omap`, `!!set`, `!!timestamp` and `!!binary` would otherwise become a Map, Set, Date or
 * Buffer, which the schema takes for an empty section (its keys, and their checks, gone).
 */
function yamlValue(text: string, path: string): unknown {
  const plain = ' (write it without a tag: plain mappings, lists and values only)';
  let problem: string;
  try {
    // Not logLevel 'silent': it also drops the error for a second document (review 123).
    // parseDocument logs nothing itself.
    const doc = parseDocument(text, { resolveKnownTags: false });
    const first = doc.errors[0] ?? doc.warnings[0];
    if (first === undefined) {
      const value = doc.toJS() as unknown;
      // Under a `%YAML 1.1` directive those tags are the schema's own, so the values are checked.
      const where = notPlain(value, '');
      if (where === undefined) return value;
      problem = `${where || '(root)'} is a YAML !!omap, !!set, !!timestamp or !!binary value${plain}`;
    } else {
      problem = first.message.split('\n')[0]!.replace(/:$/, '');
      if (first.code === 'TAG_RESOLVE_FAILED') problem += plain;
      if (first.code === 'MULTIPLE_DOCS') problem = `a second document begins at line ${first.linePos?.[0].line}: the file holds one`;
    }
  } catch (e) {
    problem = (e as Error).message;
  }
  throw new ConfigError(`config file ${path} is not valid YAML: ${problem.split('\n')[0]!.replace(/:$/, '')}`);
}

/** The path of the first value in `v` that is not a plain object, array or scalar, if any. */
function notPlain(v: unknown, at: string): string | undefined {
  if (v === null || typeof v !== 'object') return undefined;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const w = notPlain(v[i], `${at}[${i}]`);
      if (w !== undefined) return w;
    }
    return undefined;
  }
  if (Object.getPrototypeOf(v) !== Object.prototype) return at;
  for (const [k, x] of Object.entries(v)) {
    const w = notPlain(x, at === '' ? k : `${at}.${k}`);
    if (w !== undefined) return w;
  }
  return undefined;
}

/** Validates a config object (from YAML) merged with overrides into the runtime config. */
export function buildConfig(raw: unknown, overrides: Overrides = {}, source = 'config'): Config {
  const parsed = fileSchema.safeParse(raw ?? {}, { reportInput: true });
  if (!parsed.success) throw new ConfigError(formatIssues(parsed.error.issues, source));
  const f = parsed.data;
  // Flags and variables were checked where they were read (naming them); overrides given otherwise here.
  upstreamOf('upstream', overrides.upstream);
  logLevelOf('log level', overrides.logLevel);
  if (overrides.drainTimeout !== undefined && !(overrides.drainTimeout <= MAX_TIMER_SECONDS)) {
    throw new ConfigError(`drain timeout: must be at most ${MAX_TIMER_SECONDS} s (~24.8 days), got ${overrides.drainTimeout}`);
  }
  if (overrides.finalScrapeWait !== undefined && !(overrides.finalScrapeWait >= 0 && overrides.finalScrapeWait <= MAX_TIMER_SECONDS)) {
    throw new ConfigError(`final scrape wait (--final-scrape-wait, LLM_PROXY_FINAL_SCRAPE_WAIT): must be from 0 to ${MAX_TIMER_SECONDS} s (~24.8 days), got ${overrides.finalScrapeWait}`);
  }
  if (f.upstream !== undefined && f.routes !== undefined) {
    throw new ConfigError(`invalid configuration in ${source}:\n  upstream: give either "upstream" or "routes", not both`);
  }

  let routes: RouteConfig[];
  const upstream = overrides.upstream ?? f.upstream;
  if (f.routes === undefined) {
    routes = upstream === undefined ? [] : [rootRoute(upstream)];
  } else if (overrides.upstream !== undefined) {
    // --upstream / LLM_PROXY_UPSTREAM is the upstream of "/": it replaces the file's "/" route's
    // upstream (keeping its other settings) or adds a "/" route; the file's other routes stay.
    const root = f.routes.findIndex((r) => normalizePrefix(r.prefix) === '/');
    routes = [...f.routes];
    if (root === -1) routes.push(rootRoute(overrides.upstream));
    else routes[root] = { ...routes[root]!, upstream: overrides.upstream };
  } else {
    routes = f.routes;
  }
  const seen = new Set<string>();
  routes.forEach((r, i) => {
    const p = normalizePrefix(r.prefix);
    if (seen.has(p)) throw new ConfigError(`invalid configuration in ${source}:\n  routes[${i}].prefix: duplicate prefix "${r.prefix}"`);
    seen.add(p);
  });
  // An upstream that is there but empty (a template or secret left unfilled) is a mistake, not a
  // request for the built-in simulator's made-up answers; with another upstream it is moot.
  if (routes.length === 0 && f.routes !== undefined) {
    throw new ConfigError(`invalid configuration in ${source}:\n  routes: must list at least one route (remove the key to use the built-in simulator)`);
  }
  if (routes.length === 0 && overrides.upstreamEmpty === true) {
    throw new ConfigError('LLM_PROXY_UPSTREAM: set but empty, and no other upstream is given (unset it to use the built-in simulator)');
  }
  const useSimulator = routes.length === 0;

  const m = f.metrics ?? {};
  const warnings: string[] = [...(overrides.warnings ?? [])];
  // Settings that would do nothing: said, since their author expects them to.
  if (f.simulator !== undefined && !useSimulator) warnings.push(`simulator (${source}) is ignored: an upstream is configured, and the built-in simulator runs only without one`);
  const otlpOn = overrides.exporters?.otlp ?? f.otlp?.enabled ?? false;
  const otlpKeys = Object.keys(f.otlp ?? {}).filter((k) => k !== 'enabled');
  // Not when OTLP was turned off on purpose in the file (the settings kept for later).
  if (!otlpOn && otlpKeys.length > 0 && (f.otlp?.enabled !== false || overrides.exporters !== undefined)) {
    const why = overrides.exporters !== undefined ? 'OTEL_METRICS_EXPORTER leaves OTLP out' : 'otlp.enabled is not true';
    warnings.push(`otlp.${otlpKeys.join(', otlp.')} (${source}) ignored: ${why}, so nothing is pushed`);
  }
  const finalScrapeWait = overrides.finalScrapeWait ?? m.finalScrapeWait ?? 0;
  const metricsOn = overrides.metricsEnabled ?? m.enabled ?? true;
  if (finalScrapeWait > 0 && !(metricsOn && (overrides.exporters?.prometheus ?? true))) {
    const why = metricsOn ? 'OTEL_METRICS_EXPORTER leaves Prometheus out' : 'metrics are disabled';
    const key = overrides.finalScrapeWait !== undefined ? '--final-scrape-wait / LLM_PROXY_FINAL_SCRAPE_WAIT' : `metrics.finalScrapeWait (${source})`;
    warnings.push(`the final scrape wait (${key}: ${finalScrapeWait} s) is ignored: ${why}, so no scrape is waited for`);
  }
  if (m.buckets?.itl !== undefined && !m.buckets.itl.includes(STALL_GAP_SECONDS)) {
    warnings.push(
      `metrics.buckets.itl has no ${STALL_GAP_SECONDS} s boundary: the shipped stall alert (LLMProxyStreamStalls, grafana/params.yaml alerts.stalls.gapSeconds) counts the gaps above that bucket and will never fire; add it, or rebuild the rules with your boundaries as gapBuckets and a gapSeconds among them (grafana/params.yaml)`,
    );
  }
  return Object.freeze({
    routes: Object.freeze(routes.map((r) => Object.freeze({ ...r, prefix: normalizePrefix(r.prefix) }))),
    egress: egressSettings(f, overrides, source, warnings),
    warnings: Object.freeze(warnings),
    useSimulator,
    simulator: simulatorSchema.parse(f.simulator ?? {}),
    host: overrides.host ?? f.listen?.host ?? '127.0.0.1',
    port: overrides.port ?? f.listen?.port ?? 8080,
    maxConnections: f.listen?.maxConnections,
    metrics: Object.freeze({
      enabled: metricsOn,
      host: overrides.metricsHost ?? m.host ?? DEFAULT_METRICS_HOST,
      port: overrides.metricsPort ?? m.port ?? DEFAULT_METRICS_PORT,
      maxModelValues: m.maxModelValues ?? 100,
      perTokenItl: m.perTokenItl ?? false,
      identityEncoding: m.identityEncoding ?? true,
      loopDelayResolutionMs: m.loopDelayResolutionMs ?? DEFAULT_LOOP_RESOLUTION_MS,
      finalScrapeWait,
      buckets: {
        itl: m.buckets?.itl ?? [...DEFAULT_BUCKETS.itl],
        ttft: m.buckets?.ttft ?? [...DEFAULT_BUCKETS.ttft],
        duration: m.buckets?.duration ?? [...DEFAULT_BUCKETS.duration],
        tokens: m.buckets?.tokens ?? [...DEFAULT_BUCKETS.tokens],
      },
    }),
    timeouts: Object.freeze({
      connect: f.timeouts?.connect ?? 10,
      // Just under the OpenAI and Anthropic SDKs' 600 s read timeout (they announce it in
      // x-stainless-read-timeout): a slow answer that works direct must not become a 504 the
      // SDK retries twice, each attempt billed; yet a provider that hangs is ended here, as a
      // timeout (an error the alerts page), not by the SDK, as a cancellation.
      response: f.timeouts?.response ?? 590,
      idle: f.timeouts?.idle ?? 590,
      // Longer than clients' and load balancers' idle timeouts (60 s on AWS ALB),
      // so the proxy is not the side that closes a connection a client is reusing.
      keepAlive: f.timeouts?.keepAlive ?? 65,
      // Shorter than uvicorn's 5 s idle timeout (vLLM and other Python servers), which
      // comes with no Keep-Alive hint: a request written as such a server closes the
      // connection fails, and a POST cannot be retried. Upstreams that keep idle
      // connections longer can be given more, to spare new connections' handshakes.
      upstreamKeepAlive: f.timeouts?.upstreamKeepAlive ?? 4,
      // A server that says how long it keeps idle connections is believed (less 1 s
      // for transit), up to this cap: undici's keepAliveMaxTimeout default.
      upstreamKeepAliveMax: f.timeouts?.upstreamKeepAliveMax ?? 600,
      // nginx's keepalive_time default: a steady stream of requests on one pooled connection
      // would otherwise never look the upstream's name up again.
      upstreamConnectionMaxAge: f.timeouts?.upstreamConnectionMaxAge ?? 3600,
    }),
    limits: Object.freeze({
      maxEventBytes: f.limits?.maxEventBytes ?? 1024 * 1024,
      maxBodyBytes: f.limits?.maxBodyBytes ?? 4 * 1024 * 1024,
      // 64 events of the default 1 MiB at once: token streams never come near it (an event's first
      // 64 KiB are always granted); streams of generated images or audio do, and a few hundred
      // of them held ~1.5 MiB each without it.
      maxBufferedBytes: f.limits?.maxBufferedBytes ?? 64 * 1024 * 1024,
      // Above every provider's request size limit: the official Python SDKs put `model` after
      // `messages`, so a 5 MB vision request scanned to 4 MiB had no model label.
      maxRequestScanBytes: f.limits?.maxRequestScanBytes ?? 64 * 1024 * 1024,
    }),
    logLevel: overrides.logLevel ?? f.log?.level ?? 'info',
    drainTimeout: overrides.drainTimeout ?? f.drainTimeout ?? 30,
    prometheus: overrides.exporters?.prometheus ?? true,
    otlp: Object.freeze({
      enabled: overrides.exporters?.otlp ?? f.otlp?.enabled ?? false,
      // The exporter reads the variables itself when given no URL (one given in code would win).
      endpoint: overrides.otlpEndpointFromEnv === true ? undefined : f.otlp?.endpoint,
      intervalMs: overrides.otlpIntervalMs ?? (f.otlp?.intervalSeconds !== undefined ? f.otlp.intervalSeconds * 1000 : 60_000),
      exponentialHistograms: f.otlp?.exponentialHistograms ?? false,
    }),
  });
}

/**
 * The egress proxy: LLM_PROXY_EGRESS_PROXY, else the file's `egressProxy`, else `env` when
 * NODE_USE_ENV_PROXY=1 (Node's switch), else none. Errors name the key or variable.
 */
function egressSettings(f: z.output<typeof fileSchema>, overrides: Overrides, source: string, warnings: string[]): EgressSettings {
  const fromVar = overrides.egressProxy !== undefined;
  const mode = (overrides.egressProxy ?? f.egressProxy ?? (overrides.proxyEnv?.nodeUseEnvProxy === true ? 'env' : 'none')).trim();
  const modeKey = fromVar ? 'LLM_PROXY_EGRESS_PROXY' : `invalid configuration in ${source}:\n  egressProxy`;
  const env = overrides.proxyEnv;
  const noProxy = f.noProxy === undefined ? splitNoProxy(env?.no?.[1] ?? '') : typeof f.noProxy === 'string' ? splitNoProxy(f.noProxy) : f.noProxy;
  const parse = (key: string, value: string): EgressProxy | undefined => {
    if (value.trim() === '') return undefined; // an empty variable: no proxy, as in undici
    try {
      return parseProxyUrl(value);
    } catch (e) {
      // The value is echoed to help, but not a password in it.
      throw new ConfigError(`${key}: ${(e as Error).message} (got "${maskedUrl(value)}")`);
    }
  };
  if (mode.toLowerCase() === 'none') return NO_EGRESS;
  if (mode.toLowerCase() === 'env') {
    const http = env?.http === undefined ? undefined : parse(env.http[0], env.http[1]);
    // An empty https_proxy falls back to http_proxy, as in undici.
    const https = env?.https === undefined || env.https[1].trim() === '' ? http : parse(env.https[0], env.https[1]);
    if (http === undefined && https === undefined) {
      // Node's NODE_USE_ENV_PROXY=1 with no variable is silent, and may be set for every Node
      // program on the host; `env` asked of this proxy by name and finding nothing is worth a word.
      if (fromVar || f.egressProxy !== undefined) {
        const asked = fromVar ? 'LLM_PROXY_EGRESS_PROXY=env' : `egressProxy: env (${source})`;
        warnings.push(`${asked}, but none of https_proxy, HTTPS_PROXY, http_proxy, HTTP_PROXY is set to a proxy: upstreams are reached directly`);
      }
      return NO_EGRESS;
    }
    return Object.freeze({ http, https, noProxy: Object.freeze([...noProxy]) });
  }
  // A word that is not a keyword (`enve`, `off`, `direct`) is a typo, not a proxy named so on
  // port 80: without a scheme, only host:port is taken as a proxy (the variables keep curl's rule).
  if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(mode) && !/:\d+\/?$/.test(mode)) {
    throw new ConfigError(`${modeKey}: expected env, none or a proxy URL such as http://proxy.example:3128 (got "${maskedUrl(mode)}")`);
  }
  const proxy = parse(modeKey, mode);
  return Object.freeze({ http: proxy, https: proxy, noProxy: Object.freeze([...noProxy]) });
}

function normalizePrefix(p: string): string {
  return p.length > 1 && p.endsWith('/') ? p.replace(/\/+$/, '') || '/' : p;
}




/** Flags win over the environment, which wins over the file. */
export function loadConfig(flags: Overrides, env: NodeJS.ProcessEnv): Config {
  const merged: Overrides = { ...envOverrides(env) };
  for (const [k, v] of Object.entries(flags)) if (v !== undefined) (merged as Record<string, unknown>)[k] = v;
  const raw = merged.config !== undefined ? loadFile(merged.config) : {};
  return buildConfig(raw, merged, merged.config ?? 'flags');
}
