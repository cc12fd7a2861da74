// The README's benchmark section, rendered from a run's results rather than typed from them.
//
// summarize(results) keeps the few hundred figures the README shows (a results file is ~800 KB,
// a summary ~50 KB, small enough to keep for every full run in bench/results/runs/ and to put a
// past run beside the latest in brackets). renderBlock(summary, bracket) writes the Markdown
// between the README's markers; bench/readme.mjs writes or checks it, and a unit test fails when
// the README and bench/results/latest.json disagree.

import { fmt } from './stats.mjs';

const PATHS = ['proxy', 'proxy-nometrics', 'nginx', 'http-proxy', 'portkey'];
const HEAD = { proxy: 'this proxy', 'proxy-nometrics': 'metrics off', nginx: 'nginx (1 worker)', 'http-proxy': 'http-proxy', portkey: 'Portkey' };

/** An aggregate as measured: values are rounded once, where they are shown (rounding here too moved some). */
const slim = (a) => (a && Number.isFinite(a.median) ? { median: a.median, min: a.min, max: a.max, n: a.n } : null);
const raw = (x) => (Number.isFinite(x) ? x : null);
const pick = (obj, keys, f = slim) => Object.fromEntries(keys.filter((k) => obj?.[k] !== undefined).map((k) => [k, f(obj[k])]));

/** The README's figures from a results file (bench/results/latest.json). */
export function summarize(results) {
  const { meta, figures: F, targets } = results;
  if (!meta || !F || !Array.isArray(targets)) throw new Error('not a bench results file (meta, figures and targets expected)');
  const ran = PATHS.filter((p) => meta.paths?.[p]?.ok);
  const per = (obj, f, names = ran) => Object.fromEntries(names.filter((p) => obj?.[p]).map((p) => [p, f(obj[p])]));
  const foreign = (results.runs ?? []).map((r) => r.foreignCores).filter(Number.isFinite);
  return {
    version: 1,
    meta: {
      date: meta.date,
      mode: meta.mode,
      reps: meta.reps,
      durationS: Math.round(meta.durationS),
      commit: meta.commit ?? null,
      node: meta.node,
      cpus: meta.cpus,
      cpuModel: meta.cpuModel,
      memGiB: meta.memGiB,
      kernel: meta.kernel,
      paths: ran,
      ttftRequests: meta.plan?.ttft?.find((t) => t.sequential)?.count ?? null,
      memRamp: meta.plan?.mem ? [meta.plan.mem.n1, meta.plan.mem.n2] : null,
      sustainMs: meta.plan?.sustainMs ?? null,
      phases: meta.phases ?? null,
      foreignCoresMax: foreign.length ? Math.max(...foreign) : null,
    },
    ttft: Object.fromEntries(
      // direct too: its legs are the floor the others' are read against
      Object.entries(F.ttft).map(([k, byP]) => [k, per(byP, (x) => pick(x, ['addedP50', 'addedP99', 'requestLegP50', 'responseLegP50', 'requestLegsStalled', 'requests']), ['direct', ...ran])]),
    ),
    gap: Object.fromEntries(Object.entries(F.gap).map(([k, byP]) => [k, per(byP, (x) => pick(x, ['addedP50', 'addedP99']))])),
    sustained: per(F.sustained, (x) => ({ streams: slim(x.streams), reachedTopLevel: x.reachedTopLevel })),
    eventsPerCoreSecond: {
      scenario: F.eventsPerCoreSecond?.proxy?.scenario ?? null,
      ...per(F.eventsPerCoreSecond, (x) => pick(x, ['value', 'steady'])),
    },
    memory: per(F.memory, (x) => pick(x, ['rssPerStreamKiB', 'youngPerStreamKiB', 'rssSecondRampKiB', 'heapPerStreamKiB'])),
    cancellation: per(F.cancellation, (x) => ({ p99: slim(x.p99), notClosed: x.notClosed })),
    integrity: per(F.integrity, (x) => ({ ...x })),
    metricsCost: {
      busiest: F.metricsCost?.busiest?.scenario ?? null,
      scenarios: (F.metricsCost?.scenarios ?? []).map((s) => ({ scenario: s.scenario, onCpuShare: slim(s.onCpuShare), steadyRatio: raw(s.steadyRatio), wholeRatio: raw(s.wholeRatio) })),
    },
    accuracy: Object.entries(F.accuracy).map(([scenario, e]) => ({
      scenario,
      error: e.error === undefined ? undefined : String(e.error).slice(0, 120),
      held: e.held,
      ...Object.fromEntries(
        ['ttft', 'itl', 'tpot'].map((k) => [
          k,
          e[k]?.absErrMs ? { absErrMs: slim(e[k].absErrMs), errMs: slim(e[k].errMs), errUpMs: slim(e[k].errUpMs), tolMs: slim(e[k].tolMs), countsMatch: e[k].countsMatch } : null,
        ]),
      ),
    })),
    targets: targets.map((t) => ({ target: t.target, value: raw(t.value), limit: t.limit, met: t.met, note: t.note, ...(t.unmeasured ? { unmeasured: true } : {}) })),
  };
}

