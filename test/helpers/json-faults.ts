import fc from 'fast-check';

// Faults a broken or hostile peer may put into a JSON message: a node replaced by a number no
// count or time can be, a value of another type, or any JSON; or, aimed where the counts and
// timings are, a number replaced by a bad one.

const RAW = '\u0001raw:';
/**
 * Numbers JSON can carry that no count can be (negative, fractional, tiny, past 2^53, 1e400 and
 * -1e400, which JSON.parse reads as ±Infinity, 1e308, whose double overflows a sum), and -0,
 * a count of 0 in another spelling. Written into the text as they are.
 */
const BAD_NUMBERS = ['-1', '-0', '1.5', '5e-324', '1e-300', '1e400', '-1e400', '1e308', '9007199254740993', '-1e-400'];
const badNumber = fc.constantFrom(...BAD_NUMBERS).map((n) => `${RAW}${n}`);

const replacement: fc.Arbitrary<unknown> = fc.oneof(badNumber, fc.constantFrom(null, true, false, '', 0, [], {}, 'x', [null], { type: null }), fc.jsonValue({ maxDepth: 2 }));

/** Which node to replace (taken modulo the number of candidates: every node, or only the numbers), and by what. */
export interface Fault {
  node: number;
  numbersOnly: boolean;
  by: unknown;
}
export const fault: fc.Arbitrary<Fault> = fc.oneof(
  fc.record({ node: fc.nat(), numbersOnly: fc.constant(false), by: replacement }),
  fc.record({ node: fc.nat(), numbersOnly: fc.constant(true), by: badNumber }),
);

/** Every node of a JSON tree, as a path of keys (the root first), with its value. */
function nodes(v: unknown, at: (string | number)[] = [], out: [(string | number)[], unknown][] = []): [(string | number)[], unknown][] {
  out.push([at, v]);
  if (Array.isArray(v)) v.forEach((x, i) => nodes(x, [...at, i], out));
  else if (v !== null && typeof v === 'object') for (const [k, x] of Object.entries(v)) nodes(x, [...at, k], out);
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

/** `value` with the fault applied (none: unchanged; numbers only, in a value without one: any node). */
export function withFault(value: unknown, f: Fault | undefined): unknown {
  if (f === undefined) return value;
  const all = nodes(value);
  const numbers = all.filter(([, x]) => typeof x === 'number');
  const from = f.numbersOnly && numbers.length > 0 ? numbers : all;
  return replaced(value, from[f.node % from.length]![0], f.by);
}

/** The JSON text of a value that may hold faults, the bad numbers written raw. */
export function faultText(v: unknown): string {
  const s = typeof v === 'string' ? v : JSON.stringify(v);
  return s.replace(/"\\u0001raw:([^"]*)"/g, '$1');
}

/** Far past any real count or time, yet with room for a sum of a few. */
const BOUND = 1e17;

/** A time (or a histogram's sum): absent, or a number from 0 to BOUND. */
export function timeLike(v: unknown): boolean {
  return v === undefined || (typeof v === 'number' && v >= 0 && v <= BOUND);
}

/** A token count: absent, or an integer from 0 to BOUND. */
export function countLike(v: unknown): boolean {
  return v === undefined || (Number.isInteger(v) && timeLike(v));
}

/** One count as an adapter reports it (a sum of parts too, but no histogram's sum): absent, or an integer from 0 to 2^53 − 1. */
export function oneCount(v: unknown): boolean {
  return v === undefined || (Number.isSafeInteger(v) && (v as number) >= 0);
}

/** One time as an adapter reports it: absent, or a number from 0 to 2^53 − 1. */
export function oneTime(v: unknown): boolean {
  return v === undefined || (typeof v === 'number' && v >= 0 && v <= Number.MAX_SAFE_INTEGER);
}
