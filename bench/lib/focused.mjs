// What the focused benchmarks (bench/ws.mjs, bench/tls.mjs) share: their options, the shared
// clock and the wait for a scheduled time, and killing the paths on any exit.
import { killAllSync } from './paths.mjs';
import { shared } from './clock.mjs';

/** `--name=value` from the command line, or `dflt`. */
export const arg = (name, dflt) => process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? dflt;

/** `--scenarios=20x100,1.4x100`: Δ ms × concurrency, with 150 items at Δ ≥ 10 ms, else 700. */
export function scenarios(dflt) {
  return arg('scenarios', dflt)
    .split(',')
    .map((s) => {
      const [delta, n] = s.split('x').map(Number);
      return { delta, n, count: delta >= 10 ? 150 : 700 };
    });
}

/** The clock the emitter and the client share (CLOCK_MONOTONIC ms). */
export { shared };
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Resolves at `due` (shared-clock ms): a timer to within 1.5 ms of it, then one loop turn at a time. */
export async function until(due) {
  for (;;) {
    const now = shared();
    if (now >= due) return;
    if (due - now > 1.5) await sleep(due - now - 1);
    else await new Promise((r) => setImmediate(r));
  }
}

/** The paths die with this process, whatever ends it. */
export function killPathsOnExit() {
  process.on('exit', killAllSync);
  for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(130));
}
