import { createHash, randomUUID } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { performance } from 'node:perf_hooks';
import type { Duplex } from 'node:stream';
import { obj } from '../providers/types.js';
import { MessageReader } from '../ws/messages.js';
import { detectWsApi } from '../ws/session.js';
import { runSchedule, tokenTimes, type Plan } from './schedule.js';
import { token } from './text.js';

/**
 * The simulator's WebSocket APIs, on the same schedule as its streams: OpenAI's Realtime API
 * (`…/realtime`) and Gemini's Live API (`…BidiGenerateContent`), text or audio out. Enough of
 * each protocol for the proxy's measurement and the official clients: no compression offered,
 * no audio in (a commit or an activity end is the user's turn ending).
 */
const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
/** 20 ms of 24 kHz mono PCM16, as the APIs stream it. */
const AUDIO_CHUNK = Buffer.alloc(960, 0).toString('base64');

/** Answers a WebSocket upgrade on a simulated API's path; anything else is refused. */
export function handleRealtimeUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer, plan: () => Plan, random: () => number): void {
  socket.on('error', () => socket.destroy());
  const url = new URL(req.url ?? '/', 'http://sim');
  const key = req.headers['sec-websocket-key'];
  const api = detectWsApi(url.pathname)?.api;
  if (api === undefined || (req.headers.upgrade ?? '').toLowerCase() !== 'websocket' || typeof key !== 'string') {
    socket.end('HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
    return;
  }
  if (req.headers['sec-websocket-version'] !== '13') {
    socket.end('HTTP/1.1 426 Upgrade Required\r\nsec-websocket-version: 13\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
    return;
  }
  const accept = createHash('sha1').update(key + GUID).digest('base64');
  socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
  const conn = new Conn(socket);
  const sim = api === 'openai-realtime' ? new RealtimeSim(conn, url, plan, random) : new LiveSim(conn, plan, random);
  const reader = new MessageReader((data) => {
    if (data === undefined) return;
    let msg: Record<string, unknown>;
    try {
      msg = JSON.parse(data.toString('utf8')) as Record<string, unknown>;
    } catch {
      return;
    }
    if (msg !== null && typeof msg === 'object') sim.onMessage(msg);
  }, {
    maxMessageBytes: 8 * 1024 * 1024,
    deflate: false,
    requireMask: true,
    onBroken: () => conn.close(Buffer.from([0x03, 0xea])), // 1002: protocol error
    onControl: (opcode, payload) => {
      if (opcode === 8) conn.close(payload);
      else if (opcode === 9) conn.frame(10, payload);
    },
  });
  socket.on('data', (b: Buffer) => reader.push(b, 0));
  // A client that ends its half without a close frame: stop and end ours.
  socket.on('end', () => {
    sim.stop();
    socket.end();
  });
  socket.on('close', () => sim.stop());
  if (head.length > 0) reader.push(head, 0);
}

class Conn {
  private closed = false;
  constructor(private readonly socket: Duplex) {}

  send(o: unknown): void {
    this.frame(1, Buffer.from(JSON.stringify(o)));
  }

  frame(opcode: number, payload: Buffer): void {
    if (this.closed || this.socket.destroyed) return;
    const n = payload.length;
    const head = n < 126 ? Buffer.from([0x80 | opcode, n]) : n < 65536 ? Buffer.alloc(4) : Buffer.alloc(10);
    if (n >= 126) {
      head[0] = 0x80 | opcode;
      if (n < 65536) {
        head[1] = 126;
        head.writeUInt16BE(n, 2);
      } else {
        head[1] = 127;
        head.writeBigUInt64BE(BigInt(n), 2);
      }
    }
    this.socket.write(Buffer.concat([head, payload]));
  }

  /** Echoes the client's close (its status code), or sends ours, and ends the connection. */
  close(payload: Buffer): void {
    if (this.closed) return;
    this.frame(8, payload.subarray(0, 2));
    this.closed = true;
    this.socket.end();
  }
}

/** OpenAI Realtime: one response at a time, as the API allows without `conversation: "none"`. */
class RealtimeSim {
  private cancel: (() => void) | undefined;
  private active: { id: string; finish: (status: string) => void } | undefined;
  private n = 0;
  private readonly model: string;
  private audio = false;

  constructor(
    private readonly conn: Conn,
    url: URL,
    private readonly plan: () => Plan,
    private readonly random: () => number,
  ) {
    this.model = url.searchParams.get('model') ?? url.searchParams.get('deployment') ?? 'sim-model';
    this.event({ type: 'session.created', session: this.session() });
  }

  private session(): Record<string, unknown> {
    return { id: 'sess_sim', object: 'realtime.session', type: 'realtime', model: this.model, output_modalities: [this.audio ? 'audio' : 'text'] };
  }

  private event(o: Record<string, unknown>): void {
    this.conn.send({ event_id: `event_${++this.n}`, ...o });
  }

  onMessage(m: Record<string, unknown>): void {
    switch (m.type) {
      case 'session.update': {
        const modalities = obj(m.session)?.output_modalities;
        if (Array.isArray(modalities)) this.audio = modalities.includes('audio');
        this.event({ type: 'session.updated', session: this.session() });
        return;
      }
      case 'input_audio_buffer.commit':
        this.event({ type: 'input_audio_buffer.committed', item_id: `item_${this.n}`, previous_item_id: null });
        this.respond(undefined); // the server answers a finished user turn by itself
        return;
      case 'response.create':
        this.respond(m);
        return;
      case 'response.cancel':
        this.active?.finish('cancelled');
        return;
    }
  }

  private respond(create: Record<string, unknown> | undefined): void {
    if (this.active !== undefined) {
      const eventId = typeof create?.event_id === 'string' ? create.event_id : undefined;
      this.event({ type: 'error', error: { type: 'invalid_request_error', code: 'conversation_already_has_active_response', message: 'Conversation already has an active response', event_id: eventId ?? null } });
      return;
    }
    const options = obj(create?.response);
    const modalities = options?.output_modalities;
    const audio = Array.isArray(modalities) ? modalities.includes('audio') : this.audio;
    const p = { ...this.plan() };
    const cap = typeof options?.max_output_tokens === 'number' ? options.max_output_tokens : undefined;
    if (cap !== undefined) p.tokens = Math.max(1, Math.min(p.tokens, Math.floor(cap)));
    const id = `resp_${randomUUID().replace(/-/g, '').slice(0, 20)}`;
    const item = `item_${id.slice(5)}`;
    const t0 = performance.now();
    const common = { response_id: id, item_id: item, output_index: 0, content_index: 0 };
    this.event({ type: 'response.created', response: { id, object: 'realtime.response', status: 'in_progress', output: [] } });
    this.event({ type: 'response.output_item.added', response_id: id, output_index: 0, item: { id: item, type: 'message', role: 'assistant', content: [] } });
    let sent = 0;
    const finish = (status: string) => {
      this.cancel?.();
      this.cancel = undefined;
      this.active = undefined;
      const statusDetails = status === 'cancelled' ? { type: 'cancelled', reason: 'client_cancelled' } : status === 'incomplete' ? { type: 'incomplete', reason: 'max_output_tokens' } : null;
      const usage = { total_tokens: 10 + sent, input_tokens: 10, output_tokens: sent, input_token_details: { cached_tokens: 0, text_tokens: 10, audio_tokens: 0 }, output_token_details: { text_tokens: audio ? 0 : sent, audio_tokens: audio ? sent : 0 } };
      this.event({ type: 'response.done', response: { id, object: 'realtime.response', status, status_details: statusDetails, output: [], usage } });
    };
    this.active = { id, finish };
    const cancel = runSchedule(
      tokenTimes(p, this.random),
      t0,
      (k) => {
        sent++;
        if (audio) {
          this.event({ type: 'response.output_audio.delta', ...common, delta: AUDIO_CHUNK });
          this.event({ type: 'response.output_audio_transcript.delta', ...common, delta: token(k) });
        } else {
          this.event({ type: 'response.output_text.delta', ...common, delta: token(k) });
        }
      },
      () => finish(cap !== undefined && p.tokens >= cap ? 'incomplete' : 'completed'),
    );
    // A schedule with nothing to wait for ends inside runSchedule: keep no stale cancel then.
    if (this.active?.id === id) this.cancel = cancel;
  }

  stop(): void {
    this.cancel?.();
  }
}

/** Gemini Live: a model turn per finished user turn. */
class LiveSim {
  private cancel: (() => void) | undefined;
  private audio = false;

  constructor(
    private readonly conn: Conn,
    private readonly plan: () => Plan,
    private readonly random: () => number,
  ) {}

  onMessage(m: Record<string, unknown>): void {
    const setup = obj(m.setup);
    if (setup !== undefined) {
      const modalities = obj(setup.generationConfig ?? setup.generation_config)?.responseModalities;
      this.audio = Array.isArray(modalities) && modalities.includes('AUDIO');
      this.conn.send({ setupComplete: {} });
      return;
    }
    const content = obj(m.clientContent ?? m.client_content);
    const input = obj(m.realtimeInput ?? m.realtime_input);
    if ((content !== undefined && (content.turnComplete ?? content.turn_complete) === true) || (input !== undefined && (input.activityEnd !== undefined || input.audioStreamEnd === true)) || m.toolResponse !== undefined) {
      this.turn();
    }
  }

  private turn(): void {
    if (this.cancel !== undefined) {
      // The user spoke over the answer: the API says so before the next turn.
      this.cancel();
      this.conn.send({ serverContent: { interrupted: true } });
    }
    const p = { ...this.plan() };
    let sent = 0;
    let finished = false;
    const cancel = runSchedule(
      tokenTimes(p, this.random),
      performance.now(),
      (k) => {
        sent++;
        const part = this.audio ? { inlineData: { mimeType: 'audio/pcm;rate=24000', data: AUDIO_CHUNK } } : { text: token(k) };
        this.conn.send({ serverContent: { modelTurn: { role: 'model', parts: [part] } } });
      },
      () => {
        finished = true;
        this.cancel = undefined;
        this.conn.send({ serverContent: { generationComplete: true } });
        this.conn.send({ serverContent: { turnComplete: true }, usageMetadata: { promptTokenCount: 10, responseTokenCount: sent, totalTokenCount: 10 + sent } });
      },
    );
    // A schedule with nothing to wait for ends inside runSchedule: keep no stale cancel then.
    if (!finished) this.cancel = cancel;
  }

  stop(): void {
    this.cancel?.();
  }
}
