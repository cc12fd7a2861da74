// The clock every bench process shares: CLOCK_MONOTONIC in ms, one clock for every process on
// the machine. Until 2026-12-04 each process built it as performance.timeOrigin + now(), and
// timeOrigin is a wall-clock reading taken at start: a step of the wall clock between two
// starts, or a preemption between Node's two start-up reads (hrtime, then the wall clock),
// offsets one process against the other for its whole life. Once, in a run of the test suite
// on a loaded machine, the response leg (the emitter's stamp before its write → the client's
// read) came out at -1.35 ms p50: such an offset is the likely cause, but it was not
// reproduced and its source was not found.
import { performance } from 'node:perf_hooks';

/**
 * What turns performance.now() into CLOCK_MONOTONIC ms. performance.now() is that clock less
 * the process's start, so the difference is constant; a preemption between the two reads only
 * makes one sample larger, and the smallest is kept.
 */
export const origin = (() => {
  let best = Infinity;
  for (let i = 0; i < 8; i++) {
    const now = performance.now();
    best = Math.min(best, Number(process.hrtime.bigint()) / 1e6 - now);
  }
  return best;
})();

/** Now on the shared clock (ms). */
export const shared = () => origin + performance.now();
