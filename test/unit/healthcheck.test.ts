import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { buildConfig } from '../../src/config.js';
import { healthUrl, pid1Cmdline, proxyArgsOf } from '../../src/healthcheck.js';
import { tempDir } from '../helpers/temp-dir.js';

describe('healthcheck: which proxy it checks', () => {
  it("takes the proxy's flags from a command line that runs this CLI as the proxy, also behind an init", () => {
    expect(proxyArgsOf(['node', 'dist/cli.js', '--config', '/cfg.yaml'])).toEqual(['--config', '/cfg.yaml']);
    expect(proxyArgsOf(['/usr/local/bin/node', '/app/dist/cli.js'])).toEqual([]);
    expect(proxyArgsOf(['/sbin/tini', '--', 'node', '/app/dist/cli.js', '--metrics-port', '9000'])).toEqual(['--metrics-port', '9000']);
    expect(proxyArgsOf(['node', '/usr/lib/node_modules/llm-latency-proxy/bin/llm-latency-proxy', '-p', '1'])).toEqual(['-p', '1']);
  });

  it('takes nothing from the simulator, from another health check, or from another program', () => {
    expect(proxyArgsOf(['node', 'dist/cli.js', 'simulate', '--port', '8081'])).toBeUndefined();
    expect(proxyArgsOf(['node', 'dist/cli.js', 'healthcheck'])).toBeUndefined();
    expect(proxyArgsOf(['nginx', '-g', 'daemon off;'])).toBeUndefined();
    expect(proxyArgsOf(['node', 'server.js', '--port', '1'])).toBeUndefined();
    expect(proxyArgsOf(['cli.js'])).toBeUndefined(); // the program itself is not its script
    expect(proxyArgsOf([])).toBeUndefined();
  });

  it('reads a NUL-separated command line, empty arguments kept', () => {
    const dir = tempDir('hc-');
    const f = join(dir, 'cmdline');
    writeFileSync(f, 'node\0dist/cli.js\0--upstream\0\0--port\x008080\0');
    expect(pid1Cmdline(f)).toEqual(['node', 'dist/cli.js', '--upstream', '', '--port', '8080']);
    expect(pid1Cmdline(join(dir, 'missing'))).toBeUndefined();
  });

  it('asks the metrics address, a wildcard as loopback, IPv6 in brackets', () => {
    const url = (metrics: { host?: string; port?: number }) => healthUrl(buildConfig({ metrics }).metrics);
    expect(url({})).toBe('http://127.0.0.1:9464/healthz');
    expect(url({ host: '0.0.0.0', port: 9000 })).toBe('http://127.0.0.1:9000/healthz');
    expect(url({ host: '::', port: 9000 })).toBe('http://127.0.0.1:9000/healthz'); // dual stack; ::1 may be disabled
    expect(url({ host: 'fd00::5', port: 9000 })).toBe('http://[fd00::5]:9000/healthz');
    expect(url({ host: 'localhost', port: 1 })).toBe('http://localhost:1/healthz');
    expect(() => url({ port: 0 })).toThrow(/metrics port is 0/);
  });
});
