import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config.js';
import { egressFor, NoProxy, parseProxyUrl, splitNoProxy } from '../../src/proxy/egress.js';
import { Router } from '../../src/proxy/routes.js';

function errorOf(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
  throw new Error('expected a ConfigError');
}

describe('proxy URLs', () => {
  it('take http and https proxies, with or without a scheme, port and credentials (percent-decoded)', () => {
    expect(parseProxyUrl('http://proxy.corp:3128')).toEqual({ protocol: 'http:', host: 'proxy.corp', port: 3128, authorization: undefined, display: 'http://proxy.corp:3128' });
    expect(parseProxyUrl('proxy.corp:8080')).toMatchObject({ protocol: 'http:', host: 'proxy.corp', port: 8080 });
    expect(parseProxyUrl('https://proxy.corp/')).toMatchObject({ protocol: 'https:', port: 443, display: 'https://proxy.corp' });
    expect(parseProxyUrl('http://[::1]:3128')).toMatchObject({ host: '::1', port: 3128, display: 'http://[::1]:3128' });
    const p = parseProxyUrl('http://us%40r:p%3Ass@proxy:1');
    expect(Buffer.from(p.authorization!.slice('Basic '.length), 'base64').toString()).toBe('us@r:p:ss');
    expect(p.display).toBe('http://proxy:1');
  });

  it('refuse what they cannot serve, saying why', () => {
    expect(() => parseProxyUrl('socks5://proxy:1080')).toThrow('socks5 proxies are not supported');
    expect(() => parseProxyUrl('http://proxy:3128/path')).toThrow('no path');
    expect(() => parseProxyUrl('http://:3128')).toThrow();
  });
});

describe('NO_PROXY', () => {
  const np = (v: string) => new NoProxy(splitNoProxy(v));

  it('matches a name and its subdomains, with a leading dot or *. or none, case and a trailing dot aside', () => {
    for (const entry of ['example.com', '.example.com', '*.example.com', 'EXAMPLE.com.']) {
      const n = np(entry);
      expect(n.matches('example.com', 443)).toBe(true);
      expect(n.matches('api.Example.com', 443)).toBe(true);
      expect(n.matches('api.example.com.', 443)).toBe(true);
      expect(n.matches('badexample.com', 443)).toBe(false);
      expect(n.matches('example.com.evil', 443)).toBe(false);
    }
  });

  it('honours a port, IPv6 in brackets or bare, CIDR ranges of both families, * and separators', () => {
    expect(np('api.local:8443').matches('api.local', 8443)).toBe(true);
    expect(np('api.local:8443').matches('api.local', 443)).toBe(false);
    expect(np('[::1]:8000').matches('::1', 8000)).toBe(true);
    expect(np('[::1]:8000').matches('::1', 8001)).toBe(false);
    expect(np('::1').matches('::1', 1)).toBe(true);
    expect(np('10.0.0.0/8').matches('10.2.3.4', 80)).toBe(true);
    expect(np('10.0.0.0/8').matches('11.2.3.4', 80)).toBe(false);
    expect(np('10.0.0.0/8').matches('10.example', 80)).toBe(false);
    expect(np('fd00::/8').matches('fd12::1', 80)).toBe(true);
    expect(np('a.test , b.test\tc.test').matches('c.test', 1)).toBe(true);
    expect(np('*').matches('anything', 1)).toBe(true);
    expect(np('').matches('anything', 1)).toBe(false);
  });

  it('decides per route, once: https upstreams take the https proxy, http ones the http proxy', () => {
    const http = parseProxyUrl('http://hp:1');
    const https = parseProxyUrl('http://sp:2');
    const s = { http, https, noProxy: ['internal.corp'] };
    expect(egressFor(s, 'https:', 'api.openai.com', 443)).toBe(https);
    expect(egressFor(s, 'http:', 'vllm', 8000)).toBe(http);
    expect(egressFor(s, 'https:', 'llm.internal.corp', 443)).toBeUndefined();
    const r = new Router([{ prefix: '/', upstream: 'https://api.openai.com/v1', stripPrefix: true }], s);
    expect(r.match('/chat/completions')!.resolved.origin).toEqual({ protocol: 'https:', host: 'api.openai.com', port: 443, via: https });
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

  it('names the variable or key of a bad proxy URL, without echoing its password', () => {
    expect(errorOf(() => loadConfig({ upstream: u }, { NODE_USE_ENV_PROXY: '1', HTTPS_PROXY: 'socks5://user:hunter2@p:1080' }))).toBe(
      'HTTPS_PROXY: socks5 proxies are not supported (use an http:// or https:// proxy) (got "socks5://…@p:1080")',
    );
    expect(errorOf(() => loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'http://p:1/x' }))).toMatch(/^LLM_PROXY_EGRESS_PROXY: a proxy URL has no path/);
    expect(errorOf(() => loadConfig({ upstream: u }, { LLM_PROXY_EGRESS_PROXY: 'http://p:99999' }))).toMatch(/^LLM_PROXY_EGRESS_PROXY: expected a proxy URL/);
  });
});
