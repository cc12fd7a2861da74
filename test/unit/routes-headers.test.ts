import fc from 'fast-check';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { endToEndHeaders, isName, rawHeader, rawHeaderList } from '../../src/proxy/headers.js';
import { originForm, Router, targetAuthority } from '../../src/proxy/routes.js';
import { sendError } from '../../src/proxy/forward.js';
import { providerNameForHost } from '../../src/providers/detect.js';
import { RequestBodyTap } from '../../src/proxy/request-info.js';
import { CardinalityLimiter, OTHER } from '../../src/metrics/labels.js';
import { prometheusBaseName } from '../../src/metrics/prometheus-names.js';

const route = (prefix: string, upstream: string, stripPrefix = true) => ({ prefix, upstream, stripPrefix, forwardedHeaders: true });

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

describe('providerNameForHost', () => {
  it('names the provider of its hosts, regional and resource-named ones included, and nothing else', () => {
    const cases: [string, string | undefined][] = [
      ['api.openai.com', 'openai'],
      ['my-res.openai.azure.com', 'azure.ai.openai'],
      ['my-res.cognitiveservices.azure.com', 'azure.ai.openai'],
      ['my-proj.services.ai.azure.com', 'azure.ai.inference'],
      ['aiplatform.googleapis.com', 'gcp.vertex_ai'],
      ['us-central1-aiplatform.googleapis.com', 'gcp.vertex_ai'],
      ['EUROPE-WEST4-aiplatform.googleapis.com', 'gcp.vertex_ai'],
      ['generativelanguage.googleapis.com', 'gcp.gemini'],
      ['bedrock-runtime.us-east-1.amazonaws.com', 'aws.bedrock'],
      ['api.anthropic.com', 'anthropic'],
      ['api.moonshot.ai', 'moonshot_ai'],
      ['api.moonshot.cn', 'moonshot_ai'],
      ['aiplatform.googleapis.com.example.org', undefined],
      ['notaiplatform.googleapis.com', undefined],
      ['openai.com.evil.test', undefined],
      ['vllm', undefined],
    ];
    for (const [host, name] of cases) expect([host, providerNameForHost(host)]).toEqual([host, name]);
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
      'X-Empty', '', // an empty value is a field all the same
    ];
    expect(endToEndHeaders(raw)).toEqual(['Set-Cookie', 'a=1', 'Content-Type', 'text/event-stream', 'Set-Cookie', 'b=2', 'X-Empty', '']);
  });
});

describe('isName / rawHeader', () => {
  it('compare field names ignoring case, and only whole names', () => {
    for (const n of ['content-type', 'Content-Type', 'CONTENT-TYPE', 'cOnTeNt-TyPe']) expect(isName(n, 'content-type')).toBe(true);
    for (const n of ['content-typ', 'content-types', 'x-content-type', 'content_type', 'content-type ', '']) expect(isName(n, 'content-type')).toBe(false);
    const raw = ['X-A', '1', 'Content-Type', 'text/event-stream', 'content-type', 'second'];
    expect(rawHeader(raw, 'content-type')).toBe('text/event-stream'); // the first wins
    expect(rawHeader(raw, 'content-length')).toBeUndefined();
    expect(rawHeaderList(raw, 'content-type')).toBe('text/event-stream,second'); // every field, in order
    expect(rawHeaderList(raw, 'x-a')).toBe('1');
    expect(rawHeaderList(raw, 'content-length')).toBeUndefined();
  });
});

