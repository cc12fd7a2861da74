import { execFileSync } from 'node:child_process';
import { closeSync, constants, openSync, readSync } from 'node:fs';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterEach, expect, it, vi } from 'vitest';
import { connectionDropLog, createLogger, droppedLogLines, exitAfterLogs, serverErrorLog, stdoutDestination } from '../../src/log.js';
import { tempDir } from '../helpers/temp-dir.js';

type SonicBoom = { _len: number; destroy(): void };

afterEach(() => {
  vi.useRealTimers(); // drops exitAfterLogs' fallback timer with the fake clock
  vi.restoreAllMocks();
});

it('exitAfterLogs exits once, without throwing, also when the log stream is already destroyed (SIGINT then SIGTERM)', () => {
  vi.useFakeTimers();
  const exit = vi.spyOn(process, 'exit').mockImplementation((() => undefined) as never);
  const dest = pino.destination({ dest: join(tempDir('llp-log-'), 'log'), sync: true });
  const log = createLogger('info', dest);
  log.info('a line');
  dest.destroy(); // sonic-boom now throws on end()
  expect(() => exitAfterLogs(log, 3)).not.toThrow();
  expect(exit).toHaveBeenCalledWith(3);
  exitAfterLogs(log, 4); // a second signal's stop: nothing more
  expect(exit).toHaveBeenCalledTimes(1);
  // The destroyed stream's close event comes later; the real process.exit must not meet it.
  dest.removeAllListeners('close');
  dest.removeAllListeners('error');
});

it('a log reader that does not read holds at most maxLength bytes; the rest is dropped and counted', async () => {
  // A FIFO opened read-write and never read: stdout's pipe behind a stalled log shipper.
  const fifo = join(tempDir('llp-log-'), 'fifo');
  execFileSync('mkfifo', [fifo]);
  const fd = openSync(fifo, constants.O_RDWR | constants.O_NONBLOCK);
  const maxLength = 256 * 1024;
  const dest = stdoutDestination(fd, maxLength) as unknown as SonicBoom;
  const log = createLogger('info', dest as never);
  const before = droppedLogLines();
  const line = 'x'.repeat(1000);
  for (let i = 0; i < 2000; i++) log.info({ i, line }, 'request'); // ~2 MB: the pipe takes 64 KiB
  await new Promise((r) => setTimeout(r, 50));
  expect(dest._len).toBeLessThanOrEqual(maxLength);
  expect(dest._len).toBeGreaterThan(maxLength / 2);
  expect(droppedLogLines() - before).toBeGreaterThan(1000);
  // Lines are taken again once the reader catches up: read the pipe empty.
  const sink = Buffer.alloc(1 << 20);
  for (let t = 0; t < 200 && dest._len > 0; t++) {
    try {
      readSync(fd, sink);
    } catch {
      /* EAGAIN: nothing to read now */
    }
    await new Promise((r) => setTimeout(r, 5));
  }
  expect(dest._len).toBe(0);
  const dropped = droppedLogLines();
  log.info('after');
  await new Promise((r) => setTimeout(r, 20));
  expect(droppedLogLines()).toBe(dropped);
  expect(readSync(fd, sink)).toBeGreaterThan(0);
  dest.destroy();
  closeSync(fd);
});

it('exitAfterLogs exits after its grace period when the reader never reads, with the rest of the log dropped', async () => {
  vi.resetModules(); // a fresh module: the test above has used its one exit
  const fresh = await import('../../src/log.js');
  vi.useFakeTimers();
  const exit = vi.spyOn(process, 'exit').mockImplementation((() => undefined) as never);
  const dest = pino.destination({ dest: join(tempDir('llp-log-'), 'log'), sync: true });
  const log = fresh.createLogger('info', dest);
  const end = vi.spyOn(dest, 'end').mockImplementation(() => undefined); // a full pipe: the end never comes
  fresh.exitAfterLogs(log, 0, 2000);
  expect(end).toHaveBeenCalledTimes(1);
  expect(exit).not.toHaveBeenCalled();
  vi.advanceTimersByTime(2000);
  expect(exit).toHaveBeenCalledWith(0);
  // The synchronous flush at exit, which sonic-boom retries every 100 ms while the pipe is full, is a no-op.
  expect(() => dest.flushSync()).not.toThrow();
  expect((dest as unknown as { muted?: boolean }).muted).toBe(true);
});

