/**
 * Per-request bookkeeping (the instrument calls of a request's start and end,
 * the request log line) queued while this loop iteration's I/O callbacks run,
 * and done in one `setImmediate` after them. When a batch of streams all
 * receive an event in the same tick, or all end in it, the last stream's bytes
 * are then forwarded before, not after, everybody's bookkeeping.
 */
const queue: (() => void)[] = [];
let scheduled = false;

function drain(): void {
  scheduled = false;
  drainAfterIo();
}

/** Runs `fn` after the current loop iteration's I/O callbacks, in call order. */
export function afterIo(fn: () => void): void {
  queue.push(fn);
  if (!scheduled) {
    scheduled = true;
    setImmediate(drain);
  }
}

let draining = false;
let failures = 0;

/** Deferred jobs that threw since start (tests, diagnostics). */
export function afterIoFailures(): number {
  return failures;
}

/** Runs everything queued now (shutdown: before the last metric export). */
export function drainAfterIo(): void {
  if (draining) return; // called from a queued job: the running pass goes on
  draining = true;
  try {
    // Work queued while draining runs in the same pass.
    for (let i = 0; i < queue.length; i++) {
      try {
        queue[i]!();
      } catch (e) {
        // Measurement and logging only: a failure must not stop the rest, but
        // must not go unnoticed either (once per process, on stderr).
        failures++;
        if (failures === 1) warn(e);
      }
    }
    queue.length = 0;
  } finally {
    draining = false;
  }
}

function warn(e: unknown): void {
  let what = 'unknown error';
  try {
    what = e instanceof Error ? e.message : String(e);
  } catch {
    /* an object String() cannot convert */
  }
  process.emitWarning(`a deferred measurement or log job failed: ${what}`, 'LlmLatencyProxyWarning');
}
