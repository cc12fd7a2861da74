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
 * linear in the text; each whole member is parsed once (JSON.parse, which never throws here).
 */
export interface OpenContainer {
  readonly kind: 'object' | 'array';
  /** An object's members whole on this side of the cut, by key (a member that does not parse is left out). */
  readonly members: Record<string, unknown>;
  /** An array's elements whole on this side of the cut, in order (one that does not parse: undefined). */
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

interface Level {
  kind: 'object' | 'array';
  members: Record<string, unknown>;
  elements: unknown[];
  /** Where the member being read began (after `{`, `[` or `,`); -1: it began beyond the cut. */
  from: number;
}

// Members in an object without a prototype: a `__proto__` key is then a member like any other.
const level = (kind: 'object' | 'array', from: number): Level => ({ kind, members: Object.create(null) as Record<string, unknown>, elements: [], from });

/** Adds `text[l.from, to)`, one whole member (`"key": value`, or an element), to `l`. */
function collect(l: Level, text: string, to: number): void {
  if (l.from < 0) return;
  const piece = text.slice(l.from, to);
  if (l.kind === 'array') {
    l.elements.push(parse(piece));
    return;
  }
  const o = parse(`{${piece}}`);
  if (o !== null && typeof o === 'object') Object.assign(l.members, o);
}

function parse(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

const bracketKind = (c: number): 'object' | 'array' => (c === OPEN_BRACE || c === CLOSE_BRACE ? 'object' : 'array');

/** The containers open at the end of `head`, a JSON text's first bytes, outermost first; none if it is not cut inside one. */
export function headSpine(head: string): OpenContainer[] {
  const stack: Level[] = [];
  let inString = false;
  for (let i = 0; i < head.length; i++) {
    const c = head.charCodeAt(i);
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) inString = true;
    else if (c === OPEN_BRACE || c === OPEN_BRACKET) stack.push(level(bracketKind(c), i + 1));
    else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
      stack.pop(); // a whole value inside its parent's member, read with it
      if (stack.length === 0) return []; // the text ended (or closed what it never opened)
    } else if (c === COMMA && stack.length > 0) {
      const l = stack[stack.length - 1]!;
      collect(l, head, i);
      l.from = i + 1;
    }
  }
  return stack.map((l) => ({ kind: l.kind, members: l.members, elements: l.elements, open: l.kind === 'array' ? l.elements.length : openKey(head.slice(l.from)) }));
}

/** The key of a member whose `"key":` is whole in `text`. */
function openKey(text: string): string | undefined {
  const m = /^\s*("(?:[^"\\]|\\.)*")\s*:/.exec(text);
  const k = m ? parse(m[1]!) : undefined;
  return typeof k === 'string' ? k : undefined;
}

/** The containers open at the start of `tail`, a JSON text's last bytes, outermost first; none if it is not cut inside one. */
export function tailSpine(tail: string): OpenContainer[] {
  const n = tail.length;
  // Which characters lie inside a string: from the end, where the text is outside any, every
  // quote not escaped (an even run of backslashes before it) opens or closes one. A run that
  // reaches the cut is taken as even: at worst the cut member's own bytes are misread, and
  // that member is not read.
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
  const spine: OpenContainer[] = []; // innermost first
  let depth = 0; // of containers opened after the cut
  // The members of the container the cut lies in, as [from, to): its first began beyond the
  // cut and is not among them. What kind it is shows only at its end.
  let pieces: number[] = [];
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
      if (from >= 0) pieces.push(from, i);
      const l = level(bracketKind(c), -1);
      for (let k = 0; k < pieces.length; k += 2) {
        l.from = pieces[k]!;
        collect(l, tail, pieces[k + 1]!);
      }
      spine.push({ kind: l.kind, members: l.members, elements: l.elements });
      pieces = [];
      from = -1; // its parent's member that holds it began beyond the cut
    } else if (c === COMMA && depth === 0) {
      if (from >= 0) pieces.push(from, i);
      from = i + 1;
    }
  }
  return spine.reverse();
}
