import { promptTokens, token, fullText } from '../text.js';
import { afterAll, objOf, positiveInt, sendJson, str } from './groups.js';
import { runSchedule } from '../schedule.js';
import type { SimRequest, WireFormat } from './types.js';

/**
 * Ollama native API (`POST /api/chat`, `/api/generate`), NDJSON
 * (`application/x-ndjson`), streamed unless `stream: false`. One line per
 * token, then the `done: true` line with `eval_count` = scheduled tokens and
 * durations in nanoseconds (eval_duration = tokens × planned ITL, so the
 * server-reported time per token is the plan's ITL).
 */
export const ollamaFormat: WireFormat = {
  name: 'ollama',
  matches: (method, path) => method === 'POST' && /(?:^|\/)api\/(?:chat|generate)$/.test(path),
  maxTokens: (body) => positiveInt(objOf(body.options)?.num_predict),
  serve(r: SimRequest) {
    const { res, body, plan, times, t0 } = r;
    const chat = r.path.endsWith('/chat');
    const model = str(body.model, 'sim-model');
    const n = plan.tokens;
    const now = () => new Date().toISOString();
    const piece = (text: string) => (chat ? { message: { role: 'assistant', content: text } } : { response: text });
    const final = () => {
      const evalNs = Math.round(n * plan.itl * 1e9);
      const promptNs = Math.round(plan.ttft * 1e9);
      return {
        model,
        created_at: now(),
        ...piece(''),
        done_reason: r.capped ? 'length' : 'stop',
        done: true,
        total_duration: Math.round((times[n - 1] ?? 0) * 1e6),
        load_duration: 0,
        prompt_eval_count: promptTokens(body),
        prompt_eval_duration: promptNs,
        eval_count: n,
        eval_duration: evalNs,
      };
    };
    if (body.stream === false) {
      afterAll(res, times, t0, () => sendJson(res, 200, { ...final(), ...piece(fullText(n)) }, { 'content-type': 'application/json; charset=utf-8' }));
      return;
    }
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    const cancel = runSchedule(
      times,
      t0,
      (k) => res.write(`${JSON.stringify({ model, created_at: now(), ...piece(token(k)), done: false })}\n`),
      () => res.end(`${JSON.stringify(final())}\n`),
    );
    res.once('close', cancel);
  },
};
