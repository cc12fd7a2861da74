import { promptTokens } from '../text.js';
import { afterAll, argumentsText, groupText, objOf, planBlocks, planGroups, positiveInt, runGroups, sendJson, str, type Block } from './groups.js';
import type { SimRequest, WireFormat } from './types.js';

/**
 * OpenAI Responses (`POST /v1/responses`). Streamed: response.created and
 * response.in_progress with the headers; one `*.delta` event per token
 * (reasoning summary when `reasoning.summary` is set, then output text, or
 * function-call arguments when `tools` has a function); the item/part
 * open/close events around them; response.completed with the usage
 * (output_tokens = scheduled tokens, reasoning tokens among them).
 */
export const openaiResponsesFormat: WireFormat = {
  name: 'openai-responses',
  matches: (method, path) => method === 'POST' && /(?:^|\/)responses$/.test(path),
  maxTokens: (body) => positiveInt(body.max_output_tokens),
  serve(r: SimRequest) {
    const { res, body, plan, times, t0, requestId } = r;
    const model = str(body.model, 'sim-model');
    const n = plan.tokens;
    const tools = Array.isArray(body.tools) ? body.tools.map(objOf) : [];
    const fn = body.tool_choice !== 'none' ? tools.find((t) => t?.type === 'function') : undefined;
    const toolName = fn ? str(fn.name, 'tool') : undefined;
    const reasoning = objOf(body.reasoning)?.summary !== undefined && objOf(body.reasoning)?.summary !== null;
    const blocks = planBlocks(n, reasoning, toolName !== undefined);
    const groups = planGroups(blocks, false);
    const input = promptTokens(body);
    const reasoningTokens = blocks.filter((b) => b.kind === 'reasoning').reduce((s, b) => s + b.end - b.start, 0);
    const createdAt = Math.floor(Date.now() / 1000);
    const respId = `resp_${requestId}`;
    const itemId = (b: Block, i: number) => `${b.kind === 'reasoning' ? 'rs' : b.kind === 'tool' ? 'fc' : 'msg'}_${requestId}${i}`;
    const callId = `call_${requestId}`;
    // An answer cut by max_output_tokens ends incomplete: response.incomplete, with the reason.
    const endStatus = r.capped ? 'incomplete' : 'completed';

    const doneItem = (b: Block, i: number) => {
      if (b.kind === 'reasoning') return { id: itemId(b, i), type: 'reasoning', summary: [{ type: 'summary_text', text: groupText(b.start, b.end) }] };
      if (b.kind === 'tool') {
        return { id: itemId(b, i), type: 'function_call', status: 'completed', arguments: argumentsText(b.start, b.end, b.start, b.end), call_id: callId, name: toolName };
      }
      return {
        id: itemId(b, i),
        type: 'message',
        status: endStatus,
        content: [{ type: 'output_text', annotations: [], logprobs: [], text: groupText(b.start, b.end) }],
        role: 'assistant',
      };
    };
    const response = (status: string, output: object[], usage: object | null) => ({
      id: respId,
      object: 'response',
      created_at: createdAt,
      status,
      error: null,
      incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
      instructions: null,
      max_output_tokens: positiveInt(body.max_output_tokens) ?? null,
      model,
      output,
      parallel_tool_calls: true,
      previous_response_id: null,
      reasoning: { effort: null, summary: null },
      store: false,
      temperature: 1.0,
      text: { format: { type: 'text' } },
      tool_choice: 'auto',
      tools: [],
      top_p: 1.0,
      truncation: 'disabled',
      usage,
      metadata: {},
    });
    const usage = {
      input_tokens: input,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: n,
      output_tokens_details: { reasoning_tokens: reasoningTokens },
      total_tokens: input + n,
    };

    if (body.stream !== true) {
      afterAll(res, times, t0, () => sendJson(res, 200, response(endStatus, blocks.map(doneItem), usage)));
      return;
    }

    let seq = 0;
    let out = '';
    const ev = (type: string, fields: Record<string, unknown>) => {
      out += `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...fields })}\n\n`;
    };
    const flush = () => {
      res.write(out);
      out = '';
    };
    const open = (b: Block, i: number) => {
      const id = itemId(b, i);
      if (b.kind === 'reasoning') {
        ev('response.output_item.added', { output_index: i, item: { id, type: 'reasoning', summary: [] } });
        ev('response.reasoning_summary_part.added', { item_id: id, output_index: i, summary_index: 0, part: { type: 'summary_text', text: '' } });
      } else if (b.kind === 'tool') {
        ev('response.output_item.added', { output_index: i, item: { id, type: 'function_call', status: 'in_progress', arguments: '', call_id: callId, name: toolName } });
      } else {
        ev('response.output_item.added', { output_index: i, item: { id, type: 'message', status: 'in_progress', content: [], role: 'assistant' } });
        ev('response.content_part.added', { item_id: id, output_index: i, content_index: 0, part: { type: 'output_text', annotations: [], logprobs: [], text: '' } });
      }
    };
    const close = (b: Block, i: number) => {
      const id = itemId(b, i);
      const text = groupText(b.start, b.end);
      if (b.kind === 'reasoning') {
        ev('response.reasoning_summary_text.done', { item_id: id, output_index: i, summary_index: 0, text });
        ev('response.reasoning_summary_part.done', { item_id: id, output_index: i, summary_index: 0, part: { type: 'summary_text', text } });
      } else if (b.kind === 'tool') {
        ev('response.function_call_arguments.done', { item_id: id, output_index: i, arguments: argumentsText(b.start, b.end, b.start, b.end) });
      } else {
        ev('response.output_text.done', { item_id: id, output_index: i, content_index: 0, text, logprobs: [] });
        ev('response.content_part.done', { item_id: id, output_index: i, content_index: 0, part: { type: 'output_text', annotations: [], logprobs: [], text } });
      }
      ev('response.output_item.done', { output_index: i, item: doneItem(b, i) });
    };

    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-request-id': requestId });
    ev('response.created', { response: response('in_progress', [], null) });
    ev('response.in_progress', { response: response('in_progress', [], null) });
    open(blocks[0]!, 0);
    flush();
    runGroups(
      res,
      groups,
      times,
      t0,
      (g) => {
        const b = blocks[g.block]!;
        if (g.firstInBlock && g.block > 0) open(b, g.block);
        const id = itemId(b, g.block);
        if (b.kind === 'reasoning') {
          ev('response.reasoning_summary_text.delta', { item_id: id, output_index: g.block, summary_index: 0, delta: groupText(g.start, g.end) });
        } else if (b.kind === 'tool') {
          ev('response.function_call_arguments.delta', { item_id: id, output_index: g.block, delta: argumentsText(g.start, g.end, b.start, b.end) });
        } else {
          ev('response.output_text.delta', { item_id: id, output_index: g.block, content_index: 0, delta: groupText(g.start, g.end), logprobs: [] });
        }
        if (g.lastInBlock) close(b, g.block);
        flush();
      },
      () => {
        ev(`response.${endStatus}`, { response: response(endStatus, blocks.map(doneItem), usage) });
        res.end(out);
      },
    );
  },
};
