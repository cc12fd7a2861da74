import { describe, expect, it } from 'vitest';
import { AnthropicAdapter } from '../../src/providers/anthropic.js';
import { BedrockAdapter } from '../../src/providers/bedrock.js';
import { detectApi } from '../../src/providers/detect.js';
import { GeminiAdapter } from '../../src/providers/gemini.js';
import { GeminiInteractionsAdapter } from '../../src/providers/gemini-interactions.js';
import { OpenAIChatAdapter } from '../../src/providers/openai-chat.js';
import { OpenAIResponsesAdapter } from '../../src/providers/openai-responses.js';
import { TritonGenerateAdapter } from '../../src/providers/triton.js';
import { EventKind, type ResponseAdapter, type Usage } from '../../src/providers/types.js';
import { EventStreamDecoder, encodeEventStreamFrame } from '../../src/sse/eventstream.js';
import { SseParser, type SseEvent } from '../../src/sse/parser.js';

/**
 * Stream shapes the fixtures do not cover, each modelled on the source named
 * beside it (provider docs, SDK types or a public capture). Each runs through
 * the real framing decoder (split at every byte, too) and the adapter; the
 * expected counts are read off the events by hand.
 */
interface Variant {
  name: string;
  adapter: () => ResponseAdapter;
  bytes: Buffer;
  framing: 'sse' | 'eventstream';
  /** The kind of every decoded event, in order: C content, N none, E error. */
  kinds: string;
  usage?: Usage;
  model?: string;
  error?: string;
  /** Whether reasoning was streamed (adapters that track it): decides whether TPOT leaves the reasoning tokens out. */
  reasoningStreamed?: boolean;
  /** The finish reasons by choice. */
  finish?: (string | null)[];
  /** Whether events hold several tokens each (no event count without usage). */
  multiToken?: boolean;
  /** Whether TPOT cannot be had (the content events' span is not where the counted output was generated). */
  tpotUnknown?: boolean;
}

