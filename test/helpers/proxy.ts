import { buildConfig, type FileConfig } from '../../src/config.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type RunningProxy } from '../../src/main.js';

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
