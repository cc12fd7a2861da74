export function agg(values) {
  const v = values.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return null;
  const mid = Math.floor(v.length / 2);
  const median = v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
  return { median, min: v[0], max: v[v.length - 1], n: v.length };
}

export function quant(values, p) {
  const a = Float64Array.from(values).sort();
  if (a.length === 0) return NaN;
  return a[Math.min(a.length - 1, Math.floor(p * (a.length - 1) + 0.5))];
}

export function fmt(x, d = 2) {
  if (x === null || x === undefined || Number.isNaN(x)) return '–';
  if (!Number.isFinite(x)) return String(x);
  const s = x.toFixed(d);
  // A small negative (a ratio a hair below 0, an added gap a hair below direct's) rounds to
  // zero; written "-0.0" it read as a sign where there is none.
  return /^-0\.?0*$/.test(s) ? s.slice(1) : s;
}

/** "median [min–max]" */
export function fmtAgg(a, d = 2) {
  if (!a) return '–';
  if (a.n === 1) return fmt(a.median, d);
  return `${fmt(a.median, d)} [${fmt(a.min, d)}–${fmt(a.max, d)}]`;
}

export function ratio(a, b) {
  if (!a || !b || !Number.isFinite(a.median) || !Number.isFinite(b.median)) return null;
  if (Math.abs(b.median) < 1e-9) return null;
  return a.median / b.median;
}
