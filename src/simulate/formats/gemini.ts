import { promptTokens } from '../text.js';
import { afterAll, groupText, objOf, planBlocks, planGroups, positiveInt, runGroups, sendJson, type Group } from './groups.js';
import type { SimRequest, WireFormat } from './types.js';

const PATH = /\/(?:models\/|(?=tunedModels\/))((?:tunedModels\/)?[^/:]+):(streamGenerateContent|generateContent)$/;

/**
 * Google Gemini (`POST .../models/{model}:streamGenerateContent?alt=sse`, and
 * `:generateContent`). Streamed: one `data:` event per group of 1, then 3-5
 * tokens, CRLF-separated, no terminator; every chunk carries cumulative
 * `usageMetadata.candidatesTokenCount` (and `thoughtsTokenCount` when
 * `generationConfig.thinkingConfig.includeThoughts`, whose tokens come first
 * as `thought: true` parts). The two counts add up to the scheduled tokens.
 * Without `alt=sse` (or with `alt=json`) the same chunks stream as one JSON
 * array (`application/json`), each element written when due, pretty-printed
 * with CRLF as Google sends it: `[{…}` then `\r\n,\r\n{…}` per chunk, then `\r\n]`.
 */
export const geminiFormat: WireFormat = {
  name: 'gemini',
  matches: (method, path) => method === 'POST' && PATH.test(path),
  maxTokens: (body) => positiveInt(objOf(body.generationConfig)?.maxOutputTokens),
  serve(r: SimRequest) {
    const { res, body, plan, times, t0, requestId } = r;
    const m = PATH.exec(r.path)!;
    const model = decodeURIComponent(m[1]!);
    const streamed = m[2] === 'streamGenerateContent';
    const n = plan.tokens;
    const thoughts = objOf(objOf(objOf(body.generationConfig)?.thinkingConfig))?.includeThoughts === true;
    const blocks = planBlocks(n, thoughts, false);
    const groups = planGroups(blocks, true);
    const prompt = promptTokens(body);
    const thoughtTokens = blocks[0]!.kind === 'reasoning' ? blocks[0]!.end : 0;

    const chunk = (g: Group | undefined, last: boolean) => {
      const upTo = g ? g.end : n;
      const thoughtsSoFar = Math.min(upTo, thoughtTokens);
      const candidates = upTo - thoughtsSoFar;
      const part = g
        ? blocks[g.block]!.kind === 'reasoning'
          ? { text: groupText(g.start, g.end), thought: true }
          : { text: groupText(g.start, g.end) }
        : { text: groupText(thoughtTokens, n) };
      const usage: Record<string, unknown> = { promptTokenCount: prompt, candidatesTokenCount: candidates, totalTokenCount: prompt + upTo };
      if (thoughtTokens > 0) usage.thoughtsTokenCount = thoughtsSoFar;
      return {
        candidates: [{ content: { parts: [part], role: 'model' }, ...(last ? { finishReason: r.capped ? 'MAX_TOKENS' : 'STOP' } : {}), index: 0 }],
        usageMetadata: usage,
        modelVersion: model,
        responseId: requestId,
      };
    };

    if (!streamed) {
      afterAll(res, times, t0, () => sendJson(res, 200, chunk(undefined, true)));
      return;
    }
    if (r.query.get('alt') !== 'sse') {
      res.writeHead(200, { 'content-type': 'application/json; charset=UTF-8', 'x-request-id': requestId });
      const pretty = (v: unknown) => JSON.stringify(v, null, 2).replace(/\n/g, '\r\n');
      runGroups(
        res,
        groups,
        times,
        t0,
        (g, i) => res.write((i === 0 ? '[' : '\r\n,\r\n') + pretty(chunk(g, i === groups.length - 1))),
        () => res.end(groups.length > 0 ? '\r\n]' : '[]'),
      );
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'x-request-id': requestId });
    runGroups(
      res,
      groups,
      times,
      t0,
      (g, i) => res.write(`data: ${JSON.stringify(chunk(g, i === groups.length - 1))}\r\n\r\n`),
      () => res.end(),
    );
  },
};
