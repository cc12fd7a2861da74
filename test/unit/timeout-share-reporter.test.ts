import { describe, expect, it } from 'vitest';
import { closeToTimeout, renderCloseToTimeout, type Timed } from '../helpers/timeout-share-reporter.js';

describe('the timeout-share reporter', () => {
  const tests: Timed[] = [
    { name: 'fast', durationMs: 100, timeoutMs: 60_000 },
    { name: 'half', durationMs: 30_000, timeoutMs: 60_000 },
    { name: 'edge', durationMs: 24_000, timeoutMs: 60_000 }, // exactly 40 %
    { name: 'just under', durationMs: 23_999, timeoutMs: 60_000 },
    { name: 'long but far', durationMs: 90_000, timeoutMs: 600_000 },
    { name: 'timed out', durationMs: 60_004, timeoutMs: 60_000 },
    { name: 'no timeout', durationMs: 5_000, timeoutMs: 0 },
  ];

  it('keeps the tests at or over the share of their own timeout, the closest first', () => {
    expect(closeToTimeout(tests, 0.4).map((t) => t.name)).toEqual(['timed out', 'half', 'edge']);
    expect(closeToTimeout(tests, 0.1).map((t) => t.name)).toEqual(['timed out', 'half', 'edge', 'just under', 'long but far']);
    expect(closeToTimeout(tests, 2)).toEqual([]);
  });

  it('prints nothing when none is close, and each close one with its share, time and timeout', () => {
    expect(renderCloseToTimeout([], 0.4)).toBe('');
    const text = renderCloseToTimeout(closeToTimeout(tests, 0.4), 0.4);
    expect(text.split('\n').filter(Boolean)).toEqual([
      ' Tests that took 40% or more of their timeout (a loaded machine may push them over):',
      '  100%  60.0 s of 60 s  timed out',
      '  50%  30.0 s of 60 s  half',
      '  40%  24.0 s of 60 s  edge',
    ]);
  });
});
