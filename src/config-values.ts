/**
 * The configuration's scalars from flags and `LLM_PROXY_*` variables, checked, and the errors
 * they raise. Apart from config.ts (the file's schema, with zod and yaml) so that the CLI's
 * `healthcheck`, which a container runs every few seconds, loads neither unless a config file
 * is involved.
 */

/** A configuration problem: the message names the offending key. Exit code 2. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}

export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'] as const;

/** A log level given by a flag or variable (named `source` in the error), checked. */
export function logLevelOf(source: string, v: string | undefined): string | undefined {
  if (v === undefined || LOG_LEVELS.includes(v as (typeof LOG_LEVELS)[number])) return v;
  throw new ConfigError(`${source}: expected one of ${LOG_LEVELS.join(', ')}, got "${v}"`);
}

const URL_EXPECTED = 'must be an absolute http:// or https:// URL';

/** What is wrong with an upstream or endpoint URL, if anything. */
export function httpUrlProblem(s: string): string | undefined {
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    if (/^https?:\/\/\[[^\]]*%/i.test(s)) return 'IPv6 zone IDs ([fe80::1%25eth0]) are not supported (Node\'s URL parser refuses them)';
    return URL_EXPECTED;
  }
  if ((u.protocol !== 'http:' && u.protocol !== 'https:') || u.hostname === '') return URL_EXPECTED;
  if (s.includes('?') || s.includes('#')) return 'must not contain a query or fragment';
  // Credentials in the URL would not be sent (the client's own Authorization is forwarded).
  if (u.username !== '' || u.password !== '') return "must not contain user:password (not sent; the client's own Authorization header is forwarded)";
  if (u.port === '0') return 'port 0 cannot be connected to';
  return undefined;
}

/**
 * A URL as given, for an error message, without what may be a secret: credentials, the query
 * (Gemini's `?key=`, Azure's `?api-key=`, a signature) and the fragment. An http(s) URL whose
 * last `@` before its query lies in what the parser takes for its authority is rebuilt from its
 * parts (an `@` in the query is no password's). Otherwise everything up to the last `@` is masked
 * (a password may hold `/`, `@` or `:` unencoded: `http://u:2024/pw@proxy` parses with `pw@proxy`
 * in its path, and the scheme may be left out: `user:pw@proxy:3128`), and the query and fragment
 * too; with both an `@` and a `?` or `#` in the way, only the scheme is kept.
 */
