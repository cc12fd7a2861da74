/** Keeps the event loop busy for `ms` of wall time: a stalled loop, as a long synchronous task makes one. */
export function blockFor(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    // a stalled event loop
  }
}
