/**
 * Fields read out of the edges of a JSON text too large to parse whole (see sse/event-edges.ts):
 * its first bytes or its last, which are not JSON on their own. A key is found by its spelling,
 * `"key"` then `:`; inside a JSON string every quote is escaped, so the spelling cannot come from
 * a string's content. Which occurrence is the wanted one is the caller's knowledge of the
 * payload's field order.
 */

/** The first `"key": "…"` string value, decoded; undefined when none is whole in `text`. */
export function stringField(text: string, key: string): string | undefined {
  const m = new RegExp(`"${key}"\\s*:\\s*("(?:[^"\\\\]|\\\\.)*")`).exec(text);
  if (!m) return undefined;
  try {
    return JSON.parse(m[1]!) as string;
  } catch {
    return undefined;
  }
}

/** The first `"key": true|false`; undefined when none. */
export function booleanField(text: string, key: string): boolean | undefined {
  const m = new RegExp(`"${key}"\\s*:\\s*(true|false)\\b`).exec(text);
  return m ? m[1] === 'true' : undefined;
}

/**
 * The object value of `"key"`: of its last occurrence whose object is whole in `text` and
 * parses (`last`), else of its first; undefined when none is.
 */
export function objectField(text: string, key: string, last = false): Record<string, unknown> | undefined {
  const re = new RegExp(`"${key}"\\s*:\\s*\\{`, 'g');
  const starts: number[] = [];
  for (let m = re.exec(text); m !== null; m = re.exec(text)) starts.push(m.index + m[0].length - 1);
  if (last) starts.reverse();
  for (const s of starts) {
    const o = objectAt(text, s);
    if (o !== undefined) return o;
  }
  return undefined;
}

/** The numbers of `"key": n` pairs for the keys asked for, the last of each in `text`. */
export function numberFields(text: string, keys: readonly string[]): Record<string, number> {
  const out: Record<string, number> = {};
  const re = /"([A-Za-z_][A-Za-z0-9_]*)"\s*:\s*(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)/g;
  for (let m = re.exec(text); m !== null; m = re.exec(text)) if (keys.includes(m[1]!)) out[m[1]!] = Number(m[2]);
  return out;
}

/** The object that opens at `text[start]` (`{`), if it closes within `text` and parses. */
function objectAt(text: string, start: number): Record<string, unknown> | undefined {
  let depth = 0;
  let inString = false;
  for (let i = start; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b) depth++;
    else if (c === 0x7d || c === 0x5d) {
      if (--depth === 0) {
        try {
          const v: unknown = JSON.parse(text.slice(start, i + 1));
          return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
        } catch {
          return undefined;
        }
      }
    }
  }
  return undefined;
}