describe('RequestBodyTap', () => {
  const tapped = (chunks: Buffer[], max = 1 << 20) => {
    const t = new RequestBodyTap(max);
    for (const c of chunks) t.push(c);
    return { model: t.model(), prediction: t.prediction() };
  };
  const tap = (chunks: Buffer[], max = 1 << 20) => tapped(chunks, max).model;
  const prediction = (body: string) => tapped([Buffer.from(body)]).prediction;

  it('says whether the root object asks for a predicted output (a `prediction` object, the last one)', () => {
    expect(prediction('{"model":"gpt-4o","messages":[],"prediction":{"type":"content","content":"x"},"stream":true}')).toBe(true);
    expect(prediction('{"predicti\\u006fn":{"type":"content"}}')).toBe(true);
    expect(prediction('{"model":"gpt-4o","stream":true}')).toBe(false);
    expect(prediction('{"prediction":null}')).toBe(false);
    expect(prediction('{"prediction":"x"}')).toBe(false);
    expect(prediction('{"prediction":[{"type":"content"}]}')).toBe(false);
    expect(prediction('{"prediction":{"type":"content"},"prediction":null}')).toBe(false);
    expect(prediction('{"messages":[{"prediction":{"type":"content"}}],"extra":{"prediction":{}}}')).toBe(false);
  });

  it('reads the model from a JSON body fed in pieces, not from a nested or quoted look-alike', () => {
    const body = Buffer.from(JSON.stringify({ messages: [{ role: 'user', content: '{"model":"fake"}', model: 'nested' }], model: 'gpt-4o' }));
    expect(tap([body.subarray(0, 7), body.subarray(7)])).toBe('gpt-4o');
  });

  it('reads a model near the start of a body over the cap', () => {
    expect(tap([Buffer.from(`{"model":"llama-3","messages":"${'x'.repeat(1000)}"}`)], 64)).toBe('llama-3');
  });

  it('returns undefined for non-JSON, a non-object root, an absent or non-string model', () => {
    expect(tap([Buffer.from('hello')])).toBeUndefined();
    expect(tap([])).toBeUndefined();
    expect(tap([Buffer.from('["model","x"]')])).toBeUndefined();
    expect(tap([Buffer.from('{"model":7}')])).toBeUndefined();
    expect(tap([Buffer.from('{"model":"a","model":{"x":"b"}}')])).toBeUndefined(); // the last one wins
  });

  it('finds what JSON.parse finds on generated bodies, split anywhere (property)', () => {
    const text = fc.oneof(fc.string(), fc.constantFrom('model', '"model":"x"', '\\', '\\"', '{', '}', '[', ']', ',', ':', 'é😀', '\u2028'));
    const value: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
      v: fc.oneof(
        { depthSize: 'small', withCrossShrink: true },
        text,
        fc.integer(),
        fc.constantFrom(true, false, null, 1.5e-7),
        fc.array(tie('v'), { maxLength: 3 }),
        fc.dictionary(fc.oneof(text, fc.constant('model')), tie('v'), { maxKeys: 3 }),
      ),
    })).v;
    // Root entries, with `model` keys (also spelt with escapes, also repeated) among them.
    const key = fc.oneof({ weight: 3, arbitrary: text.map((k) => JSON.stringify(k)) }, { weight: 2, arbitrary: fc.constantFrom('"model"', '"mod\\u0065l"', '"model "', '"Model"', '"prediction"', '"predicti\\u006fn"') });
    const entry = fc.tuple(key, fc.oneof({ weight: 3, arbitrary: fc.oneof(text, fc.constantFrom('gpt-4o', 'meta/llama:3 "q"')) }, { weight: 1, arbitrary: value }));
    const space = fc.constantFrom('', ' ', '\n', '\r\n\t ');
    fc.assert(
      fc.property(fc.array(fc.tuple(entry, space), { maxLength: 6 }), space, fc.array(fc.nat(), { maxLength: 6 }), (entries, ws, cuts) => {
        const body = `${ws}{${entries.map(([[k, v], w]) => `${w}${k}${w}:${w}${JSON.stringify(v)}${w}`).join(',')}}${ws}`;
        const parsed = JSON.parse(body) as { model?: unknown; prediction?: unknown };
        const expected = typeof parsed.model === 'string' && Buffer.byteLength(JSON.stringify(parsed.model)) - 2 <= 1024 ? parsed.model : undefined;
        const predicted = typeof parsed.prediction === 'object' && parsed.prediction !== null && !Array.isArray(parsed.prediction);
        const bytes = Buffer.from(body);
        const offsets = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
        const chunks: Buffer[] = [];
        let prev = 0;
        for (const o of [...offsets, bytes.length]) {
          chunks.push(bytes.subarray(prev, o));
          prev = o;
        }
        expect(tapped(chunks)).toEqual({ model: expected, prediction: predicted });
      }),
      { numRuns: 2000 },
    );
  });

  it('scans a large body without keeping it', () => {
    const content = 'x'.repeat(1 << 20) + '\\"quoted\\" \\\\ and more';
    const body = Buffer.from(`{"messages":[{"role":"user","content":"${content}"}],"stream":true,"model":"late-model"}`);
    const t = new RequestBodyTap(4 << 20);
    for (let i = 0; i < body.length; i += 65536) t.push(body.subarray(i, i + 65536));
    expect(t.model()).toBe('late-model');
  });
});

describe('originForm', () => {
  it('takes an absolute-form target\'s path and query as sent (no re-encoding), without its fragment', () => {
    expect(originForm('http://any.example/v1/a{b}|^`')).toBe('/v1/a{b}|^`');
    expect(originForm('http://any.example:8080/v1/chat?q={"a":1}#frag')).toBe('/v1/chat?q={"a":1}');
    expect(originForm('HTTPS://any.example')).toBe('/');
    expect(originForm('http://any.example?x=1')).toBe('/?x=1');
    expect(originForm('/v1/a{b}')).toBe('/v1/a{b}');
    expect(originForm('http://')).toBeUndefined();
    expect(originForm('http:///v1/chat')).toBeUndefined(); // RFC 9110 §4.2.1: no empty host
    expect(originForm('http://key@/v1/chat')).toBeUndefined();
    expect(originForm('ftp://x/y')).toBeUndefined();
    expect(originForm('*')).toBeUndefined();
  });
});

