// Shared event format for the ground-truth emitter and the load client.
// Every event is an OpenAI chat-completion chunk; the client rebuilds the
// expected bytes from (stream id, sequence number) and compares them exactly.

export function streamIdOf(sid) {
  return `chatcmpl-b${sid}`;
}

/** role-only first chunk (seq 0) */
export function roleEvent(sid) {
  return `data: {"id":"${streamIdOf(sid)}","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n`;
}

/** content chunk k (k >= 1) */
export function contentEvent(sid, k) {
  return `data: {"id":"${streamIdOf(sid)}","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":[{"index":0,"delta":{"content":"tok ${k}"}}]}\n\n`;
}

/** usage chunk after the last content chunk */
export function usageEvent(sid, n) {
  return `data: {"id":"${streamIdOf(sid)}","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":${n},"total_tokens":${n + 8}}}\n\n`;
}

export const DONE_EVENT = 'data: [DONE]\n\n';

/** expected event at position i of a stream with n content events:
 *  0 = role, 1..n = content, n+1 = usage, n+2 = [DONE] */
export function expectedEvent(sid, i, n) {
  if (i === 0) return roleEvent(sid);
  if (i <= n) return contentEvent(sid, i);
  if (i === n + 1) return usageEvent(sid, n);
  if (i === n + 2) return DONE_EVENT;
  return null;
}

const SID_RE = /"id":"chatcmpl-b(\d+)"/;
export function parseSid(text) {
  const m = SID_RE.exec(text);
  return m ? Number(m[1]) : -1;
}

/**
 * Incremental SSE splitter: feed chunks (Buffer), get complete events
 * (latin1 strings including the trailing "\n\n").
 */
export class SseSplitter {
  constructor() {
    this.rest = '';
  }
  push(chunk, out) {
    let s = this.rest.length ? this.rest + chunk.toString('latin1') : chunk.toString('latin1');
    let start = 0;
    for (;;) {
      const j = s.indexOf('\n\n', start);
      if (j < 0) break;
      out.push(s.slice(start, j + 2));
      start = j + 2;
    }
    this.rest = start === 0 ? s : s.slice(start);
    return out;
  }
}

export function buildRequestBody(extra = {}) {
  return JSON.stringify({
    model: 'bench',
    stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: 'user', content: 'bench' }],
    ...extra,
  });
}
