import type { Socket } from 'node:net';

/** How far a pump got: bytes taken by the stream, and whether all of them were. */
export interface Progress {
  written: number;
  done: boolean;
}

type Drainable = NodeJS.WritableStream & { once(event: 'drain', listener: () => void): unknown };

/**
 * Writes `total` bytes as fast as `w` takes them (waiting for 'drain' when it says so), in pieces
 * from `pieceAt(offset)`; `progress` counts what it took. With `end`, ends `w` after the last.
 */
export function pump(w: Drainable, total: number, pieceAt: (offset: number) => Buffer, progress: Progress = { written: 0, done: false }, end = false): Progress {
  const next = (): void => {
    while (progress.written < total) {
      const piece = pieceAt(progress.written);
      progress.written += piece.length;
      if (!w.write(piece)) return void w.once('drain', next);
    }
    progress.done = true;
    if (end) w.end();
  };
  next();
  return progress;
}

/** Splits what `socket` reads into a response head (once, as text) and the body bytes after it. */
export function afterHead(socket: Socket, onHead: (head: string) => void, onBody: (b: Buffer) => void): void {
  let head: Buffer | undefined = Buffer.alloc(0);
  socket.on('data', (b: Buffer) => {
    if (head === undefined) return onBody(b);
    head = Buffer.concat([head, b]);
    const i = head.indexOf('\r\n\r\n');
    if (i < 0) return;
    const rest = head.subarray(i + 4);
    const text = head.subarray(0, i).toString('latin1');
    head = undefined;
    onHead(text);
    onBody(rest);
  });
}
