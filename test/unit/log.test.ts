import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterEach, expect, it, vi } from 'vitest';
import { createLogger, exitAfterLogs } from '../../src/log.js';

afterEach(() => {
  vi.useRealTimers(); // drops exitAfterLogs' fallback timer with the fake clock
  vi.restoreAllMocks();
});

it('exitAfterLogs exits once, without throwing, also when the log stream is already destroyed (SIGINT then SIGTERM)', () => {
  vi.useFakeTimers();
  const exit = vi.spyOn(process, 'exit').mockImplementation((() => undefined) as never);
  const dest = pino.destination({ dest: join(mkdtempSync(join(tmpdir(), 'llp-log-')), 'log'), sync: true });
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
