/** The pieces `ranges` (flat start/end pairs, as ChunkedDecoder reports them) of `buf`, as views. */
export function views(buf: Buffer, ranges: readonly number[]): Buffer[] {
  const out: Buffer[] = [];
  for (let k = 0; k < ranges.length; k += 2) out.push(buf.subarray(ranges[k], ranges[k + 1]));
  return out;
}

/** `buf` cut at `cuts` (each taken modulo its length + 1, repeated cuts once, in order); empty pieces only with `keepEmpty`. */
export function splitAt(buf: Buffer, cuts: readonly number[], keepEmpty = false): Buffer[] {
  const points = [...new Set(cuts.map((c) => c % (buf.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let prev = 0;
  for (const p of points) {
    out.push(buf.subarray(prev, p));
    prev = p;
  }
  out.push(buf.subarray(prev));
  return keepEmpty ? out : out.filter((b) => b.length > 0);
}
