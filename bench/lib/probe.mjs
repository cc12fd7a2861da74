// Preloaded into Node paths (`node --expose-gc --import bench/lib/probe.mjs ...`)
// when the benchmark needs their memory: on an IPC request it forces a GC and
// replies with process.memoryUsage(). Idle otherwise; it changes nothing in the
// process it is loaded into.
if (process.send) {
  process.channel?.unref?.();
  process.on('message', (m) => {
    if (!m || m.probe !== 'mem') return;
    if (typeof globalThis.gc === 'function') {
      globalThis.gc();
      globalThis.gc();
    }
    const mu = process.memoryUsage();
    process.send({ probe: 'mem', id: m.id, gc: typeof globalThis.gc === 'function', ...mu });
  });
  process.on('disconnect', () => process.exit(0));
}
