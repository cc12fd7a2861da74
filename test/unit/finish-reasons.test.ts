import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { RequestMeter } from '../../src/measure/request-meter.js';
import { BedrockAdapter } from '../../src/providers/bedrock.js';
import { detectApi } from '../../src/providers/detect.js';
import { FinishReasons } from '../../src/providers/finish-reasons.js';
import type { ResponseAdapter } from '../../src/providers/types.js';
import { testInstruments } from '../helpers/metrics.js';

/**
 * Why the model stopped, per API, as the request's summary (and log line) reports it. The
 * events are written from each API's reference (the fixtures' README and the sources named in
 * native-apis.test.ts); the fixtures themselves are checked in providers-fixtures.test.ts.
 */

let t: ReturnType<typeof testInstruments>;
beforeEach(() => {
  t = testInstruments();
});
afterEach(async () => t.shutdown());

const opts = { maxEventBytes: 1 << 20, maxBodyBytes: 1 << 20 };
const labels = { provider: 'x', operation: 'chat', requestModel: 'm', serverAddress: '127.0.0.1' };

function meterFor(path: string, provider?: string): RequestMeter {
  const api = detectApi(path, provider)!;
  return new RequestMeter(t.instruments, api.newAdapter() as ResponseAdapter, { ...labels }, 0, opts);
}

const data = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
const named = (o: { type: string } & Record<string, unknown>) => `event: ${o.type}\ndata: ${JSON.stringify(o)}\n\n`;

/** A stream's bytes, one read per piece; the summary's finish reasons. */
function streamed(path: string, contentType: string, pieces: string[], opt: { provider?: string; cancelAt?: number } = {}) {
  const m = meterFor(path, opt.provider);
  m.responseStart(200, contentType, undefined);
  let at = 10;
  for (const p of pieces) m.chunk(Buffer.from(p), (at += 5));
  return m.finish(at + 5, opt.cancelAt === undefined ? undefined : 'client_cancelled');
}

function body(path: string, o: unknown, provider?: string) {
  const m = meterFor(path, provider);
  m.responseStart(200, 'application/json', undefined);
  m.chunk(Buffer.from(JSON.stringify(o)), 20);
  return m.finish(30);
}

const chat = (choices: unknown[]) => data({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices });

