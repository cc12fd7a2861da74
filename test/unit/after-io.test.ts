import { describe, expect, it } from 'vitest';
import { afterIo, afterIoFailures } from '../../src/measure/after-io.js';

// Its own file: the once-per-process warning must be reached by this module's first failure.
describe('afterIo', () => {
  it('survives a first failure whose thrown value cannot be turned into text, and runs every job once', async () => {
    const ran: number[] = [];
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.message);
    process.on('warning', onWarning);
    afterIo(() => ran.push(1));
    afterIo(() => {
      throw Object.create(null);
    });
    afterIo(() => ran.push(3));
    await new Promise((r) => setImmediate(r));
    afterIo(() => ran.push(4));
    await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
    process.off('warning', onWarning);
    expect(ran).toEqual([1, 3, 4]);
    expect(afterIoFailures()).toBe(1);
    expect(warnings).toEqual(['a deferred measurement or log job failed: unknown error']);
  });
});
