/**
 * Reads what measurement needs from the request body (the top-level `model`
 * string) while the bytes are forwarded, without keeping or parsing the body.
 *
 * A chat request can carry megabytes of context; copying it and running
 * JSON.parse on it when it ends blocks the event loop (and every other
 * stream's next event) for milliseconds. Instead a byte scanner follows the
 * JSON structure (strings with their escapes, nesting depth) and reads only
 * the keys of the root object, the value of a `model` key and the kind of a
 * `prediction` key's value (OpenAI's Predicted Outputs). Inside other
 * strings it jumps from quote to quote with the native memchr, so a body
 * costs little more than its quotes and backslashes.
 *
 * What JSON.parse would say of a valid body is what this says: the root must
 * be an object, a repeated key's last value wins, keys and values are
 * unescaped, a non-string `model` gives none. An invalid body is not
 * rejected: the last top-level `model` string seen counts. Not read: a value
 * over 1 KiB (JSON.parse would give a name the cardinality limiter turns into
 * `_OTHER`; here the label is left out), and anything after `maxBytes`.
 */
export class RequestBodyTap {
  private scanned = 0;
  private done = false;
  private depth = 0;
  private inString = false;
  private escaped = false;
  /** What the string being read is: a root key, the value of a root `model` key, or anything else. */
  private role = Role.Other;
  /** Where the root object is between its tokens. */
  private expect = Expect.Key;
  private keyIsModel = false;
  private keyIsPrediction = false;
  /** The last root `prediction` was an object. */
  private predictionSeen = false;
  private captured: number[] = [];
  private capturedOver = false;
  private found: string | undefined;

  constructor(private readonly maxBytes: number) {}

  push(chunk: Buffer): void {
    if (this.done) return;
    const room = this.maxBytes - this.scanned;
    const len = Math.min(chunk.length, room);
    this.scanned += len;
    this.scan(chunk, len);
    if (this.scanned >= this.maxBytes) this.done = true;
  }

  /** The root object's last `prediction` is an object (a request for a predicted output). */
  prediction(): boolean {
    return this.predictionSeen;
  }

  /** The root object's `model` string, if any. */
  model(): string | undefined {
    this.done = true;
    this.captured = [];
    return this.found;
  }

  private scan(buf: Buffer, len: number): void {
    let i = 0;
    // Next quote and backslash at or after i (-2: not searched yet, -1: none), each searched again only once passed.
    let q = -2;
    let b = -2;
    while (i < len && !this.done) {
      if (this.inString) {
        if (this.role === Role.Other && !this.escaped) {
          // Jump to the next quote or backslash.
          if (q !== -1 && q < i) q = buf.indexOf(QUOTE, i);
          if (b !== -1 && b < i) b = buf.indexOf(BACKSLASH, i);
          const j = q === -1 ? b : b === -1 ? q : Math.min(q, b);
          if (j === -1 || j >= len) return;
          i = j;
        }
        const c = buf[i++]!;
        if (this.escaped) {
          this.escaped = false;
          this.capture(c);
        } else if (c === BACKSLASH) {
          this.escaped = true;
          this.capture(c);
        } else if (c === QUOTE) {
          this.inString = false;
          this.endString();
        } else {
          this.capture(c);
        }
        continue;
      }
      const c = buf[i++]!;
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) continue;
      if (this.depth === 0) {
        if (c !== 0x7b /* { */) {
          this.done = true; // not an object (or the root object has ended)
          return;
        }
        this.depth = 1;
        this.expect = Expect.Key;
        continue;
      }
      const top = this.depth === 1;
      if (c === QUOTE) {
        this.inString = true;
        this.role = Role.Other;
        if (top && this.expect === Expect.Key) this.role = Role.Key;
        else if (top && this.expect === Expect.Value) this.role = this.keyIsModel ? Role.Model : Role.Other;
        if (this.role !== Role.Other) {
          this.captured = [];
          this.capturedOver = false;
        }
      } else if (c === 0x7b || c === 0x5b /* [ */) {
        if (top) this.nonStringValue(c === 0x7b);
        this.depth++;
      } else if (c === 0x7d || c === 0x5d /* ] */) {
        this.depth--;
        if (this.depth === 1) this.expect = Expect.Comma;
        else if (this.depth === 0) this.done = true;
      } else if (top) {
        if (c === 0x3a /* : */) this.expect = Expect.Value;
        else if (c === 0x2c /* , */) this.expect = Expect.Key;
        else this.nonStringValue(false); // a number or a literal
      }
    }
  }

  private nonStringValue(isObject: boolean): void {
    if (this.expect !== Expect.Value) return;
    if (this.keyIsModel) this.found = undefined; // the last `model` wins, and it is not a string
    if (this.keyIsPrediction) this.predictionSeen = isObject;
    this.expect = Expect.Comma;
  }

  private capture(c: number): void {
    if (this.role === Role.Other || this.capturedOver) return;
    if (this.captured.length >= (this.role === Role.Key ? MAX_KEY_BYTES : MAX_VALUE_BYTES)) {
      this.capturedOver = true;
      return;
    }
    this.captured.push(c);
  }

  private endString(): void {
    const role = this.role;
    this.role = Role.Other;
    if (this.depth !== 1) return;
    if (role === Role.Key) {
      const key = this.capturedOver ? undefined : decode(this.captured);
      this.keyIsModel = key === 'model';
      this.keyIsPrediction = key === 'prediction';
      this.expect = Expect.Colon;
    } else {
      if (role === Role.Model) this.found = this.capturedOver ? undefined : decode(this.captured);
      if (this.keyIsPrediction) this.predictionSeen = false; // a string: no prediction
      this.expect = Expect.Comma;
    }
  }
}

const enum Role {
  Other,
  Key,
  Model,
}

const enum Expect {
  Key,
  Colon,
  Value,
  Comma,
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
/** Longer keys cannot be `model`, even spelt with escapes (6 bytes per character at most). */
const MAX_KEY_BYTES = 64;
const MAX_VALUE_BYTES = 1024;

/** The JSON string whose bytes (between the quotes) these are, or undefined if it is not one. */
function decode(bytes: number[]): string | undefined {
  const raw = Buffer.from(bytes).toString('utf8');
  if (!raw.includes('\\')) return raw;
  try {
    return JSON.parse(`"${raw}"`) as string;
  } catch {
    return undefined;
  }
}
