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
// percentages are of busy (non-idle) time
const idleIds = new Set(prof.nodes.filter((n) => n.callFrame.functionName === '(idle)').map((n) => n.id));
const total = [...self].reduce((a, [id, us]) => a + (idleIds.has(id) ? 0 : us), 0);
const parent = new Map();
for (const n of prof.nodes) for (const c of n.children || []) parent.set(c, n.id);
const fn = new Map();
const files = new Map();
const keyOf = (n) => {
  const cf = n.callFrame;
  const short = (cf.url || '').replace(/^file:\/\//, '').replace(/.*\/node_modules\//, 'node_modules/').replace(/.*\/dist\//, 'dist/');
  return `${cf.functionName || '(anonymous)'} ${short}${cf.url ? `:${cf.lineNumber + 1}` : ''}`;
};
const incl = new Map();
for (const [id, us] of self) {
  if (idleIds.has(id)) continue;
  const seen = new Set();
  for (let cur = id; cur !== undefined; cur = parent.get(cur)) {
    const k = keyOf(byId.get(cur));
    if (seen.has(k)) continue;
    seen.add(k);
    incl.set(k, (incl.get(k) || 0) + us);
  }
}
for (const [id, us] of self) {
  if (idleIds.has(id)) continue;
  const n = byId.get(id);
  const cf = n.callFrame;
  const short = (cf.url || '').replace(/^file:\/\//, '').replace(/.*\/node_modules\//, 'node_modules/').replace(/.*\/dist\//, 'dist/');
  const key = `${cf.functionName || '(anonymous)'} ${short}${cf.url ? `:${cf.lineNumber + 1}` : ''}`;
  fn.set(key, (fn.get(key) || 0) + us);
  const fkey = short || cf.functionName;
  files.set(fkey, (files.get(fkey) || 0) + us);
}
const pct = (us) => ((100 * us) / total).toFixed(1).padStart(5) + '%';
console.log(`${file}: ${(total / 1e6).toFixed(2)} s busy (idle excluded)`);
console.log('\nTop functions by self time:');
for (const [k, us] of [...fn].sort((a, b) => b[1] - a[1]).slice(0, N)) console.log(`${pct(us)}  ${k}`);
console.log('\nSelf time by file:');
for (const [k, us] of [...files].sort((a, b) => b[1] - a[1]).slice(0, 15)) console.log(`${pct(us)}  ${k}`);
console.log('\nInclusive time (busy), project and dependency frames:');
for (const [k, us] of [...incl].filter(([k]) => /dist\/|node_modules\//.test(k)).sort((a, b) => b[1] - a[1]).slice(0, N)) console.log(`${pct(us)}  ${k}`);
