/** The pieces `ranges` (flat start/end pairs, as ChunkedDecoder reports them) of `buf`, as views. */
export function views(buf: Buffer, ranges: readonly number[]): Buffer[] {
  const out: Buffer[] = [];
  for (let k = 0; k < ranges.length; k += 2) out.push(buf.subarray(ranges[k], ranges[k + 1]));
  return out;
}