describe('finish reasons per API', () => {
  it('OpenAI Chat: each choice by its index (n > 1), on the finish chunk or on a last content chunk (vLLM)', () => {
    const s = streamed('/v1/chat/completions', 'text/event-stream', [
      chat([{ index: 0, delta: { content: 'a' }, finish_reason: null }]),
      chat([{ index: 1, delta: { content: 'b' }, finish_reason: null }]),
      chat([{ index: 0, delta: { content: 'c' }, finish_reason: null }]), // the byte path takes this one
      chat([{ index: 1, delta: { content: 'd' }, finish_reason: 'length' }]), // content and reason in one chunk
      chat([{ index: 0, delta: {}, finish_reason: 'stop' }]),
      'data: [DONE]\n\n',
    ]);
    expect(s).toMatchObject({ contentEvents: 4, finishReasons: ['stop', 'length'], outcome: 'ok' });
  });

  it('OpenAI Chat: the last content chunk of a learned prefix still gives its reason (not taken by the byte path)', () => {
    const c = (text: string, finish: string | null) => chat([{ index: 0, delta: { content: text }, logprobs: null, finish_reason: finish }]);
    const s = streamed('/v1/chat/completions', 'text/event-stream', [c('a', null), c('b', null), c('c', null), c('d', 'length'), 'data: [DONE]\n\n']);
    expect(s).toMatchObject({ contentEvents: 4, finishReasons: ['length'] });
  });

  it('a stream cut before its last chunk has none; a reason is cleaned and bounded', () => {
    const cut = streamed('/v1/chat/completions', 'text/event-stream', [chat([{ index: 0, delta: { content: 'a' }, finish_reason: null }])], { cancelAt: 1 });
    expect(cut).toMatchObject({ outcome: 'cancelled', finishReasons: undefined });
    const f = new FinishReasons();
    f.set(0, 'tool calls/with "quotes"');
    f.set(3, 'x'.repeat(100));
    f.set(16, 'past the cap');
    f.set(-1, 'stop'); // not an index: the first choice
    f.set(1, null);
    f.set(2, 7);
    expect(f.list()).toEqual(['stop', null, null, 'x'.repeat(64)]); // choices 1 and 2 said none: null, in their places
    expect(new FinishReasons().list()).toBeUndefined();
  });

  it('n > 1 cut before every choice finished: the reasons read keep their places', () => {
    const s = streamed(
      '/v1/chat/completions',
      'text/event-stream',
      [chat([{ index: 0, delta: { content: 'a' }, finish_reason: null }]), chat([{ index: 1, delta: { content: 'b' }, finish_reason: 'length' }]), chat([{ index: 0, delta: { content: 'c' }, finish_reason: null }])],
      { cancelAt: 1 },
    );
    expect(s).toMatchObject({ outcome: 'cancelled', finishReasons: [null, 'length'] });
  });

  it('OpenAI Chat and legacy Completions: non-streamed bodies', () => {
    expect(body('/v1/chat/completions', { model: 'm', choices: [{ index: 0, message: { content: 'hi' }, finish_reason: 'content_filter' }] })?.finishReasons).toEqual(['content_filter']);
    expect(body('/v1/completions', { model: 'm', choices: [{ index: 0, text: 'a', finish_reason: 'length' }, { index: 1, text: 'b', finish_reason: 'stop' }] })?.finishReasons).toEqual(['length', 'stop']);
  });

  it('llama.cpp native /completion: stop_type, or the older stopped_* flags', () => {
    const p = (o: Record<string, unknown>) => data({ index: 0, content: 'x', tokens: [], id_slot: 0, ...o });
    expect(streamed('/completion', 'text/event-stream', [p({ stop: false }), p({ stop: true, content: '', stop_type: 'limit', tokens_predicted: 2 })])?.finishReasons).toEqual(['limit']);
    expect(streamed('/completion', 'text/event-stream', [p({ stop: false }), p({ stop: true, content: '', stopped_eos: true, stopped_word: false, stopped_limit: false })])?.finishReasons).toEqual(['eos']);
    expect(streamed('/completion', 'text/event-stream', [p({ stop: false }), p({ stop: true, content: '', stop_type: 'none' })])?.finishReasons).toBeUndefined();
  });

  it('Anthropic: message_delta.delta.stop_reason, and a non-streamed message', () => {
    const s = streamed('/v1/messages', 'text/event-stream', [
      named({ type: 'message_start', message: { model: 'claude', usage: { input_tokens: 3, output_tokens: 1 } } }),
      named({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hi' } }),
      named({ type: 'message_delta', delta: { stop_reason: 'max_tokens', stop_sequence: null }, usage: { output_tokens: 5 } }),
      named({ type: 'message_stop' }),
    ]);
    expect(s?.finishReasons).toEqual(['max_tokens']);
    expect(body('/v1/messages', { type: 'message', model: 'claude', stop_reason: 'refusal', usage: { input_tokens: 1, output_tokens: 2 } })?.finishReasons).toEqual(['refusal']);
  });

  it('Responses: incomplete_details.reason of an incomplete response, else its status', () => {
    const created = named({ type: 'response.created', response: { status: 'in_progress', model: 'gpt' } });
    const delta = named({ type: 'response.output_text.delta', delta: 'Hi' });
    const incomplete = streamed('/v1/responses', 'text/event-stream', [
      created,
      delta,
      named({ type: 'response.incomplete', response: { status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' }, usage: { input_tokens: 1, output_tokens: 9 } } }),
    ]);
    expect(incomplete?.finishReasons).toEqual(['max_output_tokens']);
    const started = streamed('/v1/responses', 'text/event-stream', [created, delta], { cancelAt: 1 });
    expect(started?.finishReasons).toBeUndefined(); // `in_progress` is no reason
    expect(body('/v1/responses', { status: 'completed', incomplete_details: null, model: 'gpt', usage: { input_tokens: 1, output_tokens: 2 } })?.finishReasons).toEqual(['completed']);
  });

  it('Gemini: each candidate finishReason by index, streamed and whole', () => {
    const s = streamed('/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse', 'text/event-stream', [
      data({ candidates: [{ content: { parts: [{ text: 'Hi' }], role: 'model' }, index: 0 }] }),
      data({ candidates: [{ content: { parts: [{ text: '!' }], role: 'model' }, finishReason: 'MAX_TOKENS', index: 0 }], usageMetadata: { candidatesTokenCount: 3 } }),
    ]);
    expect(s?.finishReasons).toEqual(['MAX_TOKENS']);
    const whole = body('/v1beta/models/gemini-2.5-flash:generateContent', {
      candidates: [
        { content: { parts: [{ text: 'a' }] }, finishReason: 'STOP', index: 0 },
        { content: { parts: [{ text: 'b' }] }, finishReason: 'SAFETY', index: 1 },
      ],
    });
    expect(whole?.finishReasons).toEqual(['STOP', 'SAFETY']);
  });

  it('Gemini Interactions: the interaction status once it no longer runs', () => {
    const s = streamed('/v1beta/interactions', 'text/event-stream', [
      named({ type: 'interaction.start', event_type: 'interaction.start', interaction: { id: 'i', model: 'gemini', status: 'in_progress' } } as never),
      named({ type: 'step.delta', event_type: 'step.delta', index: 0, delta: { type: 'text', text: 'Hi' } } as never),
      named({ type: 'interaction.completed', event_type: 'interaction.completed', interaction: { id: 'i', model: 'gemini', status: 'incomplete', usage: { total_output_tokens: 2 } } } as never),
    ]);
    expect(s?.finishReasons).toEqual(['incomplete']);
    // Queued or running is no reason (a background interaction, a stream cut before it ended); a failure is an error type.
    const queued = body('/v1beta/interactions', { id: 'i', model: 'gemini', status: 'queued' });
    expect(queued?.finishReasons).toBeUndefined();
    const failed = body('/v1beta/interactions', { id: 'i', model: 'gemini', status: 'failed' });
    expect(failed).toMatchObject({ finishReasons: undefined, errorType: 'interaction_failed' });
  });

  it('Ollama: done_reason on the last line', () => {
    const s = streamed('/api/chat', 'application/x-ndjson', [
      `${JSON.stringify({ model: 'llama', message: { role: 'assistant', content: 'Hi' }, done: false })}\n`,
      `${JSON.stringify({ model: 'llama', message: { role: 'assistant', content: '' }, done: true, done_reason: 'length', eval_count: 2 })}\n`,
    ]);
    expect(s?.finishReasons).toEqual(['length']);
  });

  it('Bedrock: Converse messageStop (streamed, and a whole answer); other model families in invoke chunks', () => {
    const b = new BedrockAdapter();
    b.onEvent({ type: 'messageStop', data: JSON.stringify({ stopReason: 'guardrail_intervened' }), id: undefined });
    expect(b.finishReasons.list()).toEqual(['guardrail_intervened']);
    const whole = new BedrockAdapter();
    whole.onBody(JSON.stringify({ output: { message: { content: [{ text: 'hi' }] } }, stopReason: 'max_tokens', usage: { inputTokens: 2, outputTokens: 6 } }));
    expect(whole.finishReasons.list()).toEqual(['max_tokens']);
    const invoke = (inner: unknown) => {
      const a = new BedrockAdapter();
      a.onEvent({ type: 'chunk', data: JSON.stringify({ bytes: Buffer.from(JSON.stringify(inner)).toString('base64') }), id: undefined });
      return a.finishReasons.list();
    };
    expect(invoke({ generation: 'x', stop_reason: 'length' })).toEqual(['length']); // Llama
    expect(invoke({ outputText: 'x', index: 0, completionReason: 'FINISH' })).toEqual(['FINISH']); // Titan
    expect(invoke({ outputs: [{ text: 'x', stop_reason: 'stop' }] })).toEqual(['stop']); // Mistral
    expect(invoke({ messageStop: { stopReason: 'end_turn' } })).toEqual(['end_turn']); // Nova
    expect(invoke({ choices: [{ index: 0, delta: { content: 'x' }, finish_reason: 'stop' }] })).toEqual(['stop']); // OpenAI-shaped
    expect(invoke({ type: 'message_delta', delta: { stop_reason: 'tool_use' }, usage: { output_tokens: 3 } })).toEqual(['tool_use']); // Anthropic
    expect(invoke({ generation: 'x', stop_reason: null })).toBeUndefined();
    // Whole InvokeModel answers of the other families, as the streamed ones.
    const invokeBody = (o: unknown) => {
      const a = new BedrockAdapter();
      a.onBody(JSON.stringify(o));
      return a.finishReasons.list();
    };
    expect(invokeBody({ inputTextTokenCount: 3, results: [{ tokenCount: 5, outputText: 'x', completionReason: 'LENGTH' }] })).toEqual(['LENGTH']); // Titan
    expect(invokeBody({ outputs: [{ text: 'x', stop_reason: 'length' }] })).toEqual(['length']); // Mistral
    expect(invokeBody({ text: 'x', finish_reason: 'COMPLETE', generation_id: 'g' })).toEqual(['COMPLETE']); // Cohere Command R
    expect(invokeBody({ choices: [{ text: 'x', stop_reason: 'stop' }] })).toEqual(['stop']); // DeepSeek
    expect(invokeBody({ choices: [{ index: 0, message: { content: 'x' }, finish_reason: 'length' }] })).toEqual(['length']); // gpt-oss
    expect(invokeBody({ generation: 'x', stop_reason: 'stop', generation_token_count: 2 })).toEqual(['stop']); // Llama
    expect(invokeBody({ type: 'message', model: 'claude', stop_reason: 'end_turn', usage: { input_tokens: 1, output_tokens: 1 } })).toEqual(['end_turn']);
  });

  it('Cohere v2: message-end finish_reason, also one that is an in-band error', () => {
    const end = (finish_reason: string) => named({ type: 'message-end', delta: { finish_reason, usage: { tokens: { input_tokens: 1, output_tokens: 2 } } } });
    const delta = named({ type: 'content-delta', index: 0, delta: { message: { content: { text: 'Hi' } } } });
    expect(streamed('/v2/chat', 'text/event-stream', [delta, end('MAX_TOKENS')])).toMatchObject({ finishReasons: ['MAX_TOKENS'], outcome: 'ok' });
    expect(streamed('/v2/chat', 'text/event-stream', [delta, end('TIMEOUT')])).toMatchObject({ finishReasons: ['TIMEOUT'], errorType: 'timeout' });
  });

  it('TGI /generate_stream: details.finish_reason; SGLang /generate: each sequence finish_reason.type', () => {
    const tok = (i: number, details: unknown) => data({ index: i, token: { id: i, text: 'w', logprob: 0, special: false }, generated_text: null, details });
    expect(streamed('/generate_stream', 'text/event-stream', [tok(1, null), tok(2, { finish_reason: 'eos_token', generated_tokens: 2, seed: null })])?.finishReasons).toEqual(['eos_token']);
    const sg = (index: number, n: number, finish: unknown) => data({ index, text: 'x'.repeat(n), meta_info: { id: `r${index}`, finish_reason: finish, prompt_tokens: 5, completion_tokens: n } });
    const s = streamed('/generate', 'text/event-stream', [sg(0, 1, null), sg(1, 1, null), sg(1, 2, { type: 'length', length: 2 }), sg(0, 2, { type: 'stop', matched: 2 }), 'data: [DONE]\n\n'], { provider: 'sglang-generate' });
    expect(s?.finishReasons).toEqual(['stop', 'length']);
  });

  it('APIs that say nothing (the generic fallback) have none', () => {
    expect(streamed('/v1/unknown', 'text/event-stream', [data({ anything: 1 })])?.finishReasons).toBeUndefined();
  });
});
