import { describe, expect, it } from 'vitest';
import { StreamClock } from '../../src/timing/stream-clock.js';

describe('StreamClock (fake clock)', () => {
  it('computes TTFT, gaps and TPOT from explicit times', () => {
    const c = new StreamClock(1000);
    expect(c.content(1200)).toBe(-1);
    expect(c.ttftMs).toBe(200);
    expect(c.content(1205)).toBe(5);
    expect(c.content(1215)).toBe(10);
    // 3 content events, provider says 5 tokens: (1215-1200)/(5-1)
    expect(c.tpotMs(5)).toBe(3.75);
    expect(c.tpotMs(3)).toBe(7.5);
    expect(c.durationMs(1300)).toBe(300);
  });

  it('has no TPOT for fewer than 2 tokens or a single event', () => {
    const c = new StreamClock(0);
    expect(c.tpotMs(10)).toBeUndefined();
    c.content(10);
    expect(c.tpotMs(10)).toBeUndefined();
    c.content(20);
    expect(c.tpotMs(1)).toBeUndefined();
    expect(c.tpotMs(2)).toBe(10);
  });

  it('keeps the longest gap, none before the second content event', () => {
    const c = new StreamClock(0);
    expect(c.maxGapMs).toBeUndefined();
    c.content(100);
    expect(c.maxGapMs).toBeUndefined();
    c.content(105);
    expect(c.maxGapMs).toBe(5);
    c.content(3105); // a 3 s stall, past the gap histogram's last bucket (2.5 s)
    c.content(3106);
    expect(c.maxGapMs).toBe(3000);
    c.content(3106); // same read: a gap of 0
    expect(c.maxGapMs).toBe(3000);
    // A stream that ends badly counts the gap still open at its end, when it is the longest.
    expect(c.maxGapOpenMs(3200)).toBe(3000);
    expect(c.maxGapOpenMs(7106)).toBe(4000);
    expect(new StreamClock(0).maxGapOpenMs(10)).toBeUndefined();
    const one = new StreamClock(0);
    one.content(5);
    expect(one.maxGapOpenMs(2005)).toBe(2000);
  });

  it('has no TTFT before the first content event', () => {
    expect(new StreamClock(5).ttftMs).toBeUndefined();
  });
});
