/**
 * Recognises the plain content deltas of one OpenAI-style stream from their
 * bytes, without decoding or parsing them.
 *
 * Within one stream, every plain delta starts with the same bytes up to its
 * text: `{"id":"chatcmpl-…","object":"chat.completion.chunk","created":…,
 * "model":"…",…"choices":[{"index":0,"delta":{"content":"`. After a full
 * parse found an event to be content, `learn()` takes that prefix and proves
 * what it means: the prefix, closed with `x"` and the brackets still open,
 * must parse to an object whose `choices[0].delta[key]` is `"x"` and that
 * has no `error`, `timings`, non-null `usage` or `x_groq.usage`, and no
 * choice with a `finish_reason` (other than null or "") or a `usage` object. JSON is
 * context-free, so a later event that starts with the same bytes has its
 * `choices[0].delta[key]` string start right there. `match()` then checks the rest itself:
 *  - the text is a non-empty, well-formed JSON string (no raw control
 *    bytes, valid escapes, a closing quote);
 *  - after it, no backslash at all (so no key is spelt with escapes and a
 *    `"` always opens or closes a string), no string `"usage"` or
 *    `"finish_reason"` unless followed by `:null` (or `:""`, for
 *    `finish_reason`), no `"error"` or
 *    `"timings"` (a value spelt so makes the answer "not sure", never a
 *    wrong yes);
 *  - the brackets close exactly the ones the prefix left open, each with
 *    its own kind, and the last one is the event's last byte.
 * Not checked (the answer is then "content" where JSON.parse would reject the
 * event or read it differently): a misspelt literal or a missing comma or
 * colon after the text, and a repeated key (JSON.parse keeps the last one).
 * No known server sends either.
 */
export class ContentPrefix {
  private prefix: Buffer | undefined;
  /** The closing brackets the prefix leaves open, innermost last. */
  private open: Uint8Array = new Uint8Array(0);
  /**
   * The prefix as little-endian 8-byte words read as doubles (its last length % 8
   * bytes left out), so that one load compares eight bytes; see `samePrefix()`.
   */
  private words: Float64Array = new Float64Array(0);
  /** Prefixes learned since the last match. */
  private attempts = 0;

  /** True when `buf[start, end)` is certainly a content delta; false means "not sure". */
  match(buf: Buffer, start: number, end: number): boolean {
    return buf[end - 1] === 0x7d /* } */ && this.matchFrom(buf, start, end) === end;
  }