it('redacts every secret-bearing header, should anything ever log headers (the proxy does not)', () => {
  const out: string[] = [];
  const log = createLogger('info', { write: (s: string) => void out.push(s) } as unknown as pino.DestinationStream);
  const secrets = {
    authorization: 'Bearer sk-1',
    'x-api-key': 'sk-ant-2',
    'x-goog-api-key': 'AIza3',
    'x-amz-security-token': 'IQoJ4',
    'ocp-apim-subscription-key': 'apim5',
    'sec-websocket-protocol': 'realtime, openai-insecure-api-key.sk-6',
    cookie: 'session=7',
  };
  log.info({ headers: secrets, req: { headers: secrets }, res: { headers: { 'set-cookie': 'session=8' } } }, 'headers');
  const line = JSON.parse(out.join(''));
  expect(line.headers).toEqual(Object.fromEntries(Object.keys(secrets).map((k) => [k, '[redacted]'])));
  expect(line.req.headers).toEqual(line.headers);
  expect(line.res.headers).toEqual({ 'set-cookie': '[redacted]' });
});

/** A logger whose JSON lines land in `out`, and a `performance.now()` that reads `clock.now` (from 1 s). */
function throttleTest() {
  const out: Record<string, unknown>[] = [];
  const log = createLogger('info', { write: (s: string) => void out.push(JSON.parse(s)) } as unknown as pino.DestinationStream);
  const clock = { now: 1_000 };
  vi.spyOn(performance, 'now').mockImplementation(() => clock.now);
  return { out, log, clock };
}

it('serverErrorLog: one warn line per 10 s for a flood of listener errors, with the count it did not log', () => {
  const { out, log, clock } = throttleTest();
  const told = serverErrorLog(log, 'proxy');
  const emfile = Object.assign(new Error('accept EMFILE'), { code: 'EMFILE' });
  for (let i = 0; i < 500; i++) told(emfile);
  clock.now += 9_999;
  told(emfile);
  clock.now += 1;
  told(emfile);
  expect(out.map((l) => [l.level, l.msg, l.listener, l.code, l.notLogged])).toEqual([
    [40, 'listener error', 'proxy', 'EMFILE', undefined],
    [40, 'listener error', 'proxy', 'EMFILE', 500],
  ]);
});

it('connectionDropLog: the first drop at once, then one line per 10 s counting every drop since the last line', () => {
  vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
  const { out, log, clock } = throttleTest();
  const dropped = connectionDropLog(log, 64);
  dropped();
  for (let i = 0; i < 40; i++) dropped();
  clock.now = 11_000; // 10 s after the first line: a line of its own, for it and the 40 before it
  dropped();
  clock.now = 12_000;
  for (let i = 0; i < 3; i++) dropped();
  clock.now = 21_000; // the flood stopped: its count is written when its 10 s are up
  vi.advanceTimersByTime(10_000);
  expect(out.map((l) => [l.level, l.msg, l.listener, l.maxConnections, l.dropped])).toEqual([
    [40, 'connection limit reached: new connections closed', 'proxy', 64, 1],
    [40, 'connection limit reached: new connections closed', 'proxy', 64, 41],
    [40, 'connection limit reached: new connections closed', 'proxy', 64, 3],
  ]);
  // 45 drops, each counted once.
  expect(out.reduce((n, l) => n + (l.dropped as number), 0)).toBe(45);
});

it('serverErrorLog: the count of a flood that stops is written when its 10 s are up (review 141)', () => {
  vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
  const { out, log, clock } = throttleTest();
  const told = serverErrorLog(log, 'metrics');
  told(Object.assign(new Error('accept EMFILE'), { code: 'EMFILE' }));
  clock.now = 3_000;
  for (let i = 0; i < 7; i++) told(Object.assign(new Error('accept ENFILE'), { code: 'ENFILE' }));
  clock.now = 10_999;
  vi.advanceTimersByTime(7_999);
  expect(out).toHaveLength(1);
  clock.now = 11_000;
  vi.advanceTimersByTime(1);
  expect(out.map((l) => [l.listener, l.code, l.notLogged])).toEqual([
    ['metrics', 'EMFILE', undefined],
    ['metrics', 'ENFILE', 7],
  ]);
});

it('throttled logs: flush() writes the count still waiting for its 10 s, once, and nothing when none waits', () => {
  vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
  const { out, log, clock } = throttleTest();
  const dropped = connectionDropLog(log, 64);
  const errors = serverErrorLog(log, 'proxy');
  dropped(); // at once
  clock.now = 2_000;
  for (let i = 0; i < 5; i++) dropped();
  errors.flush(); // none waiting: no line
  dropped.flush();
  dropped.flush();
  vi.advanceTimersByTime(20_000); // its timer was cleared: no second copy
  expect(out.map((l) => [l.msg, l.dropped])).toEqual([
    ['connection limit reached: new connections closed', 1],
    ['connection limit reached: new connections closed', 5],
  ]);
});
