import { encodeEventStreamFrame } from '../../sse/eventstream.js';
import { promptTokens } from '../text.js';
import { anthropicEvents, anthropicMessage, anthropicPlan } from './anthropic.js';
import { afterAll, groupText, objOf, planBlocks, planGroups, positiveInt, runGroups, sendJson } from './groups.js';
import type { SimRequest, WireFormat } from './types.js';

const PATH = /\/model\/([^/]+)\/(converse-stream|converse|invoke-with-response-stream|invoke)$/;
const EVENTSTREAM = 'application/vnd.amazon.eventstream';

function frame(eventType: string, payload: object): Buffer {
  return encodeEventStreamFrame({ ':event-type': eventType, ':content-type': 'application/json', ':message-type': 'event' }, JSON.stringify(payload));
}

/**
 * AWS Bedrock Runtime. `converse-stream`: event-stream frames messageStart,
 * contentBlockDelta (1, then 3-5 tokens each, when the last is due),
 * contentBlockStop, messageStop, metadata (usage.outputTokens = scheduled
 * tokens, metrics.latencyMs). `invoke-with-response-stream`: the Anthropic
 * Messages events (same grouping), each base64-wrapped in a `chunk` frame; the
 * last carries `amazon-bedrock-invocationMetrics`. `converse` / `invoke`
 * answer with JSON. The request signature is not checked.
 */
export const bedrockFormat: WireFormat = {
  name: 'bedrock',
  matches: (method, path) => method === 'POST' && PATH.test(path),
  maxTokens: (body) => positiveInt(objOf(body.inferenceConfig)?.maxTokens) ?? positiveInt(body.max_tokens),
  serve(r: SimRequest) {
    const { res, body, plan, times, t0, requestId } = r;
    const m = PATH.exec(r.path)!;
    const op = m[2]!;
    const n = plan.tokens;
    const headers = { 'x-amzn-requestid': requestId };
    const latencyMs = () => Math.round(times[n - 1] ?? 0);

    if (op === 'invoke' || op === 'invoke-with-response-stream') {
      const p = anthropicPlan({ ...r, body: { ...body, model: decodeURIComponent(m[1]!) } });
      if (op === 'invoke') {
        afterAll(res, times, t0, () => sendJson(res, 200, anthropicMessage(p, requestId), headers));
        return;
      }
      const ev = anthropicEvents(p, requestId);
      const chunk = (e: object) => frame('chunk', { bytes: Buffer.from(JSON.stringify(e)).toString('base64') });
      res.writeHead(200, { 'content-type': EVENTSTREAM, 'x-amzn-bedrock-content-type': 'application/json', ...headers });
      res.write(Buffer.concat(ev.head().filter((e) => (e as { type: string }).type !== 'ping').map(chunk)));
      runGroups(res, p.groups, times, t0, (g) => res.write(Buffer.concat(ev.forGroup(g).map(chunk))), () => {
        const tail = ev.tail();
        const stop = {
          ...tail[1]!,
          'amazon-bedrock-invocationMetrics': {
            inputTokenCount: p.input,
            outputTokenCount: n,
            invocationLatency: latencyMs(),
            firstByteLatency: Math.round(times[0] ?? 0),
          },
        };
        res.end(Buffer.concat([chunk(tail[0]!), chunk(stop)]));
      });
      return;
    }

    const blocks = planBlocks(n, false, false);
    const groups = planGroups(blocks, true);
    const input = promptTokens(body);
    const usage = { inputTokens: input, outputTokens: n, totalTokens: input + n };
    const stopReason = r.capped ? 'max_tokens' : 'end_turn';
    if (op === 'converse') {
      afterAll(res, times, t0, () =>
        sendJson(
          res,
          200,
          { output: { message: { role: 'assistant', content: [{ text: groupText(0, n) }] } }, stopReason, usage, metrics: { latencyMs: latencyMs() } },
          headers,
        ),
      );
      return;
    }
    res.writeHead(200, { 'content-type': EVENTSTREAM, ...headers });
    res.write(frame('messageStart', { role: 'assistant' }));
    runGroups(
      res,
      groups,
      times,
      t0,
      (g) => res.write(frame('contentBlockDelta', { contentBlockIndex: 0, delta: { text: groupText(g.start, g.end) } })),
      () => {
        res.end(
          Buffer.concat([
            frame('contentBlockStop', { contentBlockIndex: 0 }),
            frame('messageStop', { stopReason }),
            frame('metadata', { usage, metrics: { latencyMs: latencyMs() } }),
          ]),
        );
      },
    );
  },
};
