// A page on its own origin streaming through the proxy, as a browser application does: Chromium's
// fetch (a CORS preflight first: JSON body and an Authorization header), the official `openai`
// SDK in the browser, an abort, and a WebSocket. It stamps what it sees with performance.now()
// and reports to its own server; the test compares that with the proxy's metrics. Only
// durations leave the page: its clock has another origin than the test's.
const q = new URLSearchParams(location.search);
const proxy = q.get('proxy');
const report = (r) => fetch(`/result?run=${encodeURIComponent(q.get('run'))}`, { method: 'POST', body: JSON.stringify(r) });

/** Each SSE event's text as its last byte arrives, with that arrival time. */
async function* sseEvents(body, onBytes) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const at = performance.now();
    onBytes?.(value);
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.search(/\r\n\r\n|\n\n|\r\r/)) >= 0) {
      const sep = buf.slice(end).match(/^(\r\n\r\n|\n\n|\r\r)/)[0];
      yield { text: buf.slice(0, end), at };
      buf = buf.slice(end + sep.length);
    }
  }
}

const contentOf = (eventText) => {
  const data = eventText.split(/\r\n|\n|\r/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
  if (!data || data === '[DONE]') return '';
  return JSON.parse(data).choices?.[0]?.delta?.content ?? '';
};

const hex = (buf) => [...new Uint8Array(buf)].map((b) => b.toString(16).padStart(2, '0')).join('');

function post(model, signal) {
  return fetch(`${proxy}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer sk-browser' },
    body: JSON.stringify({ model, stream: true, messages: [{ role: 'user', content: 'hi' }] }),
    signal,
  });
}

const scenarios = {
  /** Sequential streams with fetch: times and bytes (SHA-256). */
  async fetch() {
    const streams = [];
    for (let i = 0; i < Number(q.get('n')); i++) {
      const sent = performance.now();
      const res = await post('browser-fetch');
      const parts = [];
      const s = { status: res.status, sent, first: null, last: null, contents: 0, done: false, text: '' };
      for await (const ev of sseEvents(res.body, (v) => parts.push(v))) {
        if (/^data: ?\[DONE\]$/m.test(ev.text)) s.done = true;
        const c = contentOf(ev.text);
        if (!c) continue;
        s.contents++;
        s.text += c;
        s.first ??= ev.at;
        s.last = ev.at;
      }
      const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
      parts.reduce((o, p) => (all.set(p, o), o + p.length), 0);
      s.bytes = all.length;
      s.sha256 = hex(await crypto.subtle.digest('SHA-256', all));
      streams.push(s);
    }
    return { streams };
  },

  /** The official SDK as a browser application uses it (its own fetch, SSE decoding and retries off). */
  async openai() {
    const { default: OpenAI } = await import('/openai/index.mjs');
    const client = new OpenAI({ apiKey: 'sk-browser', baseURL: `${proxy}/v1`, dangerouslyAllowBrowser: true, maxRetries: 0 });
    const streams = [];
    for (let i = 0; i < Number(q.get('n')); i++) {
      const sent = performance.now();
      const stream = await client.chat.completions.create({ model: 'browser-openai', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hi' }] });
      const s = { sent, first: null, last: null, contents: 0, text: '', usage: null, finish: null };
      for await (const chunk of stream) {
        const at = performance.now();
        if (chunk.usage) s.usage = chunk.usage;
        const choice = chunk.choices[0];
        if (choice?.finish_reason) s.finish = choice.finish_reason;
        if (!choice?.delta?.content) continue;
        s.contents++;
        s.text += choice.delta.content;
        s.first ??= at;
        s.last = at;
      }
      streams.push(s);
    }
    return { streams };
  },

  /** The user stops the answer: AbortController after the third content event. */
  async abort() {
    const controller = new AbortController();
    const res = await post('browser-abort', controller.signal);
    let contents = 0;
    let aborted = null;
    try {
      for await (const ev of sseEvents(res.body)) {
        // Events already in the last read still come out of the loop after the abort: not counted.
        if (!controller.signal.aborted && contentOf(ev.text) && ++contents === 3) controller.abort();
      }
    } catch (e) {
      aborted = e.name;
    }
    return { status: res.status, contents, aborted };
  },

  /** A Realtime session over Chromium's WebSocket (it offers permessage-deflate). */
  async websocket() {
    const ws = new WebSocket(`${proxy.replace(/^http/, 'ws')}/v1/realtime?model=browser-realtime`);
    const got = [];
    let sent = null;
    let first = null;
    let last = null;
    await new Promise((resolve, reject) => {
      ws.onerror = () => reject(new Error('WebSocket error'));
      ws.onmessage = (m) => {
        const at = performance.now();
        got.push(m.data);
        const type = JSON.parse(m.data).type;
        if (type === 'session.created') {
          sent = performance.now();
          ws.send(JSON.stringify({ type: 'response.create', response: { output_modalities: ['text'] } }));
        }
        if (type === 'response.output_text.delta') {
          first ??= at;
          last = at;
        }
        if (type === 'response.done') resolve();
      };
    });
    const extensions = ws.extensions;
    ws.close(1000);
    await new Promise((r) => (ws.onclose = r));
    return { extensions, got, sent, first, last };
  },
};

try {
  const scenario = scenarios[q.get('s')];
  if (!scenario) throw new Error(`no scenario ${q.get('s')}`);
  await report({ ok: true, crossOriginIsolated, ...(await scenario()) });
} catch (e) {
  await report({ ok: false, error: String(e?.stack ?? e) });
}
