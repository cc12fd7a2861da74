import { promptTokens } from '../text.js';
import { afterAll, argumentsText, groupText, objOf, planBlocks, planGroups, positiveInt, runGroups, sendJson, str, type Block, type Group } from './groups.js';
import type { SimRequest, WireFormat } from './types.js';

/** A fixed, well-formed-looking thinking signature. */
const SIGNATURE = 'EqQBCkYIBxgCKkBsimulatedSignatureForTheLatencyProxySimulator0000000000000000';

interface AnthropicPlan {
  model: string;
  id: string;
  n: number;
  input: number;
  blocks: Block[];
  groups: Group[];
  toolName: string | undefined;
  stopReason: string;
}

export function anthropicPlan(r: SimRequest): AnthropicPlan {
  const { body, plan } = r;
  const tools = Array.isArray(body.tools) ? body.tools : [];
  const choice = objOf(body.tool_choice);
  const toolName = tools.length > 0 && choice?.type !== 'none' ? str(objOf(tools[0])?.name, 'tool') : undefined;
  const thinking = objOf(body.thinking)?.type === 'enabled';
  const blocks = planBlocks(plan.tokens, thinking, toolName !== undefined);
  return {
    model: str(body.model, 'sim-model'),
    id: `msg_${r.requestId}`,
    n: plan.tokens,
    input: promptTokens(body),
    blocks,
    groups: planGroups(blocks, true),
    toolName,
    stopReason: r.capped ? 'max_tokens' : toolName ? 'tool_use' : 'end_turn',
  };
}

/** The Anthropic events of a plan, as (due group index or -1 for "at once", event) pairs via callbacks. */
export function anthropicEvents(p: AnthropicPlan, requestId: string) {
  const start = () => ({
    type: 'message_start',
    message: {
      id: p.id,
      type: 'message',
      role: 'assistant',
      model: p.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { input_tokens: p.input, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, output_tokens: 1 },
    },
  });
  const blockStart = (bi: number) => {
    const b = p.blocks[bi]!;
    const content_block =
      b.kind === 'reasoning'
        ? { type: 'thinking', thinking: '', signature: '' }
        : b.kind === 'tool'
          ? { type: 'tool_use', id: `toolu_${requestId}`, name: p.toolName, input: {} }
          : { type: 'text', text: '' };
    return { type: 'content_block_start', index: bi, content_block };
  };
  const delta = (g: Group) => {
    const b = p.blocks[g.block]!;
    const d =
      b.kind === 'reasoning'
        ? { type: 'thinking_delta', thinking: groupText(g.start, g.end) }
        : b.kind === 'tool'
          ? { type: 'input_json_delta', partial_json: argumentsText(g.start, g.end, b.start, b.end) }
          : { type: 'text_delta', text: groupText(g.start, g.end) };
    return { type: 'content_block_delta', index: g.block, delta: d };
  };
  /** Events that go out with group g (block start before, block stop after). */
  const forGroup = (g: Group): object[] => {
    const b = p.blocks[g.block]!;
    const out: object[] = [];
    if (g.firstInBlock && g.block > 0) {
      out.push(blockStart(g.block));
      if (b.kind === 'tool') out.push({ type: 'content_block_delta', index: g.block, delta: { type: 'input_json_delta', partial_json: '' } });
    }
    out.push(delta(g));
    if (g.lastInBlock) {
      if (b.kind === 'reasoning') out.push({ type: 'content_block_delta', index: g.block, delta: { type: 'signature_delta', signature: SIGNATURE } });
      out.push({ type: 'content_block_stop', index: g.block });
    }
    return out;
  };
  /** Events sent with the headers: message_start, the first block's start, a ping. */
  const head = (): object[] => {
    const out: object[] = [start(), blockStart(0)];
    if (p.blocks[0]!.kind === 'tool') out.push({ type: 'content_block_delta', index: 0, delta: { type: 'input_json_delta', partial_json: '' } });
    out.push({ type: 'ping' });
    return out;
  };
  const tail = (): object[] => [
    { type: 'message_delta', delta: { stop_reason: p.stopReason, stop_sequence: null }, usage: { output_tokens: p.n } },
    { type: 'message_stop' },
  ];
  return { head, forGroup, tail };
}

/** The whole message (non-streamed). */
export function anthropicMessage(p: AnthropicPlan, requestId: string): object {
  const content = p.blocks.map((b) =>
    b.kind === 'reasoning'
      ? { type: 'thinking', thinking: groupText(b.start, b.end), signature: SIGNATURE }
      : b.kind === 'tool'
        ? { type: 'tool_use', id: `toolu_${requestId}`, name: p.toolName, input: JSON.parse(argumentsText(b.start, b.end, b.start, b.end)) as unknown }
        : { type: 'text', text: groupText(b.start, b.end) },
  );
  return {
    id: p.id,
    type: 'message',
    role: 'assistant',
    model: p.model,
    content,
    stop_reason: p.stopReason,
    stop_sequence: null,
    usage: { input_tokens: p.input, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, output_tokens: p.n },
  };
}

/**
 * Anthropic Messages (`POST /v1/messages`). Streamed: message_start, the
 * first content_block_start and a ping with the headers; content_block_delta
 * events carrying 1, then 3-5 tokens each, sent when their last token is due;
 * message_delta (usage.output_tokens = scheduled tokens) and message_stop.
 * `thinking: {type: "enabled"}` puts half the tokens in a thinking block,
 * `tools` turns the answer into a tool_use block with input_json_delta.
 */
export const anthropicFormat: WireFormat = {
  name: 'anthropic',
  matches: (method, path) => method === 'POST' && /(?:^|\/)v1\/messages$/.test(path),
  maxTokens: (body) => positiveInt(body.max_tokens),
  serve(r: SimRequest) {
    const { res, body, times, t0 } = r;
    const p = anthropicPlan(r);
    if (body.stream !== true) {
      afterAll(res, times, t0, () => sendJson(res, 200, anthropicMessage(p, r.requestId), { 'request-id': r.requestId }));
      return;
    }
    const ev = anthropicEvents(p, r.requestId);
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'request-id': r.requestId });
    const send = (events: object[]) => {
      let s = '';
      for (const e of events) {
        const type = (e as { type: string }).type;
        s += `event: ${type}\ndata: ${type === 'ping' ? '{"type": "ping"}' : JSON.stringify(e)}\n\n`;
      }
      res.write(s);
    };
    send(ev.head());
    runGroups(res, p.groups, times, t0, (g) => send(ev.forGroup(g)), () => {
      send(ev.tail());
      res.end();
    });
  },
};
