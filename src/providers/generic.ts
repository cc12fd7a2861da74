import { EventKind, type ApiDescriptor, type ResponseAdapter, type Usage } from './types.js';

/**
 * The fallback for requests whose API is not known. The body is not parsed:
 * a streamed response (SSE, NDJSON or event-stream content type) is measured
 * for duration and time to first byte only; any other response (e.g.
 * `GET /v1/models`) records nothing, as before.
 */
export class GenericAdapter implements ResponseAdapter {
  readonly generic = true;
  readonly usage: Usage = {};
  readonly cumulativeOutputTokens = undefined;
  readonly responseModel = undefined;
  readonly errorType = undefined;

  onEvent(): EventKind {
    return EventKind.None;
  }
}

export const genericStream: ApiDescriptor = {
  api: 'generic',
  operation: '_OTHER',
  defaultProviderName: '_OTHER',
  newAdapter: () => new GenericAdapter(),
};