  /**
   * For an SSE data value that starts at `buf[start]` and whose end is not
   * known yet (`end`: the end of the read): the index just past it when it is
   * certainly a content delta, else -1 ("not sure"). A CR or LF outside a
   * string ends the search with -1 (it would end the SSE line), so the value
   * found is a prefix of the line; the caller checks what follows it.
   */
  matchFrom(buf: Buffer, start: number, end: number): number {
    const p = this.prefix;
    if (p === undefined) return -1;
    const n = p.length;
    let i = start + n;
    // At least one byte of text, its closing quote and the closing braces.
    if (end - i < 3 || buf[i] === 0x22 /* " */) return -1;
    if (buf[i - 2] !== p[n - 2] || !samePrefix(buf, start, p, this.words)) return -1;
    // The text: to its closing quote, as JSON.parse would read it.
    for (; i < end; i++) {
      const c = buf[i]!;
      if (c === 0x22) break;
      if (c < 0x20) return -1;
      if (c === 0x5c /* \ */) {
        const e = i + 1 < end ? buf[i + 1] : undefined;
        if (e === 0x75 /* u */) {
          if (i + 5 >= end || !hex(buf[i + 2]!) || !hex(buf[i + 3]!) || !hex(buf[i + 4]!) || !hex(buf[i + 5]!)) return -1;
          i += 5;
        } else if (e !== undefined && SIMPLE_ESCAPES.has(e)) {
          i++;
        } else {
          return -1;
        }
      }
    }
    if (i >= end) return -1;
    // After the text: strings without escapes, keys to watch for, brackets.
    // The brackets the prefix left open are read where they are (`open`, innermost
    // last); only brackets opened after the text go on the work stack.
    const stack = STACK;
    const open = this.open;
    let outer = open.length;
    let depth = 0;
    let inString = false;
    for (i++; i < end; i++) {
      const c = buf[i]!;
      if (c === 0x5c) return -1;
      if (inString) {
        if (c === 0x22) inString = false;
        else if (c < 0x20) return -1;
        continue;
      }
      if (c === 0x22) {
        inString = true;
        const k = buf[i + 1];
        if (k === 0x75 /* u */) {
          if (is(buf, i + 1, end, 'usage"') && !is(buf, i + 7, end, ':null')) return -1;
        } else if (k === 0x65 /* e */) {
          if (is(buf, i + 1, end, 'error"')) return -1;
        } else if (k === 0x74 /* t */) {
          if (is(buf, i + 1, end, 'timings"')) return -1;
        } else if (k === 0x66 /* f */ && is(buf, i + 1, end, 'finish_reason"')) {
          // Past `"finish_reason":null`, or `:""` (servers whose field is a plain string), which say
          // no reason: their bytes need no scan. Any other value goes to the full parse.
          if (is(buf, i + 15, end, ':null')) i += 19;
          else if (is(buf, i + 15, end, ':""')) i += 17;
          else return -1;
          inString = false;
        }
      } else if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
        if (depth === MAX_DEPTH) return -1;
        stack[depth++] = c + 2; // } and ] are { and [ plus 2
      } else if (c === 0x7d || c === 0x5d) {
        if (depth > 0) {
          if (stack[--depth] !== c) return -1;
        } else if (outer === 0 || open[--outer] !== c) {
          return -1;
        } else if (outer === 0) {
          this.attempts = 0;
          return i + 1;
        }
      } else if (c === 0x0a || c === 0x0d) {
        return -1; // the SSE line ends inside the object
      }
    }
    return -1; // not closed before the end of the read
  }

  /**
   * `data` was found to be a content delta by a full parse: learn its prefix.
   * A stream whose prefixes never repeat (an id per chunk) stops being tried
   * after a few prefixes that matched nothing.
   */
  learn(data: string): void {
    if (this.attempts >= MAX_ATTEMPTS) return;
    this.attempts++;
    if (data.charCodeAt(0) !== 0x7b /* { */) return;
    for (const key of CONTENT_KEYS) {
      const needle = `"${key}":"`;
      for (let at = data.indexOf(needle), n = 0; at !== -1 && n < 4; at = data.indexOf(needle, at + 1), n++) {
        const prefix = data.slice(0, at + needle.length);
        // Data joined from several lines: on the wire a line break ends the line, it cannot be matched.
        if (prefix.includes('\n') || prefix.includes('\r')) return;
        const open = proves(prefix, key);
        if (open !== undefined) {
          this.prefix = Buffer.from(prefix, 'utf8');
          this.words = new Float64Array(this.prefix.length >>> 3);
          for (let k = 0; k < this.words.length; k++) this.words[k] = this.prefix.readDoubleLE(8 * k);
          this.open = open;
          return;
        }
      }
    }
  }

  /** The learned prefix (tests). */
  get learned(): string | undefined {
    return this.prefix?.toString('utf8');
  }
}

const MAX_ATTEMPTS = 4;
const MAX_DEPTH = 64;
/** Work stack of expected closing brackets, shared: match() runs to completion. */
const STACK = new Uint8Array(MAX_DEPTH);
const CONTENT_KEYS = ['content', 'reasoning_content', 'reasoning'] as const;
/** `\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t` */
const SIMPLE_ESCAPES = new Set([0x22, 0x5c, 0x2f, 0x62, 0x66, 0x6e, 0x72, 0x74]);