const sse = (...blocks: string[]) => Buffer.from(blocks.map((b) => `${b}\n\n`).join(''));
const data = (o: unknown) => `data: ${JSON.stringify(o)}`;
const chat = (delta: unknown, extra: Record<string, unknown> = {}) =>
  data({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm-1', choices: [{ index: 0, delta, finish_reason: null }], ...extra });
const anthropic = (o: { type: string } & Record<string, unknown>) => `event: ${o.type}\ndata: ${JSON.stringify(o)}`;
/** A Responses event: its SSE name is its `type`, as Anthropic's. */
const responses = anthropic;
/** An Interactions API event: its SSE name is its `event_type`. */
const interaction = (o: { event_type: string } & Record<string, unknown>) => `event: ${o.event_type}\ndata: ${JSON.stringify(o)}`;
const gemini = (parts: unknown[], extra: Record<string, unknown> = {}) =>
  `data: ${JSON.stringify({ candidates: [{ content: { role: 'model', parts } }], modelVersion: 'gemini-3.1-pro-preview', ...extra })}\r\n`;
/** An InvokeModelWithResponseStream `chunk` frame wrapping the model's own event. */
const invokeChunk = (inner: unknown) =>
  encodeEventStreamFrame(
    { ':event-type': 'chunk', ':content-type': 'application/json', ':message-type': 'event' },
    JSON.stringify({ bytes: Buffer.from(JSON.stringify(inner)).toString('base64') }),
  );

const VARIANTS: Variant[] = [
  {
    // openai-python types/chat/chat_completion_chunk.py, ChoiceDeltaFunctionCall (the deprecated `functions` API).
    name: 'OpenAI chat: legacy function_call arguments are content; the name-only first chunk is not',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(
      chat({ role: 'assistant', content: null, function_call: { name: 'get_weather', arguments: '' } }),
      chat({ function_call: { arguments: '{"loc' } }),
      chat({ function_call: { arguments: 'ation":"Paris"}' } }),
      data({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm-1', choices: [{ index: 0, delta: {}, finish_reason: 'function_call' }] }),
      'data: [DONE]',
    ),
    kinds: 'NCCNN',
    model: 'm-1',
  },
  {
    // Same file, ChoiceDeltaToolCallCustom: a custom tool's free-form input streams in `custom.input`.
    name: 'OpenAI chat: custom-tool input is content',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(
      chat({ role: 'assistant', tool_calls: [{ index: 0, id: 'call_1', type: 'custom', custom: { name: 'apply_patch', input: '' } }] }),
      chat({ tool_calls: [{ index: 0, custom: { input: '*** Begin Patch' } }] }),
      chat({ tool_calls: [{ index: 0, custom: { input: '\n*** End Patch' } }] }),
    ),
    kinds: 'NCC',
  },
  {
    // OpenAI OpenAPI spec, ChatCompletionStreamResponseDeltaAudio (gpt-4o-audio-preview with stream: true).
    name: 'OpenAI chat: audio transcript and audio data are content',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(chat({ role: 'assistant', audio: { id: 'audio_1', transcript: '' } }), chat({ audio: { transcript: 'Yes' } }), chat({ audio: { data: 'UklGRg==' } })),
    kinds: 'NCC',
  },
  {
    // vercel/ai packages/mistral/src/__fixtures__/mistral-reasoning.chunks.txt (magistral): content as a list of parts.
    name: 'Mistral: content as a list of thinking and text parts is content',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(
      chat({ role: 'assistant', content: '' }),
      chat({ content: [{ type: 'thinking', thinking: [{ type: 'text', text: 'The user is asking' }] }] }),
      chat({ content: [{ type: 'text', text: '2 + 2 = 4' }] }),
      chat({ content: [{ type: 'text', text: '' }] }),
      data({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm-1', choices: [{ index: 0, delta: { content: '' }, finish_reason: 'stop' }], usage: { prompt_tokens: 10, completion_tokens: 46, total_tokens: 56 } }),
    ),
    kinds: 'NCCNN',
    usage: { inputTokens: 10, outputTokens: 46 },
  },
  {
    // vercel/ai packages/groq/src/groq-chat-language-model.test.ts (a 2024 capture): usage only in `x_groq`.
    name: 'Groq: usage in x_groq.usage when there is no usage',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(
      chat({ role: 'assistant', content: '' }, { x_groq: { id: 'req_1' } }),
      chat({ content: 'Hi' }),
      data({
        id: 'chatcmpl-1',
        object: 'chat.completion.chunk',
        created: 1,
        model: 'm-1',
        choices: [{ index: 0, delta: {}, finish_reason: 'stop' }],
        x_groq: { id: 'req_1', usage: { queue_time: 0.061, prompt_tokens: 18, prompt_time: 0.002, completion_tokens: 439, completion_time: 0.798, total_tokens: 457, total_time: 0.8 } },
      }),
      'data: [DONE]',
    ),
    kinds: 'NCNN',
    usage: { inputTokens: 18, outputTokens: 439 },
  },
  {
    // OpenRouter's docs (errors during streaming): an HTTP 200 stream ends with an `error` whose `code` is
    // the HTTP-like status and whose `metadata.error_type` says what happened, beside `finish_reason: "error"`.
    name: 'OpenRouter: a mid-stream error is typed by its metadata.error_type, not its numeric code (which an upstream 502 has too)',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(
      ': OPENROUTER PROCESSING',
      chat({ role: 'assistant', content: 'Hi' }),
      data({ id: 'gen-1', object: 'chat.completion.chunk', created: 1, model: 'openai/gpt-4o', provider: 'OpenAI', error: { code: 502, message: 'Provider disconnected unexpectedly', metadata: { error_type: 'provider_unavailable' } }, choices: [{ index: 0, delta: { content: '' }, finish_reason: 'error' }] }),
    ),
    kinds: 'CE',
    error: 'provider_unavailable',
  },
  {
    // perplexityai/perplexity-node src/resources/shared.ts UsageInfo: reasoning_tokens at the top level of usage;
    // OpenRouter's usage (a chunk quoted in Effect-TS/effect PR #6117): prompt_tokens_details.cache_write_tokens.
    name: 'Perplexity reasoning tokens at the top level of usage; OpenRouter cache writes in prompt_tokens_details',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(
      chat({ role: 'assistant', content: '<think>Look' }),
      data({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'sonar-reasoning-pro', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], usage: { prompt_tokens: 12, completion_tokens: 300, total_tokens: 312, reasoning_tokens: 180, citation_tokens: 40, num_search_queries: 1 } }),
      data({ id: 'gen-2', object: 'chat.completion.chunk', created: 1, model: 'anthropic/claude-sonnet-4', choices: [], usage: { prompt_tokens: 2000, completion_tokens: 300, total_tokens: 2300, cost: 0.01, prompt_tokens_details: { cached_tokens: 0, cache_write_tokens: 1800 } } }),
    ),
    kinds: 'CNN',
    // The second chunk's counts replace the first's where it has them: one stream's shapes, side by side.
    usage: { inputTokens: 2000, outputTokens: 300, reasoningTokens: 180, cachedInputTokens: 0, cacheCreationInputTokens: 1800 },
  },
  {
    // mistralai/client-python models/completionresponsestreamchoice.py: finish_reason "stop" | "length" | "error" | "tool_calls";
    // DeepSeek's API reference: "insufficient_system_resource" (cut for lack of inference capacity).
    name: 'Mistral\'s `error` and DeepSeek\'s `insufficient_system_resource` finish reasons are in-band errors; a relayed Claude stream holds several tokens an event',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(
      data({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'claude-sonnet-4-5-20250929', choices: [{ index: 0, delta: { content: 'The capital of' }, finish_reason: null }] }),
      data({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'claude-sonnet-4-5-20250929', choices: [{ index: 0, delta: { content: '' }, finish_reason: 'error' }], usage: { prompt_tokens: 5, completion_tokens: 4, total_tokens: 9 } }),
      data({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'claude-sonnet-4-5-20250929', choices: [{ index: 0, delta: { content: '' }, finish_reason: 'insufficient_system_resource' }] }),
    ),
    kinds: 'CNN',
    usage: { inputTokens: 5, outputTokens: 4 },
    error: 'error',
    multiToken: true,
    finish: ['insufficient_system_resource'],
  },
  {
    // ggml-org/llama.cpp server before PR #16109 (2025-09): errors went out as an `error:` field, no data.
    name: 'llama.cpp: an `error:` field mid-stream is an in-band error',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(chat({ content: 'Hi' }), 'error: {"code":400,"message":"the request exceeds the available context size","type":"invalid_request_error"}'),
    kinds: 'CE',
    error: 'invalid_request_error',
  },
  {
    // huggingface/text-generation-inference router/src/server.rs, `impl From<InferError> for Event`.
    name: 'TGI: a message-only error takes its type from error_type',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: Buffer.from(`data:${JSON.stringify({ error: 'Request failed during generation: Server error: out of memory', error_type: 'generation' })}\n\n`),
    kinds: 'E',
    error: 'generation',
  },
  {
    name: 'OpenAI-compatible: `event: error` with the error object itself as data',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(chat({ content: 'Hi' }), 'event: error\ndata: {"code":500,"message":"secret","type":"server_error"}'),
    kinds: 'CE',
    error: 'server_error',
  },
  {
    name: 'OpenAI-compatible: `event: error` with a message-only error and its error_type',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse('event: error\ndata: {"error":"Input validation error","error_type":"validation"}'),
    kinds: 'E',
    error: 'validation',
  },
  {
    // openai-python types/responses: ResponseShellCallCommandDeltaEvent, ResponseApplyPatchCallOperationDiffDeltaEvent, ResponseAudioDeltaEvent.
    name: 'Responses: shell commands, patch diffs and audio are content; shell output is not',
    adapter: () => new OpenAIResponsesAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'response.shell_call_command.delta', output_index: 0, command_index: 0, delta: 'ls -la' }),
      anthropic({ type: 'response.shell_call_output_content.delta', output_index: 0, command_index: 0, delta: { stdout: 'x' } }),
      anthropic({ type: 'response.apply_patch_call_operation_diff.delta', item_id: 'ap_1', output_index: 1, delta: '@@ -1 +1 @@' }),
      anthropic({ type: 'response.audio.delta', delta: 'UklGRg==' }),
    ),
    kinds: 'CNCC',
  },
  {
    // BerriAI/litellm PR #40243: mid-stream /v1/responses errors sent chat-style, with no event name and no type.
    name: 'Responses: a chat-style {"error":{…}} payload is an in-band error',
    adapter: () => new OpenAIResponsesAdapter(),
    framing: 'sse',
    bytes: sse(anthropic({ type: 'response.output_text.delta', delta: 'Hi' }), data({ error: { message: 'secret', type: 'None', code: '500' } })),
    kinds: 'CE',
    error: '500',
  },
  {
    // WHATWG HTML §9.2.6: an event named `message` is one with no name (the default). A server that
    // names every event so is read by its payloads' `type`, as one that sends no `event:` line.
    name: 'Anthropic with every event named `message`: read as without names',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      ...[
        { type: 'message_start', message: { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], usage: { input_tokens: 12, output_tokens: 1 } } },
        { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } },
        { type: 'ping' },
        { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Today in Paris' } },
        { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: ' it is 22°C.' } },
        { type: 'content_block_stop', index: 0 },
        { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 9 } },
        { type: 'message_stop' },
      ].map((o) => `event: message\n${data(o)}`),
    ),
    kinds: 'NNNCCNNN',
    model: 'claude-sonnet-4-5',
    usage: { inputTokens: 12, outputTokens: 9 },
    finish: ['end_turn'],
  },
  {
    // docs.claude.com extended thinking, "Thinking redaction": a redacted_thinking block arrives whole in its
    // content_block_start (no deltas), with the encrypted thinking in `data`.
    name: 'Anthropic: a redacted_thinking block is content (it has no deltas); other block starts are not',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'message_start', message: { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-3-7-sonnet-20250219', content: [], usage: { input_tokens: 20, output_tokens: 1 } } }),
      anthropic({ type: 'content_block_start', index: 0, content_block: { type: 'redacted_thinking', data: 'EmwKAhgBEgy3va3pzix/LafPsn4a' } }),
      anthropic({ type: 'content_block_stop', index: 0 }),
      anthropic({ type: 'content_block_start', index: 1, content_block: { type: 'text', text: '' } }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: 'The answer' } }),
      anthropic({ type: 'content_block_start', index: 2, content_block: { type: 'redacted_thinking', data: '' } }),
    ),
    kinds: 'NCNNCN',
    model: 'claude-3-7-sonnet-20250219',
  },
  {
    // platform.claude.com/docs/en/build-with-claude/compaction: the summary streams as compaction_delta; the
    // top-level output_tokens leaves it out, usage.iterations lists every pass.
    name: 'Anthropic compaction: the summary is content, output is the sum of the iterations',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'message_start', message: { model: 'claude-opus-4-6', usage: { input_tokens: 10, output_tokens: 1 } } }),
      anthropic({ type: 'content_block_start', index: 0, content_block: { type: 'compaction', content: null } }),
      anthropic({ type: 'content_block_delta', index: 0, delta: { type: 'compaction_delta', content: 'Summary of the conversation', encrypted_content: 'opaque' } }),
      anthropic({ type: 'content_block_stop', index: 0 }),
      anthropic({ type: 'content_block_start', index: 1, content_block: { type: 'text', text: '' } }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: 'The reply' } }),
      anthropic({ type: 'content_block_stop', index: 1 }),
      anthropic({
        type: 'message_delta',
        delta: { stop_reason: 'end_turn' },
        usage: { output_tokens: 40, iterations: [{ type: 'compaction', input_tokens: 150000, output_tokens: 3500 }, { type: 'message', input_tokens: 4000, output_tokens: 40 }] },
      }),
      anthropic({ type: 'message_stop' }),
    ),
    kinds: 'NNCNNCNNN',
    usage: { inputTokens: 10, outputTokens: 3540 },
    model: 'claude-opus-4-6',
  },
  {
    // platform.claude.com/docs/en/build-with-claude/refusals-and-fallback (server-side fallback, beta):
    // message_start names the requested model; a `fallback` block hands over to the one that answers.
    name: 'Anthropic server-side fallback: the model that answers, and both attempts counted',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'message_start', message: { model: 'claude-fable-5', usage: { input_tokens: 12, output_tokens: 1 } } }),
      anthropic({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }),
      anthropic({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Sure' } }),
      anthropic({ type: 'content_block_stop', index: 0 }),
      anthropic({ type: 'content_block_start', index: 1, content_block: { type: 'fallback', from: { model: 'claude-fable-5' }, to: { model: 'claude-opus-4-8' } } }),
      anthropic({ type: 'content_block_stop', index: 1 }),
      anthropic({ type: 'content_block_delta', index: 2, delta: { type: 'text_delta', text: 'Here is' } }),
      anthropic({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 20, iterations: [{ type: 'message', output_tokens: 5 }, { type: 'fallback_message', output_tokens: 20 }] } }),
    ),
    kinds: 'NNCNNNCN',
    usage: { inputTokens: 12, outputTokens: 25 },
    model: 'claude-opus-4-8',
  },
  {
    // vercel/ai packages/google/src/__fixtures__/google-stream-tool-call-arguments.chunks.txt (Vertex streamed
    // function-call arguments): a name or a value is content; an empty value and the `{}` end marker are not.
    name: 'Vertex: streamed function-call arguments',
    adapter: () => new GeminiAdapter(),
    framing: 'sse',
    bytes: Buffer.from(
      [
        gemini([{ functionCall: { name: 'getWeather', willContinue: true }, thoughtSignature: 'c2ln' }]),
        gemini([{ functionCall: { partialArgs: [{ jsonPath: '$.location', stringValue: 'Boston', willContinue: true }], willContinue: true } }]),
        gemini([{ functionCall: { partialArgs: [{ jsonPath: '$.location', stringValue: '' }], willContinue: true } }]),
        gemini([{ functionCall: {} }]),
        gemini([{ functionCall: { partialArgs: [{ jsonPath: '$.days', numberValue: 3 }], willContinue: true } }]),
        `data: ${JSON.stringify({ candidates: [{ content: { role: 'model', parts: [{ functionCall: {} }] }, finishReason: 'STOP' }], usageMetadata: { promptTokenCount: 26, candidatesTokenCount: 23, thoughtsTokenCount: 132 } })}\r\n`,
        '',
      ].join('\r\n'),
    ),
    kinds: 'CCNNCN',
    usage: { inputTokens: 26, outputTokens: 23 + 132, reasoningTokens: 132 },
    model: 'gemini-3.1-pro-preview',
  },
  {
    // vercel/ai packages/google/src/__fixtures__/issue-10660-image-thought-signature.chunks.txt (image output);
    // Vertex code execution: `executableCode` is the model's, `codeExecutionResult` the tool's.
    name: 'Gemini: generated images and code are content; a code result is not',
    adapter: () => new GeminiAdapter(),
    framing: 'sse',
    bytes: Buffer.from(
      [
        gemini([{ inlineData: { mimeType: 'image/png', data: 'iVBORw0KGgo=' }, thoughtSignature: 'c2ln' }]),
        gemini([{ executableCode: { language: 'PYTHON', code: 'print(2 + 2)' } }]),
        gemini([{ codeExecutionResult: { outcome: 'OUTCOME_OK', output: '4\n' } }]),
        gemini([{ text: '', thoughtSignature: 'c2ln' }]),
        '',
      ].join('\r\n'),
    ),
    kinds: 'CCNN',
    model: 'gemini-3.1-pro-preview',
  },
  {
    // vercel/ai packages/google/src/__fixtures__/issue-19758-prompt-block.chunks.txt: HTTP 200, no candidates.
    name: 'Gemini: a blocked prompt is an in-band error typed by its reason',
    adapter: () => new GeminiAdapter(),
    framing: 'sse',
    bytes: Buffer.from(`data: ${JSON.stringify({ promptFeedback: { blockReason: 'PROHIBITED_CONTENT' }, usageMetadata: { promptTokenCount: 9, totalTokenCount: 9 }, modelVersion: 'gemini-2.5-flash' })}\r\n\r\n`),
    kinds: 'E',
    error: 'PROHIBITED_CONTENT',
    usage: { inputTokens: 9 },
  },
  {
    // @google/genai's InteractionSSEEvent types (StepDelta, StepStart, StepDeltaMetadata.total_usage):
    // generated deltas and steps are content (a function call by its name too: one without
    // parameters has `arguments: {}` and nothing after it); signatures, annotations and tool results are not.
    name: 'Gemini Interactions: step deltas and steps, running usage',
    adapter: () => new GeminiInteractionsAdapter(),
    framing: 'sse',
    bytes: sse(
      interaction({ event_type: 'interaction.created', interaction: { id: 'v1_1', status: 'in_progress', model: 'gemini-3-flash-preview' } }),
      interaction({ event_type: 'step.start', index: 0, step: { type: 'function_call', id: 'f1', name: 'get_weather', arguments: { city: 'Paris' } } }),
      interaction({ event_type: 'step.start', index: 1, step: { type: 'function_call', id: 'f2', name: 'get_time', arguments: {} } }),
      interaction({ event_type: 'step.delta', index: 1, delta: { type: 'arguments_delta', arguments: '{"tz":' } }),
      interaction({ event_type: 'step.delta', index: 2, delta: { type: 'code_execution_result', result: '4' } }),
      interaction({ event_type: 'step.delta', index: 2, delta: { type: 'google_search_call', arguments: { queries: ['weather Paris'] } } }),
      interaction({ event_type: 'step.delta', index: 2, delta: { type: 'google_search_result', result: [{ url: 'https://x' }] } }),
      interaction({ event_type: 'step.delta', index: 3, delta: { type: 'image', mime_type: 'image/png', data: 'iVBORw0KGgo=' } }),
      interaction({ event_type: 'step.delta', index: 3, delta: { type: 'thought_signature', signature: 'c2ln' } }),
      interaction({ event_type: 'step.delta', index: 3, delta: { type: 'text_annotation_delta', annotations: [] } }),
      interaction({ event_type: 'step.delta', index: 4, delta: { type: 'text', text: 'Sunny' }, metadata: { total_usage: { total_input_tokens: 7, total_output_tokens: 30 } } }),
      interaction({ event_type: 'step.stop', index: 4 }),
    ),
    kinds: 'NCCCNCNCNNCN',
    usage: { inputTokens: 7, outputTokens: 30 },
    model: 'gemini-3-flash-preview',
  },
  {
    // The same API with steps disabled (legacy event names), then an error event (ErrorEvent: error.code).
    name: 'Gemini Interactions: legacy content.delta events and an error event',
    adapter: () => new GeminiInteractionsAdapter(),
    framing: 'sse',
    bytes: sse(
      interaction({ event_type: 'interaction.start', interaction: { id: 'v1_2', status: 'in_progress', model: 'gemini-2.5-flash' } }),
      interaction({ event_type: 'content.delta', index: 0, delta: { type: 'text', text: 'Hi' } }),
      interaction({ event_type: 'error', error: { code: 'https://ai.google.dev/errors/RESOURCE_EXHAUSTED', message: 'secret' } }),
    ),
    kinds: 'NCE',
    error: 'RESOURCE_EXHAUSTED',
    model: 'gemini-2.5-flash',
  },
  {
    // StepStart.step: ModelOutputStep.error is a google.rpc Status (numeric code); a status update may end it.
    name: 'Gemini Interactions: a model-output step with an error, by its rpc code name',
    adapter: () => new GeminiInteractionsAdapter(),
    framing: 'sse',
    bytes: sse(interaction({ event_type: 'step.start', index: 0, step: { type: 'model_output', error: { code: 8, message: 'secret' } } })),
    kinds: 'E',
    error: 'RESOURCE_EXHAUSTED',
  },
  {
    name: 'Gemini Interactions: a status update with usage; budget_exceeded ends it as an error; a thought summary image is content',
    adapter: () => new GeminiInteractionsAdapter(),
    framing: 'sse',
    bytes: sse(
      interaction({ event_type: 'step.delta', index: 0, delta: { type: 'thought_summary', content: { type: 'image', mime_type: 'image/png', data: 'iVBORw0KGgo=' } } }),
      interaction({ event_type: 'interaction.status_update', interaction_id: 'v1_4', status: 'incomplete', usage: { total_input_tokens: 4, total_output_tokens: 6 } }),
      interaction({ event_type: 'interaction.status_update', interaction_id: 'v1_4', status: 'budget_exceeded' }),
    ),
    kinds: 'CNE',
    error: 'interaction_budget_exceeded',
    usage: { inputTokens: 4, outputTokens: 6 },
  },
  {
    // total_tokens tells whether the output count already holds the thoughts.
    name: 'Gemini Interactions: thoughts not added twice when total_tokens shows the output holds them',
    adapter: () => new GeminiInteractionsAdapter(),
    framing: 'sse',
    bytes: sse(
      interaction({
        event_type: 'interaction.completed',
        interaction: { id: 'v1_5', status: 'completed', agent: 'deep-research-preview', usage: { total_input_tokens: 10, total_output_tokens: 50, total_thought_tokens: 30, total_tokens: 60 } },
      }),
    ),
    kinds: 'N',
    usage: { inputTokens: 10, outputTokens: 50, reasoningTokens: 30 },
    model: 'deep-research-preview',
  },
  {
    name: 'Gemini Interactions: a failed interaction is an in-band error; usage with thoughts',
    adapter: () => new GeminiInteractionsAdapter(),
    framing: 'sse',
    bytes: sse(
      interaction({ event_type: 'step.delta', index: 0, delta: { type: 'thought_summary', content: { type: 'text', text: 'Hmm' } } }),
      interaction({
        event_type: 'interaction.completed',
        interaction: { id: 'v1_3', status: 'failed', model: 'gemini-3-flash-preview', usage: { total_input_tokens: 3, total_output_tokens: 0, total_thought_tokens: 9 } },
      }),
    ),
    kinds: 'CE',
    error: 'interaction_failed',
    usage: { inputTokens: 3, outputTokens: 9, reasoningTokens: 9 },
  },
  {
    // AWS "Amazon Nova: streaming responses" (InvokeModelWithResponseStream); awsdocs/aws-doc-sdk-examples
    // cohere_command_*_invoke_model_with_response_stream; Cohere Command R's own stream (`text` events).
    name: 'Bedrock invoke: Nova, Cohere Command and Command R, DeepSeek-R1 text is content',
    adapter: () => new BedrockAdapter(),
    framing: 'eventstream',
    bytes: Buffer.concat([
      invokeChunk({ messageStart: { role: 'assistant' } }),
      invokeChunk({ contentBlockDelta: { delta: { text: 'Hello' }, contentBlockIndex: 0 } }),
      invokeChunk({ contentBlockDelta: { delta: { text: '' }, contentBlockIndex: 0 } }),
      invokeChunk({ generations: [{ text: ' there' }] }),
      invokeChunk({ is_finished: false, event_type: 'text-generation', text: 'Hel' }),
      invokeChunk({ choices: [{ text: 'lo', stop_reason: null }] }),
      // Command R repeats its tool plan whole at the end: not new output.
      invokeChunk({ is_finished: false, event_type: 'tool-calls-generation', text: 'I will look it up.', tool_calls: [{ name: 'search', parameters: { q: 'x' } }] }),
      invokeChunk({ is_finished: true, event_type: 'stream-end', finish_reason: 'COMPLETE', 'amazon-bedrock-invocationMetrics': { inputTokenCount: 5, outputTokenCount: 4, invocationLatency: 900, firstByteLatency: 300 } }),
    ]),
    kinds: 'NCNCCCNN',
    usage: { inputTokens: 5, outputTokens: 4 },
  },
  {
    // AWS Bedrock API reference, ReasoningContentBlockDelta: `text`, `signature` or `redactedContent`;
    // Converse's TokenUsage has no reasoning count.
    name: 'Bedrock ConverseStream: reasoning that streamed only its signature, or redacted, before the text: TPOT cannot be had',
    adapter: () => new BedrockAdapter(),
    framing: 'eventstream',
    bytes: Buffer.concat([
      encodeEventStreamFrame({ ':event-type': 'messageStart', ':content-type': 'application/json', ':message-type': 'event' }, '{"role":"assistant"}'),
      encodeEventStreamFrame({ ':event-type': 'contentBlockDelta', ':content-type': 'application/json', ':message-type': 'event' }, '{"contentBlockIndex":0,"delta":{"reasoningContent":{"signature":"c2ln"}}}'),
      encodeEventStreamFrame({ ':event-type': 'contentBlockDelta', ':content-type': 'application/json', ':message-type': 'event' }, '{"contentBlockIndex":1,"delta":{"reasoningContent":{"redactedContent":"RW5j"}}}'),
      encodeEventStreamFrame({ ':event-type': 'contentBlockDelta', ':content-type': 'application/json', ':message-type': 'event' }, '{"contentBlockIndex":2,"delta":{"text":"Hi"}}'),
      encodeEventStreamFrame({ ':event-type': 'contentBlockDelta', ':content-type': 'application/json', ':message-type': 'event' }, '{"contentBlockIndex":2,"delta":{"text":" there"}}'),
      encodeEventStreamFrame({ ':event-type': 'messageStop', ':content-type': 'application/json', ':message-type': 'event' }, '{"stopReason":"end_turn"}'),
      encodeEventStreamFrame({ ':event-type': 'metadata', ':content-type': 'application/json', ':message-type': 'event' }, '{"usage":{"inputTokens":9,"outputTokens":240,"totalTokens":249},"metrics":{"latencyMs":900}}'),
    ]),
    kinds: 'NNNCCNN',
    usage: { inputTokens: 9, outputTokens: 240 },
    tpotUnknown: true,
  },
  {
    name: 'Bedrock ConverseStream: reasoning streamed as text, then its signature: TPOT stands',
    adapter: () => new BedrockAdapter(),
    framing: 'eventstream',
    bytes: Buffer.concat([
      encodeEventStreamFrame({ ':event-type': 'contentBlockDelta', ':content-type': 'application/json', ':message-type': 'event' }, '{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"Let me see"}}}'),
      encodeEventStreamFrame({ ':event-type': 'contentBlockDelta', ':content-type': 'application/json', ':message-type': 'event' }, '{"contentBlockIndex":0,"delta":{"reasoningContent":{"signature":"c2ln"}}}'),
      encodeEventStreamFrame({ ':event-type': 'contentBlockDelta', ':content-type': 'application/json', ':message-type': 'event' }, '{"contentBlockIndex":1,"delta":{"text":"Yes"}}'),
      encodeEventStreamFrame({ ':event-type': 'metadata', ':content-type': 'application/json', ':message-type': 'event' }, '{"usage":{"inputTokens":9,"outputTokens":40,"totalTokens":49},"metrics":{"latencyMs":500}}'),
    ]),
    kinds: 'CNCN',
    usage: { inputTokens: 9, outputTokens: 40 },
    tpotUnknown: false,
  },
  {
    // Server tools with interleaved thinking, display omitted (review 141): hidden thinking before
    // the first text and again between tool uses. Counted or not, the count cannot be split
    // between the span and what came before it.
    name: 'Anthropic hidden thinking before the first content and again after it: TPOT cannot be had, with or without a thinking count',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'content_block_start', index: 0, content_block: { type: 'thinking', thinking: '', signature: '' } }),
      anthropic({ type: 'content_block_delta', index: 0, delta: { type: 'signature_delta', signature: 'c2ln' } }),
      anthropic({ type: 'content_block_start', index: 1, content_block: { type: 'server_tool_use', id: 's', name: 'web_search', input: {} } }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'input_json_delta', partial_json: '{"query":"x"}' } }),
      anthropic({ type: 'content_block_start', index: 2, content_block: { type: 'thinking', thinking: '', signature: '' } }),
      anthropic({ type: 'content_block_delta', index: 3, delta: { type: 'text_delta', text: 'Sunny.' } }),
      anthropic({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 1000, output_tokens_details: { thinking_tokens: 900 } } }),
    ),
    kinds: 'NNNCNCN',
    usage: { outputTokens: 1000, reasoningTokens: 900 },
    reasoningStreamed: true,
    tpotUnknown: true,
  },
  {
    name: 'Responses: a hidden reasoning item before the first content is left out when counted; with another one after it, or with no count, TPOT cannot be had',
    adapter: () => new OpenAIResponsesAdapter(),
    framing: 'sse',
    bytes: sse(
      responses({ type: 'response.output_item.added', output_index: 0, item: { id: 'rs_1', type: 'reasoning', summary: [] } }),
      responses({ type: 'response.output_item.added', output_index: 1, item: { id: 'ws_1', type: 'web_search_call', status: 'in_progress' } }),
      responses({ type: 'response.output_text.delta', item_id: 'msg_1', output_index: 2, content_index: 0, delta: 'Sunny' }),
      responses({ type: 'response.completed', response: { id: 'r', model: 'o4-mini', status: 'completed', usage: { output_tokens: 300, output_tokens_details: { reasoning_tokens: 290 } } } }),
    ),
    kinds: 'NNCN',
    reasoningStreamed: false,
    tpotUnknown: false,
  },
  {
    name: 'Responses: hidden reasoning before and between the tool calls, counted together: TPOT cannot be had',
    adapter: () => new OpenAIResponsesAdapter(),
    framing: 'sse',
    bytes: sse(
      responses({ type: 'response.output_item.added', output_index: 0, item: { id: 'rs_1', type: 'reasoning', summary: [] } }),
      responses({ type: 'response.function_call_arguments.delta', item_id: 'fc_1', output_index: 1, delta: '{"q":1}' }),
      responses({ type: 'response.output_item.added', output_index: 2, item: { id: 'rs_2', type: 'reasoning', summary: [] } }),
      responses({ type: 'response.output_text.delta', item_id: 'msg_1', output_index: 3, content_index: 0, delta: 'Sunny' }),
      responses({ type: 'response.completed', response: { id: 'r', model: 'o4-mini', status: 'completed', usage: { output_tokens: 300, output_tokens_details: { reasoning_tokens: 290 } } } }),
    ),
    kinds: 'NCNCN',
    reasoningStreamed: true,
    tpotUnknown: true,
  },
  {
    name: 'Responses: a hidden reasoning item before the first content with no count of it (a compatible server): TPOT cannot be had; a streamed summary keeps it',
    adapter: () => new OpenAIResponsesAdapter(),
    framing: 'sse',
    bytes: sse(
      responses({ type: 'response.output_item.added', output_index: 0, item: { id: 'rs_1', type: 'reasoning', summary: [] } }),
      responses({ type: 'response.output_text.delta', item_id: 'msg_1', output_index: 1, content_index: 0, delta: 'Sunny' }),
      responses({ type: 'response.completed', response: { id: 'r', model: 'm', status: 'completed', usage: { output_tokens: 300 } } }),
    ),
    kinds: 'NCN',
    reasoningStreamed: false,
    tpotUnknown: true,
  },
  {
    // o3 / gpt-5 with web search (review 143): a hidden reasoning item, the search, then a second
    // reasoning item whose summary is streamed. The count holds both; only the first lies outside the span.
    name: 'Responses: a hidden reasoning item before the answer beside another whose summary is streamed: TPOT cannot be had',
    adapter: () => new OpenAIResponsesAdapter(),
    framing: 'sse',
    bytes: sse(
      responses({ type: 'response.output_item.added', output_index: 0, item: { id: 'rs_1', type: 'reasoning', summary: [] } }),
      responses({ type: 'response.output_item.added', output_index: 1, item: { id: 'ws_1', type: 'web_search_call', status: 'in_progress' } }),
      responses({ type: 'response.output_item.added', output_index: 2, item: { id: 'rs_2', type: 'reasoning', summary: [] } }),
      responses({ type: 'response.reasoning_summary_text.delta', item_id: 'rs_2', output_index: 2, summary_index: 0, delta: 'Found it' }),
      responses({ type: 'response.output_text.delta', item_id: 'msg_1', output_index: 3, content_index: 0, delta: 'Sunny' }),
      responses({ type: 'response.completed', response: { id: 'r', model: 'o3', status: 'completed', usage: { output_tokens: 1000, output_tokens_details: { reasoning_tokens: 900 } } } }),
    ),
    kinds: 'NNNCCN',
    reasoningStreamed: true,
    tpotUnknown: true,
  },
  {
    name: 'Responses: a reasoning item whose summary is streamed before the answer keeps TPOT (the summary is in the span)',
    adapter: () => new OpenAIResponsesAdapter(),
    framing: 'sse',
    bytes: sse(
      responses({ type: 'response.output_item.added', output_index: 0, item: { id: 'rs_1', type: 'reasoning', summary: [] } }),
      responses({ type: 'response.reasoning_summary_text.delta', item_id: 'rs_1', output_index: 0, summary_index: 0, delta: 'Weighing' }),
      responses({ type: 'response.output_text.delta', item_id: 'msg_1', output_index: 1, content_index: 0, delta: 'Sunny' }),
      responses({ type: 'response.completed', response: { id: 'r', model: 'm', status: 'completed', usage: { output_tokens: 300 } } }),
    ),
    kinds: 'NCCN',
    reasoningStreamed: true,
    tpotUnknown: false,
  },
  {
    // openai-node ResponseTextDoneEvent and its kin: a part's whole text. A gateway that relays only
    // final events (opencode handles such streams) sends them without deltas.
    name: 'Responses with no deltas: each .done event with its whole part is content (many tokens), and TPOT cannot be had',
    adapter: () => new OpenAIResponsesAdapter(),
    framing: 'sse',
    bytes: sse(
      responses({ type: 'response.created', response: { id: 'resp_1', model: 'gpt-5.2', status: 'in_progress' } }),
      responses({ type: 'response.output_item.added', output_index: 0, item: { id: 'rs_1', type: 'reasoning', summary: [] } }),
      responses({ type: 'response.reasoning_summary_text.done', item_id: 'rs_1', output_index: 0, summary_index: 0, text: 'Weighing it.' }),
      responses({ type: 'response.content_part.added', item_id: 'msg_1', output_index: 1, content_index: 0, part: { type: 'output_text', text: '' } }),
      responses({ type: 'response.output_text.done', item_id: 'msg_1', output_index: 1, content_index: 0, text: 'It is sunny.' }),
      responses({ type: 'response.output_text.done', item_id: 'msg_2', output_index: 2, content_index: 0, text: '' }),
      responses({ type: 'response.function_call_arguments.done', item_id: 'fc_1', output_index: 3, name: 'f', arguments: '{"city":"Paris"}' }),
      responses({ type: 'response.output_item.done', output_index: 1, item: { id: 'msg_1', type: 'message', content: [{ type: 'output_text', text: 'It is sunny.' }] } }),
      responses({ type: 'response.completed', response: { id: 'resp_1', model: 'gpt-5.2', status: 'completed', usage: { input_tokens: 5, output_tokens: 30, output_tokens_details: { reasoning_tokens: 20 } } } }),
    ),
    kinds: 'NNCNCNCNN',
    reasoningStreamed: true,
    multiToken: true,
    tpotUnknown: true,
  },
  {
    name: 'Responses with deltas: the .done events repeat the streamed text and are no content',
    adapter: () => new OpenAIResponsesAdapter(),
    framing: 'sse',
    bytes: sse(
      responses({ type: 'response.output_text.delta', item_id: 'msg_1', output_index: 0, content_index: 0, delta: 'It is' }),
      responses({ type: 'response.output_text.delta', item_id: 'msg_1', output_index: 0, content_index: 0, delta: ' sunny.' }),
      responses({ type: 'response.output_text.done', item_id: 'msg_1', output_index: 0, content_index: 0, text: 'It is sunny.' }),
      responses({ type: 'response.function_call_arguments.done', item_id: 'fc_1', output_index: 1, name: 'f', arguments: '{}' }),
    ),
    kinds: 'CCNN',
    multiToken: false,
    tpotUnknown: false,
  },
  {
    // AWS Bedrock API reference, ContentBlockDelta: `image` (ImageBlockDelta) beside text, toolUse, reasoningContent.
    name: 'Bedrock ConverseStream: an image delta is content',
    adapter: () => new BedrockAdapter(),
    framing: 'eventstream',
    bytes: Buffer.concat([
      encodeEventStreamFrame({ ':event-type': 'messageStart', ':content-type': 'application/json', ':message-type': 'event' }, '{"role":"assistant"}'),
      encodeEventStreamFrame({ ':event-type': 'contentBlockDelta', ':content-type': 'application/json', ':message-type': 'event' }, '{"contentBlockIndex":0,"delta":{"image":{"source":{"bytes":"iVBORw0KGgo="}}}}'),
      encodeEventStreamFrame({ ':event-type': 'contentBlockDelta', ':content-type': 'application/json', ':message-type': 'event' }, '{"contentBlockIndex":0,"delta":{"image":{}}}'),
      // ImageBlockDelta's `error` alone: an image that failed, no output.
      encodeEventStreamFrame({ ':event-type': 'contentBlockDelta', ':content-type': 'application/json', ':message-type': 'event' }, '{"contentBlockIndex":0,"delta":{"image":{"error":{"message":"x"}}}}'),
    ]),
    kinds: 'NCNN',
  },
  {
    // @anthropic-ai/sdk ThinkingConfigAdaptive.display "omitted": a thinking block streams only its
    // signature; MessageDeltaUsage.output_tokens_details.thinking_tokens is the reasoning in output_tokens.
    name: 'Anthropic thinking not displayed: the signature is no content, the thinking tokens are reasoning, none streamed',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'message_start', message: { model: 'claude-opus-4-8', usage: { input_tokens: 10, output_tokens: 1 } } }),
      anthropic({ type: 'content_block_start', index: 0, content_block: { type: 'thinking', thinking: '', signature: '' } }),
      anthropic({ type: 'content_block_delta', index: 0, delta: { type: 'signature_delta', signature: 'c2ln' } }),
      anthropic({ type: 'content_block_stop', index: 0 }),
      anthropic({ type: 'content_block_start', index: 1, content_block: { type: 'text', text: '' } }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: 'Hi' } }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: ' there' } }),
      anthropic({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 310, output_tokens_details: { thinking_tokens: 300 } } }),
      anthropic({ type: 'message_stop' }),
    ),
    kinds: 'NNNNNCCNN',
    usage: { inputTokens: 10, outputTokens: 310, reasoningTokens: 300 },
    reasoningStreamed: false,
    tpotUnknown: false,
  },
  {
    // @anthropic-ai/sdk MessageStream pushes the content_block_start block as it came, text included,
    // and appends the deltas to it: text in the start is the message's first text.
    name: 'Anthropic text in a text block start (a compatible server) is content; the API\'s empty start is not',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }),
      anthropic({ type: 'content_block_start', index: 1, content_block: { type: 'text', text: 'Hello' } }),
      'event: content_block_start\ndata: {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}}',
      'event: content_block_start\ndata: {"type": "content_block_start", "index": 3, "content_block": {"type": "text", "text": " there"}}',
      anthropic({ type: 'content_block_start', index: 4, content_block: { type: 'tool_use', id: 't', name: 'f', input: { text: 'x' } } }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: ' world' } }),
    ),
    kinds: 'NCNCNC',
  },
  {
    // @anthropic-ai/sdk Usage.output_tokens_details: `OutputTokensDetails | null`; some models send
    // none: the hidden thinking is somewhere in output_tokens, by an unknown amount.
    name: 'Anthropic thinking not displayed, with no thinking count: TPOT cannot be had',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'message_start', message: { model: 'claude-opus-4-8', usage: { input_tokens: 10, output_tokens: 1 } } }),
      anthropic({ type: 'content_block_start', index: 0, content_block: { type: 'thinking', thinking: '', signature: '' } }),
      anthropic({ type: 'content_block_delta', index: 0, delta: { type: 'signature_delta', signature: 'c2ln' } }),
      anthropic({ type: 'content_block_stop', index: 0 }),
      anthropic({ type: 'content_block_start', index: 1, content_block: { type: 'text', text: '' } }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: 'Hi' } }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: ' there' } }),
      anthropic({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 310, output_tokens_details: null } }),
      anthropic({ type: 'message_stop' }),
    ),
    kinds: 'NNNNNCCNN',
    usage: { inputTokens: 10, outputTokens: 310 },
    reasoningStreamed: false,
    tpotUnknown: true,
  },
  {
    // Anthropic extended thinking docs, "Thinking redaction": a redacted_thinking block arrives whole,
    // after the thinking it holds was generated.
    name: 'Anthropic redacted thinking first, with no thinking count: content, and TPOT cannot be had',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'content_block_start', index: 0, content_block: { type: 'redacted_thinking', data: 'RW5jcnlwdGVk' } }),
      anthropic({ type: 'content_block_stop', index: 0 }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: 'Hi' } }),
      anthropic({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 210 } }),
    ),
    kinds: 'CNCN',
    usage: { outputTokens: 210 },
    reasoningStreamed: false,
    tpotUnknown: true,
  },
  {
    name: 'Anthropic thinking not displayed between tool uses (after the first content): inside the span, TPOT stands without a thinking count',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Let me check.' } }),
      anthropic({ type: 'content_block_start', index: 1, content_block: { type: 'thinking', thinking: '', signature: '' } }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'signature_delta', signature: 'c2ln' } }),
      anthropic({ type: 'content_block_delta', index: 2, delta: { type: 'text_delta', text: 'Done.' } }),
      anthropic({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 90 } }),
    ),
    kinds: 'CNNCN',
    usage: { outputTokens: 90 },
    reasoningStreamed: true,
    tpotUnknown: false,
  },
  {
    name: 'Anthropic summarized thinking: the summary is streamed reasoning',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'content_block_delta', index: 0, delta: { type: 'thinking_delta', thinking: 'Let me see' } }),
      anthropic({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: 'Yes' } }),
      anthropic({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 90, output_tokens_details: { thinking_tokens: 80 } } }),
    ),
    kinds: 'CCN',
    usage: { outputTokens: 90, reasoningTokens: 80 },
    reasoningStreamed: true,
  },
  {
    // @anthropic-ai/sdk BetaIterationsUsage: an `advisor_message` pass is another model consulted
    // mid-answer; its result arrives whole in an advisor_tool_result block.
    name: 'Anthropic advisor tool: the advisor pass is not the answer\'s output',
    adapter: () => new AnthropicAdapter(),
    framing: 'sse',
    bytes: sse(
      anthropic({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Let me ask' } }),
      anthropic({ type: 'content_block_start', index: 1, content_block: { type: 'server_tool_use', id: 'srvtoolu_1', name: 'advisor', input: {} } }),
      anthropic({ type: 'content_block_start', index: 2, content_block: { type: 'advisor_tool_result', tool_use_id: 'srvtoolu_1', content: { type: 'advisor_result', text: 'Do X' } } }),
      anthropic({ type: 'content_block_delta', index: 3, delta: { type: 'text_delta', text: 'Doing X' } }),
      anthropic({
        type: 'message_delta',
        delta: { stop_reason: 'end_turn' },
        usage: { output_tokens: 42, iterations: [{ type: 'message', output_tokens: 30 }, { type: 'advisor_message', model: 'claude-opus-4-8', output_tokens: 800 }, { type: 'message', output_tokens: 12 }] },
      }),
    ),
    kinds: 'CNNCN',
    usage: { outputTokens: 42 },
  },
  {
    // @google/genai: ThoughtStep holds a `signature` and an optional `summary`; thinking_summaries "none"
    // streams no summary, and Usage.total_thought_tokens comes apart from the output.
    name: 'Gemini Interactions: thoughts without a summary are reasoning none of which was streamed',
    adapter: () => new GeminiInteractionsAdapter(),
    framing: 'sse',
    bytes: sse(
      interaction({ event_type: 'step.start', index: 0, step: { type: 'thought', signature: 'c2ln' } }),
      interaction({ event_type: 'step.delta', index: 0, delta: { type: 'thought_signature', signature: 'c2ln' } }),
      interaction({ event_type: 'step.delta', index: 1, delta: { type: 'text', text: 'Hi' } }),
      interaction({
        event_type: 'interaction.completed',
        interaction: { id: 'v1_6', status: 'completed', model: 'gemini-3-pro-preview', usage: { total_input_tokens: 10, total_output_tokens: 10, total_thought_tokens: 300, total_tokens: 320 } },
      }),
    ),
    kinds: 'NNCN',
    usage: { inputTokens: 10, outputTokens: 310, reasoningTokens: 300 },
    reasoningStreamed: false,
  },
  {
    name: 'Gemini Interactions: a thought step with a summary is streamed reasoning',
    adapter: () => new GeminiInteractionsAdapter(),
    framing: 'sse',
    bytes: sse(interaction({ event_type: 'step.start', index: 0, step: { type: 'thought', signature: 'c2ln', summary: [{ type: 'text', text: 'Plan' }] } })),
    kinds: 'C',
    reasoningStreamed: true,
  },
  {
    // triton-inference-server/vllm_backend src/utils/request.py: with several sequences
    // num_output_tokens is a list, one count per sequence, as text_output is.
    name: 'Triton vLLM backend with two sequences: num_output_tokens per sequence are summed',
    adapter: () => new TritonGenerateAdapter(),
    framing: 'sse',
    bytes: sse(
      data({ model_name: 'vllm_model', model_version: '1', text_output: ['a', 'b'], num_input_tokens: 5, num_output_tokens: [1, 1] }),
      data({ model_name: 'vllm_model', model_version: '1', text_output: ['c', ''], num_output_tokens: [1, 0] }),
      data({ model_name: 'vllm_model', model_version: '1', text_output: ['d', 'e'], num_output_tokens: [1, 1] }),
    ),
    kinds: 'CCC',
    usage: { inputTokens: 5, outputTokens: 5 },
  },
  {
    // Claude on Bedrock InvokeModelWithResponseStream: the Anthropic events in `chunk` frames, thinking not displayed.
    name: 'Bedrock invoke, Claude with thinking not displayed: its thinking tokens are reasoning, none streamed',
    adapter: () => new BedrockAdapter(),
    framing: 'eventstream',
    bytes: Buffer.concat([
      invokeChunk({ type: 'message_start', message: { model: 'claude-opus-4-8', usage: { input_tokens: 10, output_tokens: 1 } } }),
      invokeChunk({ type: 'content_block_delta', index: 0, delta: { type: 'signature_delta', signature: 'c2ln' } }),
      invokeChunk({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: 'Hi' } }),
      invokeChunk({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 205, output_tokens_details: { thinking_tokens: 200 } } }),
    ]),
    kinds: 'NNCN',
    usage: { inputTokens: 10, outputTokens: 205, reasoningTokens: 200, cachedInputTokens: undefined, cacheCreationInputTokens: undefined },
    reasoningStreamed: false,
  },
  {
    // gpt-oss on Bedrock InvokeModelWithResponseStream: OpenAI Chat chunks, tool calls included.
    name: 'Bedrock invoke, OpenAI-shaped model: tool-call arguments are content, a name alone is not',
    adapter: () => new BedrockAdapter(),
    framing: 'eventstream',
    bytes: Buffer.concat([
      invokeChunk({ choices: [{ index: 0, delta: { role: 'assistant', tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'search', arguments: '' } }] } }] }),
      invokeChunk({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '{"q":"x"}' } }] } }] }),
      invokeChunk({ choices: [{ index: 0, delta: { reasoning: 'hmm' } }] }),
    ]),
    kinds: 'NCC',
  },
  {
    // vllm-project/vllm chat_completion_stream_generator: with continuous_usage_stats each chunk's usage is its
    // own choice's running count; the request's total comes only in the final `choices: []` chunk.
    name: 'vLLM continuous usage with n = 2, cut before the final usage chunk: no choice\'s count is taken for the request\'s',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: 't1' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 1, total_tokens: 8 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 1, delta: { content: 't1' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 1, total_tokens: 8 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: 't2' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 1, delta: { content: 't2' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: 't3' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 1, delta: { content: 't3' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 } }),
    ),
    kinds: 'CCCCCC',
    usage: { inputTokens: 7 },
  },
  {
    name: 'vLLM continuous usage with n = 2, whole: the final usage chunk is the request\'s total',
    adapter: () => new OpenAIChatAdapter(),
    framing: 'sse',
    bytes: sse(
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: 't1' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 1, total_tokens: 8 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 1, delta: { content: 't1' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 1, total_tokens: 8 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: 't2' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 1, delta: { content: 't2' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: 't3' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 1, delta: { content: 't3' }, finish_reason: null }], usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 } }),
      data({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage: { prompt_tokens: 7, completion_tokens: 6, total_tokens: 13 } }),
    ),
    kinds: 'CCCCCCN',
    usage: { inputTokens: 7, outputTokens: 6 },
  },
  {
    // triton-inference-server/vllm_backend src/utils/request.py: with return_finish_reason, str(output.finish_reason)
    // per sequence: "None" until it stops.
    name: 'Triton vLLM backend: finish reasons per sequence, "None" until each stops',
    adapter: () => new TritonGenerateAdapter(),
    framing: 'sse',
    bytes: sse(
      data({ model_name: 'vllm_model', text_output: ['a', 'b'], finish_reason: ['None', 'None'] }),
      data({ model_name: 'vllm_model', text_output: ['c', 'd'], finish_reason: ['stop', 'length'] }),
    ),
    kinds: 'CC',
    finish: ['stop', 'length'],
  },
  {
    name: 'Triton vLLM backend, one sequence: its finish reason as a string',
    adapter: () => new TritonGenerateAdapter(),
    framing: 'sse',
    bytes: sse(data({ model_name: 'vllm_model', text_output: 'a', finish_reason: 'None' }), data({ model_name: 'vllm_model', text_output: 'b', finish_reason: 'length' })),
    kinds: 'CC',
    finish: ['length'],
  },
];

