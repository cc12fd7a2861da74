// What the bench reads from a path's /metrics (Prometheus text format): the histograms it checks
// the proxy's accuracy by, and the proxy's own runtime figures over a run.

const SERIES = Symbol('series');

/**
 * Every sample summed per metric name (over its label sets), and the label sets of the runtime
 * series kept apart (read per GC kind and bucket by runtimeDiff).
 */
export function parseMetrics(text) {
  const out = {};
  const series = (out[SERIES] = []); // [name, labels, value]
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const v = Number(m[3]);
    if (!Number.isFinite(v)) continue;
    out[m[1]] = (out[m[1]] || 0) + v;
    if (m[2] !== undefined && (m[1].startsWith('v8js_gc_duration_seconds') || m[1].startsWith('nodejs_eventloop_delay'))) series.push([m[1], m[2], v]);
  }
  return out;
}

const HISTS = {
  ttft: 'gen_ai_client_operation_time_to_first_chunk_seconds',
  itl: 'gen_ai_client_operation_time_per_output_chunk_seconds',
  tpot: 'gen_ai_server_time_per_output_token_seconds',
};

/** The accuracy histograms' sum and count over a run: the difference of two scrapes. */
export function metricsDiff(a, b) {
  if (!a || !b || a.error || b.error) return { error: (a && a.error) || (b && b.error) || 'no scrape' };
  const d = {};
  for (const [k, name] of Object.entries(HISTS)) {
    const sum = (b[`${name}_sum`] ?? NaN) - (a[`${name}_sum`] ?? 0);
    const count = (b[`${name}_count`] ?? NaN) - (a[`${name}_count`] ?? 0);
    d[k] = { sumS: sum, count };
  }
  // Streams whose client held the proxy back: their content from then on is not in the histograms.
  const held = 'llm_proxy_streams_client_paced_total';
  d.held = (b[held] ?? 0) - (a[held] ?? 0);
  return d;
}

/**
 * The proxy's own view of a run, from its runtime metrics: the longest event-loop delay it sampled
 * (the gauge's window is the time since the previous scrape by this reader: the run, with the
 * waits before and after it that lie between the two scrapes), and its
 * GC pauses by kind: how many, their total, and the bucket bound of the longest. It tells a run
 * slowed by the proxy's own stalls from one slowed by something else. Node reports a major
 * collection's final pause, not V8's incremental-marking steps: those show only as loop delay.
 * Undefined when either scrape failed or did not come from parseMetrics.
 */
export function runtimeDiff(a, b) {
  if (!a || !b || a.error || b.error || !a[SERIES] || !b[SERIES]) return undefined;
  const label = (labels, name) => new RegExp(`[{,]${name}="([^"]*)"`).exec(labels)?.[1];
  const gc = {};
  const buckets = new Map(); // le -> pauses of the run at or below it, every kind
  const add = (rows, sign) => {
    for (const [name, labels, v] of rows) {
      const kind = label(labels, 'v8js_gc_type');
      if (kind === undefined) continue;
      const g = (gc[kind] ||= { count: 0, sumMs: 0 });
      if (name === 'v8js_gc_duration_seconds_count') g.count += sign * v;
      else if (name === 'v8js_gc_duration_seconds_sum') g.sumMs += sign * v * 1000;
      else if (name === 'v8js_gc_duration_seconds_bucket') {
        // "+Inf" reads as NaN and is left out: a pause past the last bound leaves the longest unset.
        const le = Number(label(labels, 'le'));
        if (!Number.isNaN(le)) buckets.set(le, (buckets.get(le) ?? 0) + sign * v);
      }
    }
  };
  add(a[SERIES], -1);
  add(b[SERIES], 1);
  // Fewer pauses after than before: another process answered the second scrape (a restart).
  if (Object.values(gc).some((g) => g.count < 0)) return undefined;
  for (const k of Object.keys(gc)) if (gc[k].count === 0) delete gc[k];
  const total = Object.values(gc).reduce((s, g) => s + g.count, 0);
  const les = [...buckets.keys()].sort((x, y) => x - y);
  const longest = total > 0 ? les.find((le) => buckets.get(le) >= total) : undefined;
  const ms = (n) => (b[`nodejs_eventloop_delay_${n}_seconds`] === undefined ? undefined : b[`nodejs_eventloop_delay_${n}_seconds`] * 1000);
  return { loopDelayMaxMs: ms('max'), loopDelayP99Ms: ms('p99'), gc, gcLongestAtMostMs: longest === undefined ? undefined : longest * 1000 };
}

/** runtimeDiff's GC pauses by kind, as the log line and the report write them. */
export function fmtGc(gc) {
  return Object.entries(gc).map(([k, g]) => `${k} ${g.count} (${g.sumMs.toFixed(1)} ms)`).join(', ') || 'none';
}

/** runtimeDiff's figures for a log line ('' without them). */
export function fmtRuntime(rt) {
  if (!rt) return '';
  const gc = fmtGc(rt.gc);
  const longest = rt.gcLongestAtMostMs === undefined ? '' : `, longest ≤ ${rt.gcLongestAtMostMs} ms`;
  return ` | its loop delay max ${rt.loopDelayMaxMs?.toFixed(1) ?? '?'} ms, GC ${gc}${longest}`;
}
