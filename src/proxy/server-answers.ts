/**
 * Answers Node's HTTP server gives by itself, taken over so that the proxy logs them and
 * answers in its own JSON: HTTP the parser refuses (`clientError`: 400, 408, 413, 431), an
 * `Expect` it cannot meet (417), and `100 Continue`, which Node sends the moment it parses the
 * head, before the proxy decides whether the request is forwarded at all.
 */
import { maxHeaderSize, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { rawErrorResponse } from './tunnel.js';

export interface ClientErrorAnswer {
  /** Undefined when there is nothing to answer (the client closed in the middle of its request). */
  status: number | undefined;
  type: string;
  message: string;
  /** The client spoke HTTP/2 (prior knowledge): answered in HTTP/2, which is all it can read. */
  http2?: boolean;
}

const H2_MESSAGE = 'HTTP/2 with prior knowledge is not served: HTTP/1.1 only';

/**
 * A server connection preface (an empty SETTINGS frame) and a GOAWAY with HTTP_1_1_REQUIRED
 * (RFC 9113 §3.4, §6.8, §7) whose debug data says why: an HTTP/2 client shows that reason,
 * where an HTTP/1.1 400 would reach it as a garbled frame.
 */
function http2Refusal(message: string): Buffer {
  const debug = Buffer.from(message, 'latin1');
  const settings = Buffer.from([0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
  const goaway = Buffer.alloc(9 + 8 + debug.length);
  goaway.writeUIntBE(8 + debug.length, 0, 3);
  goaway[3] = 0x7; // GOAWAY; flags 0, stream 0
  goaway.writeUInt32BE(0, 9); // last stream id: none was processed
  goaway.writeUInt32BE(0xd, 13); // HTTP_1_1_REQUIRED
  debug.copy(goaway, 17);
  return Buffer.concat([settings, goaway]);
}

type ParseError = Error & { code?: unknown; rawPacket?: unknown };

/** The answer Node's server is writing on this connection, if any (an internal Node field). */
export function answerInProgress(socket: Duplex): { headersSent?: boolean } | null | undefined {
  return (socket as { _httpMessage?: { headersSent?: boolean } | null })._httpMessage;
}

/**
 * What a connection error from Node's server means for the client, with Node's own choice of
 * status; undefined for a transport error (a reset, a broken pipe), which no answer or log
 * line is owed.
 */
export function clientErrorAnswer(err: ParseError): ClientErrorAnswer | undefined {
  const code = typeof err.code === 'string' ? err.code : '';
  switch (code) {
    case 'HPE_HEADER_OVERFLOW':
      return { status: 431, type: 'header_too_large', message: `the request head is over ${maxHeaderSize} bytes` };
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return { status: 413, type: 'chunk_extensions_too_large', message: 'chunk extensions over 16 KiB' };
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return { status: 408, type: 'request_timeout', message: 'the request head did not arrive in time' };
    case 'HPE_INVALID_EOF_STATE':
      return { status: undefined, type: 'client_cancelled', message: 'the client closed the connection in the middle of a request' };
  }
  if (!code.startsWith('HPE_')) return undefined;
  const raw = err.rawPacket;
  // A TLS ClientHello starts with a handshake record (0x16) of version 3.x.
  if (Buffer.isBuffer(raw) && raw[0] === 0x16 && raw[1] === 0x03) {
    return { status: 400, type: 'invalid_http', message: 'a TLS handshake on a plain-HTTP port: connect with http://, or put TLS in front of the proxy' };
  }
  if (code === 'HPE_PAUSED_H2_UPGRADE') return { status: 400, type: 'invalid_http', message: H2_MESSAGE, http2: true };
  return { status: 400, type: 'invalid_http', message: err.message.slice(0, 200) };
}

/**
 * Node's default `clientError` behaviour with the proxy's body: an answer only where no answer on
 * the connection has begun (it would land inside that one), then the connection closes at once,
 * as Node closes it (the parser has failed; what follows cannot be read).
 */
export function answerClientError(err: ParseError, socket: Duplex): ClientErrorAnswer | undefined {
  const answer = clientErrorAnswer(err);
  if (answer?.status !== undefined && socket.writable && !answerInProgress(socket)?.headersSent) {
    try {
      socket.write(answer.http2 === true ? http2Refusal(answer.message) : rawErrorResponse(answer.status, answer.type, answer.message));
    } catch {
      // closed under us: nothing to answer
    }
  }
  socket.destroy();
  return answer;
}

/** A request that gets its `100 Continue` when it is forwarded, not when its head is parsed. */
const deferred = new WeakSet<ServerResponse>();

/** For the server's `checkContinue` event: marks the response, then the request is handled. */
export function deferContinue(res: ServerResponse): void {
  deferred.add(res);
}

/** Sends the `100 Continue` a client is waiting for before its body, when one is owed. */
export function sendDeferredContinue(res: ServerResponse): void {
  if (!deferred.delete(res) || res.headersSent || res.destroyed) return;
  res.writeContinue();
}
