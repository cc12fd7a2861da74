import fs from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import tls from 'node:tls';

/**
 * An upstream that answers every request from its head with a 413 whose JSON body is `answer`,
 * then closes with the request body unread: its kernel resets the connection while the body is
 * still being sent (as a load balancer that refuses a request over its size limit does).
 * With `tlsFiles`, over TLS.
 */
export async function startRefusingUpstream(answer: string, tlsFiles?: { key: string; cert: string }): Promise<{ port: number; requests: () => number; close: () => Promise<void> }> {
  let requests = 0;
  const sockets = new Set<net.Socket>();
  const serve = (sock: net.Socket) => {
    sockets.add(sock);
    sock.on('error', () => {});
    sock.once('data', () => {
      requests++;
      sock.pause();
      sock.write(`HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: ${Buffer.byteLength(answer)}\r\n\r\n${answer}`, () => sock.destroy());
    });
  };
  const server = tlsFiles ? tls.createServer({ key: fs.readFileSync(tlsFiles.key), cert: fs.readFileSync(tlsFiles.cert) }, serve) : net.createServer(serve);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as AddressInfo).port,
    requests: () => requests,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}
