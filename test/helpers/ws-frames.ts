import type { EventEmitter } from 'node:events';
import * as ws from 'ws';

/**
 * The `ws` library's own frame encoder and reader, which it exports and @types/ws does not
 * declare: tests check the proxy's frames against a real implementation, not code of ours.
 */
export const { Sender, Receiver } = ws as unknown as {
  Sender: { frame(data: Buffer, o: { fin: boolean; opcode: number; mask: boolean; readOnly: boolean; rsv1: boolean }): Buffer[] };
  Receiver: new (o: { isServer: boolean }) => EventEmitter & { write(b: Buffer): void };
};
