import { MAX_TIMER_SECONDS } from '../config-values.js';
import { performance } from 'node:perf_hooks';

/** A generation plan, in seconds. */
export interface Plan {
  ttft: number;
  itl: number;
  tokens: number;
  /** Each token's time moves by up to ±jitter/2 of one ITL (so order is kept). */
  jitter: number;
}

export const PLAN_KEYS = ['ttft', 'itl', 'tokens', 'jitter'] as const;
export const MAX_TOKENS = 1_000_000;

/** What is wrong with one value of a plan, if anything: the key's whole range (review 119: a negative count read "expected a non-negative number", though 0 is refused too). */
export function planValueError(key: (typeof PLAN_KEYS)[number], v: number): string | undefined {
  if (key === 'tokens') return Number.isInteger(v) && v >= 1 && v <= MAX_TOKENS ? undefined : `expected an integer from 1 to ${MAX_TOKENS}`;
  if (key === 'jitter') return v >= 0 && v <= 1 ? undefined : 'expected a number from 0 to 1 (a fraction of one ITL, which keeps the tokens in order)';
  return v >= 0 && v <= MAX_TIMER_SECONDS ? undefined : `expected a number of seconds from 0 to ${MAX_TIMER_SECONDS}`;
}

/** A delay longer than Node's longest timer fires after 1 ms, again and again. */
export function scheduleError(p: Plan): string | undefined {
  const last = p.ttft + p.tokens * p.itl * (1 + p.jitter);
  if (!(last > MAX_TIMER_SECONDS)) return undefined;
  const due = last < MAX_TIMER_SECONDS + 1 ? last.toFixed(3) : String(Math.floor(last));
  return `the last token could be due after ${due} s (ttft + tokens × itl × (1 + jitter)): at most ${MAX_TIMER_SECONDS} s`;
}

/** Deterministic PRNG (mulberry32) so a seeded run is reproducible. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Due time of every token, in ms after the request arrived: ttft + k·itl,
 * each moved by jitter. Times come from the plan, never from the previous
 * timer's firing, so lateness does not accumulate.
 */
export function tokenTimes(plan: Plan, random: () => number): number[] {
  const out = new Array<number>(plan.tokens);
  const ttft = plan.ttft * 1000;
  const itl = plan.itl * 1000;
  for (let k = 0; k < plan.tokens; k++) {
    const j = plan.jitter > 0 ? (random() - 0.5) * plan.jitter * itl : 0;
    out[k] = Math.max(0, ttft + k * itl + j);
  }
  return out;
}

/**
 * Calls `emit(k)` for every due time `t0 + times[k]` (ms, performance.now()
 * clock), in order; then `done()`. Every event that is due when a timer fires
 * is emitted, each with its own call. Returns a cancel function.
 */
export function runSchedule(times: readonly number[], t0: number, emit: (k: number) => void, done: () => void): () => void {
  let k = 0;
  let timer: NodeJS.Timeout | undefined;
  let cancelled = false;
  const tick = (): void => {
    timer = undefined;
    if (cancelled) return;
    const now = performance.now();
    while (k < times.length && t0 + times[k]! <= now) emit(k++);
    if (cancelled) return;
    if (k >= times.length) {
      done();
      return;
    }
    const delay = t0 + times[k]! - performance.now();
    timer = setTimeout(tick, Math.max(0, delay));
  };
  tick();
  return () => {
    cancelled = true;
    if (timer) clearTimeout(timer);
  };
}
