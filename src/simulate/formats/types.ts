import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Plan } from '../schedule.js';

export interface SimRequest {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  /** Path without the query. */
  readonly path: string;
  readonly query: URLSearchParams;
  /** Parsed JSON body, or {} */
  readonly body: Record<string, unknown>;
  readonly plan: Plan;
  /** Due times of each token in ms after `t0`. */
  readonly times: readonly number[];
  /** Arrival of the request (performance.now()). */
  readonly t0: number;
  readonly requestId: string;
  /** The client's token limit (max_tokens and friends) ended the answer: report it as such. */
  readonly capped: boolean;
}

/** One provider wire format the simulator speaks. */
export interface WireFormat {
  readonly name: string;
  matches(method: string, path: string): boolean;
  /** Largest token count a request asks for (max_tokens and friends), if any. */
  maxTokens?(body: Record<string, unknown>): number | undefined;
  serve(r: SimRequest): void;
}
