import { runSchedule } from '../schedule.js';
import { fullText, promptTokens, token } from '../text.js';
import type { SimRequest, WireFormat } from './types.js';

interface Tool {
  type?: string;
  function?: { name?: string };
}

/** JSON-string fragments whose concatenation is `{"text":"..."}`: valid arguments JSON. */
function argumentFragment(k: number, n: number): string {
  const word = JSON.stringify(token(k)).slice(1, -1);
  let s = k === 0 ? `{"text":"${word}` : word;
  if (k === n - 1) s += '"}';
  return s;
}

/**
 * OpenAI Chat Completions, streamed (SSE) or not. The role-only chunk goes out
 * with the headers, content chunks on the schedule, then the finish chunk, the
 * usage chunk (when `stream_options.include_usage`) and `[DONE]`.
 */
export const openaiChatFormat: WireFormat = {
  name: 'openai-chat',
  matches: (method, path) => method === 'POST' && /(?:^|\/)chat\/completions$/.test(path),
  maxTokens(body) {
    const v = body.max_completion_tokens ?? body.max_tokens;
    return typeof v === 'number' && v > 0 ? Math.floor(v) : undefined;
  },
  serve(r: SimRequest) {
    const { res, body, plan, times, t0 } = r;
    const model = typeof body.model === 'string' ? body.model : 'sim-model';
    const id = `chatcmpl-${r.requestId}`;
    const created = Math.floor(Date.now() / 1000);
    const n = plan.tokens;
    const tools = Array.isArray(body.tools) ? (body.tools as Tool[]) : [];
    const toolName = body.tool_choice !== 'none' ? tools[0]?.function?.name : undefined;
    // The answer ends at the client's max_tokens: "length", as OpenAI reports it.
    const finish = r.capped ? 'length' : toolName ? 'tool_calls' : 'stop';
    const usage = {
      prompt_tokens: promptTokens(body),
      completion_tokens: n,
      total_tokens: promptTokens(body) + n,
    };

    if (body.stream !== true) {
      const cancel = runSchedule(
        times.length > 0 ? [times[times.length - 1]!] : [0],
        t0,
        () => undefined,
        () => {
          const message = toolName
            ? {
                role: 'assistant',
                content: null,
                tool_calls: [
                  {
                    id: `call_${r.requestId}`,
                    type: 'function',
                    function: { name: toolName, arguments: Array.from({ length: n }, (_, k) => argumentFragment(k, n)).join('') },
                  },
                ],
              }
            : { role: 'assistant', content: fullText(n) };
          const json = JSON.stringify({
            id,
            object: 'chat.completion',
            created,
            model,
            choices: [{ index: 0, message, logprobs: null, finish_reason: finish }],
            usage,
          });
          res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
          res.end(json);
        },
      );
      res.once('close', cancel);
      return;
    }

    const includeUsage =
      typeof body.stream_options === 'object' &&
      body.stream_options !== null &&
      (body.stream_options as { include_usage?: unknown }).include_usage === true;
    const usageField = includeUsage ? ',"usage":null' : '';
    const head = `{"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)},"system_fingerprint":null,"choices":[`;
    const send = (choices: string, tail = usageField) => res.write(`data: ${head}${choices}]${tail}}\n\n`);

    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      'x-request-id': r.requestId,
    });
    const firstDelta = toolName
      ? `{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_${r.requestId}","type":"function","function":{"name":${JSON.stringify(toolName)},"arguments":""}}]}`
      : '{"role":"assistant","content":""}';
    send(`{"index":0,"delta":${firstDelta},"logprobs":null,"finish_reason":null}`);

    const cancel = runSchedule(
      times,
      t0,
      (k) => {
        const delta = toolName
          ? `{"tool_calls":[{"index":0,"function":{"arguments":${JSON.stringify(argumentFragment(k, n))}}}]}`
          : `{"content":${JSON.stringify(token(k))}}`;
        send(`{"index":0,"delta":${delta},"logprobs":null,"finish_reason":null}`);
      },
      () => {
        send(`{"index":0,"delta":{},"logprobs":null,"finish_reason":"${finish}"}`);
        if (includeUsage) send('', `,"usage":${JSON.stringify(usage)}`);
        res.end('data: [DONE]\n\n');
      },
    );
    res.once('close', cancel);
  },
};