function decode(v: Variant, pieces: Buffer[]): SseEvent[] {
  const out: SseEvent[] = [];
  if (v.framing === 'sse') {
    const p = new SseParser((e) => out.push(e));
    for (const b of pieces) p.push(b);
    p.end();
  } else {
    const p = new EventStreamDecoder((e) => out.push(e));
    for (const b of pieces) p.push(b);
  }
  return out;
}

const LETTER: Record<EventKind, string> = { [EventKind.Content]: 'C', [EventKind.None]: 'N', [EventKind.Error]: 'E' };

function classify(v: Variant, pieces: Buffer[]) {
  const a = v.adapter();
  const kinds = decode(v, pieces)
    .map((e) => LETTER[a.onEvent(e)])
    .join('');
  return { kinds, a };
}

describe('wire variants beyond the fixtures', () => {
  for (const v of VARIANTS) {
    it(v.name, () => {
      const { kinds, a } = classify(v, [v.bytes]);
      expect(kinds).toBe(v.kinds);
      if (v.usage) expect(a.usage).toEqual(v.usage);
      if (v.model) expect(a.responseModel).toBe(v.model);
      if (v.reasoningStreamed !== undefined) expect(a.reasoningStreamed).toBe(v.reasoningStreamed);
      if (v.finish !== undefined) expect(a.finishReasons?.list()).toEqual(v.finish);
      if (v.multiToken !== undefined) expect(a.multiTokenEvents === true).toBe(v.multiToken);
      if (v.tpotUnknown !== undefined) expect(a.tpotUnknown === true).toBe(v.tpotUnknown);
      expect(a.errorType).toBe(v.error);
      // The same bytes one at a time: the same answer.
      const bytes = [...v.bytes].map((b) => Buffer.of(b));
      expect(classify(v, bytes).kinds).toBe(v.kinds);
    });
  }
});

