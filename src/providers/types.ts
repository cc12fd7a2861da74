import type { SseEvent } from '../sse/parser.js';

/** What one streamed event means for measurement. */
export const enum EventKind {
  /** Framing, metadata, usage, keep-alive: not output. */
  None = 0,
  /** Carries output (text, reasoning or tool-call arguments). */
  Content = 1,
  /** An in-band error: ends the measurement with `errorType`. */
  Error = 2,
}

export type TokenCountSource = 'usage' | 'events' | 'none';

/** Token usage as the provider reports it; undefined fields were not reported. */
export interface Usage {
  inputTokens?: number;
  outputTokens?: number;
  reasoningTokens?: number;
  cachedInputTokens?: number;
}

/**
 * One adapter instance per response. It reads events and keeps what it learns
 * (usage, response model, error) as plain fields the meter reads at the end.
 */
export interface ResponseAdapter {
  /** Classify one SSE event (or one NDJSON line, as `{type:'', data}`). */
  onEvent(ev: SseEvent): EventKind;
  /** A non-streamed body (JSON), at most the capture cap. */
  onBody?(body: string): void;
  readonly usage: Usage;
  /** Cumulative output tokens after the last event, when the stream reports it per event. */
  readonly cumulativeOutputTokens: number | undefined;
  readonly responseModel: string | undefined;
  readonly errorType: string | undefined;
}

/** The API family of a request: decides the adapter and the semconv names. */
export interface ApiDescriptor {
  /** Adapter id, e.g. `openai-chat`. */
  readonly api: string;
  /** `gen_ai.operation.name` value. */
  readonly operation: string;
  /** `gen_ai.provider.name` default for this API when the route does not say. */
  readonly defaultProviderName: string;
  newAdapter(): ResponseAdapter;
  /** The model when the API puts it in the path (Gemini, Bedrock); the JSON body's `model` otherwise. */
  modelFromPath?(path: string): string | undefined;
}
