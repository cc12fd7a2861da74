import net, { type AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { answerClientError, clientErrorAnswer } from '../../src/proxy/server-answers.js';

const coded = (code: string, message = 'x', rawPacket?: Buffer) => Object.assign(new Error(message), { code, rawPacket });

/** A connected pair: the server's end, and everything the client end reads until it closes. */
async function pair(): Promise<{ server: net.Socket; received: Promise<string>; close: () => void }> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const accepted = new Promise<net.Socket>((r) => srv.once('connection', r));
  const client = net.connect((srv.address() as AddressInfo).port, '127.0.0.1');
  client.on('error', () => {});
  const received = new Promise<string>((resolve) => {
    let text = '';
    client.on('data', (d: Buffer) => (text += d.toString('latin1')));
    client.on('close', () => resolve(text));
  });
  const server = await accepted;
  server.on('error', () => {});
  return { server, received, close: () => srv.close() };
}

describe("Node's own answers, taken over", () => {
  it("keeps Node's status for each parse error and says what a TLS handshake or an HTTP/2 preface is", () => {
    expect(clientErrorAnswer(coded('HPE_HEADER_OVERFLOW'))?.status).toBe(431);
    expect(clientErrorAnswer(coded('HPE_CHUNK_EXTENSIONS_OVERFLOW'))?.status).toBe(413);
    expect(clientErrorAnswer(coded('ERR_HTTP_REQUEST_TIMEOUT'))).toMatchObject({ status: 408, type: 'request_timeout' });
    expect(clientErrorAnswer(coded('HPE_INVALID_EOF_STATE'))).toMatchObject({ status: undefined, type: 'client_cancelled' });
    expect(clientErrorAnswer(coded('HPE_INVALID_METHOD', 'Parse Error: Invalid method encountered'))).toEqual({ status: 400, type: 'invalid_http', message: 'Parse Error: Invalid method encountered' });
    expect(clientErrorAnswer(coded('HPE_INVALID_METHOD', 'm', Buffer.from([0x16, 0x03, 0x01, 0x00])))?.message).toMatch(/TLS handshake/);
    expect(clientErrorAnswer(coded('HPE_INVALID_METHOD', 'm', Buffer.from([0x16, 0x20])))?.message).toBe('m');
    expect(clientErrorAnswer(coded('HPE_PAUSED_H2_UPGRADE'))?.message).toMatch(/HTTP\/2/);
    // Transport errors are owed nothing.
    for (const code of ['ECONNRESET', 'EPIPE', 'ETIMEDOUT', '']) expect(clientErrorAnswer(coded(code))).toBeUndefined();
    expect(clientErrorAnswer(Object.assign(new Error('x'), { code: 42 }))).toBeUndefined();
  });

  it('answers a head that did not arrive in time with a JSON 408 and closes; a reset gets no bytes', async () => {
    const a = await pair();
    expect(answerClientError(coded('ERR_HTTP_REQUEST_TIMEOUT'), a.server)?.status).toBe(408);
    const text = await a.received;
    expect(text).toMatch(/^HTTP\/1\.1 408 Request Timeout\r\ncontent-type: application\/json\r\ncontent-length: (\d+)\r\nconnection: close\r\n\r\n/);
    const body = text.slice(text.indexOf('\r\n\r\n') + 4);
    expect(Number(/content-length: (\d+)/.exec(text)![1])).toBe(Buffer.byteLength(body));
    expect(JSON.parse(body).error.type).toBe('request_timeout');
    a.close();

    const b = await pair();
    expect(answerClientError(coded('ECONNRESET'), b.server)).toBeUndefined();
    expect(await b.received).toBe('');
    expect(b.server.destroyed).toBe(true);
    b.close();
  });

  it('writes nothing into an answer already begun on the connection, and still closes it', async () => {
    const a = await pair();
    (a.server as unknown as { _httpMessage: unknown })._httpMessage = { headersSent: true };
    a.server.write('HTTP/1.1 200 OK\r\n\r\npart');
    expect(answerClientError(coded('HPE_INVALID_METHOD'), a.server)?.status).toBe(400);
    expect(await a.received).toBe('HTTP/1.1 200 OK\r\n\r\npart');
    a.close();
  });
});
