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
