import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';
import { performance } from 'node:perf_hooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket, WebSocketServer, type RawData } from 'ws';
import type { RunningProxy } from '../../src/main.js';
import { hist, scrape, total } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';

// OpenAI's Realtime API over a WebSocket, measured by the proxy from the tunnelled bytes. The
// upstream speaks the GA event names as the `openai` package's types give them, with
// permessage-deflate on every message (threshold 0), and writes on a known schedule; the client
// is the `ws` package (what the SDK's Node client uses), which offers permessage-deflate by
// default. Ground truth: the client's and the upstream's own timestamps, in this process, on the
// same clock.
const WAIT_BEFORE_CREATED = 30; // ms between the client's response.create and response.created
const DELTA_SPACING = 15;
const AUDIO_DELTAS = 6;
/** Float rounding in the exported sums (s). */
const EPS = 1e-6;

let upstream: http.Server;
let proxy: RunningProxy;
/** Every message the upstream sent, as sent. */
const sent: string[] = [];
/** When the upstream sent each message (before `ws.send`: the proxy reads it later). */
const sentAt: { type: string; at: number }[] = [];
/** When the upstream got each response.create it answers (the proxy read it earlier). */
const createGot: number[] = [];
/** The upstream's send times of messages of `type` from `mark` on, s. */
const upSent = (mark: number, type: string) => sentAt.slice(mark).filter((m) => m.type === type).map((m) => m.at / 1000);
const handshakes: http.IncomingMessage[] = [];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const audio = (k: number) => Buffer.alloc(4800, k).toString('base64'); // 100 ms of 24 kHz PCM16

