// Smallest pieces of `npm run bench -- --quick`: the ground-truth emitter, the
// load client's incremental parser and byte check, against the direct path and
// nginx. Asserts that the harness itself loses, merges or alters nothing.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

interface Integrity {
  runs: number;
  events: number;
  lost: number;
  merged: number;
  mismatched: number;
  failedRuns: number;
}

describe('bench harness smoke', () => {
  it('emitter -> client over direct (and nginx) delivers every event once, in order, byte-identical', () => {
    const out = mkdtempSync(join(tmpdir(), 'bench-smoke-'));
    try {
      const paths = existsSync('/usr/sbin/nginx') ? 'direct,nginx' : 'direct';
      const r = spawnSync(
        process.execPath,
        ['bench/run.mjs', '--quick', `--paths=${paths}`, '--phases=ttft,gap', '--reps=1', `--out=${out}`],
        { encoding: 'utf8', timeout: 60_000 },
      );
      expect(r.status, r.stderr.slice(-2000)).toBe(0);
      const res = JSON.parse(readFileSync(join(out, 'latest.json'), 'utf8')) as {
        meta: { paths: Record<string, { ok: boolean; error?: string }> };
        figures: { integrity: Record<string, Integrity> };
        failures: string[];
      };
      expect(res.failures).toEqual([]);
      for (const p of paths.split(',')) {
        expect(res.meta.paths[p]?.ok, res.meta.paths[p]?.error).toBe(true);
        const i = res.figures.integrity[p]!;
        expect(i.runs).toBeGreaterThan(0);
        expect(i.events).toBeGreaterThan(1000);
        expect([i.lost, i.merged, i.mismatched, i.failedRuns]).toEqual([0, 0, 0, 0]);
      }
      expect(existsSync(join(out, 'latest.md'))).toBe(true);
      expect(readFileSync(join(out, 'added-gap.svg'), 'utf8')).toContain('<svg');
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  }, 90_000);
});
