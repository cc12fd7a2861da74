#!/usr/bin/env node
import { parseArgs } from 'node:util';
import zlib from 'node:zlib';
import {
  ConfigError,
  DECIMAL,
  DEFAULT_METRICS_HOST,
  DEFAULT_METRICS_PORT,
  envOverrides,
  hostOf,
  logLevelOf,
  MAX_TIMER_SECONDS,
  upstreamOf,
  type Overrides,
} from './config-values.js';
import { checkHealth, healthUrl, pid1Cmdline, proxyArgsOf } from './healthcheck.js';
import { PLAN_KEYS, planValueError, scheduleError } from './simulate/schedule.js';
import { descriptorShortage, openFileLimit } from './start-failure.js';
import { VERSION } from './version.js';
import type { Logger } from './log.js';

const USAGE = `llm-latency-proxy ${VERSION}: a transparent streaming proxy that measures LLM TTFT and inter-token latency

Usage:
  llm-latency-proxy [options]            proxy (built-in simulator as upstream when none is given)
  llm-latency-proxy simulate [options]   run the ground-truth simulator only
  llm-latency-proxy healthcheck [proxy options] [--timeout S (2)]
                                         exit 0 if the proxy so configured answers /healthz
                                         on its metrics port, else 1 (for a container's
                                         HEALTHCHECK; a proxy running as PID 1 lends its flags)

Proxy options (environment variable in brackets):
  --upstream URL        upstream base URL for "/" [LLM_PROXY_UPSTREAM]
  -c, --config FILE     YAML config with routes, timeouts, buckets [LLM_PROXY_CONFIG]
  --host HOST           proxy listen address, default 127.0.0.1 [LLM_PROXY_HOST]
  -p, --port N          proxy port, default 8080 (0 = any free port) [LLM_PROXY_PORT]
  --metrics-host HOST   metrics listen address, default 127.0.0.1 [LLM_PROXY_METRICS_HOST]
  --metrics-port N      metrics port (/metrics, /healthz, /readyz), default 9464 [LLM_PROXY_METRICS_PORT]
  --no-metrics          forward only: no parsing, no measurement [LLM_PROXY_METRICS=false]
  --drain-timeout S     seconds in-flight streams get on SIGTERM, default 30 [LLM_PROXY_DRAIN_TIMEOUT]
  --final-scrape-wait S after the drain, seconds /metrics stays up for one more scrape,
                        default 0 [LLM_PROXY_FINAL_SCRAPE_WAIT]
  --log-level LEVEL     trace|debug|info|warn|error|fatal|silent, default info [LLM_PROXY_LOG_LEVEL]
  (no flag)             egress proxy: env (HTTPS_PROXY, HTTP_PROXY, NO_PROXY), none, or a URL
                        [LLM_PROXY_EGRESS_PROXY; env also when NODE_USE_ENV_PROXY=1]

Simulator options (times in seconds):
  --port N (8081) --host HOST (127.0.0.1) --ttft S (0.25) --itl S (0.0014)
  --tokens N (200) --jitter F (0.1, fraction of one ITL) --seed N

  -h, --help   -v, --version
`;

/**
 * Node's defaults: SIGUSR1 opens the inspector (code execution for anything that reaches
 * 127.0.0.1:9229, a pod's sidecars included, in a process that holds API keys; nginx's USR1,
 * which a copied logrotate script sends, reopens logs) and SIGUSR2 ends the process at once,
 * cutting every stream. Neither means anything here, in the proxy or the simulator; `--inspect`
 * still opens the inspector. Caught from the start of main(), before the modules and the config
 * load (tens of milliseconds), and logged once a logger exists.
 */
const ignoredSignals: NodeJS.Signals[] = [];
let onIgnoredSignal = (signal: NodeJS.Signals): void => void ignoredSignals.push(signal);

function ignoreDebugSignals(): void {
  for (const signal of ['SIGUSR1', 'SIGUSR2'] as const) process.on(signal, () => onIgnoredSignal(signal));
}

function logIgnoredSignals(log: Logger): void {
  onIgnoredSignal = (signal) => log.warn({ signal }, 'signal ignored');
  for (const signal of ignoredSignals.splice(0)) onIgnoredSignal(signal);
}

