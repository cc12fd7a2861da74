import { GoogleGenAI, Modality, type LiveServerMessage } from '@google/genai';
import net from 'node:net';
import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { RunningProxy } from '../../src/main.js';
import { createSimulator, type Simulator } from '../../src/simulate/server.js';
import { fullText } from '../../src/simulate/text.js';
import { hist, scrape, total, type Sample } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';

// The simulator's Realtime and Live endpoints emit on its schedule (first token at ttft, then
// one per itl, no jitter), so the proxy's figures have a ground truth that is not the client:
// timers fire late, never early, so TTFT and TPOT are at least the plan's, and a little above.
const PLAN = { ttft: 0.06, itl: 0.012, tokens: 9, jitter: 0 };
const SLACK = 0.03; // how late a timer, a loaded machine and the loopback may make them

let sim: Simulator;
let proxy: RunningProxy;

beforeAll(async () => {
  sim = createSimulator({ ...PLAN, seed: 5 });
  proxy = await startTestProxy(await sim.listen(0, '127.0.0.1'));
});

afterAll(async () => {
  await proxy?.close();
  await sim?.close();
});

/** A Live session of `@google/genai` through the proxy; `nextTurn()` resolves at the next turnComplete. */
async function liveThroughProxy(model: string) {
  const ai = new GoogleGenAI({ apiKey: 'g-sim', httpOptions: { baseUrl: proxy.proxyUrl } });
  const messages: LiveServerMessage[] = [];
  let turnDone: () => void = () => {};
  const session = await ai.live.connect({
    model,
    config: { responseModalities: [Modality.TEXT] },
    callbacks: {
      onmessage: (m) => {
        messages.push(m);
        if (m.serverContent?.turnComplete) turnDone();
      },
    },
  });
  const nextTurn = () => new Promise<void>((r) => (turnDone = r));
  return { session, messages, nextTurn };
}

/** `responses` TTFTs and TPOTs, their means at the plan's or a little later, never earlier. */
function expectOnPlan(s: Sample[], labels: Record<string, string>, tpotLabels: Record<string, string>, responses: number): void {
  const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', labels);
  expect(ttft.count).toBe(responses);
  expect(ttft.mean).toBeGreaterThanOrEqual(PLAN.ttft);
  expect(ttft.mean).toBeLessThan(PLAN.ttft + SLACK);
  const tpot = hist(s, 'gen_ai_server_time_per_output_token_seconds', tpotLabels);
  expect(tpot.count).toBe(responses);
  expect(tpot.mean).toBeGreaterThan(PLAN.itl * 0.9);
  expect(tpot.mean).toBeLessThan(PLAN.itl + SLACK / 4);
}

async function settled(): Promise<void> {
  for (let i = 0; i < 50 && proxy.forwarder.inFlight.size > 0; i++) await new Promise((r) => setTimeout(r, 20));
}

