import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { buildConfig, ConfigError, ENV_NAMES, envOverrides, hostOf, loadConfig, logLevelOf, unknownEnvWarnings, upstreamOf } from '../../src/config.js';
import { tempDir } from '../helpers/temp-dir.js';

function errorOf(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
  throw new Error('expected a ConfigError');
}

describe('default timeouts', () => {
  it('end just before the official SDKs\' own read timeout: a slow answer is not cut into a 504 they retry, a hang is still the proxy\'s timeout', () => {
    const t = loadConfig({}, {}).timeouts;
    for (const sdkMs of [OpenAI.DEFAULT_TIMEOUT, Anthropic.DEFAULT_TIMEOUT]) {
      for (const s of [t.response, t.idle]) {
        expect(s * 1000).toBeLessThan(sdkMs);
        expect(s * 1000).toBeGreaterThanOrEqual(sdkMs - 15_000);
      }
    }
  });

  it('custom ITL buckets without the stall alert\'s 1 s boundary get a warning that names it; with it, none', () => {
    const without = buildConfig({ metrics: { buckets: { itl: [0.001, 0.01, 0.1, 2] } } });
    expect(without.warnings?.join('\n')).toMatch(/metrics\.buckets\.itl has no 1 s boundary.*LLMProxyStreamStalls/);
    expect(buildConfig({ metrics: { buckets: { itl: [0.001, 0.01, 1, 2] } } }).warnings).toEqual([]);
    expect(loadConfig({}, {}).warnings).toEqual([]);
  });

  it('leave a request that runs into them in a finite duration bucket, and a first token just inside the response timeout in a finite TTFT bucket', () => {
    const c = loadConfig({}, {});
    expect(c.metrics.buckets.duration.at(-1)).toBeGreaterThan(Math.max(c.timeouts.response, c.timeouts.idle));
    // A reasoning model may think for minutes: its TTFT must not land in +Inf while the proxy still waits.
    expect(c.metrics.buckets.ttft.at(-1)).toBeGreaterThan(c.timeouts.response);
  });
});

