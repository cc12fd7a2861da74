import { existsSync, readFileSync } from 'node:fs';

/** Below this open-file limit the start itself may run out (Node 20: 110 sufficed here, 96 did not; Node 24 starts with ~25). */
const MIN_OPEN_FILES = 128;

/**
 * The CLI's message when a start failed for want of file descriptors, else undefined. Node's
 * loader reads the modules in parallel (~100 at once) and reports one it could not open as
 * EMFILE, or as a package it cannot find that is there. `limit`: openFileLimit(), read before the
 * modules loaded (once they have taken every descriptor it could not be).
 */
export function descriptorShortage(err: NodeJS.ErrnoException, limit: number | undefined): string | undefined {
  const low = limit !== undefined && limit < MIN_OPEN_FILES;
  if (err.code !== 'EMFILE' && err.code !== 'ENFILE' && !(low && err.code === 'ERR_MODULE_NOT_FOUND' && namedModuleExists(err.message))) return undefined;
  const why = err.code === 'ENFILE' ? "the system's file table is full" : `the process may open ${limit ?? 'too few'} files (ulimit -n, systemd's LimitNOFILE, a container's nofile)`;
  return `cannot start: out of file descriptors: ${why}. Starting takes up to ~100 (Node's loader opens the modules in parallel), and each open stream two (three with the built-in simulator): give it several thousand. (${err.message})`;
}

/**
 * Whether the file a "Cannot find module/package" message names, or its package's folder, exists
 * (a stat: no descriptor needed). A module that is not there is a broken install, not the limit.
 */
function namedModuleExists(message: string): boolean {
  const path = /Cannot find (?:module|package) '([^']+)'/.exec(message)?.[1];
  if (path === undefined) return false;
  const pkg = /^(.*[\\/]node_modules[\\/](?:@[^\\/]+[\\/])?[^\\/]+)/.exec(path)?.[1];
  return existsSync(pkg ?? path);
}

/** The soft open-file limit (Linux), or undefined where it cannot be read or is unlimited. */
export function openFileLimit(): number | undefined {
  try {
    const n = Number(/^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1]);
    return Number.isFinite(n) && n > 0 ? n : undefined;
  } catch {
    return undefined;
  }
}
