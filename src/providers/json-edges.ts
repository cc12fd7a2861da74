/**
 * The structure around the cuts of a JSON text too large to parse whole (see
 * sse/event-edges.ts): its first bytes (the head) or its last (the tail), which are not JSON on
 * their own. Each side of a cut is read as the containers still open at the cut, outermost
 * first, with the members that lie whole on that side. So a field is found by where it is (a
 * member of the top-level object, of the object open in its `response`, ...), never by its
 * spelling alone: a key inside a tool's arguments or an escaped string cannot stand in for it.
 *
 * The head is read forward from its start; the tail backward from its end, where the text is
 * outside any string, to learn which of its characters lie inside one, then forward. Both are
 * linear in the text, and parse at most PARSE_BUDGET members (JSON.parse, whose errors are
 * caught): a hostile 64 KiB tail costs a few ms (2-9 measured), a real one ~0.3 ms.
 * objectFromEdges joins the two sides into the object an adapter reads as it reads a whole event.
 */
export interface OpenContainer {
  readonly kind: 'object' | 'array';
  /** An object's members whole on this side of the cut, by key (one that does not parse, or past the budgets, is left out). */
  readonly members: Record<string, unknown>;
  /** An array's elements whole on this side of the cut, in order (one that does not parse, or past the budgets: undefined). */
  readonly elements: unknown[];
  /**
   * Head only: the member the cut lies in, an object's key (undefined while the key itself is
   * cut) or an array's position.
   */
  readonly open?: string | number;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;

/**
 * Members parsed per call at most, outermost containers first, and per container: the adapters
 * read a few members of the outer levels, and a hostile text (64 Ki empty or broken members, or
 * as many levels) then costs a few ms (review 152: 267 ms per event before).
 */
const PARSE_BUDGET = 512;
const LEVEL_BUDGET = 128;
/** Containers returned at most, the outermost (the adapters read the first eight). */
const MAX_DEPTH = 32;

/** A container open at the cut, as found: its members' [from, to) in the text, parsed later. */
interface Found {
  kind: 'object' | 'array';
  ranges: number[];
  open?: string | number;
}

const bracketKind = (c: number): 'object' | 'array' => (c === OPEN_BRACE || c === CLOSE_BRACE ? 'object' : 'array');

function parse(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function blank(text: string, from: number, to: number): boolean {
  for (let i = from; i < to; i++) {
    const c = text.charCodeAt(i);
    if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) return false;
  }
  return true;
}

/**
 * The containers with their members parsed, within the budgets: of each container's members,
 * those nearest the text's own edge (the head's first, the tail's last); an array's elements
 * left unparsed are undefined, so that positions hold. Members live in an object without a
 * prototype: a `__proto__` key is then a member like any other.
 */
function parsed(found: Found[], text: string, fromStart: boolean): OpenContainer[] {
  let budget = PARSE_BUDGET;
  return found.slice(0, MAX_DEPTH).map((f) => {
    const members = Object.create(null) as Record<string, unknown>;
    const elements: unknown[] = [];
    const n = f.ranges.length / 2;
    const take = Math.min(n, LEVEL_BUDGET, budget);
    budget -= take;
    const first = fromStart ? 0 : n - take;
    for (let k = 0; k < n; k++) {
      const from = f.ranges[2 * k]!;
      const to = f.ranges[2 * k + 1]!;
      const wanted = k >= first && k < first + take && !blank(text, from, to);
      if (f.kind === 'array') elements.push(wanted ? parse(text.slice(from, to)) : undefined);
      else if (wanted) {
        const o = parse(`{${text.slice(from, to)}}`);
        if (o !== null && typeof o === 'object') Object.assign(members, o);
      }
    }
    return { kind: f.kind, members, elements, ...(fromStart ? { open: f.open } : {}) };
  });
}

/** The containers open at the end of `head`, a JSON text's first bytes, outermost first; none if it is not cut inside one. */
export function headSpine(head: string): OpenContainer[] {
  const stack: Array<Found & { from: number }> = [];
  let inString = false;
  for (let i = 0; i < head.length; i++) {
    const c = head.charCodeAt(i);
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) inString = true;
    else if (c === OPEN_BRACE || c === OPEN_BRACKET) stack.push({ kind: bracketKind(c), ranges: [], from: i + 1 });
    else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
      stack.pop(); // a whole value inside its parent's member, read with it
      if (stack.length === 0) return []; // the text ended (or closed what it never opened)
    } else if (c === COMMA && stack.length > 0) {
      const l = stack[stack.length - 1]!;
      l.ranges.push(l.from, i);
      l.from = i + 1;
    }
  }
  const open = stack.slice(0, MAX_DEPTH);
  for (const l of open) l.open = l.kind === 'array' ? l.ranges.length / 2 : openKey(head, l.from);
  return parsed(open, head, true);
}

