// Token counts and times as an upstream may send them, good or not, for the property tests of
// how adapters read usage (usage-sums, usage-updates).
import fc from 'fast-check';

/** One part as sent: left out, null, a good value, or a value (as JSON text) that is no count or time. */
export type Part = { k: 'absent' } | { k: 'null' } | { k: 'ok'; v: number } | { k: 'bad'; text: string };

// -0 and -1e-400 (which parses as -0) are a count of 0 in another spelling, and fractions and
// tiny numbers are good times: none of them is here.
export const NOT_COUNTS = ['-1', '1.5', '5e-324', '1e-300', '1e400', '-1e400', '1e308', '9007199254740993', '"7"', 'true', '{}', '[]', '"x"', '[3]'];
export const NOT_TIMES = ['-1', '-2.5', '1e400', '-1e400', '1e308', '9007199254740993', '"7"', 'false', '{}', '[]', '[1]'];

export const countPart: fc.Arbitrary<Part> = fc.oneof(
  { weight: 1, arbitrary: fc.constant<Part>({ k: 'absent' }) },
  { weight: 1, arbitrary: fc.constant<Part>({ k: 'null' }) },
  { weight: 3, arbitrary: fc.integer({ min: 0, max: 1_000_000 }).map((v): Part => ({ k: 'ok', v })) },
  { weight: 2, arbitrary: fc.constantFrom(...NOT_COUNTS).map((text): Part => ({ k: 'bad', text })) },
);
export const timePart: fc.Arbitrary<Part> = fc.oneof(
  { weight: 1, arbitrary: fc.constant<Part>({ k: 'absent' }) },
  { weight: 1, arbitrary: fc.constant<Part>({ k: 'null' }) },
  { weight: 3, arbitrary: fc.double({ min: 0, max: 1e6, noNaN: true }).map((v): Part => ({ k: 'ok', v })) },
  { weight: 2, arbitrary: fc.constantFrom(...NOT_TIMES).map((text): Part => ({ k: 'bad', text })) },
);

/** The members of a JSON object for the parts, named `names`, joined by commas (absent ones left out). */
export function members(names: string[], parts: Part[]): string {
  const out: string[] = [];
  parts.forEach((p, i) => {
    if (p.k === 'absent') return;
    out.push(`${JSON.stringify(names[i])}:${p.k === 'null' ? 'null' : p.k === 'ok' ? JSON.stringify(p.v) : p.text}`);
  });
  return out.join(',');
}

export const isSent = (p: Part) => p.k === 'ok' || p.k === 'bad';
export const value = (p: Part) => (p.k === 'ok' ? p.v : 0);
