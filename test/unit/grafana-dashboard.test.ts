// The committed Grafana dashboard: current with grafana/params.yaml + build.mjs,
// and linted (ids, descriptions, units, datasource, layout, variables, valid
// PromQL, only metrics the proxy exports or the rules record).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import YAML from 'yaml';
import * as build from '../../grafana/build.mjs';

const ROOT = resolve(import.meta.dirname, '../..');
const GRAFANA = join(ROOT, 'grafana');
const DASHBOARD_FILE = join(GRAFANA, build.OUTPUT_FILES.dashboard);
const params = build.loadParams();
const dashboard = JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8'));
const allPanels: build.DashboardPanel[] = dashboard.panels.flatMap((p: build.DashboardPanel) => [p, ...(p.panels ?? [])]);
const panels = allPanels.filter((p) => p.type !== 'row');
const targets = build.dashboardTargets(dashboard);
const VARS = {
  datasource: 'prometheus',
  job: '.*',
  instance: '.*',
  provider: '.*',
  model: '.*',
  operation: '.*',
  server_address: '.*',
  __rate_interval: '1m',
  __interval: '15s',
  __range: '6h',
};

describe('grafana/ generated files', () => {
  it('are current: a fresh render from params.yaml equals the committed files', () => {
    expect(build.staleFiles(params)).toEqual([]);
    const r = spawnSync(process.execPath, [join(GRAFANA, 'build.mjs'), '--check'], { cwd: ROOT, encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
  });

  it('the currency check notices a changed parameter', () => {
    const changed = structuredClone(params);
    changed.alerts.itlRegression.factor = 1.7;
    expect(build.staleFiles(changed).sort()).toEqual(
      [build.OUTPUT_FILES.dashboard, build.OUTPUT_FILES.prometheusRule, build.OUTPUT_FILES.rules].sort(),
    );
  });

  it('params.yaml is validated: what would render rules Prometheus refuses, or alerts that never or always fire, is an error naming the key', () => {
    const refused = (edit: (p: build.Params) => void, message: RegExp) => {
      const bad = structuredClone(params);
      edit(bad);
      expect(() => build.validateParams(bad), String(message)).toThrow(message);
    };
    refused((p) => (p.alerts.stalls.gapSeconds = 0.9), /alerts\.stalls\.gapSeconds=0\.9 is not a gap histogram bucket boundary/);
    refused((p) => (p.selector = 'otel_scope_name=llm-latency-proxy'), /^grafana\/params\.yaml: selector must be label matchers/);
    refused((p) => (p.selector = 'otel_scope_name="a",'), /selector must be label matchers/);
    refused((p) => p.groupBy.push('k8s.namespace'), /groupBy: "k8s\.namespace" is not a Prometheus label name/);
    refused((p) => (p.instanceLabels = ['pod-name']), /instanceLabels: "pod-name" is not a Prometheus label name/);
    refused((p) => (p.groups.alerts = p.groups.recording), /groups\.recording and groups\.alerts must be two different names/);
    refused((p) => (p.window = '0s'), /bad duration "0s"/);
    refused((p) => (p.alerts.errorRatio.for = '0m'), /alerts\.errorRatio\.for: bad duration 0m/);
    refused((p) => (p.comparison.week = p.comparison.day), /comparison\.day and comparison\.week must differ/);
    refused((p) => (p.runbookUrl = 'runbook.md#x'), /runbookUrl must be an http\(s\) URL/);
    refused((p) => (p.alerts.errorRatio.threshold = 5), /alerts\.errorRatio\.threshold=5 must be below 1/); // 5 meant as 5 %
    refused((p) => (p.alerts.stalls.threshold = 1), /alerts\.stalls\.threshold=1 must be below 1/);
    refused((p) => (p.alerts.itlRegression.factor = 0.5), /alerts\.itlRegression\.factor=0\.5 must be above 1/);
    refused((p) => (p.alerts.ttftRegression.factor = 1), /alerts\.ttftRegression\.factor=1 must be above 1/);
    refused((p) => (p.alerts.itlTailRegression.factor = 1), /alerts\.itlTailRegression\.factor=1 must be above 1/);
    refused((p) => (p.alerts.itlRegression.share = 60), /alerts\.itlRegression\.share=60 must be in \(0, 1\]/); // 60 meant as 60 %
    refused((p) => (p.alerts.ttftRegression.over = '30'), /alerts\.ttftRegression\.over: bad duration 30/);
    refused((p) => (p.quantiles = [0.5, 0.95]), /quantiles must include 0\.5 and 0\.99/);
    refused((p) => (p.quantiles = [0.95, 0.99]), /quantiles must include 0\.5 and 0\.99/);
    // shorter than a step the count of steps is empty and the alert never fires; units out of order
    refused((p) => (p.alerts.itlRegression.over = '30s'), /alerts\.itlRegression\.over=30s must lie between one step \(1m\) and comparison\.day \(1d\)/);
    refused((p) => (p.alerts.itlTailRegression.over = '25h'), /alerts\.itlTailRegression\.over=25h must lie between/);
    refused((p) => (p.alerts.itlRegression.over = '1m30m'), /alerts\.itlRegression\.over: bad duration 1m30m/);
    // the objective alert is judged by its share of slow steps too
    refused((p) => (p.alerts.itlObjective.share = 1.5), /alerts\.itlObjective\.share=1\.5 must be in \(0, 1\]/);
    refused((p) => delete (p.alerts.itlObjective as Partial<build.ShareParams>).over, /alerts\.itlObjective\.over: bad duration undefined/);
    // an absolute objective has no past traffic: its bound is the subquery's cost, not comparison.day
    refused((p) => (p.alerts.itlObjective.over = '25h'), /alerts\.itlObjective\.over=25h must lie between one step \(1m\) and 1d \(each evaluation reads every step of it\)$/);
    const shortDay = structuredClone(params);
    shortDay.comparison.day = '12h';
    shortDay.alerts.itlObjective.over = '20h';
    expect(() => build.validateParams(shortDay)).not.toThrow();
    shortDay.alerts.itlRegression.over = '20h';
    expect(() => build.validateParams(shortDay)).toThrow(/alerts\.itlRegression\.over=20h must lie between one step \(1m\) and comparison\.day \(12h\)/);
    refused((p) => (p.alerts.itlRegression.keepFiringFor = '1m15m'), /alerts\.itlRegression\.keepFiringFor: bad duration 1m15m/);
    refused((p) => (p.window = ''), /bad duration ""/);
    // 20 meant as 20 ms: a p95 cannot pass the last finite gap bucket (2.5 s).
    refused((p) => (p.alerts.itlObjective.perModel = { 'gpt-4o-mini': 20 }), /alerts\.itlObjective gpt-4o-mini=20 must be seconds per token/);
    refused((p) => (p.alerts.itlObjective.defaultSeconds = 2.5), /alerts\.itlObjective defaultSeconds=2\.5/);
    refused((p) => (p.gapBuckets = [0.5, 0.2]), /gapBuckets must be/);
    // The proxy's own buckets, given: a stall threshold among them is taken, and read from the rules.
    const custom = structuredClone(params);
    custom.gapBuckets = [0.001, 0.01, 0.1, 0.5, 2, 5];
    custom.alerts.stalls.gapSeconds = 2;
    expect(() => build.validateParams(custom)).not.toThrow();
    expect(build.recordingRules(custom).find((r) => r.record.startsWith('llm_proxy:chunk_gap_stall'))!.expr).toContain('le=~"2|2.0"');
    expect(() => build.validateParams(params)).not.toThrow();
  });
});

describe('grafana/dashboards/llm-latency-proxy.json', () => {
  it('has a stable uid, a title and Grafana 10+ schema', () => {
    expect(dashboard.uid).toBe('llm-latency-proxy');
    expect(dashboard.title).toBeTruthy();
    expect(dashboard.schemaVersion).toBeGreaterThanOrEqual(36);
    expect(dashboard.id).toBeNull();
  });

  it('has the datasource variable and multi-select "All" filters for provider, model, server_address, job, instance', () => {
    const list = dashboard.templating.list as Array<Record<string, any>>;
    const ds = list.find((v) => v.name === 'datasource');
    expect(ds).toMatchObject({ type: 'datasource', query: 'prometheus' });
    for (const name of ['provider', 'model', 'server_address', 'job', 'instance']) {
      const v = list.find((x) => x.name === name);
      expect(v, name).toBeDefined();
      expect(v).toMatchObject({ type: 'query', multi: true, includeAll: true, allValue: '.*' });
      expect(v!.datasource.uid).toBe('${datasource}');
      expect(v!.definition).toMatch(/^label_values\(.+, \w+\)$/);
    }
  });

  it('panel ids are unique and every panel has a title, a description, a unit and the variable datasource', () => {
    const ids = allPanels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const p of panels) {
      expect(p.title, `panel ${p.id}`).toBeTruthy();
      expect((p.description ?? '').length, `panel ${p.id} "${p.title}" description`).toBeGreaterThan(40);
      const unit = (p as any).fieldConfig?.defaults?.unit;
      expect(unit, `panel ${p.id} "${p.title}" unit`).toBeTruthy();
      expect((p as any).datasource).toEqual({ type: 'prometheus', uid: '${datasource}' });
      expect(p.targets?.length, `panel ${p.id} targets`).toBeGreaterThan(0);
      const refIds = p.targets!.map((t) => t.refId);
      expect(new Set(refIds).size, `panel ${p.id} refIds`).toBe(refIds.length);
      for (const t of p.targets!) expect(t.expr, `panel ${p.id} ${t.refId}`).toBeTruthy();
    }
  });

  it('panels fit the 24-column grid and do not overlap', () => {
    const cells = new Map<string, number>();
    for (const p of allPanels) {
      const { x, y, w, h } = p.gridPos;
      expect(x + w, `panel ${p.id}`).toBeLessThanOrEqual(24);
      for (let i = x; i < x + w; i++) {
        for (let j = y; j < y + h; j++) {
          const key = `${i},${j}`;
          expect(cells.get(key), `panels ${cells.get(key)} and ${p.id} overlap at ${key}`).toBeUndefined();
          cells.set(key, p.id);
        }
      }
    }
  });

  it('has the panels the issue asks for', () => {
    const byMetric = (re: RegExp) => panels.filter((p) => p.targets!.some((t) => re.test(t.expr)));
    expect(byMetric(/llm_proxy_streams_total/).length).toBeGreaterThan(0); // request rate, errors
    expect(byMetric(/outcome="cancelled"/).length).toBeGreaterThan(0);
    expect(byMetric(/time_to_first_chunk_seconds_bucket/).length).toBeGreaterThan(0);
    const heatmap = panels.find((p) => p.type === 'heatmap');
    expect(heatmap?.targets?.[0]?.expr).toMatch(/time_per_output_chunk_seconds_bucket/);
    expect(heatmap?.targets?.[0]?.format).toBe('heatmap');
    // TPOT as seconds and as tokens/s (1/TPOT), p50/p95/p99
    const tpot = byMetric(/^histogram_quantile\([\d.]+, sum by \(le[^)]*\) \(rate\(gen_ai_server_time_per_output_token_seconds_bucket/);
    expect(tpot.flatMap((p) => p.targets!).length).toBe(params.quantiles.length);
    const speed = byMetric(/^1 \/ histogram_quantile\([\d.]+, .*gen_ai_server_time_per_output_token_seconds_bucket/);
    expect(speed.flatMap((p) => p.targets!).length).toBe(params.quantiles.length);
    // time shift: today vs a day and a week earlier
    const shifted = targets.filter(({ target }) => target.expr.includes('tpot') && / offset /.test(target.expr)).map(({ target }) => target.expr);
    expect(shifted.some((e) => e.endsWith(`offset ${params.comparison.day}`))).toBe(true);
    expect(shifted.some((e) => e.endsWith(`offset ${params.comparison.week}`))).toBe(true);
    expect(byMetric(/llm_proxy_streams_active/).length).toBeGreaterThan(0);
    expect(byMetric(/nodejs_eventloop_delay_p99_seconds/).length).toBeGreaterThan(0);
    // mean duration of completed requests and of failed/cancelled ones by error_type (sum / count, not a bucket quantile)
    const duration = byMetric(/gen_ai_client_operation_duration_seconds_sum\{[^}]*error_type=""/);
    expect(duration.length).toBe(1);
    expect(duration[0]!.targets!.map((t) => t.expr).join('\n')).toMatch(/duration_seconds_sum\{[^}]*error_type!=""[^}]*\}\[[^\]]+\]\)\) \/ sum by \(gen_ai_request_model, error_type\) \(rate\(gen_ai_client_operation_duration_seconds_count/);
    // the process's own health: CPU, event-loop utilisation, memory, GC
    for (const re of [/process_cpu_time_seconds_total/, /nodejs_eventloop_time_seconds_total/, /process_memory_usage_bytes/, /v8js_memory_heap_used_bytes/, /v8js_gc_duration_seconds_sum/, /v8js_gc_duration_seconds_bucket/])
      expect(byMetric(re).length, String(re)).toBeGreaterThan(0);
    expect(byMetric(/gen_ai_client_token_usage/).length).toBeGreaterThan(0);
  });

  it('queries use only metrics the proxy exports (docs/interfaces.md) or the rules record', () => {
    const recorded = new Set(build.recordingRules(params).map((r) => r.record));
    const exported = new Set(Object.values(build.METRICS));
    const exprs = [
      ...targets.map(({ target }) => target.expr),
      ...dashboard.templating.list.filter((v: any) => v.type === 'query').map((v: any) => v.definition),
    ];
    for (const e of exprs) {
      for (const m of e.matchAll(/([a-zA-Z_:][a-zA-Z0-9_:]*)\{/g)) {
        const name = m[1]!.replace(/_(bucket|sum|count)$/, '');
        expect(exported.has(name) || recorded.has(m[1]!), `unknown metric ${m[1]} in ${e}`).toBe(true);
      }
    }
  });

  it('every query is valid PromQL once the variables are substituted (promtool check rules)', () => {
    const which = spawnSync('sh', ['-c', 'command -v promtool'], { encoding: 'utf8' });
    if (which.status !== 0) {
      throw new Error('promtool not found on PATH: install the Debian/Ubuntu package `prometheus` (apt-get install prometheus)');
    }
    const rules = targets.map(({ panel, target }, i) => {
      const expr = build.expandDashboardExpr(target.expr, VARS);
      expect(expr, `panel ${panel.id} ${target.refId}: unknown variable`).not.toContain('$');
      return { record: `dashboard:panel${panel.id}_${target.refId}:q${i}`, expr };
    });
    const dir = mkdtempSync(join(tmpdir(), 'grafana-dash-'));
    try {
      const file = join(dir, 'queries.yaml');
      writeFileSync(file, YAML.stringify({ groups: [{ name: 'dashboard', rules }] }));
      const r = spawnSync(which.stdout.trim(), ['check', 'rules', file], { encoding: 'utf8' });
      expect(r.status, `${r.stdout}${r.stderr}`).toBe(0);
      expect(r.stdout).toContain(`SUCCESS: ${rules.length} rules found`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
