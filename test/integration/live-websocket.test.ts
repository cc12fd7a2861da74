import { GoogleGenAI, Modality, type LiveServerMessage } from '@google/genai';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocketServer, type RawData, type WebSocket } from 'ws';
import type { RunningProxy } from '../../src/main.js';
import { performance } from 'node:perf_hooks';
import { between, type Range } from '../helpers/bands.js';
import { hist, scrape, total } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';

// Gemini's Live API is a WebSocket (`BidiGenerateContent`); `@google/genai`'s `ai.live.connect`
// opens it at its base URL with `ws:` for `http:`, so it can be pointed at the proxy. The proxy
// tunnels it unchanged and measures the model's turn from the messages. The upstream speaks the Live protocol as the SDK's types
// describe it: `setup` → `setupComplete`, then `clientContent` → `serverContent.modelTurn` parts
// and a `turnComplete` with `usageMetadata`. (OpenAI's SDK always opens `wss:`, so its Realtime
// client needs TLS in front of the proxy and is not run here.)
const LIVE_PATH = '/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent';
const PARTS = ['The sky', ' is blue', ' because', ' of Rayleigh', ' scattering.'];

let upstream: http.Server;
let upstreamUrl: string;
let proxy: RunningProxy;
const handshakes: http.IncomingMessage[] = [];
/** Every client message the upstream received, parsed. */
const received: Record<string, unknown>[] = [];
/** Every frame the upstream sent, as sent. */
const sent: string[] = [];
/** When the upstream got the last turn's clientContent, and when it began writing each of its parts (performance.now(), ms). */
const upstreamTurn = { asked: NaN, parts: [] as number[] };

