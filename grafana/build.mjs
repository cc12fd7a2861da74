#!/usr/bin/env node
// Renders the Prometheus rules and the Grafana dashboard from grafana/params.yaml.
//
//   node grafana/build.mjs          write the rendered files
//   node grafana/build.mjs --check  exit 1 (and name the files) when a committed file is stale
//
// The functions are exported so tests can render the same artefacts, or a
// variant with scaled-down durations (see `scaleDurations`), without copying
// expressions by hand.
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';

export const GRAFANA_DIR = dirname(fileURLToPath(import.meta.url));
export const PARAMS_FILE = join(GRAFANA_DIR, 'params.yaml');

/** Metric names pinned by docs/interfaces.md (a unit test cross-checks them). */
export const METRICS = Object.freeze({
  ttft: 'gen_ai_client_operation_time_to_first_chunk_seconds',
  gap: 'gen_ai_client_operation_time_per_output_chunk_seconds',
  tpot: 'gen_ai_server_time_per_output_token_seconds',
  duration: 'gen_ai_client_operation_duration_seconds',
  tokens: 'gen_ai_client_token_usage',
  streams: 'llm_proxy_streams_total',
  clientPaced: 'llm_proxy_streams_client_paced_total',
  active: 'llm_proxy_streams_active',
  connect: 'llm_proxy_upstream_connect_duration_seconds',
  open: 'llm_proxy_connections_open',
  dropped: 'llm_proxy_connections_dropped_total',
  loopP50: 'nodejs_eventloop_delay_p50_seconds',
  loopP99: 'nodejs_eventloop_delay_p99_seconds',
  loopMax: 'nodejs_eventloop_delay_max_seconds',
  loopTime: 'nodejs_eventloop_time_seconds_total',
  cpu: 'process_cpu_time_seconds_total',
  rss: 'process_memory_usage_bytes',
  heapUsed: 'v8js_memory_heap_used_bytes',
  gc: 'v8js_gc_duration_seconds',
});

/** Bucket boundaries of the per-gap ITL and TPOT histograms (docs/interfaces.md). */
export const GAP_BUCKETS = Object.freeze([
  0.00025, 0.0005, 0.00075, 0.001, 0.00125, 0.0015, 0.00175, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.0075, 0.01,
  0.015, 0.0175, 0.02, 0.0225, 0.025, 0.0275, 0.03, 0.035, 0.04, 0.045, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3,
  0.5, 0.75, 1, 1.5, 2.5,
]);

export const DASHBOARD_UID = 'llm-latency-proxy';

export const OUTPUT_FILES = Object.freeze({
  rules: 'alerts/llm-latency-proxy.rules.yaml',
  prometheusRule: 'alerts/llm-latency-proxy.prometheusrule.yaml',
  dashboard: 'dashboards/llm-latency-proxy.json',
});

// ---------------------------------------------------------------- params

export function loadParams(file = PARAMS_FILE) {
  const params = YAML.parse(readFileSync(file, 'utf8'));
  validateParams(params);
  return params;
}

/** The "against the past" alerts, judged step by step over `over` (params.yaml). */
const REGRESSIONS = ['itlRegression', 'ttftRegression', 'itlTailRegression'];
/** The alerts judged by the share of slow steps over `over` (the regressions and the objective). */
const BY_SHARE = [...REGRESSIONS, 'itlObjective'];

