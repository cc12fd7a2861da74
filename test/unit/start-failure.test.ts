import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { descriptorShortage, openFileLimit } from '../../src/start-failure.js';

const err = (code: string, message: string) => Object.assign(new Error(message), { code }) as NodeJS.ErrnoException;
const root = join(__dirname, '../..');

describe('a start that failed for want of file descriptors', () => {
  it('EMFILE names the limit; ENFILE the system table; either whatever the limit', () => {
    expect(descriptorShortage(err('EMFILE', "EMFILE: too many open files, open 'x.js'"), 64)).toBe(
      "cannot start: out of file descriptors: the process may open 64 files (ulimit -n, systemd's LimitNOFILE, a container's nofile). Starting takes up to ~100 (Node's loader opens the modules in parallel), and each open stream two (three with the built-in simulator): give it several thousand. (EMFILE: too many open files, open 'x.js')",
    );
    expect(descriptorShortage(err('EMFILE', 'm'), undefined)).toMatch(/the process may open too few files/);
    expect(descriptorShortage(err('ENFILE', 'm'), 65536)).toMatch(/^cannot start: out of file descriptors: the system's file table is full\./);
  });

  it('a module "not found" is the limit only under 128 descriptors and when the module (or its package) is there', () => {
    const hono = `Cannot find package '${root}/node_modules/@hono/node-server/index.js' imported from ${root}/dist/server.js`;
    const plain = `Cannot find package '${root}/node_modules/yaml/index.js' imported from ${root}/dist/config.js`;
    const own = `Cannot find module '${root}/src/start-failure.ts' imported from ${root}/dist/main.js`;
    for (const m of [hono, plain, own]) expect(descriptorShortage(err('ERR_MODULE_NOT_FOUND', m), 64), m).toMatch(/^cannot start: out of file descriptors/);
    // A broken install: the package or the module is not there.
    const gone = `Cannot find package '${root}/node_modules/@hono/no-such-package/index.js' imported from ${root}/dist/server.js`;
    const missing = `Cannot find module '${root}/dist/no-such-module.js' imported from ${root}/dist/main.js`;
    for (const m of [gone, missing, 'Cannot find something else']) expect(descriptorShortage(err('ERR_MODULE_NOT_FOUND', m), 64), m).toBeUndefined();
    // Enough descriptors to start: not the limit.
    expect(descriptorShortage(err('ERR_MODULE_NOT_FOUND', hono), 128)).toBeUndefined();
    expect(descriptorShortage(err('ERR_MODULE_NOT_FOUND', hono), undefined)).toBeUndefined();
    expect(descriptorShortage(err('EADDRINUSE', 'm'), 64)).toBeUndefined();
  });

  it('reads the open-file limit of this process', () => {
    const n = openFileLimit();
    if (process.platform !== 'linux') return void expect(n).toBeUndefined();
    const line = /^Max open files\s+(\S+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))![1];
    expect(n).toBe(line === 'unlimited' ? undefined : Number(line));
  });
});