beforeAll(async () => {
  const wss = new WebSocketServer({ noServer: true });
  upstream = http.createServer((_req, res) => res.writeHead(404).end());
  upstream.on('upgrade', (req, socket, head) => {
    handshakes.push(req);
    // The SDK joins its base URL (with the trailing slash URL#toString gives it) and the path: `//ws/…`.
    if (req.url!.replace(/^\/+/, '/').split('?')[0] !== LIVE_PATH) return socket.destroy();
    wss.handleUpgrade(req, socket, head, (ws: WebSocket) => {
      const send = (o: unknown) => {
        const s = JSON.stringify(o);
        sent.push(s);
        ws.send(s);
      };
      ws.on('message', async (data: RawData) => {
        const msg = JSON.parse(data.toString()) as Record<string, unknown>;
        received.push(msg);
        if (msg.setup) send({ setupComplete: {} });
        if (msg.clientContent) {
          upstreamTurn.asked = performance.now();
          upstreamTurn.parts = [];
          for (const text of PARTS) {
            await new Promise((r) => setTimeout(r, 20));
            upstreamTurn.parts.push(performance.now());
            send({ serverContent: { modelTurn: { role: 'model', parts: [{ text }] } } });
          }
          send({ serverContent: { generationComplete: true } });
          send({ serverContent: { turnComplete: true }, usageMetadata: { promptTokenCount: 9, responseTokenCount: 12, totalTokenCount: 21 } });
        }
      });
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  proxy = await startTestProxy(upstreamUrl);
});

afterAll(async () => {
  await proxy?.close();
  upstream?.closeAllConnections();
  await new Promise((r) => upstream?.close(r));
});

/** One Live session as an application runs it: set up, one turn, close. */
async function liveSession(baseUrl: string): Promise<{ messages: LiveServerMessage[]; closeCode: number; sentFrom: number; asked: number; partsAt: number[] }> {
  const sentFrom = sent.length;
  const ai = new GoogleGenAI({ apiKey: 'g-live-key', httpOptions: { baseUrl } });
  const messages: LiveServerMessage[] = [];
  const partsAt: number[] = [];
  let turnDone!: () => void;
  const turn = new Promise<void>((r) => (turnDone = r));
  let closed!: (code: number) => void;
  const closedP = new Promise<number>((r) => (closed = r));
  const session = await ai.live.connect({
    model: 'gemini-live-2.5-flash',
    config: { responseModalities: [Modality.TEXT] },
    callbacks: {
      onmessage: (m) => {
        if (m.serverContent?.modelTurn?.parts?.length) partsAt.push(performance.now());
        messages.push(m);
        if (m.serverContent?.turnComplete) turnDone();
      },
      onclose: (e) => closed(e.code),
    },
  });
  const asked = performance.now();
  session.sendClientContent({ turns: 'Why is the sky blue?', turnComplete: true });
  await turn;
  session.close();
  return { messages, closeCode: await closedP, sentFrom, asked, partsAt };
}

describe('@google/genai Live API through the proxy (WebSocket tunnel)', () => {
  it('sets up a session, streams a turn and closes as it does without the proxy, every frame unchanged', async () => {
    const direct = await liveSession(upstreamUrl);
    const before = received.length;
    const viaProxy = await liveSession(proxy.proxyUrl);

    // The session went as it goes directly: same messages, same close (the SDK's close() sends
    // no status code, so both ends see 1005).
    expect(viaProxy.closeCode).toBe(direct.closeCode);
    expect(viaProxy.closeCode).toBe(1005);
    expect(JSON.stringify(viaProxy.messages)).toBe(JSON.stringify(direct.messages));
    // What the client read is what the upstream wrote, frame for frame.
    expect(viaProxy.messages.map((m) => JSON.stringify(m))).toEqual(sent.slice(viaProxy.sentFrom).map((x) => JSON.stringify(JSON.parse(x))));
    expect(viaProxy.messages.flatMap((m) => m.serverContent?.modelTurn?.parts?.map((p) => p.text) ?? []).join('')).toBe(PARTS.join(''));
    expect(viaProxy.messages.at(-1)?.usageMetadata?.responseTokenCount).toBe(12);

    // What the upstream got: the SDK's path, its key in the query, the client's messages.
    const hs = handshakes.at(-1)!;
    expect(hs.url).toBe(`/${LIVE_PATH}?key=g-live-key`);
    expect(hs.headers.upgrade?.toLowerCase()).toBe('websocket');
    expect(hs.headers['x-goog-api-client']).toMatch(/google-genai-sdk\//);
    expect(hs.headers['x-forwarded-for']).toBe('127.0.0.1');
    expect(hs.headers.host).toBe(new URL(upstreamUrl).host);
    expect(received[before]).toMatchObject({ setup: { model: 'models/gemini-live-2.5-flash', generationConfig: { responseModalities: ['TEXT'] } } });
    expect(received[before + 1]).toMatchObject({ clientContent: { turns: [{ role: 'user', parts: [{ text: 'Why is the sky blue?' }] }], turnComplete: true } });

    for (let i = 0; i < 50 && proxy.forwarder.inFlight.size > 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(proxy.forwarder.inFlight.size).toBe(0);
    // The turn is measured like a stream (the client's ground truth on the same clock): TTFT
    // from the clientContent that ended the user's turn, a gap per part, TPOT over the usage.
    const s = await scrape(proxy.metricsUrl);
    const labels = { gen_ai_operation_name: 'realtime', gen_ai_provider_name: 'gcp.gemini', gen_ai_request_model: 'gemini-live-2.5-flash' };
    const at = viaProxy.partsAt;
    expect(at).toHaveLength(PARTS.length);
    const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', labels);
    expect(ttft.count).toBe(1);
    // The proxy sees the ask after the client sent it and before the upstream has it, and a part
    // after the upstream began writing it and before the client reads it: each figure lies
    // between what the upstream and the client saw, on the one clock.
    const up = upstreamTurn;
    expect(up.parts).toHaveLength(PARTS.length);
    const span: Range = [(up.parts.at(-1)! - at[0]!) / 1000, (at.at(-1)! - up.parts[0]!) / 1000];
    between(ttft.sum, [(up.parts[0]! - up.asked) / 1000, (at[0]! - viaProxy.asked) / 1000], 'TTFT');
    expect(ttft.sum).toBeGreaterThan(0.02 * 0.9); // the upstream waits 20 ms before the first part
    const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', labels);
    expect(gaps.count).toBe(PARTS.length - 1);
    between(gaps.sum, span, 'sum of gaps');
    const tpot = hist(s, 'gen_ai_server_time_per_output_token_seconds', labels);
    expect(tpot.count).toBe(1);
    between(tpot.sum, span, 'TPOT', 11);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...labels, gen_ai_token_type: 'output' })).toBe(12);
    expect(total(s, 'gen_ai_client_token_usage_sum', { ...labels, gen_ai_token_type: 'input' })).toBe(9);
    expect(total(s, 'llm_proxy_streams_total', { ...labels, outcome: 'ok' })).toBe(1);
  });
});