// Prometheus's own pattern: units from the largest down, each at most once ("1m30m" is refused).
const DURATION = /^(?=\d)(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$/;
const ZERO = /^(0+(ms|s|m|h|d|w|y))+$/;
const UNIT_MS = { y: 365 * 864e5, w: 7 * 864e5, d: 864e5, h: 36e5, m: 6e4, s: 1e3, ms: 1 };
/** Milliseconds in a duration DURATION accepts. */
const durationMs = (d) => [...String(d).matchAll(/(\d+)(ms|y|w|d|h|m|s)/g)].reduce((t, [, n, u]) => t + Number(n) * UNIT_MS[u], 0);
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const MATCHER = String.raw`\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*`;
const SELECTOR = new RegExp(`^${MATCHER}(,${MATCHER})*$`);

export function validateParams(p) {
  const fail = (msg) => {
    throw new Error(`grafana/params.yaml: ${msg}`);
  };
  if (typeof p.selector !== 'string' || !SELECTOR.test(p.selector)) {
    fail(`selector must be label matchers separated by commas, each name op "value" (e.g. otel_scope_name="llm-latency-proxy", namespace="llm"): ${JSON.stringify(p.selector)}`);
  }
  if (!Array.isArray(p.groupBy) || p.groupBy.length === 0) fail('groupBy must be a non-empty list');
  if (!p.groupBy.includes('gen_ai_request_model')) fail('groupBy must include gen_ai_request_model (per-model objectives)');
  for (const [key, list] of [['groupBy', p.groupBy], ['instanceLabels', p.instanceLabels]]) {
    if (!Array.isArray(list) || list.length === 0) fail(`${key} must be a non-empty list`);
    for (const l of list) if (typeof l !== 'string' || !LABEL_NAME.test(l)) fail(`${key}: ${JSON.stringify(l)} is not a Prometheus label name (dots become underscores: k8s.namespace is k8s_namespace)`);
  }
  if (typeof p.runbookUrl !== 'string' || !/^https?:\/\/[^\s#]+$/.test(p.runbookUrl)) fail('runbookUrl must be an http(s) URL without a fragment (each alert adds #<its name>)');
  if (p.groups?.recording === p.groups?.alerts || typeof p.groups?.recording !== 'string' || typeof p.groups?.alerts !== 'string') {
    fail('groups.recording and groups.alerts must be two different names (Prometheus refuses two groups of one name)');
  }
  for (const d of [p.window, p.rangeWindow ?? p.window, p.comparison?.day, p.comparison?.week]) {
    if (typeof d !== 'string' || !DURATION.test(d) || ZERO.test(d)) fail(`bad duration ${JSON.stringify(d)} (a positive Prometheus duration, e.g. 5m)`);
  }
  if (p.comparison.day === p.comparison.week) fail('comparison.day and comparison.week must differ');
  for (const q of p.quantiles) if (!(q > 0 && q < 1)) fail(`quantile ${q} not in (0,1)`);
  for (const [name, a] of Object.entries(p.alerts)) {
    if (!DURATION.test(String(a.for)) || ZERO.test(String(a.for))) fail(`alerts.${name}.for: bad duration ${a.for} (a positive Prometheus duration)`);
    if (a.keepFiringFor !== undefined && !DURATION.test(String(a.keepFiringFor))) fail(`alerts.${name}.keepFiringFor: bad duration ${a.keepFiringFor} (a Prometheus duration)`);
    if (typeof a.severity !== 'string') fail(`alerts.${name}.severity missing`);
    for (const [k, v] of Object.entries(a)) {
      if (['for', 'keepFiringFor', 'severity', 'perModel', 'lookback', 'sustained', 'over', 'excludeOperations'].includes(k)) continue; // sustainedShare, share: positive numbers
      if (typeof v !== 'number' || !(v > 0)) fail(`alerts.${name}.${k} must be a positive number`);
    }
  }
  // Shares are fractions: 5 meant as 5 % would never fire.
  for (const key of ['errorRatio', 'cancellationRatio', 'stalls']) {
    if (!(p.alerts[key].threshold < 1)) fail(`alerts.${key}.threshold=${p.alerts[key].threshold} must be below 1: it is a share (0.05 = 5 %)`);
  }
  // A factor of 1 or less fires on every normal day.
  for (const key of REGRESSIONS) {
    const c = p.alerts[key];
    if (!(c.factor > 1)) fail(`alerts.${key}.factor=${c.factor} must be above 1 (1.5 = 50 % slower than the baseline)`);
  }
  for (const key of BY_SHARE) {
    const c = p.alerts[key];
    if (!DURATION.test(String(c.over)) || ZERO.test(String(c.over))) fail(`alerts.${key}.over: bad duration ${c.over} (a positive Prometheus duration, e.g. 30m)`);
    // Shorter than a step, the count of steps is empty between whole minutes and the alert never
    // fires. Longer than the day offset, a regression's past traffic overlaps today's; the
    // objective has no past traffic, and is bounded only because each evaluation reads every step.
    const step = p.subqueryStep ?? '1m';
    const [most, why] = REGRESSIONS.includes(key) ? [p.comparison.day, `comparison.day (${p.comparison.day})`] : ['1d', '1d (each evaluation reads every step of it)'];
    if (durationMs(c.over) < durationMs(step) || durationMs(c.over) > durationMs(most)) {
      fail(`alerts.${key}.over=${c.over} must lie between one step (${step}) and ${why}`);
    }
    if (!(c.share > 0 && c.share <= 1)) fail(`alerts.${key}.share=${c.share} must be in (0, 1]: the share of the steps of \`over\` that must be slow`);
  }
  if (!p.quantiles.includes(0.99) || !p.quantiles.includes(0.5)) fail('quantiles must include 0.5 and 0.99 (alerts.itlTailRegression reads the p99 gap, and its description the p50)');
  const gapBuckets = p.gapBuckets ?? GAP_BUCKETS;
  if (!Array.isArray(gapBuckets) || gapBuckets.length === 0 || gapBuckets.some((b, i) => typeof b !== 'number' || !(b > 0) || (i > 0 && !(b > gapBuckets[i - 1])))) {
    fail('gapBuckets must be the proxy\'s metrics.buckets.itl: positive numbers, ascending');
  }
  if (!gapBuckets.includes(p.alerts.stalls.gapSeconds)) {
    fail(`alerts.stalls.gapSeconds=${p.alerts.stalls.gapSeconds} is not a gap histogram bucket boundary (gapBuckets: ${gapBuckets.join(', ')})`);
  }
  // A p95 cannot exceed the last finite bucket: an objective at or above it never fires.
  const top = gapBuckets[gapBuckets.length - 1];
  for (const [model, s] of Object.entries({ defaultSeconds: p.alerts.itlObjective.defaultSeconds, ...(p.alerts.itlObjective.perModel ?? {}) })) {
    if (typeof s !== 'number' || !(s > 0) || !(s < top)) fail(`alerts.itlObjective ${model}=${s} must be seconds per token, above 0 and below the last finite gap bucket (${top} s)`);
  }
  if (!DURATION.test(String(p.alerts.noData.lookback))) fail('alerts.noData.lookback: bad duration');
  if (!DURATION.test(String(p.alerts.proxyDown?.lookback))) fail('alerts.proxyDown.lookback: bad duration');
  if (!DURATION.test(String(p.alerts.noData.sustained))) fail('alerts.noData.sustained: bad duration');
  const share = p.alerts.noData.sustainedShare;
  if (!(share > 0 && share <= 1)) fail('alerts.noData.sustainedShare must be in (0, 1]');
  const ex = p.alerts.cancellationRatio.excludeOperations ?? [];
  if (!Array.isArray(ex) || ex.some((o) => typeof o !== 'string' || !/^[\w.]+$/.test(o))) fail('alerts.cancellationRatio.excludeOperations must be a list of operation names');
}

/**
 * A copy of `params` whose windows, offsets and `for:` durations are replaced
 * (for a test Prometheus that cannot wait a week). Rule *names* keep the
 * production window so the dashboard's recording-rule queries stay valid.
 */
export function scaleDurations(params, { window, day, week, forDuration, lookback, sustained = window, over = window }) {
  const p = structuredClone(params);
  p.rangeWindow = window;
  p.comparison = { day, week };
  for (const a of Object.values(p.alerts)) {
    a.for = forDuration;
    if (a.keepFiringFor !== undefined) a.keepFiringFor = forDuration;
  }
  for (const key of BY_SHARE) p.alerts[key].over = over;
  p.alerts.noData.lookback = lookback;
  p.alerts.noData.sustained = sustained;
  p.subqueryStep = '1s';
  validateParams(p);
  return p;
}

// ---------------------------------------------------------------- naming

const pct = (q) => `p${String(Math.round(q * 1000) / 10).replace('.', '_')}`;

/** Names of every recording rule, derived from params. */
export function names(p) {
  const w = p.window;
  const qs = (base) => Object.fromEntries(p.quantiles.map((q) => [pct(q), `llm_proxy:${base}:${pct(q)}_${w}`]));
  return {
    ttft: qs('ttft_seconds'),
    tpot: qs('tpot_seconds'),
    gap: qs('chunk_gap_seconds'),
    ttftBaseline: `llm_proxy:ttft_seconds:p95_${w}_baseline`,
    tpotBaseline: `llm_proxy:tpot_seconds:p95_${w}_baseline`,
    gapBaseline: `llm_proxy:chunk_gap_seconds:p99_${w}_baseline`,
    tpotObjective: 'llm_proxy:tpot_objective_seconds',
    tpotObjectiveBySeries: 'llm_proxy:tpot_seconds:objective',
    streamsRate: `llm_proxy:streams:rate${w}`,
    tpotRate: `llm_proxy:tpot_requests:rate${w}`,
    ttftRate: `llm_proxy:ttft_requests:rate${w}`,
    errorRatio: `llm_proxy:streams_error:ratio_rate${w}`,
    cancelRatio: `llm_proxy:streams_cancelled:ratio_rate${w}`,
    stallRatio: `llm_proxy:chunk_gap_stall:ratio_rate${w}`,
    tokensRate: `llm_proxy:tokens:rate${w}`,
    loopP99: 'llm_proxy:eventloop_delay_p99_seconds:max',
    loopP99Avg: `llm_proxy:eventloop_delay_p99_seconds:avg${w}`,
  };
}

// ---------------------------------------------------------------- rules

const by = (labels) => labels.join(', ');

/**
 * Selects the bucket whose upper bound is `v`. Prometheus 3 stores integer bounds as floats
 * (le="1" scraped becomes le="1.0"), Prometheus 2 as written: match both, or a rule written for
 * one silently selects nothing on the other.
 */
const leMatcher = (v) => (Number.isInteger(v) ? `le=~"${v}|${v}.0"` : `le="${v}"`);

function sel(p, extra = '') {
  return `{${p.selector}${extra ? `, ${extra}` : ''}}`;
}

function hq(p, q, metric) {
  const w = p.rangeWindow ?? p.window;
  return `histogram_quantile(${q}, sum by (le, ${by(p.groupBy)}) (rate(${metric}_bucket${sel(p)}[${w}])))`;
}

/** A Go-template printf call that fills every MATCH in `exprWithMatchers` with the alert's group labels. */
function labelPrintf(p, exprWithMatchers) {
  const fmt = exprWithMatchers.replaceAll('MATCH', `{${p.groupBy.map((l) => `${l}=%q`).join(',')}}`);
  const count = (exprWithMatchers.match(/MATCH/g) ?? []).length;
  const labelArgs = Array.from({ length: count }, () => p.groupBy.map((l) => `$labels.${l}`).join(' ')).join(' ');
  return `printf \`${fmt}\` ${labelArgs}`;
}

/** A template fragment that runs `expr` (with MATCH replaced by the alert's group labels) and formats the value. */
function tq(p, expr, format) {
  return `{{ with query (${labelPrintf(p, expr)}) }}{{ . | first | value | ${format} }}{{ else }}n/a{{ end }}`;
}

const who = (p) => {
  const parts = [];
  if (p.groupBy.includes('gen_ai_request_model')) parts.push('{{ $labels.gen_ai_request_model }}');
  if (p.groupBy.includes('gen_ai_provider_name')) parts.push('via {{ $labels.gen_ai_provider_name }}');
  if (p.groupBy.includes('server_address')) parts.push('({{ $labels.server_address }})');
  return parts.join(' ');
};

function runbook(p, alert) {
  return `${p.runbookUrl}#${alert.toLowerCase()}`;
}

export function recordingRules(p) {
  const n = names(p);
  const w = p.rangeWindow ?? p.window;
  const g = by(p.groupBy);
  const rules = [];
  for (const [key, metric] of [
    ['ttft', METRICS.ttft],
    ['tpot', METRICS.tpot],
    ['gap', METRICS.gap],
  ]) {
    for (const q of p.quantiles) rules.push({ record: n[key][pct(q)], expr: hq(p, q, metric) });
  }
  const rate = (metric, extra = '') => `sum by (${g}) (rate(${metric}${sel(p, extra)}[${w}]))`;
  rules.push({ record: n.streamsRate, expr: rate(METRICS.streams) });
  rules.push({ record: n.tpotRate, expr: rate(`${METRICS.tpot}_count`) });
  rules.push({ record: n.ttftRate, expr: rate(`${METRICS.ttft}_count`) });
  // `or 0 * all` makes the ratio 0 (not absent) while no stream has failed.
  const ratio = (outcome, extra = '') =>
    `(\n  ${rate(METRICS.streams, `outcome="${outcome}"${extra}`)}\n  or\n  0 * ${rate(METRICS.streams, extra.replace(/^, /, ''))}\n)\n/\n${rate(METRICS.streams, extra.replace(/^, /, ''))}`;
  rules.push({ record: n.errorRatio, expr: ratio('error') });
  // A voice turn the user talks over ends cancelled: normal for those operations, so they are left out.
  const excluded = p.alerts.cancellationRatio.excludeOperations ?? [];
  rules.push({ record: n.cancelRatio, expr: ratio('cancelled', excluded.length > 0 ? `, gen_ai_operation_name!~"${excluded.join('|')}"` : '') });
  rules.push({
    record: n.stallRatio,
    expr: `1 - (\n  ${rate(`${METRICS.gap}_bucket`, leMatcher(p.alerts.stalls.gapSeconds))}\n  /\n  ${rate(`${METRICS.gap}_count`)}\n)`,
  });
  rules.push({
    record: n.tokensRate,
    expr: `sum by (${g}, gen_ai_token_type) (rate(${METRICS.tokens}_sum${sel(p)}[${w}]))`,
  });
  rules.push({
    record: n.loopP99,
    expr: `max by (${by(p.instanceLabels)}) (${METRICS.loopP99}${sel(p)})`,
  });
  // The gauge covers one scrape interval: an alert on single samples is reset by any one quiet
  // scrape, so saturation that comes and goes never fired. Its average over the window is what
  // the alert reads.
  rules.push({
    record: n.loopP99Avg,
    expr: `max by (${by(p.instanceLabels)}) (avg_over_time(${METRICS.loopP99}${sel(p)}[${w}]))`,
  });
  // Baselines: the slower (max) of the same window a day and a week earlier.
  // label_replace keeps the two past series apart until max() merges them;
  // max() ignores a NaN (no traffic then) unless both are NaN.
  // Each past window counts only if it had the traffic the alert asks of now: a few slow
  // requests at night must not set the baseline a real regression is compared with.
  const { day, week } = p.comparison;
  // The traffic is averaged over the alert's `over`, as the alert's own gate reads it now: a past
  // 5m rate tested alone dropped about half the steps of a model at 0.1 req/s from the count.
  // `> 0` drops a past window's NaN (no request in its 5m, while the traffic around it passed the gate).
  const past = (src, rateRule, c, off) =>
    `label_replace(${src} offset ${off} > 0 and on (${g}) avg_over_time(${rateRule}[${c.over}] offset ${off}) >= ${c.minRequestRate}, "baseline", "${off}", "", "")`;
  const baseline = (src, rateRule, c) => `max by (${g}) (\n  ${past(src, rateRule, c, day)}\n  or\n  ${past(src, rateRule, c, week)}\n)`;
  rules.push({ record: n.tpotBaseline, expr: baseline(n.tpot.p95, n.tpotRate, p.alerts.itlRegression) });
  rules.push({ record: n.ttftBaseline, expr: baseline(n.ttft.p95, n.ttftRate, p.alerts.ttftRegression) });
  rules.push({ record: n.gapBaseline, expr: baseline(n.gap.p99, n.streamsRate, p.alerts.itlTailRegression) });
  // Static per-model objectives, then one objective per recorded series:
  // the model's own objective if listed, otherwise the default.
  const o = p.alerts.itlObjective;
  for (const [model, seconds] of Object.entries(o.perModel ?? {})) {
    rules.push({ record: n.tpotObjective, expr: `vector(${seconds})`, labels: { gen_ai_request_model: model } });
  }
  const shape = `0 * ${n.tpotRate}`;
  const perModel = Object.keys(o.perModel ?? {}).length > 0;
  rules.push({
    record: n.tpotObjectiveBySeries,
    expr: perModel
      ? `(\n  ${shape}\n  + on (gen_ai_request_model) group_left ()\n  ${n.tpotObjective}\n)\nor\n(${shape} + ${o.defaultSeconds})`
      : `${shape} + ${o.defaultSeconds}`,
  });
  if (!p.quantiles.includes(0.95)) throw new Error('quantiles must include 0.95 (alerts use p95)');
  return rules;
}

/**
 * Model names past the proxy's cap share one value: its traffic is a changing mix, so it has no
 * baseline to regress from, and a model that moves into it is no outage of `_OTHER`'s.
 * LLMProxyModelCapReached says when the cap is reached.
 */
const NOT_OTHER = '{gen_ai_request_model!="_OTHER"}';

export function alertRules(p) {
  const n = names(p);
  const g = by(p.groupBy);
  const a = p.alerts;
  const on = `on (${g})`;
  const rules = [];
  const common = (name, cfg) => ({
    alert: name,
    for: cfg.for,
    ...(cfg.keepFiringFor !== undefined ? { keep_firing_for: cfg.keepFiringFor } : {}),
    labels: { severity: cfg.severity },
  });
  // The per-process alerts name their proxy by instanceLabels.
  const inst = p.instanceLabels;
  const instWho = inst.map((l) => `{{ $labels.${l} }}`).join('/');

  // "Against the past", judged step by step: the value now above `factor` x its baseline in
  // `share` of the steps of the last `over` (a step without a baseline counts as not slow), with
  // traffic averaged over `over`. An alert that had to stay above the factor for all of `for` was
  // reset by every good 5m window, so a slowdown that came and went (10 minutes in every 15) never
  // paged; and a request rate tested minute by minute opened and closed the gate at its threshold.
  const step = p.subqueryStep ?? '1m';
  /** The number of `step`s in `range`, counted by Prometheus itself (no derived literal). */
  const stepsIn = (range) => `count_over_time(vector(1)[${range}:${step}])`;
  /** The steps of the last `over` at which `now` was above `threshold` (`join`: a vector matching, or none between one series each). */
  const stepsAbove = (c, now, threshold, join = '') => `sum_over_time((${now} > bool ${join}${threshold})[${c.over}:${step}])`;
  const slowSteps = (c, now, base, join = '') => stepsAbove(c, now, `${c.factor} * ${base}`, join);
  // `> 0` drops the NaN p95 of a window without traffic (the alert would fire on with value NaN).
  const byShare = (c, now, threshold, rate, nowFilter = '') =>
    `${now}${nowFilter} > 0\nand ${on}\n` +
    `${stepsAbove(c, now, threshold, `${on} `)}\n  >= ${c.share} * scalar(${stepsIn(c.over)})\n` +
    `and ${on}\navg_over_time(${rate}[${c.over}]) >= ${c.minRequestRate}`;
  const regression = (c, now, base, rate) => byShare(c, now, `${c.factor} * ${base}`, rate, NOT_OTHER);
  /** The figures every alert judged by its share of slow steps ends its description with (`above`: what a slow step is above). */
  const shareFigures = (c, above, slow, rate, what) =>
    `Above ${above} in ${tq(p, slow, 'printf "%.0f"')} of the ` +
    `${tq(p, stepsIn(c.over), 'printf "%.0f"')} ${step} steps of the last ${c.over} ` +
    `(fires from ${Math.round(c.share * 100)} %, at >= ${c.minRequestRate} ${what} averaged over ${c.over}; ` +
    `now ${tq(p, `avg_over_time(${rate}MATCH[${c.over}])`, 'printf "%.2f"')}).`;
  const regressionFigures = (c, now, base, rate, what) =>
    shareFigures(c, `${c.factor}x`, slowSteps(c, `${now}MATCH`, `${base}MATCH`), rate, what);
  const pastWindows = `the slower of the same ${p.window} window ${p.comparison.day} and ${p.comparison.week} earlier`;
  {
    const c = a.itlRegression;
    const name = 'LLMProxyITLRegression';
    rules.push({
      ...common(name, c),
      expr: regression(c, n.tpot.p95, n.tpotBaseline, n.tpotRate),
      annotations: {
        summary: `ITL regression: p95 time per output token of ${who(p)} was ${c.factor}x+ slower than a day and a week earlier for most of the last ${c.over}`,
        description:
          `p95 TPOT of ${who(p)} is {{ $value | humanizeDuration }} per token now ` +
          `(${tq(p, `1 / ${n.tpot.p95}MATCH`, 'printf "%.0f"')} tokens/s), ` +
          `${tq(p, `${n.tpot.p95}MATCH / ${n.tpotBaseline}MATCH`, 'printf "%.2f"')}x its baseline of ` +
          `${tq(p, `${n.tpotBaseline}MATCH`, 'humanizeDuration')} ` +
          `(${tq(p, `1 / ${n.tpotBaseline}MATCH`, 'printf "%.0f"')} tokens/s; ${pastWindows}). ` +
          regressionFigures(c, n.tpot.p95, n.tpotBaseline, n.tpotRate, 'req/s'),
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.itlTailRegression;
    const name = 'LLMProxyITLTailRegression';
    rules.push({
      ...common(name, c),
      expr: regression(c, n.gap.p99, n.gapBaseline, n.streamsRate),
      annotations: {
        summary: `ITL tail regression: p99 inter-chunk gap of ${who(p)} was ${c.factor}x+ longer than a day and a week earlier for most of the last ${c.over}`,
        description:
          `p99 gap between content chunks of ${who(p)} is {{ $value | humanizeDuration }} now, ` +
          `${tq(p, `${n.gap.p99}MATCH / ${n.gapBaseline}MATCH`, 'printf "%.2f"')}x its baseline of ` +
          `${tq(p, `${n.gapBaseline}MATCH`, 'humanizeDuration')} (${pastWindows}); ` +
          `p50 gap ${tq(p, `${n.gap.p50}MATCH`, 'humanizeDuration')}, p95 TPOT ${tq(p, `${n.tpot.p95}MATCH`, 'humanizeDuration')}. ` +
          regressionFigures(c, n.gap.p99, n.gapBaseline, n.streamsRate, 'streams/s'),
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.itlObjective;
    const name = 'LLMProxyITLAboveObjective';
    rules.push({
      ...common(name, c),
      expr: byShare(c, n.tpot.p95, n.tpotObjectiveBySeries, n.tpotRate),
      annotations: {
        summary: `p95 time per output token of ${who(p)} was above its objective for most of the last ${c.over}`,
        description:
          `p95 TPOT of ${who(p)} over ${p.window} is {{ $value | humanizeDuration }} per token now ` +
          `(${tq(p, `1 / ${n.tpot.p95}MATCH`, 'printf "%.0f"')} tokens/s); objective ` +
          `${tq(p, `${n.tpotObjectiveBySeries}MATCH`, 'humanizeDuration')} ` +
          `(${tq(p, `1 / ${n.tpotObjectiveBySeries}MATCH`, 'printf "%.0f"')} tokens/s). ` +
          shareFigures(c, 'it', stepsAbove(c, `${n.tpot.p95}MATCH`, `${n.tpotObjectiveBySeries}MATCH`), n.tpotRate, 'req/s'),
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.ttftRegression;
    const name = 'LLMProxyTTFTRegression';
    rules.push({
      ...common(name, c),
      expr: regression(c, n.ttft.p95, n.ttftBaseline, n.ttftRate),
      annotations: {
        summary: `TTFT regression: p95 time to first token of ${who(p)} was ${c.factor}x+ slower than a day and a week earlier for most of the last ${c.over}`,
        description:
          `p95 TTFT of ${who(p)} is {{ $value | humanizeDuration }} now, ` +
          `${tq(p, `${n.ttft.p95}MATCH / ${n.ttftBaseline}MATCH`, 'printf "%.2f"')}x its baseline of ` +
          `${tq(p, `${n.ttftBaseline}MATCH`, 'humanizeDuration')} (${pastWindows}). ` +
          regressionFigures(c, n.ttft.p95, n.ttftBaseline, n.ttftRate, 'req/s'),
        runbook_url: runbook(p, name),
      },
    });
  }
  for (const [name, c, ratio, what] of [
    ['LLMProxyHighErrorRatio', a.errorRatio, n.errorRatio, 'failed (outcome="error")'],
    ['LLMProxyHighCancellationRatio', a.cancellationRatio, n.cancelRatio, 'were cancelled by the client (outcome="cancelled")'],
  ]) {
    rules.push({
      ...common(name, c),
      expr: `${ratio} > ${c.threshold}\nand ${on}\n${n.streamsRate} >= ${c.minRequestRate}`,
      annotations: {
        summary: `${name === 'LLMProxyHighErrorRatio' ? 'Errors' : 'Cancellations'}: {{ $value | humanizePercentage }} of streams to ${who(p)} ${what}`,
        description:
          `{{ $value | humanizePercentage }} of the streams to ${who(p)} finished in the last ${p.window} ${what}; ` +
          `threshold ${c.threshold * 100}% at >= ${c.minRequestRate} req/s; ` +
          `now ${tq(p, `${n.streamsRate}MATCH`, 'printf "%.2f"')} req/s.`,
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.stalls;
    const name = 'LLMProxyStreamStalls';
    rules.push({
      ...common(name, c),
      expr: `${n.stallRatio} > ${c.threshold}\nand ${on}\n${n.streamsRate} >= ${c.minRequestRate}`,
      annotations: {
        summary: `Stalls: {{ $value | humanizePercentage }} of inter-chunk gaps of ${who(p)} are longer than ${c.gapSeconds}s`,
        description:
          `{{ $value | humanizePercentage }} of the gaps between content chunks of ${who(p)} in the last ${p.window} were longer than ${c.gapSeconds}s ` +
          `(threshold ${c.threshold * 100}%); p99 gap ${tq(p, `${n.gap.p99}MATCH`, 'humanizeDuration')}; ` +
          `${tq(p, `${n.streamsRate}MATCH`, 'printf "%.2f"')} req/s.`,
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.proxySaturated;
    const name = 'LLMProxySaturated';
    const instMatch = `{${inst.map((l) => `${l}=%q`).join(',')}}`;
    const instArgs = inst.map((l) => `$labels.${l}`).join(' ');
    rules.push({
      ...common(name, c),
      expr: `${n.loopP99Avg} > ${c.eventLoopP99Seconds}`,
      annotations: {
        summary: `Proxy ${instWho} is saturated: event-loop delay p99 {{ $value | humanizeDuration }} on average over ${p.window}`,
        description:
          `The p99 event-loop delay of proxy ${instWho} averaged {{ $value | humanizeDuration }} over the last ${p.window} (threshold ${c.eventLoopP99Seconds}s). ` +
          `Every timestamp it takes can be late by that much, so its TTFT/ITL figures are inflated by the proxy itself, not the provider. ` +
          `In-flight requests (also those waiting for the provider): {{ with query (printf \`sum(${METRICS.active}${instMatch})\` ${instArgs}) }}{{ . | first | value | printf "%.0f" }}{{ else }}n/a{{ end }}.`,
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.noData;
    const name = 'LLMProxyModelNoData';
    const needed = `${c.sustainedShare} * scalar(${stepsIn(c.sustained)})`;
    rules.push({
      ...common(name, c),
      // Traffic held for `sustainedShare` of `sustained`, counted in steps, at some point in the last
      // `lookback`: a short batch does not count, a brand-new series cannot reach the count in
      // less time, and short pauses do not reset it. Now none for the model, on this server or
      // another (traffic that moved to another endpoint is not lost).
      expr: `max_over_time(sum_over_time((${n.streamsRate}${NOT_OTHER} >= bool ${c.minRequestRate})[${c.sustained}:${step}])[${c.lookback}:${p.rangeWindow ?? p.window}]) >= ${needed}\nunless on (${by(p.groupBy.filter((l) => l !== 'server_address'))})\n${n.streamsRate} > 0`,
      annotations: {
        summary: `No finished streams for ${who(p)}, which had traffic in the last ${c.lookback}`,
        description:
          `${who(p)} served >= ${c.minRequestRate} req/s in {{ $value }} of the ${step} steps of a ${c.sustained} window within the last ${c.lookback} but no stream of the model finished in the last ${p.window} ` +
          `(or its series disappeared: proxy down, not scraped, or traffic moved elsewhere).`,
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.proxyDown;
    const name = 'LLMProxyDown';
    rules.push({
      ...common(name, c),
      // `up` carries no label of the proxy's own: a target is one if it exported the proxy's
      // event-loop series within `lookback` (any job name; another exporter's target never).
      // Joined on the target's own labels, whatever `instanceLabels` says: `up` is per target,
      // and a pod's other, failing target must not stand for its proxy.
      expr: `up == 0\nand on (job, instance)\nmax_over_time(${METRICS.loopP99}${sel(p)}[${c.lookback}])`,
      annotations: {
        summary: `Proxy metrics target {{ $labels.job }}/{{ $labels.instance }} is down: Prometheus cannot scrape it`,
        description:
          `The scrape of {{ $labels.job }}/{{ $labels.instance }} has failed (up = {{ $value }}) for ${c.for}; it exported the proxy's metrics within the last ${c.lookback} ` +
          `(the proxy itself, or an OpenTelemetry Collector that relays them). Until it is back the latency of the traffic measured there is not seen, and no latency alert can fire for it.`,
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.modelCapReached;
    const name = 'LLMProxyModelCapReached';
    rules.push({
      ...common(name, c),
      expr: `sum by (${by(inst)}) (rate(${METRICS.streams}${sel(p, 'gen_ai_request_model="_OTHER"')}[${p.rangeWindow ?? p.window}])) > 0`,
      annotations: {
        summary: `Proxy ${instWho} counts requests under model _OTHER: its model-name cap is reached`,
        description:
          `{{ $value | printf "%.2f" }} finished streams per second of proxy ${instWho} were counted under gen_ai_request_model="_OTHER" over the last ${p.window}: ` +
          `the proxy had already given metrics.maxModelValues other model names an upstream served their own series since it started (or the names were longer than 128 characters). ` +
          `Their latency reaches no per-model alert, and a model that lands there after a restart pages as LLMProxyModelNoData.`,
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.connectionCapReached;
    const name = 'LLMProxyConnectionCapReached';
    rules.push({
      ...common(name, c),
      expr: `sum by (${by(inst)}) (increase(${METRICS.dropped}${sel(p)}[${p.rangeWindow ?? p.window}])) > 0`,
      annotations: {
        summary: `Proxy ${instWho} closes new client connections unread: it is at its listen.maxConnections`,
        description:
          `{{ $value | printf "%.0f" }} client connections were closed unread by proxy ${instWho} over the last ${p.window}, and some in every ${p.window} window for ${c.for}: it already held listen.maxConnections open. ` +
          `Their clients got no answer (the OpenAI and Anthropic SDKs retry twice within about 1.5 s, then fail), and neither the stream counts nor any other alert include them.`,
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.labelOverflow;
    const name = 'LLMProxyLabelOverflow';
    rules.push({
      ...common(name, c),
      expr: `count by (${by(inst)}) (${sel(p, 'otel_metric_overflow="true"')}) > 0`,
      annotations: {
        summary: `Proxy ${instWho} merges new label sets into one overflow series: alerts cannot see them`,
        description:
          `{{ $value }} series of proxy ${instWho} carry otel_metric_overflow="true": an instrument reached 2,000 label sets, and every new one ` +
          `(a model's first error, a new error type, a new server) is recorded there without its labels, so no per-model alert sees it. It lasts until the proxy restarts.`,
        runbook_url: runbook(p, name),
      },
    });
  }
  {
    const c = a.noMetrics;
    const name = 'LLMProxyNoMetrics';
    rules.push({
      ...common(name, c),
      expr: `absent(${METRICS.loopP99}${sel(p)})`,
      annotations: {
        summary: `No metrics of any proxy match the rules' selector: every other alert is blind`,
        description:
          `absent() has returned {{ $value }} for ${c.for}: Prometheus has no ${METRICS.loopP99} series matching ${p.selector.replaceAll('"', "'")}, ` +
          `which every running proxy exports. Every proxy is down or unscraped, or the OTLP path drops the otel_scope_name label (see the runbook).`,
        runbook_url: runbook(p, name),
      },
    });
  }
  return rules;
}

export function ruleGroups(p) {
  return [
    { name: p.groups.recording, rules: recordingRules(p) },
    { name: p.groups.alerts, rules: alertRules(p) },
  ];
}

const HEADER = [
  '# GENERATED by grafana/build.mjs from grafana/params.yaml. Do not edit by hand:',
  '# change params.yaml (or build.mjs) and run `node grafana/build.mjs`.',
].join('\n');

const yamlOpts = { lineWidth: 0, indent: 2 };

export function renderRulesFile(p) {
  return `${HEADER}\n${YAML.stringify({ groups: ruleGroups(p) }, yamlOpts)}`;
}

export function renderPrometheusRule(p) {
  const doc = {
    apiVersion: 'monitoring.coreos.com/v1',
    kind: 'PrometheusRule',
    metadata: {
      name: 'llm-latency-proxy',
      labels: { 'app.kubernetes.io/name': 'llm-latency-proxy', 'app.kubernetes.io/component': 'alerting' },
    },
    spec: { groups: ruleGroups(p) },
  };
  return `${HEADER}\n${YAML.stringify(doc, yamlOpts)}`;
}

// ---------------------------------------------------------------- dashboard

const DS = { type: 'prometheus', uid: '${datasource}' };

/** A time series with a second unit on the right axis, for the series whose legend matches `rightLegend`. */
function twoAxes(leftUnit, rightLegend, rightUnit) {
  return {
    defaults: { unit: leftUnit, min: 0, custom: { drawStyle: 'line', lineWidth: 1, fillOpacity: 0, showPoints: 'never', spanNulls: false } },
    overrides: [
      {
        matcher: { id: 'byRegexp', options: rightLegend },
        properties: [
          { id: 'unit', value: rightUnit },
          { id: 'custom.axisPlacement', value: 'right' },
        ],
      },
    ],
  };
}

export function dashboardFilters(p) {
  const proc = `${p.selector}, job=~"$job", instance=~"$instance"`;
  const streamLabels = `${proc}, gen_ai_provider_name=~"$provider", server_address=~"$server_address"`;
  return {
    proc,
    active: `${streamLabels}, gen_ai_operation_name=~"$operation"`,
    all: `${streamLabels}, gen_ai_request_model=~"$model", gen_ai_operation_name=~"$operation"`,
    // recording rules keep only the groupBy labels
    recorded: p.groupBy
      .map((l) => ({ gen_ai_provider_name: '$provider', gen_ai_request_model: '$model', gen_ai_operation_name: '$operation', server_address: '$server_address' })[l])
      .map((v, i) => (v ? `${p.groupBy[i]}=~"${v}"` : null))
      .filter(Boolean)
      .join(', '),
  };
}

export function renderDashboard(p) {
  const n = names(p);
  const f = dashboardFilters(p);
  const ri = '$__rate_interval';
  // The series the alerts keep apart (params groupBy: operation and server too), so that "All"
  // does not blend a model's voice turns with its HTTP streams, or one region with another.
  const pm = by(p.groupBy);
  const pmLegend = p.groupBy.map((l) => `{{${l}}}`).join('/');
  let id = 0;
  let y = 0;
  const panels = [];
  let rowX = 0;
  let rowH = 0;
  const row = (title) => {
    y += rowH;
    rowX = 0;
    rowH = 0;
    panels.push({ id: ++id, type: 'row', title, collapsed: false, gridPos: { h: 1, w: 24, x: 0, y }, panels: [] });
    y += 1;
  };
  const target = (expr, legendFormat, extra = {}) => ({ expr, legendFormat, range: true, instant: false, ...extra });
  const panel = ({ title, description, unit, targets, w = 12, h = 8, type = 'timeseries', options, fieldConfig, min }) => {
    if (rowX + w > 24) {
      y += rowH;
      rowX = 0;
      rowH = 0;
    }
    const defaults = fieldConfig?.defaults ?? {
      unit,
      ...(min !== undefined ? { min } : {}),
      custom: { drawStyle: 'line', lineWidth: 1, fillOpacity: 0, showPoints: 'never', spanNulls: false },
    };
    if (!defaults.unit) defaults.unit = unit;
    panels.push({
      id: ++id,
      type,
      title,
      description,
      datasource: DS,
      gridPos: { h, w, x: rowX, y },
      fieldConfig: { defaults, overrides: fieldConfig?.overrides ?? [] },
      options: options ?? {
        legend: { displayMode: 'table', placement: 'bottom', showLegend: true, calcs: ['lastNotNull', 'max'] },
        tooltip: { mode: 'multi', sort: 'desc' },
      },
      targets: targets.map((t, i) => ({ refId: String.fromCharCode(65 + i), datasource: DS, ...t })),
    });
    rowX += w;
    rowH = Math.max(rowH, h);
  };
  const quantiles = (metric, groupLabels, legend, transform = (e) => e, qs = p.quantiles, legendQ = (q) => pct(q)) =>
    qs.map((q) =>
      target(
        transform(`histogram_quantile(${q}, sum by (le, ${groupLabels}) (rate(${metric}_bucket{${f.all}}[${ri}])))`),
        `${legendQ(q)} ${legend}`,
      ),
    );
  const streamRate = (extra) => `sum by (${pm}) (rate(${METRICS.streams}{${f.all}${extra}}[${ri}]))`;
  const ratioExpr = (outcome) =>
    `(${streamRate(`, outcome="${outcome}"`)} or 0 * ${streamRate('')}) / ${streamRate('')}`;

  row('Traffic');
  panel({
    title: 'Request rate by model (req/s)',
    description: `Finished measured streams per second (${METRICS.streams}, all outcomes), per provider/model. A stream is counted when it ends: completed, failed or cancelled.`,
    unit: 'reqps',
    w: 8,
    targets: [target(streamRate(''), pmLegend)],
  });
  panel({
    title: 'Output token rate by model (tokens/s)',
    description: `Output tokens per second summed over all streams (rate of ${METRICS.tokens}_sum{gen_ai_token_type="output"}): the aggregate throughput the providers deliver, not the speed of one stream.`,
    unit: 'suffix: tok/s',
    w: 8,
    targets: [
      target(
        `sum by (${pm}) (rate(${METRICS.tokens}_sum{${f.all}, gen_ai_token_type="output"}[${ri}]))`,
        pmLegend,
      ),
    ],
  });
  panel({
    title: 'Error and cancellation ratio (% of streams)',
    description: `Share of finished streams per provider/model whose outcome was "error" (upstream failure, HTTP error, in-band error event, timeout) or "cancelled" (the client went away), from ${METRICS.streams}{outcome}. Shows 0 while nothing failed.`,
    unit: 'percentunit',
    w: 8,
    min: 0,
    targets: [target(ratioExpr('error'), `error ${pmLegend}`), target(ratioExpr('cancelled'), `cancelled ${pmLegend}`)],
  });
  panel({
    title: 'Failed requests by error_type (req/s)',
    description: `Requests per second that ended with an error_type label on ${METRICS.duration} (client_cancelled, upstream_reset, timeout, upstream_unreachable, proxy_out_of_resources, upstream_protocol_error, an HTTP status, or the provider's in-band error type).`,
    unit: 'reqps',
    w: 12,
    h: 7,
    targets: [
      target(
        `sum by (gen_ai_request_model, error_type) (rate(${METRICS.duration}_count{${f.all}, error_type!=""}[${ri}]))`,
        '{{gen_ai_request_model}} {{error_type}}',
      ),
    ],
  });
  const meanDuration = (sel, labels) =>
    `sum by (${labels}) (rate(${METRICS.duration}_sum{${f.all}, ${sel}}[${ri}])) / sum by (${labels}) (rate(${METRICS.duration}_count{${f.all}, ${sel}}[${ri}]))`;
  panel({
    title: 'Mean request duration: completed, and by error_type (seconds)',
    description: `Mean duration (${METRICS.duration}, request arrival to the last byte, the failure or the cancellation) of the requests that ended without an error_type, per provider/model, and of the failed or cancelled ones per error_type. Cancelled requests whose mean sits at a round figure (2 s, 30 s, 60 s) are mostly one client's timeout giving up; a timeout error sits at timeouts.response. A mean, not a quantile: the histogram's doubling buckets would put a 10 s timeout at 7.7 s.`,
    unit: 's',
    min: 0,
    w: 12,
    h: 7,
    targets: [
      target(meanDuration('error_type=""', pm), `completed ${pmLegend}`),
      target(meanDuration('error_type!=""', 'gen_ai_request_model, error_type'), '{{gen_ai_request_model}} {{error_type}}'),
    ],
  });

  row('Latency');
  panel({
    title: 'TTFT p50 / p95 / p99 by model (seconds)',
    description: `Time to first token: arrival at the proxy of the first content-bearing event minus the request's arrival at the proxy (${METRICS.ttft}). Quantiles estimated from histogram buckets over $__rate_interval.`,
    unit: 's',
    targets: quantiles(METRICS.ttft, pm, pmLegend),
  });
  panel({
    title: 'Per-request ITL (TPOT) p50 / p95 / p99 by model (seconds per token)',
    description: `Time per output token of one request: (last content event - first content event) / (output tokens - 1), recorded once per successful request (outcome ok) with >= 2 output tokens (${METRICS.tpot}). The distribution is over requests.`,
    unit: 's',
    targets: quantiles(METRICS.tpot, pm, pmLegend),
  });
  panel({
    title: 'Per-request output speed p50 / p5 / p1 by model (tokens/s = 1/TPOT)',
    description:
      'The TPOT quantiles expressed as output tokens per second of one stream: 1 / TPOT. Inversion flips the order, so p50 TPOT is p50 speed, p95 TPOT is p5 speed (the slowest 5% of requests are at or below it) and p99 TPOT is p1 speed.',
    unit: 'suffix: tok/s',
    targets: quantiles(
      METRICS.tpot,
      pm,
      pmLegend,
      (e) => `1 / ${e}`,
      p.quantiles,
      (q) => `${pct(Math.round((1 - q) * 1000) / 1000)} speed (${pct(q)} TPOT)`,
    ),
  });
  panel({
    title: 'Inter-chunk gap distribution (heatmap, seconds)',
    description: `Every gap between consecutive content chunks as seen by the proxy (${METRICS.gap}, one sample per gap), bucketed by the histogram's boundaries; a cell's colour is gaps per second in that bucket. Stalls show as cells far above the main band.`,
    unit: 's',
    type: 'heatmap',
    fieldConfig: { defaults: { unit: 's', custom: { hideFrom: { legend: false, tooltip: false, viz: false } } } },
    options: {
      calculate: false,
      cellGap: 1,
      color: { mode: 'scheme', scheme: 'Oranges', exponent: 0.5, fill: 'dark-orange', reverse: false, steps: 64 },
      exemplars: { color: 'rgba(255,0,255,0.7)' },
      filterValues: { le: 1e-9 },
      legend: { show: true },
      rowsFrame: { layout: 'auto' },
      tooltip: { show: true, yHistogram: true },
      yAxis: { axisPlacement: 'left', reverse: false, unit: 's' },
      cellValues: { unit: 'reqps' },
    },
    targets: [
      // rate, not increase: the query runs every $__interval over $__rate_interval, windows that
      // overlap, so increase() counted each gap in several cells.
      target(`sum by (le) (rate(${METRICS.gap}_bucket{${f.all}}[${ri}]))`, '{{le}}', { format: 'heatmap' }),
    ],
  });
  panel({
    title: `Stalls: share of inter-chunk gaps longer than ${p.alerts.stalls.gapSeconds}s (%)`,
    description: `Share of gaps between content chunks (${METRICS.gap}) above ${p.alerts.stalls.gapSeconds} s, per provider/model: 1 - rate(bucket ${leMatcher(p.alerts.stalls.gapSeconds)}) / rate(count).`,
    unit: 'percentunit',
    w: 8,
    min: 0,
    targets: [
      target(
        `1 - (sum by (${pm}) (rate(${METRICS.gap}_bucket{${f.all}, ${leMatcher(p.alerts.stalls.gapSeconds)}}[${ri}])) / sum by (${pm}) (rate(${METRICS.gap}_count{${f.all}}[${ri}])))`,
        pmLegend,
      ),
    ],
  });
  panel({
    title: 'Inter-chunk gap p50 / p95 / p99 by model (seconds)',
    description: `Quantiles of every gap between consecutive content chunks (${METRICS.gap}). Unlike TPOT this is per gap, so a single long stall moves p99 here while barely moving TPOT.`,
    unit: 's',
    w: 8,
    targets: quantiles(METRICS.gap, pm, pmLegend),
  });
  panel({
    title: 'Client-paced streams (% of streams)',
    description: `Share of finished streams per provider/model whose client did not take the bytes as fast as the provider sent them, so that the proxy paused reading the upstream for 100 ms or more (${METRICS.clientPaced} / ${METRICS.streams}). From that pause on, a stream's arrival times show the client's pace (a browser, a speech pipeline paced to playback, a slow network to the client), so its later gaps and its TPOT are left out of the latency histograms; its duration still holds the pause. A rise here means fewer of those streams' tokens in the ITL panels. Shows 0 while no client held a stream back.`,
    unit: 'percentunit',
    w: 8,
    min: 0,
    targets: [
      target(`(sum by (${pm}) (rate(${METRICS.clientPaced}{${f.all}}[${ri}])) or 0 * ${streamRate('')}) / ${streamRate('')}`, pmLegend),
    ],
  });

  row('Regression: now vs a day and a week earlier (the alert inputs)');
  const rec = `{${f.recorded}}`;
  const legend = p.groupBy.map((l) => `{{${l}}}`).join(' ');
  panel({
    title: `p95 TPOT now vs ${p.comparison.day} and ${p.comparison.week} earlier (seconds per token)`,
    description: `Recorded ${n.tpot.p95} (p95 time per output token per ${p.groupBy.join('/')}, ${p.window} window) now, the same window ${p.comparison.day} and ${p.comparison.week} earlier, the regression alert's threshold (${p.alerts.itlRegression.factor} x the slower of the two) and the absolute objective. Filtered by ${p.groupBy.join('/')} only: recording rules aggregate job and instance away.`,
    unit: 's',
    targets: [
      target(`${n.tpot.p95}${rec}`, `now ${legend}`),
      target(`${n.tpot.p95}${rec} offset ${p.comparison.day}`, `${p.comparison.day} ago ${legend}`),
      target(`${n.tpot.p95}${rec} offset ${p.comparison.week}`, `${p.comparison.week} ago ${legend}`),
      target(`${p.alerts.itlRegression.factor} * ${n.tpotBaseline}${rec}`, `regression threshold ${legend}`),
      target(`${n.tpotObjectiveBySeries}${rec}`, `objective ${legend}`),
    ],
  });
  panel({
    title: `p95 TTFT now vs ${p.comparison.day} and ${p.comparison.week} earlier (seconds)`,
    description: `Recorded ${n.ttft.p95} (p95 time to first token, ${p.window} window) now and the same window ${p.comparison.day} and ${p.comparison.week} earlier, with the TTFT regression alert's threshold (${p.alerts.ttftRegression.factor} x the slower of the two). Filtered by ${p.groupBy.join('/')} only.`,
    unit: 's',
    targets: [
      target(`${n.ttft.p95}${rec}`, `now ${legend}`),
      target(`${n.ttft.p95}${rec} offset ${p.comparison.day}`, `${p.comparison.day} ago ${legend}`),
      target(`${n.ttft.p95}${rec} offset ${p.comparison.week}`, `${p.comparison.week} ago ${legend}`),
      target(`${p.alerts.ttftRegression.factor} * ${n.ttftBaseline}${rec}`, `regression threshold ${legend}`),
    ],
  });
  panel({
    title: `p99 inter-chunk gap now vs ${p.comparison.day} and ${p.comparison.week} earlier (seconds)`,
    description: `Recorded ${n.gap.p99} (p99 of every gap between content chunks, ${p.window} window) now and the same window ${p.comparison.day} and ${p.comparison.week} earlier, with the ITL tail alert's threshold (${p.alerts.itlTailRegression.factor} x the slower of the two). A tail that slows while TPOT holds shows here only. Filtered by ${p.groupBy.join('/')} only.`,
    unit: 's',
    targets: [
      target(`${n.gap.p99}${rec}`, `now ${legend}`),
      target(`${n.gap.p99}${rec} offset ${p.comparison.day}`, `${p.comparison.day} ago ${legend}`),
      target(`${n.gap.p99}${rec} offset ${p.comparison.week}`, `${p.comparison.week} ago ${legend}`),
      target(`${p.alerts.itlTailRegression.factor} * ${n.gapBaseline}${rec}`, `regression threshold ${legend}`),
    ],
  });

  row('Proxy health (is the proxy itself the bottleneck?)');
  panel({
    title: 'In-flight streams and open client connections (count), and connections closed at the cap (per second, right axis)',
    description: `Requests currently in flight through the proxy (${METRICS.active}, an up-down counter), from their arrival (also while the upstream has not answered: requests that hang pile up here) to their end, per provider, operation (a Realtime or Live response counts while it is being answered) and upstream server_address. Open client connections (${METRICS.open}), per instance: those with a request in flight, idle ones kept alive between requests and WebSocket tunnels; listen.maxConnections caps them. Right axis, only for proxies with that cap set: client connections closed unread because the proxy already held that many open (rate of ${METRICS.dropped}); their clients got no answer and retried or failed, and no stream series shows them. Above 0, the proxy is at its cap: add replicas or raise it.`,
    fieldConfig: twoAxes('short', '^closed at cap', 'cps'),
    targets: [
      target(
        `sum by (gen_ai_provider_name, gen_ai_operation_name, server_address) (${METRICS.active}{${f.active}})`,
        '{{gen_ai_provider_name}} {{gen_ai_operation_name}} {{server_address}}',
      ),
      target(`sum by (instance) (${METRICS.open}{${f.proc}})`, 'open connections {{instance}}'),
      target(`sum by (instance) (rate(${METRICS.dropped}{${f.proc}}[${ri}]))`, 'closed at cap {{instance}}'),
    ],
  });
  panel({
    title: 'New upstream connections: set-up p50 / p99 (seconds), and opened per second (right axis)',
    description: `Connections the proxy opened to each upstream (${METRICS.connect}: from the start of connecting, name lookup included, until TCP is up and TLS done, through an egress proxy's tunnel when there is one). The request that opened a connection waited for it inside its TTFT, so a TTFT rise together with a rise here is connection set-up (a cold pool after a restart, an upstream or a load balancer closing idle connections, DNS or TLS slowness), not the provider's model; requests on pooled connections do not pay it. Right axis: connections opened per second; steady traffic should reuse connections and open few.`,
    fieldConfig: twoAxes('s', '^opened', 'cps'),
    targets: [
      target(`histogram_quantile(0.5, sum by (le, server_address) (rate(${METRICS.connect}_bucket{${f.proc}, server_address=~"$server_address"}[${ri}])))`, 'p50 {{server_address}}'),
      target(`histogram_quantile(0.99, sum by (le, server_address) (rate(${METRICS.connect}_bucket{${f.proc}, server_address=~"$server_address"}[${ri}])))`, 'p99 {{server_address}}'),
      target(`sum by (server_address) (rate(${METRICS.connect}_count{${f.proc}, server_address=~"$server_address"}[${ri}]))`, 'opened {{server_address}}'),
    ],
  });
  panel({
    title: 'Proxy event-loop delay p50 / p99 / max (seconds)',
    description: `The proxy process's own event-loop delay (${METRICS.loopP50}, _p99_, _max_). Every timestamp the proxy takes can be late by this much; when p99 is high the proxy, not the provider, inflates TTFT/ITL. Alert threshold: p99 > ${p.alerts.proxySaturated.eventLoopP99Seconds}s.`,
    unit: 's',
    min: 0,
    targets: [
      target(`${METRICS.loopP50}{${f.proc}}`, 'p50 {{instance}}'),
      target(`${METRICS.loopP99}{${f.proc}}`, 'p99 {{instance}}'),
      target(`${METRICS.loopMax}{${f.proc}}`, 'max {{instance}}'),
    ],
  });
  panel({
    title: 'Proxy CPU and event-loop utilisation (100% = one core / a loop always busy)',
    description: `CPU used by the proxy process (rate of ${METRICS.cpu}, user + system: 100% is one core; more means its helper threads, GC and I/O, work too) and the share of time its event loop was running callbacks (rate of ${METRICS.loopTime} active). A loop near 100% is saturated: it cannot take a timestamp on time, and its TTFT/ITL figures run late; scale out. CPU far below the loop's share points at CPU throttling or a noisy neighbour.`,
    unit: 'percentunit',
    min: 0,
    w: 8,
    targets: [
      target(`sum by (job, instance) (rate(${METRICS.cpu}{${f.proc}}[${ri}]))`, 'CPU {{instance}}'),
      target(`sum by (job, instance) (rate(${METRICS.loopTime}{${f.proc}, nodejs_eventloop_state="active"}[${ri}]))`, 'event loop busy {{instance}}'),
    ],
  });
  panel({
    title: 'Proxy memory: resident and V8 heap in use (bytes)',
    description: `Resident memory of the proxy process (${METRICS.rss}: the heap, the buffers of streams in flight, the code) and the V8 heap in use (${METRICS.heapUsed}, all spaces). Resident memory rises with in-flight streams (a few tens of KiB per open stream) and then stays near its high-water mark, as freed memory is kept for reuse; a leak is heap in use that keeps rising across collections with a flat stream count.`,
    unit: 'bytes',
    min: 0,
    w: 8,
    targets: [
      target(`sum by (job, instance) (${METRICS.rss}{${f.proc}})`, 'resident {{instance}}'),
      target(`sum by (job, instance) (${METRICS.heapUsed}{${f.proc}})`, 'heap in use {{instance}}'),
    ],
  });
  panel({
    title: 'Proxy GC: share of time paused, and p99 pause (seconds, right axis)',
    description: `Garbage collection in the proxy process (${METRICS.gc}). The event loop waits during a pause, so a pause of 20 ms delays every event in flight by up to 20 ms: it shows as a gap in the ITL of every stream at once. Left axis: share of time spent in GC, by kind (minor = scavenge, major = mark-compact's final pause, incremental = the start of marking); right axis: p99 pause. V8's incremental-marking steps between those are not reported by Node: with a large heap they show only in the event-loop delay.`,
    w: 8,
    fieldConfig: twoAxes('percentunit', '^p99 pause', 's'),
    targets: [
      target(`sum by (job, instance, v8js_gc_type) (rate(${METRICS.gc}_sum{${f.proc}}[${ri}]))`, 'in GC {{v8js_gc_type}} {{instance}}'),
      target(`histogram_quantile(0.99, sum by (le, job, instance) (rate(${METRICS.gc}_bucket{${f.proc}}[${ri}])))`, 'p99 pause {{instance}}'),
    ],
  });

  row('Token usage');
  panel({
    title: 'Token usage rate, input and output (tokens/s)',
    description: `Tokens per second by model and gen_ai_token_type (input = prompt tokens, output = completion tokens) from ${METRICS.tokens}_sum; counts come from the provider's usage block when present, otherwise from counted content events. Other types some providers report (e.g. cached input, reasoning) are subsets of input/output: do not add them up.`,
    unit: 'suffix: tok/s',
    targets: [
      target(
        `sum by (gen_ai_request_model, gen_ai_token_type) (rate(${METRICS.tokens}_sum{${f.all}}[${ri}]))`,
        '{{gen_ai_request_model}} {{gen_ai_token_type}}',
      ),
    ],
  });
  panel({
    title: 'Tokens per request p50 / p95, input and output (tokens)',
    description: `Distribution of tokens per request (${METRICS.tokens} histogram) by model and token type; buckets are powers of 4, so these are coarse estimates.`,
    unit: 'short',
    targets: [0.5, 0.95].map((q) =>
      target(
        `histogram_quantile(${q}, sum by (le, gen_ai_request_model, gen_ai_token_type) (rate(${METRICS.tokens}_bucket{${f.all}}[${ri}])))`,
        `${pct(q)} {{gen_ai_request_model}} {{gen_ai_token_type}}`,
      ),
    ),
  });
  panel({
    title: 'Tokens in the selected time range, input and output (tokens)',
    description: `Total tokens over the dashboard's time range (increase of ${METRICS.tokens}_sum over $__range) by token type; types other than input/output are subsets of those two.`,
    unit: 'short',
    type: 'stat',
    w: 24,
    h: 5,
    options: {
      reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
      orientation: 'auto',
      textMode: 'value_and_name',
      colorMode: 'none',
      graphMode: 'none',
      justifyMode: 'auto',
    },
    fieldConfig: { defaults: { unit: 'short', decimals: 0 } },
    targets: [
      target(
        `sum by (gen_ai_token_type) (increase(${METRICS.tokens}_sum{${f.all}}[$__range]))`,
        '{{gen_ai_token_type}}',
        { instant: true, range: false },
      ),
    ],
  });

  const queryVar = (name, label, query, description) => ({
    name,
    label,
    description,
    type: 'query',
    datasource: DS,
    definition: query,
    query: { query, refId: 'PrometheusVariableQueryEditor-VariableQuery' },
    includeAll: true,
    multi: true,
    allValue: '.*',
    current: { selected: true, text: ['All'], value: ['$__all'] },
    refresh: 2,
    regex: '',
    sort: 1,
    hide: 0,
    options: [],
  });
  const templating = {
    list: [
      {
        name: 'datasource',
        label: 'Prometheus',
        type: 'datasource',
        query: 'prometheus',
        current: {},
        hide: 0,
        refresh: 1,
        regex: '',
        options: [],
      },
      queryVar('job', 'job', `label_values(${METRICS.loopP99}{${p.selector}}, job)`, 'Scrape job of the proxy'),
      queryVar(
        'instance',
        'instance',
        `label_values(${METRICS.loopP99}{${p.selector}, job=~"$job"}, instance)`,
        'Scraped proxy instance',
      ),
      queryVar(
        'provider',
        'provider',
        `label_values(${METRICS.streams}{${f.proc}}, gen_ai_provider_name)`,
        'gen_ai_provider_name',
      ),
      queryVar(
        'model',
        'model',
        `label_values(${METRICS.streams}{${f.proc}, gen_ai_provider_name=~"$provider"}, gen_ai_request_model)`,
        'gen_ai_request_model (the model the client asked for)',
      ),
      queryVar(
        'operation',
        'operation',
        `label_values(${METRICS.streams}{${f.proc}, gen_ai_provider_name=~"$provider"}, gen_ai_operation_name)`,
        'gen_ai_operation_name (chat, text_completion, generate_content; realtime: the responses of WebSocket voice sessions)',
      ),
      queryVar(
        'server_address',
        'server_address',
        `label_values(${METRICS.streams}{${f.proc}, gen_ai_provider_name=~"$provider"}, server_address)`,
        'Upstream host',
      ),
    ],
  };
  const dashboard = {
    __requires: [
      { type: 'grafana', id: 'grafana', name: 'Grafana', version: '10.0.0' },
      { type: 'datasource', id: 'prometheus', name: 'Prometheus', version: '1.0.0' },
      { type: 'panel', id: 'timeseries', name: 'Time series', version: '' },
      { type: 'panel', id: 'heatmap', name: 'Heatmap', version: '' },
      { type: 'panel', id: 'stat', name: 'Stat', version: '' },
    ],
    annotations: {
      list: [
        {
          builtIn: 1,
          datasource: { type: 'grafana', uid: '-- Grafana --' },
          enable: true,
          hide: true,
          iconColor: 'rgba(0, 211, 255, 1)',
          name: 'Annotations & Alerts',
          type: 'dashboard',
        },
      ],
    },
    description:
      'LLM latency measured by llm-latency-proxy: TTFT, per-request ITL (TPOT), inter-chunk gaps, errors, and whether the proxy itself is saturated. GENERATED by grafana/build.mjs from grafana/params.yaml.',
    editable: true,
    fiscalYearStartMonth: 0,
    graphTooltip: 1,
    id: null,
    links: [],
    panels,
    refresh: '30s',
    schemaVersion: 39,
    tags: ['llm', 'latency', 'llm-latency-proxy'],
    templating,
    time: { from: 'now-6h', to: 'now' },
    timepicker: {},
    timezone: '',
    title: 'LLM latency proxy: TTFT and inter-token latency',
    uid: DASHBOARD_UID,
    version: 1,
    weekStart: '',
  };
  return `${JSON.stringify(dashboard, null, 2)}\n`;
}

// ---------------------------------------------------------------- helpers for tests

/** Every query target of a dashboard (rows' nested panels included), with its panel. */
export function dashboardTargets(dashboard) {
  const out = [];
  const visit = (panels) => {
    for (const panel of panels ?? []) {
      if (panel.type === 'row') visit(panel.panels);
      else for (const target of panel.targets ?? []) out.push({ panel, target });
    }
  };
  visit(dashboard.panels);
  return out;
}

/**
 * Replaces Grafana variables in a query: `vars` maps a name (without `$`) to its
 * text, e.g. { provider: '.*', __rate_interval: '10s' }. Unknown variables are
 * left in place so a test can detect them.
 */
export function expandDashboardExpr(expr, vars) {
  const keys = Object.keys(vars).sort((a, b) => b.length - a.length);
  let out = expr;
  for (const k of keys) {
    out = out.replaceAll(`\${${k}}`, vars[k]).replace(new RegExp(`\\$${k}(?![A-Za-z0-9_])`, 'g'), () => vars[k]);
  }
  return out;
}

// ---------------------------------------------------------------- main

export function renderAll(p) {
  return {
    [OUTPUT_FILES.rules]: renderRulesFile(p),
    [OUTPUT_FILES.prometheusRule]: renderPrometheusRule(p),
    [OUTPUT_FILES.dashboard]: renderDashboard(p),
  };
}

/** Files (relative to grafana/) whose committed content differs from a fresh render. */
export function staleFiles(p = loadParams(), dir = GRAFANA_DIR) {
  const stale = [];
  for (const [rel, content] of Object.entries(renderAll(p))) {
    let current = null;
    try {
      current = readFileSync(join(dir, rel), 'utf8');
    } catch {
      current = null;
    }
    if (current !== content) stale.push(rel);
  }
  return stale;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const params = loadParams();
  if (process.argv.includes('--check')) {
    const stale = staleFiles(params);
    if (stale.length > 0) {
      console.error(`stale (run node grafana/build.mjs): ${stale.map((f) => `grafana/${f}`).join(', ')}`);
      process.exit(1);
    }
    console.log('grafana/: rendered files are current');
  } else {
    for (const [rel, content] of Object.entries(renderAll(params))) {
      const file = join(GRAFANA_DIR, rel);
      mkdirSync(dirname(file), { recursive: true });
      writeFileSync(file, content);
      console.log(`wrote ${relative(process.cwd(), file)}`);
    }
  }
}