// The prefix is compared through a DataView, eight bytes per load: cheaper than
// Buffer#compare's call (~115 ns, bench/README.md) once the view exists, but making
// a view costs about as much as one compare. So the view is kept for the memory the
// last read lived in (its ArrayBuffer, not the Buffer): the proxy's reads of a few
// hundred bytes are slices of Node's shared 8 KiB allocation pool, so ~20-40
// successive reads, of any streams, use one view; a large read has its own memory
// and room for many events. Memory too small for two prefixes uses Buffer#compare.
// Both caches pin what they point to until another read comes: one pool (8 KiB) or
// one read's memory.
//
// Eight bytes are read as a double: two doubles compare equal exactly when their
// bits are equal, except +0 and -0 (equal, different bits) and NaNs (never equal).
// A word of the prefix is neither: ±0 needs seven NUL bytes, and the prefix is JSON
// that JSON.parse accepted (no raw NUL); a NaN needs a byte >= 0xF0 followed by 0x7F
// or 0xFF, which valid UTF-8 never has (the prefix is encoded from a string). So the
// comparison is exact: equal words are equal bytes, and a read's word that is a NaN
// or a zero differs from the prefix's.
let viewOf: ArrayBufferLike | undefined;
let view: DataView | undefined;
/** The last read compared, and where it starts in `view`: reading `buf.buffer` and `buf.byteOffset` costs ~35 ns. */
let readOf: Buffer | undefined;
let readAt = 0;

function samePrefix(buf: Buffer, start: number, p: Buffer, words: Float64Array): boolean {
  const n = p.length;
  if (buf !== readOf) {
    const memory = buf.buffer;
    if (memory !== viewOf) {
      if (memory.byteLength < 2 * n) return buf.compare(p, 0, n, start, start + n) === 0;
      viewOf = memory;
      view = new DataView(memory);
    }
    readOf = buf;
    readAt = buf.byteOffset;
  }
  const v = view!;
  const at = readAt + start;
  const m = words.length;
  for (let k = 0; k < m; k++) if (v.getFloat64(at + 8 * k, true) !== words[k]) return false;
  for (let k = 8 * m; k < n; k++) if (buf[start + k] !== p[k]) return false;
  return true;
}

function hex(c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66);
}

/** `buf[at, end)` starts with `s`. */
function is(buf: Buffer, at: number, end: number, s: string): boolean {
  if (at + s.length > end) return false;
  for (let k = 0; k < s.length; k++) if (buf[at + k] !== s.charCodeAt(k)) return false;
  return true;
}

/**
 * Closing `prefix` with `x"` and its open brackets gives an object whose
 * choices[0].delta[key] is "x" and that names nothing else the adapter reads:
 * returns the closing brackets (innermost last), or undefined.
 */
function proves(prefix: string, key: string): Uint8Array | undefined {
  const open: number[] = [];
  let inString = false;
  for (let i = 0; i < prefix.length; i++) {
    const c = prefix.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b) open.push(c + 2);
    else if (c === 0x7d || c === 0x5d) open.pop();
  }
  if (!inString) return undefined;
  let probe: Record<string, unknown>;
  try {
    probe = JSON.parse(`${prefix}x"${String.fromCharCode(...[...open].reverse())}`) as Record<string, unknown>;
  } catch {
    return undefined;
  }
  if (probe === null || typeof probe !== 'object') return undefined;
  // What the adapter reads besides the delta (see OpenAIChatAdapter.classify).
  if (probe.error !== undefined && probe.error !== null) return undefined;
  if (probe.usage && typeof probe.usage === 'object') return undefined;
  if (probe.timings && typeof probe.timings === 'object') return undefined;
  const groq = probe.x_groq as Record<string, unknown> | null | undefined;
  if (groq && typeof groq === 'object' && groq.usage && typeof groq.usage === 'object') return undefined;
  const choices = probe.choices;
  if (!Array.isArray(choices)) return undefined;
  // A choice that says why it stopped goes to the full parse, which reads its finish reason; so
  // does one with its own usage (Moonshot's).
  for (const c of choices) {
    const reason = (c as { finish_reason?: unknown } | null)?.finish_reason;
    if (reason !== undefined && reason !== null && reason !== '') return undefined;
    const usage = (c as { usage?: unknown } | null)?.usage;
    if (usage && typeof usage === 'object') return undefined;
  }
  const delta = (choices[0] as { delta?: unknown } | null | undefined)?.delta;
  if (delta === null || typeof delta !== 'object' || (delta as Record<string, unknown>)[key] !== 'x') return undefined;
  return Uint8Array.from(open);
}
