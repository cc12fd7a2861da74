import { readFileSync } from 'node:fs';
import http from 'node:http';
import { isIPv6 } from 'node:net';

/**
 * `llm-latency-proxy healthcheck`: GET /healthz on the metrics port of a proxy running with the
 * same configuration, for a container's HEALTHCHECK (slim images have no curl). The port and
 * host come from where the proxy's own come from: its flags, the `LLM_PROXY_*` environment and
 * the config file. A health check runs as a process of its own, with the container's
 * environment but not the proxy's flags (`docker run IMAGE --config /cfg.yaml`), so those are
 * read from the command line of PID 1 when PID 1 is this CLI running the proxy.
 */

/**
 * The proxy options on a command line that runs this CLI as the proxy (`node dist/cli.js
 * --config F`, also behind an init such as tini): what follows the script. Undefined for
 * anything else, the simulator and the health check included.
 */
export function proxyArgsOf(cmdline: readonly string[]): string[] | undefined {
  const i = cmdline.findIndex((a, k) => k > 0 && /(^|\/)(cli\.js|llm-latency-proxy)$/.test(a));
  if (i < 0) return undefined;
  const rest = cmdline.slice(i + 1);
  if (rest[0] === 'simulate' || rest[0] === 'healthcheck') return undefined;
  return rest;
}

/** PID 1's command line, if this process can read it (Linux). */
export function pid1Cmdline(path = '/proc/1/cmdline'): string[] | undefined {
  try {
    const parts = readFileSync(path, 'utf8').split('\0');
    if (parts.at(-1) === '') parts.pop(); // every argument ends with a NUL
    return parts;
  } catch {
    return undefined;
  }
}

/** The health URL of a proxy with this configuration, as seen from the same host. */
export function healthUrl({ host, port }: { host: string; port: number }): string {
  if (port === 0) throw new Error('the metrics port is 0 (any free port): give the health check the port the proxy got, with --metrics-port');
  // A wildcard address listens on loopback too; `::` on IPv4's as well (dual stack, Node's
  // default), which is there even where IPv6 is disabled.
  const h = host === '0.0.0.0' || host === '::' || host === '' ? '127.0.0.1' : host;
  return `http://${isIPv6(h) ? `[${h}]` : h}:${port}/healthz`;
}

/**
 * One GET of the health URL; resolves with what to print, healthy or not, by `timeoutMs` at the
 * latest (a deadline, not an idle timer: a peer that trickles bytes cannot hold it). The status
 * decides; the body is not read. node:http, not fetch: fetch refuses the ports browsers block
 * (6000, 6665–6669, ...), and loads undici.
 */
export function checkHealth(url: string, timeoutMs: number): Promise<{ healthy: boolean; message: string }> {
  return new Promise((resolve) => {
    const req = http.get(url, { agent: false }, (res) => {
      const status = res.statusCode ?? 0;
      clearTimeout(deadline);
      req.destroy();
      resolve({ healthy: status >= 200 && status < 300, message: `${url}: ${status}` });
    });
    const deadline = setTimeout(() => {
      req.destroy();
      resolve({ healthy: false, message: `${url}: no answer within ${timeoutMs} ms` });
    }, timeoutMs);
    req.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(deadline);
      resolve({ healthy: false, message: `${url}: ${e.code ?? e.message}` });
    });
  });
}
