// Preloaded into Node paths (`node --expose-gc --import bench/lib/probe.mjs ...`)
// when the benchmark needs their memory: on an IPC request it forces a GC and
// replies with process.memoryUsage() and the young generation's physical size
// (and writes a heap snapshot when BENCH_HEAP_SNAPSHOT_DIR is set). Idle
// otherwise; it changes nothing in the process it is loaded into.
import v8 from 'node:v8';

if (process.send) {
  process.channel?.unref?.();
  process.on('message', (m) => {
    if (!m || m.probe !== 'mem') return;
    if (typeof globalThis.gc === 'function') {
      globalThis.gc();
      globalThis.gc();
    }
    const mu = process.memoryUsage();
    // Young generation committed: V8 grows it while a ramp's objects survive
    // scavenges, a one-off that shows in RSS but is not held per stream.
    const spaces = v8.getHeapSpaceStatistics();
    const young = spaces
      .filter((s) => s.space_name === 'new_space' || s.space_name === 'new_large_object_space')
      .reduce((a, s) => a + s.physical_space_size, 0);
    if (process.env.BENCH_HEAP_SNAPSHOT_DIR) v8.writeHeapSnapshot(`${process.env.BENCH_HEAP_SNAPSHOT_DIR}/${process.pid}-${m.id}.heapsnapshot`);
    process.send({ probe: 'mem', id: m.id, gc: typeof globalThis.gc === 'function', youngPhysical: young, ...mu });
  });
  process.on('disconnect', () => process.exit(0));
}