beforeAll(async () => {
  const wss = new WebSocketServer({ noServer: true, perMessageDeflate: { threshold: 0 } });
  upstream = http.createServer((_req, res) => res.writeHead(404).end());
  upstream.on('upgrade', (req, socket, head) => {
    handshakes.push(req);
    wss.handleUpgrade(req, socket, head, (ws) => {
      const send = (o: Record<string, unknown>) => {
        const s = JSON.stringify({ event_id: `event_${sent.length}`, ...o });
        sent.push(s);
        sentAt.push({ type: o.type as string, at: performance.now() });
        ws.send(s);
      };
      let n = 0;
      const respond = async (id: string, status: string, deltas: 'audio' | 'text', count: number, usage: Record<string, unknown>) => {
        send({ type: 'response.created', response: { id, object: 'realtime.response', status: 'in_progress', output: [] } });
        send({ type: 'response.output_item.added', response_id: id, output_index: 0, item: { id: `item_${id}`, type: 'message', role: 'assistant', content: [] } });
        for (let k = 0; k < count; k++) {
          await sleep(DELTA_SPACING);
          const common = { response_id: id, item_id: `item_${id}`, output_index: 0, content_index: 0 };
          if (deltas === 'audio') {
            send({ type: 'response.output_audio.delta', ...common, delta: audio(k) });
            // A transcript of the audio: not output of its own.
            send({ type: 'response.output_audio_transcript.delta', ...common, delta: `word${k} ` });
          } else {
            send({ type: 'response.output_text.delta', ...common, delta: `tok${k} ` });
          }
        }
        send({ type: 'response.done', response: { id, object: 'realtime.response', status, output: [], usage } });
      };
      send({ type: 'session.created', session: { id: 'sess_1', object: 'realtime.session', model: 'gpt-realtime-2025-08-28', type: 'realtime' } });
      ws.on('message', async (data: RawData) => {
        const msg = JSON.parse(data.toString()) as { type: string; event_id?: string };
        if (msg.type === 'response.create' && msg.event_id === 'evt_rejected') {
          send({ type: 'error', error: { type: 'invalid_request_error', code: 'conversation_already_has_active_response', message: 'busy', event_id: msg.event_id } });
          return;
        }
        if (msg.type === 'response.create') {
          createGot.push(performance.now() / 1000);
          await sleep(WAIT_BEFORE_CREATED);
          await respond(`resp_${++n}`, 'completed', 'audio', AUDIO_DELTAS, {
            total_tokens: 70,
            input_tokens: 30,
            output_tokens: 40,
            input_token_details: { cached_tokens: 5, text_tokens: 30, audio_tokens: 0 },
            output_token_details: { text_tokens: 8, audio_tokens: 32 },
          });
        }
        if (msg.type === 'input_audio_buffer.append') {
          // Server VAD: the server ends the user's turn and answers by itself; the client then
          // speaks over the answer, and the server cancels it.
          send({ type: 'input_audio_buffer.speech_stopped', audio_end_ms: 900, item_id: 'item_user' });
          send({ type: 'input_audio_buffer.committed', item_id: 'item_user', previous_item_id: null });
          await sleep(WAIT_BEFORE_CREATED);
          await respond(`resp_${++n}`, 'cancelled', 'text', 3, { total_tokens: 33, input_tokens: 30, output_tokens: 3 });
        }
      });
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  proxy = await startTestProxy(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`);
});

afterAll(async () => {
  await proxy?.close();
  upstream?.closeAllConnections();
  await new Promise((r) => upstream?.close(r));
});

interface Received {
  text: string;
  type: string;
  at: number;
}

describe('OpenAI Realtime through the proxy (WebSocket, permessage-deflate)', () => {
  it('measures each response from the message that asked for it, per delta, with its usage, bytes unchanged', async () => {
    const [mark, markCreate] = [sentAt.length, createGot.length];
    const base = proxy.proxyUrl.replace(/^http/, 'ws');
    const ws = new WebSocket(`${base}/v1/realtime?model=gpt-realtime`, { headers: { authorization: 'Bearer sk-test' } });
    const got: Received[] = [];
    const waiters: { type: string; resolve: () => void }[] = [];
    ws.on('message', (d: RawData) => {
      const at = performance.now();
      const text = d.toString();
      const type = (JSON.parse(text) as { type: string }).type;
      got.push({ text, type, at });
      for (const w of waiters.filter((x) => x.type === type)) w.resolve();
    });
    const next = (type: string) => new Promise<void>((resolve) => waiters.push({ type, resolve }));
    await new Promise((r, j) => ws.once('open', r).once('error', j));
    expect(ws.extensions).toContain('permessage-deflate');
    await next('session.created');

    // A rejected response.create (it gets an error, no response) must not shift the next one's start.
    ws.send(JSON.stringify({ type: 'response.create', event_id: 'evt_rejected' }));
    await next('error');
    ws.send(JSON.stringify({ type: 'conversation.item.create', item: { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hi' }] } }));
    const asked = performance.now();
    let done = next('response.done');
    ws.send(JSON.stringify({ type: 'response.create', event_id: 'evt_1', response: { output_modalities: ['audio'] } }));
    await done;

    done = next('response.done');
    ws.send(JSON.stringify({ type: 'input_audio_buffer.append', audio: audio(9) }));
    await done;
    ws.close(1000);
    await new Promise((r) => ws.once('close', r));

    // Every message arrived as the upstream sent it, in order.
    expect(got.map((g) => g.text)).toEqual(sent);

    for (let i = 0; i < 50 && proxy.forwarder.inFlight.size > 0; i++) await sleep(20);
    const s = await scrape(proxy.metricsUrl);
    const labels = { gen_ai_operation_name: 'realtime', gen_ai_provider_name: 'openai', gen_ai_request_model: 'gpt-realtime' };

    // Ground truth on both sides, one clock: the proxy read each message after the upstream sent
    // it (or before the upstream got it) and before the client got it (or after the client sent
    // it). Response 1 runs from the client's response.create to the audio deltas; response 2
    // from the server's commit to the text deltas. Times in s.
    const at = (type: string) => got.filter((g) => g.type === type).map((g) => g.at / 1000);
    const [audioAt, textAt] = [at('response.output_audio.delta'), at('response.output_text.delta')];
    const committedAt = at('input_audio_buffer.committed')[0]!;
    const [upAudio, upText] = [upSent(mark, 'response.output_audio.delta'), upSent(mark, 'response.output_text.delta')];
    const upCommit = upSent(mark, 'input_audio_buffer.committed')[0]!;
    const upCreate = createGot[markCreate]!;
    expect(audioAt).toHaveLength(AUDIO_DELTAS);
    expect(textAt).toHaveLength(3);
    expect(createGot).toHaveLength(markCreate + 1); // the rejected one is not answered

    const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', labels);
    expect(ttft.count).toBe(2);
    // Not from response.created (30 ms later): from what asked for the response.
    expect(ttft.sum).toBeGreaterThan((2 * (WAIT_BEFORE_CREATED + DELTA_SPACING) * 0.9) / 1000);
    expect(ttft.sum).toBeGreaterThanOrEqual(upAudio[0]! - upCreate + (upText[0]! - committedAt) - EPS);
    expect(ttft.sum).toBeLessThanOrEqual(audioAt[0]! - asked / 1000 + (textAt[0]! - upCommit) + EPS);

    // One gap per output delta after the first (transcript deltas are not output).
    const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', labels);
    expect(gaps.count).toBe(AUDIO_DELTAS - 1 + 2);
    expect(gaps.sum).toBeGreaterThanOrEqual(upAudio.at(-1)! - audioAt[0]! + (upText.at(-1)! - textAt[0]!) - EPS);
    expect(gaps.sum).toBeLessThanOrEqual(audioAt.at(-1)! - upAudio[0]! + (textAt.at(-1)! - upText[0]!) + EPS);
    expect(gaps.mean).toBeGreaterThan((DELTA_SPACING * 0.8) / 1000);

    // TPOT over the usage's output tokens (audio included): (last - first) / (40 - 1), for the
    // first response only: the second was cancelled, and TPOT is for successful responses.
    const tpot = hist(s, 'gen_ai_server_time_per_output_token_seconds', { ...labels, gen_ai_response_model: 'gpt-realtime-2025-08-28' });
    expect(tpot.count).toBe(1);
    expect(tpot.sum).toBeGreaterThanOrEqual((upAudio.at(-1)! - audioAt[0]!) / 39 - EPS);
    expect(tpot.sum).toBeLessThanOrEqual((audioAt.at(-1)! - upAudio[0]!) / 39 + EPS);

    const tokens = (type: string) => total(s, 'gen_ai_client_token_usage_sum', { ...labels, gen_ai_token_type: type });
    expect(tokens('output')).toBe(43);
    expect(tokens('input')).toBe(60);
    expect(tokens('cached_input')).toBe(5);

    // The second answer was cancelled (the user spoke over it); nothing is left active.
    expect(total(s, 'llm_proxy_streams_total', { ...labels, outcome: 'ok' })).toBe(1);
    expect(total(s, 'llm_proxy_streams_total', { ...labels, outcome: 'cancelled' })).toBe(1);
    expect(total(s, 'gen_ai_client_operation_duration_seconds_count', { ...labels, error_type: 'client_cancelled' })).toBe(1);
    expect(total(s, 'llm_proxy_streams_active', { gen_ai_provider_name: 'openai' })).toBe(0);
    // Its series says which operation it counts (the dashboard's operation variable filters it).
    expect(s.filter((x) => x.name === 'llm_proxy_streams_active' && x.labels.gen_ai_provider_name === 'openai').map((x) => x.labels.gen_ai_operation_name)).toEqual(['realtime']);
    expect(handshakes.at(-1)!.url).toBe('/v1/realtime?model=gpt-realtime');
  });

  it('measures a session of the official openai client (OpenAIRealtimeWS) the same way', async () => {
    const labels = { gen_ai_operation_name: 'realtime', gen_ai_provider_name: 'openai', gen_ai_request_model: 'gpt-realtime' };
    const [mark, markCreate] = [sentAt.length, createGot.length];
    const before = await scrape(proxy.metricsUrl);
    const ttft0 = hist(before, 'gen_ai_client_operation_time_to_first_chunk_seconds', labels);
    const gaps0 = hist(before, 'gen_ai_client_operation_time_per_output_chunk_seconds', labels);

    const client = new OpenAI({ apiKey: 'sk-sdk', baseURL: `${proxy.proxyUrl}/v1` });
    // The SDK always opens wss:, and the proxy serves no TLS (an ingress does, in production):
    // `ws` is handed a plain TCP connection to the proxy for the SDK's URL.
    const port = Number(new URL(proxy.proxyUrl).port);
    const rt = await OpenAIRealtimeWS.create(client, { model: 'gpt-realtime', options: { createConnection: () => net.connect(port, '127.0.0.1') } });
    const audioAt: number[] = [];
    rt.on('response.output_audio.delta', () => audioAt.push(performance.now()));
    const done = new Promise<void>((r) => rt.on('response.done', () => r()));
    await new Promise<void>((r, j) => rt.socket.once('open', () => r()).once('error', j));
    const asked = performance.now();
    rt.send({ type: 'response.create', event_id: 'evt_sdk', response: { output_modalities: ['audio'] } });
    await done;
    rt.close();
    await new Promise((r) => rt.socket.once('close', r));

    expect(handshakes.at(-1)!.url).toBe('/v1/realtime?model=gpt-realtime');
    expect(handshakes.at(-1)!.headers.authorization).toBe('Bearer sk-sdk');
    expect(audioAt).toHaveLength(AUDIO_DELTAS);
    for (let i = 0; i < 50 && proxy.forwarder.inFlight.size > 0; i++) await sleep(20);
    const s = await scrape(proxy.metricsUrl);
    const ttft = hist(s, 'gen_ai_client_operation_time_to_first_chunk_seconds', labels);
    // Bounded as in the first test: the upstream's send before the proxy's read, the client's read after it.
    const upAudio = upSent(mark, 'response.output_audio.delta');
    const upCreate = createGot[markCreate]!;
    expect(upAudio).toHaveLength(AUDIO_DELTAS);
    expect(ttft.count - ttft0.count).toBe(1);
    expect(ttft.sum - ttft0.sum).toBeLessThanOrEqual((audioAt[0]! - asked) / 1000 + EPS);
    expect(ttft.sum - ttft0.sum).toBeGreaterThanOrEqual(upAudio[0]! - upCreate - EPS);
    expect(ttft.sum - ttft0.sum).toBeGreaterThan((WAIT_BEFORE_CREATED * 0.9) / 1000);
    const gaps = hist(s, 'gen_ai_client_operation_time_per_output_chunk_seconds', labels);
    expect(gaps.count - gaps0.count).toBe(AUDIO_DELTAS - 1);
    expect(gaps.sum - gaps0.sum).toBeGreaterThanOrEqual(upAudio.at(-1)! - audioAt[0]! / 1000 - EPS);
    expect(gaps.sum - gaps0.sum).toBeLessThanOrEqual(audioAt.at(-1)! / 1000 - upAudio[0]! + EPS);
  });
});
