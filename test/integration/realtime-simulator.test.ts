import { GoogleGenAI, Modality, type LiveServerMessage } from '@google/genai';
import net from 'node:net';
import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { RunningProxy } from '../../src/main.js';
import { createSimulator, type Simulator } from '../../src/simulate/server.js';
import { fullText } from '../../src/simulate/text.js';
import { between, ClientTimes, streamBounds } from '../helpers/bands.js';
import { hist, scrape, total, type Sample } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';

// The simulator's Realtime and Live endpoints emit on its schedule (first token at ttft, then
// one per itl, no jitter), never early, from when a response starts; the proxy's figures lie
// between that schedule and what the client saw (`streamBounds`: the proxy starts its clock after
// the client asked and stamps an event before the client has it).
const PLAN = { ttft: 0.06, itl: 0.012, tokens: 9, jitter: 0 };

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

/**
 * A Live session of `@google/genai` through the proxy; `nextTurn()` resolves at the next
 * turnComplete; `times` has what the client saw of each turn asked with `ask`.
 */
async function liveThroughProxy(model: string) {
  const ai = new GoogleGenAI({ apiKey: 'g-sim', httpOptions: { baseUrl: proxy.proxyUrl } });
  const messages: LiveServerMessage[] = [];
  const times: ClientTimes[] = [];
  let turnDone: () => void = () => {};
  const session = await ai.live.connect({
    model,
    config: { responseModalities: [Modality.TEXT] },
    callbacks: {
      onmessage: (m) => {
        messages.push(m);
        if (m.serverContent?.modelTurn) times.at(-1)?.content();
        if (m.serverContent?.turnComplete) turnDone();
      },
    },
  });
  const nextTurn = () => new Promise<void>((r) => (turnDone = r));
  const ask = (turns: string) => {
    times.push(new ClientTimes());
    session.sendClientContent({ turns, turnComplete: true });
  };
  return { session, messages, nextTurn, ask, times };
}

/**
 * The responses' TTFTs, gaps and TPOTs, bounded by the schedule and what the client saw of each
 * (`times[i]`, with `tokens[i]` content events, one per token). `lead` (s): how much later than
 * the upstream's start the proxy may have started a turn's clock (0 where the client's message
 * starts the turn: the proxy sees it first).
 */
