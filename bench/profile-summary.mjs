#!/usr/bin/env node
// Summarises a V8 .cpuprofile (from node --cpu-prof): top functions by self
// time and self time per file.   usage: node bench/profile-summary.mjs FILE [N]
import fs from 'node:fs';

const [file, nArg] = process.argv.slice(2);
const N = Number(nArg || 25);
const prof = JSON.parse(fs.readFileSync(file, 'utf8'));
const byId = new Map(prof.nodes.map((n) => [n.id, n]));
const self = new Map();
const dt = prof.timeDeltas;
for (let i = 0; i < prof.samples.length; i++) {
  const id = prof.samples[i];
  self.set(id, (self.get(id) || 0) + (dt[i] || 0));
}
const total = [...self.values()].reduce((a, b) => a + b, 0);
const fn = new Map();
const files = new Map();
for (const [id, us] of self) {
  const n = byId.get(id);
  const cf = n.callFrame;
  const short = (cf.url || '').replace(/^file:\/\//, '').replace(/.*\/node_modules\//, 'node_modules/').replace(/.*\/dist\//, 'dist/');
  const key = `${cf.functionName || '(anonymous)'} ${short}${cf.url ? `:${cf.lineNumber + 1}` : ''}`;
  fn.set(key, (fn.get(key) || 0) + us);
  const fkey = short || cf.functionName;
  files.set(fkey, (files.get(fkey) || 0) + us);
}
const pct = (us) => ((100 * us) / total).toFixed(1).padStart(5) + '%';
console.log(`${file}: ${(total / 1e6).toFixed(2)} s sampled`);
console.log('\nTop functions by self time:');
for (const [k, us] of [...fn].sort((a, b) => b[1] - a[1]).slice(0, N)) console.log(`${pct(us)}  ${k}`);
console.log('\nSelf time by file:');
for (const [k, us] of [...files].sort((a, b) => b[1] - a[1]).slice(0, 15)) console.log(`${pct(us)}  ${k}`);
