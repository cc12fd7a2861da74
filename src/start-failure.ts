import { existsSync, readFileSync } from 'node:fs';

/** Below this open-file limit the start itself may run out (Node 20: 110 sufficed here, 105 did not; Node 24 starts with ~25). */
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
  return `cannot start: out of file descriptors: ${why}. Starting takes over 100 on Node 20, about 25 on Node 24 (Node's loader opens the modules in parallel), and each open stream two (three with the built-in simulator): give it several thousand. (${err.message})`;
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

/** Descriptors the process needs besides its streams' (stdio, the listeners, scrapes, OTLP, name lookups). */
const RESERVED_FILES = 100;
/** Without a cap, a start warns when fewer streams than this fit in the open-file limit. */
const FEW_STREAMS = 100;

/**
 * What a start says when the open-file limit `files` is below what the streams will take: the
 * cap's needs, or without a cap, room for fewer than FEW_STREAMS; else undefined. Past the limit
 * failures are the only sign, and starting proves little (Node 24 starts with ~25 descriptors).
 */
export function descriptorWarning(files: number, maxConnections: number | undefined, simulator: boolean): { fields: Record<string, number>; msg: string } | undefined {
  // The built-in simulator's end of each upstream connection is in this process too.
  const [perStream, counted, fail] = !simulator
    ? [2, "two per stream: the client's connection and the upstream's", '503 proxy_out_of_resources']
    : [3, "three per stream: the client's connection, the upstream's and the built-in simulator's end of it", '503 proxy_out_of_resources, or 502 where the simulator could not accept them'];
  const fit = Math.max(0, Math.floor((files - RESERVED_FILES) / perStream));
  const past = `past them, libuv closes connections without a word and upstream connections fail (${fail})`;
  if (maxConnections !== undefined) {
    const needs = perStream * maxConnections + RESERVED_FILES;
    if (needs <= files) return undefined;
    // With room for no stream at all, no cap would do.
    const lower = fit === 0 ? '' : `, or lower the cap to ${fit} or less`;
    return {
      fields: { maxConnections, openFileLimit: files },
      msg: `listen.maxConnections (${maxConnections}) needs ~${needs} file descriptors (${counted}), more than the process may open (${files}): ${past}. Raise the nofile limit${lower}`,
    };
  }
  if (fit >= FEW_STREAMS) return undefined;
  const room = fit === 0 ? 'few if any concurrent streams' : fit === 1 ? 'about 1 concurrent stream' : `about ${fit} concurrent streams`;
  return {
    fields: { openFileLimit: files, streams: fit },
    msg: `the process may open ${files} file descriptors, room for ${room} (${counted}; ~${RESERVED_FILES} more for the process itself): ${past}. Raise the nofile limit (ulimit -n, systemd's LimitNOFILE, a container's nofile) to several thousand`,
  };
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
