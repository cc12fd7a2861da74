import { pino, type Logger } from 'pino';

export type { Logger };

/** Header values that must never reach a log line. */
export const SECRET_HEADERS = [
  'authorization',
  'proxy-authorization',
  'x-api-key',
  'api-key',
  'x-goog-api-key',
  'cookie',
  'set-cookie',
];

/** JSON lines on stdout (pino), with secrets redacted should anything log headers. */
export function createLogger(level: string, destination?: pino.DestinationStream): Logger {
  const opts: pino.LoggerOptions = {
    level,
    base: { service: 'llm-latency-proxy' },
    timestamp: pino.stdTimeFunctions.isoTime,
    redact: {
      paths: SECRET_HEADERS.flatMap((h) => [`headers["${h}"]`, `req.headers["${h}"]`, `res.headers["${h}"]`]),
      censor: '[redacted]',
    },
  };
  return destination ? pino(opts, destination) : pino(opts);
}

let exiting = false;

/**
 * Exits once the log stream has written what it holds, or after `graceMs`. Exiting with a
 * write still in flight makes pino flush synchronously at exit, and sonic-boom retries a
 * synchronous write that failed with EPIPE (a log reader that went away: `| head`, a crashed
 * shipper) every 100 ms forever: the process never ended on SIGTERM. Ending the stream first
 * lets that EPIPE arrive asynchronously, where pino drops the rest of the logging.
 */
export function exitAfterLogs(log: Logger, code: number, graceMs = 2000): void {
  // A second call (SIGINT then SIGTERM) must not end the stream again: sonic-boom throws then.
  if (exiting) return;
  exiting = true;
  const exit = (): void => {
    process.exit(code);
  };
  const stream = (log as unknown as Record<symbol, unknown>)[pino.symbols.streamSym] as
    | { end?: () => void; once?: (event: string, fn: () => void) => void }
    | undefined;
  if (typeof stream?.end !== 'function' || typeof stream.once !== 'function') {
    exit();
    return;
  }
  setTimeout(exit, graceMs);
  stream.once('close', exit);
  stream.once('error', exit);
  try {
    stream.end();
  } catch {
    exit(); // already destroyed
  }
}
