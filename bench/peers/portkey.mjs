// Starts @portkey-ai/gateway bound to 127.0.0.1 only. The gateway calls
// serve({port}) which listens on all interfaces; we pin every listen() of this
// process to 127.0.0.1 before importing its entry point.
// usage: node bench/peers/portkey.mjs --port=PORT [--headless]
import net from 'node:net';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import path from 'node:path';

const origListen = net.Server.prototype.listen;
net.Server.prototype.listen = function patchedListen(...args) {
  if (args.length && typeof args[0] === 'object' && args[0] !== null && !Array.isArray(args[0])) {
    args[0] = { ...args[0], host: '127.0.0.1' };
  } else if (typeof args[0] === 'number' || (typeof args[0] === 'string' && /^\d+$/.test(args[0]))) {
    const port = Number(args[0]);
    const rest = args.slice(1).filter((a) => typeof a === 'function');
    args = [port, '127.0.0.1', ...rest];
  }
  return origListen.apply(this, args);
};

// console.clear() and the spinner are noise in a log file.
console.clear = () => {};
const require = createRequire(import.meta.url);
const pkgJson = require.resolve('@portkey-ai/gateway/package.json');
const entry = path.join(path.dirname(pkgJson), 'build', 'start-server.js');
await import(pathToFileURL(entry).href);
