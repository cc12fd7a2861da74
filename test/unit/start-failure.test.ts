import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { descriptorShortage, descriptorWarning, openFileLimit } from '../../src/start-failure.js';

const err = (code: string, message: string) => Object.assign(new Error(message), { code }) as NodeJS.ErrnoException;
const root = join(__dirname, '../..');

describe('a start that failed for want of file descriptors', () => {
  it('EMFILE names the limit; ENFILE the system table; either whatever the limit', () => {
    expect(descriptorShortage(err('EMFILE', "EMFILE: too many open files, open 'x.js'"), 64)).toBe(
      "cannot start: out of file descriptors: the process may open 64 files (ulimit -n, systemd's LimitNOFILE, a container's nofile). Starting takes over 100 on Node 20, about 25 on Node 24 (Node's loader opens the modules in parallel), and each open stream two (three with the built-in simulator): give it several thousand. (EMFILE: too many open files, open 'x.js')",
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

describe('the start warning on too few file descriptors', () => {
  const TWO = "two per stream: the client's connection and the upstream's";
  const THREE = "three per stream: the client's connection, the upstream's and the built-in simulator's end of it";
  const PAST = 'past them, libuv closes connections without a word and upstream connections fail';
  const RAISE = "Raise the nofile limit (ulimit -n, systemd's LimitNOFILE, a container's nofile) to several thousand";

  it('without a cap: said when fewer than 100 streams fit beside ~100 descriptors of the process, in words that fit the count', () => {
    // Two descriptors a stream upstream, three with the built-in simulator.
    expect(descriptorWarning(300, undefined, false)).toBeUndefined();
    expect(descriptorWarning(299, undefined, false)).toEqual({
      fields: { openFileLimit: 299, streams: 99 },
      msg: `the process may open 299 file descriptors, room for about 99 concurrent streams (${TWO}; ~100 more for the process itself): ${PAST} (503 proxy_out_of_resources). ${RAISE}`,
    });
    expect(descriptorWarning(400, undefined, true)).toBeUndefined();
    expect(descriptorWarning(399, undefined, true)).toEqual({
      fields: { openFileLimit: 399, streams: 99 },
      msg: `the process may open 399 file descriptors, room for about 99 concurrent streams (${THREE}; ~100 more for the process itself): ${PAST} (503 proxy_out_of_resources, or 502 where the simulator could not accept them). ${RAISE}`,
    });
    expect(descriptorWarning(102, undefined, false)?.msg).toMatch(/^the process may open 102 file descriptors, room for about 1 concurrent stream \(/);
    expect(descriptorWarning(102, undefined, false)?.fields).toEqual({ openFileLimit: 102, streams: 1 });
    expect(descriptorWarning(104, undefined, false)?.msg).toMatch(/room for about 2 concurrent streams \(/);
    for (const files of [101, 64, 1]) {
      expect(descriptorWarning(files, undefined, false)?.fields, String(files)).toEqual({ openFileLimit: files, streams: 0 });
      expect(descriptorWarning(files, undefined, false)?.msg, String(files)).toMatch(/room for few if any concurrent streams \(/);
    }
  });

  it('with a cap: said (and only that) when the cap needs more than the limit, with the cap that would fit, if any', () => {
    // A cap that fits, even with fewer than 100 streams: its own choice, nothing said.
    expect(descriptorWarning(300, 100, false)).toBeUndefined();
    expect(descriptorWarning(200, 50, false)).toBeUndefined();
    expect(descriptorWarning(250, 50, true)).toBeUndefined();
    expect(descriptorWarning(299, 100, false)).toEqual({
      fields: { maxConnections: 100, openFileLimit: 299 },
      msg: `listen.maxConnections (100) needs ~300 file descriptors (${TWO}), more than the process may open (299): ${PAST} (503 proxy_out_of_resources). Raise the nofile limit, or lower the cap to 99 or less`,
    });
    expect(descriptorWarning(399, 100, true)?.msg).toMatch(/needs ~400 file descriptors \(three per stream.*, or lower the cap to 99 or less$/);
    // Room for no stream: no cap would do.
    expect(descriptorWarning(64, 10, false)?.msg).toMatch(/more than the process may open \(64\): .*\. Raise the nofile limit$/);
  });
});

