import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { EventStreamDecoder, EventStreamError, encodeEventStreamFrame, type EventStreamEvent } from '../../src/sse/eventstream.js';
import { rawFrame } from '../helpers/eventstream-frame.js';
import { FIXTURE_DIR, fixture } from '../helpers/fixtures.js';

function decodeAll(chunks: Buffer[]): EventStreamEvent[] {
  const out: EventStreamEvent[] = [];
  const d = new EventStreamDecoder((e) => out.push(e));
  for (const c of chunks) d.push(c);
  return out;
}

/** The botocore-decoded companions of the .bin fixtures are the oracle. */
function oracle(name: string): { type: string; messageType: string; payload: unknown }[] {
  return readFileSync(join(FIXTURE_DIR, name), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { headers: Record<string, string>; payload: unknown })
    .map((r) => ({ type: r.headers[':event-type']!, messageType: r.headers[':message-type']!, payload: r.payload }));
}

describe('AWS event-stream decoder', () => {
  for (const name of ['bedrock-converse-stream', 'bedrock-invoke-anthropic']) {
    it(`${name}.bin decodes to the botocore-decoded frames, however it is split`, () => {
      const bytes = fixture(`${name}.bin`);
      const want = oracle(`${name}.decoded.jsonl`);
      const check = (events: EventStreamEvent[]) => {
        expect(events.map((e) => ({ type: e.type, messageType: e.messageType, payload: JSON.parse(e.data) }))).toEqual(want);
      };
      check(decodeAll([bytes]));
      for (let i = 1; i < bytes.length; i++) {
        const got = decodeAll([bytes.subarray(0, i), bytes.subarray(i)]);
        if (got.length !== want.length) expect(got.length, `split at ${i}`).toBe(want.length);
      }
      check(decodeAll(Array.from({ length: bytes.length }, (_, i) => Buffer.from(bytes.subarray(i, i + 1)))));
    });
  }

  it('round-trips frames it encodes, including an exception frame', () => {
    const a = encodeEventStreamFrame({ ':event-type': 'chunk', ':content-type': 'application/json', ':message-type': 'event' }, '{"bytes":"e30="}');
    const b = encodeEventStreamFrame({ ':exception-type': 'throttlingException', ':content-type': 'application/json', ':message-type': 'exception' }, '{"message":"slow down °"}');
    const events = decodeAll([Buffer.concat([a, b])]);
    expect(events).toEqual([
      { type: 'chunk', data: '{"bytes":"e30="}', id: undefined, messageType: 'event' },
      { type: 'throttlingException', data: '{"message":"slow down °"}', id: undefined, messageType: 'exception' },
    ]);
  });

  it('skips headers of other value types (bool, byte, short, int, long, timestamp, uuid, bytes)', () => {
    const frame = encodeEventStreamFrame({ ':event-type': 'metadata', ':message-type': 'event' }, '{}');
    // Re-build the frame with extra typed headers in front.
    const extra = Buffer.concat([
      Buffer.from([1, 0x62, 0]), // "b" bool true
      Buffer.from([1, 0x66, 1]), // "f" bool false
      Buffer.from([1, 0x63, 2, 0x7f]), // "c" byte
      Buffer.from([1, 0x73, 3, 0, 9]), // "s" int16
      Buffer.from([1, 0x6c, 5, 0, 0, 0, 0, 0, 0, 0, 2]), // "l" int64
      Buffer.from([1, 0x69, 4, 0, 0, 0, 7]), // "i" int32
      Buffer.from([1, 0x74, 8, 0, 0, 0, 0, 0, 0, 0, 1]), // "t" timestamp
      Buffer.concat([Buffer.from([1, 0x75, 9]), Buffer.alloc(16, 0xab)]), // "u" uuid
      Buffer.from([1, 0x79, 6, 0, 2, 0xff, 0xfe]), // "y" bytes
    ]);
    const headersLen = frame.readUInt32BE(4);
    const headers = Buffer.concat([extra, frame.subarray(12, 12 + headersLen)]);
    const rebuilt = rawFrame(headers, frame.subarray(12 + headersLen, frame.length - 4));
    expect(decodeAll([rebuilt])).toEqual([{ type: 'metadata', data: '{}', id: undefined, messageType: 'event' }]);
  });

  it('a corrupt frame throws one EventStreamError and the decoder stays stopped', () => {
    const good = fixture('bedrock-converse-stream.bin');
    for (const at of [2, 9, 40, 0xa1 - 2]) {
      const bad = Buffer.from(good);
      bad[at] = bad[at]! ^ 0x5a;
      const out: EventStreamEvent[] = [];
      const d = new EventStreamDecoder((e) => out.push(e));
      expect(() => d.push(bad.subarray(0, 300)), `byte ${at}`).toThrow(EventStreamError);
      expect(d.failed).toBe(true);
      expect(() => d.push(bad.subarray(300))).not.toThrow();
      expect(out.length).toBe(0);
    }
  });

  it('skips a well-formed frame over the size limit unread and decodes the frames after it, however split', () => {
    const frame = (type: string, payload: string) => encodeEventStreamFrame({ ':event-type': type, ':message-type': 'event' }, payload);
    const bytes = Buffer.concat([frame('a', '1'), frame('big', 'x'.repeat(5000)), frame('b', '2'), frame('big', 'y'.repeat(4200)), frame('c', '3')]);
    const run = (pieces: Buffer[]) => {
      const out: string[] = [];
      const d = new EventStreamDecoder((e) => out.push(`${e.type}=${e.data}`), { maxFrameBytes: 4096 });
      for (const p of pieces) d.push(p);
      return { out, d };
    };
    const whole = run([bytes]);
    expect(whole.out).toEqual(['a=1', 'b=2', 'c=3']);
    expect(whole.d.oversizeFrames).toBe(2);
    expect(whole.d.failed).toBe(false);
    for (let i = 1; i < bytes.length; i += 7) {
      for (const j of [i + 1, i + 11, i + 4100]) {
        const got = run([bytes.subarray(0, i), bytes.subarray(i, j), bytes.subarray(j)]).out;
        if (got.join() !== 'a=1,b=2,c=3') expect(got, `split at ${i}, ${j}`).toEqual(['a=1', 'b=2', 'c=3']);
      }
    }
  });

  it('rejects impossible lengths, and an oversize frame whose prelude CRC is wrong, before buffering them', () => {
    const big = encodeEventStreamFrame({ ':event-type': 'chunk', ':message-type': 'event' }, 'x'.repeat(5000));
    big[8] = big[8]! ^ 0xff;
    const d = new EventStreamDecoder(() => undefined, { maxFrameBytes: 4096 });
    expect(() => d.push(big.subarray(0, 12))).toThrow(/prelude CRC/);
    const tiny = Buffer.alloc(12);
    tiny.writeUInt32BE(8, 0); // shorter than the minimum frame
    expect(() => new EventStreamDecoder(() => undefined).push(tiny)).toThrow(/lengths/);
  });
});