describe('the simulator over WebSocket, measured through the proxy', () => {
  it('OpenAI Realtime with the official client: text, then audio, then a turn the server answers by itself', async () => {
    const client = new OpenAI({ apiKey: 'sk-sim', baseURL: `${proxy.proxyUrl}/v1` });
    const port = Number(new URL(proxy.proxyUrl).port);
    // The SDK opens wss:; the proxy serves plain HTTP (see the README).
    const rt = await OpenAIRealtimeWS.create(client, { model: 'gpt-realtime', options: { createConnection: () => net.connect(port, '127.0.0.1') } });
    const text: string[] = [];
    let audio = 0;
    const usage: (number | undefined)[] = [];
    let done: () => void = () => {};
    rt.on('response.output_text.delta', (e) => text.push(e.delta));
    rt.on('response.output_audio.delta', () => audio++);
    rt.on('response.done', (e) => {
      usage.push(e.response.usage?.output_tokens);
      done();
    });
    const next = () => new Promise<void>((r) => (done = r));
    await new Promise<void>((r, j) => rt.socket.once('open', () => r()).once('error', j));

    let p = next();
    rt.send({ type: 'response.create' });
    await p;
    p = next();
    rt.send({ type: 'response.create', response: { output_modalities: ['audio'], max_output_tokens: 5 } });
    await p;
    p = next();
    rt.send({ type: 'input_audio_buffer.commit' });
    await p;
    rt.close();
    await new Promise((r) => rt.socket.once('close', r));

    expect(text).toHaveLength(2 * PLAN.tokens);
    expect(text.join('')).toBe(fullText(PLAN.tokens).repeat(2));
    expect(audio).toBe(5);
    expect(usage).toEqual([PLAN.tokens, 5, PLAN.tokens]);

    await settled();
    const s = await scrape(proxy.metricsUrl);
    const labels = { gen_ai_operation_name: 'realtime', gen_ai_provider_name: 'openai', gen_ai_request_model: 'gpt-realtime' };
    expectOnPlan(s, labels, { ...labels, gen_ai_response_model: 'gpt-realtime' }, 3);
    const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', labels);
    expect(gaps.count).toBe(2 * (PLAN.tokens - 1) + 4);
    // The audio answer was cut by max_output_tokens: `incomplete`, a normal end.
    expect(total(s, 'llm_proxy_streams_total', { ...labels, outcome: 'ok', token_count_source: 'usage' })).toBe(3);
  });

  it('Gemini Live with @google/genai', async () => {
    const { session, messages, nextTurn } = await liveThroughProxy('gemini-live-2.5-flash');
    for (let i = 0; i < 2; i++) {
      const turn = nextTurn();
      session.sendClientContent({ turns: 'Weather in Paris?', turnComplete: true });
      await turn;
    }
    session.close();
    expect(messages.filter((m) => m.serverContent?.modelTurn).length).toBe(2 * PLAN.tokens);
    expect(messages.filter((m) => m.usageMetadata?.responseTokenCount === PLAN.tokens).length).toBe(2);

    await settled();
    const s = await scrape(proxy.metricsUrl);
    const labels = { gen_ai_operation_name: 'realtime', gen_ai_provider_name: 'gcp.gemini', gen_ai_request_model: 'gemini-live-2.5-flash' };
    expectOnPlan(s, labels, labels, 2);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...labels, gen_ai_token_type: 'output' })).toBe(2 * PLAN.tokens);
  });

  it('Gemini Live: a user turn over the answer interrupts it, and the cut turn is recorded as cancelled', async () => {
    const { session, messages, nextTurn } = await liveThroughProxy('gemini-live-interrupt');
    const turn = nextTurn();
    session.sendClientContent({ turns: 'Weather in Paris?', turnComplete: true });
    while (!messages.some((m) => m.serverContent?.modelTurn)) await new Promise((r) => setTimeout(r, 5));
    session.sendClientContent({ turns: 'No, in Lyon.', turnComplete: true });
    await turn;
    session.close();
    expect(messages.filter((m) => m.serverContent?.interrupted)).toHaveLength(1);

    await settled();
    const s = await scrape(proxy.metricsUrl);
    const labels = { gen_ai_operation_name: 'realtime', gen_ai_request_model: 'gemini-live-interrupt' };
    expect(total(s, 'llm_proxy_streams_total', { ...labels, outcome: 'cancelled' })).toBe(1);
    expect(total(s, 'llm_proxy_streams_total', { ...labels, outcome: 'ok' })).toBe(1);
    expect(hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', labels).count).toBe(2);
  });

  it('speaks RFC 6455 where a client can get it wrong: version 13 only, masked client frames only', async () => {
    const port = (sim.server.address() as net.AddressInfo).port;
    const raw = (version: string, after?: Buffer) =>
      new Promise<Buffer>((resolve) => {
        const c = net.connect(port, '127.0.0.1');
        const got: Buffer[] = [];
        c.on('data', (b) => {
          got.push(b);
          if (after !== undefined && Buffer.concat(got).includes('\r\n\r\n')) c.write(after);
        });
        c.on('close', () => resolve(Buffer.concat(got)));
        c.on('error', () => resolve(Buffer.concat(got)));
        c.write(`GET /v1/realtime?model=x HTTP/1.1\r\nHost: sim\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: ${version}\r\n\r\n`);
        setTimeout(() => c.destroy(), 2000);
      });
    expect((await raw('8')).toString('latin1')).toMatch(/^HTTP\/1\.1 426 [\s\S]*sec-websocket-version: 13/i);
    // An unmasked client frame: the server answers close 1002 (protocol error) and ends.
    const answer = await raw('13', Buffer.from([0x81, 0x02, 0x68, 0x69]));
    const text = answer.toString('latin1');
    expect(text).toMatch(/^HTTP\/1\.1 101 [\s\S]*Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK\+xOo=/);
    const close = answer.subarray(answer.lastIndexOf(Buffer.from([0x88, 0x02])));
    expect([...close]).toEqual([0x88, 0x02, 0x03, 0xea]);
  });

  it('Gemini Live with nothing to wait for (ttft 0, itl 0): each turn completes, none is reported interrupted', async () => {
    const fast = createSimulator({ ttft: 0, itl: 0, tokens: 3, jitter: 0, seed: 1 });
    const url = await fast.listen(0, '127.0.0.1');
    try {
      const ws = new WebSocket(`${url.replace(/^http/, 'ws')}/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent`);
      const got: Record<string, unknown>[] = [];
      let turnDone: () => void = () => {};
      ws.on('message', (d) => {
        const m = JSON.parse(d.toString()) as Record<string, { turnComplete?: boolean }>;
        got.push(m);
        if (m.serverContent?.turnComplete) turnDone();
      });
      await new Promise((r, j) => ws.once('open', r).once('error', j));
      ws.send(JSON.stringify({ setup: { model: 'models/x' } }));
      for (let i = 0; i < 3; i++) {
        const t = new Promise<void>((r) => (turnDone = r));
        ws.send(JSON.stringify({ clientContent: { turns: [], turnComplete: true } }));
        await t;
      }
      ws.close();
      expect(got.filter((m) => (m.serverContent as { interrupted?: boolean } | undefined)?.interrupted)).toEqual([]);
      expect(got.filter((m) => (m.serverContent as { turnComplete?: boolean } | undefined)?.turnComplete)).toHaveLength(3);
    } finally {
      await fast.close();
    }
  });
});
