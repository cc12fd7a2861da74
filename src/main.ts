import { diag, DiagLogLevel, type DiagLogger } from '@opentelemetry/api';
import type { Server } from 'node:http';
import type { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { rootRoute, type Config } from './config.js';
import { connectionDropLog, droppedLogLines, serverErrorLog, type Logger, type Throttled } from './log.js';
import { drainAfterIo } from './measure/after-io.js';
import { createTelemetry, SCOPE_NAME, type Telemetry } from './metrics/exporter.js';
import { FinalScrape } from './metrics/final-scrape.js';
import { Instruments } from './metrics/instruments.js';
import { ERROR_TYPE } from './metrics/semconv.js';
import { Forwarder } from './proxy/forward.js';
import { NO_EGRESS } from './proxy/egress.js';
import { upstreamOrigin } from './proxy/routes.js';
import { Tunnel } from './proxy/tunnel.js';
import { createMetricsApp, createProxyApp, listen } from './server.js';
import { createSimulator, type Simulator } from './simulate/server.js';
import { descriptorWarning, openFileLimit } from './start-failure.js';
import { VERSION } from './version.js';
import { sessionsClosing } from './ws/session.js';

export interface RunningProxy {
  readonly proxyUrl: string;
  readonly metricsUrl: string;
  /** The in-process simulator when no upstream was configured. */
  readonly simulator: Simulator | undefined;
  readonly simulatorUrl: string | undefined;
  readonly config: Config;
  readonly telemetry: Telemetry | undefined;
  readonly forwarder: Forwarder;
  /**
   * Graceful stop: readiness fails at once, no new connections, in-flight
   * streams get up to `deadlineSeconds` to finish, the rest are cut and
   * recorded with error type `shutdown_deadline`; then, with `metrics.finalScrapeWait`, the
   * metrics port waits for one more scrape.
   */
  shutdown(deadlineSeconds?: number): Promise<void>;
  /** Immediate stop (tests); ends a final scrape wait under way. */
  close(): Promise<void>;
  /**
   * For an exit that cannot wait (a second signal, a crash): throttled log lines write the counts
   * still waiting for their 10 s; each open WebSocket tunnel is ended as at the drain deadline,
   * its sides sent their Close 1001 now where a frame can go in, a side mid-frame cut at once.
   */
  beforeForcedExit(): void;
}

export async function startProxy(config: Config, log: Logger): Promise<RunningProxy> {
  let simulator: Simulator | undefined;
  let simulatorUrl: string | undefined;
  let cfg = config;
  for (const w of config.warnings ?? []) log.warn(w);
  if (config.useSimulator) {
    simulator = createSimulator(config.simulator);
    simulatorUrl = await simulator.listen(0, '127.0.0.1');
    const s = config.simulator;
    // The first log line says what the proxy is pointed at; at warn, so that a production log
    // level still shows a proxy answering with the simulator's made-up completions.
    log.warn(
      { simulatorUrl, ttft: s.ttft, itl: s.itl, tokens: s.tokens, jitter: s.jitter },
      `no upstream configured: using the built-in simulator at ${simulatorUrl} as the default upstream (no API key needed)`,
    );
    // The in-process simulator is on this host's loopback: never through an egress proxy.
    cfg = Object.freeze({ ...config, routes: [rootRoute(simulatorUrl)], egress: NO_EGRESS });
  }

  // A push that fails (collector down, wrong endpoint) reaches OpenTelemetry's diag logger,
  // which is silent unless one is set: say it in the proxy's log, at warn, once per failed push.
  // Set before the exporter is built, so that its own warnings are kept too.
  const otelLogger = cfg.metrics.enabled && cfg.otlp.enabled ? diagToLog(log) : undefined;
  if (otelLogger) diag.setLogger(otelLogger, { logLevel: DiagLogLevel.WARN, suppressOverrideMessage: true });
  const telemetry = cfg.metrics.enabled
    ? createTelemetry({
        prometheus: cfg.prometheus,
        loopDelayResolutionMs: cfg.metrics.loopDelayResolutionMs,
        ...(cfg.otlp.enabled ? { otlp: cfg.otlp, egress: cfg.egress } : {}),
      })
    : undefined;
  const instruments = telemetry
    ? new Instruments(telemetry.provider.getMeter(SCOPE_NAME, VERSION), cfg.metrics.buckets, {
        fast: telemetry.fast,
        sdkRequestHistograms: cfg.otlp.enabled && cfg.otlp.exponentialHistograms,
        perTokenItl: cfg.metrics.perTokenItl,
      })
    : undefined;
  const forwarder = new Forwarder({ config: cfg, log, instruments });
  await forwarder.warmUp();
  let draining = false;

  // Which of the two could not listen, on what address, and where that was set (both may be
  // given the same port; a host that is no address fails here, not at the config's check).
  const which = (what: string) => (e: Error): never => {
    e.message = `${what}: ${e.message}`;
    throw e;
  };
  // A connection closed at the cap has no request, and so no request line or stream series: it is
  // counted and logged here. The counter is there at 0 from the start, so that rate() sees the first.
  let dropped: (() => void) | undefined;
  let dropLog: Throttled<void> | undefined;
  if (cfg.maxConnections !== undefined) {
    const told = connectionDropLog(log, cfg.maxConnections);
    dropLog = told;
    instruments?.connectionsDropped.add(0);
    dropped = () => {
      instruments?.connectionsDropped.add(1);
      told();
    };
  }
  const files = openFileLimit();
  const short = files === undefined ? undefined : descriptorWarning(files, cfg.maxConnections, simulator !== undefined);
  if (short !== undefined) log.warn(short.fields, short.msg);
  const open = instruments?.connectionsOpen;
  open?.add(0);
  const opened = open
    ? (socket: Socket) => {
        open.add(1);
        socket.once('close', () => open.add(-1));
      }
    : undefined;
  const at = (host: string, port: number, keys: string) => `${host.includes(':') ? `[${host}]` : host}:${port} (${keys})`;
  const proxyErrors = serverErrorLog(log, 'proxy');
  const metricsErrors = serverErrorLog(log, 'metrics');
  const proxy = await listen(createProxyApp(forwarder), cfg.port, cfg.host, {
    keepAliveSeconds: cfg.timeouts.keepAlive,
    onUpgrade: (req, socket, head) => forwarder.upgrade(req, socket, head),
    onConnect: (req, socket) => forwarder.refuseConnect(req, socket),
    onRequestError: (err, req) => forwarder.refuseUnparsed(err, req),
    onClientError: (err, socket) => forwarder.refuseClientError(err, socket),
    onExpectation: (req, res) => forwarder.refuseExpectation(req, res),
    deferContinue: true,
    hostOptional: true, // the forwarder answers a request without Host with its own 400 and log line
    onServerError: proxyErrors,
    maxConnections: cfg.maxConnections,
    onDrop: dropped,
    onConnection: opened,
  }).catch(
    which(`proxy on ${at(cfg.host, cfg.port, '--host/--port, LLM_PROXY_HOST/_PORT, listen.host/.port')}`),
  );
  const finalScrape = new FinalScrape();
  const metrics = await listen(createMetricsApp(telemetry, { ready: () => !draining }, { finalScrape }), cfg.metrics.port, cfg.metrics.host, { keepAliveSeconds: cfg.timeouts.keepAlive, onServerError: metricsErrors }).catch(
    async (e: Error) => {
      await new Promise((r) => proxy.server.close(r)); // not left listening while main() reports the error
      return which(`metrics on ${at(cfg.metrics.host, cfg.metrics.port, '--metrics-host/--metrics-port, LLM_PROXY_METRICS_HOST/_PORT, metrics.host/.port')}`)(e);
    },
  );
  // A scraper that stops reading holds its paused exposition (a few MB at the series cap) for
  // as long as it stays connected: cut after timeouts.idle without progress, as a client that
  // stops reading a stream is.
  metrics.server.timeout = cfg.timeouts.idle * 1000;
  log.info(
    {
      proxyUrl: proxy.url,
      metricsUrl: metrics.url,
      version: VERSION,
      routes: cfg.routes.map((r) => {
        const u = new URL(r.upstream);
        // Through which egress proxy, if any (without its credentials): NO_PROXY's effect, visible at start.
        return { prefix: r.prefix, upstream: u.origin, provider: r.provider, via: upstreamOrigin(u, cfg.egress).via?.display };
      }),
      metricsEnabled: cfg.metrics.enabled,
      ...(cfg.maxConnections !== undefined ? { maxConnections: cfg.maxConnections } : {}),
    },
    'listening',
  );

  // Counts still waiting for their 10 s: their timers are unref'd, and the exit would drop them.
  const flushCounts = () => {
    for (const t of [dropLog, proxyErrors, metricsErrors]) t?.flush();
    forwarder.flushCounts();
  };
  let closed = false;
  const closeAll = async () => {
    if (closed) return;
    closed = true;
    // A scrape under way gets a second to finish; a connection that sent nothing or half a
    // request is then cut: it would hold the exit (and the last OTLP push) until timeouts.idle.
    const cutScrapers = setTimeout(() => metrics.server.closeAllConnections(), 1000);
    await Promise.all([closeServer(proxy.server), closeServer(metrics.server)]);
    clearTimeout(cutScrapers);
    flushCounts();
    forwarder.close();
    drainAfterIo(); // the records of streams cut just now, before the last export
    instruments?.shutdown();
    await telemetry?.shutdown();
    if (otelLogger) diag.disable(); // the logger is process-wide: do not keep this proxy's after it
    await simulator?.close();
  };

  return {
    proxyUrl: proxy.url,
    metricsUrl: metrics.url,
    simulator,
    simulatorUrl,
    config: cfg,
    telemetry,
    forwarder,
    async shutdown(deadlineSeconds = cfg.drainTimeout) {
      if (draining) return;
      draining = true;
      const started = performance.now();
      log.info({ inFlight: forwarder.inFlight.size, deadlineSeconds }, 'draining');
      // New requests on open keep-alive connections get 503 and a close; answers still to
      // come say Connection: close.
      forwarder.draining = true;
      const stopped = closeServer(proxy.server); // stop accepting; idle keep-alive sockets close now
      const deadline = started + deadlineSeconds * 1000;
      while (forwarder.inFlight.size > 0 && performance.now() < deadline) {
        await sleep(50);
        proxy.server.closeIdleConnections(); // those whose answer has ended since
      }
      const left = [...forwarder.inFlight];
      // Requests queued behind a cut answer on their connection were never sent: not counted as cut.
      const unsent = left.filter((f) => f.queued === true).length;
      // Open WebSocket tunnels are told "going away" where they can be (each one's own line says):
      // not counted as cut. An upgrade not answered yet is cut as a request is.
      const tunnels = left.filter((f) => f instanceof Tunnel && f.isOpen).length;
      const cut = left.length - unsent - tunnels;
      for (const f of left) f.abort(ERROR_TYPE.shutdownDeadline);
      proxy.server.closeAllConnections();
      await stopped;
      const dropped = droppedLogLines(); // a log reader that did not keep up (log.ts)
      const drainLog = {
        cut,
        ...(unsent > 0 ? { unsent } : {}),
        ...(tunnels > 0 ? { tunnels } : {}),
        ...(dropped > 0 ? { logLinesDropped: dropped } : {}),
        ms: Math.round(performance.now() - started),
      };
      if (cut + unsent > 0) log.warn(drainLog, 'drain deadline reached: cut streams');
      else if (tunnels > 0) log.warn(drainLog, 'drain deadline reached: closed tunnels');
      else log.info(drainLog, 'drained');
      const wait = cfg.metrics.finalScrapeWait;
      if (wait > 0 && telemetry?.scrape !== undefined && !closed) {
        // The records of streams cut just now, and of WebSocket sessions whose last messages were
        // still in zlib (at most 200 ms), before the scrape that is to show them.
        drainAfterIo();
        for (let i = 0; i < 20 && sessionsClosing() > 0; i++) await sleep(25);
        const since = performance.now();
        log.info({ waitSeconds: wait, metricsUrl: metrics.url }, 'waiting for a final scrape');
        const by = await finalScrape.wait(since, wait * 1000);
        if (by !== undefined) log.info({ ms: Math.round(performance.now() - since), client: by.address, userAgent: by.userAgent }, 'final scrape served');
        else if (!closed) log.warn({ waitSeconds: wait }, 'no scrape within the final scrape wait (metrics.finalScrapeWait): the records since the last scrape are not in Prometheus');
      }
      await closeAll();
    },
    beforeForcedExit() {
      // Each step on its own (and each tunnel, in endTunnelsNow): after a crash, the one that
      // fails must not cost the others.
      try {
        flushCounts();
      } catch {
        /* the exit goes on */
      }
      forwarder.endTunnelsNow(ERROR_TYPE.shutdownDeadline);
    },
    async close() {
      finalScrape.cancel();
      draining = true;
      forwarder.draining = true;
      forwarder.cutTunnels(ERROR_TYPE.shutdownDeadline);
      proxy.server.closeAllConnections();
      await closeAll();
    },
  };
}

function closeServer(server: Server): Promise<void> {
  return new Promise((resolve) => {
    if (!server.listening) return resolve();
    server.close(() => resolve());
    server.closeIdleConnections();
  });
}

/**
 * OpenTelemetry's diag messages as log lines. Export failures come through its global error
 * handler as a JSON string of the error (with its stack): the line keeps only the message.
 */
function diagToLog(log: Logger): DiagLogger {
  const warn = (message: string) => {
    let text = message;
    try {
      const parsed = JSON.parse(message) as { message?: unknown };
      if (typeof parsed?.message === 'string') text = parsed.message;
    } catch {
      /* a plain message */
    }
    log.warn(`OpenTelemetry: ${text}`);
  };
  const quiet = () => {};
  return { error: warn, warn, info: quiet, debug: quiet, verbose: quiet };
}