describe('server-reported timings in variants', () => {
  it('Groq: queue_time + prompt_time, completion_time / completion_tokens and queue_time + total_time (seconds) from its usage', () => {
    // groq-sdk CompletionUsage: queue_time, prompt_time, completion_time, total_time (seconds), beside the counts;
    // older streams carry it as x_groq.usage.
    for (const where of ['usage', 'x_groq'] as const) {
      const a = new OpenAIChatAdapter();
      const usage = { queue_time: 0.0123, prompt_tokens: 40, prompt_time: 0.004, completion_tokens: 200, completion_time: 0.28, total_tokens: 240, total_time: 0.284 };
      const last = where === 'usage' ? { usage } : { x_groq: { id: 'req_1', usage } };
      const out = decode({ framing: 'sse' } as Variant, [sse(chat({ content: 'Hi' }), data({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'llama-3.3-70b-versatile', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], ...last }))]);
      out.forEach((e) => a.onEvent(e));
      expect(a.usage).toMatchObject({ outputTokens: 200, inputTokens: 40 });
      // TTFT and duration include the queueing (as Ollama's include loading the model).
      expect(a.serverTimings?.timeToFirstToken).toBeCloseTo(0.0123 + 0.004, 12);
      expect(a.serverTimings?.timePerOutputToken).toBeCloseTo(0.0014, 12);
      expect(a.serverTimings?.duration).toBeCloseTo(0.0123 + 0.284, 12);
    }
    // OpenAI's usage has none of these: no server timings.
    const plain = new OpenAIChatAdapter();
    decode({ framing: 'sse' } as Variant, [sse(chat({ content: 'Hi' }, { usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }))]).forEach((e) => plain.onEvent(e));
    expect(plain.serverTimings).toBeUndefined();
  });
});

