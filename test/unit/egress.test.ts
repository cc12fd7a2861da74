import { describe, expect, it } from 'vitest';
import { egressFor, NoProxy, parseProxyUrl, splitNoProxy } from '../../src/proxy/egress.js';
import { Router } from '../../src/proxy/routes.js';

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
    // `*` counts as the whole value only, as in undici and Node 24.
    expect(np('localhost,*').matches('api.openai.com', 443)).toBe(false);
    expect(np('').matches('anything', 1)).toBe(false);
  });

  it('decides per route, once: https upstreams take the https proxy, http ones the http proxy', () => {
    const http = parseProxyUrl('http://hp:1');
    const https = parseProxyUrl('http://sp:2');
    const s = { http, https, noProxy: ['internal.corp'] };
    expect(egressFor(s, 'https:', 'api.openai.com', 443)).toBe(https);
    expect(egressFor(s, 'http:', 'vllm', 8000)).toBe(http);
    expect(egressFor(s, 'https:', 'llm.internal.corp', 443)).toBeUndefined();
    const r = new Router([{ prefix: '/', upstream: 'https://api.openai.com/v1', stripPrefix: true, forwardedHeaders: true }], s);
    expect(r.match('/chat/completions')!.resolved.origin).toEqual({ protocol: 'https:', host: 'api.openai.com', port: 443, via: https });
  });
});

describe('NO_PROXY with IPv6', () => {
  it('compares addresses in the form URLs write them', () => {
    const n = new NoProxy(splitNoProxy('0:0:0:0:0:0:0:1,[::ffff:127.0.0.1]:8000'));
    expect(n.matches('::1', 80)).toBe(true);
    expect(n.matches('::ffff:7f00:1', 8000)).toBe(true);
  });
});

describe('a fully qualified upstream name (trailing dot)', () => {
  it('is labelled and recognised without the dot (the TLS server name too: serverName), and connected to as written', () => {
    const r = new Router([{ prefix: '/', upstream: 'https://x.openai.azure.com.:8443', stripPrefix: true, forwardedHeaders: true }]).match('/v1/chat/completions')!.resolved;
    expect(r.serverAddress).toBe('x.openai.azure.com');
    expect(r.providerName).toBe('azure.ai.openai');
    expect(r.origin.host).toBe('x.openai.azure.com.');
  });
});
