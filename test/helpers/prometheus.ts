import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/** A real Prometheus server (Debian package `prometheus`) on 127.0.0.1, for the e2e tests. */
export interface PrometheusServer {
  url: string;
  child: ChildProcess;
  /** Its stdout and stderr (the first 200 pieces), for failure messages. */
  output: string[];
  /** An instant query; a scalar comes back as one sample without labels. */
  query(expr: string): Promise<PromSample[]>;
  stop(): Promise<void>;
}

export type PromSample = { metric: Record<string, string>; value: [number, string] };

export function which(bin: string): string | null {
  const r = spawnSync('sh', ['-c', `command -v ${bin}`], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
}

export async function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const addr = s.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      s.close(() => res(port));
    });
  });
}

/** Writes `config` as `dir`/prometheus.yml and starts Prometheus on it; resolves once /-/ready answers. */
export async function startPrometheus(dir: string, config: string): Promise<PrometheusServer> {
  const bin = which('prometheus');
  if (!bin) throw new Error('prometheus not found on PATH: install the Debian/Ubuntu package `prometheus` (apt-get install prometheus)');
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  writeFileSync(join(dir, 'prometheus.yml'), config);
  const child = spawn(bin, [`--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'], {
    cwd: dir,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const output: string[] = [];
  child.stdout!.on('data', (d: Buffer) => output.length < 200 && output.push(d.toString()));
  child.stderr!.on('data', (d: Buffer) => output.length < 200 && output.push(d.toString()));
  const server: PrometheusServer = {
    url,
    child,
    output,
    async query(expr) {
      const r = await fetch(`${url}/api/v1/query?query=${encodeURIComponent(expr)}`);
      const j = (await r.json()) as { status: string; data?: { resultType: string; result: PromSample[] }; error?: string };
      if (j.status !== 'success') throw new Error(`query failed: ${expr}: ${j.error}`);
      if (j.data!.resultType === 'scalar') return [{ metric: {}, value: j.data!.result as unknown as [number, string] }];
      return j.data!.result;
    },
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise<void>((r) => child.once('exit', () => r()));
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(t);
    },
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`prometheus exited: ${output.join('')}`);
    try {
      if ((await fetch(`${url}/-/ready`)).ok) return server;
    } catch {
      /* not listening yet */
    }
    if (Date.now() > deadline) {
      await server.stop();
      throw new Error(`Prometheus not ready within 30 s: ${output.join('')}`);
    }
    await sleep(200);
  }
}
