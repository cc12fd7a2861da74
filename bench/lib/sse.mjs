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

/**
 * The position an event claims to have in its stream (as expectedEvent numbers them), or -1
 * when it claims none: used to re-align after a fault, so that one lost, duplicated or
 * merged event is counted as that, not as every later event of the stream.
 */
export function claimedIndex(text, n) {
  if (text === DONE_EVENT) return n + 2;
  const m = TOK_RE.exec(text);
  if (m) {
    const k = Number(m[1]);
    return k >= 1 && k <= n ? k : -1; // a position the stream does not have: altered
  }
  if (text.includes('"usage":')) return n + 1;
  if (text.includes('"role":"assistant"')) return 0;
  return -1;
}
const TOK_RE = /"content":"tok (\d+)"/;

/** The request tag the client puts in the body's `user` field, which the emitter reads back. */
export const tagOf = (tag) => `bench-${tag}`;
const TAG_RE = /"user":"bench-(\d+)"/;
export function parseTag(body) {
  const m = TAG_RE.exec(body);
  return m ? Number(m[1]) : undefined;
}

/**
 * Checks one received event of a stream of n content events against the position expected
 * next, and counts what is wrong in `st` (sid, got, received, skipped, mismatched, merged,
 * extra: the client's per-stream record). Returns the first position the event stands for (it
 * stands for every position up to st.got - 1: more than one when records were merged), or -1
 * when it stands for none (past the end, or a duplicate of an earlier position); an intact
 * event costs what it did before (the expected event's string and one compare). After a fault the next events are
 * compared with their own positions again, so that one lost, duplicated or merged event counts
 * once, not as every event after it.
 */
export function placeEvent(st, e, n) {
  if (st.sid < 0) st.sid = parseSid(e);
  const i = st.got;
  const exp = expectedEvent(st.sid, i, n);
  if (exp === null) {
    st.extra++;
    return -1;
  }
  let first = i;
  let last = i;
  if (e !== exp) {
    const parts = e.split(/(?=data:)/);
    if (parts.length > 1) {
      // Records glued without their separator: one merged event standing for all of them.
      st.merged++;
      const a = claimedIndex(parts[0], n);
      const b = claimedIndex(parts[parts.length - 1], n);
      if (a > i) first = a;
      last = Math.max(first, b);
    } else {
      const at = claimedIndex(e, n);
      const intact = at >= 0 && e === expectedEvent(st.sid, at, n);
      if (intact && at < i) {
        st.extra++; // a duplicate (or one that came out of order)
        return -1;
      }
      if (intact && at > i) first = last = at;
      else st.mismatched++; // altered bytes: taken as the event expected here
    }
    st.skipped += first - i; // positions jumped over: lost in the middle of the stream
  }
  st.got = last + 1;
  st.received++;
  return first;
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
