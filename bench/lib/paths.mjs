// Starting, probing and stopping the paths under test. Every server listens on
// 127.0.0.1; every child runs in its own process group so that it and its
// children (nginx workers) can be killed together.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { pathToFileURL, fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(HERE, '..', '..');
const PROBE = pathToFileURL(path.join(HERE, 'probe.mjs')).href;
const NGINX = '/usr/sbin/nginx';

/** every process group we started, for cleanup on any exit */
export const children = new Set();

export function killAllSync() {
  for (const c of children) {
    try {
      process.kill(-c.pid, 'SIGKILL');
    } catch {
      try {
        process.kill(c.pid, 'SIGKILL');
      } catch {}
    }
  }
  children.clear();
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function tcpReady(port, timeoutMs, child) {
  const until = Date.now() + timeoutMs;
  return new Promise((resolve, reject) => {
    const attempt = () => {
      if (child && child.exitCode !== null) {
        reject(new Error(`exited with code ${child.exitCode} before listening`));
        return;
      }
      if (child && child.signalCode) {
        reject(new Error(`killed by ${child.signalCode} before listening`));
        return;
      }
      const s = net.connect(port, '127.0.0.1');
      s.once('connect', () => {
        s.destroy();
        resolve();
      });
      s.once('error', () => {
        s.destroy();
        if (Date.now() > until) reject(new Error(`port ${port} not listening after ${timeoutMs} ms`));
        else setTimeout(attempt, 100);
      });
    };
    attempt();
  });
}

function spawnLogged(cmd, args, logFile, { ipc = false, env } = {}) {
  const fd = fs.openSync(logFile, 'a');
  const child = spawn(cmd, args, {
    cwd: ROOT,
    stdio: ['ignore', fd, fd, ...(ipc ? ['ipc'] : [])],
    detached: true, // own process group
    env: { ...process.env, ...env },
  });
  fs.closeSync(fd);
  children.add(child);
  child.on('exit', () => children.delete(child));
  child.on('error', () => {});
  return child;
}

export async function stopChild(child) {
  if (!child || child.exitCode !== null || child.signalCode) {
    children.delete(child);
    return;
  }
  const exited = new Promise((r) => child.once('exit', r));
  try {
    process.kill(-child.pid, 'SIGTERM');
  } catch {}
  const t = await Promise.race([exited.then(() => 'ok'), sleep(3000).then(() => 'timeout')]);
  if (t === 'timeout') {
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {}
    await Promise.race([exited, sleep(1000)]);
  }
  children.delete(child);
}

function logTail(file, n = 800) {
  try {
    const s = fs.readFileSync(file, 'utf8');
    return s.slice(-n).trim();
  } catch {
    return '';
  }
}

function nginxConf(tmp, port, upstreamPort, websocket = false) {
  const isRoot = typeof process.getuid === 'function' && process.getuid() === 0;
  // As root, nginx would switch workers to `nobody`; keep that (never run the
  // worker as root) and make the temp dir traversable for it.
  const user = isRoot ? 'user nobody nogroup;\n' : '';
  return `${user}daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile 20000;
pid ${tmp}/nginx.pid;
error_log ${tmp}/error.log warn;
events { worker_connections 19000; multi_accept on; }
http {
  access_log off;
  client_body_temp_path ${tmp}/client_body;
  proxy_temp_path ${tmp}/proxy;
  fastcgi_temp_path ${tmp}/fastcgi;
  uwsgi_temp_path ${tmp}/uwsgi;
  scgi_temp_path ${tmp}/scgi;
  keepalive_timeout 60s;
  keepalive_requests 100000;
  upstream emitter {
    server 127.0.0.1:${upstreamPort};
    keepalive 256;
    keepalive_requests 100000;
  }
  server {
    listen 127.0.0.1:${port} backlog=4096;
    location / {
      proxy_pass http://emitter;
      proxy_http_version 1.1;
${websocket ? '      proxy_set_header Upgrade $http_upgrade;\n      proxy_set_header Connection "upgrade";' : '      proxy_set_header Connection "";'}
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 300s;
    }
  }
}
`;
}

/** A space-separated environment variable as a word list (unset: none). */
const envWords = (name) => (process.env[name] ?? '').split(' ').filter(Boolean);

/**
 * Path definitions. start() returns an instance { url, headers, pids(), child,
 * metricsUrl?, memProbe? } or throws with the reason.
 */
export function pathDefs({ emitterUrl, emitterPort, tmpRoot, profileDir = null, websocket = false }) {
  const cli = path.join(ROOT, 'dist', 'cli.js');
  const nodePeer = (name, args, { headers = {}, metrics = false, profile = false } = {}) => ({
    name,
    async start(tag = '') {
      const port = await freePort();
      const metricsPort = await freePort();
      const log = path.join(tmpRoot, `${name}${tag}.log`);
      const a = args({ port, metricsPort });
      const prof = profile && profileDir ? ['--cpu-prof', `--cpu-prof-dir=${profileDir}`, `--cpu-prof-name=${name}${tag}.cpuprofile`] : [];
      const extra = name.startsWith('proxy') ? envWords('BENCH_PROXY_NODE_FLAGS') : [];
      if (name === 'proxy-alt') extra.push(...envWords('BENCH_ALT_NODE_FLAGS'));
      const child = spawnLogged(process.execPath, ['--expose-gc', ...extra, ...prof, '--import', PROBE, ...a], log, {
        ipc: true,
      });
      try {
        await tcpReady(port, 20_000, child);
      } catch (err) {
        await stopChild(child);
        throw new Error(`${err.message}; log: ${logTail(log)}`);
      }
      let memSeq = 0;
      return {
        name,
        child,
        url: `http://127.0.0.1:${port}`,
        headers,
        log,
        logTail: () => logTail(log),
        pids: () => [child.pid],
        mainPid: child.pid,
        metricsUrl: metrics ? `http://127.0.0.1:${metricsPort}/metrics` : null,
        memProbe: () =>
          new Promise((resolve) => {
            const id = ++memSeq;
            const t = setTimeout(() => resolve(null), 5000);
            const on = (m) => {
              if (m && m.probe === 'mem' && m.id === id) {
                clearTimeout(t);
                child.off('message', on);
                resolve(m);
              }
            };
            child.on('message', on);
            child.send({ probe: 'mem', id });
          }),
        stop: () => stopChild(child),
      };
    },
  });

  const proxyArgs = (extra, cliPath = cli) => ({ port, metricsPort }) => {
    if (!fs.existsSync(cliPath)) throw new Error(`${cliPath} not found (run npm run build)`);
    return [
      cliPath,
      '--upstream',
      emitterUrl,
      '--host',
      '127.0.0.1',
      '--port',
      String(port),
      '--metrics-host',
      '127.0.0.1',
      '--metrics-port',
      String(metricsPort),
      '--log-level',
      'warn',
      ...extra,
    ];
  };

  return {
    direct: {
      name: 'direct',
      async start() {
        return {
          name: 'direct',
          url: emitterUrl,
          headers: {},
          pids: () => [],
          metricsUrl: null,
          stop: async () => {},
        };
      },
    },
    proxy: nodePeer('proxy', proxyArgs([]), { metrics: true, profile: true }),
    // For A/B experiments, not in the default set: another build (BENCH_ALT_CLI), other
    // arguments (BENCH_ALT_ARGS, e.g. "--config /tmp/alt.yaml") or Node flags
    // (BENCH_ALT_NODE_FLAGS), alternated with the others.
    'proxy-alt': nodePeer('proxy-alt', proxyArgs(envWords('BENCH_ALT_ARGS'), process.env.BENCH_ALT_CLI), {
      metrics: true,
      profile: true,
    }),
    'proxy-nometrics': nodePeer('proxy-nometrics', proxyArgs(['--no-metrics']), { profile: true }),
    nginx: {
      name: 'nginx',
      async start(tag = '') {
        if (!fs.existsSync(NGINX)) throw new Error(`${NGINX} not installed`);
        const port = await freePort();
        const tmp = fs.mkdtempSync(path.join(tmpRoot, `nginx${tag}-`));
        fs.chmodSync(tmp, 0o755);
        fs.writeFileSync(path.join(tmp, 'nginx.conf'), nginxConf(tmp, port, emitterPort, websocket));
        const log = path.join(tmp, 'stderr.log');
        const child = spawnLogged(
          NGINX,
          ['-p', tmp, '-c', path.join(tmp, 'nginx.conf'), '-e', path.join(tmp, 'error.log')],
          log,
        );
        try {
          await tcpReady(port, 10_000, child);
        } catch (err) {
          await stopChild(child);
          throw new Error(`${err.message}; ${logTail(log)} ${logTail(path.join(tmp, 'error.log'))}`);
        }
        return {
          name: 'nginx',
          child,
          url: `http://127.0.0.1:${port}`,
          headers: {},
          log,
          mainPid: child.pid,
          pids: () => [child.pid, ...childPids(child.pid)],
          metricsUrl: null,
          logTail: () => logTail(path.join(tmp, 'error.log')),
          stop: () => stopChild(child),
        };
      },
    },
    'http-proxy': nodePeer('http-proxy', ({ port }) => [
      path.join(ROOT, 'bench', 'peers', 'http-proxy.mjs'),
      String(port),
      emitterUrl,
    ]),
    portkey: nodePeer(
      'portkey',
      ({ port }) => [path.join(ROOT, 'bench', 'peers', 'portkey.mjs'), `--port=${port}`, '--headless'],
      {
        headers: {
          'x-portkey-provider': 'openai',
          'x-portkey-custom-host': `${emitterUrl}/v1`,
        },
      },
    ),
  };
}

export function childPids(pid) {
  try {
    const s = fs.readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim();
    if (!s) return [];
    const kids = s.split(/\s+/).map(Number);
    return kids.flatMap((k) => [k, ...childPids(k)]);
  } catch {
    return [];
  }
}

const CLK_TCK = 100;
/**
 * CPU time (ms) used so far by pids, all their threads. From the scheduler's
 * exact runtime (/proc/PID/task/TID/schedstat, ns): utime+stime in /proc/PID/stat
 * are sampled once per tick on kernels with tick-based accounting (this one),
 * which over a 2 s run of a process using 0.4 core is ~80 samples, ±10 %.
 * Falls back to utime+stime where schedstat is missing. Threads that exited
 * during the run are not counted (Node's and nginx's are long-lived).
 */
export function cpuMsOf(pids) {
  let ms = 0;
  for (const pid of pids) {
    let ns = 0;
    let exact = true;
    try {
      for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
        const v = Number(fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
        if (!Number.isFinite(v)) exact = false;
        ns += v;
      }
    } catch {
      exact = false;
    }
    if (exact) {
      ms += ns / 1e6;
      continue;
    }
    try {
      const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
      ms += ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK;
    } catch {}
  }
  return ms;
}

/** VmRSS in KiB summed over pids */
export function rssKiBOf(pids) {
  let kib = 0;
  for (const pid of pids) {
    try {
      const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
      const m = /VmRSS:\s+(\d+)\s+kB/.exec(s);
      if (m) kib += Number(m[1]);
    } catch {}
  }
  return kib;
}

/** utime+stime (ms) of every process on the machine: Map pid -> ms */
export function allProcCpu() {
  const m = new Map();
  for (const d of fs.readdirSync('/proc')) {
    if (d.charCodeAt(0) < 48 || d.charCodeAt(0) > 57) continue;
    try {
      const s = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
      m.set(Number(d), ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK);
    } catch {}
  }
  return m;
}

/** CPU ms used between two allProcCpu() snapshots by processes not in `own` */
export function foreignCpuMs(before, after, own) {
  let ms = 0;
  for (const [pid, t] of after) {
    if (own.has(pid)) continue;
    ms += t - (before.get(pid) ?? 0); // a process born during the run counts in full
  }
  return ms;
}