function fail(message: string): never {
  process.stderr.write(`llm-latency-proxy: ${message}\n`);
  process.exit(2);
}

function num(name: string, v: string | undefined, opts: { int?: boolean; min?: number; max?: number } = {}): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  // Decimal only, as the variables take them (Number() also reads "0x10", "0b1", " 80"); integers
  // in digits only ("1e3" is a number of seconds, not a port).
  // An integer past 2^53 would be taken rounded (--seed 99999999999999999999999 as 1e23).
  if (!DECIMAL.test(v.trim()) || !Number.isFinite(n) || (opts.int && (!/^-?\d+$/.test(v.trim()) || !Number.isSafeInteger(n))) || (opts.min !== undefined && n < opts.min) || (opts.max !== undefined && n > opts.max)) {
    const what = opts.int ? 'an integer' : 'a number';
    const range =
      opts.min !== undefined && opts.max !== undefined
        ? ` from ${opts.min} to ${opts.max}`
        : opts.min !== undefined
          ? (opts.min === 0 ? ' of 0 or more' : ` of at least ${opts.min}`)
          : '';
    throw new ConfigError(`--${name}: invalid value ${JSON.stringify(v)} (expected ${what}${range})`);
  }
  return n;
}

async function runSimulate(args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: {
      port: { type: 'string' },
      host: { type: 'string' },
      ttft: { type: 'string' },
      itl: { type: 'string' },
      tokens: { type: 'string' },
      jitter: { type: 'string' },
      seed: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
      version: { type: 'boolean', short: 'v' },
    },
    strict: true,
  });
  if (infoOnly(values)) return;
  const [{ createLogger, exitAfterLogs }, { createSimulator }] = await Promise.all([import('./log.js'), import('./simulate/server.js')]);
  const log = createLogger(logLevelOf('LLM_PROXY_LOG_LEVEL', process.env.LLM_PROXY_LOG_LEVEL || undefined) ?? 'info');
  logIgnoredSignals(log);
  const plan = {
    ttft: num('ttft', values.ttft) ?? 0.25,
    itl: num('itl', values.itl) ?? 0.0014,
    tokens: num('tokens', values.tokens, { int: true }) ?? 200,
    jitter: num('jitter', values.jitter) ?? 0.1,
  };
  // The ranges /_sim/config keeps, in its words (a timer past ~24.8 days would fire at once, again and again).
  for (const k of PLAN_KEYS) {
    const problem = planValueError(k, plan[k]);
    if (problem !== undefined) throw new ConfigError(`--${k}: invalid value "${values[k]}" (${problem})`);
  }
  const tooLong = scheduleError(plan);
  if (tooLong !== undefined) throw new ConfigError(`--ttft, --itl, --tokens, --jitter: ${tooLong}`);
  const seed = num('seed', values.seed, { int: true });
  const sim = createSimulator({ ...plan, ...(seed !== undefined ? { seed } : {}) });
  // Handlers first: a signal right after the 'listening' line must not meet the default action.
  const listening = sim.listen(num('port', values.port, { int: true, min: 0, max: 65535 }) ?? 8081, hostOf('--host', values.host) ?? '127.0.0.1');
  let stopping = false;
  const stop = () => {
    if (stopping) return exitAfterLogs(log, 1); // a second signal: now
    stopping = true;
    void listening.then(
      () => sim.close().then(() => exitAfterLogs(log, 0)),
      () => undefined, // the listen failed: main() says so and exits
    );
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  const url = await listening;
  log.info({ url, ...plan, seed }, 'simulator listening');
}

const PROXY_OPTIONS = {
  upstream: { type: 'string' },
  config: { type: 'string', short: 'c' },
  host: { type: 'string' },
  port: { type: 'string', short: 'p' },
  'metrics-host': { type: 'string' },
  'metrics-port': { type: 'string' },
  'no-metrics': { type: 'boolean' },
  'drain-timeout': { type: 'string' },
  'final-scrape-wait': { type: 'string' },
  'log-level': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
  version: { type: 'boolean', short: 'v' },
} as const;

type ProxyValues = ReturnType<typeof parseArgs<{ options: typeof PROXY_OPTIONS; strict: true }>>['values'];

function configPath(v: string | undefined): string | undefined {
  if (v !== undefined && v.trim() === '') throw new ConfigError('--config: must not be empty (a YAML file)');
  return v;
}

