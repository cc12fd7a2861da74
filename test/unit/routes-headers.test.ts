import { describe, expect, it } from 'vitest';
import { endToEndHeaders } from '../../src/proxy/headers.js';
import { Router } from '../../src/proxy/routes.js';
import { RequestBodyTap } from '../../src/proxy/request-info.js';
import { CardinalityLimiter, OTHER } from '../../src/metrics/labels.js';
import { prometheusBaseName } from '../../src/metrics/prometheus-names.js';

const route = (prefix: string, upstream: string, stripPrefix = true) => ({ prefix, upstream, stripPrefix });

describe('Router', () => {
  const r = new Router([route('/openai', 'https://api.openai.com'), route('/anthropic', 'https://api.anthropic.com/'), route('/', 'http://vllm:8000/base')]);

  it('picks the longest prefix on a segment boundary and strips it', () => {
    expect(r.match('/openai/v1/chat/completions?x=1')).toMatchObject({ upstreamPath: '/v1/chat/completions?x=1' });
    expect(r.match('/openai/v1/chat/completions')!.resolved.upstream.host).toBe('api.openai.com');
    expect(r.match('/anthropic/v1/messages')!.resolved.upstream.host).toBe('api.anthropic.com');
    expect(r.match('/openaiX/v1')!.resolved.upstream.host).toBe('vllm:8000');
    expect(r.match('/openaiX/v1')!.upstreamPath).toBe('/base/openaiX/v1');
    expect(r.match('/openai')!.upstreamPath).toBe('/');
  });

  it('never lets the request choose the destination (absolute-form target)', () => {
    const m = r.match('http://evil.example:1/openai/v1/models');
    expect(m!.resolved.upstream.host).toBe('api.openai.com');
    expect(m!.upstreamPath).toBe('/v1/models');
    expect(r.match('*')).toBeUndefined();
  });

  it('keeps the prefix when stripPrefix is false; no route when nothing matches', () => {
    const r2 = new Router([route('/v1', 'http://a:1', false)]);
    expect(r2.match('/v1/chat/completions')!.upstreamPath).toBe('/v1/chat/completions');
    expect(r2.match('/v2/x')).toBeUndefined();
  });
});

describe('endToEndHeaders', () => {
  it('drops hop-by-hop fields and fields named in Connection, keeps case, order and repeats', () => {
    const raw = [
      'Connection', 'keep-alive, X-Private',
      'Keep-Alive', 'timeout=5',
      'Transfer-Encoding', 'chunked',
      'X-Private', 'secret',
      'Set-Cookie', 'a=1',
      'Content-Type', 'text/event-stream',
      'Set-Cookie', 'b=2',
      'TE', 'trailers',
      'Upgrade', 'h2c',
      'Proxy-Authorization', 'x',
    ];
    expect(endToEndHeaders(raw)).toEqual(['Set-Cookie', 'a=1', 'Content-Type', 'text/event-stream', 'Set-Cookie', 'b=2']);
  });
});

describe('RequestBodyTap', () => {
  it('reads the model from a JSON body fed in pieces', () => {
    const t = new RequestBodyTap(1 << 20);
    const body = Buffer.from(JSON.stringify({ messages: [{ role: 'user', content: '{"model":"fake"}' }], model: 'gpt-4o' }));
    t.push(body.subarray(0, 7));
    t.push(body.subarray(7));
    expect(t.model()).toBe('gpt-4o');
  });

  it('falls back to a scan of the head when the body is over the cap', () => {
    const t = new RequestBodyTap(64);
    t.push(Buffer.from(`{"model":"llama-3","messages":"${'x'.repeat(1000)}"}`));
    expect(t.model()).toBe('llama-3');
  });

  it('returns undefined for non-JSON or absent model', () => {
    const t = new RequestBodyTap(100);
    t.push(Buffer.from('hello'));
    expect(t.model()).toBeUndefined();
    expect(new RequestBodyTap(100).model()).toBeUndefined();
  });
});

describe('CardinalityLimiter', () => {
  it('keeps the first N values and maps the rest to _OTHER', () => {
    const l = new CardinalityLimiter(2);
    expect(l.limit('a')).toBe('a');
    expect(l.limit('b')).toBe('b');
    expect(l.limit('c')).toBe(OTHER);
    expect(l.limit('a')).toBe('a');
    expect(l.limit('x'.repeat(500))).toBe(OTHER);
  });
});

describe('Prometheus names (as the Collector writes them)', () => {
  it('appends unit words and drops annotations', () => {
    expect(prometheusBaseName('gen_ai.client.operation.time_to_first_chunk', 's')).toBe('gen_ai_client_operation_time_to_first_chunk_seconds');
    expect(prometheusBaseName('gen_ai.client.token.usage', '{token}')).toBe('gen_ai_client_token_usage');
    expect(prometheusBaseName('x.duration_seconds', 's')).toBe('x_duration_seconds');
    expect(prometheusBaseName('process.memory', 'By')).toBe('process_memory_bytes');
  });
});
