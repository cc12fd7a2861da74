// The official SDKs, when a provider (or the load balancer in front of it) refuses a request
// from its head and closes with the body unread: Anthropic documents 413 request_too_large for a
// request over 32 MB, returned by Cloudflare. The close resets the connection while the proxy is
// still sending the body; the client must get the provider's answer, not a 502 it would retry.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { hist, scrape } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';
import { startRefusingUpstream } from '../helpers/refusing-upstream.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** The refusing upstream, closed after the test. */
async function refusingUpstream(answer: string): Promise<{ url: string; requests: () => number }> {
  const up = await startRefusingUpstream(answer);
  cleanups.push(up.close);
  return { url: `http://127.0.0.1:${up.port}`, requests: up.requests };
}

async function proxyTo(url: string): Promise<RunningProxy> {
  const p = await startTestProxy(url);
  cleanups.push(() => p.close());
  return p;
}

/** Runs `call` five times; each must fail with an error whose status and body come from the upstream. */
async function fiveRefusals(call: () => Promise<unknown>): Promise<unknown[]> {
  const errs: unknown[] = [];
  for (let i = 0; i < 5; i++) errs.push(await call().then(() => undefined, (e: unknown) => e));
  return errs;
}

/** Each refusal recorded as a 413, none as the proxy's own upstream_reset. No model label: the answer comes before the body's model is read. */
async function expectRecorded(p: RunningProxy): Promise<void> {
  const s = await scrape(p.metricsUrl);
  expect(hist(s, 'gen_ai_client_operation_duration_seconds', { error_type: '413' }).count).toBe(5);
  expect(hist(s, 'gen_ai_client_operation_duration_seconds', { error_type: 'upstream_reset' }).count).toBe(0);
}

const PROMPT = 'x'.repeat(2 * 1024 * 1024);

describe('an early 413 through a reset mid-upload, to the official SDKs (their default retries on)', () => {
  it('openai: APIError 413 with the provider\'s code, one upstream request each (a 502 would be retried twice)', async () => {
    const up = await refusingUpstream('{"error":{"message":"Request too large.","type":"invalid_request_error","param":null,"code":"request_too_large"}}');
    const p = await proxyTo(up.url);
    const sdk = new OpenAI({ apiKey: 'sk-test-not-a-key', baseURL: `${p.proxyUrl}/v1` });
    const errs = await fiveRefusals(() => sdk.chat.completions.create({ model: 'big-model', messages: [{ role: 'user', content: PROMPT }], stream: true }));
    for (const e of errs) {
      expect(e).toBeInstanceOf(OpenAI.APIError);
      expect((e as InstanceType<typeof OpenAI.APIError>).status).toBe(413);
      expect((e as InstanceType<typeof OpenAI.APIError>).code).toBe('request_too_large');
    }
    expect(up.requests()).toBe(5);
    await expectRecorded(p);
  });

  it('@anthropic-ai/sdk: APIError 413 request_too_large, one upstream request each', async () => {
    const up = await refusingUpstream('{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}');
    const p = await proxyTo(up.url);
    const sdk = new Anthropic({ apiKey: 'sk-ant-test', baseURL: p.proxyUrl });
    const errs = await fiveRefusals(() => sdk.messages.create({ model: 'big-model', max_tokens: 16, messages: [{ role: 'user', content: PROMPT }], stream: true }));
    for (const e of errs) {
      expect(e).toBeInstanceOf(Anthropic.APIError);
      expect((e as InstanceType<typeof Anthropic.APIError>).status).toBe(413);
      expect((e as InstanceType<typeof Anthropic.APIError>).error).toMatchObject({ type: 'error', error: { type: 'request_too_large' } });
    }
    expect(up.requests()).toBe(5);
    await expectRecorded(p);
  });
});
