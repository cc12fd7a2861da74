import fc from 'fast-check';

// Faults a broken or hostile peer may put into a JSON message: any node replaced by a number no
// count can be (negative, fractional, 1e400, which JSON.parse reads as Infinity, past 2^53), a
// value of another type, or any JSON.

const RAW = '\u0001raw:';
/** Numbers JSON can carry that no count can be; written into the text as they are. */
const BAD_NUMBERS = ['-1', '-0', '1.5', '1e400', '-1e400', '1e308', '9007199254740993', '-1e-400'];

export const replacement: fc.Arbitrary<unknown> = fc.oneof(
  fc.constantFrom(...BAD_NUMBERS).map((n) => `${RAW}${n}`),
  fc.constantFrom(null, true, false, '', 0, [], {}, 'x', [null], { type: null }),
  fc.jsonValue({ maxDepth: 2 }),
);

/** Which node to replace (taken modulo the number of nodes), and by what. */
export type Fault = [node: number, by: unknown];
export const fault: fc.Arbitrary<Fault> = fc.tuple(fc.nat(), replacement);

/** Every node of a JSON tree, as a path of keys (the root first). */
function paths(v: unknown, at: (string | number)[] = [], out: (string | number)[][] = []): (string | number)[][] {
  out.push(at);
  if (Array.isArray(v)) v.forEach((x, i) => paths(x, [...at, i], out));
  else if (v !== null && typeof v === 'object') for (const [k, x] of Object.entries(v)) paths(x, [...at, k], out);
  return out;
}

function replaced(v: unknown, path: (string | number)[], by: unknown): unknown {
  if (path.length === 0) return by;
  const [head, ...rest] = path;
  if (Array.isArray(v)) return v.map((x, i) => (i === head ? replaced(x, rest, by) : x));
  const o = { ...(v as Record<string, unknown>) };
  o[head as string] = replaced(o[head as string], rest, by);
  return o;
}

/** `value` with the fault applied (none: unchanged). */
export function withFault(value: unknown, f: Fault | undefined): unknown {
  if (f === undefined) return value;
  const all = paths(value);
  return replaced(value, all[f[0] % all.length]!, f[1]);
}

/** The JSON text of a value that may hold faults, the bad numbers written raw. */
export function faultText(v: unknown): string {
  const s = typeof v === 'string' ? v : JSON.stringify(v);
  return s.replace(/"\\u0001raw:([^"]*)"/g, '$1');
}

/** A count or a timing: absent, or a finite number ≥ 0. */
export function countLike(v: unknown): boolean {
  return v === undefined || (typeof v === 'number' && Number.isFinite(v) && v >= 0);
}
