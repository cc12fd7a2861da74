import { crc32 } from 'node:zlib';

/**
 * An AWS event-stream frame around `headers` (already encoded) and `payload`, written from the
 * format's description rather than with the proxy's own encoder: total and headers length, the
 * prelude's CRC-32, then the frame's.
 */
export function rawFrame(headers: Buffer, payload: Buffer): Buffer {
  const total = 12 + headers.length + payload.length + 4;
  const out = Buffer.alloc(total);
  out.writeUInt32BE(total, 0);
  out.writeUInt32BE(headers.length, 4);
  out.writeUInt32BE(crc32(out.subarray(0, 8)), 8);
  headers.copy(out, 12);
  payload.copy(out, 12 + headers.length);
  out.writeUInt32BE(crc32(out.subarray(0, total - 4)), total - 4);
  return out;
}

/** Event-stream headers, each of type 7 (string). */
export function stringHeaders(headers: Record<string, string>): Buffer {
  return Buffer.concat(
    Object.entries(headers).map(([k, v]) => {
      const value = Buffer.from(v);
      const h = Buffer.alloc(1 + k.length + 3);
      h.writeUInt8(k.length, 0);
      h.write(k, 1, 'latin1');
      h.writeUInt8(7, 1 + k.length);
      h.writeUInt16BE(value.length, 2 + k.length);
      return Buffer.concat([h, value]);
    }),
  );
}
