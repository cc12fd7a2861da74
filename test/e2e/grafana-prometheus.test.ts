// End-to-end proof of grafana/: a real Prometheus server (Debian package
// `prometheus`) on 127.0.0.1 scrapes a real proxy in front of the real
// simulator, evaluates the rules rendered by grafana/build.mjs with its
// durations scaled down (windows 10s, "1d" -> 45s, "1w" -> 55s, for: 3s), and
// answers every query of the committed dashboard JSON. Then the simulator's
// ITL is slowed 1.6x and the ITL regression alert must go pending/firing, and
// clear again once the ITL is restored (before the slowdown reaches the
// baseline, so the restore is what clears it).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as build from '../../grafana/build.mjs';
import { startPrometheus, which, type PrometheusServer, type PromSample } from '../helpers/prometheus.js';

const ROOT = resolve(import.meta.dirname, '../..');
const CLI = join(ROOT, 'dist/cli.js');
const DASHBOARD_FILE = join(ROOT, 'grafana', build.OUTPUT_FILES.dashboard as string);

// The offsets set how long the test waits for history. "1d" only has to outlast the slowdown
// until the alert clears (27.2 s once the alert judged its share of slow steps, 29.6 s with
// keep_firing_for, 2026-12-05; it was 15.7-18.7 s before), so the restore is what clears it.
const SCALE = { window: '10s', day: '45s', week: '55s', forDuration: '3s', lookback: '60s' };
const DAY_OFFSET_S = 45;
const WEEK_OFFSET_S = 55;
const BASE_ITL = 0.0014; // the motivating 1.4 ms per token (lands in the (1.25,1.5] ms bucket)
const SLOW_ITL = BASE_ITL * 1.6; // 2.24 ms (lands in (2,2.5] ms)
const MODEL = 'sim-model';
const WORKERS = 4;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Proc {
  child: ChildProcess;
  output: string[];
}

