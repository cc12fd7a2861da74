/**
 * Reads what measurement needs from the request body (the model name) from a
 * bounded copy of the bytes as they are forwarded. Never holds more than the
 * request body itself, and only up to `maxBytes`.
 */
export class RequestBodyTap {
  private parts: Buffer[] = [];
  private bytes = 0;
  private overflow = false;

  constructor(private readonly maxBytes: number) {}

  push(chunk: Buffer): void {
    if (this.overflow) return;
    if (this.bytes + chunk.length > this.maxBytes) {
      // Keep the head: `model` is nearly always near the start of the JSON.
      const room = this.maxBytes - this.bytes;
      if (room > 0) this.parts.push(chunk.subarray(0, room));
      this.bytes = this.maxBytes;
      this.overflow = true;
      return;
    }
    this.parts.push(chunk);
    this.bytes += chunk.length;
  }

  /** The `model` field of a JSON body, if any. Releases the copy. */
  model(): string | undefined {
    const parts = this.parts;
    this.parts = [];
    if (this.bytes === 0) return undefined;
    const text = Buffer.concat(parts, this.bytes).toString('utf8');
    if (!this.overflow) {
      try {
        const obj = JSON.parse(text) as unknown;
        if (obj && typeof obj === 'object' && typeof (obj as { model?: unknown }).model === 'string') {
          return (obj as { model: string }).model;
        }
        return undefined;
      } catch {
        /* not JSON: fall through to the scan */
      }
    }
    const m = /"model"\s*:\s*"((?:[^"\\]|\\.){1,256})"/.exec(text);
    if (!m) return undefined;
    try {
      return JSON.parse(`"${m[1]}"`) as string;
    } catch {
      return undefined;
    }
  }
}
