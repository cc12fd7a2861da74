// OpenAI's Predicted Outputs through the proxy, with the official client (Chat and Azure): the
// rejected prediction tokens the usage counts were never streamed, so TPOT divides the streamed
// span by the streamed tokens. Without a prediction in the request the same usage field is taken
// as sent (the SGLang gateway reports rejected speculative drafts there, outside the count).
import OpenAI, { AzureOpenAI } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { between, ClientTimes, warmFetch } from '../helpers/bands.js';
import { startGroundTruth } from '../helpers/ground-truth.js';
import { hist, scrape, total } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';

const TOKENS = 6;
const REJECTED = 200;
let gt: Awaited<ReturnType<typeof startGroundTruth>>;
let proxy: RunningProxy;

beforeAll(async () => {
  gt = await startGroundTruth({ ttftMs: 30, itlMs: 20, tokens: TOKENS, rejectedPredictionTokens: REJECTED });
  proxy = await startTestProxy(gt.url);
  await warmFetch();
});
afterAll(async () => {
  await proxy?.close();
  await gt?.close();
});

const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'Rename x to y in: let x = 1;' }];
const prediction = { type: 'content' as const, content: 'let y = 1;' };

/** Streams one request; the range of streamed spans the proxy can have seen (s), from the upstream's send and the client's arrival times. */
async function stream(client: OpenAI, body: { model: string; prediction?: typeof prediction }): Promise<[number, number]> {
  const before = gt.sent.length;
  const t = new ClientTimes();
  const s = await client.chat.completions.create({ ...body, messages, stream: true, stream_options: { include_usage: true } });
  let usage: OpenAI.CompletionUsage | null | undefined;
  for await (const chunk of s) {
    if (chunk.choices[0]?.delta?.content) t.content();
    if (chunk.usage) usage = chunk.usage;
  }
  expect(usage?.completion_tokens).toBe(TOKENS + REJECTED);
  const sent = gt.sent[before]!.contentSendTimes;
  expect(sent).toHaveLength(TOKENS);
  return [(sent.at(-1)! - t.first) / 1000, (t.last - sent[0]!) / 1000];
}

async function measured(model: string) {
  const s = await scrape(proxy.metricsUrl);
  return {
    tpot: hist(s, 'gen_ai_server_time_per_output_token_seconds', { gen_ai_request_model: model }),
    output: total(s, 'gen_ai_client_token_usage_sum', { gen_ai_request_model: model, gen_ai_token_type: 'output' }),
  };
}

describe('Predicted Outputs through the proxy (official openai client)', () => {
  it('Chat with a prediction: TPOT over the streamed tokens; the output usage keeps the billed count', async () => {
    const client = new OpenAI({ apiKey: 'sk-test-not-a-key', baseURL: `${proxy.proxyUrl}/v1`, maxRetries: 0 });
    const span = await stream(client, { model: 'pred-chat', prediction });
    const m = await measured('pred-chat');
    expect(m.tpot.count).toBe(1);
    between(m.tpot.sum, span, 'TPOT', TOKENS - 1);
    expect(m.output).toBe(TOKENS + REJECTED);
  });

  it('Azure deployment with a prediction: the same, and the model label stays the deployment', async () => {
    const client = new AzureOpenAI({ apiKey: 'test-not-a-key', endpoint: proxy.proxyUrl, apiVersion: '2024-10-21', deployment: 'pred-deploy', maxRetries: 0 });
    const span = await stream(client, { model: 'gpt-4o', prediction });
    const m = await measured('pred-deploy');
    expect(m.tpot.count).toBe(1);
    between(m.tpot.sum, span, 'TPOT', TOKENS - 1);
    expect((await measured('gpt-4o')).tpot.count).toBe(0);
  });

  it('Chat without a prediction: the usage field is not taken as rejected predictions', async () => {
    const client = new OpenAI({ apiKey: 'sk-test-not-a-key', baseURL: `${proxy.proxyUrl}/v1`, maxRetries: 0 });
    const span = await stream(client, { model: 'draft-chat' });
    const m = await measured('draft-chat');
    expect(m.tpot.count).toBe(1);
    between(m.tpot.sum, span, 'TPOT', TOKENS + REJECTED - 1);
  });
});