function proxyFlags(values: ProxyValues): Overrides {
  return {
    config: configPath(values.config),
    upstream: upstreamOf('--upstream', values.upstream),
    host: hostOf('--host', values.host),
    port: num('port', values.port, { int: true, min: 0, max: 65535 }),
    metricsHost: hostOf('--metrics-host', values['metrics-host']),
    metricsPort: num('metrics-port', values['metrics-port'], { int: true, min: 0, max: 65535 }),
    metricsEnabled: values['no-metrics'] ? false : undefined,
    drainTimeout: num('drain-timeout', values['drain-timeout'], { min: 0, max: MAX_TIMER_SECONDS }),
    finalScrapeWait: num('final-scrape-wait', values['final-scrape-wait'], { min: 0, max: MAX_TIMER_SECONDS }),
    logLevel: logLevelOf('--log-level', values['log-level']),
  };
}

/** --help or --version: printed, and nothing else to do. */
function infoOnly(values: { help?: boolean; version?: boolean }): boolean {
  if (values.help) process.stdout.write(USAGE);
  else if (values.version) process.stdout.write(`${VERSION}\n`);
  else return false;
  return true;
}

async function runProxy(args: string[]): Promise<void> {
  const { values } = parseArgs({ args, options: PROXY_OPTIONS, strict: true });
  if (infoOnly(values)) return;
  // Loaded here, not at the top: `healthcheck` runs every few seconds and needs none of it.
  const [{ loadConfig }, { createLogger, exitAfterLogs, muteIfTerminalGone }, { startProxy }] = await Promise.all([import('./config.js'), import('./log.js'), import('./main.js')]);
  const config = loadConfig(proxyFlags(values), process.env);
  const log = createLogger(config.logLevel);
  // Handlers before the start: the 'listening' line can reach a supervisor (or a test) before
  // startProxy() returns, and a SIGTERM then must shut down, not meet the default action.
  const starting = startProxy(config, log);
  let started: Awaited<typeof starting> | undefined;
  void starting.then(
    (proxy) => (started = proxy),
    () => undefined, // main() says so and exits
  );
  let stopping = false;
  let terminalGone = false;
  const exit = (code: number): void => {
    if (!terminalGone) return exitAfterLogs(log, code);
    // Node 20 aborts at exit when it cannot restore a hung-up terminal's settings
    // (nodejs/node#51519): end as the hangup would have ended it, once the drain is done.
    process.removeAllListeners('SIGHUP');
    process.kill(process.pid, 'SIGHUP');
  };
  const stop = (signal: string) => {
    if (stopping) {
      // A second signal (Ctrl-C twice): no more waiting for streams to drain. Open WebSocket
      // tunnels are still sent their Close 1001 where one can go in (written before the exit,
      // the kernel delivers it as the process's sockets close), and the throttled log lines
      // their waiting counts.
      log.warn({ signal }, 'second signal: exiting now');
      started?.beforeForcedExit();
      exit(1);
      return;
    }
    stopping = true;
    log.info({ signal }, 'shutting down');
    starting.then(
      (proxy) =>
        proxy.shutdown().then(
          () => exit(0),
          (e: unknown) => {
            log.error({ err: (e as Error).message }, 'shutdown failed');
            exit(1);
          },
        ),
      () => undefined, // the start failed: main() says so and exits
    );
  };
  // A bug that escaped every handler: Node would print a bare stack trace and exit 1. The same
  // exit, with a fatal log line a log shipper can alert on and the usual prefix on stderr.
  const crashed = (kind: string) => (e: unknown): void => {
    const err = e instanceof Error ? e : new Error(String(e));
    process.stderr.write(`llm-latency-proxy: fatal: ${kind}: ${err.stack ?? err.message}\n`);
    log.fatal({ err: err.message, stack: err.stack }, `${kind}: exiting`);
    started?.beforeForcedExit();
    exit(1);
  };
  process.on('uncaughtException', crashed('uncaught exception'));
  process.on('unhandledRejection', crashed('unhandled rejection'));
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
  // A closed terminal or SSH session (or an init that forwards it): drain like SIGTERM rather
  // than die at once with every stream cut and no record of them.
  process.on('SIGHUP', () => {
    terminalGone ||= muteIfTerminalGone(log);
    stop('SIGHUP');
  });
  logIgnoredSignals(log);
  await starting;
}

