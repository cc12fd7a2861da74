/** Minimal reader for the Prometheus text format: sums of `_count`/`_sum`/plain samples by name and label filter. */
export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export function parseProm(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    if (m[2]) for (const l of m[2].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!.replace(/\\(.)/g, '$1');
    out.push({ name: m[1]!, labels, value: m[3] === '+Inf' ? Infinity : m[3] === '-Inf' ? -Infinity : Number(m[3]) });
  }
  return out;
}

export function total(samples: Sample[], name: string, filter: Record<string, string> = {}): number {
  return samples
    .filter((s) => s.name === name && Object.entries(filter).every(([k, v]) => s.labels[k] === v))
    .reduce((a, s) => a + s.value, 0);
}

export async function scrape(metricsUrl: string): Promise<Sample[]> {
  const res = await fetch(`${metricsUrl}/metrics`);
  if (!res.ok) throw new Error(`scrape failed: ${res.status}`);
  return parseProm(await res.text());
}

/** count, sum and mean of a histogram across series matching `filter`. */
export function hist(samples: Sample[], base: string, filter: Record<string, string> = {}) {
  const count = total(samples, `${base}_count`, filter);
  const sum = total(samples, `${base}_sum`, filter);
  return { count, sum, mean: count > 0 ? sum / count : NaN };
}