describe('targetAuthority', () => {
  it('is an absolute-form target\'s authority as sent, port included, userinfo dropped; none for origin-form', () => {
    expect(targetAuthority('http://api.example:8443/v1/chat?q=1')).toBe('api.example:8443');
    expect(targetAuthority('HTTPS://Any.Example')).toBe('Any.Example');
    expect(targetAuthority('http://any.example?x=1')).toBe('any.example');
    expect(targetAuthority('http://user:k@y@[::1]:8080/v1')).toBe('[::1]:8080');
    expect(targetAuthority('http:///v1')).toBeUndefined();
    expect(targetAuthority('http://u@/v1')).toBeUndefined();
    expect(targetAuthority('/v1/http://x/')).toBeUndefined();
    expect(targetAuthority('ftp://x/y')).toBeUndefined();
  });
});

describe('server.address and server.port (what the metrics label a route with)', () => {
  it('the host without IPv6 brackets, and the port, the scheme\'s default when the URL names none', () => {
    const at = (upstream: string) => new Router([{ prefix: '/', upstream, stripPrefix: false, forwardedHeaders: true }]).match('/v1/chat/completions')!.resolved.origin;
    expect(at('https://api.openai.com/v1')).toMatchObject({ host: 'api.openai.com', port: 443 });
    expect(at('http://10.0.0.5')).toMatchObject({ host: '10.0.0.5', port: 80 });
    expect(at('http://[::1]:8080')).toMatchObject({ host: '::1', port: 8080 });
    expect(at('https://[2001:db8::1]')).toMatchObject({ host: '2001:db8::1', port: 443 });
  });
});

describe('CardinalityLimiter', () => {
  it('maps values that are not well-formed UTF-16 to what the exposition writes (U+FFFD), so they share one series', () => {
    const l = new CardinalityLimiter(5);
    expect(l.limit('m\ud800x')).toBe('m\ufffdx');
    expect(l.limit('m\udc00x')).toBe('m\ufffdx');
    expect(l.limit('m\ufffdx')).toBe('m\ufffdx');
    expect(l.limit('ok \ud83d\ude00')).toBe('ok \ud83d\ude00'); // a pair is kept
  });

  it('keeps the first N values and maps the rest to _OTHER', () => {
    const l = new CardinalityLimiter(2);
    expect(l.limit('a')).toBe('a');
    expect(l.limit('b')).toBe('b');
    expect(l.limit('c')).toBe(OTHER);
    expect(l.limit('a')).toBe('a');
    expect(l.limit('x'.repeat(500))).toBe(OTHER);
    // A value of up to 128 UTF-16 units is kept, a longer one is not (with room under the cap).
    const wide = new CardinalityLimiter(5);
    expect(wide.limit('y'.repeat(128))).toBe('y'.repeat(128));
    expect(wide.limit('y'.repeat(129))).toBe(OTHER);
  });

  it('known() reads whether a value was admitted, and admits none', () => {
    const l = new CardinalityLimiter(1);
    expect(l.known('a')).toBeUndefined();
    expect(l.known('b')).toBeUndefined();
    expect(l.limit('a')).toBe('a'); // the one place was still free
    expect(l.known('a')).toBe('a');
    expect(l.limit('b')).toBe(OTHER);
    expect(l.known('b')).toBeUndefined(); // past the cap: no value, not _OTHER
    const wf = new CardinalityLimiter(5);
    wf.limit('m\ud800');
    expect(wf.known('m\udc00')).toBe('m\ufffd'); // the exposed form, as limit() gives it
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

describe('sendError', () => {
  it('answers with the standard reason phrase after a writeHead that failed, and closes when it cannot answer at all', async () => {
    const seen: string[] = [];
    const server = http.createServer((req, res) => {
      if (req.url === '/after-bad-reason') {
        // A writeHead Node refused (an upstream reason phrase with a control character) leaves its
        // reason on the response: a second writeHead without one threw the same error again.
        expect(() => res.writeHead(502, 'bad\u0001reason')).toThrow();
        sendError(res, 502, 'upstream_protocol_error', 'x');
      } else {
        res.setHeader('x-bad', 'ok');
        res.writeHead(200).write('partial'); // headers sent: the answer can only be cut
        sendError(res, 502, 'upstream_reset', 'x');
      }
      res.once('close', () => seen.push(req.url!));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    try {
      const r = await fetch(`http://127.0.0.1:${port}/after-bad-reason`);
      expect([r.status, r.statusText, ((await r.json()) as { error: { type: string } }).error.type]).toEqual([502, 'Bad Gateway', 'upstream_protocol_error']);
      await expect(fetch(`http://127.0.0.1:${port}/cut`).then((x) => x.text())).rejects.toThrow();
    } finally {
      await new Promise((r) => server.close(r));
    }
  });
});
