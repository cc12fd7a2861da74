import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';

export const CLI = join(__dirname, '../../dist/cli.js');

export interface Spawned {
  child: ChildProcess;
  /** Parsed JSON log lines seen so far. */
  lines: Record<string, unknown>[];
  stderr: string;
  waitFor(pred: (line: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  exited: Promise<number | null>;
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/**
 * Runs `node dist/cli.js ...args` and collects its JSON log lines. `under`: a command it runs
 * under (`['prlimit', '--nofile=64:64']`).
 */
export function spawnCli(args: string[], env: NodeJS.ProcessEnv = {}, under: string[] = []): Spawned {
  const [command, ...before] = [...under, process.execPath];
  const child = spawn(command!, [...before, CLI, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: Record<string, unknown>[] = [];
  const waiters: { pred: (l: Record<string, unknown>) => boolean; resolve: (l: Record<string, unknown>) => void }[] = [];
  let buf = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => {
    buf += d.toString('utf8');
    let i: number;
    while ((i = buf.indexOf('\n')) !== -1) {
      const text = buf.slice(0, i);
      buf = buf.slice(i + 1);
      let line: Record<string, unknown>;
      try {
        line = JSON.parse(text) as Record<string, unknown>;
      } catch {
        line = { raw: text };
      }
      lines.push(line);
      for (const w of [...waiters]) if (w.pred(line)) { waiters.splice(waiters.indexOf(w), 1); w.resolve(line); }
    }
  });
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString('utf8')));
  // 'close', not 'exit': its output is read to the end then (the last log lines, written just before it exits).
  const exited = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)));
  const s: Spawned = {
    child,
    lines,
    get stderr() {
      return stderr;
    },
    waitFor(pred, timeoutMs = 15_000) {
      const found = lines.find(pred);
      if (found) return Promise.resolve(found);
      return new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`timed out waiting for a log line; stderr: ${stderr}; lines: ${JSON.stringify(lines)}`)), timeoutMs);
        waiters.push({ pred, resolve: (l) => { clearTimeout(t); resolve(l); } });
        void exited.then((code) => { clearTimeout(t); reject(new Error(`process exited (${code}) before the log line; stderr: ${stderr}`)); });
      });
    },
    exited,
    async stop(signal = 'SIGTERM') {
      if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
      child.kill(signal);
      const t = setTimeout(() => child.kill('SIGKILL'), 10_000);
      const code = await exited;
      clearTimeout(t);
      return code;
    },
  };
  return s;
}