describe('config', () => {
  it('defaults to the built-in simulator when no upstream is given', () => {
    const c = buildConfig({});
    expect(c.useSimulator).toBe(true);
    expect(c.port).toBe(8080);
    expect(c.metrics.port).toBe(9464);
    expect(c.host).toBe('127.0.0.1');
    expect(c.metrics.maxModelValues).toBe(100);
    expect(c.metrics.loopDelayResolutionMs).toBe(50);
    expect(buildConfig({ metrics: { loopDelayResolutionMs: 10 } }).metrics.loopDelayResolutionMs).toBe(10);
  });

  it("refuses a simulator plan the simulator's /_sim/config would refuse, naming the key", () => {
    expect(buildConfig({ simulator: { tokens: 1_000_000, itl: 0.001 } }).simulator.tokens).toBe(1_000_000);
    expect(errorOf(() => buildConfig({ simulator: { tokens: 1_000_001 } }))).toMatch(/simulator\.tokens: expected an integer from 1 to 1000000/);
    expect(errorOf(() => buildConfig({ simulator: { tokens: 2.5 } }))).toMatch(/simulator\.tokens: expected an integer/);
    expect(errorOf(() => buildConfig({ simulator: { ttft: 3_000_000 } }))).toMatch(/simulator\.ttft: expected a number of seconds from 0 to 2147483/);
    expect(errorOf(() => buildConfig({ simulator: { jitter: 1.5 } }))).toMatch(/simulator\.jitter: expected a number from 0 to 1/);
    expect(errorOf(() => buildConfig({ simulator: { itl: -1 } }))).toMatch(/simulator\.itl: expected a number of seconds from 0 to 2147483/);
    // Each value allowed, their schedule not: the last token past Node's longest timer.
    expect(errorOf(() => buildConfig({ simulator: { tokens: 1_000_000, itl: 2, jitter: 0.1 } }))).toMatch(/\n  simulator: the last token could be due after 2200000 s \(ttft \+ tokens × itl × \(1 \+ jitter\)\)/);
    expect(errorOf(() => buildConfig({ simulator: { ttft: 2_147_483 } }))).toMatch(/due after 2147483\.308 s/);
    // A value already refused is the one message.
    expect(errorOf(() => buildConfig({ simulator: { tokens: 1_000_001, itl: 5 } })).split('\n').filter((l) => l.includes('simulator'))).toHaveLength(1);
  });

  it('reads several routes from YAML', () => {
    const dir = tempDir('cfg-');
    const file = join(dir, 'c.yaml');
    writeFileSync(
      file,
      'routes:\n  - prefix: /openai\n    upstream: https://api.openai.com\n  - prefix: /anthropic/\n    upstream: https://api.anthropic.com\n    provider: anthropic\n  - prefix: /\n    upstream: http://vllm:8000\nlisten:\n  port: 9000\n',
    );
    const c = loadConfig({ config: file }, {});
    expect(c.routes.map((r) => r.prefix)).toEqual(['/openai', '/anthropic', '/']);
    expect(c.routes[1]!.provider).toBe('anthropic');
    expect(c.port).toBe(9000);
    expect(c.useSimulator).toBe(false);
  });

  it('flags win over the environment, which wins over the file', () => {
    const dir = tempDir('cfg-');
    const file = join(dir, 'c.yaml');
    writeFileSync(file, 'listen: {port: 1111}\nmetrics: {port: 2222}\nupstream: http://file:1\n');
    const env = { LLM_PROXY_CONFIG: file, LLM_PROXY_PORT: '3333', LLM_PROXY_UPSTREAM: 'http://env:2' };
    const c = loadConfig({ port: 4444 }, env);
    expect(c.port).toBe(4444);
    expect(c.metrics.port).toBe(2222);
    expect(c.routes[0]!.upstream).toBe('http://env:2');
    const c2 = loadConfig({}, env);
    expect(c2.port).toBe(3333);
  });

  it('the OTLP endpoint variables win over the file\'s otlp.endpoint (the exporter reads them when given no URL)', () => {
    const dir = tempDir('cfg-');
    const file = join(dir, 'c.yaml');
    writeFileSync(file, 'otlp: {enabled: true, endpoint: "http://file:4318/v1/metrics"}\n');
    expect(loadConfig({ config: file }, {}).otlp.endpoint).toBe('http://file:4318/v1/metrics');
    for (const name of ['OTEL_EXPORTER_OTLP_METRICS_ENDPOINT', 'OTEL_EXPORTER_OTLP_ENDPOINT']) {
      expect(loadConfig({ config: file }, { [name]: 'http://env:4318' }).otlp.endpoint, name).toBeUndefined();
    }
    expect(loadConfig({ config: file }, { OTEL_EXPORTER_OTLP_ENDPOINT: ' ' }).otlp.endpoint).toBe('http://file:4318/v1/metrics');
  });

  it('a bad value from a variable or flag is named by that variable or flag', () => {
    expect(errorOf(() => envOverrides({ LLM_PROXY_LOG_LEVEL: 'INFO' }))).toMatch(/^LLM_PROXY_LOG_LEVEL: expected one of trace, .* got "INFO"$/);
    expect(errorOf(() => envOverrides({ LLM_PROXY_UPSTREAM: 'localhost:8000' }))).toMatch(/^LLM_PROXY_UPSTREAM: must be an absolute http/);
    expect(errorOf(() => logLevelOf('--log-level', 'bogus'))).toMatch(/^--log-level: /);
    expect(errorOf(() => upstreamOf('--upstream', 'localhost:8000'))).toMatch(/^--upstream: /);
    // An empty listen address would listen on every interface.
    expect(errorOf(() => hostOf('--host', ''))).toMatch(/^--host: must not be empty/);
    expect(hostOf('--host', '0.0.0.0')).toBe('0.0.0.0');
    // ... from a variable or the file too (a blank one failed later as a name lookup).
    expect(errorOf(() => envOverrides({ LLM_PROXY_HOST: ' ' }))).toMatch(/^LLM_PROXY_HOST: must not be empty/);
    expect(errorOf(() => envOverrides({ LLM_PROXY_METRICS_HOST: '\t' }))).toMatch(/^LLM_PROXY_METRICS_HOST: must not be empty/);
    expect(errorOf(() => buildConfig({ listen: { host: ' ' } }, {}))).toMatch(/listen\.host: must not be empty/);
    expect(errorOf(() => buildConfig({ metrics: { host: '' } }, {}))).toMatch(/metrics\.host: must not be empty/);
    // Credentials in an upstream URL would be dropped silently.
    expect(errorOf(() => upstreamOf('--upstream', 'http://user:secret@vllm:8000'))).toMatch(/^--upstream: must not contain user:password/);
    expect(errorOf(() => upstreamOf('LLM_PROXY_UPSTREAM', 'https://user:s3cret@api.example.com/v1'))).not.toMatch(/s3cret/); // not echoed back
    // Nor a key in the query, the natural first try for Gemini or Azure (review 140).
    expect(errorOf(() => upstreamOf('--upstream', 'https://generativelanguage.googleapis.com/v1beta?key=AIzaSECRET'))).toBe(
      '--upstream: must not contain a query or fragment (got "https://generativelanguage.googleapis.com/v1beta?…")',
    );
    expect(errorOf(() => upstreamOf('--upstream', 'https://gw.example/v1?user=alice@example.com&key=SECRET'))).toMatch(/\(got "https:\/\/gw\.example\/v1\?…"\)$/);
    expect(errorOf(() => upstreamOf('LLM_PROXY_UPSTREAM', 'https://r.openai.azure.com/openai#api-key=SECRET'))).toMatch(/\(got "https:\/\/r\.openai\.azure\.com\/openai#…"\)$/);
    expect(errorOf(() => buildConfig({ routes: [{ prefix: '/', upstream: 'https://u:p@api.example.com' }] }, {}))).toMatch(/routes\[0\]\.upstream: must not contain user:password/);
  });

  it('--upstream (or LLM_PROXY_UPSTREAM) with a routes file sets the upstream of "/" and keeps the other routes', () => {
    const routes = [
      { prefix: '/anthropic', upstream: 'https://api.anthropic.com', provider: 'anthropic' },
      { prefix: '/', upstream: 'http://file:1', providerName: 'vllm' },
    ];
    const c = buildConfig({ routes }, { upstream: 'http://flag:2' });
    expect(c.routes.map((r) => [r.prefix, r.upstream, r.provider ?? r.providerName])).toEqual([
      ['/anthropic', 'https://api.anthropic.com', 'anthropic'],
      ['/', 'http://flag:2', 'vllm'],
    ]);
    // From the environment, and with no "/" route in the file: one is added.
    const file = join(tempDir('cfg-'), 'c.yaml');
    writeFileSync(file, 'routes:\n  - prefix: /anthropic\n    upstream: https://api.anthropic.com\n');
    const c2 = loadConfig({ config: file }, { LLM_PROXY_UPSTREAM: 'http://env:3' });
    expect(c2.routes.map((r) => [r.prefix, r.upstream])).toEqual([
      ['/anthropic', 'https://api.anthropic.com'],
      ['/', 'http://env:3'],
    ]);
    const c3 = buildConfig({ routes: [routes[0]!] }, { upstream: 'http://flag:2' });
    expect(c3.routes.map((r) => [r.prefix, r.upstream])).toEqual([
      ['/anthropic', 'https://api.anthropic.com'],
      ['/', 'http://flag:2'],
    ]);
    expect(c3.useSimulator).toBe(false);
  });

  it('refuses timeouts longer than a Node timer can hold (which would fire after 1 ms)', () => {
    for (const key of ['connect', 'response', 'idle', 'keepAlive']) {
      // keepAlive one second less: Node's server waits a second past it (below).
      const max = key === 'keepAlive' ? 2_147_482 : 2_147_483;
      expect(errorOf(() => buildConfig({ timeouts: { [key]: 3_000_000 } }))).toMatch(new RegExp(`timeouts\\.${key}: must be at most ${max} s`));
      expect(buildConfig({ timeouts: { [key]: max } }).timeouts[key as 'connect']).toBe(max);
    }
    expect(errorOf(() => buildConfig({ drainTimeout: 3_000_000 }))).toMatch(/drainTimeout: must be at most/);
    expect(errorOf(() => buildConfig({}, { drainTimeout: 3_000_000 }))).toMatch(/drain timeout: must be at most/);
    // The variable is checked where it is read, so its error names it.
    expect(errorOf(() => envOverrides({ LLM_PROXY_DRAIN_TIMEOUT: '3000000' }))).toMatch(/^LLM_PROXY_DRAIN_TIMEOUT: expected a number of seconds from 0 to 2147483/);
    expect(envOverrides({ LLM_PROXY_DRAIN_TIMEOUT: '2147483' }).drainTimeout).toBe(2_147_483);
    expect(errorOf(() => buildConfig({ metrics: { finalScrapeWait: 3_000_000 } }))).toMatch(/metrics\.finalScrapeWait: must be at most/);
    expect(errorOf(() => envOverrides({ LLM_PROXY_FINAL_SCRAPE_WAIT: '-1' }))).toMatch(/^LLM_PROXY_FINAL_SCRAPE_WAIT: expected a number of seconds from 0 to 2147483/);
    expect(errorOf(() => buildConfig({}, { finalScrapeWait: Number.NaN }))).toMatch(/final scrape wait \(--final-scrape-wait, LLM_PROXY_FINAL_SCRAPE_WAIT\): must be from 0 to 2147483/);
    expect(errorOf(() => buildConfig({ otlp: { intervalSeconds: 3_000_000 } }))).toMatch(/otlp\.intervalSeconds: must be at most/);
    expect(errorOf(() => envOverrides({ OTEL_METRIC_EXPORT_INTERVAL: '3000000000' }))).toMatch(/OTEL_METRIC_EXPORT_INTERVAL: expected milliseconds from 100 to 2147483000/);
    expect(envOverrides({ OTEL_METRIC_EXPORT_INTERVAL: '2147483000' }).otlpIntervalMs).toBe(2_147_483_000);
  });

  it('names the bad key', () => {
    expect(errorOf(() => buildConfig({ routes: [{ prefix: '/', upstream: 'ftp://x' }] }))).toMatch(/routes\[0\]\.upstream: must be an absolute http/);
    expect(errorOf(() => buildConfig({ routes: [{ prefix: 'x', upstream: 'http://x' }] }))).toMatch(/routes\[0\]\.prefix/);
    expect(errorOf(() => buildConfig({ upstrem: 'http://x' }))).toMatch(/upstrem: unknown key/);
    // A key no one could read in the message (empty, a space, a dot, a line break) is quoted.
    expect(errorOf(() => buildConfig({ '': 1, timeouts: { 'idle ': 5 }, routes: [{ prefix: '/', upstream: 'http://x', 'a.b': 1, 'x\n': 2 }] }))).toBe(
      'invalid configuration in config:\n  routes[0]["a.b"]: unknown key\n  routes[0]["x\\n"]: unknown key\n  timeouts["idle "]: unknown key\n  [""]: unknown key',
    );
    expect(errorOf(() => buildConfig({ timeouts: { 'idle\u200b': 5, 'r\u202eesponse': 5 } }))).toBe('invalid configuration in config:\n  timeouts["idle\\u200b"]: unknown key\n  timeouts["r\\u202eesponse"]: unknown key');
    // Several unknown keys: one indented line each; a key left out is said to be required.
    expect(errorOf(() => buildConfig({ routes: [{ path: '/', upstream: 'http://x', timeouts: {} }] }))).toBe(
      'invalid configuration in config:\n  routes[0].prefix: required (string)\n  routes[0].path: unknown key\n  routes[0].timeouts: unknown key',
    );
    // A misspelt provider would silently fall back to path detection.
    expect(errorOf(() => buildConfig({ routes: [{ prefix: '/', upstream: 'http://x', provider: 'antropic' }] }))).toMatch(
      /^invalid configuration in config:\n  routes\[0\]\.provider: unknown provider "antropic" \(one of: openai, .*\banthropic\b.*\)$/,
    );
    expect(buildConfig({ routes: [{ prefix: '/', upstream: 'http://x', provider: 'anthropic' }] }).routes[0]!.provider).toBe('anthropic');
    expect(errorOf(() => buildConfig({ routes: [{ prefix: '/', upstream: 5 }] }))).toMatch(/routes\[0\]\.upstream: Invalid input: expected string, received number/);
    expect(errorOf(() => buildConfig({ metrics: { port: 'abc' } }))).toMatch(/metrics\.port/);
    expect(errorOf(() => buildConfig({ limits: { maxBufferedBytes: -1 } }))).toMatch(/^invalid configuration in config:\n  limits\.maxBufferedBytes: /);
    expect(errorOf(() => buildConfig({ limits: { maxBufferedBytes: 1.5 } }))).toMatch(/limits\.maxBufferedBytes: /);
    expect(buildConfig({}).limits.maxBufferedBytes).toBe(64 * 1024 * 1024);
    expect(buildConfig({ limits: { maxBufferedBytes: 0 } }).limits.maxBufferedBytes).toBe(0);
    expect(errorOf(() => buildConfig({ metrics: { buckets: { itl: [0.002, 0.001] } } }))).toMatch(/metrics\.buckets\.itl: must be strictly increasing/);
    expect(errorOf(() => buildConfig({ metrics: { loopDelayResolutionMs: 0 } }))).toMatch(/metrics\.loopDelayResolutionMs/);
    expect(errorOf(() => buildConfig({ metrics: { loopDelayResolutionMs: 2.5 } }))).toMatch(/metrics\.loopDelayResolutionMs/);
    // A period near the scrape interval would leave windows without two samples, i.e. no gauges.
    expect(errorOf(() => buildConfig({ metrics: { loopDelayResolutionMs: 15_000 } }))).toMatch(/metrics\.loopDelayResolutionMs/);
    expect(errorOf(() => buildConfig({ timeouts: { upstreamKeepAlive: 1e9 } }))).toMatch(/timeouts\.upstreamKeepAlive:/);
    expect(errorOf(() => buildConfig({ timeouts: { connect: -1 } }))).toMatch(/timeouts\.connect/);
    expect(errorOf(() => buildConfig({ timeouts: { keepAlive: 0 } }))).toMatch(/timeouts\.keepAlive/);
    expect(buildConfig({}).timeouts.keepAlive).toBe(65);
    expect(buildConfig({}).timeouts.upstreamKeepAlive).toBe(4);
    expect(buildConfig({ timeouts: { upstreamKeepAlive: 90 } }).timeouts.upstreamKeepAlive).toBe(90);
    expect(errorOf(() => buildConfig({ timeouts: { upstreamKeepAlive: 0 } }))).toMatch(/timeouts\.upstreamKeepAlive:/);
    expect(buildConfig({}).timeouts.upstreamKeepAliveMax).toBe(600);
    expect(buildConfig({ timeouts: { upstreamKeepAliveMax: 30 } }).timeouts.upstreamKeepAliveMax).toBe(30);
    expect(errorOf(() => buildConfig({ timeouts: { upstreamKeepAliveMax: 7200 } }))).toMatch(/timeouts\.upstreamKeepAliveMax:/);
    expect(errorOf(() => buildConfig({ routes: [{ prefix: '/a', upstream: 'http://x' }, { prefix: '/a/', upstream: 'http://y' }] }))).toMatch(/routes\[1\]\.prefix: duplicate/);
    expect(errorOf(() => buildConfig({}, { upstream: 'not a url' }))).toMatch(/^upstream:/);
    expect(errorOf(() => buildConfig({}, { logLevel: 'loud' }))).toMatch(/log level/);
    expect(errorOf(() => envOverrides({ LLM_PROXY_PORT: '80a' }))).toMatch(/LLM_PROXY_PORT/);
    expect(errorOf(() => envOverrides({ LLM_PROXY_METRICS_PORT: '70000' }))).toMatch(/LLM_PROXY_METRICS_PORT/);
  });

  it('reports unreadable and non-YAML files', () => {
    expect(errorOf(() => loadConfig({ config: '/nonexistent/x.yaml' }, {}))).toMatch(/cannot read config file/);
    const dir = tempDir('cfg-');
    const file = join(dir, 'bad.yaml');
    writeFileSync(file, 'routes: [\n');
    expect(errorOf(() => loadConfig({ config: file }, {}))).toMatch(/not valid YAML/);
  });

  it('refuses an upstream that is there but empty instead of falling back to the simulator, and ignores it beside another (reviews 121, 123)', () => {
    expect(errorOf(() => loadConfig({}, { LLM_PROXY_UPSTREAM: '' }))).toBe('LLM_PROXY_UPSTREAM: set but empty, and no other upstream is given (unset it to use the built-in simulator)');
    expect(errorOf(() => loadConfig({}, { LLM_PROXY_UPSTREAM: '  ' }))).toMatch(/^LLM_PROXY_UPSTREAM: set but empty/);
    expect(errorOf(() => buildConfig({ routes: [] }, {}, 'r.yaml'))).toBe('invalid configuration in r.yaml:\n  routes: must list at least one route (remove the key to use the built-in simulator)');
    expect(loadConfig({}, {}).useSimulator).toBe(true); // nothing given at all: the simulator
    // A template that always renders the variable, beside a routes file or a flag: ignored.
    const dir = tempDir('cfg-');
    const file = join(dir, 'routes.yaml');
    writeFileSync(file, 'routes: [{prefix: /, upstream: "http://file:1"}]\n');
    expect(loadConfig({ config: file }, { LLM_PROXY_UPSTREAM: '' }).routes[0]!.upstream).toBe('http://file:1');
    expect(loadConfig({ upstream: 'http://flag:1' }, { LLM_PROXY_UPSTREAM: '' }).routes[0]!.upstream).toBe('http://flag:1');
    // routes: [] with an upstream from a flag or variable: that upstream's "/" route.
    expect(buildConfig({ routes: [] }, { upstream: 'http://flag:1' }).routes).toEqual([{ prefix: '/', upstream: 'http://flag:1', stripPrefix: true, forwardedHeaders: true }]);
  });

  it('refuses route prefixes no request path can match: a query, a fragment, a glob, white space (review 121)', () => {
    for (const prefix of ['/v1/*', '/a?x=1', '/a#b', '/a b', '/a\tb', '/ünicode', '/a\u0000']) {
      expect(errorOf(() => buildConfig({ routes: [{ prefix, upstream: 'http://u:1' }] })), prefix).toMatch(/routes\[0\]\.prefix: a path prefix without "\?", "#", "\*", white space or characters outside ASCII/);
    }
    for (const prefix of ['/v1/chat-completions_2.x~', '/%C3%BCnicode', '/a+b@c:d;e', '/%20']) {
      expect(buildConfig({ routes: [{ prefix, upstream: 'http://u:1' }] }).routes[0]!.prefix).toBe(prefix);
    }
  });

  it('warns of LLM_PROXY_* variables it does not read, with the nearest it does (review 121)', () => {
    expect(unknownEnvWarnings({ LLM_PROXY_UPSTREAMS: 'http://u:1', LLM_PROXY_LOGLEVEL: 'debug', LLM_PROXY_DRAIN_TIME: '5', LLM_PROXY_XYZZY: '1', OTHER: '1', ...Object.fromEntries(ENV_NAMES.map((n) => [n, ''])) })).toEqual([
      'LLM_PROXY_DRAIN_TIME is not a variable of this proxy and is ignored; did you mean LLM_PROXY_DRAIN_TIMEOUT?', // 3 edits
      'LLM_PROXY_LOGLEVEL is not a variable of this proxy and is ignored; did you mean LLM_PROXY_LOG_LEVEL?',
      'LLM_PROXY_UPSTREAMS is not a variable of this proxy and is ignored; did you mean LLM_PROXY_UPSTREAM?',
      'LLM_PROXY_XYZZY is not a variable of this proxy and is ignored',
    ]);
    expect(loadConfig({ upstream: 'http://u:1' }, { LLM_PROXY_UPSTREAMS: 'x' }).warnings).toEqual([expect.stringMatching(/^LLM_PROXY_UPSTREAMS is not/)]);
    // Every variable the README's table names is one it reads (listed here, not taken from ENV_NAMES).
    const readme = { LLM_PROXY_UPSTREAM: 'http://u:1', LLM_PROXY_CONFIG: '', LLM_PROXY_HOST: '127.0.0.1', LLM_PROXY_PORT: '1', LLM_PROXY_METRICS_HOST: '127.0.0.1', LLM_PROXY_METRICS_PORT: '2', LLM_PROXY_METRICS: 'true', LLM_PROXY_DRAIN_TIMEOUT: '3', LLM_PROXY_FINAL_SCRAPE_WAIT: '0', LLM_PROXY_LOG_LEVEL: 'info', LLM_PROXY_EGRESS_PROXY: 'none' };
    expect(unknownEnvWarnings(readme)).toEqual([]);
    expect(loadConfig({}, readme).warnings).toEqual([]);
    // A Kubernetes Service named llm-proxy: its link names are left alone, its _PORT is refused with the reason.
    expect(unknownEnvWarnings({ LLM_PROXY_SERVICE_HOST: '10.0.0.1', LLM_PROXY_SERVICE_PORT: '8080', LLM_PROXY_SERVICE_PORT_HTTP: '8080', LLM_PROXY_PORT_8080_TCP: 'tcp://10.0.0.1:8080', LLM_PROXY_PORT_8080_TCP_ADDR: '10.0.0.1' })).toEqual([]);
    expect(errorOf(() => envOverrides({ LLM_PROXY_PORT: 'tcp://10.0.0.1:8080' }))).toMatch(/^LLM_PROXY_PORT: "tcp:\/\/10\.0\.0\.1:8080" is a Kubernetes service link \(a Service named llm-proxy sets it\).* enableServiceLinks: false/);
    // The Service the variable comes from, by its name.
    expect(errorOf(() => envOverrides({ LLM_PROXY_METRICS_PORT: 'tcp://10.0.0.1:9464' }))).toMatch(/^LLM_PROXY_METRICS_PORT: .* \(a Service named llm-proxy-metrics sets it\)/);
  });

  it('metrics.finalScrapeWait: 0 by default; the variable and the flag win over the file; ignored with a warning when nothing is scraped', () => {
    expect(buildConfig({}).metrics.finalScrapeWait).toBe(0);
    expect(buildConfig({ metrics: { finalScrapeWait: 20 } }).metrics.finalScrapeWait).toBe(20);
    expect(errorOf(() => buildConfig({ metrics: { finalScrapeWait: -1 } }))).toMatch(/metrics\.finalScrapeWait: /);
    expect(errorOf(() => buildConfig({ metrics: { finalScrapeWait: '20s' } }))).toMatch(/metrics\.finalScrapeWait: /);
    expect(loadConfig({}, { LLM_PROXY_FINAL_SCRAPE_WAIT: '7.5' }).metrics.finalScrapeWait).toBe(7.5);
    expect(loadConfig({ finalScrapeWait: 3 }, { LLM_PROXY_FINAL_SCRAPE_WAIT: '7.5' }).metrics.finalScrapeWait).toBe(3);
    expect(buildConfig({ metrics: { finalScrapeWait: 20 } }).warnings).toEqual([]);
    expect(buildConfig({ metrics: { finalScrapeWait: 20, enabled: false } }, {}, 'p.yaml').warnings).toEqual(['the final scrape wait (metrics.finalScrapeWait (p.yaml): 20 s) is ignored: metrics are disabled, so no scrape is waited for']);
    expect(buildConfig({ metrics: { finalScrapeWait: 20 } }, { exporters: { prometheus: false, otlp: true }, finalScrapeWait: 5 }).warnings).toEqual([
      'the final scrape wait (--final-scrape-wait / LLM_PROXY_FINAL_SCRAPE_WAIT: 5 s) is ignored: OTEL_METRICS_EXPORTER leaves Prometheus out, so no scrape is waited for',
    ]);
    expect(buildConfig({ metrics: { finalScrapeWait: 0, enabled: false } }).warnings).toEqual([]);
  });

  it('warns of settings that do nothing: a simulator plan beside an upstream, OTLP settings without OTLP (review 121)', () => {
    expect(buildConfig({ upstream: 'http://u:1', simulator: { ttft: 0.1 } }, {}, 's.yaml').warnings).toEqual([
      'simulator (s.yaml) is ignored: an upstream is configured, and the built-in simulator runs only without one',
    ]);
    expect(buildConfig({ simulator: { ttft: 0.1 } }).warnings).toEqual([]);
    const otlp = { endpoint: 'http://c:4318/v1/metrics', intervalSeconds: 5 };
    expect(buildConfig({ upstream: 'http://u:1', otlp }, {}, 'o.yaml').warnings).toEqual([
      'otlp.endpoint, otlp.intervalSeconds (o.yaml) ignored: otlp.enabled is not true, so nothing is pushed',
    ]);
    expect(buildConfig({ upstream: 'http://u:1', otlp }, { exporters: { prometheus: true, otlp: false } }, 'o.yaml').warnings).toEqual([
      'otlp.endpoint, otlp.intervalSeconds (o.yaml) ignored: OTEL_METRICS_EXPORTER leaves OTLP out, so nothing is pushed',
    ]);
    expect(buildConfig({ upstream: 'http://u:1', otlp: { ...otlp, enabled: true } }).warnings).toEqual([]);
    // Turned off on purpose in the file, the settings kept for later: no warning (review 123); a
    // file with only enabled: no warning either.
    expect(buildConfig({ upstream: 'http://u:1', otlp: { ...otlp, enabled: false } }).warnings).toEqual([]);
    expect(buildConfig({ upstream: 'http://u:1', otlp: { enabled: true } }, { exporters: { prometheus: true, otlp: false } }).warnings).toEqual([]);
    expect(buildConfig({ upstream: 'http://u:1', otlp }, { exporters: { prometheus: true, otlp: true } }).warnings).toEqual([]);
  });

  it('refuses a client keep-alive Node would overflow, and OTLP intervals shorter than a push (review 121)', () => {
    expect(errorOf(() => buildConfig({ timeouts: { keepAlive: 2_147_483 } }))).toMatch(/timeouts\.keepAlive: must be at most 2147482 s/);
    // One line per problem (review 123: two, contradicting each other).
    expect(errorOf(() => buildConfig({ timeouts: { keepAlive: 3e6 } })).split('\n')).toHaveLength(2);
    expect(errorOf(() => buildConfig({ otlp: { intervalSeconds: 0 } })).split('\n')).toEqual(['invalid configuration in config:', '  otlp.intervalSeconds: must be at least 0.1 s']);
    expect(buildConfig({ timeouts: { keepAlive: 2_147_482 } }).timeouts.keepAlive).toBe(2_147_482);
    expect(errorOf(() => buildConfig({ otlp: { intervalSeconds: 0.0001 } }))).toMatch(/otlp\.intervalSeconds: must be at least 0\.1 s/);
    expect(buildConfig({ otlp: { intervalSeconds: 0.1 } }).otlp.intervalMs).toBe(100);
    expect(errorOf(() => envOverrides({ OTEL_METRIC_EXPORT_INTERVAL: '99' }))).toMatch(/expected milliseconds from 100/);
    expect(errorOf(() => envOverrides({ OTEL_METRIC_EXPORT_INTERVAL: '0x3e8' }))).toMatch(/expected milliseconds from 100/);
    expect(envOverrides({ OTEL_METRIC_EXPORT_INTERVAL: ' 1000 ' }).otlpIntervalMs).toBe(1000);
    expect(envOverrides({ OTEL_METRIC_EXPORT_INTERVAL: '100' }).otlpIntervalMs).toBe(100);
  });

  it('takes numbers in decimal only: 0x10 is not 16 seconds (review 121)', () => {
    for (const v of ['0x10', '0b1', '0o7', 'Infinity', '1_000']) expect(errorOf(() => envOverrides({ LLM_PROXY_DRAIN_TIMEOUT: v })), v).toMatch(/^LLM_PROXY_DRAIN_TIMEOUT: expected a number of seconds/);
    // Surrounding white space is forgiven, as before (review 123); a stray CR is shown escaped.
    for (const [v, n] of [['30', 30], ['0.5', 0.5], ['1e1', 10], ['.5', 0.5], ['+5', 5], ['5.', 5], [' 5', 5], ['30\r', 30]] as const) expect(envOverrides({ LLM_PROXY_DRAIN_TIMEOUT: v }).drainTimeout, v).toBe(n);
    expect(errorOf(() => envOverrides({ LLM_PROXY_DRAIN_TIMEOUT: '0x10\r' }))).toMatch(/got "0x10\\r"$/);
  });

  it('refuses YAML tags that would turn a section into a Map, Set, Date or Buffer (its checks gone), in one line (review 121)', () => {
    const dir = tempDir('cfg-');
    const cases: [string, RegExp][] = [
      ['listen: !!omap [ port: 39105 ]\n', /Unresolved tag: tag:yaml\.org,2002:omap at line 1, column 9 \(write it without a tag/],
      ['timeouts: !!omap [ connect: -5 ]\n', /omap at line 1/],
      ['metrics: !!set {enabled}\n', /2002:set at line 1/],
      ['listen: !!timestamp 2001-12-14\n', /2002:timestamp at line 1/],
      ['!!omap [ upstream: "ftp://bad" ]\n', /2002:omap at line 1, column 1/],
      ['listen: !local {port: 1}\n', /Unresolved tag: !local/],
      ['listen:\n  port: 1\n  port: 2\n', /Map keys must be unique at line 3, column 3$/],
      // A second document is not silently dropped (review 123: 'silent' logging dropped that error).
      ['upstream: http://a:1\n---\nupstream: http://b:1\nlisten: {port: -5}\n', /a second document begins at line 2: the file holds one$/],
      // Under a %YAML 1.1 directive those tags are the schema's own: caught by the values they make.
      ['%YAML 1.1\n---\ntimeouts: !!omap [connect: -5]\n', /timeouts is a YAML !!omap, !!set, !!timestamp or !!binary value/],
      ['%YAML 1.1\n---\nroutes: [{prefix: /, upstream: "http://u:1"}, !!set {a}]\n', /routes\[1\] is a YAML/],
    ];
    for (const [text, want] of cases) {
      const file = join(dir, 'tag.yaml');
      writeFileSync(file, text);
      const message = errorOf(() => loadConfig({ config: file }, {}));
      expect(message, text).toMatch(/^config file .* is not valid YAML: /);
      expect(message, text).toMatch(want);
      expect(message, text).not.toContain('\n');
    }
    // Plain YAML still reads: anchors, a BOM, an empty file.
    for (const [text, port] of [['listen: {host: &h 127.0.0.2, port: 39105}\nmetrics: {host: *h}\n', 39105], ['\ufefflisten: {port: 39106}\n', 39106], ['', 8080]] as const) {
      const file = join(dir, 'ok.yaml');
      writeFileSync(file, text);
      expect(loadConfig({ config: file }, {}).port).toBe(port);
    }
    writeFileSync(join(dir, 'v11.yaml'), '%YAML 1.1\n---\nlisten: {port: 39107}\n...\n');
    expect(loadConfig({ config: join(dir, 'v11.yaml') }, {}).port).toBe(39107);
    writeFileSync(join(dir, 'alias.yaml'), 'listen: {host: &h 127.0.0.2}\nmetrics: {host: *h}\n');
    expect(loadConfig({ config: join(dir, 'alias.yaml') }, {}).metrics.host).toBe('127.0.0.2');
  });

  it('returns a frozen object', () => {
    const c = buildConfig({ upstream: 'http://x:1' });
    expect(Object.isFrozen(c)).toBe(true);
    expect(Object.isFrozen(c.routes)).toBe(true);
  });
});

describe('egress configuration', () => {
  const u = 'http://up:1';

  it('is direct unless asked: the variables alone change nothing (as in Node without NODE_USE_ENV_PROXY)', () => {
    expect(loadConfig({ upstream: u }, { HTTPS_PROXY: 'http://p:1', HTTP_PROXY: 'http://p:1' }).egress).toMatchObject({ http: undefined, https: undefined });
  });

  it('reads the variables as undici does: lower case first, https falls back to http, an empty one is none', () => {
    const env = { NODE_USE_ENV_PROXY: '1', https_proxy: 'http://lower:1', HTTPS_PROXY: 'http://upper:1', NO_PROXY: 'a.test' };
    expect(loadConfig({ upstream: u }, env).egress).toMatchObject({ https: { host: 'lower' }, http: undefined, noProxy: ['a.test'] });
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'env', http_proxy: 'http://h:1' }).egress).toMatchObject({ http: { host: 'h' }, https: { host: 'h' } });
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'env', http_proxy: 'http://h:1', https_proxy: '' }).egress).toMatchObject({ https: { host: 'h' } });
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'env', http_proxy: '' }).egress).toMatchObject({ http: undefined, https: undefined });
    // LLM_PROXY_EGRESS_PROXY=none wins over NODE_USE_ENV_PROXY.
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'none', NODE_USE_ENV_PROXY: '1', https_proxy: 'http://p:1' }).egress.https).toBeUndefined();
  });

  it('warns when env is asked for by name and finds no proxy, not when only NODE_USE_ENV_PROXY is set (Node is silent)', () => {
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'env', NO_PROXY: 'a.test' }).warnings).toEqual([
      'LLM_PROXY_EGRESS_PROXY=env, but none of https_proxy, HTTPS_PROXY, http_proxy, HTTP_PROXY is set to a proxy: upstreams are reached directly',
    ]);
    expect(buildConfig({ upstream: u, egressProxy: 'env' }, { proxyEnv: { nodeUseEnvProxy: false, http: ['HTTP_PROXY', ' '] } }, 'p.yaml').warnings).toEqual([
      'egressProxy: env (p.yaml), but none of https_proxy, HTTPS_PROXY, http_proxy, HTTP_PROXY is set to a proxy: upstreams are reached directly',
    ]);
    expect(loadConfig({ upstream: u }, { NODE_USE_ENV_PROXY: '1' }).warnings).toEqual([]);
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'env', http_proxy: 'http://h:1' }).warnings).toEqual([]);
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'none' }).warnings).toEqual([]);
  });

  it('names the variable or key of a bad proxy URL, without echoing its password', () => {
    expect(errorOf(() => loadConfig({ upstream: u }, { NODE_USE_ENV_PROXY: '1', HTTPS_PROXY: 'socks5://user:hunter2@p:1080' }))).toBe(
      'HTTPS_PROXY: socks5 proxies are not supported (use an http:// or https:// proxy) (got "socks5://…@p:1080")',
    );
    expect(errorOf(() => loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'http://p:1/x' }))).toMatch(/^LLM_PROXY_EGRESS_PROXY: a proxy URL has no path/);
    // Passwords with /, @ or : unencoded, or without a scheme, are masked whole (review T).
    for (const [given, shown] of [
      ['bob:hunter2@proxy:3128/path', '…@proxy:3128/path'],
      ['http://bob:hun/ter2@proxy:3128', 'http://…@proxy:3128'],
      ['http://bob:hun@ter2@proxy:3128/x', 'http://…@proxy:3128/x'],
      // A query or fragment, which may hold a token, is masked too; so is a password with `?` in it.
      ['http://proxy:3128/?token=hunter2', 'http://proxy:3128/?…'],
      // An `@` and a `?`: which ends the password and which begins the query cannot be told.
      ['http://bob:hun?ter2@proxy:3128/x#hunter2', 'http://…'],
      // An `@` inside the query is no password's (review 141).
      ['http://proxy:3128/?u=a@b&token=hunter2', 'http://proxy:3128/?…'],
      // A password with a `/` after digits, or after nothing, parses as a port and a path (review 143).
      ['http://admin:2024/hunter2@proxy.example:3128', 'http://…@proxy.example:3128'],
      ['http://admin:/hunter2@proxy.example:3128', 'http://…@proxy.example:3128'],
    ]) {
      const message = errorOf(() => loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: given }));
      expect(message).toContain(`(got "${shown}")`);
      expect(message).not.toMatch(/hunter2|hun|ter2/);
    }
    expect(errorOf(() => loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'http://p:99999' }))).toMatch(/^LLM_PROXY_EGRESS_PROXY: expected a proxy URL/);
  });

  it("checks the file's noProxy entries, which would otherwise exempt nothing without a word (review 121)", () => {
    const ok = ['localhost', '.internal', '*.example.com', 'example.com.', 'host:8443', '[::1]:8000', '::1', '127.0.0.1', '10.0.0.0/8', '2001:db8::/32', '1.2.3.4/32', '::1/128', 'bücher.de', 'my_host'];
    expect(buildConfig({ upstream: u, noProxy: ok }).egress).toMatchObject({ http: undefined }); // no proxy, and no error
    expect(buildConfig({ upstream: u, egressProxy: 'http://p:1', noProxy: ok }).egress.noProxy).toEqual(ok);
    expect(buildConfig({ upstream: u, egressProxy: 'http://p:1', noProxy: '*' }).egress.noProxy).toEqual(['*']);
    for (const [entry, want] of [
      ['10.0.0.0/99', /noProxy\[1\]: a range is an IP address/],
      ['1.2.3.4/-1', /noProxy\[1\]: a range/],
      ['1.2.3.4/33', /noProxy\[1\]: a range/],
      ['::1/129', /noProxy\[1\]: a range/],
      ['[::1', /noProxy\[1\]: a bracketed IPv6 address/],
      ['[::1]:70000', /noProxy\[1\]: a bracketed IPv6 address/],
      ['a:b:c', /noProxy\[1\]: not an IPv6 address/],
      ['h:99999', /noProxy\[1\]: a port is a number/],
      ['h:', /noProxy\[1\]: a port is a number/],
      ['exa mple', /noProxy\[1\]: a host name/],
      ['http://x', /noProxy\[1\]: a host, not a URL/],
      ['*', /noProxy\[1\]: "\*" means every host only as the whole value/],
    ] as const) {
      expect(errorOf(() => buildConfig({ upstream: u, noProxy: ['ok.test', entry] })), entry).toMatch(want);
    }
    expect(errorOf(() => buildConfig({ upstream: u, noProxy: 'a.test, 10.0.0.0/99' }))).toMatch(/noProxy: a range .* \(got "10\.0\.0\.0\/99"\)/);
    expect(errorOf(() => buildConfig({ upstream: u, noProxy: 5 }))).toMatch(/noProxy: expected a list of hosts, or one string of them separated by commas/);
    // The variable is read as undici reads it: what it cannot use is skipped, not an error.
    expect(loadConfig({ upstream: u }, { NODE_USE_ENV_PROXY: '1', HTTPS_PROXY: 'http://p:1', NO_PROXY: 'a.test,10.0.0.0/99' }).egress.noProxy).toEqual(['a.test', '10.0.0.0/99']);
    // A proxy on port 0 is refused, as an upstream there is.
    expect(errorOf(() => loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'http://p:0' }))).toMatch(/^LLM_PROXY_EGRESS_PROXY: port 0 cannot be connected to/);
  });

  it('takes a word that is no keyword for a typo, not for a proxy of that name on port 80 (review 121)', () => {
    for (const v of ['enve', 'off', 'direct', 'no', 'disabled', 'env,none', 'proxy.example']) {
      expect(errorOf(() => loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: v })), v).toBe(`LLM_PROXY_EGRESS_PROXY: expected env, none or a proxy URL such as http://proxy.example:3128 (got "${v}")`);
      expect(errorOf(() => buildConfig({ upstream: u, egressProxy: v }, {}, 'e.yaml')), v).toMatch(/^invalid configuration in e\.yaml:\n {2}egressProxy: expected env, none or a proxy URL/);
    }
    // host:port without a scheme is a proxy, as are URLs and the keywords in any case.
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'proxy.example:3128' }).egress.https).toMatchObject({ host: 'proxy.example', port: 3128 });
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'proxy.example:3128/' }).egress.https).toMatchObject({ host: 'proxy.example', port: 3128 });
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: '[::1]:3128' }).egress.https).toMatchObject({ host: '::1', port: 3128 });
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'https://p' }).egress.https).toMatchObject({ host: 'p', port: 443 });
    expect(loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'NONE' }).egress.https).toBeUndefined();
    // The standard variables keep curl's rule: a bare name is a proxy on port 80.
    expect(loadConfig({ upstream: u }, { NODE_USE_ENV_PROXY: '1', HTTPS_PROXY: 'squid' }).egress.https).toMatchObject({ host: 'squid', port: 80 });
  });
});

