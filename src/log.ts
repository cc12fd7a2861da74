import { pino, type Logger } from 'pino';

export type { Logger };

/** Header values that must never reach a log line. */
export const SECRET_HEADERS = [
  'authorization',
  'proxy-authorization',
  'x-api-key',
  'api-key',
  'x-goog-api-key',
  'x-amz-security-token',
  'ocp-apim-subscription-key',
  // Browsers' Realtime sessions send their key in it (`openai-insecure-api-key.<key>`).
  'sec-websocket-protocol',
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
  return destination ? pino(opts, destination) : pino(opts, stdoutDestination());
}

type Neutered = { write: () => void; end: () => void; flushSync: () => void; destroy: () => void; muted?: boolean };

/**
 * Log bytes held for a reader that is there but does not read (a stalled log shipper, a blocked
 * log driver: stdout's pipe is full) before new lines are dropped. Without a bound every line
 * stayed in memory (review H: +94 MB over 60,000 requests).
 */
export const LOG_BUFFER_BYTES = 8 * 1024 * 1024;

/**
 * stdout, as pino's default (asynchronous sonic-boom), but a write error of any kind stops the
 * logging: pino gives up only on EPIPE, and sonic-boom's exit flush retries any other error
 * every 100 ms forever, so a terminal that hung up (EIO) held the process after its drain.
 * Past `maxLength` unwritten bytes, lines are dropped (counted in `droppedLogLines`).
 */
export function stdoutDestination(fd: number = process.stdout.fd ?? 1, maxLength = LOG_BUFFER_BYTES): pino.DestinationStream {
  const stream = pino.destination({ dest: fd, sync: false, maxLength });
  stream.on('error', () => neuter(stream as unknown as Neutered));
  stream.on('drop', () => void droppedLines++);
  return stream;
}

let droppedLines = 0;
/** Log lines dropped because the reader of stdout did not keep up (see LOG_BUFFER_BYTES). */
export function droppedLogLines(): number {
  return droppedLines;
}

function neuter(stream: Neutered): void {
  const noop = (): void => {};
  stream.write = noop;
  stream.end = noop;
  stream.flushSync = noop;
  stream.destroy = noop;
  stream.muted = true;
}

/**
 * SIGHUP with stdout on a terminal: the terminal has gone away (a closed window or SSH session)
 * and a write to it fails with EIO, possibly in the synchronous exit flush that never gives up:
 * the logging stops before anything is written.
 */
export function muteIfTerminalGone(log: Logger): boolean {
  if (!process.stdout.isTTY) return false;
  const stream = (log as unknown as Record<symbol, unknown>)[pino.symbols.streamSym] as Neutered | undefined;
  if (stream !== undefined) neuter(stream);
  return true;
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
    | { end?: () => void; once?: (event: string, fn: () => void) => void; muted?: boolean }
    | undefined;
  if (typeof stream?.end !== 'function' || typeof stream.once !== 'function' || stream.muted) {
    exit();
    return;
  }
  // A reader that is there but does not read (a full pipe) never lets the stream end, and the
  // synchronous flush at exit would retry forever: past the grace period, what is left is dropped.
  setTimeout(() => {
    neuter(stream as unknown as Neutered);
    exit();
  }, graceMs);
  stream.once('close', exit);
  stream.once('error', exit);
  try {
    stream.end();
  } catch {
    exit(); // already destroyed
  }
}

/** A throttled logger; `flush()` writes the count still waiting for its 10 s (at shutdown). */
export interface Throttled<T> {
  (item: T): void;
  flush(): void;
}

/**
 * At most one call of `write` per 10 s for a flood of `T`s: at once for the first, then for the
 * first one 10 s after the last call, with the number that had no call of their own (`unlogged`);
 * the count of a flood that stops is written when its 10 s are up, or at `flush()` (`own` false:
 * a summary, with the latest one).
 */
function throttled<T>(write: (latest: T, unlogged: number, own: boolean) => void): Throttled<T> {
  let last = -Infinity;
  let unlogged = 0;
  let latest: T | undefined;
  let timer: NodeJS.Timeout | undefined;
  const emit = (item: T, own: boolean, now: number) => {
    write(item, unlogged, own);
    last = now;
    unlogged = 0;
  };
  const due = () => {
    timer = undefined;
    if (unlogged > 0) emit(latest!, false, performance.now());
  };
  const call = (item: T) => {
    const now = performance.now();
    if (now - last < 10_000) {
      unlogged++;
      latest = item;
      timer ??= setTimeout(due, last + 10_000 - now).unref();
      return;
    }
    clearTimeout(timer);
    timer = undefined;
    emit(item, true, now);
  };
  // The timer is unref'd: without this, a process that exits within the 10 s loses the count.
  return Object.assign(call, {
    flush: () => {
      if (timer === undefined) return;
      clearTimeout(timer);
      due();
    },
  });
}

/**
 * Logs a listener's error (an accept that failed), at most one line per 10 s with the count of
 * those not logged: a flood of them must not become a flood of log lines.
 */
export function serverErrorLog(log: Logger, listener: string): Throttled<Error> {
  return throttled((err: NodeJS.ErrnoException, unlogged) => {
    log.warn({ listener, err: err.message, code: err.code, ...(unlogged > 0 ? { notLogged: unlogged } : {}) }, 'listener error');
  });
}

/**
 * Logs the connections the proxy's port closed at `listen.maxConnections`, at most one line per
 * 10 s: `dropped`, how many since the previous line (this one's own included).
 */
export function connectionDropLog(log: Logger, maxConnections: number): Throttled<void> {
  return throttled((_: void, unlogged, own) => {
    log.warn({ listener: 'proxy', maxConnections, dropped: unlogged + (own ? 1 : 0) }, 'connection limit reached: new connections closed');
  });
}

/**
 * Logs the events read no further than their edges because all requests together held
 * `limits.maxBufferedBytes` (sse/byte-budget.ts), at most one line per 10 s: `refused`, how many
 * buffers could not grow since the previous line (this one's own included): one per such event,
 * more for an SSE event of several long lines.
 */
export function bufferLimitLog(log: Logger, maxBufferedBytes: number): Throttled<void> {
  return throttled((_: void, unlogged, own) => {
    log.warn({ maxBufferedBytes, refused: unlogged + (own ? 1 : 0) }, 'buffer limit reached (limits.maxBufferedBytes): large events or bodies forwarded without being read whole');
  });
}