/**
 * Exit 0 when the proxy configured like this one answers /healthz, else 1 (Docker reserves 2).
 * The flags of a proxy running as PID 1 (a container's) come first; this command's own win.
 */
async function runHealthcheck(args: string[]): Promise<void> {
  const options = { ...PROXY_OPTIONS, timeout: { type: 'string' } } as const;
  const unhealthy = (message: string): never => {
    process.stderr.write(`llm-latency-proxy healthcheck: ${message}\n`);
    process.exit(1);
  };
  let own: ReturnType<typeof parseArgs<{ options: typeof options; strict: true }>>['values'];
  try {
    own = parseArgs({ args, options, strict: true }).values;
  } catch (e) {
    return unhealthy((e as Error).message);
  }
  if (infoOnly(own)) return;
  let running: Overrides = {};
  const pid1 = proxyArgsOf(pid1Cmdline() ?? []);
  if (pid1 !== undefined) {
    try {
      running = defined(proxyFlags(parseArgs({ args: pid1, options: PROXY_OPTIONS, strict: true }).values));
    } catch {
      /* not a command line the proxy would have started with: its own flags only */
    }
  }
  let url: string;
  let timeoutMs: number;
  try {
    timeoutMs = (num('timeout', own.timeout, { min: 0.001, max: MAX_TIMER_SECONDS }) ?? 2) * 1000;
    const flags = { ...running, ...defined(proxyFlags(own)) };
    const merged = { ...envOverrides(process.env), ...flags };
    // Without a config file the address comes from flags and variables alone: the file's schema
    // (zod, yaml) is loaded only when there is a file, which halves the check's CPU.
    const metrics =
      merged.config === undefined
        ? { host: merged.metricsHost ?? DEFAULT_METRICS_HOST, port: merged.metricsPort ?? DEFAULT_METRICS_PORT }
        : (await import('./config.js')).loadConfig(flags, process.env).metrics;
    url = healthUrl(metrics);
  } catch (e) {
    return unhealthy((e as Error).message);
  }
  const r = await checkHealth(url, timeoutMs);
  if (!r.healthy) unhealthy(r.message);
  process.stdout.write(`healthy: ${r.message}\n`);
  process.exit(0); // nothing left to wait for (a socket the peer holds open, say)
}

/** The keys that are set: a flag one command line lacks must not erase the other's. */
function defined(o: Overrides): Overrides {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Overrides;
}

/** Read before the modules load: once they have taken every descriptor it could not be. */
const OPEN_FILE_LIMIT = openFileLimit();

async function main(): Promise<void> {
  // npm only warns about `engines`; without this an older Node dies on a module's missing export.
  if (typeof (zlib as { crc32?: unknown }).crc32 !== 'function') fail(`needs Node.js >= 20.15.0 (zlib.crc32, for Bedrock's frames); this is ${process.version}`);
  const argv = process.argv.slice(2);
  ignoreDebugSignals();
  if (argv[0] === 'simulate') await runSimulate(argv.slice(1));
  else if (argv[0] === 'healthcheck') await runHealthcheck(argv.slice(1));
  else await runProxy(argv);
}

main().catch((e: unknown) => {
  if (e instanceof ConfigError) fail(e.message);
  const err = e as NodeJS.ErrnoException;
  if (err.code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION' || err.code === 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE' || err.code === 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL') {
    fail(`${err.message}\nRun with --help for usage.`);
  }
  // An address that cannot be bound (in use, not ours, not resolvable) is a configuration error.
  if (['EADDRINUSE', 'EACCES', 'EADDRNOTAVAIL', 'EINVAL', 'ENOTFOUND', 'EAI_AGAIN', 'EAI_FAIL', 'EAI_NONAME'].includes(err.code ?? '')) {
    fail(`cannot listen: ${err.message}`);
  }
  const shortage = descriptorShortage(err, OPEN_FILE_LIMIT);
  if (shortage !== undefined) fail(shortage);
  process.stderr.write(`llm-latency-proxy: fatal: ${err.stack ?? String(e)}\n`);
  process.exit(1);
});
