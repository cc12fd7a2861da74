import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { extname, join, normalize, sep } from 'node:path';

/** Debian's package `chromium` (.ci/run installs it). */
export const CHROMIUM = process.env.CHROMIUM_BIN ?? '/usr/bin/chromium';

/** Why Chromium cannot run here, or undefined. */
export function chromiumMissing(): string | undefined {
  const r = spawnSync(CHROMIUM, ['--version'], { encoding: 'utf8' });
  if (r.status === 0) return undefined;
  return `${CHROMIUM} is needed (Debian: apt-get install chromium; .ci/run does): ${r.error?.message ?? r.stderr.trim()}`;
}

const TYPES: Record<string, string> = { '.html': 'text/html; charset=utf-8', '.mjs': 'text/javascript', '.js': 'text/javascript', '.json': 'application/json' };

/**
 * The page's own origin: `/` is `page.html` from `dir`, other files from `dir`, `/<name>/...` from
 * the directories in `mounts` (npm packages loaded as ES modules), and `POST /result` is how the
 * page reports. Cross-origin isolated (COOP + COEP), so the page's performance.now() has 5 µs
 * resolution instead of 100 µs.
 */
export async function startPageServer(dir: string, mounts: Record<string, string> = {}) {
  const waiting: ((r: unknown) => void)[] = [];
  const server = http.createServer((req, res) => {
    if (req.method === 'POST' && req.url === '/result') {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (d: string) => (body += d));
      req.on('end', () => {
        res.end();
        waiting.shift()?.(JSON.parse(body));
      });
      return;
    }
    const path = decodeURIComponent(new URL(req.url ?? '/', 'http://x').pathname);
    const [, first = '', ...rest] = path.split('/');
    const base = mounts[first] ?? dir;
    const file = normalize(join(base, path === '/' ? 'page.html' : mounts[first] ? rest.join('/') : path));
    let data: Buffer;
    try {
      if (!file.startsWith(base + sep)) throw new Error('outside');
      data = readFileSync(file);
    } catch {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, {
      'content-type': TYPES[extname(file)] ?? 'application/octet-stream',
      'cross-origin-opener-policy': 'same-origin',
      'cross-origin-embedder-policy': 'require-corp',
    });
    res.end(data);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    /** The next report a page POSTs. */
    nextResult: () => new Promise<unknown>((r) => waiting.push(r)),
    close: () => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}

/**
 * Opens `url` in headless Chromium (a fresh profile, no proxy, nothing fetched from the network
 * but loopback) and resolves with what `result` resolves to (the page's report), then quits it.
 * Rejects with Chromium's last stderr lines if it exits first or `timeoutMs` passes.
 */
export async function runPage<T>(url: string, result: Promise<T>, timeoutMs = 60_000): Promise<T> {
  const profile = mkdtempSync(join(tmpdir(), 'llp-chromium-'));
  const child = spawn(CHROMIUM, [
    '--headless',
    // Root in a container: Chromium's sandbox needs user namespaces it may not have.
    '--no-sandbox',
    '--disable-gpu',
    '--disable-dev-shm-usage',
    '--no-proxy-server',
    '--no-first-run',
    '--no-default-browser-check',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--disable-extensions',
    '--mute-audio',
    '--password-store=basic',
    `--user-data-dir=${profile}`,
    url,
  ], { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (d: string) => (stderr = (stderr + d).slice(-4000)));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      result,
      exited.then((code) => Promise.reject(new Error(`Chromium exited (${code}) before the page reported; stderr: ${stderr}`))),
      new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`the page did not report within ${timeoutMs} ms; Chromium's stderr: ${stderr}`)), timeoutMs))),
      new Promise<never>((_, reject) => child.once('error', reject)),
    ]);
  } finally {
    clearTimeout(timer);
    // Chromium runs as a process group (its renderers and helpers): end them all before its profile goes.
    await stopGroup(child.pid);
    rmSync(profile, { recursive: true, force: true, maxRetries: 5, retryDelay: 100 });
  }
}

const groupAlive = (pgid: number) => {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
};

/** SIGTERM to the group, SIGKILL after 5 s, resolved once no process of the group is left. */
async function stopGroup(pgid: number | undefined): Promise<void> {
  if (pgid === undefined || !groupAlive(pgid)) return;
  process.kill(-pgid, 'SIGTERM');
  for (let waited = 0; groupAlive(pgid); waited += 50) {
    if (waited === 5_000) process.kill(-pgid, 'SIGKILL');
    await new Promise((r) => setTimeout(r, 50));
  }
}
