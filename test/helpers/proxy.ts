import { buildConfig, type FileConfig } from '../../src/config.js';
import { createLogger } from '../../src/log.js';
import { setTimeout as sleep } from 'node:timers/promises';
import { startProxy, type RunningProxy } from '../../src/main.js';
import { scrape, total } from './prom.js';

/** Starts the proxy in-process on free ports. */
export async function startTestProxy(upstream: string | undefined, file: FileConfig = {}, extra: { metricsEnabled?: boolean; logLevel?: string; logLines?: Record<string, unknown>[] } = {}): Promise<RunningProxy> {
  const config = buildConfig(file, {
    ...(upstream !== undefined ? { upstream } : {}),
    port: 0,
    metricsPort: 0,
    logLevel: extra.logLevel ?? 'silent',
    ...(extra.metricsEnabled !== undefined ? { metricsEnabled: extra.metricsEnabled } : {}),
  });
  const lines = extra.logLines;
  return startProxy(config, lines ? createLogger(config.logLevel, { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) }) : createLogger(config.logLevel));
}

/**
 * Once clients are gone: the requests still active (the streams gauge) and still in flight in the
 * forwarder (tunnels and unmeasured requests too), after waiting up to 5 s for each to reach 0.
 */
export async function settledLoad(proxy: RunningProxy): Promise<{ active: number; inFlight: number }> {
  let active = -1;
  for (let i = 0; i < 100 && active !== 0; i++) {
    active = total(await scrape(proxy.metricsUrl), 'llm_proxy_streams_active');
    if (active !== 0) await sleep(50);
  }
  for (let i = 0; i < 100 && proxy.forwarder.inFlight.size > 0; i++) await sleep(50);
  return { active, inFlight: proxy.forwarder.inFlight.size };
}