/** As the README has always shown figures: two decimals below 10, else three significant digits ("0.45", "19.3", "879,000"). */
export function num(x) {
  const a = Math.abs(x);
  // fmt: '–' for nothing, and no sign on what rounds to zero
  return Number.isFinite(x) && a >= 1000 ? Math.round(Number(x.toPrecision(3))).toLocaleString('en-US') : fmt(x, a >= 100 ? 0 : a >= 10 ? 1 : 2);
}
const med = (a) => num(a?.median);
/** Accuracy errors are hundredths of a millisecond or less: three decimals. */
const ms3 = (x) => fmt(x, 3);
const range = (a) => (a ? `${num(a.min)}–${num(a.max)}` : '–');
/** "a / b" of two aggregates' medians. */
const pair = (x, f1, f2) => (x ? `${med(x[f1])} / ${med(x[f2])}` : '–');
const mdTable = (head, rows) => [`| ${head.join(' | ')} |`, `|${head.map(() => '---').join('|')}|`, ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
const int = (n) => Number(n).toLocaleString('en-US');
/** A count (a median of counts may be a half). */
const count = (n) => (Number.isInteger(n) ? int(n) : num(n));

/** "gap d=1.4 c=100" → "Δ 1.4 ms × 100 streams" */
const scenarioText = (key) => {
  const m = /d=([\d.]+) c=(\d+)/.exec(key);
  return m ? `Δ ${m[1]} ms × ${int(m[2])} stream${m[2] === '1' ? '' : 's'}` : key;
};

/**
 * The Markdown between the README's markers. `bracket` (a summary of an earlier run, or null)
 * is shown in brackets after this proxy's figures and verdicts.
 */
export function renderBlock(cur, bracket = null) {
  const out = [];
  const paths = cur.meta.paths;
  const b = bracket;
  const br = (s) => (b ? ` [${s}]` : '');
  const m = cur.meta;
  const reps = (n) => `${n} repetition${n === 1 ? '' : 's'}`;
  const ALL_PHASES = ['ttft', 'gap', 'sustain', 'mem', 'cancel'];
  const partial = m.phases && ALL_PHASES.some((ph) => !m.phases.includes(ph)) ? `, phases ${m.phases.join(', ')} only` : '';
  out.push(
    `Run: \`npm run bench${m.mode === 'quick' ? ' -- --quick' : ''}\` (${m.mode}: ${reps(m.reps)}${partial}, ${int(m.durationS)} s)` +
      `${m.commit ? ` of commit ${m.commit}` : ''}, finished ${m.date.slice(0, 16).replace('T', ' ')} UTC; Node ${m.node}, ${m.cpus} × ${m.cpuModel}, ${m.memGiB} GiB, Linux ${m.kernel}; ` +
      (m.foreignCoresMax === null ? '' : `other processes used at most ${num(m.foreignCoresMax)} core during any measurement. `) +
      `${m.reps > 1 ? `Median of ${reps(m.reps)}` : 'One repetition'} (every figure's min–max: bench/results/latest.md). ` +
      `"Added" = through the path − direct, same repetition.` +
      (b && paths.includes('proxy') ? ` In brackets, this proxy in an earlier ${b.meta.mode} run${b.meta.commit ? ` of ${b.meta.commit}` : ''} (finished ${b.meta.date.slice(0, 16).replace('T', ' ')} UTC, ${int(b.meta.durationS)} s).` : ''),
  );

  // 1. The figures, one row each, every path in a column.
  const rows = [];
  // A row whose figure no path has (its phase did not run) is left out, not shown as dashes.
  const row = (label, get, getB = get) => {
    const cells = paths.map((p) => get(p, cur));
    if (cells.every((c) => c === '–')) return;
    rows.push([label, ...cells.map((c, i) => c + (paths[i] === 'proxy' && b && getB ? br(getB('proxy', b)) : ''))]);
  };
  const ttftKeys = Object.keys(cur.ttft);
  for (const k of ttftKeys) {
    const c = Number(/c=(\d+)/.exec(k)?.[1]);
    const label = c === 1 ? `added TTFT p50 / p99, 1 stream, ${m.ttftRequests ?? ''} sequential requests (ms)` : `added TTFT p50 / p99, ${int(c)} concurrent new requests (ms)`;
    row(label, (p, s) => pair(s.ttft[k]?.[p], 'addedP50', 'addedP99'));
  }
  let first = true;
  for (const k of Object.keys(cur.gap)) {
    const label = first ? `added latency per event p50 / p99 (every stream's event k due at t0 + k·Δ), ${scenarioText(k)} (ms)` : `… ${scenarioText(k)} (ms)`;
    const before = rows.length;
    row(label, (p, s) => pair(s.gap[k]?.[p], 'addedP50', 'addedP99'));
    if (rows.length > before) first = false;
  }
  row(
    `streams sustained at Δ 20 ms${m.sustainMs ? `, ${m.sustainMs / 1000} s per level` : ''} (added per-event p99 ≤ 5 ms, no gap > 200 ms): median [min–max]`,
    (p, s) => {
      const x = s.sustained[p]?.streams;
      return x ? `${count(x.median)} [${count(x.min)}–${count(x.max)}]` : '–';
    },
    (p, s) => (s.sustained[p] ? count(s.sustained[p].streams.median) : '–'),
  );
  const epcs = cur.eventsPerCoreSecond;
  if (epcs.scenario) {
    row(`events per core-second, ${scenarioText(epcs.scenario)}, whole run`, (p, s) => med(s.eventsPerCoreSecond[p]?.value));
    row('… the same run\'s steady state (middle 60 % of the schedule)', (p, s) => med(s.eventsPerCoreSecond[p]?.steady));
  }
  const ramp = m.memRamp ? `${int(m.memRamp[0])} → ${int(m.memRamp[1])} streams` : 'two stream counts';
  row(`RSS per open stream, ${ramp}: slope / of it young generation / second ramp; heap (KiB)`, (p, s) => {
    const x = s.memory[p];
    if (!x) return '–';
    return `${med(x.rssPerStreamKiB)} / ${med(x.youngPerStreamKiB)} / ${med(x.rssSecondRampKiB)}; ${med(x.heapPerStreamKiB)}`;
  });
  row('cancellation → upstream closed, p99 (ms)', (p, s) => {
    const x = s.cancellation[p];
    if (!x) return '–';
    return x.p99 ? med(x.p99) + (x.notClosed ? ` (${x.notClosed} never closed)` : '') : x.notClosed ? 'never closed' : '–';
  });
  const evs = paths.map((p) => cur.integrity[p]?.events).filter(Number.isFinite);
  const mil = (n) => (n / 1e6).toFixed(1);
  const of = evs.length ? ` (of ${mil(Math.min(...evs))}–${mil(Math.max(...evs))} M events per path)` : '';
  row(`lost (or undelivered) / merged / altered events, streams of another request, requests refused${of}`, (p, s) => {
    const x = s.integrity[p];
    return x ? `${x.lost + x.undelivered} / ${x.merged} / ${x.mismatched}, ${x.misrouted}, ${x.refused}` : '–';
  }, null); // an earlier run's zeros say nothing here
  out.push(mdTable(['figure', ...paths.map((p) => HEAD[p])], rows));

  // 2. The issue's targets, with this run's verdict and the bracket run's.
  // A target the run could not measure is a failure of the run, said as such.
  const verdict = (t) => (t ? (t.unmeasured ? 'missed (unmeasured)' : t.met === null ? 'no verdict' : t.met ? 'met' : 'missed') : 'not run');
  // JSON has no Infinity: a ratio over a peer's 0 (Portkey sustaining no level) is null there.
  // Met with no value, it can only be that.
  const value = (t) => (t?.unmeasured ? 'unmeasured' : t?.value == null && t?.met === true ? '∞' : num(t?.value));
  const bt = new Map((b?.targets ?? []).map((t) => [t.target, t]));
  const isAcc = (t) => t.target.startsWith('measurement error');
  const trows = cur.targets.filter((t) => !isAcc(t)).map((t) => [t.target, `${value(t)}${br(value(bt.get(t.target)))}`, t.limit, `${verdict(t)}${br(verdict(bt.get(t.target)))}`, t.note]);
  // The accuracy checks in two rows, ITL/TPOT and TTFT (which differs from the client's by
  // design: the client's includes the request's trip): how many were within, and which were not.
  const accCount = (ts, kind) => {
    const acc = ts.filter((t) => isAcc(t) && (t.target.startsWith('measurement error ttft') === (kind === 'ttft')));
    const within = acc.filter((t) => t.met === true).length;
    const over = acc.filter((t) => t.met !== true);
    return { n: acc.length, within, over, verdict: acc.length === 0 ? 'no verdict' : over.some((t) => t.met === false) ? 'missed' : over.length ? 'no verdict' : 'met' };
  };
  const checks = (c, what = ' within') => (c.n ? `${c.within} of ${c.n}${what}` : 'none run');
  for (const [kind, label] of [
    ['itl', 'measurement error, ITL and TPOT (means of /metrics against the client, worst repetition, tolerance max(1 % of the mean, 0.1 ms))'],
    ['ttft', 'measurement error, TTFT (the same; the client\'s TTFT also holds the request\'s trip to the proxy, so they differ by design)'],
  ]) {
    const ac = accCount(cur.targets, kind);
    const acb = b ? accCount(b.targets, kind) : null;
    if (ac.n === 0 && !(acb && acb.n > 0)) continue;
    trows.push([
      label,
      `${checks(ac)}${acb ? ` [${checks(acb, '')}]` : ''}`,
      'every one',
      `${ac.verdict}${acb ? br(acb.verdict) : ''}`,
      ac.over.length ? `not within: ${ac.over.map((t) => t.target.replace(/^measurement error (ttft|itl|tpot) /, '$1 ')).join(', ')} (accuracy table below)` : '',
    ]);
  }
  out.push('Against the issue\'s targets (ratios of the unrounded figures):\n\n' + mdTable(['target', 'value', 'limit', 'verdict', 'detail'], trows));

  // 3. TTFT at one stream, by leg: where the first event's time went.
  const t1 = Object.keys(cur.ttft).find((k) => k === 'ttft c=1');
  if (t1) {
    const legRows = ['direct', ...paths].filter((p) => cur.ttft[t1][p]).map((p) => {
      const x = cur.ttft[t1][p];
      const xb = b?.ttft?.[t1]?.[p];
      const bb = (f) => (p === 'proxy' && b ? ` [${f(xb)}]` : '');
      return [
        p === 'direct' ? 'direct' : HEAD[p],
        med(x?.requestLegP50) + bb((y) => med(y?.requestLegP50)),
        med(x?.responseLegP50) + bb((y) => med(y?.responseLegP50)),
        (x?.requestLegsStalled ? `${count(x.requestLegsStalled.median)} (${count(x.requestLegsStalled.min)}–${count(x.requestLegsStalled.max)})` : '–') +
          bb((y) => (y?.requestLegsStalled ? count(y.requestLegsStalled.median) : '–')),
        p === 'direct' ? '–' : `${med(x?.addedP99)} (${range(x?.addedP99)})` + bb((y) => med(y?.addedP99)),
      ];
    });
    out.push(
      `TTFT at 1 stream by leg (request leg: client sends → the emitter has the request; response leg: the emitter writes event 1 → the client has it; medians of the repetitions' p50s):\n\n` +
        mdTable(['path', 'request leg p50 (ms)', 'response leg p50 (ms)', `request legs over 1.5 ms, of ${m.ttftRequests ?? '?'} (per repetition)`, 'added TTFT p99 (per repetition)'], legRows),
    );
  }

  // 4. Accuracy, per scenario.
  const ab = new Map((b?.accuracy ?? []).map((a) => [a.scenario, a]));
  const accRows = (cur.accuracy ?? []).map((a) => {
    if (a.error) return [a.scenario, `scrape failed: ${a.error}`, '', '', '', '', '', ''];
    const x = ab.get(a.scenario);
    const e = (k, f) => (a[k] ? f(a[k]) : '–');
    return [
      a.scenario.startsWith('gap ') ? scenarioText(a.scenario) : a.scenario.replace(/^ttft c=(\d+)/, (_, c) => (c === '1' ? 'TTFT scenario, 1 stream' : `TTFT scenario, ${c} new requests`)),
      e('itl', (y) => ms3(y.absErrMs.max)) + (b ? ` [${x?.itl ? ms3(x.itl.absErrMs.max) : '–'}]` : ''),
      e('tpot', (y) => ms3(y.absErrMs.max)),
      e('itl', (y) => ms3(y.tolMs.min)),
      e('itl', (y) => (y.countsMatch && (!a.tpot || a.tpot.countsMatch) ? 'equal' : 'DIFFER')),
      e('itl', (y) => ms3(y.errUpMs?.median)),
      // TTFT is judged in the TTFT scenarios only: in the others the streams start under load.
      a.scenario.startsWith('ttft') ? e('ttft', (y) => num(y.errMs.median)) : '–',
      a.held === undefined ? '–' : String(a.held),
    ];
  });
  if (accRows.length) out.push(
    'Measurement accuracy (figure 7: the proxy\'s `/metrics` sums and counts against the client\'s observations of the same run; ms; "vs emitter" is the proxy\'s mean gap minus what the emitter wrote, median of the repetitions):\n\n' +
      mdTable(['scenario', 'ITL error, worst repetition', 'TPOT error, worst repetition', 'tolerance', 'counts', 'ITL vs emitter', 'TTFT proxy − client', 'streams held by the client'], accRows),
  );

  // 5. What the measurement costs, in every gap scenario that ran both ways.
  const mb = new Map((b?.metricsCost?.scenarios ?? []).map((s) => [s.scenario, s]));
  const costRows = cur.metricsCost.scenarios.map((s) => {
    const x = mb.get(s.scenario);
    const tag = s.scenario === cur.metricsCost.busiest ? ' (busiest)' : s.scenario === epcs.scenario ? ' (heaviest load)' : '';
    return [
      scenarioText(s.scenario) + tag,
      med(s.onCpuShare) + (b ? ` [${med(x?.onCpuShare)}]` : ''),
      num(s.steadyRatio) + (b ? ` [${num(x?.steadyRatio)}]` : ''),
      num(s.wholeRatio) + (b ? ` [${num(x?.wholeRatio)}]` : ''),
    ];
  });
  if (costRows.length) out.push(
    'Events per core-second with metrics on ÷ off, per scenario (the proxy\'s CPU share in the steady window, i.e. the middle 60 % of the schedule):\n\n' +
      mdTable(['scenario', "proxy's CPU share, steady", 'on ÷ off, steady', 'on ÷ off, whole run'], costRows),
  );
  return out.join('\n\n') + '\n';
}

export const BEGIN = '<!-- bench-table: generated by `node bench/readme.mjs --write`';
export const END = '<!-- /bench-table -->';

/** The README's generated block: its text, and the bracket file its marker names (or null). */
export function readBlock(text) {
  const readme = text.replace(/\r\n/g, '\n'); // a CRLF checkout reads as the LF one
  const i = readme.indexOf(BEGIN);
  const j = readme.indexOf(END);
  if (i < 0 || j < i) throw new Error(`README has no bench block (${BEGIN} … ${END})`);
  const markerEnd = readme.indexOf('-->', i) + 3;
  const marker = readme.slice(i, markerEnd);
  const bracket = / bracket: (\S+) -->$/.exec(marker)?.[1] ?? null;
  return { start: i, end: j + END.length, body: readme.slice(markerEnd, j).replace(/^\n+/, '').replace(/\n+$/, '\n'), bracket };
}

/**
 * The README with its block replaced by `body`, the marker naming `bracket`. Only the block's bytes
 * change: it is written with the line ending the old one had (a CRLF checkout stays CRLF).
 */
export function writeBlock(text, body, bracket) {
  readBlock(text); // the same refusal of a README without a block
  const start = text.indexOf(BEGIN);
  const end = text.indexOf(END) + END.length;
  const marker = `${BEGIN} from bench/results/latest.json${bracket ? `; bracket: ${bracket}` : ''} -->`;
  const block = `${marker}\n\n${body}\n${END}`;
  return `${text.slice(0, start)}${text.slice(start, end).includes('\r\n') ? block.replace(/\n/g, '\r\n') : block}${text.slice(end)}`;
}
