// Node peer: the `http-proxy` package (1.18) as a plain streaming reverse proxy.
// usage: node bench/peers/http-proxy.mjs <listenPort> <upstreamUrl>
import http from 'node:http';
import httpProxy from 'http-proxy';

const [port, target] = process.argv.slice(2);
const proxy = httpProxy.createProxyServer({
  target,
  agent: new http.Agent({ keepAlive: true, maxSockets: Infinity }),
  xfwd: false,
});
proxy.on('error', (err, req, res) => {
  if (res && !res.headersSent && typeof res.writeHead === 'function') res.writeHead(502);
  if (res && typeof res.end === 'function') res.end();
});
const server = http.createServer((req, res) => proxy.web(req, res));
server.keepAliveTimeout = 60_000;
server.requestTimeout = 0;
server.listen(Number(port), '127.0.0.1');