/** The key of the member at `from` in `text`, if its `"key":` is whole there. */
function openKey(text: string, from: number): string | undefined {
  const re = /\s*("(?:[^"\\]|\\.)*")\s*:/y;
  re.lastIndex = from;
  const m = re.exec(text);
  const k = m ? parse(m[1]!) : undefined;
  return typeof k === 'string' ? k : undefined;
}

/** The containers open at the start of `tail`, a JSON text's last bytes, outermost first; none if it is not cut inside one. */
export function tailSpine(tail: string): OpenContainer[] {
  const n = tail.length;
  // Which characters lie inside a string: from the end, where the text is outside any, every
  // quote not escaped (an even run of backslashes before it) opens or closes one. A run that
  // reaches the cut is taken as even: only backslashes precede such a quote, all in the member
  // the cut lies in, which is not read.
  const inString = new Uint8Array(n);
  let s = false;
  for (let i = n - 1; i >= 0; i--) {
    if (tail.charCodeAt(i) === QUOTE) {
      let j = i - 1;
      while (j >= 0 && tail.charCodeAt(j) === BACKSLASH) j--;
      if ((i - 1 - j) % 2 === 0) {
        inString[i] = 1;
        s = !s;
        continue;
      }
    }
    if (s) inString[i] = 1;
  }
  const spine: Found[] = []; // innermost first
  let depth = 0; // of containers opened after the cut
  // The members of the container the cut lies in: its first began beyond the cut and is not
  // among them. What kind it is shows only at its end.
  let ranges: number[] = [];
  let from = -1;
  for (let i = 0; i < n; i++) {
    if (inString[i] === 1) continue;
    const c = tail.charCodeAt(i);
    if (c === OPEN_BRACE || c === OPEN_BRACKET) depth++;
    else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
      if (depth > 0) {
        depth--;
        continue;
      }
      // Closes a container open at the cut: its members since the cut are known.
      if (from >= 0) ranges.push(from, i);
      spine.push({ kind: bracketKind(c), ranges });
      ranges = [];
      from = -1; // its parent's member that holds it began beyond the cut
    } else if (c === COMMA && depth === 0) {
      if (from >= 0) ranges.push(from, i);
      from = i + 1;
    }
  }
  return parsed(spine.reverse(), tail, false);
}

/** Stands for the value the cuts lie in (a generated image, a long text, a context): not empty, as it was. */
export const CUT_VALUE = '(over limits.maxEventBytes)';

/**
 * The JSON object whose first and last bytes these are, as far as they show it, for an adapter
 * to read as it reads a whole event: each container open across the cut holds its members from
 * both sides, and the member the cut lies in is the next container down, or CUT_VALUE for the
 * value cut itself (so a generated image's data is there and not empty, a signature is still a
 * signature). The two sides' containers are matched by depth: both cuts lie in the one value
 * that made the event large. A tail that is one whole object (the event over a cap below the
 * tail's size) is the event itself. Undefined when the head is not a cut object.
 */
export function objectFromEdges(head: string, tail: string): Record<string, unknown> | undefined {
  const whole = wholeObject(tail);
  if (whole !== undefined) return whole;
  const h = headSpine(head);
  if (h[0]?.kind !== 'object') return undefined;
  const t = tailSpine(tail);
  const build = (k: number): unknown => {
    const hk = h[k]!;
    const tk = t[k]?.kind === hk.kind ? t[k] : undefined;
    const inner = k + 1 < h.length ? build(k + 1) : CUT_VALUE;
    if (hk.kind === 'array') return [...hk.elements, inner, ...(tk?.elements ?? [])];
    const o = Object.assign(Object.create(null) as Record<string, unknown>, hk.members, tk?.members);
    if (typeof hk.open === 'string') o[hk.open] = inner;
    return o;
  };
  return build(0) as Record<string, unknown>;
}

/** `text` parsed, when it is one whole JSON object (and starts like one: a cut text fails at once). */
function wholeObject(text: string): Record<string, unknown> | undefined {
  let i = 0;
  while (i < text.length && text.charCodeAt(i) <= 0x20) i++;
  if (text.charCodeAt(i) !== OPEN_BRACE) return undefined;
  const v = parse(text);
  return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}
