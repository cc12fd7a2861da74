#!/usr/bin/env node
// Micro-benchmark of reading client WebSocket frames (masked, RFC 6455 §5.3) in the tunnel's
// MessageReader: µs per message of 190 B (a text event), 6.4 KB (100 ms of 24 kHz PCM16 audio
// as base64) and 64 KiB, one message per read. No sockets and no session: the unmasking and
// the copy into the message buffer. `--ab=/other/dist` runs another build's reader in the same
// process, alternately, 5 rounds each (runs minutes apart differ by more than builds do).
// Run after `npm run build`:  node bench/micro/ws-unmask.mjs [--ab=/other/checkout/dist]
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';

const HERE = path.dirname(new URL(import.meta.url).pathname);
const abArg = process.argv.find((a) => a.startsWith('--ab='));
const builds = [['this', path.resolve(HERE, '../../dist')]];
if (abArg !== undefined) builds.push(['other', path.resolve(abArg.slice(5))]);
const readers = await Promise.all(builds.map(async ([name, dist]) => [name, (await import(pathToFileURL(path.join(dist, 'ws/messages.js')).href)).MessageReader]));

/** A masked binary frame, as a client sends it. */
function clientFrame(payload, mask) {
  const n = payload.length;
  const len = n < 126 ? [0x80 | n] : n < 65536 ? [0x80 | 126, n >> 8, n & 0xff] : [0x80 | 127, 0, 0, 0, 0, n >>> 24, (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff];
  const out = Buffer.concat([Buffer.from([0x82, ...len]), mask, payload]);
  const body = out.subarray(out.length - n);
  for (let i = 0; i < n; i++) body[i] ^= mask[i & 3];
  return out;
}

const mask = Buffer.from([0x3c, 0xa1, 0x5e, 0x07]);
const sizes = [190, 6400, 65536];
const frames = new Map(sizes.map((n) => [n, clientFrame(Buffer.alloc(n, 0).map((_, i) => 32 + ((i * 7) % 90)), mask)]));
const results = new Map();
for (let round = 0; round < 5; round++) {
  for (const [name, MessageReader] of readers) {
    for (const n of sizes) {
      const frame = frames.get(n);
      let got = 0;
      const r = new MessageReader(() => got++, { maxMessageBytes: 1 << 20, deflate: false, requireMask: true });
      const count = Math.max(200, Math.floor(4e7 / n));
      for (let i = 0; i < 50; i++) r.push(frame, 0); // warm-up
      const t = performance.now();
      for (let i = 0; i < count; i++) r.push(frame, 0);
      const us = ((performance.now() - t) * 1000) / count;
      if (got !== count + 50) throw new Error(`${name}: ${got} messages of ${count + 50}`);
      const key = `${name} ${n}`;
      results.set(key, [...(results.get(key) ?? []), us]);
    }
  }
}
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
for (const n of sizes) {
  const row = readers.map(([name]) => {
    const a = results.get(`${name} ${n}`);
    return `${name} ${med(a).toFixed(2)} µs [${Math.min(...a).toFixed(2)}–${Math.max(...a).toFixed(2)}]`;
  });
  console.log(`${String(n).padStart(6)} B per message: ${row.join(' | ')}`);
}
