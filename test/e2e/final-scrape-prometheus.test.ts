// The final scrape on a real Prometheus (Debian package `prometheus`): streams that finish during
// a drain, and one cut at its deadline, are recorded after the scrape before the SIGTERM. With
// --final-scrape-wait the proxy keeps /metrics open after the drain until Prometheus has scraped
// it once more, so Prometheus holds every stream of the proxy's life once the process is gone.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { startGroundTruth } from '../helpers/ground-truth.js';
import { spawnCli, type Spawned } from '../helpers/process.js';
import { startPrometheus, type PrometheusServer } from '../helpers/prometheus.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A streamed chat completion read to its end (or its cut); resolves once the first byte came via `started`. */
async function stream(url: string, model: string, started: () => void): Promise<'ended' | 'cut'> {
  try {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hi' }] }),
    });
    const reader = res.body!.getReader();
    let first = true;
    for (;;) {
      const { done } = await reader.read();
      if (done) return 'ended';
      if (first) {
        first = false;
        started();
      }
    }
  } catch {
    return 'cut';
  }
}

describe('the final scrape after a drain, on a real Prometheus', () => {
  it('Prometheus holds the streams that ended during the drain, and the one cut at its deadline, after the proxy has exited', async () => {
    const tmp = mkdtempSync(join(tmpdir(), 'llp-final-scrape-e2e-'));
    cleanups.push(() => rmSync(tmp, { recursive: true, force: true }));
    const short = await startGroundTruth({ ttftMs: 20, itlMs: 20, tokens: 300, alwaysUsage: true }); // ~6 s
    cleanups.push(short.close);
    const long = await startGroundTruth({ ttftMs: 20, itlMs: 50, tokens: 600 }); // 30 s: cut at the deadline
    cleanups.push(long.close);
    writeFileSync(join(tmp, 'config.yaml'), `routes:\n  - { prefix: /long, upstream: "${long.url}" }\n  - { prefix: /, upstream: "${short.url}" }\n`);
    const proxy: Spawned = spawnCli(['--config', join(tmp, 'config.yaml'), '--port', '0', '--metrics-port', '0', '--drain-timeout', '10', '--final-scrape-wait', '15'], { OTEL_METRICS_EXPORTER: 'prometheus' });
    cleanups.push(async () => void (await proxy.stop('SIGKILL')));
    const l = await proxy.waitFor((x) => x.msg === 'listening');
    const target = new URL(l.metricsUrl as string).host;
    const prom: PrometheusServer = await startPrometheus(
      tmp,
      ['global:', '  scrape_interval: 1s', '  scrape_timeout: 900ms', 'scrape_configs:', '  - job_name: llm-proxy', '    static_configs:', `      - targets: ['${target}']`, ''].join('\n'),
    );
    cleanups.push(() => prom.stop());
    const poll = async (what: string, ms: number, fn: () => Promise<boolean>) => {
      const end = Date.now() + ms;
      while (!(await fn())) {
        if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}: ${prom.output.join('')}`);
        await sleep(250);
      }
    };
    await poll('the target to be up', 30_000, async () => (await prom.query('up{job="llm-proxy"} == 1')).length === 1);

    let started = 0;
    const endedAt: number[] = [];
    const timed = (p: Promise<'ended' | 'cut'>) => p.then((r) => (endedAt.push(performance.now()), r));
    const streams = [
      timed(stream(l.proxyUrl as string, 'final-model', () => started++)),
      timed(stream(l.proxyUrl as string, 'final-model', () => started++)),
      timed(stream(`${l.proxyUrl as string}/long`, 'final-model', () => started++)),
    ];
    await poll('three streams under way', 10_000, async () => started === 3);
    // The streams' first tokens reach Prometheus before the SIGTERM; their ends cannot have.
    const ttft = `sum(gen_ai_client_operation_time_to_first_chunk_seconds_count{gen_ai_request_model="final-model"})`;
    await poll('the first tokens scraped', 15_000, async () => Number((await prom.query(ttft))[0]?.value[1]) === 3);
    const sigterm = performance.now();
    proxy.child.kill('SIGTERM');
    expect((await Promise.all(streams)).sort()).toEqual(['cut', 'ended', 'ended']);
    expect(Math.min(...endedAt)).toBeGreaterThan(sigterm); // every stream ended in the drain
    expect(await proxy.exited).toBe(0);
    expect(proxy.lines.find((x) => x.msg === 'final scrape served')).toMatchObject({ userAgent: expect.stringMatching(/^Prometheus\//) });

    // The target is gone: its series are stale now, so look back over the last minute (and give
    // Prometheus a moment to append what it read).
    const value = async (expr: string) => Number((await prom.query(expr))[0]?.value[1]);
    const ended = (filter: string) => `sum(max_over_time(gen_ai_client_operation_duration_seconds_count{gen_ai_request_model="final-model"${filter}}[1m]))`;
    await poll('the final scrape in the TSDB', 10_000, async () => (await value(ended(''))) === 3);
    expect(await value(ended(',error_type="shutdown_deadline"'))).toBe(1);
    const gaps = `sum(max_over_time(gen_ai_client_operation_time_per_output_chunk_seconds_count{gen_ai_request_model="final-model"}[1m]))`;
    expect(await value(gaps)).toBeGreaterThanOrEqual(2 * 299);
  });
});
