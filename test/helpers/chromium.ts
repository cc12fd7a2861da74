import { spawn, spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
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
 * the directories in `mounts` (npm packages loaded as ES modules), and `POST /result?run=<id>` is
 * how the page of run `id` reports (a report that is no JSON resolves as a failed one).
 * Cross-origin isolated (COOP + COEP), so the page's performance.now() has 5 µs resolution
 * instead of 100 µs.
 */
export async function startPageServer(dir: string, mounts: Record<string, string> = {}) {
  const waiting = new Map<string, (r: unknown) => void>();
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    if (req.method === 'POST' && url.pathname === '/result') {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (d: string) => (body += d));
      req.on('end', () => {
        res.end();
        let report: unknown;
        try {
          report = JSON.parse(body);
        } catch {
          report = { ok: false, error: `a report that is no JSON: ${body.slice(0, 200)}` };
        }
        const run = url.searchParams.get('run') ?? '';
        waiting.get(run)?.(report);
        waiting.delete(run);
      });
      return;
    }
    const path = decodeURIComponent(url.pathname);
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
    /** The report of run `id`, whenever it comes; `forget` drops the wait (a run that gave up). */
    result: (id: string) => new Promise<unknown>((r) => waiting.set(id, r)),
    forget: (id: string) => waiting.delete(id),
    close: () => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}

export type PageServer = Awaited<ReturnType<typeof startPageServer>>;

/**
 * Opens `path` (with its query) of the page server in headless Chromium (a fresh profile, no
 * proxy, nothing fetched from the network but loopback) and resolves with the page's report,
 * then quits Chromium. Rejects with Chromium's last stderr lines if it exits first or
 * `timeoutMs` passes. Each run has its own id, so a run that gave up leaves nothing for the next.
 */
export async function runPage(page: PageServer, path: string, timeoutMs = 60_000): Promise<unknown> {
  const id = randomUUID();
  const result = page.result(id);
  const url = `${page.origin}${path}${path.includes('?') ? '&' : '?'}run=${id}`;
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
  // Its own process group outlives this process unless ended with it (a killed test run).
  const onExit = () => {
    try {
      if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
    } catch {}
  };
  process.once('exit', onExit);
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
    page.forget(id);
    // Chromium runs as a process group (its renderers and helpers): end them all before its profile goes.
    await stopGroup(child.pid);
    process.removeListener('exit', onExit);
    try {
      rmSync(profile, { recursive: true, force: true, maxRetries: 5, retryDelay: 100 });
    } catch {} // a helper that outlived the wait may still write there: a temp dir left, not a failed test
  }
}

/**
 * Whether a process of the group is still running. Zombies do not count: once Chromium's main
 * process is gone its helpers are reaped by PID 1, which may take seconds, or never in a
 * container whose PID 1 reaps nothing.
 */
function groupAlive(pgid: number): boolean {
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    } catch {
      continue; // gone meanwhile
    }
    // pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
    const [state, , pgrp] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(pgrp) === pgid && state !== 'Z') return true;
  }
  return false;
}

/** SIGTERM to the group, SIGKILL after 5 s; resolved once none of it runs, or 5 s after the SIGKILL. */
async function stopGroup(pgid: number | undefined): Promise<void> {
  if (pgid === undefined) return;
  const signal = (s: NodeJS.Signals) => {
    try {
      process.kill(-pgid, s);
    } catch {} // the group is gone
  };
  signal('SIGTERM');
  for (let waited = 0; waited < 10_000 && groupAlive(pgid); waited += 50) {
    if (waited === 5_000) signal('SIGKILL');
    await new Promise((r) => setTimeout(r, 50));
  }
}
