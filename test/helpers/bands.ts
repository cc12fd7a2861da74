import { expect } from 'vitest';

/**
 * A loaded 2-core machine can hold one timer or read back by a few hundred ms: such a stall
 * moves a mean over `over` intervals by STALL_S / over. The precision of the figures is
 * checked on fake clocks in the unit tests.
 */
export const STALL_S = 0.2;

/**
 * `actual` within `rel` of `expected`, plus one stall's effect on a mean over `over` timed
 * intervals (none for values reported in-band, which no stall moves).
 */
export function within(actual: number, expected: number, opts: { over?: number; rel?: number; what?: string } = {}): void {
  const { over = Infinity, rel = 0.1, what = '' } = opts;
  const tol = expected * rel + STALL_S / over;
  const msg = `${what ? `${what}: ` : ''}${actual} vs ${expected} ± ${tol}`;
  expect(actual, msg).toBeGreaterThanOrEqual(expected - tol);
  expect(actual, msg).toBeLessThanOrEqual(expected + tol);
}