describe('a route\'s `provider:` by its gen_ai.provider.name value', () => {
  it('gives that name as the default label (a Vertex route behind a gateway is gcp.vertex_ai, not gcp.gemini)', () => {
    for (const name of ['openai', 'azure.ai.openai', 'anthropic', 'gcp.gemini', 'gcp.vertex_ai', 'aws.bedrock', 'cohere', 'deepseek', 'groq', 'cloudflare.workers_ai']) {
      expect(detectApi('/anything', name)?.defaultProviderName, name).toBe(name);
    }
  });
});

describe('detection of the variants’ paths', () => {
  it('Vertex tuned-model endpoints and resumed Responses streams get their adapters', () => {
    expect(detectApi('/v1/projects/p/locations/us-central1/endpoints/123:streamGenerateContent?alt=sse', undefined)?.api).toBe('gemini');
    expect(detectApi('/v1/projects/p/locations/us-central1/endpoints/123:streamGenerateContent', undefined)?.modelFromPath?.('/v1/projects/p/locations/us-central1/endpoints/123:streamGenerateContent')).toBe('123');
    expect(detectApi('/v1/responses/resp_abc123?stream=true&starting_after=42', undefined)?.api).toBe('openai-responses');
    expect(detectApi('/v1/responses/resp_abc123?starting_after=42&stream=true', undefined)?.api).toBe('openai-responses');
    // Retrieving a stored response is not measured: the request that made it counted its usage.
    expect(detectApi('/v1/responses/resp_abc123', undefined)?.api).toBe('generic');
    expect(detectApi('/v1/responses/resp_abc123?stream=false', undefined)?.api).toBe('generic');
    expect(detectApi('/v1/responses/resp_abc123/input_items', undefined)?.api).toBe('generic');
    expect(detectApi('/v1beta/interactions', undefined)?.api).toBe('gemini-interactions');
    expect(detectApi('/v1beta1/projects/p/locations/global/interactions', undefined)?.api).toBe('gemini-interactions');
    expect(detectApi('/v1beta/interactions/v1_abc?stream=true&last_event_id=7', undefined)?.api).toBe('gemini-interactions');
    expect(detectApi('/v1beta/interactions/v1_abc', undefined)?.api).toBe('generic');
    expect(detectApi('/v1beta/interactions/v1_abc/cancel', undefined)?.api).toBe('generic');
    // Azure's legacy Completions on a deployment: the deployment names the model, as for its Chat.
    const azure = detectApi('/openai/deployments/my-instruct/completions?api-version=2024-10-21', undefined);
    expect([azure?.api, azure?.operation, azure?.defaultProviderName]).toEqual(['openai-completions', 'text_completion', 'azure.ai.openai']);
    expect(azure?.modelFromPath?.('/openai/deployments/my-instruct/completions?api-version=2024-10-21')).toBe('my-instruct');
    expect(detectApi('/openai/deployments/my-gpt/chat/completions?api-version=2024-10-21', undefined)?.modelFromPath?.('/openai/deployments/my-gpt/chat/completions')).toBe('my-gpt');
  });

  it('only POSTs are generation calls, and GETs that resume a stream: a CORS preflight or a listing is an unknown API', () => {
    for (const [method, path] of [
      ['OPTIONS', '/v1/chat/completions'],
      ['OPTIONS', '/v1/messages'],
      ['OPTIONS', '/v1beta/models/gemini-2.5-flash:streamGenerateContent'],
      ['GET', '/v1/chat/completions?limit=10'],
      ['GET', '/v1/messages'],
      ['HEAD', '/v1/chat/completions'],
      ['PUT', '/api/chat'],
      ['GET', '/v1/responses/resp_abc123'],
    ] as const) {
      expect(detectApi(path, undefined, [], method)?.api, `${method} ${path}`).toBe('generic');
      expect(detectApi(path, 'openai', [], method)?.api, `${method} ${path} on a route forcing openai`).toBe('generic');
    }
    expect(detectApi('/v1/responses/resp_abc123?stream=true', undefined, [], 'GET')?.api).toBe('openai-responses');
    expect(detectApi('/v1beta/interactions/v1_abc?stream=true', undefined, [], 'GET')?.api).toBe('gemini-interactions');
    // A resumed stream replays what came before in a burst, or starts mid-answer, while its usage
    // counts the whole answer: no TPOT (review 143). A generation call keeps it.
    for (const [method, path, unknown] of [
      ['GET', '/v1/responses/resp_abc123?stream=true', true],
      ['GET', '/v1/responses/resp_abc123?stream=true&starting_after=42', true],
      ['GET', '/v1beta/interactions/v1_abc?stream=true&last_event_id=7', true],
      ['POST', '/v1/responses', false],
      ['POST', '/v1beta/interactions', false],
    ] as const) {
      expect(detectApi(path, undefined, [], method)!.newAdapter().tpotUnknown === true, `${method} ${path}`).toBe(unknown);
    }
    expect(detectApi('/v1/chat/completions', undefined, [], 'POST')?.api).toBe('openai-chat');
  });

  it('Bedrock embedding models on /invoke are not measured as chat (as no embeddings API is measured)', () => {
    for (const id of ['amazon.titan-embed-text-v2:0', 'amazon.titan-embed-image-v1', 'cohere.embed-english-v3', 'cohere.embed-v4%3A0', 'amazon.nova-2-multimodal-embeddings-v1:0', 'twelvelabs.marengo-embed-2-7-v1:0']) {
      expect(detectApi(`/model/${id}/invoke`, undefined)?.api, id).toBe('generic');
    }
    expect(detectApi('/v1/embeddings', undefined)?.api).toBe('generic');
    expect(detectApi('/model/anthropic.claude-3-5-haiku-20241022-v1:0/invoke', undefined)?.api).toBe('bedrock-invoke');
    expect(detectApi('/model/amazon.titan-text-express-v1/invoke-with-response-stream', undefined)?.api).toBe('bedrock-invoke');
    expect(detectApi('/model/us.amazon.nova-pro-v1:0/converse', undefined)?.api).toBe('bedrock-converse');
  });
});