export function maskedUrl(v: string): string {
  const scheme = /^[a-z][a-z0-9+.-]*:\/\//i.exec(v)?.[0] ?? '';
  const q = v.search(/[?#]/);
  const at = (q === -1 ? v : v.slice(0, q)).lastIndexOf('@');
  const authority = /^https?:\/\/[^/?#\\]*/i.exec(v)?.[0];
  if (authority !== undefined && at < authority.length && URL.canParse(v)) {
    const u = new URL(v);
    const credentials = u.username !== '' || u.password !== '' ? '…@' : '';
    const path = v.length > authority.length && v[authority.length] === '/' ? u.pathname : ''; // not the `/` the parser adds
    return `${scheme}${credentials}${u.host}${path}${v.includes('?') ? '?…' : ''}${v.includes('#') ? '#…' : ''}`;
  }
  const lastAt = v.lastIndexOf('@');
  // Both: which one ends the password and which one begins the query cannot be told.
  if (lastAt !== -1 && q !== -1) return `${scheme}…`;
  if (lastAt !== -1) return `${scheme}…${v.slice(lastAt)}`;
  return q === -1 ? v : `${v.slice(0, q + 1)}…`;
}

/** An upstream URL given by a flag or variable (named `source` in the error), checked. */
export function upstreamOf(source: string, v: string | undefined): string | undefined {
  if (v === undefined) return v;
  const problem = httpUrlProblem(v);
  // The value is echoed to help, but not a password or query in it (stderr often reaches a log system).
  if (problem !== undefined) throw new ConfigError(`${source}: ${problem} (got "${maskedUrl(v)}")`);
  return v;
}

/** What is wrong with a listen address, if anything. */
export function listenHostProblem(v: string): string | undefined {
  if (v.trim() === '') return 'must not be empty (0.0.0.0 or :: listens on every interface)';
  // Node's URL parser refuses zone IDs, so neither the logged URLs nor the health check could use one.
  if (v.includes('%')) return 'IPv6 zone IDs (fe80::1%eth0) are not supported: give an address without one, or :: for every interface';
  return undefined;
}

/** An IPv6 listen address as URLs write it (`[::1]`) means the address itself. */
export function unbracket(v: string): string {
  return /^\[[^\]]*\]$/.test(v) ? v.slice(1, -1) : v;
}

/** A listen address given by a flag (an empty one would mean every interface), checked. */
export function hostOf(source: string, v: string | undefined): string | undefined {
  if (v === undefined) return v;
  const problem = listenHostProblem(v);
  if (problem !== undefined) throw new ConfigError(`${source}: ${problem}`);
  return unbracket(v);
}

/** Node timers hold at most 2^31 − 1 ms (~24.8 days); a longer one fires after 1 ms. */
export const MAX_TIMER_SECONDS = 2_147_483;

/** Where /metrics, /healthz and /readyz listen unless told otherwise. */
export const DEFAULT_METRICS_HOST = '127.0.0.1';
export const DEFAULT_METRICS_PORT = 9464;

/** Values from flags or the environment; they win over the file. */
export interface Overrides {
  config?: string;
  upstream?: string;
  host?: string;
  port?: number;
  metricsHost?: string;
  metricsPort?: number;
  metricsEnabled?: boolean;
  logLevel?: string;
  /** From OTEL_METRICS_EXPORTER: which exporters run. */
  exporters?: { prometheus: boolean; otlp: boolean };
  otlpIntervalMs?: number;
  /** OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set: it wins over the file's `otlp.endpoint`. */
  otlpEndpointFromEnv?: boolean;
  drainTimeout?: number;
  finalScrapeWait?: number;
  /** LLM_PROXY_EGRESS_PROXY: `env`, `none` or a proxy URL. */
  egressProxy?: string;
  /** The standard proxy variables, read when the egress proxy is `env`: [variable name, value]. */
  proxyEnv?: ProxyEnv;
  /** LLM_PROXY_UPSTREAM is set but empty (a secret or template left unfilled). */
  upstreamEmpty?: boolean;
  /** What the variables' reading has to say at start (an `LLM_PROXY_*` name the proxy does not read). */
  warnings?: readonly string[];
}

/** The `LLM_PROXY_*` variables the proxy reads. */
export const ENV_NAMES: readonly string[] = [
  'LLM_PROXY_CONFIG',
  'LLM_PROXY_UPSTREAM',
  'LLM_PROXY_HOST',
  'LLM_PROXY_PORT',
  'LLM_PROXY_METRICS',
  'LLM_PROXY_METRICS_HOST',
  'LLM_PROXY_METRICS_PORT',
  'LLM_PROXY_LOG_LEVEL',
  'LLM_PROXY_DRAIN_TIMEOUT',
  'LLM_PROXY_FINAL_SCRAPE_WAIT',
  'LLM_PROXY_EGRESS_PROXY',
];

/** Edit distance, for the nearest known name of a misspelt one. */
function distance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) row[j] = Math.min(prev[j]! + 1, row[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = row;
  }
  return prev[b.length]!;
}

/**
 * `LLM_PROXY_*` variables the proxy does not read: a misspelt name would otherwise leave its
 * setting at the default without a word (an upstream's: the built-in simulator).
 */
export function unknownEnvWarnings(env: NodeJS.ProcessEnv): string[] {
  const out: string[] = [];
  for (const name of Object.keys(env).sort()) {
    if (!name.startsWith('LLM_PROXY_') || ENV_NAMES.includes(name)) continue;
    if (/^LLM_PROXY_(SERVICE_(HOST|PORT)|PORT_\d+_)/.test(name)) continue; // a Kubernetes service link's
    let near: string | undefined;
    let best = 4;
    for (const known of ENV_NAMES) {
      const d = distance(name, known);
      if (d < best) [near, best] = [known, d];
    }
    out.push(`${name} is not a variable of this proxy and is ignored${near === undefined ? '' : `; did you mean ${near}?`}`);
  }
  return out;
}

/** http_proxy, https_proxy and no_proxy as undici reads them (lower case first), and NODE_USE_ENV_PROXY. */
export interface ProxyEnv {
  http?: readonly [string, string];
  https?: readonly [string, string];
  no?: readonly [string, string];
  /** NODE_USE_ENV_PROXY=1: Node's own switch for honouring the variables. */
  nodeUseEnvProxy: boolean;
}

function proxyEnvOf(env: NodeJS.ProcessEnv): ProxyEnv {
  const pick = (lower: string): readonly [string, string] | undefined => {
    const upper = lower.toUpperCase();
    // An empty variable counts as set (it switches the proxy off), as in undici.
    if (env[lower] !== undefined) return [lower, env[lower]!];
    if (env[upper] !== undefined) return [upper, env[upper]!];
    return undefined;
  };
  const p: ProxyEnv = { nodeUseEnvProxy: env.NODE_USE_ENV_PROXY === '1' };
  const http = pick('http_proxy');
  const https = pick('https_proxy');
  const no = pick('no_proxy');
  if (http !== undefined) p.http = http;
  if (https !== undefined) p.https = https;
  if (no !== undefined) p.no = no;
  return p;
}

function envInt(env: NodeJS.ProcessEnv, name: string, max = 65535): number | undefined {
  const v = env[name];
  if (v === undefined || v === '') return undefined;
  if (/^tcp:\/\//.test(v)) {
    // Kubernetes sets <SERVICE>_PORT=tcp://ip:port for every Service in the namespace.
    throw new ConfigError(`${name}: "${v}" is a Kubernetes service link (a Service named ${name.slice(0, -'_PORT'.length).toLowerCase().replace(/_/g, '-')} sets it): set enableServiceLinks: false in the pod spec, or name the Service otherwise`);
  }
  if (!/^\d+$/.test(v) || Number(v) > max) throw new ConfigError(`${name}: expected an integer from 0 to ${max}, got "${v}"`);
  return Number(v);
}

/** A number as people write one (`30`, `0.5`, `1e3`): Number() also reads `0x10`, `0b1` and blanks. */
export const DECIMAL = /^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$/;

function envSeconds(env: NodeJS.ProcessEnv, name: string): number | undefined {
  const v = env[name];
  if (v === undefined || v === '') return undefined;
  const n = Number(v);
  if (!DECIMAL.test(v.trim()) || !Number.isFinite(n) || n < 0 || n > MAX_TIMER_SECONDS) {
    throw new ConfigError(`${name}: expected a number of seconds from 0 to ${MAX_TIMER_SECONDS} (~24.8 days), got ${JSON.stringify(v)}`);
  }
  return n;
}

/** Overrides from `LLM_PROXY_*` environment variables. */
export function envOverrides(env: NodeJS.ProcessEnv): Overrides {
  const o: Overrides = {};
  const set = <K extends keyof Overrides>(k: K, v: Overrides[K] | undefined) => {
    if (v !== undefined) o[k] = v;
  };
  set('config', env.LLM_PROXY_CONFIG || undefined);
  // Set and empty: an error only where it would leave the built-in simulator (buildConfig);
  // beside a routes file or --upstream it is a template's blank, and ignored.
  if (env.LLM_PROXY_UPSTREAM !== undefined && env.LLM_PROXY_UPSTREAM.trim() === '') o.upstreamEmpty = true;
  else set('upstream', upstreamOf('LLM_PROXY_UPSTREAM', env.LLM_PROXY_UPSTREAM));
  set('host', hostOf('LLM_PROXY_HOST', env.LLM_PROXY_HOST || undefined));
  set('port', envInt(env, 'LLM_PROXY_PORT'));
  set('metricsHost', hostOf('LLM_PROXY_METRICS_HOST', env.LLM_PROXY_METRICS_HOST || undefined));
  set('metricsPort', envInt(env, 'LLM_PROXY_METRICS_PORT'));
  set('logLevel', logLevelOf('LLM_PROXY_LOG_LEVEL', env.LLM_PROXY_LOG_LEVEL || undefined));
  set('drainTimeout', envSeconds(env, 'LLM_PROXY_DRAIN_TIMEOUT'));
  set('finalScrapeWait', envSeconds(env, 'LLM_PROXY_FINAL_SCRAPE_WAIT'));
  set('egressProxy', env.LLM_PROXY_EGRESS_PROXY || undefined);
  o.proxyEnv = proxyEnvOf(env);
  const unknown = unknownEnvWarnings(env);
  if (unknown.length > 0) o.warnings = unknown;
  // The standard OpenTelemetry variables: OTEL_METRICS_EXPORTER=otlp,prometheus|none, OTEL_METRIC_EXPORT_INTERVAL (ms).
  const exp = env.OTEL_METRICS_EXPORTER;
  if (exp !== undefined && exp.trim() !== '') {
    const names = exp.split(',').map((x) => x.trim().toLowerCase()).filter((x) => x !== '');
    const bad = names.find((n) => !['otlp', 'prometheus', 'none'].includes(n));
    if (bad !== undefined) throw new ConfigError(`OTEL_METRICS_EXPORTER: unknown exporter "${bad}" (use otlp, prometheus or none)`);
    o.exporters = { prometheus: names.includes('prometheus'), otlp: names.includes('otlp') };
  }
  if ((env.OTEL_EXPORTER_OTLP_METRICS_ENDPOINT ?? '').trim() !== '' || (env.OTEL_EXPORTER_OTLP_ENDPOINT ?? '').trim() !== '') o.otlpEndpointFromEnv = true;
  const interval = env.OTEL_METRIC_EXPORT_INTERVAL;
  if (interval !== undefined && interval !== '') {
    const n = Number(interval);
    if (!DECIMAL.test(interval.trim()) || !Number.isInteger(n) || n < 100 || n > MAX_TIMER_SECONDS * 1000) {
      throw new ConfigError(`OTEL_METRIC_EXPORT_INTERVAL: expected milliseconds from 100 to ${MAX_TIMER_SECONDS * 1000}, got ${JSON.stringify(interval)}`);
    }
    o.otlpIntervalMs = n;
  }
  const metrics = env.LLM_PROXY_METRICS;
  if (metrics !== undefined && metrics !== '') {
    if (!/^(true|false|on|off|1|0)$/i.test(metrics)) throw new ConfigError(`LLM_PROXY_METRICS: expected true or false, got "${metrics}"`);
    o.metricsEnabled = /^(true|on|1)$/i.test(metrics);
  }
  return o;
}