function expectOnPlan(s: Sample[], labels: Record<string, string>, tpotLabels: Record<string, string>, times: ClientTimes[], tokens: number[], lead = 0): void {
  const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', labels);
  expect(ttft.count).toBe(times.length);
  const [lo, hi] = streamBounds(times, PLAN.ttft, PLAN.ttft).ttft;
  between(ttft.sum, [lo - lead, hi], 'TTFT');
  // Responses differ in length: their spans add up to the sum of gaps; TPOT divides each by its tokens − 1.
  let spanLo = 0;
  let spanHi = 0;
  let tpotLo = 0;
  let tpotHi = 0;
  times.forEach((t, i) => {
    const n = tokens[i]!;
    const [lo, hi] = streamBounds(t, PLAN.ttft, PLAN.ttft + PLAN.itl * (n - 1)).span;
    spanLo += lo;
    spanHi += hi;
    tpotLo += lo / (n - 1);
    tpotHi += hi / (n - 1);
  });
  const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', labels);
  expect(gaps.count).toBe(tokens.reduce((a, n) => a + n - 1, 0));
  between(gaps.sum, [spanLo, spanHi], 'sum of gaps');
  const tpot = hist(s, 'gen_ai_server_time_per_output_token_seconds', tpotLabels);
  expect(tpot.count).toBe(times.length);
  between(tpot.sum, [tpotLo, tpotHi], 'TPOT');
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
    const times: ClientTimes[] = [];
    let committedAt = NaN;
    let done: () => void = () => {};
    rt.on('response.output_text.delta', (e) => {
      text.push(e.delta);
      times.at(-1)!.content();
    });
    rt.on('response.output_audio.delta', () => {
      audio++;
      times.at(-1)!.content();
    });
    rt.on('input_audio_buffer.committed', () => (committedAt = performance.now()));
    rt.on('response.done', (e) => {
      usage.push(e.response.usage?.output_tokens);
      done();
    });
    const ask = (e: Parameters<typeof rt.send>[0]) => {
      const p = new Promise<void>((r) => (done = r));
      times.push(new ClientTimes());
      rt.send(e);
      return p;
    };
    await new Promise<void>((r, j) => rt.socket.once('open', () => r()).once('error', j));

    await ask({ type: 'response.create' });
    await ask({ type: 'response.create', response: { output_modalities: ['audio'], max_output_tokens: 5 } });
    await ask({ type: 'input_audio_buffer.commit' });
    rt.close();
    await new Promise((r) => rt.socket.once('close', r));

    expect(text).toHaveLength(2 * PLAN.tokens);
    expect(text.join('')).toBe(fullText(PLAN.tokens).repeat(2));
    expect(audio).toBe(5);
    expect(usage).toEqual([PLAN.tokens, 5, PLAN.tokens]);

    await settled();
    const s = await scrape(proxy.metricsUrl);
    const labels = { gen_ai_operation_name: 'realtime', gen_ai_provider_name: 'openai', gen_ai_request_model: 'gpt-realtime' };
    // The third turn's clock starts at the server's `committed`, which the proxy may read after
    // the simulator has started that response, but before the client has it.
    expect(committedAt, 'the client got no input_audio_buffer.committed').not.toBeNaN();
    expectOnPlan(s, labels, { ...labels, gen_ai_response_model: 'gpt-realtime' }, times, [PLAN.tokens, 5, PLAN.tokens], (committedAt - times[2]!.sent) / 1000);
    // The audio answer was cut by max_output_tokens: `incomplete`, a normal end.
    expect(total(s, 'llm_proxy_streams_total', { ...labels, outcome: 'ok', token_count_source: 'usage' })).toBe(3);
  });

  it('Gemini Live with @google/genai', async () => {
    const { session, messages, nextTurn, ask, times } = await liveThroughProxy('gemini-live-2.5-flash');
    for (let i = 0; i < 2; i++) {
      const turn = nextTurn();
      ask('Weather in Paris?');
      await turn;
    }
    session.close();
    expect(messages.filter((m) => m.serverContent?.modelTurn).length).toBe(2 * PLAN.tokens);
    expect(messages.filter((m) => m.usageMetadata?.responseTokenCount === PLAN.tokens).length).toBe(2);

    await settled();
    const s = await scrape(proxy.metricsUrl);
    const labels = { gen_ai_operation_name: 'realtime', gen_ai_provider_name: 'gcp.gemini', gen_ai_request_model: 'gemini-live-2.5-flash' };
    expectOnPlan(s, labels, labels, times, [PLAN.tokens, PLAN.tokens]);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...labels, gen_ai_token_type: 'output' })).toBe(2 * PLAN.tokens);
  });

  it('Gemini Live: a user turn over the answer interrupts it, and the cut turn is recorded as cancelled', async () => {
    // A long answer (100 tokens, ~1.25 s), so that the second turn comes while it streams: with
    // the plan's 9 tokens (~0.16 s) a 0.4 s stall of this process let the simulator send them all
    // at once when it resumed, and the turn completed before the user spoke.
    const config = `http://127.0.0.1:${(sim.server.address() as net.AddressInfo).port}/_sim/config`;
    const setTokens = (tokens: number) => fetch(config, { method: 'PUT', body: JSON.stringify({ tokens }) });
    expect((await setTokens(100)).status).toBe(200);
    try {
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
    } finally {
      await setTokens(PLAN.tokens);
    }
  });

  it('a drain that ends with sessions open tells the official clients the server is going away (Close 1001), not an abnormal closure', async () => {
    const p = await startTestProxy(`http://127.0.0.1:${(sim.server.address() as net.AddressInfo).port}`);
    try {
      // OpenAI Realtime, open after one answer.
      const client = new OpenAI({ apiKey: 'sk-sim', baseURL: `${p.proxyUrl}/v1` });
      const port = Number(new URL(p.proxyUrl).port);
      const rt = await OpenAIRealtimeWS.create(client, { model: 'gpt-realtime', options: { createConnection: () => net.connect(port, '127.0.0.1') } });
      await new Promise<void>((r, j) => rt.socket.once('open', () => r()).once('error', j));
      const answered = new Promise<void>((r) => rt.on('response.done', () => r()));
      rt.send({ type: 'response.create' });
      await answered;
      const rtClosed = new Promise<[number, string]>((r) => rt.socket.once('close', (code, reason) => r([code, reason.toString()])));
      // Gemini Live, open after one turn.
      let liveClosed!: (c: [number, string]) => void;
      const liveClose = new Promise<[number, string]>((r) => (liveClosed = r));
      let turnDone!: () => void;
      const turn = new Promise<void>((r) => (turnDone = r));
      const ai = new GoogleGenAI({ apiKey: 'g-sim', httpOptions: { baseUrl: p.proxyUrl } });
      const session = await ai.live.connect({
        model: 'gemini-live-2.5-flash',
        config: { responseModalities: [Modality.TEXT] },
        callbacks: {
          onmessage: (m) => {
            if (m.serverContent?.turnComplete) turnDone();
          },
          onclose: (e) => liveClosed([e.code, e.reason]),
        },
      });
      session.sendClientContent({ turns: 'Weather in Paris?', turnComplete: true });
      await turn;

      await p.shutdown(0.2);
      expect(await rtClosed).toEqual([1001, 'proxy shutting down']);
      expect(await liveClose).toEqual([1001, 'proxy shutting down']);
    } finally {
      await p.close();
    }
  });

  it('a session quiet for timeouts.idle is closed with a Close 1001 "idle timeout" that the official client reads', async () => {
    const p = await startTestProxy(`http://127.0.0.1:${(sim.server.address() as net.AddressInfo).port}`, { timeouts: { idle: 0.5 } });
    try {
      const client = new OpenAI({ apiKey: 'sk-sim', baseURL: `${p.proxyUrl}/v1` });
      const port = Number(new URL(p.proxyUrl).port);
      const rt = await OpenAIRealtimeWS.create(client, { model: 'gpt-realtime', options: { createConnection: () => net.connect(port, '127.0.0.1') } });
      const rtClosed = new Promise<[number, string]>((r) => rt.socket.once('close', (code, reason) => r([code, reason.toString()])));
      await new Promise<void>((r, j) => rt.socket.once('open', () => r()).once('error', j));
      expect(await rtClosed).toEqual([1001, 'idle timeout']);
    } finally {
      await p.close();
    }
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