describe('listen.maxConnections', () => {
  it('is a whole number of at least 1, none by default; a bad value names the key', () => {
    expect(buildConfig({}, {}).maxConnections).toBeUndefined();
    expect(buildConfig({ listen: { maxConnections: 1 } }, {}).maxConnections).toBe(1);
    expect(buildConfig({ listen: { port: 0, maxConnections: 5000 } }, { port: 9000 })).toMatchObject({ port: 9000, maxConnections: 5000 });
    for (const bad of [0, -1, 1.5, '100', null]) {
      expect(errorOf(() => buildConfig({ listen: { maxConnections: bad as never } }, {}))).toMatch(/^invalid configuration in config:\n  listen\.maxConnections: /);
    }
    expect(errorOf(() => buildConfig({ listen: { maxConnection: 10 } as never }, {}))).toMatch(/listen\.maxConnection: unknown key/);
  });
});

describe('addresses', () => {
  it('take an IPv6 listen address in brackets as the address, and refuse zone IDs and port 0 upstreams with a reason', () => {
    expect(hostOf('--host', '[::1]')).toBe('::1');
    expect(buildConfig({ listen: { host: '[::1]' }, metrics: { host: '[::]' } })).toMatchObject({ host: '::1', metrics: { host: '::' } });
    expect(errorOf(() => hostOf('--host', 'fe80::1%lo'))).toMatch(/^--host: IPv6 zone IDs .* are not supported/);
    expect(errorOf(() => buildConfig({ listen: { host: 'fe80::1%lo' } }))).toMatch(/listen\.host: IPv6 zone IDs/);
    expect(errorOf(() => upstreamOf('--upstream', 'http://[fe80::1%25lo]:8000'))).toMatch(/^--upstream: IPv6 zone IDs .* are not supported/);
    expect(errorOf(() => upstreamOf('--upstream', 'http://localhost:0'))).toMatch(/^--upstream: port 0 cannot be connected to/);
  });
});