/** Spawns `cmd` and resolves with the first stdout JSON line whose msg is `msg`. */
async function startLogged(cmd: string, args: string[], msg: string, timeoutMs = 20_000): Promise<{ proc: Proc; line: Record<string, unknown> }> {
  const child = spawn(cmd, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  const output: string[] = [];
  const proc = { child, output };
  child.stderr!.on('data', (d: Buffer) => output.push(d.toString()));
  const rl = createInterface({ input: child.stdout! });
  const line = await new Promise<Record<string, unknown>>((res, rej) => {
    const timer = setTimeout(() => rej(new Error(`${cmd} ${args.join(' ')}: no "${msg}" line in ${timeoutMs} ms:\n${output.join('')}`)), timeoutMs);
    child.once('exit', (code) => rej(new Error(`${cmd} exited with ${code} before "${msg}":\n${output.join('')}`)));
    rl.on('line', (l) => {
      if (output.length < 200) output.push(`${l}\n`);
      try {
        const j = JSON.parse(l) as Record<string, unknown>;
        if (j.msg === msg) {
          clearTimeout(timer);
          res(j);
        }
      } catch {
        /* not JSON */
      }
    });
  });
  return { proc, line };
}

async function stop(p: Proc | undefined): Promise<void> {
  if (!p || p.child.exitCode !== null || p.child.signalCode !== null) return;
  const exited = new Promise<void>((r) => p.child.once('exit', () => r()));
  p.child.kill('SIGTERM');
  const t = setTimeout(() => p.child.kill('SIGKILL'), 5_000);
  await exited;
  clearTimeout(t);
}

type Sample = PromSample;

describe('grafana/ on a real Prometheus', () => {
  const promtool = which('promtool');
  const prometheusBin = which('prometheus');
  let tmp = '';
  let sim: Proc | undefined;
  let proxy: Proc | undefined;
  let prom: PrometheusServer | undefined;
  let simUrl = '';
  let proxyUrl = '';
  let metricsUrl = '';
  let metricsTarget = ''; // host:port, the target's `instance` label
  let promUrl = '';
  let params: any;
  let scaled: any;
  let traffic: Promise<void> | undefined;
  let stopTraffic = false;
  const stats = { ok: 0, cancelled: 0, failed: 0, lastError: '' };

  const query = (expr: string): Promise<Sample[]> => prom!.query(expr);

  async function alerts(name: string): Promise<Array<{ labels: Record<string, string>; annotations: Record<string, string>; state: string }>> {
    const r = await fetch(`${promUrl}/api/v1/alerts`);
    const j = (await r.json()) as { data: { alerts: Array<{ labels: Record<string, string>; annotations: Record<string, string>; state: string }> } };
    return j.data.alerts.filter((a) => a.labels.alertname === name);
  }

  async function waitFor<T>(what: string, timeoutMs: number, fn: () => Promise<T | undefined | null | false>): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    let last: unknown;
    for (;;) {
      try {
        const v = await fn();
        if (v) return v;
      } catch (e) {
        last = e;
      }
      if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ''}`);
      await sleep(500);
    }
  }

  async function diagnostics(): Promise<string> {
    const out: string[] = [`traffic ${JSON.stringify(stats)}`];
    for (const e of [
      `sum by (le) (rate(gen_ai_server_time_per_output_token_seconds_bucket[${SCALE.window}]))`,
      'llm_proxy:tpot_seconds:p95_5m',
      'llm_proxy:tpot_seconds:p95_5m_baseline',
      'nodejs_eventloop_delay_p99_seconds',
    ]) {
      try {
        out.push(`${e} = ${JSON.stringify((await query(e)).map((s) => [s.metric.le ?? '', s.value[1]]))}`);
      } catch (err) {
        out.push(String(err));
      }
    }
    return out.join('\n');
  }

  /** One streamed chat completion; every `cancelEvery`-th one is aborted after its first chunk. */
  async function oneRequest(cancel: boolean): Promise<void> {
    const ac = new AbortController();
    const res = await fetch(`${proxyUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer test' },
      body: JSON.stringify({
        model: MODEL,
        stream: true,
        stream_options: { include_usage: true },
        messages: [{ role: 'user', content: 'Say something.' }],
      }),
      signal: ac.signal,
    });
    if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
    const reader = res.body.getReader();
    let chunks = 0;
    for (;;) {
      const { done } = await reader.read();
      if (done) break;
      chunks += 1;
      if (cancel && chunks >= 3) {
        ac.abort();
        await reader.cancel().catch(() => undefined);
        stats.cancelled += 1;
        return;
      }
    }
    stats.ok += 1;
  }

  function startTraffic(deadlineMs: number): Promise<void> {
    const worker = async (w: number) => {
      // bounded: stops at the deadline, on stopTraffic, or after 5000 requests
      for (let i = 0; i < 5000 && !stopTraffic && Date.now() < deadlineMs; i++) {
        try {
          await oneRequest(w === 0 && i % 10 === 9);
        } catch (e) {
          if ((e as Error).name !== 'AbortError') {
            stats.failed += 1;
            stats.lastError = String(e);
            await sleep(100);
          }
        }
      }
    };
    return Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w))).then(() => undefined);
  }

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
    if (!promtool || !prometheusBin) {
      throw new Error('promtool/prometheus not found on PATH: install the Debian/Ubuntu package `prometheus` (apt-get install prometheus)');
    }
    tmp = mkdtempSync(join(tmpdir(), 'grafana-e2e-'));
    params = build.loadParams();
    scaled = build.scaleDurations(params, SCALE);
    const rulesFile = join(tmp, 'rules.yaml');
    writeFileSync(rulesFile, build.renderRulesFile(scaled));
    const check = spawnSync(promtool, ['check', 'rules', rulesFile], { encoding: 'utf8' });
    if (check.status !== 0) throw new Error(`scaled rules invalid:\n${check.stdout}${check.stderr}`);

    const s = await startLogged(process.execPath, [CLI, 'simulate', '--port', '0', '--ttft', '0.05', '--itl', String(BASE_ITL), '--tokens', '200', '--jitter', '0.1', '--seed', '7'], 'simulator listening');
    sim = s.proc;
    simUrl = String(s.line.url);
    // A connection cap far above the test's load: the dashboard's drop series is there (at 0).
    const configFile = join(tmp, 'proxy.yaml');
    writeFileSync(configFile, 'listen: { maxConnections: 1000 }\n');
    const p = await startLogged(process.execPath, [CLI, '--upstream', simUrl, '--port', '0', '--metrics-port', '0', '--log-level', 'info', '--config', configFile], 'listening');
    proxy = p.proc;
    proxyUrl = String(p.line.proxyUrl);
    metricsUrl = String(p.line.metricsUrl);
    metricsTarget = new URL(metricsUrl).host;

    prom = await startPrometheus(
      tmp,
      [
        'global:',
        '  scrape_interval: 1s',
        '  scrape_timeout: 900ms',
        '  evaluation_interval: 1s',
        'rule_files:',
        `  - ${rulesFile}`,
        'scrape_configs:',
        '  - job_name: llm-proxy',
        '    static_configs:',
        `      - targets: ['${metricsTarget}']`,
        '',
      ].join('\n'),
    );
    promUrl = prom.url;

    // Traffic for at most 4 minutes; the test stops it earlier.
    traffic = startTraffic(Date.now() + 240_000);
  });

  afterAll(async () => {
    stopTraffic = true;
    await traffic?.catch(() => undefined);
    await prom?.stop();
    await stop(proxy);
    await stop(sim);
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('scrapes the proxy, evaluates every rule, answers every dashboard query, and pages on a 1.6x ITL slowdown', async () => {
    // -- 1. history long enough for the scaled "a week earlier" comparison
    await waitFor('the scrape target to be up', 30_000, async () => (await query('up{job="llm-proxy"} == 1')).length === 1);
    // Both baselines' inputs: the two rules may get their first value in different evaluations.
    await waitFor(`TPOT and TTFT p95 recorded ${WEEK_OFFSET_S}s ago (the scaled "1w" offset)`, (WEEK_OFFSET_S + 60) * 1000, async () => {
      for (const rule of ['llm_proxy:tpot_seconds:p95_5m', 'llm_proxy:ttft_seconds:p95_5m']) {
        const r = await query(`${rule} offset ${WEEK_OFFSET_S}s`);
        if (!(r.length > 0 && Number.isFinite(Number(r[0]!.value[1])))) return false;
      }
      return true;
    });
    expect(stats.ok, `traffic: ${JSON.stringify(stats)}`).toBeGreaterThan(200);

    // -- 2. every recording rule has a value
    const recorded = [...new Set(build.recordingRules(scaled).map((r: { record: string }) => r.record))] as string[];
    for (const name of recorded) {
      const r = await query(name);
      expect(r.length, `recording rule ${name} has no value`).toBeGreaterThan(0);
      if (/:p\d+_5m/.test(name)) {
        expect(r.every((s) => Number.isFinite(Number(s.value[1]))), `${name} = ${JSON.stringify(r)}`).toBe(true);
      }
    }
    // 1.4 ms per token, bucket (1.25,1.5] ms; on a loaded machine a few stalled streams may lift
    // the p95 into the next bucket, (1.5,2] ms, still clear of the slowed ITL's (2,2.5] ms. A
    // machine loaded enough to stall the simulator or the proxy for longer (review 150 saw the
    // proxy's event-loop delay p99 at 0.53 s and a p95 of 3.6 ms) stretches the streams
    // themselves: their TPOT is measured right, but is not the normal traffic's. So the p95 is
    // judged in the first window in that range, within 60 s; a proxy that measured TPOT too high
    // or too low never gets there.
    let p95: Sample[] = [];
    await waitFor('the normal traffic\'s TPOT p95 in (1.25, 2] ms', 60_000, async () => {
      p95 = await query(`llm_proxy:tpot_seconds:p95_5m{gen_ai_request_model="${MODEL}"}`);
      const v = Number(p95[0]?.value[1]);
      return v > 0.00125 && v <= 0.002;
    }).catch(async (e) => {
      throw new Error(`${String(e)}; the last: ${JSON.stringify(p95)}\n${await diagnostics()}`);
    });
    expect(p95.map((s) => s.metric.gen_ai_provider_name)).toEqual(['openai']);

    // -- 3. every panel query of the committed dashboard returns data
    const dashboard = JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8'));
    const vars = {
      datasource: 'prometheus',
      job: '.*',
      instance: '.*',
      provider: '.*',
      model: '.*',
      operation: '.*',
      server_address: '.*',
      __rate_interval: SCALE.window,
      __interval: '1s',
      __range: '60s',
    };
    const targets = build.dashboardTargets(dashboard) as Array<{ panel: { id: number; title: string }; target: { expr: string; refId: string } }>;
    expect(targets.length).toBeGreaterThan(20);
    const empty: string[] = [];
    for (const { panel, target } of targets) {
      // the scaled rules' "a day/week earlier" is 45s/55s; the same substitution for the dashboard's offsets
      const expr = build
        .expandDashboardExpr(target.expr, vars)
        .replaceAll(`offset ${params.comparison.day}`, `offset ${DAY_OFFSET_S}s`)
        .replaceAll(`offset ${params.comparison.week}`, `offset ${WEEK_OFFSET_S}s`);
      expect(expr, `unsubstituted variable in panel ${panel.id}`).not.toMatch(/\$/);
      const r = await query(expr);
      if (r.length === 0) empty.push(`panel ${panel.id} "${panel.title}" ${target.refId}: ${expr}`);
    }
    expect(empty, `dashboard queries without data:\n${empty.join('\n')}`).toEqual([]);
    // the template variables' label_values() queries
    for (const v of dashboard.templating.list.filter((x: { type: string }) => x.type === 'query')) {
      const m = /^label_values\((.*), (\w+)\)$/.exec(v.definition as string);
      expect(m, v.definition).not.toBeNull();
      const match = build.expandDashboardExpr(m![1]!, vars);
      const r = await fetch(`${promUrl}/api/v1/label/${m![2]}/values?match[]=${encodeURIComponent(match)}`);
      const values = ((await r.json()) as { data: string[] }).data;
      expect(values.length, `variable ${v.name}: ${v.definition}`).toBeGreaterThan(0);
    }

    // -- 4. normal traffic: the regression alert is silent
    expect(await alerts('LLMProxyITLRegression'), await diagnostics()).toEqual([]);

    // -- 5. slow the simulator's ITL 1.6x: the alert goes pending, then firing
    const put = await fetch(`${simUrl}/_sim/config`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ itl: SLOW_ITL }),
    });
    expect(put.ok).toBe(true);
    const slowedAt = Date.now();
    const pending = await waitFor('LLMProxyITLRegression pending or firing', 60_000, async () => {
      const a = await alerts('LLMProxyITLRegression');
      return a.length > 0 ? a : undefined;
    }).catch(async (e) => {
      throw new Error(`${String(e)}\n${await diagnostics()}`);
    });
    const pendingAfterS = (Date.now() - slowedAt) / 1000;
    expect(pending.map((a) => a.labels)).toEqual([
      {
        alertname: 'LLMProxyITLRegression',
        severity: params.alerts.itlRegression.severity,
        gen_ai_operation_name: 'chat',
        gen_ai_provider_name: 'openai',
        gen_ai_request_model: MODEL,
        server_address: '127.0.0.1',
      },
    ]);
    const firing = await waitFor('LLMProxyITLRegression firing', 30_000, async () => {
      const a = await alerts('LLMProxyITLRegression');
      return a.find((x) => x.state === 'firing');
    });
    expect(firing.annotations.runbook_url).toMatch(/runbook\.md#llmproxyitlregression$/);
    // p95 in the (2,2.5] ms bucket, the baseline from before the slowdown: in (1.25,1.5] ms
    // (1.488 ms in all 14 logged suites), or (1.5,1.75] when a loaded machine stretched some of
    // the simulator's 1.4 ms gaps; though past ~1.65 ms the slowed p95 (<= 2.5) is no longer over
    // the factor's 1.5x, and the wait for the alert above times out first
    const m = /is ([\d.]+)ms per token .*, ([\d.]+)x its baseline of ([\d.]+)ms/.exec(firing.annotations.description!);
    expect(m, firing.annotations.description).not.toBeNull();
    expect(Number(m![1])).toBeGreaterThan(2);
    expect(Number(m![2])).toBeGreaterThan(params.alerts.itlRegression.factor);
    expect(Number(m![3])).toBeLessThanOrEqual(1.75);

    // -- 6. restore: the alert clears, while the baseline still predates the slowdown
    const restore = await fetch(`${simUrl}/_sim/config`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ itl: BASE_ITL }),
    });
    expect(restore.ok).toBe(true);
    await waitFor('LLMProxyITLRegression to clear', 60_000, async () => (await alerts('LLMProxyITLRegression')).length === 0).catch(
      async (e) => {
        throw new Error(`${String(e)}\n${await diagnostics()}`);
      },
    );
    const clearedAfterS = (Date.now() - slowedAt) / 1000;
    // Had it taken longer than the scaled "1d" offset, the slow period would be in the baseline
    // and could have cleared the alert by itself.
    expect(clearedAfterS, 'the alert must clear because the ITL was restored, not because the baseline caught up').toBeLessThan(
      DAY_OFFSET_S,
    );
    console.log(
      `ITL x1.6: alert active after ${pendingAfterS.toFixed(1)} s, cleared ${clearedAfterS.toFixed(1)} s after the slowdown; ` +
        `firing description: ${firing.annotations.description}; traffic ${JSON.stringify(stats)}`,
    );
    const baseline = await query(`llm_proxy:tpot_seconds:p95_5m_baseline{gen_ai_request_model="${MODEL}"}`);
    expect(Number(baseline[0]!.value[1])).toBeLessThanOrEqual(0.002); // the normal traffic's, as above

    // -- 7. promtool check metrics on a real scrape
    stopTraffic = true;
    await traffic;
    expect(stats.cancelled, 'some streams were cancelled by the client').toBeGreaterThan(0);
    expect(stats.failed, `requests that failed through the proxy; the last: ${stats.lastError}`).toBe(0);
    const text = await (await fetch(`${metricsUrl}/metrics`)).text();
    const lint = spawnSync(promtool!, ['check', 'metrics'], { input: text, encoding: 'utf8' });
    // No problem is tolerated: grafana/README.md documents that the scrape is clean.
    expect(`${lint.stdout}${lint.stderr}`.trim()).toBe('');
    expect(lint.status).toBe(0);

    // -- 8. the proxy goes away: its failing scrape pages (LLMProxyDown), naming the target
    expect(await alerts('LLMProxyDown')).toEqual([]);
    await stop(proxy);
    const down = await waitFor('LLMProxyDown firing', 30_000, async () => (await alerts('LLMProxyDown')).find((a) => a.state === 'firing')).catch(
      async (e) => {
        throw new Error(`${String(e)}\n${await diagnostics()}`);
      },
    );
    expect(down.labels).toEqual({ alertname: 'LLMProxyDown', severity: params.alerts.proxyDown.severity, job: 'llm-proxy', instance: metricsTarget });
    expect(down.annotations.runbook_url).toMatch(/runbook\.md#llmproxydown$/);
  });
});
