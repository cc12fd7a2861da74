/**
 * Recognises the plain content deltas of one OpenAI-style stream from their
 * bytes, without decoding or parsing them.
 *
 * Within one stream, every plain delta starts with the same bytes up to its
 * text: `{"id":"chatcmpl-…","object":"chat.completion.chunk","created":…,
 * "model":"…",…"choices":[{"index":0,"delta":{"content":"`. After a full
 * parse found an event to be content, `learn()` takes that prefix and proves
 * what it means: the prefix, closed with `x"` and the brackets still open,
 * must parse to an object whose `choices[0].delta[key]` is `"x"`. JSON is
 * context-free, so any later event that starts with the same bytes has its
 * `choices[0].delta[key]` string start right there; it is content when that
 * string is not empty, and nothing after it may be a key the adapter must
 * read (`usage` unless null, `error`, `timings`). Outside strings a key is
 * always written `"key"`, and inside a string a `"` is escaped, so a plain
 * search of the bytes after the text finds every such key (it may also find
 * one inside a string: then the answer is "not sure", never a wrong yes).
 * Not handled (the answer is then wrong, like JSON.parse's last-wins): an
 * event that repeats a key. No known server does.
 */
export class ContentPrefix {
  private prefix: Buffer | undefined;
  /** Prefixes learned since the last match. */
  private attempts = 0;

  /** True when `buf[start, end)` is certainly a content delta; false means "not sure". */
  match(buf: Buffer, start: number, end: number): boolean {
    const p = this.prefix;
    if (p === undefined) return false;
    const n = p.length;
    let i = start + n;
    // At least one byte of text, its closing quote and the closing braces.
    if (end - i < 3 || buf[end - 1] !== 0x7d /* } */ || buf[i] === 0x22 /* " */) return false;
    if (buf[i - 2] !== p[n - 2] || buf.compare(p, 0, n, start, i) !== 0) return false;
    // To the text's closing quote.
    for (; i < end; i++) {
      const c = buf[i];
      if (c === 0x5c /* \ */) i++;
      else if (c === 0x22) break;
    }
    for (i++; i < end; i++) {
      if (buf[i] !== 0x22) continue;
      const c = buf[i + 1];
      if (c === 0x75 /* u */) {
        if (is(buf, i + 1, 'usage"')) {
          if (!is(buf, i + 7, ':null')) return false;
        }
      } else if (c === 0x65 /* e */) {
        if (is(buf, i + 1, 'error"')) return false;
      } else if (c === 0x74 /* t */) {
        if (is(buf, i + 1, 'timings"')) return false;
      }
    }
    this.attempts = 0;
    return true;
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
        if (proves(prefix, key)) {
          this.prefix = Buffer.from(prefix, 'utf8');
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
const CONTENT_KEYS = ['content', 'reasoning_content', 'reasoning'] as const;

function is(buf: Buffer, at: number, s: string): boolean {
  if (at + s.length > buf.length) return false;
  for (let k = 0; k < s.length; k++) if (buf[at + k] !== s.charCodeAt(k)) return false;
  return true;
}

/** The prefix text itself names none of the keys the adapter must read. */
function harmless(d: string): boolean {
  if (d.indexOf('"error"') !== -1 || d.indexOf('"timings"') !== -1) return false;
  for (let u = d.indexOf('"usage"'); u !== -1; u = d.indexOf('"usage"', u + 7)) if (!d.startsWith(':null', u + 7)) return false;
  return true;
}

/** Closing `prefix` with `x"` and its open brackets gives an object whose choices[0].delta[key] is "x". */
function proves(prefix: string, key: string): boolean {
  if (!harmless(prefix)) return false;
  const open: string[] = [];
  let inString = false;
  for (let i = 0; i < prefix.length; i++) {
    const c = prefix.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b) open.push('}');
    else if (c === 0x5b) open.push(']');
    else if (c === 0x7d || c === 0x5d) open.pop();
  }
  if (!inString) return false;
  let probe: unknown;
  try {
    probe = JSON.parse(`${prefix}x"${open.reverse().join('')}`);
  } catch {
    return false;
  }
  const choices = (probe as { choices?: unknown } | null)?.choices;
  if (!Array.isArray(choices)) return false;
  const delta = (choices[0] as { delta?: unknown } | null | undefined)?.delta;
  return delta !== null && typeof delta === 'object' && (delta as Record<string, unknown>)[key] === 'x';
}
